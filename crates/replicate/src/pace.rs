//! The coordinator's rate control, sans-IO: R2's controller that gathers every stream's
//! progress and holds their sum at the bottleneck, divided so that all streams finish
//! together (the slow get more, the fast are capped), applied by per-socket pacing
//! (SO_MAX_PACING_RATE on each stream's connections, TCP's inter-packet gap).
//!
//! The input is what each source disk server reports: bytes it has had acknowledged by
//! its destination and bytes it still has to send. From the sum of the acknowledged
//! bytes over a span of at least four round trips (1..4 s) the controller measures the
//! rate the streams deliver together.
//! - With the bottleneck given (`--rate`), the total is that rate from the start.
//! - Without, the streams start unpaced; once three spans in a row fail to raise the best
//!   total rate by a tenth, the link is full and the best rate is the bottleneck. From then
//!   on the total is [`HEADROOM`] over the highest rate of the last ten spans: enough to
//!   climb when the path frees up, too little to build a standing queue quickly.
//! - The rates above are of units acknowledged, which come in bursts when a lost packet
//!   holds a stream's units back until it is repaired: a span can show more than the path
//!   carries (one stream's units at 550 Mbit/s for a second on an 800 Mbit/s link). So the
//!   best rate is held to what the streams' connections say crossed the path (TCP's
//!   delivered segments, SACKed ones included: [`StreamView::wire_rate`]), the median of
//!   the last [`WIRE_WINDOW`] spans. Without it a total set from a burst overflowed the
//!   bottleneck for the rest of the transfer (1.45 M queue drops in a 60-s run), which
//!   made more bursts.
//! - The total is divided in proportion to the bytes each stream has left, so that they
//!   finish together. A stream that does not reach its share for three spans in a row
//!   (a slow disk, a slow path of its own) gets what it reaches plus [`PROBE`] and the
//!   rest goes to the others: what it cannot use is not lost to the link.

use std::collections::VecDeque;
use std::time::Duration;

/// How the streams are paced (the lab compares them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The coordinator divides the bottleneck by what each stream has left.
    Cooperative,
    /// Each stream paced to 1/N of the given rate, never changed.
    Static,
    /// No pacing at all.
    Unpaced,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "cooperative" | "coop" => Ok(Mode::Cooperative),
            "static" => Ok(Mode::Static),
            "unpaced" | "none" => Ok(Mode::Unpaced),
            _ => Err(format!("pacing {s:?}: say cooperative, static or unpaced")),
        }
    }
}

/// The cruise total over the best recent rate.
pub const HEADROOM: f64 = 1.02;
/// What a stream that falls short of its share gets over what it reaches.
pub const PROBE: f64 = 1.15;
const GROWTH: f64 = 1.10;
/// The cruise total never falls below this share of the bottleneck found at start-up.
pub const FLOOR: f64 = 0.5;
const STALLS_TO_CRUISE: u32 = 3;
const WINDOW: usize = 10;
/// Spans whose path rates (the median) bound the best rate.
pub const WIRE_WINDOW: usize = 5;
const SHORT_SPANS: u32 = 3;

/// One stream as the coordinator last heard of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamView {
    /// Bytes acknowledged by the destination so far.
    pub done: u64,
    /// Bytes still to send.
    pub remaining: u64,
    pub finished: bool,
    /// Bytes per second the stream's connections put across the path over their last
    /// span, as TCP counts them; 0 when not known.
    pub wire_rate: u64,
}

/// What the streams are paced at now.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Decision {
    /// The total the streams share, bytes per second (`None`: unpaced).
    pub total: Option<u64>,
    /// Each stream's pacing rate (`None`: unpaced).
    pub shares: Vec<Option<u64>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Unpaced, finding the bottleneck.
    Startup,
    /// Paced to the bottleneck (found or given).
    Cruise,
}

