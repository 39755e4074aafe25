//! Live tuning from the connections' TCP_INFO: the queue depth grown and cut to the
//! measured path, and the rate control that paces the session to the bottleneck.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use iscsi::negotiate::{TargetPacing, PACING_RATE_KEY};
use iscsi::pdu::{Pdu, TextRequest, RESERVED_TAG};

use super::tasks::recv_pdu;
use super::{PathReport, Shared};
use crate::conn::{Conn, Reader};
use crate::tune::RateControl;
use crate::tune::{PathLearner, PeakRate, Plan};

/// How often a connection's reader samples TCP_INFO for auto-tuning.
const PATH_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// The plan and the live tuning state. The rate control's state has its own mutex, as it
/// had on the session; the values the readers read on every sample are atomics.
pub(super) struct Tuner {
    pub(super) plan: Option<Plan>,
    /// The session's peak delivery rate while busy, for cutting a long path's queue back.
    peak: Mutex<PeakRate>,
    /// Finds the bottleneck and paces the session to it, when asked (`rate_control=yes`)
    /// and no rate was given (see [`crate::tune::RateControl`]).
    pub(super) rate: Option<Mutex<RateControl>>,
    /// The session's total pacing rate from `rate`, bytes per second (0: none yet).
    pub(super) pace_total: AtomicU64,
    /// The session's total pacing rate set from outside ([`crate::Session::set_pacing_rate`]),
    /// bytes per second: 0 none, `u64::MAX` unpaced again. Wins over the rate control.
    pub(super) pace_external: AtomicU64,
    /// How often the readers sample TCP_INFO, microseconds.
    sample_every_us: AtomicU64,
    /// The least time the connections' rates are measured over, microseconds.
    span_us: AtomicU64,
    /// What the session learns of its path, for the path cache at logout.
    pub(super) learnt: Mutex<PathLearner>,
}

impl Tuner {
    pub(super) fn new(plan: Option<Plan>) -> Tuner {
        let rate_control = plan.as_ref().is_some_and(|p| p.rate_control);
        Tuner {
            plan,
            peak: Mutex::default(),
            rate: rate_control.then(|| Mutex::new(RateControl::default())),
            pace_total: AtomicU64::new(0),
            pace_external: AtomicU64::new(0),
            sample_every_us: AtomicU64::new(PATH_SAMPLE_INTERVAL.as_micros() as u64),
            span_us: AtomicU64::new(RateControl::span(Duration::ZERO).as_micros() as u64),
            learnt: Mutex::default(),
        }
    }
}

impl Shared {
    pub(super) fn path(conns: &[Arc<Conn>]) -> Option<PathReport> {
        let mut r = PathReport::default();
        let mut min_rtt = u32::MAX;
        let mut srtt = 0u64;
        for c in conns.iter().filter(|c| c.is_alive()) {
            if let Some(p) = *c.path.lock().unwrap() {
                r.connections_sampled += 1;
                r.rate_bytes_per_s += p.rate;
                r.wire_bytes_per_s += p.span_rate.unwrap_or(0);
                r.retransmits += u64::from(p.info.total_retrans);
                if p.info.min_rtt_us > 0 {
                    min_rtt = min_rtt.min(p.info.min_rtt_us);
                }
                srtt += u64::from(p.info.rtt_us);
            }
        }
        if r.connections_sampled == 0 {
            return None;
        }
        r.min_rtt_ms = if min_rtt == u32::MAX {
            0.0
        } else {
            f64::from(min_rtt) / 1e3
        };
        r.srtt_ms = srtt as f64 / r.connections_sampled as f64 / 1e3;
        Some(r)
    }

    /// Called by a connection's reader after a read, every [`Shared::sample_every`]:
    /// samples its TCP_INFO, grows the queue depth when the measured path needs more in
    /// flight, and runs the rate control.
    pub(super) fn observe(self: &Arc<Self>, conn: &Arc<Conn>, stream: &Reader) {
        let span = Duration::from_micros(self.tuner.span_us.load(Ordering::Relaxed));
        let Some(fd) = stream.socket() else {
            return;
        };
        if !conn.sample_path(fd, self.epoch.elapsed(), span) || !self.opts.auto_tune {
            return;
        }
        let conns = self.state.lock().unwrap().conns.all.clone();
        let Some(path) = Self::path(&conns) else {
            return;
        };
        self.tuner.learnt.lock().unwrap().push(
            path.rate_bytes_per_s,
            self.slots.busy(self.slots.depth()),
            (path.min_rtt_ms * 1e3) as u32,
        );
        if !self.opts.is_pinned("queue_depth") {
            self.grow_queue(&path, conns.len());
            self.shrink_queue(&path, conns.len());
        }
        if self.tuner.pace_external.load(Ordering::Relaxed) != 0 {
            self.apply_external_pace(conn, stream, &conns);
        } else if self.tuner.rate.is_some() {
            self.control_rate(conn, stream, &conns, &path);
        }
    }

