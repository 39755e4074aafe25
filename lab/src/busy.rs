//! How busy the bottleneck was during a measurement, from the emulator's counters: the
//! reason behind a figure. A transfer that falls short of the link rate either left the
//! link idle (start-up, a congestion control's probing, the end of the run) or spent it
//! on bytes that are not payload (headers); the two are told apart here.

use serde::{Deserialize, Serialize};

/// A reading of the bytes that had left the bottleneck in one direction by `at` (seconds
/// since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub at: f64,
    pub bytes: u64,
}

/// Share of a link's rate at which it counts as full.
pub const FULL: f64 = 0.9;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct LinkUse {
    /// Bytes that left the bottleneck in the measured window, as a share of what the link
    /// could carry in it (%). Headers count: payload is at most about 96.5 % of this.
    pub busy_pct: f64,
    /// Those bytes: the payload's share of them tells headers and retransmissions apart
    /// from idle time.
    pub wire_bytes: u64,
    /// Seconds from the window's start until the link first ran at 90 % of its rate or
    /// more over a sampling interval (the whole window when it never did).
    pub start_s: f64,
    /// Link time lost before that point (seconds at the full rate that went unused).
    pub lost_start_s: f64,
    /// Link time lost after it, up to the end of the issuing (probing, loss recovery,
    /// stalls), or to the window's end when no issuing end was given.
    pub lost_later_s: f64,
    /// Link time lost after the issuing ended while the commands still in flight finished
    /// (the window's tail); 0 when no issuing end was given or it is not inside the window.
    /// `None` in results measured before it was counted (their other losses were counted
    /// otherwise, from single intervals, and are not comparable).
    pub lost_end_s: Option<f64>,
    /// The link's use over each sampling interval of the window, in order (%, headers
    /// included): when the time was lost.
    #[serde(default)]
    pub intervals: Vec<Interval>,
}

/// One sampling interval of a [`LinkUse`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Interval {
    /// Seconds from the window's start to the interval's end.
    pub to_s: f64,
    /// Bytes that left the bottleneck in it, as a share of what the link could carry.
    pub busy_pct: f64,
}

/// Bytes counted by `at`, interpolated between the samples around it (`samples` sorted by
/// time); `None` outside them.
pub(crate) fn bytes_at(samples: &[Sample], at: f64) -> Option<f64> {
    let i = samples.partition_point(|s| s.at < at);
    let after = samples.get(i)?;
    if after.at == at || i == 0 {
        return (after.at == at).then_some(after.bytes as f64);
    }
    let before = samples[i - 1];
    let span = after.at - before.at;
    let share = if span > 0.0 {
        (at - before.at) / span
    } else {
        1.0
    };
    Some(before.bytes as f64 + share * (after.bytes as f64 - before.bytes as f64))
}

