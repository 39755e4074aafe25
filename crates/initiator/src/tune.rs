//! Auto-tuning: what a session should look like for the path it runs over.
//!
//! Before login a TCP handshake to the portal measures the round-trip time (`TCP_INFO`).
//! With the bottleneck rate (`--rate`, or an assumed 1 Gbit/s) that gives the
//! bandwidth-delay product, and from it [`plan`] chooses, for every option not set by hand:
//!
//! - **connections**: one on a LAN; on a long path two, or with a known rate 4 (from 10 ms)
//!   or 8 (from 30 ms) paced ones, because a loss slows only the flow it hit; more when one
//!   socket's buffer cannot hold its share of the window;
//! - **queue depth**: enough commands to keep twice the BDP in flight (BBR's cwnd gain)
//!   plus two per connection, so that every connection always has work;
//! - **bursts**: on a long path FirstBurstLength and MaxBurstLength as large as one command,
//!   so that a write goes out whole without waiting a round trip for an R2T;
//! - **buffers**: left to the kernel's autotuning when its ceiling holds the connection's
//!   share of the window, set explicitly (past `net.core.*mem_max` with CAP_NET_ADMIN)
//!   when it does not;
//! - **pacing**: with a known bottleneck rate, each connection is paced to its share of it
//!   (R1's remedy: senders held to the bottleneck never overrun its queue). The rate goes
//!   to the target too (`X-org.reservoir.PacingRate` at each connection's login), so that
//!   its Data-In is paced the same way; [`TargetPacingReport`] says what it answered.
//!
//! While the session runs, every connection's reader samples `TCP_INFO` once a second; the
//! session grows its queue depth when the measured delivery rate needs more in flight than
//! the plan assumed ([`grown_queue_depth`]), and on a long path cuts it back when it holds
//! far more than the measured peak rate needs ([`shrunk_queue_depth`]).
//!
//! [`plan`] is a pure function of its inputs so that it can be unit-tested; [`probe`] does
//! the I/O.

use std::time::Duration;

use serde::Serialize;
use units::{Rate, Size};

use crate::{Error, Result, SessionOptions};

/// Rate assumed for sizing when none is given: a fast WAN. Sizing for more than the path
/// carries costs memory only where data actually queues.
pub const ASSUMED_RATE: u64 = net::ASSUMED_RATE_BPS / 8;

/// Bytes per second a session on `rsv` starts at when it knows no rate (none given, none
/// remembered): 20 Mbit/s shared by its connections, a window of twice that times the RTT
/// from the first data instead of ten packets a connection. On R0 (100 ms) that is about
/// 345 packets for the session instead of 20: four of BBR's doublings, about 0.4 s of a
/// copy's start. A start, not a pace: on a slower path `rsv` drops it when BBR leaves
/// STARTUP, three rounds without delivery-rate growth.
pub const UNKNOWN_PATH_START: u64 = 20_000_000 / 8;

/// Bytes per second at which each of `n` connections of a session on `rsv` that knows no
/// rate sends its start's first round (its share of [`UNKNOWN_PATH_START`] x RTT): the
/// assumed rate's share, never below the start `each`.
///
/// Why: BBR's delivery-rate samples of a first round are the round's data over a round
/// trip, the start rate whatever the path; the spacing of that round's ACKs is the
/// bottleneck's rate only if the round went faster than the bottleneck, so it goes at the
/// rate a fast WAN would have (`rsv` then starts at what the ACKs showed:
/// `docs/congestion.md`, "The probed start"). The data is the same as without the probe;
/// at a slower bottleneck it queues at most N x (1 - C/R) packets of it once, which a
/// queue of one BDP at the start rate holds (at 20 Mbit/s and faster).
pub fn unknown_path_probe(n: u64, each: u64) -> u64 {
    (ASSUMED_RATE / n.max(1)).max(each)
}
/// Below this RTT the path is a LAN: one connection, the kernel's defaults.
pub const LAN_RTT: Duration = Duration::from_millis(10);
/// From this RTT on, eight connections.
pub const LONG_RTT: Duration = Duration::from_millis(30);
pub const MAX_CONNECTIONS: u16 = 32;
pub const MAX_QUEUE_DEPTH: usize = 1024;
/// The largest burst RFC 7143 allows (2^24 - 1) rounded down to 1 KiB.
pub const MAX_BURST: u32 = 16_776_192;

/// What was measured before login, and what an earlier session learnt of the path.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Probe {
    /// Round-trip time of the handshake, microseconds.
    pub rtt_us: u32,
    pub mss: u32,
    /// The rate an earlier session with this peer moved (`net::paths`), if one did lately.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remembered: Option<Remembered>,
    /// The process's default congestion control, for a session given none.
    #[serde(skip)]
    pub congestion_default: Option<net::congestion::Choice>,
}

/// A path's rate from the path cache, and how old it is.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Remembered {
    pub rate_bytes_per_s: u64,
    pub age_s: u64,
}

/// What auto-tuning saw and chose, and why. `rsv tune` prints it; `rsv cp --json` and
/// `rsv bench --json` carry it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Plan {
    pub enabled: bool,
    pub rtt_ms: f64,
    /// Bytes per second the plan was sized for.
    pub rate_bytes_per_s: u64,
    /// "given" (--rate) or "assumed".
    pub rate_source: &'static str,
    pub bdp_bytes: u64,
    /// Bytes the session keeps in flight (twice the BDP).
    pub in_flight_bytes: u64,
    pub io_size: u64,
    pub connections: u16,
    pub queue_depth: usize,
    pub first_burst: u32,
    pub max_burst: u32,
    pub send_buffer: Option<usize>,
    pub recv_buffer: Option<usize>,
    /// Bytes per second per connection.
    pub pacing_rate: Option<u64>,
    pub congestion: Option<String>,
    pub kernel: net::KernelLimits,
    /// Whether the session finds the bottleneck's rate while it runs and paces to it
    /// ([`RateControl`]).
    pub rate_control: bool,
    /// One line per choice: what and why.
    pub reasons: Vec<String>,
}

