//! `rsv sync`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::Args;

use crate::auth::Key;
use crate::coord::{self, SyncOptions, VolumeRef};
use crate::metrics::SyncMetrics;
use crate::pace::Mode;

#[derive(Args, Debug)]
#[command(after_help = "\
SOURCE and DEST name a volume by its control endpoint and LUN: [rsv://]HOST[:PORT]/IQN/LUN
(port 3262 unless given). Each side runs `rsv target` with `--control ADDR --control-key
FILE` (or [control] in its TOML) on the file server and on every disk server, all with the
same key file. A LUN striped over iscsi:// members is copied member by member: disk server
i of the source writes its member straight to disk server i of the destination over iSCSI,
in parallel; the data never passes through this command.

The streams are paced together (--pacing cooperative): their sum is held at the bottleneck
(--rate, or found by the streams) and divided by what each has left, so that they finish
together. With change tracking (`track = true` on the source LUNs) a second sync sends only
the units written since the last one, and an interrupted sync resumes where it stopped;
without it, --state FILE keeps the resume point. Every unit sent is checked by a BLAKE3
checksum taken on each side; a unit that differs is sent again.

Roles: a sync makes SOURCE the primary and DEST a replica (read-only to applications; only
the sync's streams write it). `rsv sync promote|demote|status|resync` handle failover and
failback; a sync between two primaries, or from a stale one, is refused before any data
moves.

With --every INTERVAL it runs continuously: one cycle per interval (cut, send what changed,
commit at the far site, release), until SIGTERM or SIGINT (the cycle running finishes; a
second signal abandons it). A cycle that fails is logged and the next interval tries again;
the far site keeps its last committed image meanwhile.

Exit status: 0 done and verified (with --every: stopped by a signal), 1 failed (run the same
command to resume).")]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SyncArgs {
    #[command(subcommand)]
    pub action: Option<crate::failover_cli::Action>,
    /// The volume to copy: [rsv://]HOST[:PORT]/IQN/LUN.
    #[arg(required = true)]
    pub source: Option<VolumeRef>,
    /// Where it goes: [rsv://]HOST[:PORT]/IQN/LUN (same layout: as many members, same stripe unit).
    #[arg(required = true)]
    pub dest: Option<VolumeRef>,
    /// The key file every control request is signed with (owner-readable only).
    #[arg(long, env = "RSV_CONTROL_KEY", value_name = "FILE", required = true)]
    pub key_file: Option<PathBuf>,
    /// The bottleneck between the sites, as tc writes it (1gbit) or in bytes (125MB/s).
    /// Without it the streams find it together.
    #[arg(long)]
    pub rate: Option<String>,
    /// cooperative (divided by what each stream has left), static (1/N of --rate each) or unpaced.
    #[arg(long, default_value = "cooperative")]
    pub pacing: Mode,
    /// Transfer, checksum and resume unit (with change tracking: the tracking unit).
    #[arg(long, default_value = "1MiB")]
    pub unit: String,
    /// Send every unit even where change tracking could tell what changed.
    #[arg(long)]
    pub full: bool,
    /// Skip the checksum comparison.
    #[arg(long)]
    pub no_verify: bool,
    /// zstd on the wire: auto (per stream, while the data compresses and the CPU keeps up
    /// with the stream), on (every unit that shrinks) or off. Only to Reservoir's targets;
    /// others get plain writes.
    #[arg(long, value_enum, default_value = "auto")]
    pub compress: crate::squeeze::Mode,
    /// Progress and the result as JSON lines on stdout (per-stream rates every interval).
    #[arg(long)]
    pub json: bool,
    /// Resume state for volumes without change tracking (removed when the sync ends well).
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// An option of the iSCSI sessions to the destination (as in an iscsi:// URL's query),
    /// repeatable: e.g. --session connections=2.
    #[arg(long = "session", value_name = "KEY=VALUE")]
    pub session: Vec<String>,
    /// How often the streams are asked how they do.
    #[arg(long, default_value = "500ms")]
    pub interval: String,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics while the sync
    /// runs (off unless given): each stream's rate, bytes sent and left, ETA and pacing
    /// cap, the totals, and when the sync completed (docs/replicate.md). Printed as
    /// `metrics ADDR` on stderr (with --json, a line {"event":"metrics","listen":ADDR}).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// With --metrics: keep serving this long after the sync ends (or until SIGTERM),
    /// so that a scrape sees how it ended; more than the scrape interval.
    #[arg(
        long,
        default_value = "0s",
        value_name = "DURATION",
        requires = "metrics"
    )]
    pub metrics_hold: String,
    /// With --metrics: the most per-stream series one scrape carries (7 per stream);
    /// streams past it are left out, and the log says so once.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub metrics_max_series: u64,
    /// Copy the live LUNs instead of a point-in-time image: a volume written during the
    /// sync then lands as a copy of no single moment.
    #[arg(long)]
    pub live: bool,
    /// The longest the source members hold write answers while the cut is taken (the
    /// cut aborts past it).
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub cut_hold: String,
    /// Continuous mode: a cycle every DURATION (from the start of one to the start of the
    /// next; a cycle longer than that is followed by the next at once) until SIGTERM or
    /// SIGINT, which let the cycle running finish (a second one abandons it). Each prints a `cycle` line (with --json: its number, cut moment, bytes,
    /// duration, whether it committed, and the replica's lag, rpo_seconds).
    #[arg(long, value_name = "DURATION")]
    pub every: Option<String>,
}

