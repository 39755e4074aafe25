//! Whether a send compresses its units on the wire: decided per stream, as it goes, from
//! what compression did to the units tried (sans-IO; the agent compresses and times).
//!
//! Compression pays when the stream then moves more of the volume per second: without it
//! the stream moves its wire rate `w` (the pacing share, or what its connections deliver);
//! with it, `w / r` at a ratio `r` (frame bytes over data bytes), but no more than the
//! compressors keep up with (`threads` times one compressor's speed). So a unit is
//! compressed while `min(w / r, threads × speed) ≥ GAIN × w` and `r ≤ WORTH`; with no rate
//! known yet (an unpaced start) the ratio alone decides. The first [`FIRST_PROBES`] units
//! are tried, counted as they are handed out, not as their results come back: a stream
//! hands out a whole window of units (dozens on a long path) before the first compression
//! ends, and counting results tried them all, a window of 1 MiB compressions per stream
//! for nothing on data that does not compress (R2: a third of the source's CPU). While
//! compression is off, one unit in [`PROBE_EVERY`] is tried again, so a volume
//! whose data changes from incompressible to text turns it on, and the other way round.
//! A unit tried and found not to shrink by [`WORTH`] goes as it is.
//!
//! The level too is chosen per stream, from [`LEVELS`]: zstd's level 1 and its fast
//! levels (`--fast=N`, level −N), each faster and shrinking less than the one before. Each
//! level tried keeps its own ratio `r` and speed `s`, and units go at the level that moves
//! the most volume, `min(w / r, threads × s)`: level 1 while the link binds, a faster one
//! while the compressors fall behind it (on two cores shared with the far side and the
//! link, level 1 holds a stream at what it compresses, below what the link would carry at
//! a lower ratio). A stream whose compressors bind tries the next faster level it has not
//! tried; while on, one unit in [`PROBE_EVERY`] tries the level next to its own (faster
//! while the compressors bind, slower while the link does), so the choice follows the load.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the user asked for (`rsv sync --compress`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Never: every unit as plain iSCSI writes.
    Off,
    /// When it pays, decided as the stream goes.
    #[default]
    Auto,
    /// Every unit that shrinks, whatever the rates.
    On,
}

/// A frame must be at most this share of its data to be worth sending instead.
pub const WORTH: f64 = 0.9;
/// Compression must move the volume this much faster than the plain stream.
pub const GAIN: f64 = 1.1;
/// Units tried at the start of a stream.
pub const FIRST_PROBES: u32 = 4;
/// While off, one unit in this many is tried.
pub const PROBE_EVERY: u32 = 32;
/// Weight of the newest sample in the running ratio and speed.
const ALPHA: f64 = 0.5;
/// zstd's level with no measure yet: its fastest standard one. Higher levels compress text
/// a little better at a fraction of the speed, and a stream that cannot keep up gains
/// nothing.
pub const LEVEL: i32 = 1;
/// The levels a stream chooses among, best ratio first: 1, then zstd's fast levels
/// (`--fast=1, 3, 5, 8`). On binaries and libraries each step is about 1.2-1.4× faster
/// and shrinks about a tenth less; `--fast=8` is about twice level 1's speed at 2/3 of its
/// ratio (`zstd -b`, 1 MiB blocks).
pub const LEVELS: [i32; 5] = [LEVEL, -1, -3, -5, -8];

/// What the units tried at one level showed: running frame/data ratio and data bytes per
/// second of one compression.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    pub ratio: f64,
    pub speed: f64,
}

impl Measure {
    /// Volume bytes a second a stream of wire rate `w` moves at this level with `threads`
    /// compressors: what the link carries of it or what the compressors make, the less.
    pub fn effective(&self, w: f64, threads: f64) -> f64 {
        (w / self.ratio).min(threads * self.speed)
    }

    /// Whether the compressors, not the link, hold the stream back at this level.
    pub fn cpu_bound(&self, w: f64, threads: f64) -> bool {
        threads * self.speed < w / self.ratio
    }
}