    /// Applies a pacing rate set from outside the session to this connection now
    /// ([`crate::Session::set_pacing_rate`] wakes each reader for it).
    pub(super) fn repace(self: &Arc<Self>, conn: &Arc<Conn>, stream: &Reader) {
        if self.tuner.pace_external.load(Ordering::Relaxed) == 0 {
            return;
        }
        let conns = self.state.lock().unwrap().conns.all.clone();
        self.apply_external_pace(conn, stream, &conns);
    }

    /// Paces this connection to its share of the rate set from outside the session (a
    /// coordinator dividing a shared bottleneck between sessions); `u64::MAX` lifts it.
    fn apply_external_pace(&self, conn: &Arc<Conn>, stream: &Reader, conns: &[Arc<Conn>]) {
        let total = self.tuner.pace_external.load(Ordering::Relaxed);
        let live = conns.iter().filter(|c| c.is_alive()).count().max(1) as u64;
        let share = if total == u64::MAX {
            0
        } else {
            (total / live).max(1)
        };
        let applied = conn.applied_pace.load(Ordering::Relaxed);
        if share == applied
            || (share != 0 && applied != 0 && share.abs_diff(applied) * 200 <= applied)
        {
            return;
        }
        conn.applied_pace.store(share, Ordering::Relaxed);
        let Some(fd) = stream.socket() else { return };
        // 0 on SO_MAX_PACING_RATE would stop the socket; "no limit" is all ones.
        let value = if share == 0 { u64::MAX } else { share };
        if let Err(e) = net::set_pacing_rate(fd, value) {
            tracing::warn!(cid = conn.cid, "SO_MAX_PACING_RATE {value}: {e}");
        }
    }

    pub(super) fn grow_queue(&self, path: &PathReport, connections: usize) {
        let io = self.tuner.plan.as_ref().map_or(1 << 20, |p| p.io_size);
        let current = self.slots.depth();
        if let Some(q) = crate::tune::grown_queue_depth(
            current,
            path.rate_bytes_per_s,
            Duration::from_secs_f64(path.min_rtt_ms / 1e3),
            io,
            connections,
        ) {
            if self.slots.grow(current, q) {
                tracing::info!(
                    "auto-tuning: queue depth {current} -> {q} for {:.0} Mbit/s at {:.1} ms",
                    path.rate_bytes_per_s as f64 * 8e-6,
                    path.min_rtt_ms
                );
            }
        }
    }

    /// Cuts a long path's queue back to what its measured peak rate needs
    /// ([`crate::tune::shrunk_queue_depth`]) once the session has been busy long enough to
    /// know it.
    pub(super) fn shrink_queue(&self, path: &PathReport, connections: usize) {
        let io = self.tuner.plan.as_ref().map_or(1 << 20, |p| p.io_size);
        let current = self.slots.depth();
        let busy = self.slots.busy(current);
        let peak =
            self.tuner
                .peak
                .lock()
                .unwrap()
                .push(self.epoch.elapsed(), path.rate_bytes_per_s, busy);
        let Some(q) = peak.and_then(|peak| {
            crate::tune::shrunk_queue_depth(
                current,
                peak,
                Duration::from_secs_f64(path.min_rtt_ms / 1e3),
                io,
                connections,
            )
        }) else {
            return;
        };
        if !self.slots.cut(current, q) {
            return;
        }
        tracing::info!(
            "auto-tuning: queue depth {current} -> {q}: a peak of {:.0} Mbit/s at {:.1} ms \
             needs no more",
            peak.unwrap_or(0) as f64 * 8e-6,
            path.min_rtt_ms
        );
    }

    /// How often a reader samples its connection's TCP_INFO.
    pub(super) fn sample_every(&self) -> Duration {
        Duration::from_micros(self.tuner.sample_every_us.load(Ordering::Relaxed))
    }