fn shown_rate(bytes_per_s: u64) -> String {
    units::Rate::from_bytes_per_sec(bytes_per_s).approx()
}

pub fn run(args: SyncArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return crate::failover_cli::run(action);
    }
    run_sync(args, false)
}

/// A sync, or with `resync` a failback (`rsv sync resync`).
pub(crate) fn run_sync(args: SyncArgs, resync: bool) -> anyhow::Result<()> {
    let (Some(source), Some(dest)) = (args.source.clone(), args.dest.clone()) else {
        anyhow::bail!("give SOURCE and DEST");
    };
    let Some(key_file) = &args.key_file else {
        anyhow::bail!("give --key-file");
    };
    let key = Key::from_file(key_file)?;
    let unit = units::parse_size(&args.unit).map_err(|e| anyhow!("--unit: {e}"))?;
    anyhow::ensure!(
        unit >= 4096 && unit.is_power_of_two(),
        "--unit {unit}: use a power of two of at least 4 KiB"
    );
    let rate = match &args.rate {
        Some(r) => Some(
            units::parse_rate(r)
                .map_err(|e| anyhow!("--rate: {e}"))?
                .bits_per_sec(),
        ),
        None => None,
    };
    if args.pacing == Mode::Static && rate.is_none() {
        anyhow::bail!("--pacing static divides --rate by the streams: give --rate");
    }
    let mut session = Vec::new();
    for kv in &args.session {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--session {kv}: write KEY=VALUE"))?;
        initiator::SessionOptions::default()
            .set(k, v)
            .map_err(|e| anyhow!("--session {kv}: {e}"))?;
        session.push((k.to_owned(), v.to_owned()));
    }
    let interval = units::parse_duration(&args.interval).map_err(|e| anyhow!("--interval: {e}"))?;
    let metrics_hold =
        units::parse_duration(&args.metrics_hold).map_err(|e| anyhow!("--metrics-hold: {e}"))?;
    let o = SyncOptions {
        unit,
        rate,
        pacing: args.pacing,
        full: args.full,
        verify: !args.no_verify,
        compress: args.compress,
        interval: interval.max(Duration::from_millis(50)),
        session,
        state: args.state.clone(),
        cut: if args.live {
            None
        } else {
            Some(units::parse_duration(&args.cut_hold).map_err(|e| anyhow!("--cut-hold: {e}"))?)
        },
        resync,
        stop: Default::default(),
    };
    let every = match &args.every {
        Some(e) => {
            let d = units::parse_duration(e).map_err(|e| anyhow!("--every: {e}"))?;
            anyhow::ensure!(!d.is_zero(), "--every: give a duration above zero");
            Some(d)
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let json = args.json;
    let bar = !json && std::io::stderr().is_terminal();
    let metrics = SyncMetrics::default();
    if let Some(addr) = args.metrics {
        let max = usize::try_from(args.metrics_max_series).unwrap_or(usize::MAX);
        let registry = std::sync::Arc::new(metrics.registry(max));
        let l = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("listening for metrics on {addr}"))?;
        let at = l.local_addr()?;
        if json {
            println!("{}", serde_json::json!({"event": "metrics", "listen": at}));
        } else {
            eprintln!("metrics {at}");
        }
        rt.spawn(rsv_metrics::serve(l, registry));
    }
    if let Some(every) = every {
        let r = crate::continuous::run(&rt, &source, &dest, &key, &o, every, &metrics, json);
        hold_metrics(&rt, args.metrics.is_some(), metrics_hold);
        return r;
    }
    let report = rt.block_on(coord::run(&source, &dest, &key, &o, |t| {
        metrics.progress(t);
        if json {
            if let Ok(line) = serde_json::to_string(t) {
                println!("{line}");
            }
        } else if bar {
            let pct = t.done_bytes as f64 * 100.0 / t.bytes.max(1) as f64;
            let left = t.bytes.saturating_sub(t.done_bytes);
            let eta = if t.rate_bytes_per_s > 0 {
                format!("{:.0} s left", left as f64 / t.rate_bytes_per_s as f64)
            } else {
                String::new()
            };
            let running = t.streams.iter().filter(|s| s.finished_at.is_none()).count();
            eprint!(
                "\r{pct:5.1}%  {} of {}  {}  {running}/{} streams  {:?}  {eta}     ",
                units::Size(t.done_bytes).approx(),
                units::Size(t.bytes).approx(),
                shown_rate(t.rate_bytes_per_s),
                t.streams.len(),
                t.phase,
            );
            let _ = std::io::stderr().flush();
        }
    }));
    if bar {
        eprintln!();
    }
    match &report {
        Ok(r) => {
            metrics.completed();
            if let Some(c) = r.cycle.as_ref().filter(|c| c.whole) {
                metrics.committed(c.cut_unix_ms as f64 / 1e3);
            }
        }
        Err(_) => metrics.failed(),
    }
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            hold_metrics(&rt, args.metrics.is_some(), metrics_hold);
            return Err(e);
        }
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "synced {} in {} stream(s) in {:.1} s ({}){}{}; {} as data ({} on the wire), {} as zeros; finish spread {:.1} %; {} unit(s) verified, {} repaired",
            units::Size(report.bytes).approx(),
            report.streams,
            report.seconds,
            shown_rate(report.rate_bytes_per_s),
            if report.incremental { ", incremental" } else { "" },
            report
                .cut
                .as_ref()
                .map(|c| format!(", image of one moment (writes held {} µs at most)", c.max_held_us()))
                .unwrap_or_default(),
            units::Size(report.data_bytes).approx(),
            units::Size(report.wire_bytes).approx(),
            units::Size(report.zero_bytes).approx(),
            report.finish_spread * 100.0,
            report.verified_units,
            report.repaired_units
        );
    }
    hold_metrics(&rt, args.metrics.is_some(), metrics_hold);
    Ok(())
}

/// With --metrics, serves on for `hold` after the sync (SIGTERM or SIGINT end it early),
/// so that the last scrape sees its end.
pub(crate) fn hold_metrics(rt: &tokio::runtime::Runtime, metrics: bool, hold: Duration) {
    if !metrics || hold.is_zero() {
        return;
    }
    let _ = std::io::stdout().flush();
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return tokio::time::sleep(hold).await;
        };
        tokio::select! {
            _ = tokio::time::sleep(hold) => {}
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
}