#[derive(Debug)]
pub struct Controller {
    mode: Mode,
    given: Option<u64>,
    phase: Phase,
    span_start: Option<(Duration, u64, Vec<u64>)>,
    best: u64,
    /// The bottleneck found when start-up ended (0 before).
    found: u64,
    stalls: u32,
    recent: VecDeque<u64>,
    /// The streams' path rates summed, of the last spans.
    wire: VecDeque<u64>,
    total: Option<u64>,
    shares: Vec<Option<u64>>,
    /// Spans in a row each stream fell short of its share, and what it reached.
    short: Vec<(u32, u64)>,
    /// The last span's rate of each stream and of all, bytes per second.
    rates: Vec<u64>,
    rate: u64,
}

impl Controller {
    /// `given`: the bottleneck's rate for the streams' payload, bytes per second.
    pub fn new(mode: Mode, given: Option<u64>, streams: usize) -> Controller {
        let total = match mode {
            Mode::Unpaced => None,
            _ => given,
        };
        Controller {
            mode,
            given,
            phase: if total.is_some() {
                Phase::Cruise
            } else {
                Phase::Startup
            },
            span_start: None,
            best: 0,
            found: 0,
            stalls: 0,
            recent: VecDeque::new(),
            wire: VecDeque::new(),
            total,
            shares: vec![None; streams],
            short: vec![(0, 0); streams],
            rates: vec![0; streams],
            rate: 0,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The rate measured over the last span: all streams, and each.
    pub fn rates(&self) -> (u64, &[u64]) {
        (self.rate, &self.rates)
    }

    /// The bottleneck found (or given), bytes per second.
    pub fn bottleneck(&self) -> Option<u64> {
        self.given
            .or((self.phase == Phase::Cruise).then_some(self.best))
    }

    /// The span rates are measured over for a path of `rtt`.
    pub fn span(rtt: Duration) -> Duration {
        (rtt * 4).clamp(Duration::from_secs(1), Duration::from_secs(4))
    }

    /// Takes the streams' reports at `now` (`rtt`: the least round trip they measure) and
    /// returns the pacing to apply.
    pub fn tick(&mut self, now: Duration, rtt: Duration, streams: &[StreamView]) -> Decision {
        let n = streams.len();
        self.shares.resize(n, None);
        self.short.resize(n, (0, 0));
        self.rates.resize(n, 0);
        let done: Vec<u64> = streams.iter().map(|s| s.done).collect();
        let sum: u64 = done.iter().sum();
        match &self.span_start {
            None => self.span_start = Some((now, sum, done.clone())),
            Some((t0, s0, d0)) if now.saturating_sub(*t0) >= Self::span(rtt) => {
                let secs = (now - *t0).as_secs_f64();
                self.rate = (sum.saturating_sub(*s0) as f64 / secs) as u64;
                for (i, d) in done.iter().enumerate() {
                    let before = d0.get(i).copied().unwrap_or(0);
                    self.rates[i] = (d.saturating_sub(before) as f64 / secs) as u64;
                }
                // A stream judged over a span is one that had delivered when the span
                // began: before its first acknowledgment it is logging in, or its first
                // units are still crossing the path, and says nothing of what it can do.
                let delivering: Vec<bool> = (0..n)
                    .map(|i| d0.get(i).copied().unwrap_or(0) > 0)
                    .collect();
                self.span_start = Some((now, sum, done.clone()));
                self.sample(streams, &delivering);
            }
            Some(_) => {}
        }
        self.divide(streams);
        Decision {
            total: self.total,
            shares: self.shares.clone(),
        }
    }

    /// A new span's rates are in.
    fn sample(&mut self, streams: &[StreamView], delivering: &[bool]) {
        let rate = self.rate;
        let all_busy = streams.iter().all(|s| !s.finished);
        // A span in which nothing was acknowledged (the first units still on their way
        // over a long path, a connection being recovered) says nothing of the path's
        // rate: it neither ends the start-up nor lowers the cruise.
        if self.mode == Mode::Cooperative && self.given.is_none() && all_busy && rate > 0 {
            self.recent.push_back(rate);
            if self.recent.len() > WINDOW {
                self.recent.pop_front();
            }
            let wire: u64 = streams.iter().map(|s| s.wire_rate).sum();
            if streams.iter().all(|s| s.wire_rate > 0) {
                self.wire.push_back(wire);
                if self.wire.len() > WIRE_WINDOW {
                    self.wire.pop_front();
                }
            }
            match self.phase {
                Phase::Startup => {
                    if rate as f64 > self.best as f64 * GROWTH {
                        self.best = rate;
                        self.stalls = 0;
                    } else {
                        self.best = self.best.max(rate);
                        self.stalls += 1;
                        if self.stalls >= STALLS_TO_CRUISE {
                            self.phase = Phase::Cruise;
                        }
                    }
                }
                Phase::Cruise => {
                    // Follows the path down when it is shared, but not below a fraction
                    // of what it was found to carry.
                    let recent = self.recent.iter().copied().max().unwrap_or(rate);
                    self.best = recent.max((self.found as f64 * FLOOR) as u64);
                }
            }
            if self.phase == Phase::Cruise {
                // No more than crossed the path: acknowledgments released together after a
                // repaired loss are no faster path.
                if let Some(crossed) = median(&self.wire) {
                    self.best = self.best.min(crossed);
                }
                if self.found == 0 {
                    self.found = self.best;
                }
                self.total = Some((self.best as f64 * HEADROOM) as u64);
            }
        }
        if self.mode == Mode::Cooperative && self.total.is_some() {
            // What the streams typically reach of their shares: when they all fall short
            // together, the total is more than the path carries (a rate found a little
            // high), and that is no stream's fault; a stream is short only against the
            // others. (Capping every stream at what it reached, as before, split the
            // rate-found default's streams into capped and uncapped ones that then
            // finished 10 % apart.)
            let mut reach: Vec<f64> = (0..streams.len())
                .filter(|&i| !streams[i].finished && delivering[i])
                .filter_map(|i| {
                    let share = self.shares[i]?;
                    Some(self.rates[i] as f64 / share.max(1) as f64)
                })
                .collect();
            reach.sort_by(f64::total_cmp);
            let typical = reach.get(reach.len() / 2).copied().unwrap_or(1.0).min(1.0);
            for (i, s) in streams.iter().enumerate() {
                let reached = self.rates[i];
                // Short of the share: below 85 % of what the streams typically reach
                // of theirs, or, once judged short, below 95 % of what it was given since
                // (it did not use its probe's room).
                let limited = self.short[i].0 >= SHORT_SPANS;
                let bar = if limited { 0.95 } else { 0.85 * typical };
                match self.shares[i] {
                    Some(share)
                        if !s.finished
                            && delivering[i]
                            && (reached as f64) < share as f64 * bar =>
                    {
                        self.short[i] = (self.short[i].0 + 1, reached);
                    }
                    _ => self.short[i] = (0, 0),
                }
            }
        }
    }

    fn divide(&mut self, streams: &[StreamView]) {
        let n = streams.len();
        let Some(total) = self.total else {
            self.shares = vec![None; n];
            return;
        };
        let live: Vec<usize> = (0..n).filter(|&i| !streams[i].finished).collect();
        if live.is_empty() {
            self.shares = vec![None; n];
            return;
        }
        if self.mode == Mode::Static {
            let each = (total / n as u64).max(1);
            self.shares = (0..n).map(|_| Some(each)).collect();
            return;
        }
        let mut shares = vec![None; n];
        // Streams that cannot use their share: what they reach plus a probe.
        let mut left = total;
        let mut open = Vec::new();
        for &i in &live {
            let (spans, reached) = self.short[i];
            if spans >= SHORT_SPANS && reached > 0 {
                let s = ((reached as f64 * PROBE) as u64).min(left);
                shares[i] = Some(s.max(1));
                left -= s;
            } else {
                open.push(i);
            }
        }
        if open.is_empty() {
            // Every stream falls short: none is capped below what it might reach.
            for &i in &live {
                shares[i] = Some((total / live.len() as u64).max(shares[i].unwrap_or(1)));
            }
        } else {
            let rem: u64 = open.iter().map(|&i| streams[i].remaining).sum();
            let floor = left / (10 * open.len() as u64);
            for &i in &open {
                let s = if rem == 0 {
                    left / open.len() as u64
                } else {
                    (left as u128 * streams[i].remaining as u128 / rem as u128) as u64
                };
                shares[i] = Some(s.max(floor).max(1));
            }
        }
        self.shares = shares;
    }
}

/// The median (the upper one of an even count); `None` when empty.
fn median(v: &VecDeque<u64>) -> Option<u64> {
    let mut s: Vec<u64> = v.iter().copied().collect();
    s.sort_unstable();
    s.get(s.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Duration = Duration::from_millis(100);

    fn view(done: u64, remaining: u64) -> StreamView {
        StreamView {
            wire_rate: 0,
            done,
            remaining,
            finished: remaining == 0,
        }
    }

    #[test]
    fn given_rate_divided_by_what_is_left() {
        let mut c = Controller::new(Mode::Cooperative, Some(1000), 2);
        let d = c.tick(Duration::ZERO, RTT, &[view(0, 300), view(0, 100)]);
        assert_eq!(d.total, Some(1000));
        assert_eq!(d.shares, vec![Some(750), Some(250)]);
        // The first finishes: the other gets everything.
        let d = c.tick(
            Duration::from_millis(500),
            RTT,
            &[view(300, 0), view(50, 50)],
        );
        assert_eq!(d.shares, vec![None, Some(1000)]);
    }

    #[test]
    fn static_and_unpaced() {
        let mut c = Controller::new(Mode::Static, Some(900), 3);
        let d = c.tick(Duration::ZERO, RTT, &[view(0, 1), view(0, 100), view(0, 5)]);
        assert_eq!(d.shares, vec![Some(300); 3]);
        let mut c = Controller::new(Mode::Unpaced, Some(900), 3);
        let d = c.tick(Duration::ZERO, RTT, &[view(0, 1), view(0, 100), view(0, 5)]);
        assert_eq!(
            d,
            Decision {
                total: None,
                shares: vec![None; 3]
            }
        );
    }

    /// Over 350 ms the first units take seconds to be acknowledged: spans without
    /// progress do not end the start-up (they once did, and the streams were paced to
    /// nothing), and a stall in cruise (a connection being recovered) does not bring the
    /// total below half the bottleneck found.
    #[test]
    fn spans_without_progress_neither_end_startup_nor_starve_cruise() {
        let rtt = Duration::from_millis(350);
        let span = Controller::span(rtt);
        let mut c = Controller::new(Mode::Cooperative, None, 2);
        let size = 1_000_000_000u64;
        let mut t = Duration::ZERO;
        for _ in 0..8 {
            let d = c.tick(t, rtt, &[view(0, size), view(0, size)]);
            assert_eq!(d.total, None, "still unpaced at {t:?}");
            t += span;
        }
        assert_eq!(c.phase(), Phase::Startup);
        // Then 1000 B/s each, flat: cruise near 2000 B/s.
        let mut done = 0u64;
        for _ in 0..6 {
            done += (1000.0 * span.as_secs_f64()) as u64;
            c.tick(t, rtt, &[view(done, size), view(done, size)]);
            t += span;
        }
        assert_eq!(c.phase(), Phase::Cruise, "{c:?}");
        let found = c.bottleneck().unwrap();
        assert!((1900..=2100).contains(&found), "{found}");
        // Nothing moves for twelve spans: the total stays at least half of that.
        for _ in 0..12 {
            let d = c.tick(t, rtt, &[view(done, size), view(done, size)]);
            let total = d.total.unwrap();
            assert!(
                total as f64 >= found as f64 * FLOOR,
                "{total} against {found}"
            );
            assert!(d.shares.iter().all(|s| s.unwrap() > 1), "{d:?}");
            t += span;
        }
    }

    /// Streams that share a bottleneck of 1000 B/s: startup finds it, then the total is
    /// held just over it and divided by what is left.
    #[test]
    fn finds_the_bottleneck_then_cruises() {
        let mut c = Controller::new(Mode::Cooperative, None, 2);
        let mut done = [0u64, 0];
        let size = 1_000_000u64;
        let mut t = Duration::ZERO;
        let mut rate = 100u64;
        for _ in 0..40 {
            let views = [view(done[0], size - done[0]), view(done[1], size - done[1])];
            let d = c.tick(t, RTT, &views);
            if c.phase() == Phase::Cruise {
                let total = d.total.unwrap();
                assert!((990..=1030).contains(&total), "{total}");
            }
            // Unpaced, the link doubles what it carries each second up to 1000 B/s,
            // unevenly: stream 0 gets twice as much. Paced, each gets its share (scaled
            // down to the link when they ask for more).
            rate = (rate * 2).min(1000);
            match d.total {
                None => {
                    done[0] += rate * 2 / 3;
                    done[1] += rate / 3;
                }
                Some(total) => {
                    for (done, share) in done.iter_mut().zip(&d.shares) {
                        *done += share.unwrap() * 1000 / total.max(1000);
                    }
                }
            }
            t += Duration::from_secs(1);
        }
        assert_eq!(c.phase(), Phase::Cruise);
        let found = c.bottleneck().unwrap();
        assert!((990..=1000).contains(&found), "{found}");
        // The lagging stream (1) is given more than the leading one.
        let views = [view(done[0], size - done[0]), view(done[1], size - done[1])];
        let d = c.tick(t, RTT, &views);
        assert!(d.shares[1] > d.shares[0], "{d:?}");
    }

    /// Acknowledgments that come in bursts (units held back behind a repaired loss, then
    /// acknowledged together) do not pass for a faster path: the total stays at what
    /// crossed the link.
    #[test]
    fn bursts_of_acknowledgments_do_not_raise_the_total() {
        let mut c = Controller::new(Mode::Cooperative, None, 2);
        let mut done = [0u64, 0];
        let size = 100_000_000u64;
        let mut t = Duration::ZERO;
        let mut rate = 100u64;
        let mut held = 0u64;
        let mut carried = 0u64;
        for i in 0..60 {
            let views = [0, 1].map(|s| StreamView {
                wire_rate: carried / 2,
                ..view(done[s], size - done[s])
            });
            let d = c.tick(t, RTT, &views);
            if i > 20 {
                assert_eq!(c.phase(), Phase::Cruise);
                let total = d.total.unwrap();
                assert!((950..=1050).contains(&total), "second {i}: total {total}");
            }
            // The link carries up to 1000 B/s (doubling at first, unpaced); every other
            // second half of what it carried is acknowledged only with the next second's.
            rate = (rate * 2).min(1000);
            carried = d.total.map_or(rate, |total| rate.min(total));
            let acked = if i % 2 == 0 {
                held = carried / 2;
                carried - held
            } else {
                carried + std::mem::take(&mut held)
            };
            done[0] += acked / 2;
            done[1] += acked - acked / 2;
            t += Duration::from_secs(1);
        }
        let found = c.bottleneck().unwrap();
        assert!((950..=1030).contains(&found), "{found}");
    }

    #[test]
    fn a_stream_short_of_its_share_gives_the_rest_away() {
        let mut c = Controller::new(Mode::Cooperative, Some(1000), 2);
        let mut t = Duration::ZERO;
        let mut done = [0u64, 0];
        let mut d = c.tick(t, RTT, &[view(0, 1_000_000), view(0, 1_000_000)]);
        assert_eq!(d.shares, vec![Some(500), Some(500)]);
        for _ in 0..5 {
            t += Duration::from_secs(1);
            done[0] += 100; // reaches 100 of its 500
            done[1] += d.shares[1].unwrap();
            d = c.tick(
                t,
                RTT,
                &[
                    view(done[0], 1_000_000 - done[0]),
                    view(done[1], 1_000_000 - done[1]),
                ],
            );
        }
        assert_eq!(d.shares[0], Some(114)); // 100 B/s (rounded down) + 15 %
        assert_eq!(d.shares[1], Some(886));
    }

    /// The total above what the path carries (a found rate a little high): every stream
    /// reaches 80 % of its share. None is capped: each keeps a share in proportion to
    /// what it has left, so that they still finish together; one that reaches far less
    /// than the others is still judged short.
    #[test]
    fn streams_short_together_are_not_capped() {
        let mut c = Controller::new(Mode::Cooperative, Some(1000), 3);
        let size = 1_000_000u64;
        let mut t = Duration::ZERO;
        let mut done = [0u64; 3];
        let mut d = c.tick(t, RTT, &[view(0, size), view(0, size), view(0, size)]);
        for _ in 0..6 {
            t += Duration::from_secs(1);
            for (done, share) in done.iter_mut().zip(&d.shares) {
                *done += share.unwrap() * 8 / 10;
            }
            let views: Vec<StreamView> = done.iter().map(|&x| view(x, size - x)).collect();
            d = c.tick(t, RTT, &views);
        }
        let sum: u64 = d.shares.iter().map(|s| s.unwrap()).sum();
        assert!(sum >= 999, "{d:?}");
        assert!(d.shares.iter().all(|s| s.unwrap() >= 330), "{d:?}");
        // Now stream 2 reaches a tenth of what the others do.
        for _ in 0..4 {
            t += Duration::from_secs(1);
            for (i, (done, share)) in done.iter_mut().zip(&d.shares).enumerate() {
                *done += share.unwrap() * if i == 2 { 8 } else { 80 } / 100;
            }
            let views: Vec<StreamView> = done.iter().map(|&x| view(x, size - x)).collect();
            d = c.tick(t, RTT, &views);
        }
        assert!(d.shares[2].unwrap() < 100, "{d:?}");
        assert!(d.shares[0].unwrap() > 400, "{d:?}");
    }

    /// Seen at 350 ms with the rate given: the streams spent their first three spans
    /// logging in, were judged short of their shares at 0 B/s and capped to what they
    /// reached in their first second of data plus 15 %, so the link took seconds more to
    /// fill. A stream is judged only over spans that began after its first delivery.
    #[test]
    fn a_stream_still_starting_keeps_its_share() {
        let mut c = Controller::new(Mode::Cooperative, Some(1000), 2);
        let mut t = Duration::ZERO;
        let mut d = c.tick(t, RTT, &[view(0, 1_000_000), view(0, 1_000_000)]);
        // Four spans with nothing delivered (logging in), then one with a slow first
        // second (the first units crossing the path).
        let mut done = 0;
        for step in 0..5 {
            t += Duration::from_secs(1);
            if step == 4 {
                done = 50;
            }
            d = c.tick(
                t,
                RTT,
                &[view(done, 1_000_000 - done), view(done, 1_000_000 - done)],
            );
        }
        assert_eq!(d.shares, vec![Some(500), Some(500)]);
        // A stream that then stays short is judged as before.
        let mut done = [done, done];
        for _ in 0..3 {
            t += Duration::from_secs(1);
            done[0] += 100;
            done[1] += 500;
            d = c.tick(
                t,
                RTT,
                &[
                    view(done[0], 1_000_000 - done[0]),
                    view(done[1], 1_000_000 - done[1]),
                ],
            );
        }
        assert_eq!(d.shares[0], Some(114)); // 100 B/s (rounded down) + 15 %
    }
}