/// Applies auto-tuning to `opts` for a path measured by `probe`; returns the options to use
/// and the plan that explains them. Options in `opts.pinned` are kept.
pub fn plan(
    opts: &SessionOptions,
    probe: &Probe,
    kernel: &net::KernelLimits,
) -> (SessionOptions, Plan) {
    let mut o = opts.clone();
    // Given no congestion control, the process's default (decided where it may load rsv).
    let default_cc = probe
        .congestion_default
        .as_ref()
        .filter(|_| opts.congestion.is_none());
    if let Some(c) = default_cc {
        o.congestion = c.name.clone();
        o.congestion_default = Some(c.clone());
    }
    let rtt = Duration::from_micros(u64::from(probe.rtt_us.max(1)));
    let remembered = probe
        .remembered
        .filter(|r| opts.rate.is_none() && opts.path_cache && r.rate_bytes_per_s > 0);
    let (rate, rate_source) = match (opts.rate, remembered) {
        (Some(r), _) => (r.max(1), "given"),
        // Sized for at least the assumed rate, as without a cache: sizing for more costs
        // memory only where data queues, while a queue sized for a remembered rate left no
        // room when the bottleneck's queue stretched the round trip (RTT sweep, 300 ms
        // reads: 4.8 s of link time lost after the start with QD 39, against 0.6 s with
        // the assumed rate's 76).
        (None, Some(m)) => (m.rate_bytes_per_s.max(ASSUMED_RATE), "remembered"),
        (None, None) => (ASSUMED_RATE, "assumed"),
    };
    let bdp = net::bdp_bytes(rate.saturating_mul(8), rtt);
    let in_flight = bdp.saturating_mul(2).max(1 << 20);
    let io = opts.io_size_hint.unwrap_or(1 << 20).clamp(4096, 64 << 20);
    let mut reasons = Vec::new();
    let mut plan = Plan {
        enabled: opts.auto_tune,
        rtt_ms: rtt.as_secs_f64() * 1e3,
        rate_bytes_per_s: rate,
        rate_source,
        bdp_bytes: bdp,
        in_flight_bytes: in_flight,
        io_size: io,
        connections: o.connections,
        queue_depth: o.queue_depth,
        first_burst: o.first_burst,
        max_burst: o.max_burst,
        send_buffer: o.send_buffer,
        recv_buffer: o.recv_buffer,
        pacing_rate: o.pacing_rate,
        congestion: o.congestion.clone(),
        kernel: *kernel,
        rate_control: false,
        reasons: Vec::new(),
    };
    if !opts.auto_tune {
        plan.reasons
            .push("auto-tuning off: every option as given or default".into());
        return (o, plan);
    }
    let rate_note = match (opts.rate, remembered) {
        (Some(_), _) => format!("{} given", Rate::from_bytes_per_sec(rate).approx()),
        (None, Some(m)) => format!(
            "{} remembered from a session {} ago{} (give --rate for the real bottleneck)",
            Rate::from_bytes_per_sec(m.rate_bytes_per_s).approx(),
            age(m.age_s),
            if rate > m.rate_bytes_per_s {
                format!(
                    ", sized for the assumed {}",
                    Rate::from_bytes_per_sec(rate).approx()
                )
            } else {
                String::new()
            }
        ),
        (None, None) => format!(
            "{} assumed (give --rate for the real bottleneck)",
            Rate::from_bytes_per_sec(rate).approx()
        ),
    };
    reasons.push(format!(
        "RTT {:.1} ms measured on a TCP handshake; {rate_note}: BDP {}, {} kept in flight",
        plan.rtt_ms,
        Size(bdp).approx(),
        Size(in_flight).approx()
    ));

    // Connections: by RTT, then enough that one socket's share of the window fits the
    // largest buffer it can have.
    let per_socket_max = if kernel.can_force {
        net::MAX_EXPLICIT_BUFFER
    } else {
        kernel.tcp_wmem_max.max(kernel.wmem_max) / 2
    }
    .max(64 * 1024) as u64;
    if opts.is_pinned("connections") {
        reasons.push(format!("connections: {} (set by hand)", o.connections));
    } else {
        // Measured on the R0 link (100 Mbit/s, 100 ms, 1 % and 5 % loss, BBR, buffers as
        // below): unpaced, 1 or 2 connections keep the link full while 4 or 8 overrun the
        // bottleneck queue and lose 10 % to retransmissions; paced to a known rate, 4 or 8
        // do as well as 1 with a fifth of the retransmissions and no standing queue.
        let paced = opts.rate.is_some() && !opts.is_pinned("pacing_rate");
        let by_rtt: u16 = match (rtt < LAN_RTT, rtt < LONG_RTT, paced) {
            (true, _, _) => 1,
            (false, _, false) => 2,
            (false, true, true) => 4,
            (false, false, true) => 8,
        };
        let by_buffer = in_flight
            .div_ceil(per_socket_max)
            .min(u64::from(MAX_CONNECTIONS)) as u16;
        o.connections = by_rtt.max(by_buffer).clamp(1, MAX_CONNECTIONS);
        reasons.push(if by_buffer > by_rtt {
            format!(
                "connections: {} so that each holds its share of the window in a {} buffer",
                o.connections,
                Size(per_socket_max).approx()
            )
        } else if by_rtt == 1 {
            "connections: 1 (RTT below 10 ms: one flow fills the path)".into()
        } else if paced {
            format!(
                "connections: {} (RTT {}, paced to the given rate: a loss slows only the flow \
                 it hits, 1/{} of the pipe, and pacing keeps the flows from overrunning the \
                 bottleneck's queue)",
                o.connections,
                if rtt < LONG_RTT {
                    "10-30 ms"
                } else {
                    "30 ms or more"
                },
                o.connections
            )
        } else {
            format!(
                "connections: {} (RTT 10 ms or more, rate unknown: two flows ride out a loss; \
                 more unpaced flows would overrun the bottleneck's queue — give --rate to pace \
                 more)",
                o.connections
            )
        });
    }
    let n = u64::from(o.connections);

    if opts.is_pinned("queue_depth") {
        reasons.push(format!("queue depth: {} (set by hand)", o.queue_depth));
    } else {
        let qd = (in_flight.div_ceil(io) + 2 * n) as usize;
        o.queue_depth = qd.clamp(opts.queue_depth.min(32), MAX_QUEUE_DEPTH);
        reasons.push(format!(
            "queue depth: {} commands of {} (the in-flight bytes plus two per connection{})",
            o.queue_depth,
            Size(io).approx(),
            if rtt >= LAN_RTT {
                "; cut back to eight round trips of the measured rate once 8 s of work \
                 have measured it"
            } else {
                ""
            }
        ));
    }

    if rtt >= LAN_RTT {
        let burst = u32::try_from(io)
            .unwrap_or(MAX_BURST)
            .clamp(256 * 1024, MAX_BURST);
        if !opts.is_pinned("max_burst") {
            o.max_burst = o.max_burst.max(burst);
        }
        if !opts.is_pinned("first_burst") {
            o.first_burst = o.first_burst.max(burst).min(o.max_burst);
        }
        if !opts.is_pinned("initial_r2t") {
            o.initial_r2t = false;
        }
        if !opts.is_pinned("immediate_data") {
            o.immediate_data = true;
        }
        reasons.push(format!(
            "bursts: FirstBurstLength {}, MaxBurstLength {}, InitialR2T={}: a write goes out \
             without waiting a round trip for an R2T (the target may grant less)",
            Size(u64::from(o.first_burst)).approx(),
            Size(u64::from(o.max_burst)).approx(),
            if o.initial_r2t { "Yes" } else { "No" }
        ));
    }

    let window = (in_flight / n) as usize;
    for (key, auto_max, explicit_max, dir) in [
        ("send_buffer", kernel.tcp_wmem_max, kernel.wmem_max, "send"),
        (
            "recv_buffer",
            kernel.tcp_rmem_max,
            kernel.rmem_max,
            "receive",
        ),
    ] {
        if opts.is_pinned(key) {
            reasons.push(format!("{dir} buffer: set by hand"));
            continue;
        }
        let c = net::choose_buffer(window, auto_max, explicit_max, kernel.can_force);
        reasons.push(format!("{dir} buffer: {}", c.why));
        if key == "send_buffer" {
            o.send_buffer = c.bytes;
        } else {
            o.recv_buffer = c.bytes;
        }
    }

    if opts.is_pinned("pacing_rate") {
        reasons.push("pacing: set by hand".into());
    } else if let Some(r) = opts.rate {
        // 5 % above the share: the kernel paces whole packets, headers included, and a flow
        // recovering from a loss leaves room the others may take.
        let each = (r / n + r / n / 20).max(1);
        o.pacing_rate = Some(each);
        reasons.push(format!(
            "pacing: {} per connection, the given rate shared by {n} plus 5 %: the senders \
             never overrun the bottleneck's queue{}",
            Rate::from_bytes_per_sec(each).approx(),
            if opts.pacing_hint {
                "; the target is asked to pace its Data-In the same way"
            } else {
                ""
            }
        ));
    } else if !opts.rate_control {
        reasons.push(
            "pacing: none (no --rate; the congestion control paces; rate_control=yes would \
             find the bottleneck and pace to it)"
                .into(),
        );
    } else {
        plan.rate_control = true;
        reasons.push(format!(
            "pacing: none at first (no --rate); once the connections stop speeding up, the \
             rate they reached is the bottleneck's, and every connection is paced at its \
             share of {}% of it{}, to keep the bottleneck's queue short",
            CRUISE_GAIN,
            if opts.pacing_hint {
                " (and the target asked to pace its Data-In alike)"
            } else {
                ""
            }
        ));
    }
    let on_rsv = o
        .congestion
        .as_deref()
        .is_some_and(|c| c.split(',').any(|c| c.trim() == net::cc::NAME));
    if remembered.is_none()
        && opts.rate.is_none()
        && on_rsv
        && o.pacing_rate.is_none()
        && !opts.is_pinned("start_rate")
        && rtt >= LAN_RTT
    {
        let each = (UNKNOWN_PATH_START / n).max(1);
        o.start_rate = Some(each);
        let probe = if opts.is_pinned("probe_rate") {
            opts.probe_rate.filter(|r| *r > 0)
        } else {
            Some(unknown_path_probe(n, each))
        };
        o.probe_rate = Some(probe.unwrap_or(0));
        reasons.push(match probe {
            Some(p) => format!(
                "start: each connection sends its first round ({} x RTT: {} shared by {n}, \
                 no rate given or remembered) at {}, and starts at the rate its ACKs come \
                 back at, the bottleneck's share; BBR's own model takes over once the rate \
                 stops growing",
                Rate::from_bytes_per_sec(each).approx(),
                Rate::from_bytes_per_sec(UNKNOWN_PATH_START).approx(),
                Rate::from_bytes_per_sec(p).approx()
            ),
            None => format!(
                "start: each connection at {} ({} shared by {n}: no rate given or \
                 remembered) instead of ten packets; BBR's own model takes over once the \
                 rate stops growing",
                Rate::from_bytes_per_sec(each).approx(),
                Rate::from_bytes_per_sec(UNKNOWN_PATH_START).approx()
            ),
        });
    }
    if let Some(m) =
        remembered.filter(|_| !opts.is_pinned("pacing_rate") && !opts.is_pinned("start_rate"))
    {
        let each = (m.rate_bytes_per_s / n).max(1);
        o.start_rate = Some(each);
        let rsv = o
            .congestion
            .as_deref()
            .is_some_and(|c| c.split(',').any(|c| c.trim() == net::cc::NAME));
        reasons.push(if rsv {
            format!(
                "start: each connection at {} (the remembered rate shared by {n}) instead \
                 of ten packets; BBR's own model takes over once the rate stops growing",
                Rate::from_bytes_per_sec(each).approx()
            )
        } else {
            "start: the kernel's (congestion=rsv would start each connection at its share of \
             the remembered rate)"
                .into()
        });
    }
    reasons.push(match (&o.congestion, default_cc) {
        (_, Some(c)) => format!("congestion control: {}", c.why),
        (Some(cc), None) => format!("congestion control: {cc} (set by the congestion option)"),
        (None, None) => "congestion control: the kernel's default".into(),
    });

    plan.connections = o.connections;
    plan.queue_depth = o.queue_depth;
    plan.first_burst = o.first_burst;
    plan.max_burst = o.max_burst;
    plan.send_buffer = o.send_buffer;
    plan.recv_buffer = o.recv_buffer;
    plan.pacing_rate = o.pacing_rate;
    plan.congestion = o.congestion.clone();
    plan.reasons = reasons;
    (o, plan)
}