/// The position in [`LEVELS`] that moves the most volume at wire rate `rate` with `threads`
/// compressors, among the levels measured whose ratio is worth it; a tie goes to the better
/// ratio (fewer wire bytes, less for the link and the far side). With no rate known, the
/// best ratio. `None`: no level measured shrinks the data by [`WORTH`].
pub fn best_level(measured: &[Option<Measure>], rate: Option<u64>, threads: f64) -> Option<usize> {
    let w = rate.filter(|&w| w > 0).map(|w| w as f64);
    let mut best: Option<(usize, f64)> = None;
    for (i, m) in measured.iter().enumerate() {
        let Some(m) = m.filter(|m| m.ratio <= WORTH) else {
            continue;
        };
        let score = match w {
            Some(w) => m.effective(w, threads),
            None => 1.0 / m.ratio,
        };
        // Better by more than a hair: a level measured a little faster by noise does not
        // take over from one with the better ratio.
        match best {
            Some((_, b)) if score <= b * 1.02 => {}
            _ => best = Some((i, score)),
        }
    }
    best.map(|(i, _)| i)
}

/// A stream's compression decision.
#[derive(Clone, Debug)]
pub struct Adaptive {
    mode: Mode,
    threads: f64,
    /// What the units tried at each of [`LEVELS`] showed.
    measured: [Option<Measure>; LEVELS.len()],
    /// The position in [`LEVELS`] units go at.
    at: usize,
    /// A level to try on the next unit handed out (one not measured, or a neighbour of
    /// `at` to measure again), and whether that unit is out.
    trial: Option<(usize, bool)>,
    /// The level of the unit handed out last.
    last: usize,
    samples: u32,
    /// Of the first probes, those handed out (their samples may not be back yet).
    first_tried: u32,
    /// Units not tried since the last one tried, while off; while on, units since a
    /// neighbouring level was last tried.
    since_probe: u32,
    on: bool,
}

impl Adaptive {
    /// `threads`: compressions that may run at once (the cores the agent may use).
    pub fn new(mode: Mode, threads: usize) -> Adaptive {
        Adaptive {
            mode,
            threads: threads.max(1) as f64,
            measured: [None; LEVELS.len()],
            at: 0,
            trial: None,
            last: 0,
            samples: 0,
            first_tried: 0,
            since_probe: 0,
            on: mode == Mode::On,
        }
    }

    /// Whether to compress the next unit (to send it so, or to try). Asked as the unit is
    /// handed out, before the result of any compression still running is known.
    pub fn compress_next(&mut self) -> bool {
        self.next_level().is_some()
    }

    /// The zstd level to compress the next unit at, `None` to send it plainly. Asked as
    /// the unit is handed out, before the result of any compression still running is known.
    pub fn next_level(&mut self) -> Option<i32> {
        let i = self.next_position()?;
        self.last = i;
        Some(LEVELS[i])
    }

    fn next_position(&mut self) -> Option<usize> {
        match self.mode {
            Mode::Off => None,
            // Every unit that shrinks: at the level the measures say, like auto when on.
            Mode::On => Some(self.take_trial().unwrap_or(self.at)),
            Mode::Auto if self.first_tried < FIRST_PROBES => {
                self.first_tried += 1;
                Some(0)
            }
            // The first probes are out, their samples not all back: wait for them.
            Mode::Auto if self.samples < FIRST_PROBES && !self.on => None,
            Mode::Auto => {
                if let Some(i) = self.take_trial() {
                    return Some(i);
                }
                if self.on {
                    self.since_probe += 1;
                    return Some(self.at);
                }
                self.since_probe += 1;
                if self.since_probe >= PROBE_EVERY {
                    self.since_probe = 0;
                    Some(self.at)
                } else {
                    None
                }
            }
        }
    }

    /// The trial level, if one is due and not out yet.
    fn take_trial(&mut self) -> Option<usize> {
        match self.trial {
            Some((i, false)) => {
                self.trial = Some((i, true));
                Some(i)
            }
            _ => None,
        }
    }

    /// The level of the unit [`Adaptive::next_level`] handed out last.
    pub fn last_level(&self) -> i32 {
        LEVELS[self.last]
    }

