//! R0: sequential backup writes (and reads) over 100 Mbit/s, 100 ms RTT with random loss;
//! the study's "before" and "tuned (2b)" settings, Reservoir's defaults, qemu-img (libiscsi)
//! into tgt and into Reservoir, and iperf3 single streams as the network's own ceiling.

use crate::busy;
use crate::env::Environment;
use crate::peers::{rsv_target, Tgt, ISCSI_PORT};
use crate::proc::{self, check_interrupt, in_ns, rsv_bin, sysctl, Link, Proc};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

pub const IQN: &str = "iqn.2026-11.org.reservoir:lab";
const LUN_SIZE: &str = "1GiB";

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    pub rate: String,
    pub rtt: String,
    pub loss_pct: Vec<f64>,
    /// Each point moves data for at most this long (seconds); throughput is bytes/s.
    pub seconds: u64,
    /// The largest image qemu-img copies per point (it is sized to what the link can carry
    /// in `seconds`, from the iperf3 CUBIC reference at the same point).
    pub qemu_max_bytes: u64,
    pub reads: bool,
    /// Also run the Reservoir rows (default and `--rate`) with this congestion control at
    /// both ends (`rsv`: Reservoir's own, docs/congestion.md).
    pub congestion: Option<String>,
    /// Only the iperf3 references and the Reservoir rows (no study configurations, no
    /// qemu-img, no tgt).
    #[serde(default)]
    pub reservoir_only: bool,
    /// Each iSCSI configuration's rows run this many times at each point, interleaved
    /// (all configurations once, then again); the peers (iperf3, qemu-img, tgt) once.
    /// Results from before it had none: 0, read as 1.
    #[serde(default)]
    pub repeat: u32,
    /// Only these configurations (by key: before, tuned, reservoir, reservoir-rate, and
    /// with a congestion control CC reservoir-CC, reservoir-rate-CC); empty: all.
    #[serde(default)]
    pub rows: Vec<String>,
}

impl Params {
    pub fn new(quick: bool) -> Params {
        Params {
            rate: "100mbit".into(),
            rtt: "100ms".into(),
            loss_pct: if quick {
                vec![0.1]
            } else {
                vec![0.001, 0.01, 0.1, 1.0, 5.0]
            },
            // Long enough that BBR's start-up (about a second at 100 ms) is a small part.
            seconds: if quick { 3 } else { 30 },
            qemu_max_bytes: if quick { 16 << 20 } else { 256 << 20 },
            // Reads double the time; the quick version leaves them out.
            reads: !quick,
            congestion: None,
            reservoir_only: false,
            repeat: 1,
            rows: Vec::new(),
        }
    }
}

/// `rsv-lab run r0`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Repeated,
    /// Only these loss rates, in percent (e.g. 1,5).
    #[arg(long, value_delimiter = ',')]
    pub loss: Vec<f64>,
    /// Seconds per measurement instead of 30 (--quick 3).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Also run Reservoir's rows with this congestion control at both ends (`rsv`:
    /// Reservoir's own, loaded by the target and the initiator).
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// Only the iperf3 references and Reservoir's rows (no study configurations, qemu-img
    /// or tgt).
    #[arg(long)]
    pub reservoir_only: bool,
    /// Only these configurations (before, tuned, reservoir, reservoir-rate, with
    /// --congestion CC reservoir-CC, reservoir-rate-CC).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
}

impl Args {
    pub fn params(&self) -> Params {
        let mut p = Params::new(self.flags.common.quick);
        p.loss_pct = crate::cli::given_or(&self.loss, p.loss_pct);
        p.seconds = self.seconds.unwrap_or(p.seconds);
        p.congestion = self.congestion.clone();
        p.reservoir_only = self.reservoir_only;
        p.repeat = self.flags.repeat.repeat;
        p.rows = self.rows.clone();
        p
    }
}

/// One iSCSI configuration: TCP settings of both sites, the target's session offer and the
/// initiator's flags.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct IscsiConfig {
    pub key: String,
    pub label: String,
    pub sysctl: Vec<(String, String)>,
    pub target_session: String,
    pub connections: Option<u16>,
    pub queue_depth: Option<usize>,
    pub io_size: String,
    pub initiator_opts: Vec<String>,
    /// The initiator's path cache (`RSV_PATH_CACHE`); `None`: none, as every row but the
    /// RTT sweep's remembered-rate row.
    pub path_cache: Option<std::path::PathBuf>,
}