/// The link's use over `[from, to]` at `rate_bps`, the issuing having ended at `issued`
/// (the rest of the window being the wait for the commands in flight), or `None` when
/// the samples do not cover the window (the watch started late or stopped early) or it
/// is empty.
///
/// The seconds lost in each phase come from the bytes over the whole phase, not from a
/// sum over the sampling intervals: a reading timed a little late makes one interval look
/// short of the rate and the next over it, and counting only the shortfalls added up to
/// seconds of "lost" link time on a link that was busy throughout.
pub fn link_use(
    samples: &[Sample],
    from: f64,
    to: f64,
    issued: Option<f64>,
    rate_bps: u64,
) -> Option<LinkUse> {
    if to <= from || rate_bps == 0 {
        return None;
    }
    let rate = rate_bps as f64 / 8.0;
    let first = bytes_at(samples, from)?;
    let last = bytes_at(samples, to)?;
    // The window's edges and every sample inside it.
    let mut points = vec![(from, first)];
    points.extend(
        samples
            .iter()
            .filter(|s| s.at > from && s.at < to)
            .map(|s| (s.at, s.bytes as f64)),
    );
    points.push((to, last));
    let mut start: Option<(f64, f64)> = None;
    let mut intervals = Vec::new();
    for w in points.windows(2) {
        let ((t0, b0), (t1, b1)) = (w[0], w[1]);
        let dt = t1 - t0;
        if dt <= 0.0 {
            continue;
        }
        if start.is_none() && (b1 - b0) / dt >= FULL * rate {
            start = Some((t0, b0));
        }
        intervals.push(Interval {
            to_s: ((t1 - from) * 1000.0).round() / 1000.0,
            busy_pct: ((b1 - b0) / rate / dt * 1000.0).round() / 10.0,
        });
    }
    // Link time unused between two points of the window.
    let lost = |(t0, b0): (f64, f64), (t1, b1): (f64, f64)| ((t1 - t0) - (b1 - b0) / rate).max(0.0);
    let end = (to, last);
    let (start_s, lost_start, lost_later, lost_end) = match start {
        None => (to - from, lost((from, first), end), 0.0, 0.0),
        Some(s) => {
            let issued = issued
                .filter(|&t| t > s.0 && t < to)
                .and_then(|t| Some((t, bytes_at(samples, t)?)));
            let (later, tail) = match issued {
                Some(i) => (lost(s, i), lost(i, end)),
                None => (lost(s, end), 0.0),
            };
            (s.0 - from, lost((from, first), s), later, tail)
        }
    };
    Some(LinkUse {
        busy_pct: (last - first) / rate / (to - from) * 100.0,
        wire_bytes: (last - first).round() as u64,
        start_s,
        lost_start_s: lost_start,
        lost_later_s: lost_later,
        lost_end_s: Some(lost_end),
        intervals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(rates: &[(f64, f64)], every: f64) -> Vec<Sample> {
        // rates: (seconds, bytes per second) phases, sampled every `every` seconds.
        let mut out = vec![Sample { at: 0.0, bytes: 0 }];
        let (mut t, mut b) = (0.0, 0.0);
        for &(len, r) in rates {
            let steps = (len / every).round() as usize;
            for _ in 0..steps {
                t += every;
                b += r * every;
                out.push(Sample {
                    at: t,
                    bytes: b.round() as u64,
                });
            }
        }
        out
    }

    #[test]
    fn a_full_link_loses_nothing() {
        let s = samples(&[(10.0, 1e6)], 0.25);
        let u = link_use(&s, 0.0, 10.0, None, 8_000_000).unwrap();
        assert!((u.busy_pct - 100.0).abs() < 1e-6);
        assert_eq!(u.wire_bytes, 10_000_000);
        assert_eq!(u.start_s, 0.0);
        assert!(u.lost_start_s.abs() < 1e-6 && u.lost_later_s.abs() < 1e-6);
    }

    #[test]
    fn start_up_and_a_later_dip_are_told_apart() {
        // 1 s idle, 1 s at half rate, 6 s full, 1 s at a quarter, 1 s full.
        let s = samples(
            &[(1.0, 0.0), (1.0, 5e5), (6.0, 1e6), (1.0, 2.5e5), (1.0, 1e6)],
            0.25,
        );
        let u = link_use(&s, 0.0, 10.0, None, 8_000_000).unwrap();
        assert!((u.start_s - 2.0).abs() < 1e-9, "{u:?}");
        assert!((u.lost_start_s - 1.5).abs() < 1e-6, "{u:?}");
        assert!((u.lost_later_s - 0.75).abs() < 1e-6, "{u:?}");
        assert!((u.busy_pct - 77.5).abs() < 1e-6, "{u:?}");
    }

    #[test]
    fn the_window_is_cut_between_samples() {
        // Full rate throughout; a window that starts and ends between samples.
        let s = samples(&[(10.0, 1e6)], 1.0);
        let u = link_use(&s, 0.5, 9.25, None, 8_000_000).unwrap();
        assert!((u.busy_pct - 100.0).abs() < 1e-6, "{u:?}");
        assert_eq!(u.start_s, 0.0);
    }

    #[test]
    fn a_window_the_samples_do_not_cover_has_no_answer() {
        let s = samples(&[(5.0, 1e6)], 1.0);
        assert_eq!(link_use(&s, -1.0, 4.0, None, 8_000_000), None);
        assert_eq!(link_use(&s, 1.0, 6.0, None, 8_000_000), None);
        assert_eq!(link_use(&s, 3.0, 3.0, None, 8_000_000), None);
        assert_eq!(link_use(&[], 0.0, 1.0, None, 8_000_000), None);
    }

    #[test]
    fn a_link_that_never_fills_is_all_start() {
        let s = samples(&[(4.0, 5e5)], 0.5);
        let u = link_use(&s, 0.0, 4.0, None, 8_000_000).unwrap();
        assert_eq!(u.start_s, 4.0);
        assert!(
            (u.lost_start_s - 2.0).abs() < 1e-6 && u.lost_later_s == 0.0,
            "{u:?}"
        );
    }

    #[test]
    fn readings_timed_late_or_early_lose_no_link_time() {
        // Full rate throughout, each reading's time off by up to ±20 ms (as a loaded
        // machine starts the reader late): intervals alternate short of and over the
        // rate, the bytes over the window do not.
        let mut s = samples(&[(30.0, 1e6)], 0.2);
        for (i, x) in s.iter_mut().enumerate().skip(1) {
            x.at += if i % 2 == 0 { 0.02 } else { -0.02 };
        }
        let last = s.len() - 1;
        s[last].at = 30.0;
        let u = link_use(&s, 0.0, 30.0, None, 8_000_000).unwrap();
        assert!(u.lost_later_s.abs() < 1e-6, "{u:?}");
        assert!(u.lost_start_s.abs() < 1e-6, "{u:?}");
        assert!(u.intervals.iter().any(|i| i.busy_pct < 90.0), "{u:?}");
    }

    #[test]
    fn the_wait_after_the_issuing_is_counted_apart() {
        // 10 s full, then the commands in flight finish over 1 s at half the rate.
        let s = samples(&[(10.0, 1e6), (1.0, 5e5)], 0.25);
        let u = link_use(&s, 0.0, 11.0, Some(10.0), 8_000_000).unwrap();
        assert!(u.lost_later_s.abs() < 1e-6, "{u:?}");
        assert!((u.lost_end_s.unwrap() - 0.5).abs() < 1e-6, "{u:?}");
        assert_eq!(u.intervals.len(), 44);
        assert!((u.intervals[43].busy_pct - 50.0).abs() < 1e-6, "{u:?}");
        // Without the issuing's end, the same time is lost later.
        let u = link_use(&s, 0.0, 11.0, None, 8_000_000).unwrap();
        assert!(
            (u.lost_later_s - 0.5).abs() < 1e-6 && u.lost_end_s == Some(0.0),
            "{u:?}"
        );
    }

    #[test]
    fn lost_time_adds_up_to_what_the_link_did_not_carry() {
        let s = samples(&[(1.0, 2e5), (5.0, 1e6), (2.0, 0.0), (4.0, 9.5e5)], 0.25);
        let u = link_use(&s, 0.0, 12.0, Some(11.0), 8_000_000).unwrap();
        let idle = 12.0 * (1.0 - u.busy_pct / 100.0);
        let lost = u.lost_start_s + u.lost_later_s + u.lost_end_s.unwrap();
        assert!((lost - idle).abs() < 1e-6, "{lost} {idle} {u:?}");
        assert!((u.lost_start_s - 0.8).abs() < 1e-6, "{u:?}");
        assert!((u.lost_later_s - 2.15).abs() < 1e-6, "{u:?}");
        assert!((u.lost_end_s.unwrap() - 0.05).abs() < 1e-6, "{u:?}");
    }
}