    /// A unit [`Adaptive::compress_next`] chose was not compressed after all (it held only
    /// zeros, sent as such): the probe goes to a later unit.
    pub fn not_tried(&mut self) {
        if let Some((i, true)) = self.trial {
            // A trial's unit held zeros: the next unit tries that level instead.
            self.trial = Some((i, false));
            return;
        }
        if self.mode != Mode::Auto || self.on {
            return;
        }
        if self.samples < FIRST_PROBES && self.first_tried > self.samples {
            self.first_tried -= 1;
        } else {
            self.since_probe = PROBE_EVERY - 1;
        }
    }

    /// A unit of `data` bytes was compressed to `frame` bytes in `took` at the level
    /// [`Adaptive::next_level`] gave last; the stream's wire rate is `rate` bytes per
    /// second, when known.
    pub fn sample(&mut self, data: usize, frame: usize, took: Duration, rate: Option<u64>) {
        self.sample_at(self.last_level(), data, frame, took, rate);
    }

    /// A unit of `data` bytes was compressed to `frame` bytes in `took` at zstd `level`
    /// (one of [`LEVELS`]); the stream's wire rate is `rate` bytes per second, when known.
    pub fn sample_at(
        &mut self,
        level: i32,
        data: usize,
        frame: usize,
        took: Duration,
        rate: Option<u64>,
    ) {
        if data == 0 {
            return;
        }
        let Some(i) = LEVELS.iter().position(|&l| l == level) else {
            return;
        };
        let r = frame as f64 / data as f64;
        let s = data as f64 / took.as_secs_f64().max(1e-6);
        let ewma = |old: f64, new: f64| old + ALPHA * (new - old);
        self.measured[i] = Some(match self.measured[i] {
            Some(m) => Measure {
                ratio: ewma(m.ratio, r),
                speed: ewma(m.speed, s),
            },
            None => Measure { ratio: r, speed: s },
        });
        self.samples += 1;
        if matches!(self.trial, Some((t, _)) if t == i) {
            self.trial = None;
        }
        if self.mode != Mode::Off {
            self.decide(rate);
        }
    }

    /// The level units go at, whether they are compressed (auto), and the level to try
    /// next: from what every level measured showed, at wire rate `rate`.
    fn decide(&mut self, rate: Option<u64>) {
        let best = best_level(&self.measured, rate, self.threads);
        if let Some(b) = best {
            self.at = b;
        }
        if self.mode == Mode::Auto {
            self.on = self.pays(rate);
        }
        let Some(w) = rate.filter(|&w| w > 0).map(|w| w as f64) else {
            // No rate: nothing says the compressors fall behind; the best ratio.
            return;
        };
        if self.trial.is_some() {
            return;
        }
        let Some(m) = self.measured[self.at].filter(|m| m.ratio <= WORTH) else {
            return;
        };
        let faster = (self.at + 1 < LEVELS.len()).then_some(self.at + 1);
        let slower = self.at.checked_sub(1);
        let cpu_bound = m.cpu_bound(w, self.threads);
        // A faster level never measured, while the compressors bind: try it at once.
        if cpu_bound {
            if let Some(f) = faster.filter(|&f| self.measured[f].is_none()) {
                self.trial = Some((f, false));
                return;
            }
        }
        // While on, the neighbour on the side that could move more, measured again now
        // and then: the load, and so the compressors' speed, changes.
        if self.on && self.since_probe >= PROBE_EVERY {
            self.since_probe = 0;
            let n = if cpu_bound { faster } else { slower };
            if let Some(n) = n {
                self.trial = Some((n, false));
            }
        }
    }

    /// The zstd level units go at now.
    pub fn level(&self) -> i32 {
        LEVELS[self.at]
    }

    /// Whether compression pays at wire rate `rate`, by what the units tried showed, at the
    /// level units go at.
    pub fn pays(&self, rate: Option<u64>) -> bool {
        let Some(m) = self.measured[self.at] else {
            return false;
        };
        if m.ratio > WORTH {
            return false;
        }
        match rate.filter(|&w| w > 0) {
            Some(w) => {
                let w = w as f64;
                m.effective(w, self.threads) >= GAIN * w
            }
            None => true,
        }
    }