    /// Feeds the rate control what the session's connections delivered, and paces this
    /// connection to its share of the session's rate: its own sends with
    /// SO_MAX_PACING_RATE, the target's with a hint (`X-org.reservoir.PacingRate` in a
    /// Text request) where the target takes them.
    pub(super) fn control_rate(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        stream: &Reader,
        conns: &[Arc<Conn>],
        path: &PathReport,
    ) {
        let Some(rate) = &self.tuner.rate else { return };
        let min_rtt = Duration::from_secs_f64(path.min_rtt_ms / 1e3);
        let every = RateControl::interval(min_rtt);
        self.tuner
            .sample_every_us
            .store(every.as_micros() as u64, Ordering::Relaxed);
        self.tuner.span_us.store(
            RateControl::span(min_rtt).as_micros() as u64,
            Ordering::Relaxed,
        );
        let live: Vec<&Arc<Conn>> = conns.iter().filter(|c| c.is_alive()).collect();
        {
            let mut rc = rate.lock().unwrap();
            let now = self.epoch.elapsed();
            if rc.due(now, every) {
                // The sum of every live connection's rate over its own last span.
                let rate: Option<u64> = live
                    .iter()
                    .map(|c| c.path.lock().unwrap().and_then(|p| p.span_rate))
                    .sum();
                // Busy: more than three quarters of the queue in use (a session short
                // of work measures itself, not the path).
                let busy = self.slots.busy(self.slots.depth());
                if let Some(total) = rc.sample(now, rate, busy) {
                    self.tuner.pace_total.store(total, Ordering::Relaxed);
                    let r = rc.report();
                    tracing::info!(
                        "rate control ({}): bottleneck {:.1} Mbit/s, session paced at {:.1} \
                         Mbit/s over {} connections",
                        r.phase,
                        r.bottleneck_bytes_per_s as f64 * 8e-6,
                        total as f64 * 8e-6,
                        live.len()
                    );
                }
            }
        }
        let total = self.tuner.pace_total.load(Ordering::Relaxed);
        if total == 0 {
            return;
        }
        let share = (total / live.len().max(1) as u64).max(1);
        let applied = conn.applied_pace.load(Ordering::Relaxed);
        if share.abs_diff(applied) * 50 <= applied {
            return;
        }
        conn.applied_pace.store(share, Ordering::Relaxed);
        let Some(fd) = stream.socket() else { return };
        if let Err(e) = net::set_pacing_rate(fd, share) {
            tracing::warn!(cid = conn.cid, "SO_MAX_PACING_RATE {share}: {e}");
        }
        if conn.target_takes_hints() {
            self.hint_target_pacing(conn, share);
        }
    }

    /// Asks the target to pace what it sends on `conn` at `rate` bytes per second
    /// (a Text request in full feature phase) and records its answer.
    pub(super) fn hint_target_pacing(self: &Arc<Self>, conn: &Arc<Conn>, rate: u64) {
        let s = self.clone();
        let c = conn.clone();
        tokio::spawn(async move {
            let (guard, mut rx) = s.register(&c);
            let cmdsn = s.state.lock().unwrap().window.cmdsn;
            c.send(Pdu::TextRequest(TextRequest {
                immediate: true,
                final_: true,
                cont: false,
                lun: 0,
                itt: guard.itt,
                ttt: RESERVED_TAG,
                cmdsn,
                expstatsn: 0,
                data: Bytes::from(format!("{PACING_RATE_KEY}={rate}\0")),
            }));
            let answer =
                match tokio::time::timeout(Duration::from_secs(10), recv_pdu(&mut rx)).await {
                    Ok(Some(Pdu::TextResponse(r))) => iscsi::text::TextKeys::parse(&r.data)
                        .ok()
                        .and_then(|k| {
                            k.get(PACING_RATE_KEY)
                                .map(iscsi::negotiate::pacing_from_answer)
                        })
                        .unwrap_or(TargetPacing::Refused),
                    Ok(Some(_)) => TargetPacing::Refused,
                    // No answer (the connection went): nothing learnt.
                    _ => return,
                };
            tracing::debug!(
                cid = c.cid,
                "pacing hint {rate}: the target answered {}",
                answer.as_str()
            );
            *c.ffp_pacing.lock().unwrap() = Some(answer);
            drop(guard);
        });
    }
}
