//! R2: Data Reservoir. Two sites of N disk servers each (plus a file server striping over
//! them) across one long bottleneck; a volume copied disk server to disk server in N
//! parallel iSCSI streams (`rsv sync`), against one stream, N unpaced streams, N streams
//! statically paced to 1/N, and the peers: `iperf3 -P N` (the network's ceiling), GridFTP
//! `globus-url-copy -p N`, and `qemu-img convert` from iSCSI to iSCSI. Every stream's
//! throughput over time is plotted with the total, as R2's Fig. 6 does.
//!
//! Figures of each row, from the bottleneck's byte counters (read every 0.2 s) and the
//! transfer's own progress:
//! - payload share from first full: payload bytes delivered from the moment the link
//!   first ran at 90 % of its rate to the end, over what the link's payload capacity
//!   (rate x 1448/1500) carries in that time;
//! - payload share of the whole transfer: all its payload bytes over the capacity from the
//!   command's start (connection set-up and start-up included) to its end;
//! - time until full; finish spread ((last - first) / last finish time) and Jain's index of
//!   the streams' rates (bytes / own finish time).
//!
//! The bottleneck's rate is measured at the start of the run: the highest of a few
//! candidates at which `iperf3 -P N` through the emulator keeps 95 % of the rate on the
//! wire at 20 ms, with every disk server of both sites running.

use crate::busy::{self, Sample};
use crate::env::Environment;
use crate::peers::ISCSI_PORT;
use crate::proc::{self, check_interrupt, in_ns, rsv_bin, sysctl, Link, Proc};
use crate::sites::{Layout, Site, CONTROL_PORT, IQN};
use crate::stats::Spread;
use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const GRIDFTP_PORT: u16 = 2811;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    /// Disk servers per site.
    pub disk_servers: usize,
    pub rtt_ms: Vec<u64>,
    /// Candidate bottleneck rates, highest first (bits per second).
    pub candidate_rates: Vec<u64>,
    /// Link time one transfer should take at the full rate, seconds.
    pub link_seconds: u64,
    /// The one-stream row moves this share of the volume.
    pub one_stream_share: f64,
    /// How long a peer that cannot finish (qemu-img) may run, as a multiple of link_seconds.
    pub overtime: f64,
    /// Only the rows with these keys (all when empty).
    pub rows: Vec<String>,
    /// The bottleneck's rate, bits per second, instead of calibrating it.
    pub link_rate: Option<u64>,
    /// How many times Reservoir's rows (`reservoir`, `reservoir-rate`) run at each RTT,
    /// interleaved (`--repeat`; 0 in results from before it, meaning once).
    #[serde(default)]
    pub repeat: u32,
}

/// `rsv-lab run r2`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Repeated,
    /// Disk servers per site (default 8; --quick 2).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub disk_servers: Option<u64>,
    /// Only these round-trip times, in milliseconds (e.g. 200).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub rtt: Vec<u64>,
    /// Seconds of link time per transfer at the full rate (default 60; --quick 6).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Only these rows.
    #[arg(long, value_delimiter = ',', value_parser = ROWS)]
    pub rows: Vec<String>,
    /// The bottleneck's rate as tc writes it (800mbit) instead of calibrating it.
    #[arg(long, value_parser = units::parse_rate)]
    pub link_rate: Option<units::Rate>,
}

/// The rows `--repeat` repeats: Reservoir's own (the others are the study's methods and the
/// peers, run once a point).
const REPEATED: [&str; 2] = ["reservoir", "reservoir-rate"];

/// R2's rows, by key.
const ROWS: [&str; 8] = [
    "one",
    "unpaced",
    "static",
    "reservoir",
    "reservoir-rate",
    "iperf3",
    "gridftp",
    "qemu-img",
];

impl Args {
    pub fn params(&self) -> Result<Params> {
        let mut p = Params::new(self.flags.common.quick);
        p.rtt_ms = crate::cli::given_or(&self.rtt, p.rtt_ms);
        p.link_seconds = self.seconds.unwrap_or(p.link_seconds);
        if let Some(n) = self.disk_servers {
            p.disk_servers = usize::try_from(n)?;
        }
        p.rows = self.rows.clone();
        p.link_rate = self.link_rate.map(|r| r.bits_per_sec());
        p.repeat = self.flags.repeat.repeat;
        Ok(p)
    }
}

impl Params {
    pub fn new(quick: bool) -> Params {
        if quick {
            Params {
                disk_servers: 2,
                rtt_ms: vec![50],
                candidate_rates: vec![100_000_000],
                link_seconds: 6,
                one_stream_share: 0.5,
                overtime: 3.0,
                rows: Vec::new(),
                link_rate: None,
                repeat: 1,
            }
        } else {
            Params {
                disk_servers: 8,
                rtt_ms: vec![350, 200],
                candidate_rates: vec![
                    1_000_000_000,
                    800_000_000,
                    600_000_000,
                    500_000_000,
                    400_000_000,
                    300_000_000,
                ],
                link_seconds: 60,
                one_stream_share: 0.25,
                overtime: 2.0,
                rows: Vec::new(),
                link_rate: None,
                repeat: 1,
            }
        }
    }
}