/// Whether the target paces what it sends us, from each connection's login answer to
/// `X-org.reservoir.PacingRate` (see `docs/internals.md`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TargetPacingReport {
    /// Bytes per second per connection asked of the target; `None`: not asked (no pacing
    /// rate in force, or `pacing_hint=no`).
    pub requested: Option<u64>,
    /// Live connections the target paces.
    pub paced_connections: usize,
    pub connections: Vec<ConnPacing>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ConnPacing {
    pub cid: u16,
    /// "paced", "not paced" (the target answered 0), "not understood" (not a Reservoir
    /// target), "refused" (Reject or a malformed answer), "not asked".
    pub answer: &'static str,
    /// The rate the target paces this connection at, bytes per second.
    pub rate_bytes_per_s: Option<u64>,
}

impl TargetPacingReport {
    pub fn new(
        requested: Option<u64>,
        conns: impl IntoIterator<Item = (u16, iscsi::negotiate::TargetPacing)>,
    ) -> Self {
        let mut connections: Vec<ConnPacing> = conns
            .into_iter()
            .map(|(cid, p)| ConnPacing {
                cid,
                answer: p.as_str(),
                rate_bytes_per_s: p.rate(),
            })
            .collect();
        connections.sort_by_key(|c| c.cid);
        TargetPacingReport {
            requested,
            paced_connections: connections
                .iter()
                .filter(|c| c.rate_bytes_per_s.is_some())
                .count(),
            connections,
        }
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        let Some(asked) = self.requested else {
            return "not asked (no pacing rate in force)".into();
        };
        let n = self.connections.len();
        let mut rates: Vec<u64> = self
            .connections
            .iter()
            .filter_map(|c| c.rate_bytes_per_s)
            .collect();
        rates.sort_unstable();
        rates.dedup();
        let mut line = format!(
            "asked {} per connection; the target paces {} of {n}",
            Rate::from_bytes_per_sec(asked).approx(),
            self.paced_connections
        );
        match rates.as_slice() {
            [] => {}
            [one] => line.push_str(&format!(" at {}", Rate::from_bytes_per_sec(*one).approx())),
            [lo, .., hi] => line.push_str(&format!(
                " at {} to {}",
                Rate::from_bytes_per_sec(*lo).approx(),
                Rate::from_bytes_per_sec(*hi).approx()
            )),
        }
        for answer in ["not paced", "not understood", "refused", "not asked"] {
            let k = self
                .connections
                .iter()
                .filter(|c| c.answer == answer)
                .count();
            if k > 0 {
                line.push_str(&format!(
                    "; {k} {answer}{}",
                    match answer {
                        "not paced" => " (its pacing hints are off)",
                        "not understood" => {
                            " (not a Reservoir target: its congestion control alone paces it)"
                        }
                        _ => "",
                    }
                ));
            }
        }
        line
    }
}

/// The queue depth the measured path needs: twice the delivered bytes per RTT, in
/// commands of `io` bytes, plus two per connection. `None` when `current` suffices.
pub fn grown_queue_depth(
    current: usize,
    delivery_rate: u64,
    min_rtt: Duration,
    io: u64,
    connections: usize,
) -> Option<usize> {
    let want = depth_for(delivery_rate, min_rtt, 2, io, connections);
    (want > current).then_some(want)
}

/// Commands of `io` bytes that hold `round_trips` round trips of `rate` bytes per second,
/// plus two per connection.
fn depth_for(rate: u64, min_rtt: Duration, round_trips: u64, io: u64, connections: usize) -> usize {
    let bdp = net::bdp_bytes(rate.saturating_mul(8), min_rtt);
    (bdp.saturating_mul(round_trips).div_ceil(io.max(1)) as usize + 2 * connections)
        .min(MAX_QUEUE_DEPTH)
}