fn tcp(sack: bool, ts: bool, wscale: bool, wmem: &str, rmem: &str) -> Vec<(String, String)> {
    let b = |x: bool| if x { "1" } else { "0" }.to_owned();
    vec![
        ("net.ipv4.tcp_congestion_control".into(), "cubic".into()),
        ("net.ipv4.tcp_sack".into(), b(sack)),
        ("net.ipv4.tcp_timestamps".into(), b(ts)),
        ("net.ipv4.tcp_window_scaling".into(), b(wscale)),
        ("net.ipv4.tcp_wmem".into(), wmem.into()),
        ("net.ipv4.tcp_rmem".into(), rmem.into()),
    ]
}

/// What a fresh namespace on this kernel starts with, but CUBIC (the kernel default here
/// is BBR; the study and most installations use CUBIC).
pub fn linux_default_tcp() -> Vec<(String, String)> {
    tcp(
        true,
        true,
        true,
        "4096 16384 4194304",
        "4096 131072 33554432",
    )
}

/// The configurations of a point: the study's, Reservoir's, and Reservoir's again with
/// congestion control `cc` at both ends when given.
pub fn configs(cc: Option<&str>) -> Vec<IscsiConfig> {
    let mut v = base_configs();
    if let Some(cc) = cc {
        for base in ["reservoir", "reservoir-rate"] {
            let Some(c) = v.iter().find(|c| c.key == base).cloned() else {
                continue;
            };
            let mut c = c;
            c.key = format!("{base}-{cc}");
            c.label = format!("{} congestion={cc}", c.label);
            c.target_session = format!("{}congestion = \"{cc}\"\n", c.target_session);
            c.initiator_opts.push(format!("congestion={cc}"));
            v.push(c);
        }
    }
    v
}

fn base_configs() -> Vec<IscsiConfig> {
    vec![
        IscsiConfig {
            key: "before".into(),
            label: "R0 before".into(),
            // No window scaling: a 64 KB window whatever the buffers say, as in the study.
            sysctl: tcp(false, false, false, "4096 131072 131072", "4096 174080 174080"),
            target_session: "max_connections = 1\ninitial_r2t = true\nfirst_burst_length = 65536\n\
                             max_burst_length = 262144\nsend_buffer = 131072\nrecv_buffer = 174080\n\
                             congestion = \"cubic\"\n"
                .into(),
            connections: Some(1),
            queue_depth: Some(1),
            io_size: "256k".into(),
            initiator_opts: vec![
                "initial_r2t=1".into(),
                "first_burst=65536".into(),
                "max_burst=262144".into(),
                "send_buffer=131072".into(),
                "recv_buffer=174080".into(),
                "congestion=cubic".into(),
            ],
            path_cache: None,
        },
        IscsiConfig {
            key: "tuned".into(),
            label: "R0 tuned (2b)".into(),
            // 5 MB / 20 MB as the autotuning ceiling: setsockopt is capped by the host's
            // net.core.[rw]mem_max, the per-namespace tcp_[rw]mem are not.
            sysctl: tcp(true, true, true, "4096 1048576 5242880", "4096 1048576 20971520"),
            target_session: "max_connections = 16\ninitial_r2t = false\nfirst_burst_length = 262144\n\
                             max_burst_length = 262144\ncongestion = \"cubic\"\n"
                .into(),
            connections: Some(16),
            queue_depth: Some(16),
            io_size: "256k".into(),
            initiator_opts: vec![
                "initial_r2t=0".into(),
                "first_burst=262144".into(),
                "max_burst=262144".into(),
                "congestion=cubic".into(),
            ],
            path_cache: None,
        },
        IscsiConfig {
            key: "reservoir".into(),
            label: "Reservoir default".into(),
            sysctl: linux_default_tcp(),
            target_session: String::new(),
            connections: None,
            queue_depth: None,
            io_size: "1m".into(),
            initiator_opts: Vec::new(),
            path_cache: None,
        },
        IscsiConfig {
            key: "reservoir-rate".into(),
            label: "Reservoir --rate 100mbit".into(),
            sysctl: linux_default_tcp(),
            target_session: String::new(),
            connections: None,
            queue_depth: None,
            io_size: "1m".into(),
            initiator_opts: vec!["rate=100mbit".into()],
            path_cache: None,
        },
    ]
}