/// One row: a way of moving the data, at one RTT.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Row {
    pub key: String,
    /// Which repetition of the row this is (1 to `--repeat`; 0 in results from before it).
    #[serde(default)]
    pub repeat: u32,
    pub label: String,
    pub rtt_ms: u64,
    pub streams: usize,
    pub payload_bytes: u64,
    pub seconds: f64,
    pub payload_mbit_s: f64,
    /// Payload share of the bottleneck from first full to the end (%).
    pub from_full_pct: Option<f64>,
    /// Payload share over the whole transfer, start-up included (%).
    pub whole_pct: f64,
    /// Seconds from the command's start until the link first ran full.
    pub time_to_full_s: Option<f64>,
    /// Bytes on the wire over the transfer as a share of the rate (%).
    pub wire_pct: f64,
    pub finish_spread_pct: Option<f64>,
    pub jain: Option<f64>,
    /// Each stream's finish time (s from the start) and rate (Mbit/s).
    pub stream_finish_s: Vec<f64>,
    pub stream_mbit_s: Vec<f64>,
    /// Per-stream throughput over time: (seconds, Mbit/s) per stream.
    pub series: Vec<Vec<(f64, f64)>>,
    /// The whole link's payload-equivalent throughput over time (Mbit/s on the wire).
    pub link_series: Vec<(f64, f64)>,
    /// The bottleneck's queue each second of the transfer: (seconds from the start,
    /// MB queued at the second's last reading, packets dropped in the second).
    #[serde(default)]
    pub queue_series: Vec<(f64, f64, u64)>,
    pub verified_units: Option<u64>,
    /// TCP retransmissions per stream, as the streams last reported them.
    pub retransmits: Vec<u64>,
    /// What the row cost the machine: CPU, the relay, drops at the bottleneck.
    pub cost: proc::Cost,
    pub note: String,
    pub error: String,
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    /// The bottleneck the rows ran at, bits per second, and how it was chosen.
    pub rate_bps: u64,
    pub calibration: Vec<(u64, f64)>,
    pub volume_bytes: u64,
    pub environment: Environment,
    pub rows: Vec<Row>,
    /// Each repeated row at each RTT over its repetitions (empty in results from before
    /// `--repeat`).
    #[serde(default)]
    pub summary: Vec<Summary>,
}

/// A row of Reservoir's at one RTT over its repetitions (`--repeat`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Summary {
    pub rtt_ms: u64,
    pub key: String,
    /// Repetitions run, and how many failed (left out of the spreads).
    pub runs: usize,
    pub failed: usize,
    pub whole_pct: Option<Spread>,
    pub from_full_pct: Option<Spread>,
    pub time_to_full_s: Option<Spread>,
    pub queue_drops: Option<Spread>,
    /// The repetition whose whole-transfer share is the median (the lower of the two
    /// middle ones for an even count): its timeline is drawn and its other columns shown.
    pub median_repeat: Option<u32>,
}

/// The repeated rows (`REPEATED`) of `rows`, grouped by RTT and key in the order they
/// first appear.
pub fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut groups: Vec<(u64, &str, Vec<&Row>)> = Vec::new();
    for r in rows.iter().filter(|r| REPEATED.contains(&r.key.as_str())) {
        match groups
            .iter_mut()
            .find(|(t, k, _)| *t == r.rtt_ms && *k == r.key)
        {
            Some((_, _, v)) => v.push(r),
            None => groups.push((r.rtt_ms, r.key.as_str(), vec![r])),
        }
    }
    groups
        .into_iter()
        .map(|(rtt_ms, key, rs)| {
            let ok: Vec<&Row> = rs.iter().copied().filter(|r| r.error.is_empty()).collect();
            let mut by_whole = ok.clone();
            by_whole.sort_by(|a, b| a.whole_pct.total_cmp(&b.whole_pct));
            Summary {
                rtt_ms,
                key: key.to_owned(),
                runs: rs.len(),
                failed: rs.len() - ok.len(),
                whole_pct: Spread::of(ok.iter().map(|r| r.whole_pct)),
                from_full_pct: Spread::of(ok.iter().filter_map(|r| r.from_full_pct)),
                time_to_full_s: Spread::of(ok.iter().filter_map(|r| r.time_to_full_s)),
                queue_drops: Spread::of(ok.iter().map(|r| r.cost.queue_drops as f64)),
                median_repeat: by_whole
                    .get(by_whole.len().saturating_sub(1) / 2)
                    .map(|r| r.repeat),
            }
        })
        .collect()
}

/// Whether `row` is drawn and shown in the document: every row run once, and of a
/// repeated one the median repetition.
fn shown(summary: &[Summary], row: &Row) -> bool {
    match summary
        .iter()
        .find(|s| s.rtt_ms == row.rtt_ms && s.key == row.key && s.runs > 1)
    {
        Some(s) => s.median_repeat == Some(row.repeat),
        None => true,
    }
}

fn payload_capacity(rate_bps: u64) -> f64 {
    rate_bps as f64 * 1448.0 / 1500.0 / 8.0
}

/// The bottleneck's samples between two Unix times, as Mbit/s over 1-s steps.
fn link_series(ab: &[Sample], from: f64, to: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut t = from;
    while t + 1.0 <= to + 1e-9 {
        if let (Some(a), Some(b)) = (busy::bytes_at(ab, t), busy::bytes_at(ab, t + 1.0)) {
            out.push((t + 0.5 - from, (b - a) * 8.0 / 1e6));
        }
        t += 1.0;
    }
    out
}

/// Fills a row's link figures from the bottleneck's samples over `[start, end]` (Unix).
/// `payload_at(t)`: payload delivered by Unix time `t`, where the transfer knows it.
fn link_figures(
    row: &mut Row,
    ab: &[Sample],
    start: f64,
    end: f64,
    rate_bps: u64,
    payload_at: Option<&dyn Fn(f64) -> f64>,
) {
    let cap = payload_capacity(rate_bps);
    row.seconds = end - start;
    row.payload_mbit_s = row.payload_bytes as f64 * 8.0 / row.seconds.max(1e-9) / 1e6;
    row.whole_pct = 100.0 * row.payload_bytes as f64 / (cap * row.seconds.max(1e-9));
    row.link_series = link_series(ab, start, end);
    if let Some(u) = busy::link_use(ab, start, end, None, rate_bps) {
        row.wire_pct = u.busy_pct;
        if u.start_s < row.seconds {
            row.time_to_full_s = Some(u.start_s);
            let full = start + u.start_s;
            let payload_after = match payload_at {
                Some(f) => row.payload_bytes as f64 - f(full),
                // Without the transfer's own progress: the wire bytes after the point,
                // scaled by the transfer's payload share of all its wire bytes.
                None => {
                    let wire_after = busy::bytes_at(ab, end).unwrap_or(0.0)
                        - busy::bytes_at(ab, full).unwrap_or(0.0);
                    wire_after * row.payload_bytes as f64 / (u.wire_bytes as f64).max(1.0)
                }
            };
            let span = end - full;
            if span > 0.0 {
                row.from_full_pct = Some(100.0 * payload_after / (cap * span));
            }
        }
    }
}