    /// Whether units are being compressed now.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// The running frame/data ratio of the units tried at the level units go at.
    pub fn ratio(&self) -> Option<f64> {
        self.measured[self.at].map(|m| m.ratio)
    }
}

/// Whether a unit of `data` bytes compressed to `frame` bytes goes as the frame.
pub fn worth_sending(data: usize, frame: usize) -> bool {
    (frame as f64) <= data as f64 * WORTH
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    /// Feeds `n` units of `ratio` compressed at `speed` MB/s; how many were tried.
    fn feed(a: &mut Adaptive, n: u32, ratio: f64, speed: f64, rate: Option<u64>) -> u32 {
        let mut tried = 0;
        for _ in 0..n {
            if a.compress_next() {
                tried += 1;
                let took = Duration::from_secs_f64(1.0 / speed);
                a.sample(MB, (MB as f64 * ratio) as usize, took, rate);
            }
        }
        tried
    }

    #[test]
    fn incompressible_data_is_tried_then_left_alone() {
        let mut a = Adaptive::new(Mode::Auto, 2);
        let tried = feed(&mut a, 4 + 320, 1.0, 500.0, Some(40_000_000));
        assert!(!a.is_on());
        // The first units, then one in PROBE_EVERY.
        assert_eq!(tried, FIRST_PROBES + 320 / PROBE_EVERY);
    }

    #[test]
    fn text_over_a_slow_link_is_compressed() {
        let mut a = Adaptive::new(Mode::Auto, 2);
        let tried = feed(&mut a, 100, 0.4, 300.0, Some(40_000_000));
        assert!(a.is_on());
        assert_eq!(tried, 100);
        assert!((a.ratio().unwrap() - 0.4).abs() < 1e-4);
    }

    #[test]
    fn a_compressor_slower_than_the_link_is_not_used() {
        // 2:1 data, one core compressing 30 MB/s, a 100 MB/s stream: 30 < 110.
        let mut a = Adaptive::new(Mode::Auto, 1);
        feed(&mut a, 50, 0.5, 30.0, Some(100_000_000));
        assert!(!a.is_on());
        // The same on a 20 MB/s stream pays: min(40, 30) ≥ 22.
        let mut a = Adaptive::new(Mode::Auto, 1);
        feed(&mut a, 50, 0.5, 30.0, Some(20_000_000));
        assert!(a.is_on());
        // Two cores double what the compressors keep up with.
        let mut a = Adaptive::new(Mode::Auto, 4);
        feed(&mut a, 50, 0.5, 30.0, Some(100_000_000));
        assert!(a.is_on());
    }

    #[test]
    fn a_small_gain_does_not_pay() {
        let mut a = Adaptive::new(Mode::Auto, 8);
        feed(&mut a, 50, 0.95, 1000.0, Some(10_000_000));
        assert!(!a.is_on());
        // No rate known: the ratio alone.
        let mut a = Adaptive::new(Mode::Auto, 8);
        feed(&mut a, 50, 0.5, 1000.0, None);
        assert!(a.is_on());
    }

    #[test]
    fn a_window_handed_out_before_any_result_tries_only_the_first_probes() {
        // A long path's stream hands out dozens of units before the first compression
        // ends: only FIRST_PROBES of them are tried (all of them were, before).
        let mut a = Adaptive::new(Mode::Auto, 2);
        let window = (0..64).filter(|_| a.compress_next()).count() as u32;
        assert_eq!(window, FIRST_PROBES);
        // Their results: random data. Off, then one unit in PROBE_EVERY.
        for _ in 0..FIRST_PROBES {
            a.sample(MB, MB + 40, Duration::from_millis(2), Some(12_500_000));
        }
        assert!(!a.is_on());
        let later = (0..PROBE_EVERY * 4).filter(|_| a.compress_next()).count() as u32;
        assert_eq!(later, 4);
        // Text: the first window's probes turn it on once their results are back, and
        // every unit is then compressed.
        let mut t = Adaptive::new(Mode::Auto, 2);
        assert_eq!(
            (0..64).filter(|_| t.compress_next()).count() as u32,
            FIRST_PROBES
        );
        for _ in 0..FIRST_PROBES {
            t.sample(MB, MB / 3, Duration::from_millis(2), Some(12_500_000));
        }
        assert!(t.is_on());
        assert_eq!((0..10).filter(|_| t.compress_next()).count(), 10);
    }

    #[test]
    fn a_probe_on_a_unit_of_zeros_goes_to_the_next_unit() {
        let mut a = Adaptive::new(Mode::Auto, 2);
        assert!(a.compress_next());
        a.not_tried();
        let tried = (0..64).filter(|_| a.compress_next()).count() as u32;
        assert_eq!(tried, FIRST_PROBES);
        for _ in 0..FIRST_PROBES {
            a.sample(MB, MB, Duration::from_millis(2), None);
        }
        // Off: the periodic probe lands on zeros, the next unit is tried instead.
        let mut n = 0;
        while !a.compress_next() {
            n += 1;
        }
        assert_eq!(n, PROBE_EVERY - 1);
        a.not_tried();
        assert!(a.compress_next());
    }

    #[test]
    fn the_decision_follows_the_data() {
        let rate = Some(40_000_000);
        let mut a = Adaptive::new(Mode::Auto, 2);
        feed(&mut a, 20, 1.0, 500.0, rate);
        assert!(!a.is_on());
        // The volume turns to text: the next probe finds it (within PROBE_EVERY units).
        feed(&mut a, PROBE_EVERY, 0.3, 500.0, rate);
        assert!(a.is_on());
        // And back to random data: every unit is tried while on, so it turns off within a
        // few units (the running ratio from 0.3: 0.65, 0.83, 0.91).
        feed(&mut a, 2, 1.0, 500.0, rate);
        assert!(a.is_on());
        feed(&mut a, 1, 1.0, 500.0, rate);
        assert!(!a.is_on());
    }

    #[test]
    fn modes_off_and_on() {
        let mut off = Adaptive::new(Mode::Off, 2);
        assert_eq!(feed(&mut off, 100, 0.1, 1000.0, None), 0);
        let mut on = Adaptive::new(Mode::On, 1);
        assert_eq!(feed(&mut on, 10, 1.0, 1.0, Some(1 << 30)), 10);
        assert!(on.is_on());
    }

    /// Ratio and MiB/s of each of LEVELS on binaries, about what `zstd -b` shows here: each
    /// faster level shrinks less.
    const BINARIES: [(f64, f64); 5] = [
        (0.42, 90.0),
        (0.48, 130.0),
        (0.53, 160.0),
        (0.57, 200.0),
        (0.62, 260.0),
    ];

    /// 100 MiB/s of wire (800 Mbit/s less the headers), and a fifth of it.
    const WIRE: Option<u64> = Some(100 << 20);
    const SLOW: Option<u64> = Some(20 << 20);

    /// Feeds `n` units whose compression at each level gives `table`'s ratio and speed;
    /// units handed out at each level, in LEVELS' order.
    fn run(a: &mut Adaptive, n: u32, table: &[(f64, f64)], rate: Option<u64>) -> [u32; 5] {
        let mut at = [0; 5];
        for _ in 0..n {
            if let Some(level) = a.next_level() {
                let i = LEVELS.iter().position(|&l| l == level).unwrap();
                at[i] += 1;
                let (r, speed) = table[i];
                let took = Duration::from_secs_f64(1.0 / speed);
                a.sample_at(level, MB, (MB as f64 * r) as usize, took, rate);
            }
        }
        at
    }

    #[test]
    fn the_level_that_moves_the_most_volume_is_chosen() {
        let m = |&(ratio, speed): &(f64, f64)| {
            Some(Measure {
                ratio,
                speed: speed * MB as f64,
            })
        };
        let all: Vec<Option<Measure>> = BINARIES.iter().map(m).collect();
        // 100 MB/s of wire, one compressor: level 1 makes 90, --fast=3 160, --fast=5 175
        // (its link bound, 100 / 0.57, under what it compresses, 200), --fast=8 161.
        assert_eq!(best_level(&all, WIRE, 1.0), Some(3));
        // 20 MB/s of wire: the link binds at every level; the best ratio.
        assert_eq!(best_level(&all, SLOW, 1.0), Some(0));
        // No rate: the ratio alone.
        assert_eq!(best_level(&all, None, 1.0), Some(0));
        // Four compressors on 100 MB/s: level 1 keeps up (238 < 360).
        assert_eq!(best_level(&all, WIRE, 4.0), Some(0));
        // Only levels not measured or not worth it: none.
        let mut few = vec![None; 5];
        few[0] = Some(Measure {
            ratio: 0.97,
            speed: 5e8,
        });
        assert_eq!(best_level(&few, WIRE, 2.0), None);
    }

    #[test]
    fn compressors_behind_the_link_step_to_a_faster_level() {
        // One compressor, 100 MiB/s of wire: every faster level is tried once, then the
        // units go at --fast=5, the most volume a second (175 MiB/s against level 1's 90).
        let mut a = Adaptive::new(Mode::Auto, 1);
        let at = run(&mut a, 400, &BINARIES, WIRE);
        assert!(a.is_on());
        assert_eq!(a.level(), -5, "{at:?}");
        assert!(at[3] > 350, "most units at --fast=5: {at:?}");
        // The levels on the way were measured; then the slower neighbour, --fast=3, one
        // unit in PROBE_EVERY (the link binds at --fast=5: the side that could move more).
        // --fast=8 not at all: a faster level cannot move more where the link binds.
        assert!(at[..3].iter().all(|&n| n >= 1), "{at:?}");
        assert!(at[2] <= 400 / PROBE_EVERY + 1, "{at:?}");
        assert_eq!(at[4], 0, "{at:?}");
        // The same data on a link that binds: level 1 throughout, no unit at another.
        let mut slow = Adaptive::new(Mode::Auto, 1);
        let at = run(&mut slow, 400, &BINARIES, SLOW);
        assert_eq!(at, [400, 0, 0, 0, 0]);
        assert_eq!(slow.level(), 1);
    }

    #[test]
    fn compression_too_slow_at_level_1_pays_at_a_fast_level() {
        // Level 1 at 60 MiB/s on a 100 MiB/s stream: 60 < 110, off; --fast=8 at 200 MiB/s
        // moves 161 MiB/s: on, at a fast level.
        let table = [
            (0.42, 60.0),
            (0.48, 80.0),
            (0.53, 110.0),
            (0.57, 140.0),
            (0.62, 200.0),
        ];
        let mut a = Adaptive::new(Mode::Auto, 1);
        run(&mut a, 200, &table, WIRE);
        assert!(a.is_on());
        assert_eq!(a.level(), -8);
    }

    #[test]
    fn the_level_follows_the_load() {
        let mut a = Adaptive::new(Mode::Auto, 1);
        run(&mut a, 200, &BINARIES, WIRE);
        assert_eq!(a.level(), -5);
        // The machine quietens: every level compresses three times as fast, level 1 keeps
        // up with the link (270 > 238) and moves the most. The neighbours tried now and then
        // lead back to it within a few probe periods.
        let quiet: Vec<(f64, f64)> = BINARIES.iter().map(|&(r, s)| (r, 3.0 * s)).collect();
        run(&mut a, 6 * PROBE_EVERY, &quiet, WIRE);
        assert_eq!(a.level(), 1);
        // Busy again: back down.
        run(&mut a, 6 * PROBE_EVERY, &BINARIES, WIRE);
        assert_eq!(a.level(), -5);
    }

    #[test]
    fn a_trial_on_a_unit_of_zeros_goes_to_the_next_unit() {
        let mut a = Adaptive::new(Mode::Auto, 1);
        for _ in 0..FIRST_PROBES {
            assert_eq!(a.next_level(), Some(1));
            a.sample_at(1, MB, MB / 2, Duration::from_millis(20), WIRE);
        }
        // 50 MiB/s at level 1 on a 100 MiB/s stream: the next unit tries --fast=1.
        assert_eq!(a.next_level(), Some(-1));
        a.not_tried();
        assert_eq!(a.next_level(), Some(-1));
    }

    #[test]
    fn frames_worth_sending() {
        assert!(worth_sending(MB, MB / 2));
        assert!(!worth_sending(MB, MB * 95 / 100));
        assert!(!worth_sending(MB, MB + 10));
    }
}