/// Bytes kept in flight, in round trips of the measured peak rate, when a long path's queue
/// is cut back: four times what [`grown_queue_depth`] asks for, so that the two never take
/// turns, and enough for the holes a lossy path leaves (see [`shrunk_queue_depth`]).
pub const SHRINK_BDPS: u64 = 8;
/// How long the session must have been busy, and over what time the peak rate is taken,
/// before its queue is cut back. Far longer than a loss recovery or a PROBE_RTT dip.
pub const PEAK_WINDOW: Duration = Duration::from_secs(8);

/// The queue depth a long path needs once its rate is known, when the current one holds
/// far more (half as much again): [`SHRINK_BDPS`] round trips of the peak rate in
/// commands of `io` bytes, plus two per connection. `None` when `current` is not that
/// much deeper, or on a LAN (below [`LAN_RTT`]), where depth serves the storage and not
/// the path.
///
/// The plan sizes a session for an assumed 1 Gbit/s; on a 100 Mbit/s, 100 ms path that is
/// about 2.7 s of data queued in the initiator and the sockets. Every command waits that
/// long, and at the end of a copy the connections drain it unevenly while the link runs
/// part-empty. Measured on that path with 1 MiB writes for 30 s (the lab's R0 link):
/// - at 1 % loss, 9 to 12 commands instead of 32 kept the link as full, and the time
///   after the last command fell from 2.4-3.2 s to 0.6-1.0 s;
/// - at 5 % loss, four round trips (9-10 commands) lost about 2 Mbit/s against 32 (a
///   mean of 86.7 against 88.9 over five and six runs): a lost segment holds up every
///   command behind it on its connection for a round trip. Eight round trips (14
///   commands) gave 88.9, as 32 did, with a median latency of 1.25 s instead of 2.9 s.
pub fn shrunk_queue_depth(
    current: usize,
    peak_rate: u64,
    min_rtt: Duration,
    io: u64,
    connections: usize,
) -> Option<usize> {
    if min_rtt < LAN_RTT || peak_rate == 0 {
        return None;
    }
    let want = depth_for(peak_rate, min_rtt, SHRINK_BDPS, io, connections);
    (current > want + want / 2).then_some(want)
}

/// The highest rate a busy session delivered over the last [`PEAK_WINDOW`]: what its queue
/// can be sized for. Known only once the session has been busy that long without a break;
/// a sample while it was not busy starts it afresh (an idle session measures itself).
#[derive(Clone, Debug, Default)]
pub struct PeakRate {
    /// Busy samples (time, rate), oldest first; the first one is the newest at least a
    /// window old, so that the rest cover the window.
    hist: std::collections::VecDeque<(Duration, u64)>,
}

impl PeakRate {
    /// Records a sample at `at`; returns the peak over the window once busy samples cover
    /// it.
    pub fn push(&mut self, at: Duration, rate: u64, busy: bool) -> Option<u64> {
        if !busy {
            self.hist.clear();
            return None;
        }
        self.hist.push_back((at, rate));
        while self.hist.len() > 1 && at.saturating_sub(self.hist[1].0) >= PEAK_WINDOW {
            self.hist.pop_front();
        }
        let (first, _) = self.hist[0];
        (at.saturating_sub(first) >= PEAK_WINDOW)
            .then(|| self.hist.iter().map(|&(_, r)| r).max().unwrap_or(0))
    }
}

/// What a session learns of its path for the path cache (`net::paths`): the rate it moved
/// while it had work queued, as the upper quartile of its busy samples (above the ramp of
/// the start, below a burst of acknowledgments after a loss), and the least RTT seen.
#[derive(Clone, Debug, Default)]
pub struct PathLearner {
    busy: std::collections::VecDeque<u64>,
    min_rtt_us: u32,
}

/// Busy samples kept for the estimate, the newest.
const LEARN_SAMPLES: usize = 64;
/// Busy samples needed before the session says anything of the path.
pub const LEARN_MIN_SAMPLES: usize = 3;

impl PathLearner {
    /// One sample of the session: the rate its connections moved lately, whether it had
    /// work queued, and the least RTT they saw (0: none).
    pub fn push(&mut self, rate: u64, busy: bool, min_rtt_us: u32) {
        if min_rtt_us > 0 && (self.min_rtt_us == 0 || min_rtt_us < self.min_rtt_us) {
            self.min_rtt_us = min_rtt_us;
        }
        if !busy || rate == 0 {
            return;
        }
        if self.busy.len() == LEARN_SAMPLES {
            self.busy.pop_front();
        }
        self.busy.push_back(rate);
    }

    /// (rate in bytes per second, min RTT in microseconds), once enough busy samples came.
    pub fn estimate(&self) -> Option<(u64, u32)> {
        if self.busy.len() < LEARN_MIN_SAMPLES || self.min_rtt_us == 0 {
            return None;
        }
        let mut v: Vec<u64> = self.busy.iter().copied().collect();
        v.sort_unstable();
        Some((v[v.len() * 3 / 4], self.min_rtt_us))
    }
}

/// Finds the bottleneck's rate from what the session delivers, and paces the session to
/// it, when nobody gave the rate (`--rate`). R1's remedy without being told the number:
/// senders held to the bottleneck never fill its queue, so it drops nothing and the round
/// trip stays at its floor.
///
/// Every few round trips ([`RateControl::interval`]) it is fed the rate at which the
/// session's connections moved segments across the path, each measured from `TCP_INFO`
/// over a [`SpanRate`] and summed, and answers with the total pacing rate the session
/// should keep, to be shared by its connections:
///
/// - **start-up**: no pacing while the congestion control ramps up; the highest rate seen
///   so far is remembered. When [`FLAT_TICKS`] busy samples in a row fail to grow it by
///   a quarter, the pipe is full and that rate is the bottleneck's.
/// - **cruise**: the session is paced at [`CRUISE_GAIN`] times the highest rate of the
///   last [`WINDOW`] busy samples. The margin lets the rate grow by a few percent per
///   sample when the path frees up (the delivered rate follows the pacing up), and the
///   window lets it fall when the path is shared.
///
/// Samples while the session had little to do (`busy` false) are skipped: an idle
/// session delivers little, and that says nothing about the path.
///
/// Off by default (`rate_control=yes`): in the lab it helped nowhere beyond noise and
/// cost four independent backups sharing one bottleneck (R1) 12 points of the link and
/// their fairness, each pacing itself to its own measurement
/// (`lab/results/rate-control/`).
#[derive(Clone, Debug, Default)]
pub struct RateControl {
    last: Option<Duration>,
    cruising: bool,
    best: u64,
    flat: u32,
    recent: std::collections::VecDeque<u64>,
    pace: Option<u64>,
}

/// One connection's delivery rate over at least a span of time: ACKs that arrive in
/// bunches and a hole filled after a loss make short-term rates jump far above what the
/// path carries.
#[derive(Clone, Debug, Default)]
pub struct SpanRate {
    /// Earlier samples (time, bytes delivered), oldest first.
    hist: std::collections::VecDeque<(Duration, u64)>,
}