/// The queue samples between `from` and `to` by whole seconds from `from`: the bytes at
/// the second's last reading, the drops during it.
fn queue_series(q: &[proc::QueueSample], from: f64, to: f64) -> Vec<(f64, f64, u64)> {
    let mut out: Vec<(f64, f64, u64)> = Vec::new();
    let mut drops_before = q.iter().take_while(|s| s.at < from).last().map(|s| s.drops);
    for s in q.iter().filter(|s| s.at >= from && s.at <= to + 1.0) {
        let second = (s.at - from).floor();
        let dropped = s.drops.saturating_sub(drops_before.unwrap_or(s.drops));
        drops_before = Some(s.drops);
        match out.last_mut() {
            Some(last) if last.0 == second => {
                last.1 = s.queue_bytes as f64 / 1e6;
                last.2 += dropped;
            }
            _ => out.push((second, s.queue_bytes as f64 / 1e6, dropped)),
        }
    }
    out
}

/// A progress tick: Unix time, bytes acknowledged in all, and per stream.
type Point = (f64, f64, Vec<f64>);

/// A row of `rsv sync`: key, label, (source, destination), flags.
type SyncPlan<'a> = (&'a str, String, (&'a str, &'a str), Vec<String>);

/// Runs `rsv sync --json` in the source site's file-server namespace and reads its ticks.
#[allow(clippy::too_many_arguments)]
fn sync_row(
    link: &Link,
    key_file: &Path,
    dir: &Path,
    rate_bps: u64,
    rtt: u64,
    rowkey: &str,
    label: &str,
    volume: (&str, &str),
    args: &[String],
    timeout: Duration,
) -> Result<Row> {
    let a = &link.a[0];
    let mut cmd = in_ns(&a.ns, rsv_bin());
    cmd.arg("sync")
        .arg("--json")
        .arg("--key-file")
        .arg(key_file)
        .args(args)
        .arg(volume.0)
        .arg(volume.1);
    // RSV_LAB_KEEP=DIR keeps each sync's --json lines and its log (run with -v) there,
    // for a look at a row's timeline; the run's results do not depend on it.
    let keep = std::env::var_os("RSV_LAB_KEEP").map(PathBuf::from);
    if keep.is_some() {
        cmd.arg("-v");
    }
    let watch = watch(link)?;
    let start = unix_now();
    let out = proc::run(cmd, timeout, dir)?;
    let end_wall = unix_now();
    let ((ab, _), queue) = watch.finish_with_queue();
    let queue_series = queue_series(&queue, start, end_wall);
    if let Some(k) = &keep {
        std::fs::create_dir_all(k)?;
        let stem = k.join(format!("r2-{rtt}ms-{rowkey}"));
        std::fs::write(stem.with_extension("jsonl"), &out.stdout)?;
        std::fs::write(
            stem.with_extension("log"),
            format!("started {start:.3}\n{}", out.stderr),
        )?;
    }
    let mut row = Row {
        key: rowkey.into(),
        label: label.into(),
        rtt_ms: rtt,
        queue_series,
        ..Row::default()
    };
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let done = lines.iter().find(|l| l["event"] == "done");
    let ticks: Vec<&Value> = lines.iter().filter(|l| l["event"] == "progress").collect();
    let Some(done) = done else {
        row.error = format!("rsv sync did not finish: {}", out.describe());
        link_figures(&mut row, &ab, start, end_wall, rate_bps, None);
        return Ok(row);
    };
    let n = done["streams"].as_u64().unwrap_or(0) as usize;
    row.streams = n;
    row.payload_bytes = done["bytes"].as_u64().unwrap_or(0);
    row.verified_units = done["verified_units"].as_u64();
    // The most each stream reported: a finished stream's session is gone and says 0.
    for t in &ticks {
        for (i, x) in t["streams"].as_array().into_iter().flatten().enumerate() {
            let r = x["retransmits"].as_u64().unwrap_or(0);
            match row.retransmits.get_mut(i) {
                Some(m) => *m = (*m).max(r),
                None => row.retransmits.push(r),
            }
        }
    }
    let started = done["started_unix"].as_f64().unwrap_or(start);
    let fin: Vec<f64> = done["finished_at"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let sb: Vec<u64> = done["stream_bytes"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    // The transfer ends when its last stream finishes (verification comes after).
    let end = started + fin.iter().copied().fold(0.0, f64::max);
    // Times count from the command's start: login and planning are part of the transfer.
    let offset = started - start;
    row.stream_finish_s = fin.iter().map(|f| f + offset).collect();
    row.stream_mbit_s = fin
        .iter()
        .zip(&sb)
        .map(|(f, b)| *b as f64 * 8.0 / (f + offset).max(1e-9) / 1e6)
        .collect();
    if n > 1 {
        let hi = row.stream_finish_s.iter().copied().fold(0.0, f64::max);
        let lo = row
            .stream_finish_s
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        row.finish_spread_pct = Some(100.0 * (hi - lo) / hi.max(1e-9));
        row.jain = Some(crate::r1::jain(&row.stream_mbit_s));
    }
    // Per-stream series from the ticks' acknowledged bytes, over 1-s steps.
    let points: Vec<Point> = ticks
        .iter()
        .map(|t| {
            let per = t["streams"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .map(|x| x["done_bytes"].as_f64().unwrap_or(0.0))
                        .collect()
                })
                .unwrap_or_default();
            (
                t["unix"].as_f64().unwrap_or(0.0),
                t["done_bytes"].as_f64().unwrap_or(0.0),
                per,
            )
        })
        .collect();
    let at = |t: f64, f: &dyn Fn(&Point) -> f64| -> f64 {
        let i = points.partition_point(|p| p.0 < t);
        match (i.checked_sub(1).and_then(|j| points.get(j)), points.get(i)) {
            (Some(b), Some(a)) if a.0 > b.0 => f(b) + (t - b.0) / (a.0 - b.0) * (f(a) - f(b)),
            (Some(b), _) => f(b),
            (None, Some(_)) | (None, None) => 0.0,
        }
    };
    row.series = (0..n)
        .map(|i| {
            let mut s = Vec::new();
            let mut t = start;
            while t + 1.0 <= end + 1e-9 {
                let a = at(t, &|p| p.2.get(i).copied().unwrap_or(0.0));
                let b = at(t + 1.0, &|p| p.2.get(i).copied().unwrap_or(0.0));
                s.push((t + 0.5 - start, (b - a) * 8.0 / 1e6));
                t += 1.0;
            }
            s
        })
        .collect();
    let payload_at = |t: f64| at(t, &|p| p.1);
    link_figures(&mut row, &ab, start, end, rate_bps, Some(&payload_at));
    if !out.ok() {
        row.error = out.describe();
    }
    Ok(row)
}

/// Starts reading the bottleneck's counters and returns once a first reading is in, so
/// that the samples cover the measurement from its start.
fn watch(link: &Link) -> Result<proc::Watch> {
    let w = link.watch(Duration::from_millis(200));
    proc::sleep(Duration::from_millis(400))?;
    Ok(w)
}

/// MemAvailable from /proc/meminfo, bytes (0 when unreadable).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `iperf3 -P N` from site A's file-server host to site B's for `seconds`.
fn iperf3_row(
    link: &Link,
    dir: &Path,
    rate_bps: u64,
    rtt: u64,
    n: usize,
    seconds: u64,
) -> Result<Row> {
    let (a, b) = (&link.a[0], &link.b[0]);
    let mut s = in_ns(&b.ns, "iperf3");
    s.args(["-s", "-1", "-p", "5201"]);
    let mut server = Proc::spawn(s, "iperf3 -s", &dir.join("iperf3-s.log"))?;
    proc::wait_listen(&b.ns, 5201, &mut server)?;
    let mut c = in_ns(&a.ns, "iperf3");
    c.args([
        "-c",
        &b.addr.to_string(),
        "-p",
        "5201",
        "-J",
        "-i",
        "1",
        "-P",
        &n.to_string(),
        "-t",
        &seconds.to_string(),
    ]);
    let watch = watch(link)?;
    let start = unix_now();
    let out = proc::run(c, Duration::from_secs(seconds + 60), dir)?;
    let end = unix_now();
    let (ab, _) = watch.finish();
    drop(server);
    let mut row = Row {
        key: "iperf3".into(),
        label: format!("iperf3 -P {n} (network ceiling)"),
        rtt_ms: rtt,
        streams: n,
        ..Row::default()
    };
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    let (received, _) = crate::peers::iperf3_received(&v);
    row.payload_bytes = received;
    if received == 0 {
        row.error = out.describe();
    }
    // Per-stream series from the intervals.
    let mut series: Vec<Vec<(f64, f64)>> = vec![Vec::new(); n];
    if let Some(iv) = v["intervals"].as_array() {
        for i in iv {
            if let Some(ss) = i["streams"].as_array() {
                for (k, s) in ss.iter().enumerate().take(n) {
                    let t = (s["start"].as_f64().unwrap_or(0.0) + s["end"].as_f64().unwrap_or(0.0))
                        / 2.0;
                    series[k].push((t, s["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6));
                }
            }
        }
    }
    if let Some(ss) = v["end"]["streams"].as_array() {
        row.stream_mbit_s = ss
            .iter()
            .map(|s| s["receiver"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6)
            .collect();
        row.jain = Some(crate::r1::jain(&row.stream_mbit_s));
    }
    row.series = series;
    row.note = format!("{seconds} s of sending; the sender's bytes (the receiver's count is the same up to the last window)");
    // iperf3 sends for a fixed time: the transfer is the client's run, start-up included.
    link_figures(&mut row, &ab, start, end, rate_bps, None);
    Ok(row)
}

/// GridFTP: `globus-url-copy -p N` of a file of the volume's size from site A to site B's
/// /dev/null (a sparse file on tmpfs: reading it costs nothing).
fn gridftp_row(
    link: &Link,
    dir: &Path,
    rate_bps: u64,
    rtt: u64,
    n: usize,
    bytes: u64,
    timeout: Duration,
) -> Result<Row> {
    let (a, b) = (&link.a[0], &link.b[0]);
    let src = dir.join("gridftp-src");
    std::fs::File::create(&src)?.set_len(bytes)?;
    let mut s = in_ns(&b.ns, "globus-gridftp-server");
    s.args([
        "-aa",
        "-anonymous-user",
        "nobody",
        "-p",
        &GRIDFTP_PORT.to_string(),
        "-debug",
        "-d",
        "error",
    ])
    .args([
        "-control-interface",
        &b.addr.to_string(),
        "-data-interface",
        &b.addr.to_string(),
    ]);
    // Globus looks its own host name up unless told; the namespaces have no resolver.
    s.env("GLOBUS_HOSTNAME", b.addr.to_string());
    let mut server = Proc::spawn(s, "globus-gridftp-server", &dir.join("gridftp-server.log"))?;
    proc::wait_listen(&b.ns, GRIDFTP_PORT, &mut server)?;
    // Each stream's TCP buffer: twice its share of the path's BDP.
    let bdp = rate_bps as f64 / 8.0 * rtt as f64 / 1e3;
    let tcp_bs = ((2.0 * bdp / n as f64) as u64).max(1 << 20);
    let mut c = in_ns(&a.ns, "globus-url-copy");
    c.env("GLOBUS_HOSTNAME", a.addr.to_string());
    c.args(["-p", &n.to_string(), "-tcp-bs", &tcp_bs.to_string()])
        .arg(format!("file://{}", src.display()))
        .arg(format!("ftp://{}:{GRIDFTP_PORT}/dev/null", b.addr));
    let watch = watch(link)?;
    let start = unix_now();
    let out = proc::run(c, timeout, dir)?;
    let end = unix_now();
    let (ab, _) = watch.finish();
    drop(server);
    let _ = std::fs::remove_file(&src);
    let mut row = Row {
        key: "gridftp".into(),
        label: format!("GridFTP globus-url-copy -p {n}"),
        rtt_ms: rtt,
        streams: n,
        payload_bytes: if out.ok() { bytes } else { 0 },
        note: format!("-tcp-bs {tcp_bs} (twice each stream's share of the BDP), mode E"),
        ..Row::default()
    };
    if !out.ok() {
        row.error = out.describe();
    }
    link_figures(&mut row, &ab, start, end, rate_bps, None);
    Ok(row)
}

/// `rsv sync promote --force VOLUME`: makes a replica that the sync rows left behind the
/// primary, writable to applications (a volume with no role yet is left as it is).
fn promote(link: &Link, key_file: &Path, volume: &str, dir: &Path) -> Result<()> {
    let a = &link.a[0];
    let mut cmd = in_ns(&a.ns, rsv_bin());
    cmd.args(["sync", "promote", "--force", "--json", "--key-file"])
        .arg(key_file)
        .arg(volume);
    let out = proc::run(cmd, Duration::from_secs(60), dir)?;
    if !out.ok() {
        return Err(anyhow!("rsv sync promote {volume}: {}", out.stderr.trim()));
    }
    Ok(())
}

/// `qemu-img convert` from site A's file server to site B's, iSCSI to iSCSI, stopped after
/// `timeout` if it has not finished (then its payload is estimated from the wire).
fn qemu_row(
    link: &Link,
    dir: &Path,
    rate_bps: u64,
    rtt: u64,
    bytes: u64,
    timeout: Duration,
) -> Result<Row> {
    let (a, b) = (&link.a[0], &link.b[0]);
    let mut c = in_ns(&a.ns, "qemu-img");
    c.args(["convert", "-n", "-m", "16", "-W", "-O", "raw"])
        .arg(format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", a.addr))
        .arg(format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", b.addr));
    let watch = watch(link)?;
    let start = unix_now();
    let out = proc::run(c, timeout, dir)?;
    let end = unix_now();
    let (ab, _) = watch.finish();
    let mut row = Row {
        key: "qemu-img".into(),
        label: "qemu-img convert iSCSI to iSCSI (file server to file server)".into(),
        rtt_ms: rtt,
        streams: 1,
        ..Row::default()
    };
    let wire = busy::bytes_at(&ab, end).unwrap_or(0.0) - busy::bytes_at(&ab, start).unwrap_or(0.0);
    if out.ok() {
        row.payload_bytes = bytes;
    } else if out.timed_out {
        row.payload_bytes = (wire * 1448.0 / 1500.0) as u64;
        row.note = format!(
            "stopped after {:.0} s, unfinished: payload estimated from the wire bytes (x 1448/1500)",
            timeout.as_secs_f64()
        );
    } else {
        row.error = out.describe();
    }
    link_figures(&mut row, &ab, start, end, rate_bps, None);
    Ok(row)
}

/// The highest candidate rate at which `iperf3 -P N` keeps 95 % on the wire at 20 ms.
fn calibrate(link: &Link, p: &Params, dir: &Path, n: usize) -> Result<(u64, Vec<(u64, f64)>)> {
    let mut seen = Vec::new();
    let secs = if p.link_seconds < 30 { 3 } else { 8 };
    for &rate in &p.candidate_rates {
        check_interrupt()?;
        link.set(&[
            "--rtt".into(),
            "20ms".into(),
            "--rate".into(),
            format!("{rate}bit"),
        ])?;
        let row = iperf3_row(link, dir, rate, 20, n, secs)?;
        let held = row.wire_pct / 100.0;
        eprintln!(
            "r2: calibration: {} Mbit/s -> {:.1} % on the wire",
            rate / 1_000_000,
            row.wire_pct
        );
        seen.push((rate, held));
        if held >= 0.95 {
            return Ok((rate, seen));
        }
    }
    let last = *p
        .candidate_rates
        .last()
        .ok_or_else(|| anyhow!("no candidate rates"))?;
    Ok((last, seen))
}

/// Brings up the emulated WAN with `n` disk servers plus an initiator on each site, and
/// TCP buffers that hold the path's BDP for every tool: the network's ceiling must not be
/// a host's. The guard keeps the host-wide socket buffer maxima raised (SO_SNDBUF and
/// SO_RCVBUF, e.g. GridFTP's -tcp-bs, are capped by them) until it is dropped.
pub(crate) fn wan_up(
    name: &str,
    rtt_ms: u64,
    rate_bps: u64,
    n: usize,
) -> Result<(Link, HostSysctl)> {
    let link = Link::up(
        name,
        &[
            "--rtt".into(),
            format!("{rtt_ms}ms"),
            "--rate".into(),
            format!("{rate_bps}bit"),
            "--hosts-b".into(),
            (n + 1).to_string(),
        ],
        (n + 1) as u32,
    )?;
    if link.a.len() < n + 1 || link.b.len() < n + 1 {
        return Err(anyhow!(
            "rsv-lab wan up gave {} + {} hosts, not {} each",
            link.a.len(),
            link.b.len(),
            n + 1
        ));
    }
    let mut tcp = crate::r0::linux_default_tcp();
    for (k, v) in &mut tcp {
        if k.ends_with("tcp_rmem") {
            *v = "4096 131072 268435456".into();
        } else if k.ends_with("tcp_wmem") {
            *v = "4096 16384 268435456".into();
        }
    }
    for ns in link.all_ns() {
        sysctl(ns, &tcp).with_context(|| format!("sysctls in {ns}"))?;
    }
    let buffers = HostSysctl::raise(&[
        ("net.core.rmem_max", 268_435_456),
        ("net.core.wmem_max", 268_435_456),
    ])?;
    Ok((link, buffers))
}

pub fn run(p: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    let environment = crate::env::collect();
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let n = p.disk_servers;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "r2")?;
    let dir = &scratch.0;
    let key = crate::sites::control_key(dir)?;
    let (link, _buffers) = wan_up("lr2", 20, p.candidate_rates[0], n)?;
    let _hosts = NetnsHosts::write(&link)?;
    // The volume's size from the largest candidate: sized again below once the rate is known.
    let (rate_bps, calibration) = match p.link_rate {
        Some(r) => (r, Vec::new()),
        None => calibrate(&link, &p, dir, n)?,
    };
    let mut volume = (payload_capacity(rate_bps) * p.link_seconds as f64) as u64;
    // Both sites' stores (and the one-stream LUNs) live in memory: leave room for the rest.
    let room = mem_available().saturating_sub(6 << 30);
    // Each site holds the volume and the one-stream row's LUN.
    let per_volume = 2.0 * (1.0 + p.one_stream_share);
    let fits = (room as f64 / per_volume) as u64;
    if volume > fits {
        let capped = fits;
        eprintln!(
            "r2: the volume would be {} MiB, more than memory holds for both sites; {} MiB: {:.0} s of link time instead of {}",
            volume >> 20,
            capped >> 20,
            capped as f64 / payload_capacity(rate_bps),
            p.link_seconds
        );
        volume = capped;
    }
    let member = (volume / n as u64 / (1 << 20)).max(1) << 20;
    let volume = member * n as u64;
    let one = ((volume as f64 * p.one_stream_share) as u64 / (1 << 20)).max(1) << 20;
    eprintln!(
        "r2: bottleneck {} Mbit/s; volume {} MiB over {n} disk servers per site; one-stream LUN {} MiB",
        rate_bps / 1_000_000,
        volume >> 20,
        one >> 20
    );
    let layout = |fill| Layout {
        member,
        one: Some(one),
        fill,
        disk_lun_options: "",
    };
    let site_a = Site::start(&link.a, "a", &key, dir, &layout(true))?;
    let site_b = Site::start(&link.b, "b", &key, dir, &layout(false))?;
    let src = format!("{}:{CONTROL_PORT}/{IQN}/0", link.a[0].addr);
    let dst = format!("{}:{CONTROL_PORT}/{IQN}/0", link.b[0].addr);
    let src_one = format!("{}:{CONTROL_PORT}/{IQN}/1", link.a[1].addr);
    let dst_one = format!("{}:{CONTROL_PORT}/{IQN}/1", link.b[1].addr);
    let rate_arg = format!("{rate_bps}bit");
    let mut rows = Vec::new();
    for &rtt in &p.rtt_ms {
        link.set(&[
            "--rtt".into(),
            format!("{rtt}ms"),
            "--rate".into(),
            rate_arg.clone(),
        ])?;
        let timeout = Duration::from_secs_f64(p.link_seconds as f64 * (p.overtime + 1.0) + 60.0);
        let one_stream: Vec<String> = vec![
            "--pacing".into(),
            "unpaced".into(),
            "--session".into(),
            "connections=1".into(),
        ];
        let plans: Vec<SyncPlan> = vec![
            (
                "one",
                "one stream (1 TCP connection, unpaced)".into(),
                (&src_one, &dst_one),
                one_stream,
            ),
            (
                "unpaced",
                format!("{n} streams, unpaced (1 connection each)"),
                (&src, &dst),
                vec![
                    "--pacing".into(),
                    "unpaced".into(),
                    "--session".into(),
                    "connections=1".into(),
                ],
            ),
            (
                "static",
                format!("{n} streams paced to 1/{n} (1 connection each)"),
                (&src, &dst),
                vec![
                    "--pacing".into(),
                    "static".into(),
                    "--rate".into(),
                    rate_arg.clone(),
                    "--session".into(),
                    "connections=1".into(),
                ],
            ),
            (
                "reservoir",
                "Reservoir default (cooperative, rate found)".into(),
                (&src, &dst),
                vec![],
            ),
            (
                "reservoir-rate",
                "Reservoir cooperative, --rate given".into(),
                (&src, &dst),
                vec!["--rate".into(), rate_arg.clone()],
            ),
        ];
        let wanted = |k: &str| p.rows.is_empty() || p.rows.iter().any(|r| r == k);
        let mut measure = |rep: u32, f: &mut dyn FnMut() -> Result<Row>| -> Result<()> {
            check_interrupt()?;
            let mark = proc::CostMark::take(&link);
            let mut row = f()?;
            row.cost = mark.cost(&link);
            row.repeat = rep;
            report(&row);
            rows.push(row);
            Ok(())
        };
        // The study's methods once, then Reservoir's rows `--repeat` times, interleaved
        // (every one once, then again), so that a slow spell of the machine does not fall
        // on one row's repetitions only.
        let repeat = p.repeat.max(1);
        let (ours, once): (Vec<&SyncPlan>, Vec<&SyncPlan>) =
            plans.iter().partition(|x| REPEATED.contains(&x.0));
        let mut sync = |rep: u32, plans: &[&SyncPlan]| -> Result<()> {
            for (key_, label, vol, args) in plans.iter().copied() {
                if wanted(key_) {
                    measure(rep, &mut || {
                        sync_row(
                            &link, &key, dir, rate_bps, rtt, key_, label, *vol, args, timeout,
                        )
                    })?;
                }
            }
            Ok(())
        };
        sync(1, &once)?;
        for rep in 1..=repeat {
            if repeat > 1 {
                eprintln!("r2: {rtt} ms, Reservoir's rows, repetition {rep} of {repeat}");
            }
            sync(rep, &ours)?;
        }
        if wanted("iperf3") {
            measure(1, &mut || {
                iperf3_row(&link, dir, rate_bps, rtt, n, p.link_seconds)
            })?;
        }
        if wanted("gridftp") {
            measure(1, &mut || {
                gridftp_row(&link, dir, rate_bps, rtt, n, volume, timeout)
            })?;
        }
        if wanted("qemu-img") {
            // The syncs above left site B a read-only replica of A (`rsv sync`'s roles);
            // qemu-img writes to it as an application would, so B is promoted first.
            promote(&link, &key, &dst, dir)?;
            let cap = Duration::from_secs_f64(p.link_seconds as f64 * p.overtime);
            measure(1, &mut || qemu_row(&link, dir, rate_bps, rtt, volume, cap))?;
        }
    }
    drop(site_a);
    drop(site_b);
    drop(link);
    let summary = summarize(&rows);
    for s in summary.iter().filter(|s| s.runs > 1) {
        let f = |x: &Option<Spread>, d: usize, u: &str| x.map_or("–".into(), |x| x.show(d, u));
        eprintln!(
            "r2: {:>3} ms {:<16} {} runs ({} failed): whole {}, from full {}, full after {}",
            s.rtt_ms,
            s.key,
            s.runs,
            s.failed,
            f(&s.whole_pct, 1, " %"),
            f(&s.from_full_pct, 1, " %"),
            f(&s.time_to_full_s, 1, " s")
        );
    }
    let results = Results {
        run: crate::results::Run::new("r2", quick, command, p),
        rate_bps,
        calibration,
        volume_bytes: volume,
        environment,
        rows,
        summary,
    };
    write_outputs(&results, out)?;
    Ok(results)
}

/// `/etc/netns/NS/hosts` for the namespaces GridFTP runs in, naming every host of the
/// link: Globus looks its own address up, and the namespaces reach no DNS server
/// (`ip netns exec` mounts the file over /etc/hosts). Removed when dropped.
struct NetnsHosts(Vec<PathBuf>);

impl NetnsHosts {
    fn write(link: &Link) -> Result<NetnsHosts> {
        let mut text = String::from("127.0.0.1 localhost\n");
        for h in link.a.iter().chain(&link.b) {
            text += &format!("{} {}\n", h.addr, h.ns);
        }
        let mut dirs = Vec::new();
        for h in [&link.a[0], &link.b[0]] {
            let dir = PathBuf::from("/etc/netns").join(&h.ns);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("hosts"), &text)?;
            dirs.push(dir);
        }
        Ok(NetnsHosts(dirs))
    }
}

impl Drop for NetnsHosts {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Host-wide sysctls raised for the run and put back as they were when it ends.
pub(crate) struct HostSysctl(Vec<(String, String)>);

impl HostSysctl {
    pub(crate) fn raise(settings: &[(&str, u64)]) -> Result<HostSysctl> {
        let mut old = Vec::new();
        for (k, want) in settings {
            let path = format!("/proc/sys/{}", k.replace('.', "/"));
            let was = std::fs::read_to_string(&path)?.trim().to_owned();
            if was.parse::<u64>().map_or(true, |w| w < *want) {
                std::fs::write(&path, want.to_string()).with_context(|| format!("raising {k}"))?;
                old.push((path, was));
            }
        }
        Ok(HostSysctl(old))
    }
}

impl Drop for HostSysctl {
    fn drop(&mut self) {
        for (path, was) in &self.0 {
            let _ = std::fs::write(path, was);
        }
    }
}

fn report(r: &Row) {
    let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.1}"));
    eprintln!(
        "r2: {:>3} ms {:<48} {:>7.1} Mbit/s  whole {:>5.1} %  from full {:>5} %  full after {:>5} s  spread {:>5} %  Jain {}{}{}",
        r.rtt_ms,
        r.label,
        r.payload_mbit_s,
        r.whole_pct,
        f(r.from_full_pct),
        f(r.time_to_full_s),
        f(r.finish_spread_pct),
        r.jain.map_or("-".into(), |j| format!("{j:.3}")),
        cost_text(r),
        if r.error.is_empty() { String::new() } else { format!("  ERROR {}", proc::tail(&r.error, 300)) }
    );
}

/// CPU, relay, drops and retransmissions of a row, for the log line.
fn cost_text(r: &Row) -> String {
    let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.0}"));
    let mut t = format!(
        "  cpu {} %  relay {} %  drops {} (host {})",
        f(r.cost.cpu_busy_pct),
        f(r.cost.relay_cpu_pct),
        r.cost.queue_drops,
        r.cost.host_drops.map_or("-".into(), |d| d.to_string())
    );
    if !r.retransmits.is_empty() {
        t += &format!("  retrans {:?}", r.retransmits);
    }
    t
}

pub fn write_outputs(r: &Results, out: &Path) -> Result<()> {
    crate::results::save(out, "r2.json", r)?;
    let mut csv = String::from(
        "scenario,rtt_ms,row,label,repeat,streams,payload_bytes,seconds,payload_mbit_s,whole_pct,\
         from_full_pct,time_to_full_s,wire_pct,finish_spread_pct,jain,error\n",
    );
    let o = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.3}"));
    for row in &r.rows {
        csv += &format!(
            "r2,{},{},{},{},{},{},{:.3},{:.3},{:.3},{},{},{:.3},{},{},{}\n",
            row.rtt_ms,
            row.key,
            row.label.replace(',', ";"),
            row.repeat.max(1),
            row.streams,
            row.payload_bytes,
            row.seconds,
            row.payload_mbit_s,
            row.whole_pct,
            o(row.from_full_pct),
            o(row.time_to_full_s),
            row.wire_pct,
            o(row.finish_spread_pct),
            o(row.jain),
            row.error.replace(['\n', ','], " ")
        );
    }
    std::fs::write(out.join("r2.csv"), csv)?;
    for row in &r.rows {
        if row.series.is_empty() || !shown(&r.summary, row) {
            continue;
        }
        let path = figure(out, row);
        let title = format!(
            "R2 at {} ms: {} ({} Mbit/s bottleneck)",
            row.rtt_ms,
            row.label,
            r.rate_bps / 1_000_000
        );
        let mut series: Vec<(String, Vec<(f64, f64)>)> = row
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("stream {}", i + 1), s.clone()))
            .collect();
        series.push(("link (wire)".into(), row.link_series.clone()));
        crate::plot::time_chart(&path, &title, &series, r.rate_bps as f64 / 1e6)
            .with_context(|| format!("plotting {}", path.display()))?;
    }
    Ok(())
}

/// The figure of a row: `r2-RTT-KEY.png`.
pub fn figure(out: &Path, row: &Row) -> PathBuf {
    out.join(format!("r2-{}ms-{}.png", row.rtt_ms, row.key))
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "r2.json")
}

