//! `rsv load`: many sessions at once against one target, each doing verified mixed I/O in
//! a region of its own (stamped 4 KiB units written, read back and compared with what was
//! last acknowledged there), for a set time. Reports errors, mismatches, latency
//! percentiles and, given the target's process id, its peak resident memory and file
//! descriptors with a sample every second (memory after warm-up against the end says
//! whether it stays flat). SIGINT or SIGTERM ends the load early, with its report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use bytes::Bytes;
use initiator::{IscsiUrl, Lun, SessionOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::crash::model::{self, Found, UNIT};

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// The LUN: iscsi://HOST[:PORT]/IQN/LUN.
    pub url: String,
    /// Sessions at once.
    #[arg(long, default_value_t = 256)]
    pub sessions: u32,
    /// TCP connections per session.
    #[arg(long, default_value_t = 2)]
    pub connections: u16,
    /// How long the load runs (600s, 30s); SIGINT or SIGTERM ends it sooner, and the
    /// report is printed all the same.
    #[arg(long, default_value = "600s")]
    pub duration: String,
    /// Bytes of the LUN each session works in.
    #[arg(long, default_value = "1MiB")]
    pub region: String,
    /// Percent of operations that read and verify.
    #[arg(long, default_value_t = 50)]
    pub read_percent: u8,
    /// The target's process: its memory and descriptors are sampled every second.
    #[arg(long)]
    pub target_pid: Option<u32>,
    /// List every command that took at least this long (start time and duration) in the
    /// report's `slow_commands`, up to 100,000: a failover bench finds the stall of each
    /// gateway it killed there (100ms, 1s).
    #[arg(long)]
    pub slow: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One command at least `--slow` long.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SlowCommand {
    /// When it was issued, in seconds since the Unix epoch.
    pub start_unix_s: f64,
    /// How long it took until its answer (or error).
    pub seconds: f64,
    pub write: bool,
}

/// How many slow commands a report keeps.
const SLOW_KEPT: usize = 100_000;

#[derive(Debug, Default, Serialize)]
pub struct LoadReport {
    pub sessions: u32,
    pub sessions_logged_in: u32,
    pub connections_per_session: u16,
    pub seconds: f64,
    pub ios: u64,
    pub writes: u64,
    pub verified_reads: u64,
    pub errors: u64,
    pub mismatches: u64,
    /// The first errors and mismatches, one line each.
    pub first_errors: Vec<String>,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_max: u64,
    /// Target process samples, when `--target-pid` was given.
    pub target_peak_rss_kib: Option<u64>,
    pub target_peak_fds: Option<u64>,
    /// Resident memory a quarter into the run and at its end.
    pub target_rss_kib_at_quarter: Option<u64>,
    pub target_rss_kib_at_end: Option<u64>,
    /// The target's memory and descriptors over the run: the sample nearest each tenth
    /// of it (memory flat after warm-up shows as the same figure from the second on).
    pub target_over_time: Vec<TargetSample>,
    /// Commands at least `--slow` long, in the order they ended (empty without it).
    pub slow_commands: Vec<SlowCommand>,
}

/// One sample of the target's process.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TargetSample {
    /// Seconds since the load began.
    pub at_s: u64,
    pub rss_kib: u64,
    pub fds: u64,
}

#[derive(Default)]
struct Tally {
    ios: AtomicU64,
    writes: AtomicU64,
    reads: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
    first: Mutex<Vec<String>>,
    hist: Mutex<Option<hdrhistogram::Histogram<u64>>>,
    /// Set by SIGINT or SIGTERM: the sessions end after their command in flight.
    stop: std::sync::atomic::AtomicBool,
    /// `--slow`, and the commands found so.
    slow_from: Option<Duration>,
    slow: Mutex<Vec<SlowCommand>>,
}

impl Tally {
    fn note(&self, what: String) {
        let mut f = self.first.lock().unwrap();
        if f.len() < 10 {
            f.push(what);
        }
    }
}