impl SpanRate {
    /// Records the counter `delivered` at `at`; returns the rate since the newest earlier
    /// sample at least `span` older, if there is one. A counter that goes backwards
    /// starts afresh.
    pub fn push(&mut self, at: Duration, delivered: u64, span: Duration) -> Option<u64> {
        if self
            .hist
            .back()
            .is_some_and(|&(t, d)| delivered < d || at < t)
        {
            self.hist.clear();
        }
        let from = self
            .hist
            .iter()
            .rposition(|&(t, _)| at.saturating_sub(t) >= span && t < at);
        let rate = from.map(|i| {
            let (t0, d0) = self.hist[i];
            self.hist.drain(..i);
            ((delivered - d0) as f64 / (at - t0).as_secs_f64()) as u64
        });
        self.hist.push_back((at, delivered));
        rate
    }
}

/// Busy samples without growth that end the start-up.
pub const FLAT_TICKS: u32 = 3;
/// Busy samples the bottleneck estimate is the maximum of, in cruise.
pub const WINDOW: usize = 10;
/// Pacing over the estimate, in cruise, in hundredths.
pub const CRUISE_GAIN: u64 = 105;
/// A new pacing rate is applied only when it differs from the one in force by more than
/// this many hundredths (each change costs a setsockopt per socket, and a Text request
/// per connection when the target paces its Data-In).
const CHANGE_MIN: u64 = 2;

/// What [`RateControl`] knows, for `--json` and `rsv tune`.
#[derive(Clone, Debug, Serialize, PartialEq, Default)]
pub struct RateControlReport {
    /// "start-up" or "cruise".
    pub phase: &'static str,
    /// The bottleneck's rate as measured: segments across the path × MSS, per second.
    pub bottleneck_bytes_per_s: u64,
    /// The session's total pacing rate, bytes per second (None: unpaced).
    pub pacing_bytes_per_s: Option<u64>,
}

impl RateControl {
    /// How often to sample: a few round trips, so that a sample sees the pacing of the
    /// one before, within 50 ms..1 s.
    pub fn interval(min_rtt: Duration) -> Duration {
        (min_rtt * 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
    }

    /// The least time a rate is measured over: eight round trips, within 1..4 s.
    pub fn span(min_rtt: Duration) -> Duration {
        (min_rtt * 8).clamp(Duration::from_secs(1), Duration::from_secs(4))
    }

    /// One sample at `at`. `rate`: what the session's connections moved lately, bytes
    /// per second, each measured over a [`SpanRate`] and summed (`None` while one has not
    /// run a span yet); `busy`: whether the session had work queued meanwhile. Returns
    /// the new total pacing rate when it changes.
    pub fn sample(&mut self, at: Duration, rate: Option<u64>, busy: bool) -> Option<u64> {
        self.last = Some(at);
        let rate = rate.filter(|_| busy)?;
        if !self.cruising {
            if rate > self.best.saturating_add(self.best / 4) {
                self.flat = 0;
            } else {
                self.flat += 1;
            }
            self.best = self.best.max(rate);
            if self.flat < FLAT_TICKS {
                return None;
            }
            self.cruising = true;
            self.recent.push_back(self.best);
        } else {
            self.recent.push_back(rate);
            if self.recent.len() > WINDOW {
                self.recent.pop_front();
            }
        }
        let est = self.recent.iter().copied().max().unwrap_or(0).max(1);
        let pace = est.saturating_mul(CRUISE_GAIN) / 100;
        let changed = match self.pace {
            None => true,
            Some(p) => pace.abs_diff(p).saturating_mul(100) > p.saturating_mul(CHANGE_MIN),
        };
        if changed {
            self.pace = Some(pace);
            return Some(pace);
        }
        None
    }

    /// Whether a sample is due at `at`, `every` being the sampling interval.
    pub fn due(&self, at: Duration, every: Duration) -> bool {
        self.last
            .is_none_or(|t| at.saturating_sub(t) >= every.mul_f64(0.9))
    }

    pub fn report(&self) -> RateControlReport {
        RateControlReport {
            phase: if self.cruising { "cruise" } else { "start-up" },
            bottleneck_bytes_per_s: if self.cruising {
                self.recent.iter().copied().max().unwrap_or(0)
            } else {
                self.best
            },
            pacing_bytes_per_s: self.pace,
        }
    }
}

/// What a connection without a TCP socket counts as carrying per segment: as much as
/// loopback does.
const LOOPBACK_MSS: u32 = 65_483;

/// Handshakes per probe: a lost SYN or SYN-ACK makes one handshake's RTT a
/// retransmission timeout, so the smallest of a few is taken.
const PROBE_HANDSHAKES: usize = 3;

/// Measures the path to `portal` with a few concurrent TCP handshakes (no login), each
/// through `dialer` when one is given.
pub async fn probe(portal: &str, dialer: Option<&net::transport::Dialer>) -> Result<Probe> {
    probe_keep(portal, dialer, None).await.map(|(p, _)| p)
}

/// As [`probe`], and hands back the connections it made, so that a session logs in on
/// them instead of dialing again: on a long path that saves a round trip. They are dialled
/// with `recv_buffer` (their first window, see `net::first_window_buffer`).
pub async fn probe_keep(
    portal: &str,
    dialer: Option<&net::transport::Dialer>,
    recv_buffer: Option<usize>,
) -> Result<(Probe, Vec<net::transport::Stream>)> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..PROBE_HANDSHAKES {
        set.spawn(handshake(portal.to_owned(), dialer.cloned(), recv_buffer));
    }
    let mut best: Option<Probe> = None;
    let mut streams = Vec::new();
    let mut last_err = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok((p, s))) => {
                if best.as_ref().is_none_or(|b| p.rtt_us < b.rtt_us) {
                    best = Some(p);
                }
                streams.push(s);
            }
            Ok(Err(e)) => last_err = Some(e),
            Err(e) => last_err = Some(Error::Protocol(e.to_string())),
        }
    }
    let best = best.ok_or_else(|| last_err.unwrap_or(Error::Closed))?;
    Ok((best, streams))
}

