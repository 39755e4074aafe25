//! `rsv sync --every INTERVAL`: continuous mode. One cycle per interval until SIGTERM or
//! SIGINT; each takes the group's image (the cut), sends the units changed since the last
//! cycle (the change maps), commits at the far site and releases the image
//! ([`coord::run`]). A cycle that fails is logged and leaves the far copy whole (rolled
//! back when abandoned, else by the next cycle's open); the next interval tries again.
//! A signal lets the cycle running finish (it commits, or fails as any other) and ends the
//! command with status 0; a second signal abandons it (its streams cancelled and waited
//! for, the far site's cycle rolled back, so the next run sends every unit again).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::auth::Key;
use crate::coord::{self, Abandoned, SyncOptions};
use crate::metrics::SyncMetrics;

/// One `cycle` line of `--json`.
#[derive(Serialize, Debug)]
pub struct CycleLine {
    pub event: &'static str,
    /// 1 for the first cycle of this command, and on.
    pub cycle: u64,
    /// The cycle's id at the far site (the cut's), when it got one.
    pub id: Option<u64>,
    /// When its image was cut at the source (Unix time, s).
    pub cut_unix: Option<f64>,
    pub bytes: u64,
    pub data_bytes: u64,
    pub wire_bytes: u64,
    pub seconds: f64,
    /// Whether the far site holds this cycle's image now.
    pub committed: bool,
    /// Whether the far site keeps its copy whole (every member has an undo log).
    pub whole: Option<bool>,
    /// The replica's lag as the cycle ends: now minus the moment the far site's last
    /// committed image was cut (absent: none committed by this command yet).
    pub rpo_seconds: Option<f64>,
    /// The longest hold of the cut, µs.
    pub held_us: Option<u64>,
    pub error: Option<String>,
    /// The cycle was abandoned on a signal.
    pub abandoned: bool,
    /// Where a committed cycle's seconds went (`coord::Phases`; absent for one that
    /// failed).
    pub phases: Option<coord::Phases>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Runs cycles every `every` until a signal. Errors only when it cannot start.
#[allow(clippy::too_many_arguments)] // the one-shot sync's pieces, handed on whole
pub fn run(
    rt: &tokio::runtime::Runtime,
    source: &crate::coord::VolumeRef,
    dest: &crate::coord::VolumeRef,
    key: &Key,
    o: &SyncOptions,
    every: Duration,
    metrics: &SyncMetrics,
    json: bool,
) -> anyhow::Result<()> {
    let stop = o.stop.clone();
    let finishing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wake = Arc::new(tokio::sync::Notify::new());
    {
        let (stop, wake, finishing) = (stop.clone(), wake.clone(), finishing.clone());
        let mut term = rt
            .block_on(async {
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            })
            .map_err(|e| anyhow::anyhow!("listening for SIGTERM: {e}"))?;
        rt.spawn(async move {
            for first in [true, false] {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                if first {
                    tracing::info!(
                        "asked to stop: the cycle running finishes (a second signal abandons it)"
                    );
                    finishing.store(true, Ordering::SeqCst);
                } else {
                    tracing::warn!("asked again: the cycle running is abandoned and rolled back");
                    stop.store(true, Ordering::SeqCst);
                }
                wake.notify_one();
            }
        });
    }
    let mut committed_cut: Option<f64> = None;
    let mut n = 0u64;
    while !finishing.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
        n += 1;
        let start = Instant::now();
        let r = rt.block_on(coord::run(source, dest, key, o, |t| {
            metrics.progress(t);
            if json {
                if let Ok(line) = serde_json::to_string(t) {
                    println!("{line}");
                }
            }
        }));
        let seconds = start.elapsed().as_secs_f64();
        let line = match r {
            Ok(report) => {
                metrics.completed();
                let c = report.cycle.as_ref();
                if let Some(c) = c {
                    let cut = c.cut_unix_ms as f64 / 1e3;
                    committed_cut = Some(cut);
                    metrics.committed(cut);
                }
                CycleLine {
                    event: "cycle",
                    cycle: n,
                    id: c.map(|c| c.cycle),
                    cut_unix: c.map(|c| c.cut_unix_ms as f64 / 1e3),
                    bytes: report.bytes,
                    data_bytes: report.data_bytes,
                    wire_bytes: report.wire_bytes,
                    seconds,
                    committed: true,
                    whole: c.map(|c| c.whole),
                    rpo_seconds: committed_cut.map(|cut| (unix_now() - cut).max(0.0)),
                    held_us: report.cut.as_ref().map(|c| c.max_held_us()),
                    error: None,
                    abandoned: false,
                    phases: Some(report.phases.clone()),
                }
            }
            Err(e) => {
                metrics.failed();
                let abandoned = e.downcast_ref::<Abandoned>().is_some();
                if !abandoned {
                    tracing::error!("cycle {n} failed: {e:#}; the next interval tries again");
                }
                CycleLine {
                    event: "cycle",
                    cycle: n,
                    id: None,
                    cut_unix: None,
                    bytes: 0,
                    data_bytes: 0,
                    wire_bytes: 0,
                    seconds,
                    committed: false,
                    whole: None,
                    rpo_seconds: committed_cut.map(|cut| (unix_now() - cut).max(0.0)),
                    held_us: None,
                    error: Some(format!("{e:#}")),
                    abandoned,
                    phases: None,
                }
            }
        };
        if json {
            println!("{}", serde_json::to_string(&line)?);
        } else {
            let rpo = line
                .rpo_seconds
                .map(|r| format!("; replica {r:.1} s behind"))
                .unwrap_or_default();
            match &line.error {
                None => println!(
                    "cycle {n}: committed {} in {:.1} s{rpo}",
                    units::Size(line.bytes).approx(),
                    line.seconds
                ),
                Some(e) => println!("cycle {n}: not committed ({e}){rpo}"),
            }
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let next = start + every;
        rt.block_on(async {
            tokio::select! {
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(next)) => {}
                _ = wake.notified() => {}
            }
        });
    }
    Ok(())
}