fn proc_sample(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

pub fn run(args: LoadArgs) -> anyhow::Result<LoadReport> {
    let duration = units::parse_duration(&args.duration).map_err(|e| anyhow!("--duration: {e}"))?;
    let region = units::parse_size(&args.region).map_err(|e| anyhow!("--region: {e}"))?;
    let region = region / UNIT as u64 * UNIT as u64;
    if region == 0 || args.sessions == 0 {
        bail!("--region and --sessions must be above zero");
    }
    let slow_from = args
        .slow
        .as_deref()
        .map(|s| units::parse_duration(s).map_err(|e| anyhow!("--slow: {e}")))
        .transpose()?;
    let url = IscsiUrl::parse(&args.url)?;
    let base = url.options(&SessionOptions::default())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let tally = Arc::new(Tally {
        slow_from,
        ..Tally::default()
    });
    *tally.hist.lock().unwrap() =
        Some(hdrhistogram::Histogram::new_with_bounds(1, 600_000_000, 3).unwrap());
    let logged_in = Arc::new(AtomicU64::new(0));
    let samples: Arc<Mutex<Vec<TargetSample>>> = Arc::default();
    let started = Instant::now();
    rt.block_on(async {
        let sampler = args.target_pid.map(|pid| {
            let samples = samples.clone();
            tokio::spawn(async move {
                loop {
                    if let Some((rss_kib, fds)) = proc_sample(pid) {
                        samples.lock().unwrap().push(TargetSample {
                            at_s: started.elapsed().as_secs(),
                            rss_kib,
                            fds,
                        });
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        });
        let deadline = Instant::now() + duration;
        // A signal ends the load as its deadline would: each session finishes the command
        // it has in flight, and the report is made (a bench stops a load so, after its
        // last event).
        let stopper = {
            let tally = tally.clone();
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                tracing::info!("signal: ending the load");
                tally.stop.store(true, Ordering::Relaxed);
            })
        };
        let mut tasks = Vec::new();
        for i in 0..args.sessions {
            let url = url.clone();
            let tally = tally.clone();
            let logged_in = logged_in.clone();
            // The URL's query (portal=, timeouts) counts; these three are the load's.
            let opts = SessionOptions {
                connections: args.connections,
                auto_tune: false,
                queue_depth: 8,
                ..base.clone()
            };
            let read_percent = args.read_percent;
            tasks.push(tokio::spawn(async move {
                let lun = match Lun::open_url(&url, &opts).await {
                    Ok(l) => l,
                    Err(e) => {
                        tally.errors.fetch_add(1, Ordering::Relaxed);
                        tally.note(format!("session {i}: login: {e}"));
                        return;
                    }
                };
                logged_in.fetch_add(1, Ordering::Relaxed);
                let base = i as u64 * region;
                if base + region > lun.size() {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    tally.note(format!("session {i}: the LUN is too small for its region"));
                    return;
                }
                session(lun, i, base, region, read_percent, deadline, &tally).await;
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        if let Some(s) = sampler {
            s.abort();
        }
        stopper.abort();
    });
    let h = tally.hist.lock().unwrap().take().unwrap();
    let samples = samples.lock().unwrap().clone();
    let first_errors = tally.first.lock().unwrap().clone();
    let slow_commands = std::mem::take(&mut *tally.slow.lock().unwrap());
    let at = |f: f64| {
        samples
            .get(((samples.len() as f64) * f) as usize)
            .map(|s| s.rss_kib)
    };
    let target_over_time = if samples.is_empty() {
        Vec::new()
    } else {
        (1..=10)
            .map(|i| samples[(samples.len() * i / 10).min(samples.len() - 1)])
            .collect()
    };
    Ok(LoadReport {
        sessions: args.sessions,
        sessions_logged_in: logged_in.load(Ordering::Relaxed) as u32,
        connections_per_session: args.connections,
        seconds: started.elapsed().as_secs_f64(),
        ios: tally.ios.load(Ordering::Relaxed),
        writes: tally.writes.load(Ordering::Relaxed),
        verified_reads: tally.reads.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        mismatches: tally.mismatches.load(Ordering::Relaxed),
        first_errors,
        latency_us_p50: h.value_at_quantile(0.5),
        latency_us_p99: h.value_at_quantile(0.99),
        latency_us_p999: h.value_at_quantile(0.999),
        latency_us_max: h.max(),
        target_peak_rss_kib: samples.iter().map(|s| s.rss_kib).max(),
        target_peak_fds: samples.iter().map(|s| s.fds).max(),
        target_rss_kib_at_quarter: at(0.25),
        target_rss_kib_at_end: samples.last().map(|s| s.rss_kib),
        target_over_time,
        slow_commands,
    })
}

/// One session's loop: writes of 1..4 stamped units, or reads compared with the stamps
/// last acknowledged (one command at a time, so a read sees exactly those).
async fn session(
    lun: Lun,
    i: u32,
    base: u64,
    region: u64,
    read_percent: u8,
    deadline: Instant,
    tally: &Tally,
) {
    let units = region / UNIT as u64;
    let mut gens = vec![0u64; units as usize];
    let mut gen = 0u64;
    let mut rng = StdRng::seed_from_u64(i as u64);
    let run = 0x10ad_0000 + i as u64;
    while Instant::now() < deadline && !tally.stop.load(Ordering::Relaxed) {
        let n = rng.gen_range(1..=4u64).min(units);
        let first = rng.gen_range(0..=units - n);
        let offset = base + first * UNIT as u64;
        let t = Instant::now();
        if rng.gen_range(0..100) < read_percent {
            let r = lun.read_at(offset, n as usize * UNIT).await;
            record(tally, t, false);
            match r {
                Ok(data) => {
                    tally.reads.fetch_add(1, Ordering::Relaxed);
                    for (k, chunk) in data.chunks(UNIT).enumerate() {
                        let u = first + k as u64;
                        let want = match gens[u as usize] {
                            0 => Found::Empty,
                            g => Found::Stamp {
                                run,
                                unit: base / UNIT as u64 + u,
                                gen: g,
                            },
                        };
                        let got = model::parse(chunk);
                        // A region never written reads as zeros or as an earlier run's
                        // stamps; after a write, exactly what was written.
                        if gens[u as usize] != 0 && got != want {
                            tally.mismatches.fetch_add(1, Ordering::Relaxed);
                            tally.note(format!("session {i}: unit {u}: {got:?} where {want:?}"));
                        }
                    }
                }
                Err(e) => {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    tally.note(format!("session {i}: read: {e}"));
                }
            }
        } else {
            gen += 1;
            let mut buf = vec![0u8; n as usize * UNIT];
            for (k, chunk) in buf.chunks_mut(UNIT).enumerate() {
                model::stamp(chunk, run, base / UNIT as u64 + first + k as u64, gen);
            }
            let r = lun.write_at(offset, Bytes::from(buf)).await;
            record(tally, t, true);
            match r {
                Ok(()) => {
                    tally.writes.fetch_add(1, Ordering::Relaxed);
                    for u in first..first + n {
                        gens[u as usize] = gen;
                    }
                }
                Err(e) => {
                    tally.errors.fetch_add(1, Ordering::Relaxed);
                    tally.note(format!("session {i}: write: {e}"));
                }
            }
        }
    }
}

fn record(tally: &Tally, t: Instant, write: bool) {
    tally.ios.fetch_add(1, Ordering::Relaxed);
    let took = t.elapsed();
    if tally.slow_from.is_some_and(|s| took >= s) {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(took);
        let mut slow = tally.slow.lock().unwrap();
        if slow.len() < SLOW_KEPT {
            slow.push(SlowCommand {
                start_unix_s: start.as_secs_f64(),
                seconds: took.as_secs_f64(),
                write,
            });
        }
    }
    let us = took.as_micros().max(1) as u64;
    if let Some(h) = tally.hist.lock().unwrap().as_mut() {
        let _ = h.record(us.min(600_000_000));
    }
}

/// Prints the report; false when anything went wrong.
pub fn print(report: &LoadReport, json: bool) -> anyhow::Result<bool> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!(
            "{} of {} sessions ({} connections each) for {:.1} s: {} I/Os ({} writes, {} verified reads), \
             {} errors, {} mismatches; latency p50 {} us, p99 {} us, p99.9 {} us, max {} us",
            report.sessions_logged_in,
            report.sessions,
            report.connections_per_session,
            report.seconds,
            report.ios,
            report.writes,
            report.verified_reads,
            report.errors,
            report.mismatches,
            report.latency_us_p50,
            report.latency_us_p99,
            report.latency_us_p999,
            report.latency_us_max
        );
        if let (Some(rss), Some(fds)) = (report.target_peak_rss_kib, report.target_peak_fds) {
            println!(
                "target: peak RSS {rss} KiB, peak fds {fds}; RSS {} KiB a quarter in, {} KiB at the end",
                report.target_rss_kib_at_quarter.unwrap_or(0),
                report.target_rss_kib_at_end.unwrap_or(0)
            );
            let over: Vec<String> = report
                .target_over_time
                .iter()
                .map(|s| format!("{} s {} KiB {} fds", s.at_s, s.rss_kib, s.fds))
                .collect();
            println!("target over time: {}", over.join("; "));
        }
        for e in &report.first_errors {
            println!("  {e}");
        }
    }
    Ok(
        report.errors == 0
            && report.mismatches == 0
            && report.sessions_logged_in == report.sessions,
    )
}