async fn handshake(
    portal: String,
    dialer: Option<net::transport::Dialer>,
    recv_buffer: Option<usize>,
) -> Result<(Probe, net::transport::Stream)> {
    let s = crate::conn::dial(&portal, dialer.as_ref(), recv_buffer).await?;
    let Some(fd) = s.socket() else {
        // A carrier with no socket under it (in memory) has no path to wait for.
        let p = Probe {
            rtt_us: 1,
            mss: LOOPBACK_MSS,
            remembered: None,
            congestion_default: None,
        };
        return Ok((p, s));
    };
    let info = net::tcp_info(fd)?;
    let p = Probe {
        rtt_us: info.rtt_us.max(1),
        mss: info.snd_mss,
        remembered: None,
        congestion_default: None,
    };
    Ok((p, s))
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> net::KernelLimits {
        net::KernelLimits {
            tcp_wmem_max: 4 << 20,
            tcp_rmem_max: 6 << 20,
            wmem_max: 212_992,
            rmem_max: 212_992,
            can_force: true,
        }
    }

    fn probe_ms(ms: u32) -> Probe {
        Probe {
            rtt_us: ms * 1000,
            mss: 1448,
            remembered: None,
            congestion_default: None,
        }
    }

    #[test]
    fn path_learner_takes_the_upper_quartile_of_busy_samples() {
        let mut l = PathLearner::default();
        l.push(9_000_000, true, 0);
        l.push(50_000_000, false, 101_000);
        assert_eq!(l.estimate(), None, "one busy sample says nothing");
        // A ramp, the cruise and one burst.
        for r in [2, 6, 11, 12, 12, 12, 12, 12, 12, 12, 12, 30] {
            l.push(r * 1_000_000, true, 100_500);
        }
        assert_eq!(l.estimate(), Some((12_000_000, 100_500)));
        for _ in 0..LEARN_SAMPLES {
            l.push(5_000_000, true, 0);
        }
        assert_eq!(
            l.estimate(),
            Some((5_000_000, 100_500)),
            "the newest samples count"
        );
    }

    #[test]
    fn an_unknown_long_path_on_rsv_starts_above_ten_packets() {
        let rsv = SessionOptions {
            congestion: Some("rsv".into()),
            ..Default::default()
        };
        let (o, p) = plan(&rsv, &probe_ms(100), &kernel());
        let n = u64::from(o.connections);
        assert_eq!(o.start_rate, Some(UNKNOWN_PATH_START / n));
        assert_eq!(o.pacing_rate, None, "a start, not a pace");
        assert!(
            p.reasons
                .iter()
                .any(|r| r.contains("no rate given or remembered")),
            "{:?}",
            p.reasons
        );
        // The default decided rsv: the same.
        let mut probe = probe_ms(100);
        probe.congestion_default = Some(net::congestion::choose(
            &net::congestion::Host {
                built: Ok(()),
                cap_eff: u64::MAX,
                btf: true,
                available: vec!["bbr".into()],
                allowed: vec![],
            },
            Ok(()),
        ));
        let (o, _) = plan(&SessionOptions::default(), &probe, &kernel());
        assert_eq!(o.congestion.as_deref(), Some("rsv"));
        assert!(o.start_rate.is_some());
        // A LAN, another congestion control, a given rate, a start set by hand: not this.
        assert_eq!(plan(&rsv, &probe_ms(1), &kernel()).0.start_rate, None);
        let bbr = SessionOptions {
            congestion: Some("bbr".into()),
            ..Default::default()
        };
        assert_eq!(plan(&bbr, &probe_ms(100), &kernel()).0.start_rate, None);
        let mut rated = rsv.clone();
        rated.set("rate", "50mbit").unwrap();
        assert_eq!(plan(&rated, &probe_ms(100), &kernel()).0.start_rate, None);
        let mut by_hand = rsv.clone();
        by_hand.set("start_rate", "80mbit").unwrap();
        assert_eq!(
            plan(&by_hand, &probe_ms(100), &kernel()).0.start_rate,
            Some(10_000_000)
        );
    }

    #[test]
    fn an_unknown_long_path_on_rsv_sends_its_first_round_at_the_assumed_share() {
        let rsv = SessionOptions {
            congestion: Some("rsv".into()),
            ..Default::default()
        };
        let (o, p) = plan(&rsv, &probe_ms(200), &kernel());
        let n = u64::from(o.connections);
        assert_eq!(o.start_rate, Some(UNKNOWN_PATH_START / n));
        assert_eq!(o.probe_rate, Some(ASSUMED_RATE / n));
        assert_eq!(o.tuning().probe_rate, Some(ASSUMED_RATE / n));
        assert!(
            p.reasons
                .iter()
                .any(|r| r.contains("sends its first round")),
            "{:?}",
            p.reasons
        );
        // The probe is the assumed rate's share, never below the start itself.
        assert_eq!(unknown_path_probe(2, 1_250_000), 62_500_000);
        assert_eq!(unknown_path_probe(0, 1), ASSUMED_RATE);
        assert_eq!(unknown_path_probe(1, 2 * ASSUMED_RATE), 2 * ASSUMED_RATE);
        assert_eq!(unknown_path_probe(10_000, 20_000), 20_000);

        // By hand: another probe rate, or none (0), the start kept.
        let mut other = rsv.clone();
        other.set("probe_rate", "200mbit").unwrap();
        assert_eq!(
            plan(&other, &probe_ms(200), &kernel()).0.probe_rate,
            Some(25_000_000)
        );
        let mut off = rsv.clone();
        off.set("probe_rate", "0").unwrap();
        let (o_off, p_off) = plan(&off, &probe_ms(200), &kernel());
        assert_eq!(o_off.start_rate, Some(UNKNOWN_PATH_START / n));
        assert_eq!(o_off.tuning().probe_rate, None);
        assert!(p_off
            .reasons
            .iter()
            .any(|r| r.contains("instead of ten packets")));
        assert!(off.set("probe_rate", "fast").is_err());

        // A rate known (given, remembered), a LAN, another congestion control: no probe.
        let mut rated = rsv.clone();
        rated.set("rate", "50mbit").unwrap();
        assert_eq!(plan(&rated, &probe_ms(200), &kernel()).0.probe_rate, None);
        let mut remembered = probe_ms(200);
        remembered.remembered = Some(Remembered {
            rate_bytes_per_s: 62_500_000,
            age_s: 60,
        });
        let (o_mem, _) = plan(&rsv, &remembered, &kernel());
        assert!(o_mem.start_rate.is_some());
        assert_eq!(o_mem.probe_rate, None, "a remembered start is not probed");
        assert_eq!(plan(&rsv, &probe_ms(1), &kernel()).0.probe_rate, None);
        let bbr = SessionOptions {
            congestion: Some("bbr".into()),
            ..Default::default()
        };
        assert_eq!(plan(&bbr, &probe_ms(200), &kernel()).0.probe_rate, None);
    }

    #[test]
    fn a_remembered_rate_sizes_the_session_and_starts_rsv_connections() {
        let mut probe = probe_ms(100);
        probe.remembered = Some(Remembered {
            rate_bytes_per_s: 625_000_000,
            age_s: 600,
        });
        let mut o = SessionOptions {
            congestion: Some("rsv,bbr".into()),
            ..Default::default()
        };
        let (got, p) = plan(&o, &probe, &kernel());
        assert_eq!(
            (p.rate_bytes_per_s, p.rate_source),
            (625_000_000, "remembered")
        );
        assert!(p.reasons[0].contains("5gbit remembered from a session 10 min ago"));
        let n = u64::from(got.connections);
        assert_eq!(got.start_rate, Some(625_000_000 / n));
        assert_eq!(got.pacing_rate, None, "a remembered rate is no pace");
        assert!(p
            .reasons
            .iter()
            .any(|r| r.starts_with("start: each connection at")));
        // Sized for it: more commands in flight than for the assumed 1 Gbit/s.
        let (assumed, _) = plan(&o, &probe_ms(100), &kernel());
        assert!(got.queue_depth > assumed.queue_depth);
        // Nothing remembered: the start of a path whose rate is unknown.
        assert_eq!(
            assumed.start_rate,
            Some(UNKNOWN_PATH_START / u64::from(assumed.connections))
        );
        // A slower path remembered: started at it, still sized for the assumed rate.
        let mut slow = probe.clone();
        slow.remembered = Some(Remembered {
            rate_bytes_per_s: 12_500_000,
            age_s: 7_200,
        });
        let (got_slow, p_slow) = plan(&o, &slow, &kernel());
        assert_eq!(p_slow.rate_bytes_per_s, ASSUMED_RATE);
        assert!(p_slow.reasons[0]
            .contains("100mbit remembered from a session 2 h ago, sized for the assumed 1gbit"));
        assert_eq!(got_slow.queue_depth, assumed.queue_depth);
        let n = u64::from(got_slow.connections);
        assert_eq!(got_slow.start_rate, Some(12_500_000 / n));

        // A given rate wins; the cache off or a start set by hand leaves it unused.
        o.set("rate", "200mbit").unwrap();
        assert_eq!(plan(&o, &probe, &kernel()).1.rate_source, "given");
        let mut off = SessionOptions::default();
        off.set("path_cache", "no").unwrap();
        assert_eq!(plan(&off, &probe, &kernel()).1.rate_source, "assumed");
        let mut by_hand = SessionOptions::default();
        by_hand.set("start_rate", "10mbit").unwrap();
        let (o2, p2) = plan(&by_hand, &probe, &kernel());
        assert_eq!(
            (p2.rate_source, o2.start_rate),
            ("remembered", Some(1_250_000))
        );
        // Without rsv, the start stays the kernel's and the plan says so.
        let (o3, p3) = plan(&SessionOptions::default(), &probe, &kernel());
        if !o3.congestion.as_deref().unwrap_or("").contains("rsv") {
            assert!(p3
                .reasons
                .iter()
                .any(|r| r.starts_with("start: the kernel's")));
        }
    }

    #[test]
    fn lan_keeps_one_connection_and_kernel_buffers() {
        let (o, p) = plan(&SessionOptions::default(), &probe_ms(0), &kernel());
        assert_eq!(o.connections, 1);
        assert_eq!(o.send_buffer, None);
        assert_eq!(o.recv_buffer, None);
        assert_eq!(o.queue_depth, 32);
        assert!(p.reasons.iter().any(|r| r.starts_with("connections: 1")));
    }

    #[test]
    fn r0_path_gets_eight_connections_and_enough_in_flight() {
        let mut opts = SessionOptions {
            rate: Some(12_500_000),
            ..SessionOptions::default()
        };
        opts.io_size_hint = Some(1 << 20);
        let (o, p) = plan(&opts, &probe_ms(100), &kernel());
        assert_eq!(p.bdp_bytes, 1_250_000);
        assert_eq!(o.connections, 8);
        // 2.5 MB in flight = 3 commands of 1 MiB, plus 16: never fewer than 32.
        assert_eq!(o.queue_depth, 32);
        assert_eq!(o.first_burst, 1 << 20);
        assert!(!o.initial_r2t && o.immediate_data);
        // The given rate is shared by 8 connections, plus 5 %.
        assert_eq!(o.pacing_rate, Some(12_500_000 / 8 * 105 / 100));
        // 2.5 MB over 8 sockets fits the kernel's autotuning.
        assert_eq!(o.send_buffer, None);
        // Without a rate: two unpaced connections sized for 1 Gbit/s, 12.5 MB each.
        let (o, _) = plan(&SessionOptions::default(), &probe_ms(100), &kernel());
        assert_eq!((o.connections, o.pacing_rate), (2, None));
        assert_eq!(o.send_buffer, Some(12_500_000));
    }

    #[test]
    fn fast_long_path_sets_buffers_and_more_in_flight() {
        // R2: 8.2 Gbit/s, 350 ms: BDP 358 MB.
        let mut opts = SessionOptions {
            rate: Some(8_200_000_000 / 8),
            ..SessionOptions::default()
        };
        opts.io_size_hint = Some(4 << 20);
        let (o, p) = plan(&opts, &probe_ms(350), &kernel());
        assert_eq!(p.bdp_bytes, 358_750_000);
        // 717.5 MB in flight needs 11 sockets of 64 MiB.
        assert_eq!(o.connections, 11);
        assert_eq!(o.queue_depth, 172 + 22);
        assert!(o.send_buffer.unwrap() > 60_000_000);
        assert!(o.recv_buffer.unwrap() > 60_000_000);
    }

    #[test]
    fn pinned_options_are_kept() {
        let mut opts = SessionOptions::default();
        opts.set("connections", "2").unwrap();
        opts.set("queue_depth", "7").unwrap();
        opts.set("first_burst", "65536").unwrap();
        let (o, p) = plan(&opts, &probe_ms(100), &kernel());
        assert_eq!((o.connections, o.queue_depth, o.first_burst), (2, 7, 65536));
        assert!(p.reasons.iter().any(|r| r.contains("set by hand")));
    }

    #[test]
    fn off_means_untouched() {
        let opts = SessionOptions {
            auto_tune: false,
            ..SessionOptions::default()
        };
        let (o, p) = plan(&opts, &probe_ms(100), &kernel());
        assert_eq!(o, opts);
        assert!(!p.enabled);
    }

    #[test]
    fn target_pacing_report() {
        use iscsi::negotiate::TargetPacing::*;
        let r = TargetPacingReport::new(None, [(0, NotAsked)]);
        assert_eq!(r.paced_connections, 0);
        assert!(r.summary().starts_with("not asked"), "{}", r.summary());
        let r = TargetPacingReport::new(
            Some(1_640_625),
            [(1, Paced(1_640_625)), (0, Paced(1_640_625))],
        );
        assert_eq!(r.paced_connections, 2);
        assert_eq!(r.connections[0].cid, 0);
        assert_eq!(r.connections[1].rate_bytes_per_s, Some(1_640_625));
        assert_eq!(
            r.summary(),
            "asked 13.1mbit per connection; the target paces 2 of 2 at 13.1mbit"
        );
        // tgt, LIO: nothing paced, and the report says why.
        let r = TargetPacingReport::new(Some(1_640_625), [(0, NotUnderstood), (1, NotUnderstood)]);
        assert_eq!(r.paced_connections, 0);
        assert_eq!(r.connections[0].answer, "not understood");
        assert!(
            r.summary().contains("paces 0 of 2; 2 not understood"),
            "{}",
            r.summary()
        );
        let r = TargetPacingReport::new(Some(1_640_625), [(0, NotPaced), (1, Refused)]);
        assert!(
            r.summary()
                .ends_with("; 1 not paced (its pacing hints are off); 1 refused"),
            "{}",
            r.summary()
        );
        // The JSON names the answer per connection.
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["connections"][1]["answer"], "refused");
        assert_eq!(j["requested"], 1_640_625);
    }

    #[test]
    fn plan_pacing_reason_mentions_the_target_only_when_it_is_asked() {
        let mut opts = SessionOptions {
            rate: Some(12_500_000),
            ..SessionOptions::default()
        };
        let (o, p) = plan(&opts, &probe_ms(100), &kernel());
        assert_eq!(o.target_pacing_hint(), o.pacing_rate);
        assert!(p.reasons.iter().any(|r| r.contains("the target is asked")));
        opts.set("pacing_hint", "no").unwrap();
        let (o, p) = plan(&opts, &probe_ms(100), &kernel());
        assert_eq!(o.target_pacing_hint(), None);
        assert!(!p.reasons.iter().any(|r| r.contains("the target is asked")));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rate_control_finds_the_bottleneck_and_paces_just_above_it() {
        let mut rc = RateControl::default();
        let mut t = 0u64;
        let mut step = |rc: &mut RateControl, rate: u64| {
            t += 100;
            rc.sample(ms(t), Some(rate), true)
        };
        // Start-up: the rate doubles; nothing is paced.
        for r in [1_000_000, 2_000_000, 4_000_000, 8_000_000] {
            assert_eq!(step(&mut rc, r), None);
            assert_eq!(rc.report().phase, "start-up");
        }
        // The pipe is full at 12.5 MB/s: three samples without a quarter's growth.
        assert_eq!(step(&mut rc, 12_500_000), None);
        assert_eq!(step(&mut rc, 12_400_000), None);
        assert_eq!(step(&mut rc, 12_600_000), None);
        let p = step(&mut rc, 12_500_000).expect("paced once the pipe is full");
        assert_eq!(p, 12_600_000 * 105 / 100);
        let r = rc.report();
        assert_eq!((r.phase, r.bottleneck_bytes_per_s), ("cruise", 12_600_000));
        // Steady at the bottleneck: no change.
        for _ in 0..5 {
            assert_eq!(step(&mut rc, 12_500_000), None);
        }
        // The path frees up: the delivered rate follows the pacing up, a few % a sample.
        let mut pace = p;
        for _ in 0..20 {
            if let Some(n) = step(&mut rc, pace.min(25_000_000)) {
                assert!(n > pace);
                pace = n;
            }
        }
        assert!(pace > 25_000_000, "{pace}");
        // Shared with others now: after a window of lower samples the pacing comes down.
        for _ in 0..WINDOW {
            step(&mut rc, 10_000_000);
        }
        assert_eq!(rc.report().bottleneck_bytes_per_s, 10_000_000);
        assert_eq!(rc.report().pacing_bytes_per_s, Some(10_500_000));
    }

    #[test]
    fn rate_control_ignores_idle_samples() {
        let mut rc = RateControl::default();
        let mut changes = Vec::new();
        for i in 0..5u64 {
            changes.extend(rc.sample(ms(100 * i), Some(10_000_000), true));
        }
        // Three samples without growth after the first end the start-up.
        assert_eq!(changes, [10_500_000]);
        let paced = rc.report().pacing_bytes_per_s;
        // Idle, or no rate measured yet: nothing changes.
        for i in 5..40u64 {
            assert_eq!(rc.sample(ms(100 * i), Some(1000), false), None);
            assert_eq!(rc.sample(ms(100 * i), None, true), None);
        }
        assert_eq!(rc.report().pacing_bytes_per_s, paced);
        assert!(!rc.due(ms(3950), ms(100)));
        assert!(rc.due(ms(4000), ms(100)));
    }

    #[test]
    fn span_rate_averages_bursts() {
        let mut sr = SpanRate::default();
        // 10 MB/s on average, delivered in bursts: 0, 3 MB, 0, 1 MB every 100 ms.
        let mut d = 0u64;
        let mut rates = Vec::new();
        for i in 0..200u64 {
            d += [0, 3_000_000, 0, 1_000_000][(i % 4) as usize];
            rates.extend(sr.push(ms(100 * i), d, ms(1000)));
        }
        // Measured over a second at least, never 30 MB/s.
        assert_eq!(rates.len(), 190);
        assert!(
            rates.iter().all(|r| (8_000_000..=12_000_000).contains(r)),
            "{rates:?}"
        );
        // It keeps about a span of samples, not the whole run.
        assert!(sr.hist.len() <= 12, "{}", sr.hist.len());
        // A counter that goes backwards (a connection replaced) starts afresh.
        assert_eq!(sr.push(ms(20_000), 5, ms(1000)), None);
        assert_eq!(sr.hist.len(), 1);
    }

    #[test]
    fn plan_runs_the_rate_control_only_when_asked_and_without_a_rate() {
        let d = SessionOptions::default();
        let (_, p) = plan(&d, &probe_ms(100), &kernel());
        assert!(!p.rate_control);
        assert!(p.reasons.iter().any(|r| r.contains("rate_control=yes")));
        let mut o = d.clone();
        o.set("rate_control", "yes").unwrap();
        assert!(plan(&o, &probe_ms(0), &kernel()).1.rate_control);
        assert!(plan(&o, &probe_ms(100), &kernel()).1.rate_control);
        // A given rate, or pacing set by hand, paces already.
        o.set("rate", "100mbit").unwrap();
        assert!(!plan(&o, &probe_ms(100), &kernel()).1.rate_control);
        let mut o = d;
        o.set("rate_control", "yes").unwrap();
        o.set("pacing_rate", "100mbit").unwrap();
        assert!(!plan(&o, &probe_ms(100), &kernel()).1.rate_control);
    }

    #[test]
    fn rate_control_interval_is_a_few_round_trips() {
        assert_eq!(RateControl::interval(ms(1)), ms(50));
        assert_eq!(RateControl::interval(ms(100)), ms(400));
        assert_eq!(RateControl::interval(ms(300)), ms(1000));
        assert_eq!(RateControl::span(ms(1)), ms(1000));
        assert_eq!(RateControl::span(ms(300)), ms(2400));
    }

    #[test]
    fn long_path_queue_shrinks_to_the_measured_rate() {
        let rtt = ms(100);
        // R0: 100 Mbit/s (12.5 MB/s) at 100 ms, 1 MiB commands, two connections: eight
        // round trips are 10 MB, ten commands, plus four.
        assert_eq!(
            shrunk_queue_depth(32, 12_500_000, rtt, 1 << 20, 2),
            Some(14)
        );
        // Not deep enough to be worth it (14 + 7 = 21 or fewer).
        assert_eq!(shrunk_queue_depth(21, 12_500_000, rtt, 1 << 20, 2), None);
        assert_eq!(
            shrunk_queue_depth(22, 12_500_000, rtt, 1 << 20, 2),
            Some(14)
        );
        // Once shrunk, the grow rule does not take it back at the same rate, nor at twice
        // the rate...
        assert_eq!(grown_queue_depth(14, 12_500_000, rtt, 1 << 20, 2), None);
        assert_eq!(grown_queue_depth(14, 25_000_000, rtt, 1 << 20, 2), None);
        // ...but does when the path turns out far faster.
        assert_eq!(grown_queue_depth(14, 62_500_000, rtt, 1 << 20, 2), Some(16));
        // A LAN keeps its depth: there it serves the storage.
        assert_eq!(shrunk_queue_depth(32, 12_500_000, ms(1), 1 << 20, 1), None);
        // Small commands on a long path: the depth that holds the bytes is kept.
        assert_eq!(shrunk_queue_depth(32, 12_500_000, rtt, 4096, 2), None);
        // No rate measured yet: nothing to size for.
        assert_eq!(shrunk_queue_depth(32, 0, rtt, 1 << 20, 2), None);
    }

    #[test]
    fn peak_rate_needs_a_whole_busy_window() {
        let mut p = PeakRate::default();
        let s = |n: u64| Duration::from_secs(n);
        for t in 0..PEAK_WINDOW.as_secs() {
            assert_eq!(p.push(s(t), 10 + t, true), None, "at {t} s");
        }
        // Eight seconds of samples: the peak of them.
        assert_eq!(p.push(PEAK_WINDOW, 5, true), Some(17));
        // The peak (at 7 s) falls out of the window only once a window has passed.
        assert_eq!(p.push(s(9), 5, true), Some(17));
        assert_eq!(p.push(s(15), 5, true), Some(17));
        assert_eq!(p.push(s(16), 5, true), Some(5));
        // A sample while the session had little to do starts it afresh.
        assert_eq!(p.push(s(18), 100, false), None);
        assert_eq!(p.push(s(19), 5, true), None);
        assert_eq!(p.push(s(27), 5, true), Some(5));
    }

    #[test]
    fn queue_grows_with_measured_rate() {
        // 100 MB/s delivered over 100 ms: 10 MB per RTT, 20 MB in flight = 20 x 1 MiB.
        let g = grown_queue_depth(32, 100_000_000, Duration::from_millis(100), 1 << 20, 8);
        assert_eq!(g, Some(36));
        assert_eq!(
            grown_queue_depth(64, 100_000_000, Duration::from_millis(100), 1 << 20, 8),
            None
        );
    }
}