/// Writes `docs/lab-r2.md` from `r2.json` under `results` (figures linked relative to the
/// document).
pub fn write_doc(results: &Path, doc: &Path) -> Result<()> {
    let v = load(results)?;
    let rate = v.rate_bps;
    let p = &v.run.params;
    let n = p.disk_servers;
    let mut d = v.run.doc_head(
        "Lab R2: Data Reservoir — striped volumes copied disk server to disk server",
        "",
    );
    d += &format!(
        "- Two sites of {n} disk servers each, plus a file server per site striping over them (1 MiB units); every disk server is its own network namespace host behind the site's bridge; one emulated bottleneck between the sites.\n"
    );
    d += &if v.calibration.is_empty() {
        format!(
            "- Bottleneck: **{} Mbit/s**, given (`--link-rate`), not calibrated in this run.\n",
            rate / 1_000_000
        )
    } else {
        format!(
            "- Bottleneck: **{} Mbit/s**, the highest candidate at which `iperf3 -P {n}` kept ≥ 95 % on the wire at 20 ms with every disk server running (calibration: {}).\n",
            rate / 1_000_000,
            v.calibration
                .iter()
                .map(|(bps, share)| format!("{} Mbit/s → {:.1} %", bps / 1_000_000, share * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    d += &format!(
        "- Volume: {} MiB of random data ({} s of the link's payload capacity), RAM-backed files on both sides; the one-stream row copies a LUN of {:.0} % of that size.\n",
        v.volume_bytes >> 20,
        p.link_seconds,
        p.one_stream_share * 100.0
    );
    d += &crate::doc::machine(&v.environment, 400)?;
    d += "Columns: payload rate over the whole transfer; payload share of the bottleneck's payload capacity (rate × 1448/1500) over the whole transfer, start-up included, and from the moment the link first ran at ≥ 90 % of its rate to the end; seconds until then; spread of the streams' finish times ((last − first)/last) and Jain's index of their rates; what the row cost the machine: both cores' busy share, the link relay's CPU (% of one core), and packets dropped by the emulated bottleneck's queue and, before the relay read them, by the TUN device (host drops: the machine's losses, not the path's). A row near 100 % CPU, or with host drops, measured the machine as much as the method.\n\n";
    crate::doc::repeat_note(
        &mut d,
        p.repeat,
        "Reservoir's rows (the study's methods and the peers once a point)",
    );
    if p.repeat > 1 {
        d += "Here the medians are the whole %, from full % and full after columns; the other columns, and the figure, are the repetition with the median whole % (named in the note).\n\n";
    }
    let mut rtts: Vec<u64> = v.rows.iter().map(|r| r.rtt_ms).collect();
    rtts.dedup();
    let f = |x: Option<f64>, digits: usize| x.map_or("–".to_owned(), |v| format!("{v:.digits$}"));
    for rtt in rtts {
        let rows = || v.rows.iter().filter(move |r| r.rtt_ms == rtt);
        d += &format!("## RTT {rtt} ms\n\n");
        d += "| row | streams | payload Mbit/s | whole % | from full % | full after s | finish spread % | Jain | CPU busy % | relay CPU % | drops: queue / host | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        for row in rows().filter(|r| shown(&v.summary, r)) {
            // A repeated row: the median and range of its repetitions where they differ
            // most, the median repetition's figures in the other columns.
            let sum = v
                .summary
                .iter()
                .find(|s| s.rtt_ms == rtt && s.key == row.key && s.runs > 1);
            let spread = |x: Option<Spread>, own: String| match (sum, x) {
                (Some(_), Some(sp)) => sp.show(1, ""),
                _ => own,
            };
            let mut note = if row.error.is_empty() {
                row.note.replace('|', "/")
            } else {
                format!(
                    "error: {}",
                    row.error.lines().next().unwrap_or("").replace('|', "/")
                )
            };
            if let Some(sm) = sum {
                let runs = format!(
                    "median of {} runs (repetition {} shown){}",
                    sm.runs - sm.failed,
                    sm.median_repeat.unwrap_or(0),
                    if sm.failed > 0 {
                        format!(", {} failed", sm.failed)
                    } else {
                        String::new()
                    }
                );
                note = if note.is_empty() {
                    runs
                } else {
                    format!("{runs}; {note}")
                };
            }
            let cost = &row.cost;
            d += &format!(
                "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |\n",
                row.label,
                row.streams,
                row.payload_mbit_s,
                spread(
                    sum.and_then(|s| s.whole_pct),
                    format!("{:.1}", row.whole_pct)
                ),
                spread(sum.and_then(|s| s.from_full_pct), f(row.from_full_pct, 1)),
                spread(sum.and_then(|s| s.time_to_full_s), f(row.time_to_full_s, 1)),
                f(row.finish_spread_pct, 1),
                f(row.jain, 3),
                f(cost.cpu_busy_pct, 0),
                f(cost.relay_cpu_pct, 0),
                cost.queue_drops,
                cost.host_drops.map_or("–".to_owned(), |d| d.to_string()),
                note
            );
        }
        d += "\n";
        for row in rows().filter(|r| shown(&v.summary, r)) {
            let file = format!("r2-{rtt}ms-{}.png", row.key);
            if results.join(&file).exists() {
                d += &format!(
                    "![{}]({})\n",
                    row.label,
                    crate::doc::link(doc, results, &file)
                );
            }
        }
        d += "\n";
    }
    std::fs::write(doc, d)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, rtt_ms: u64, repeat: u32, whole_pct: f64, error: &str) -> Row {
        Row {
            key: key.into(),
            rtt_ms,
            repeat,
            whole_pct,
            from_full_pct: Some(whole_pct + 5.0),
            error: error.into(),
            ..Row::default()
        }
    }

    #[test]
    fn repeated_rows_give_their_median_repetition_and_range() {
        let rows = vec![
            row("one", 350, 1, 60.0, ""),
            row("reservoir", 350, 1, 91.0, ""),
            row("reservoir-rate", 350, 1, 93.0, ""),
            row("reservoir", 350, 2, 79.0, ""),
            row("reservoir-rate", 350, 2, 0.0, "rsv sync did not finish"),
            row("reservoir", 350, 3, 86.0, ""),
            row("reservoir-rate", 350, 3, 95.0, ""),
            row("reservoir", 200, 1, 97.0, ""),
        ];
        let s = summarize(&rows);
        // Only Reservoir's rows, per RTT and key, in the order they first appear.
        let keys: Vec<(u64, &str, usize)> = s
            .iter()
            .map(|x| (x.rtt_ms, x.key.as_str(), x.runs))
            .collect();
        assert_eq!(
            keys,
            [
                (350, "reservoir", 3),
                (350, "reservoir-rate", 3),
                (200, "reservoir", 1)
            ]
        );
        let w = s[0].whole_pct.unwrap();
        assert_eq!((w.n, w.median, w.min, w.max), (3, 86.0, 79.0, 91.0));
        assert_eq!(s[0].median_repeat, Some(3));
        assert_eq!(s[0].from_full_pct.unwrap().median, 91.0);
        // A failed repetition is counted and left out; of two, the lower middle one.
        assert_eq!((s[1].runs, s[1].failed), (3, 1));
        assert_eq!(s[1].whole_pct.unwrap().median, 94.0);
        assert_eq!(s[1].median_repeat, Some(1));
        // The document and the figures show every row run once and the median repetitions.
        let shown_rows: Vec<(u64, &str, u32)> = rows
            .iter()
            .filter(|r| shown(&s, r))
            .map(|r| (r.rtt_ms, r.key.as_str(), r.repeat))
            .collect();
        assert_eq!(
            shown_rows,
            [
                (350, "one", 1),
                (350, "reservoir-rate", 1),
                (350, "reservoir", 3),
                (200, "reservoir", 1)
            ]
        );
    }
}