pub(crate) fn target_toml(session: &str) -> String {
    format!(
        "[session]\n{session}\n[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\n\
         backstore = \"ram\"\nsize = \"{LUN_SIZE}\"\n"
    )
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Row {
    pub loss_pct: f64,
    /// "write", "read" or "network".
    pub direction: String,
    pub config: String,
    pub tool: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mbit_per_s: f64,
    /// The transfer ran to its planned end (a fixed size, or the time for a timed run).
    pub complete: bool,
    pub error: String,
    /// Which repetition of the row this is (1 to `--repeat`).
    #[serde(default)]
    pub repeat: u32,
    /// For `rsv bench` rows: what the session used and what its sockets saw (JSON only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionSummary>,
    /// For `rsv bench` rows: how busy the bottleneck was over the measured time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<busy::LinkUse>,
}

/// What `rsv bench` reported about its session, so that a figure can be explained.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SessionSummary {
    pub connections: u64,
    pub queue_depth: u64,
    /// The queue depth at the end, after auto-tuning grew or cut it.
    #[serde(default)]
    pub queue_depth_end: u64,
    pub congestion: String,
    /// Per-connection pacing, bytes/s; none when the congestion control paces alone.
    pub pacing_rate: Option<u64>,
    /// TCP retransmissions over the session's connections (the last TCP_INFO sample).
    pub retransmits: u64,
    pub min_rtt_ms: f64,
    /// Commands that finished after the issuing window and were counted.
    pub drained_after_window: u64,
    /// Commands that did not finish in the wait after it and were not.
    pub abandoned: u64,
    /// On `rsv`, the initiator's PROBE_RTTs (its sends: the writes), as the session's
    /// group counted them: entered, skipped, deferred, the most at once.
    pub probe_rtt: Option<[u64; 4]>,
}

impl SessionSummary {
    fn from_bench(v: &Value) -> SessionSummary {
        let s = &v["session"];
        SessionSummary {
            connections: v["connections"].as_u64().unwrap_or(0),
            queue_depth: v["queue_depth"].as_u64().unwrap_or(0),
            queue_depth_end: s["queue_depth"].as_u64().unwrap_or(0),
            congestion: s["congestion"].as_str().unwrap_or("").into(),
            pacing_rate: s["tuning"]["pacing_rate"].as_u64(),
            retransmits: s["path"]["retransmits"].as_u64().unwrap_or(0),
            min_rtt_ms: s["path"]["min_rtt_ms"].as_f64().unwrap_or(0.0),
            drained_after_window: v["drained_after_window"].as_u64().unwrap_or(0),
            abandoned: v["abandoned_at_deadline"].as_u64().unwrap_or(0),
            probe_rtt: s["rsv"]["probe_rtt"].as_object().map(|p| {
                let n = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
                [n("probes"), n("skipped"), n("deferred"), n("max_probing")]
            }),
        }
    }
}

impl Row {
    fn new(loss: f64, direction: &str, config: &str, tool: &str) -> Row {
        Row {
            loss_pct: loss,
            direction: direction.into(),
            config: config.into(),
            tool: tool.into(),
            bytes: 0,
            seconds: 0.0,
            mbit_per_s: 0.0,
            complete: false,
            error: String::new(),
            repeat: 1,
            session: None,
            link: None,
        }
    }

    fn measured(mut self, bytes: u64, seconds: f64, complete: bool) -> Row {
        self.bytes = bytes;
        self.seconds = seconds;
        self.mbit_per_s = if seconds > 0.0 {
            bytes as f64 * 8.0 / seconds / 1e6
        } else {
            0.0
        };
        self.complete = complete;
        self
    }

    fn failed(mut self, e: impl std::fmt::Display) -> Row {
        self.error = e.to_string().replace(['\n', ','], " ");
        self
    }

    pub fn ok(&self) -> bool {
        self.error.is_empty() && self.mbit_per_s > 0.0
    }

    /// What follows the figure on the progress line: the error, or the session's shape.
    pub fn note(&self) -> String {
        match &self.session {
            _ if !self.error.is_empty() => format!("  ({})", self.error),
            Some(s) => {
                format!(
                    "  ({} conn, QD {}{}, {}{}, {} retransmits{})",
                    s.connections,
                    s.queue_depth,
                    if s.queue_depth_end != s.queue_depth && s.queue_depth_end > 0 {
                        format!("→{}", s.queue_depth_end)
                    } else {
                        String::new()
                    },
                    s.congestion,
                    s.pacing_rate.map_or(String::new(), |r| format!(
                        " paced {:.1} Mbit/s",
                        r as f64 * 8e-6
                    )),
                    s.retransmits,
                    s.probe_rtt.map_or(String::new(), |[e, sk, d, m]| format!(
                        ", PROBE_RTT {e} entered {sk} skipped {d} deferred, at most {m} at once"
                    ))
                ) + &self.link.as_ref().map_or(String::new(), |u| {
                    format!(
                        "  link busy {:.1} %, {:.1} % of it payload: {:.1} s lost starting (full \
                     after {:.1} s), {:.1} s later, {:.1} s at the end",
                        u.busy_pct,
                        self.bytes as f64 / u.wire_bytes.max(1) as f64 * 100.0,
                        u.lost_start_s,
                        u.start_s,
                        u.lost_later_s,
                        u.lost_end_s.unwrap_or(0.0)
                    )
                })
            }
            None => String::new(),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    pub configs: Vec<IscsiConfig>,
    pub peer_tcp: Vec<(String, String)>,
    pub environment: Environment,
    /// Every run, each repetition its own row.
    pub rows: Vec<Row>,
    /// Each row over its repetitions: median and range.
    #[serde(default)]
    pub summary: Vec<LossSummary>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct LossSummary {
    pub loss_pct: f64,
    #[serde(flatten)]
    pub row: crate::stats::RowSummary,
}

/// The rows' summaries, point by point.
fn summarize(loss_pct: &[f64], rows: &[Row]) -> Vec<LossSummary> {
    let mut out = Vec::new();
    for &loss in loss_pct {
        let at = rows.iter().filter(|r| r.loss_pct == loss);
        out.extend(
            crate::stats::summarize(at)
                .into_iter()
                .map(|row| LossSummary {
                    loss_pct: loss,
                    row,
                }),
        );
    }
    out
}

pub fn run(params: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    let configs = configs(params.congestion.as_deref());
    let keys: Vec<&str> = configs.iter().map(|c| c.key.as_str()).collect();
    if let Some(r) = params.rows.iter().find(|r| !keys.contains(&r.as_str())) {
        anyhow::bail!(
            "r0 has no configuration {r:?}; its configurations: {}",
            keys.join(", ")
        );
    }
    let environment = crate::env::collect();
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "r0")?;
    let dir = &scratch.0;
    let src = dir.join("source.img");
    proc::random_file(&src, params.qemu_max_bytes)?;
    let first_loss = format!("{}%", params.loss_pct[0]);
    let link = Link::up(
        "lr0",
        &[
            "--rtt".into(),
            params.rtt.clone(),
            "--rate".into(),
            params.rate.clone(),
            "--loss".into(),
            first_loss,
        ],
        1,
    )?;
    let mut rows = Vec::new();
    for &loss in &params.loss_pct {
        check_interrupt()?;
        link.set(&["--loss".into(), format!("{loss}%")])?;
        for rep in 1..=params.repeat.max(1) {
            check_interrupt()?;
            eprintln!(
                "r0: loss {loss} %{}",
                if params.repeat > 1 {
                    format!(", repetition {rep} of {}", params.repeat)
                } else {
                    String::new()
                }
            );
            let mut point = run_point(&link, loss, &params, dir, &src, rep)?;
            for r in &mut point {
                r.repeat = rep;
                eprintln!(
                    "  {:<7} {:<22} {:<24} {:>8.2} Mbit/s{}",
                    r.direction,
                    r.config,
                    r.tool,
                    r.mbit_per_s,
                    r.note()
                );
            }
            rows.extend(point);
        }
    }
    drop(link);
    let summary = summarize(&params.loss_pct, &rows);
    if params.repeat > 1 {
        for s in &summary {
            if let Some(m) = &s.row.mbit_per_s {
                eprintln!(
                    "r0: {} % {:<7} {:<40} {} Mbit/s, full after {}",
                    s.loss_pct,
                    s.row.direction,
                    s.row.config,
                    m.show(2, ""),
                    s.row.full_after_s.map_or("—".into(), |f| f.show(1, " s"))
                );
            }
        }
    }
    let results = Results {
        run: crate::results::Run::new("r0", quick, command, params),
        configs,
        peer_tcp: linux_default_tcp(),
        environment,
        rows,
        summary,
    };
    write_outputs(&results, out)?;
    Ok(results)
}

pub(crate) fn set_tcp(link: &Link, settings: &[(String, String)]) -> Result<()> {
    for ns in link.all_ns() {
        sysctl(ns, settings)?;
    }
    Ok(())
}

/// One point's rows; the peers (iperf3, qemu-img, tgt) only in the first repetition.
fn run_point(
    link: &Link,
    loss: f64,
    p: &Params,
    dir: &Path,
    src: &Path,
    rep: u32,
) -> Result<Vec<Row>> {
    let a = &link.a[0];
    let b = &link.b[0];
    let mut rows = Vec::new();
    set_tcp(link, &linux_default_tcp())?;
    let first = rep <= 1;
    let mut cubic_rate = 0.0;
    let peers: &[&str] = if first { &["cubic", "bbr"] } else { &[] };
    for &cc in peers {
        let row = iperf3(link, loss, cc, p.seconds, dir)?;
        if cc == "cubic" && row.ok() {
            cubic_rate = row.mbit_per_s * 1e6 / 8.0;
        }
        rows.push(row);
    }
    // qemu-img's copy of an image sized to what CUBIC carried, into the LUN at `url`.
    let qemu_row = |url: &str, label: &str| {
        let size = qemu_size(cubic_rate, p);
        qemu(&a.ns, src, size, url, loss, label, p.seconds, dir)
    };
    let url = format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", b.addr);
    for cfg in configs(p.congestion.as_deref()) {
        if p.reservoir_only && !cfg.key.starts_with("reservoir") {
            continue;
        }
        if !p.rows.is_empty() && !p.rows.contains(&cfg.key) {
            continue;
        }
        check_interrupt()?;
        set_tcp(link, &cfg.sysctl)?;
        let target = rsv_target(
            &b.ns,
            b.addr,
            &target_toml(&cfg.target_session),
            dir,
            &cfg.key,
        );
        let mut target = match target {
            Ok(t) => t,
            Err(e) => {
                rows.push(
                    Row::new(loss, "write", &cfg.label, "rsv bench").failed(format!("{e:#}")),
                );
                continue;
            }
        };
        let dirs: &[&str] = if p.reads {
            &["write", "read"]
        } else {
            &["write"]
        };
        for rw in dirs {
            rows.push(bench(link, &url, &cfg, rw, loss, p.seconds, dir)?);
        }
        if cfg.key == "reservoir" && !p.reservoir_only && first && p.rows.is_empty() {
            rows.push(qemu_row(&url, "qemu-img → Reservoir")?);
        }
        check_target(&mut target, &mut rows);
    }
    if p.reservoir_only || !first || !p.rows.is_empty() {
        return Ok(rows);
    }
    // tgt, driven by qemu-img (libiscsi) with everyone's defaults.
    set_tcp(link, &linux_default_tcp())?;
    match Tgt::start(
        &b.ns,
        b.addr,
        &dir.join("tgt.img"),
        1 << 30,
        &dir.join("tgtd.log"),
    ) {
        Ok(tgt) => {
            let url = format!("iscsi://{}:{ISCSI_PORT}/{}/1", b.addr, tgt.iqn);
            rows.push(qemu_row(&url, "qemu-img → tgt")?);
            drop(tgt);
        }
        Err(e) => rows.push(
            Row::new(loss, "write", "qemu-img → tgt", "qemu-img convert").failed(format!("{e:#}")),
        ),
    }
    let _ = std::fs::remove_file(dir.join("tgt.img"));
    Ok(rows)
}

/// A target that died during a run makes every row of its runs suspect: say so.
pub(crate) fn check_target(target: &mut Proc, rows: &mut [Row]) {
    if !target.alive() {
        let log = target.log_text();
        if let Some(r) = rows.last_mut() {
            r.error =
                format!("rsv target exited: {}", proc::tail(&log, 200)).replace(['\n', ','], " ");
        }
    }
    target.stop();
}

/// An image as large as the link carried in `seconds` of iperf3 CUBIC (so most points run
/// to completion), within [4 MiB, qemu_max_bytes].
fn qemu_size(cubic_bytes_per_s: f64, p: &Params) -> u64 {
    let want = (cubic_bytes_per_s * p.seconds as f64) as u64;
    let mib = 1u64 << 20;
    (want / mib * mib).clamp(4 * mib, p.qemu_max_bytes)
}

pub(crate) fn iperf3(link: &Link, loss: f64, cc: &str, seconds: u64, dir: &Path) -> Result<Row> {
    let a = &link.a[0];
    let b = &link.b[0];
    let label = format!("iperf3 {}", cc.to_uppercase());
    let row = Row::new(loss, "network", &label, "iperf3 -c (1 stream)");
    let mut server = in_ns(&b.ns, "iperf3");
    server.args(["-s", "-1", "-p", "5201"]);
    let mut server = Proc::spawn(server, "iperf3 -s", &dir.join("iperf3-s.log"))?;
    proc::wait_listen(&b.ns, 5201, &mut server)?;
    let mut client = in_ns(&a.ns, "iperf3");
    client
        .args(["-c", &b.addr.to_string(), "-p", "5201", "-J", "-C", cc])
        .args(["-t", &seconds.to_string()]);
    let o = proc::run(client, Duration::from_secs(seconds + 30), dir)?;
    server.stop();
    let v: Value = match serde_json::from_str(&o.stdout) {
        Ok(v) => v,
        Err(_) => return Ok(row.failed(format!("iperf3: {}", o.describe()))),
    };
    if let Some(e) = v["error"].as_str() {
        return Ok(row.failed(format!("iperf3: {e}")));
    }
    let (bytes, secs) = crate::peers::iperf3_received(&v);
    Ok(row.measured(bytes, secs, o.ok()))
}

/// One `rsv bench` run from site a over `link`, with the bottleneck watched meanwhile.
pub(crate) fn bench(
    link: &Link,
    url: &str,
    cfg: &IscsiConfig,
    rw: &str,
    loss: f64,
    seconds: u64,
    dir: &Path,
) -> Result<Row> {
    let row = Row::new(loss, rw, &cfg.label, "rsv bench --pattern seq");
    let mut c = in_ns(&link.a[0].ns, rsv_bin());
    c.args(["bench", url, "--json", "--pattern", "seq", "--rw", rw])
        .args([
            "--block-size",
            &cfg.io_size,
            "--duration",
            &seconds.to_string(),
        ]);
    if let Some(n) = cfg.connections {
        c.args(["--connections", &n.to_string()]);
    }
    if let Some(q) = cfg.queue_depth {
        c.args(["--queue-depth", &q.to_string()]);
    }
    for o in &cfg.initiator_opts {
        c.args(["--opt", o]);
    }
    if let Some(p) = &cfg.path_cache {
        c.env("RSV_PATH_CACHE", p);
    }
    let watch = link.watch(WATCH_EVERY);
    // At 5 % loss a single command can wait many retransmission timeouts.
    let o = proc::run(c, Duration::from_secs(seconds + 60), dir);
    let (ab, ba) = watch.finish();
    let o = o?;
    let v: Value = match serde_json::from_str(&o.stdout) {
        Ok(v) => v,
        Err(_) => return Ok(row.failed(format!("rsv bench: {}", o.describe()))),
    };
    let ios = v["ios"].as_u64().unwrap_or(0);
    let bs = v["block_size"].as_u64().unwrap_or(0);
    let secs = v["seconds"].as_f64().unwrap_or(0.0);
    let mut row = row.measured(ios * bs, secs, o.ok());
    row.session = Some(SessionSummary::from_bench(&v));
    // Writes cross a→b (the initiator is in site a), reads b→a.
    let samples = if rw == "write" { ab } else { ba };
    let from = v["started_unix_s"].as_f64().unwrap_or(0.0);
    // The issuing stopped `seconds` after the start; the rest of the window waited for the
    // commands then in flight.
    let issued = from + seconds as f64;
    row.link = busy::link_use(&samples, from, from + secs, Some(issued), link.rate_bps);
    if row.link.is_none() {
        eprintln!(
            "  (the link's counters do not cover {from:.1}..{:.1}: {} readings, {:?}..{:?})",
            from + secs,
            samples.len(),
            samples.first().map(|s| s.at),
            samples.last().map(|s| s.at)
        );
    }
    Ok(row)
}

/// How often the bottleneck's counters are read during a measurement.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Last "(P/100%)" that `qemu-img convert -p` printed.
fn qemu_progress(out: &str) -> f64 {
    out.rsplit('(')
        .find_map(|s| {
            s.split_once("/100%)")
                .and_then(|(p, _)| p.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

#[allow(clippy::too_many_arguments)]
fn qemu(
    ns: &str,
    src: &Path,
    size: u64,
    url: &str,
    loss: f64,
    label: &str,
    seconds: u64,
    dir: &Path,
) -> Result<Row> {
    let row = Row::new(loss, "write", label, "qemu-img convert (libiscsi)");
    let mut c = in_ns(ns, "qemu-img");
    c.args(["convert", "-p", "-n", "-O", "raw", "--image-opts"])
        .arg(format!(
            "driver=raw,size={size},file.driver=file,file.filename={}",
            src.display()
        ))
        .arg(url);
    // The image is sized for `seconds`; twice that lets a slow start finish, then the
    // point is cut and the bytes so far count.
    let o = proc::run(c, Duration::from_secs(2 * seconds + 5), dir)?;
    let secs = o.elapsed.as_secs_f64();
    if o.ok() {
        return Ok(row.measured(size, secs, true));
    }
    if o.timed_out {
        let done = (qemu_progress(&o.stdout) / 100.0 * size as f64) as u64;
        return Ok(row.measured(done, secs, false));
    }
    Ok(row.failed(format!("qemu-img: {}", o.describe())))
}

pub fn write_outputs(r: &Results, out: &Path) -> Result<()> {
    crate::results::save_with_csv(
        out,
        "r0",
        r,
        "scenario,loss_pct,direction,config,tool,repeat,bytes,seconds,mbit_per_s,complete,error",
        r.rows.iter().map(|x| {
            format!(
                "r0,{},{},{},{},{},{},{:.3},{:.3},{},{}",
                x.loss_pct,
                x.direction,
                x.config,
                x.tool,
                x.repeat,
                x.bytes,
                x.seconds,
                x.mbit_per_s,
                x.complete,
                x.error
            )
        }),
    )?;
    for dir in ["write", "read"] {
        // Each row's median over its repetitions.
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for x in r
            .summary
            .iter()
            .filter(|x| x.row.direction == dir || x.row.direction == "network")
        {
            let Some(m) = &x.row.mbit_per_s else {
                continue;
            };
            let pt = (x.loss_pct, m.median);
            match series.iter_mut().find(|(n, _)| *n == x.row.config) {
                Some((_, pts)) => pts.push(pt),
                None => series.push((x.row.config.clone(), vec![pt])),
            }
        }
        let title = format!(
            "R0: sequential {dir}s, {} / {} RTT, {} s per point",
            r.run.params.rate, r.run.params.rtt, r.run.params.seconds
        );
        crate::plot::loss_chart(&out.join(format!("r0-{dir}.png")), &title, &series, 100.0)
            .with_context(|| format!("plotting r0-{dir}.png"))?;
    }
    Ok(())
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "r0.json")
}
