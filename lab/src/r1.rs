//! R1: four concurrent image backups from fast senders into one bottleneck with a shallow
//! buffer. Unpaced CUBIC, unpaced BBR, and each sender paced to a quarter of the bottleneck
//! (R1's patterns 1 and 2); per-stream and total throughput, link use, Jain's index.

use crate::env::Environment;
use crate::peers::{rsv_target, ISCSI_PORT};
use crate::proc::{self, check_interrupt, in_ns, rsv_bin, sysctl, Link, Proc};
use crate::stats::Spread;
use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.reservoir:vtl";
pub const STREAMS: usize = 4;
/// The congestion "setting" of a mode that sets nothing by hand.
const AUTO: &str = "auto";

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    pub rate: String,
    pub rate_bps: u64,
    pub rtt: String,
    /// Drop-tail bottleneck queue (bytes): shallow, well under one BDP of the fast side.
    pub queue: String,
    pub image_bytes: u64,
    pub io_size: String,
    pub iperf_seconds: u64,
    /// Also run Reservoir's default with this congestion control at both ends (`rsv`:
    /// Reservoir's own, loaded by the target and the initiators; needs root).
    pub congestion: Option<String>,
    /// Every mode runs this many times, interleaved (all modes once, then again).
    #[serde(default)]
    pub repeat: u32,
    /// Only these modes (iperf3, cubic, bbr, paced, reservoir, reservoir-CC); empty: all.
    #[serde(default)]
    pub modes: Vec<String>,
}

/// `rsv-lab run r1`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Repeated,
    /// Also run Reservoir's default with this congestion control at both ends (`rsv`:
    /// Reservoir's own, loaded by the target and the initiators).
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// Only these modes (iperf3, cubic, bbr, paced, reservoir, with --congestion CC
    /// reservoir-CC).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
}

impl Args {
    pub fn params(&self) -> Params {
        let mut p = Params::new(self.flags.common.quick);
        p.congestion = self.congestion.clone();
        p.repeat = self.flags.repeat.repeat;
        p.modes = self.rows.clone();
        p
    }
}

impl Params {
    pub fn new(quick: bool) -> Params {
        let (rate, bps) = if quick {
            ("200mbit", 200_000_000)
        } else {
            // The emulator holds 1 Gbit/s on an idle machine; four senders, a target and
            // the relay on two shared cores do not leave it idle: at 500 Mbit/s even four
            // iperf3 streams reached only 45 % of the link, so the run measured the machine.
            ("250mbit", 250_000_000)
        };
        Params {
            rate: rate.into(),
            rate_bps: bps,
            rtt: "2ms".into(),
            queue: "48KiB".into(),
            image_bytes: if quick { 24 << 20 } else { 256 << 20 },
            io_size: "1m".into(),
            iperf_seconds: if quick { 3 } else { 10 },
            congestion: None,
            repeat: 1,
            modes: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Stream {
    pub host: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub error: String,
}

impl Stream {
    /// One stream's figures from the host it ran on; when it `failed`, what `o` says.
    fn new(host: &str, bytes: u64, seconds: f64, failed: bool, o: &proc::Outcome) -> Stream {
        Stream {
            host: host.to_owned(),
            bytes,
            seconds,
            mb_per_s: if seconds > 0.0 {
                bytes as f64 / seconds / 1e6
            } else {
                0.0
            },
            error: if failed { o.describe() } else { String::new() },
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Mode {
    pub key: String,
    pub label: String,
    pub tool: String,
    pub congestion: String,
    pub pacing_bps: Option<u64>,
    pub streams: Vec<Stream>,
    pub wall_seconds: f64,
    /// Sum of bytes over the wall time of the whole batch (MB/s, 10^6 bytes).
    pub total_mb_per_s: f64,
    /// Goodput as a share of the bottleneck rate (%).
    pub link_use_pct: f64,
    /// Bytes that left the bottleneck (headers and retransmissions included) as a share (%).
    pub wire_use_pct: f64,
    pub queue_drops: u64,
    pub jain: f64,
    /// Which repetition of the mode this is (1 to `--repeat`).
    #[serde(default)]
    pub repeat: u32,
    /// Where the bottleneck's time went over the wall time (the backups' modes): its
    /// byte counters read every 0.2 s; the issuing's end is the first backup's end, so
    /// "at the end" is the time the others took after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::busy::LinkUse>,
}

/// A mode over its repetitions: median and range of what the table shows, and which
/// repetition is the median one (its streams stand for the mode in the plot).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ModeSummary {
    pub key: String,
    pub label: String,
    pub runs: usize,
    pub link_use_pct: Option<Spread>,
    pub wire_use_pct: Option<Spread>,
    pub total_mb_per_s: Option<Spread>,
    pub jain: Option<Spread>,
    pub median_repeat: u32,
}

fn summarize(modes: &[Mode]) -> Vec<ModeSummary> {
    let mut keys: Vec<&str> = Vec::new();
    for m in modes {
        if !keys.contains(&m.key.as_str()) {
            keys.push(&m.key);
        }
    }
    keys.into_iter()
        .map(|k| {
            let runs: Vec<&Mode> = modes.iter().filter(|m| m.key == k).collect();
            let link = Spread::of(runs.iter().map(|m| m.link_use_pct));
            // The repetition whose link use is the median (the lower middle one of an even
            // count).
            let mut by_use = runs.clone();
            by_use.sort_by(|a, b| a.link_use_pct.total_cmp(&b.link_use_pct));
            ModeSummary {
                key: k.into(),
                label: runs[0].label.clone(),
                runs: runs.len(),
                link_use_pct: link,
                wire_use_pct: Spread::of(runs.iter().map(|m| m.wire_use_pct)),
                total_mb_per_s: Spread::of(runs.iter().map(|m| m.total_mb_per_s)),
                jain: Spread::of(runs.iter().map(|m| m.jain)),
                median_repeat: by_use[(by_use.len() - 1) / 2].repeat,
            }
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    pub target_config: String,
    pub environment: Environment,
    /// Every run, each repetition its own mode.
    pub modes: Vec<Mode>,
    /// Each mode over its repetitions.
    #[serde(default)]
    pub summary: Vec<ModeSummary>,
}

pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        0.0
    } else {
        s * s / (xs.len() as f64 * q)
    }
}

fn target_toml(image: u64, session: &str) -> String {
    let mut t = format!("{session}[[target]]\niqn = \"{IQN}\"\n");
    for i in 0..STREAMS {
        t += &format!("[[target.lun]]\nid = {i}\nbackstore = \"ram\"\nsize = {image}\n");
    }
    t
}

pub fn run(p: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    let quarter = p.rate_bps / STREAMS as u64;
    // (key, label, congestion, pacing, the target's [session])
    let mut table: Vec<(String, String, String, Option<u64>, String)> = vec![
        (
            "cubic".into(),
            "CUBIC unpaced".into(),
            "cubic".into(),
            None,
            String::new(),
        ),
        (
            "bbr".into(),
            "BBR unpaced".into(),
            "bbr".into(),
            None,
            String::new(),
        ),
        (
            "paced".into(),
            "CUBIC paced to 1/4 each".into(),
            "cubic".into(),
            Some(quarter),
            String::new(),
        ),
        // Nothing set by hand: the hosts' default is CUBIC, Reservoir picks its own.
        (
            "reservoir".into(),
            "Reservoir default".into(),
            AUTO.into(),
            None,
            String::new(),
        ),
    ];
    if let Some(cc) = &p.congestion {
        table.push((
            format!("reservoir-{cc}"),
            format!("Reservoir congestion={cc}"),
            cc.clone(),
            None,
            format!("[session]\ncongestion = \"{cc}\"\n"),
        ));
    }
    let keys: Vec<&str> = std::iter::once("iperf3")
        .chain(table.iter().map(|t| t.0.as_str()))
        .collect();
    if let Some(m) = p.modes.iter().find(|m| !keys.contains(&m.as_str())) {
        anyhow::bail!("r1 has no mode {m:?}; its modes: {}", keys.join(", "));
    }
    let wanted = |k: &str| p.modes.is_empty() || p.modes.iter().any(|m| m == k);
    table.retain(|t| wanted(&t.0));
    let environment = crate::env::collect();
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "r1")?;
    let dir = &scratch.0;
    let src = dir.join("image.img");
    proc::random_file(&src, p.image_bytes)?;
    let link = Link::up(
        "lr1",
        &[
            "--rtt".into(),
            p.rtt.clone(),
            "--rate".into(),
            p.rate.clone(),
            "--queue".into(),
            p.queue.clone(),
        ],
        STREAMS as u32,
    )?;
    if link.a.len() < STREAMS {
        return Err(anyhow!(
            "rsv-lab wan up gave {} hosts in site a",
            link.a.len()
        ));
    }
    for ns in link.all_ns() {
        sysctl(ns, &crate::r0::linux_default_tcp())?;
    }
    let b = &link.b[0];
    let config = target_toml(p.image_bytes, "");
    let mut modes = Vec::new();
    let show = |m: &Mode| {
        eprintln!(
            "r1: {:<26} total {:>7.1} MB/s  link use {:>5.1} %  Jain {:.3}  streams {:?}",
            m.label,
            m.total_mb_per_s,
            m.link_use_pct,
            m.jain,
            m.streams
                .iter()
                .map(|s| (s.mb_per_s * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
        if let Some(u) = &m.link {
            eprintln!(
                "r1:   link busy {:.1} %: {:.2} s lost starting (full after {:.1} s), {:.2} s \
                 later, {:.2} s after the first backup ended",
                u.busy_pct,
                u.lost_start_s,
                u.start_s,
                u.lost_later_s,
                u.lost_end_s.unwrap_or(0.0)
            );
        }
    };
    for rep in 1..=p.repeat.max(1) {
        if p.repeat > 1 {
            eprintln!("r1: repetition {rep} of {}", p.repeat);
        }
        if wanted("iperf3") {
            let mut m = iperf3_reference(&link, &p, dir)?;
            m.repeat = rep;
            show(&m);
            modes.push(m);
        }
        for (key, label, cc, pacing, session) in &table {
            check_interrupt()?;
            // A fresh target per mode: no state (or fresh-LUN allocation) carries over.
            let toml = target_toml(p.image_bytes, session);
            let mut target = rsv_target(&b.ns, b.addr, &toml, dir, key)?;
            let mut m = backups(&link, &p, key, label, cc, *pacing, &src, dir)?;
            m.repeat = rep;
            if !target.alive() {
                for s in &mut m.streams {
                    if s.error.is_empty() {
                        s.error = "rsv target exited during the run".into();
                    }
                }
            }
            show(&m);
            modes.push(m);
            target.stop();
        }
    }
    drop(link);
    let summary = summarize(&modes);
    if p.repeat > 1 {
        for s in &summary {
            eprintln!(
                "r1: {:<26} link use {}  Jain {}",
                s.label,
                s.link_use_pct.map_or("—".into(), |x| x.show(1, " %")),
                s.jain.map_or("—".into(), |x| x.show(3, ""))
            );
        }
    }
    let results = Results {
        run: crate::results::Run::new("r1", quick, command, p),
        target_config: config,
        environment,
        modes,
        summary,
    };
    write_outputs(&results, out)?;
    Ok(results)
}

fn finish(mut m: Mode, rate_bps: u64, wire_bytes: u64) -> Mode {
    let total: u64 = m.streams.iter().map(|s| s.bytes).sum();
    m.total_mb_per_s = total as f64 / m.wall_seconds / 1e6;
    let cap = rate_bps as f64 / 8.0;
    m.link_use_pct = 100.0 * total as f64 / m.wall_seconds / cap;
    m.wire_use_pct = 100.0 * wire_bytes as f64 / m.wall_seconds / cap;
    let rates: Vec<f64> = m.streams.iter().map(|s| s.mb_per_s).collect();
    m.jain = jain(&rates);
    m
}

/// Four iperf3 CUBIC streams from the four senders: what TCP alone gets through this link.
fn iperf3_reference(link: &Link, p: &Params, dir: &Path) -> Result<Mode> {
    let b = &link.b[0];
    let mut servers = Vec::new();
    for i in 0..STREAMS {
        let mut s = in_ns(&b.ns, "iperf3");
        s.args(["-s", "-1", "-p", &(5201 + i).to_string()]);
        let mut s = Proc::spawn(s, "iperf3 -s", &dir.join(format!("iperf3-s{i}.log")))?;
        proc::wait_listen(&b.ns, 5201 + i as u16, &mut s)?;
        servers.push(s);
    }
    let clients = (0..STREAMS)
        .map(|i| {
            let mut c = in_ns(&link.a[i].ns, "iperf3");
            c.args(["-c", &b.addr.to_string(), "-p", &(5201 + i).to_string()])
                .args(["-J", "-C", "cubic", "-t", &p.iperf_seconds.to_string()]);
            c
        })
        .collect();
    let (wire0, drops0) = link.ab_counters()?;
    let t0 = Instant::now();
    let outs = proc::run_many(clients, Duration::from_secs(p.iperf_seconds + 30), dir)?;
    let wall = t0.elapsed().as_secs_f64();
    let (wire1, drops1) = link.ab_counters()?;
    let mut streams = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        let v: Value = serde_json::from_str(&o.stdout).unwrap_or(Value::Null);
        let (bytes, secs) = crate::peers::iperf3_received(&v);
        streams.push(Stream::new(&link.a[i].ns, bytes, secs, bytes == 0, o));
    }
    drop(servers);
    // iperf3's own seconds, not the wall time with process start-up, for its total.
    let secs = streams.iter().map(|s| s.seconds).fold(0.0, f64::max);
    let m = Mode {
        key: "iperf3".into(),
        label: "iperf3 CUBIC x4 (network)".into(),
        tool: "iperf3".into(),
        congestion: "cubic".into(),
        pacing_bps: None,
        streams,
        wall_seconds: if secs > 0.0 { secs } else { wall },
        queue_drops: drops1 - drops0,
        repeat: 1,
        // The shares and Jain's index: `finish`'s.
        ..Default::default()
    };
    let scale = m.wall_seconds / wall;
    Ok(finish(
        m,
        p.rate_bps,
        ((wire1 - wire0) as f64 * scale) as u64,
    ))
}

#[allow(clippy::too_many_arguments)]
fn backups(
    link: &Link,
    p: &Params,
    key: &str,
    label: &str,
    cc: &str,
    pacing: Option<u64>,
    src: &Path,
    dir: &Path,
) -> Result<Mode> {
    let b = &link.b[0];
    // The hosts' default where the mode sets none, or names one the kernel may not have
    // registered yet (`rsv`, loaded by Reservoir's processes): the option selects it.
    let host_cc = match cc {
        "cubic" | "bbr" => cc,
        _ => "cubic",
    };
    for h in &link.a[..STREAMS] {
        sysctl(
            &h.ns,
            &[("net.ipv4.tcp_congestion_control".into(), host_cc.into())],
        )?;
    }
    let cmds = (0..STREAMS)
        .map(|i| {
            let url = format!("iscsi://{}:{ISCSI_PORT}/{IQN}/{i}", b.addr);
            let mut c = in_ns(&link.a[i].ns, rsv_bin());
            c.arg("cp").arg(src).arg(&url).args([
                "--json",
                "--no-progress",
                "--io-size",
                &p.io_size,
            ]);
            if cc != AUTO {
                c.args(["--opt", &format!("congestion={cc}")]);
            }
            if let Some(r) = pacing {
                let rate = units::Rate::from_bits_per_sec(r);
                c.args(["--pacing-rate", &rate.to_string()]);
            }
            c
        })
        .collect();
    let (wire0, drops0) = link.ab_counters()?;
    let watch = link.watch(Duration::from_millis(200));
    let t0 = Instant::now();
    let t0_unix = proc::unix_now();
    // At 20 % link use a backup takes 5x its ideal time; allow ten.
    let ideal = p.image_bytes as f64 * STREAMS as f64 * 8.0 / p.rate_bps as f64;
    let outs = proc::run_many(cmds, Duration::from_secs_f64(10.0 * ideal + 30.0), dir);
    let wall = t0.elapsed().as_secs_f64();
    let (ab, _) = watch.finish();
    let outs = outs?;
    let (wire1, drops1) = link.ab_counters()?;
    let first_done = outs
        .iter()
        .map(|o| o.elapsed.as_secs_f64())
        .fold(f64::INFINITY, f64::min);
    let link_use = crate::busy::link_use(
        &ab,
        t0_unix,
        t0_unix + wall,
        first_done.is_finite().then_some(t0_unix + first_done),
        p.rate_bps,
    );
    let streams = outs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let v: Value = serde_json::from_str(&o.stdout).unwrap_or(Value::Null);
            let bytes = v["bytes"].as_u64().unwrap_or(0);
            let secs = v["seconds"].as_f64().unwrap_or(0.0);
            Stream::new(&link.a[i].ns, bytes, secs, !o.ok() || bytes == 0, o)
        })
        .collect();
    let m = Mode {
        key: key.into(),
        label: label.into(),
        tool: "rsv cp".into(),
        congestion: cc.into(),
        pacing_bps: pacing,
        streams,
        wall_seconds: wall,
        queue_drops: drops1 - drops0,
        repeat: 1,
        link: link_use,
        ..Default::default()
    };
    Ok(finish(m, p.rate_bps, wire1 - wire0))
}

pub fn write_outputs(r: &Results, out: &Path) -> Result<()> {
    crate::results::save(out, "r1.json", r)?;
    let mut csv = String::from(
        "scenario,mode,tool,congestion,pacing_bps,repeat,stream,host,bytes,seconds,mb_per_s,\
         total_mb_per_s,link_use_pct,wire_use_pct,jain,queue_drops,error\n",
    );
    for m in &r.modes {
        // The columns a mode's stream lines and its total line share.
        let mode = format!(
            "r1,{},{},{},{},{}",
            m.label.replace(',', ";"),
            m.tool,
            m.congestion,
            m.pacing_bps.map(|x| x.to_string()).unwrap_or_default(),
            m.repeat
        );
        for (i, s) in m.streams.iter().enumerate() {
            csv += &format!(
                "{mode},{},{},{},{:.3},{:.3},,,,,,{}\n",
                i + 1,
                s.host,
                s.bytes,
                s.seconds,
                s.mb_per_s,
                s.error.replace(['\n', ','], " ")
            );
        }
        let bytes: u64 = m.streams.iter().map(|s| s.bytes).sum();
        csv += &format!(
            "{mode},total,,{bytes},{:.3},{:.3},{:.3},{:.2},{:.2},{:.4},{},\n",
            m.wall_seconds,
            m.total_mb_per_s,
            m.total_mb_per_s,
            m.link_use_pct,
            m.wire_use_pct,
            m.jain,
            m.queue_drops
        );
    }
    std::fs::write(out.join("r1.csv"), csv)?;
    let cap_mb = r.run.params.rate_bps as f64 / 8e6;
    // Each mode's median repetition (by link use).
    let mut groups: Vec<crate::plot::BarGroup> = r
        .summary
        .iter()
        .filter_map(|s| {
            r.modes
                .iter()
                .find(|m| m.key == s.key && m.repeat == s.median_repeat)
        })
        .map(|m| crate::plot::BarGroup {
            label: m.label.clone(),
            streams: m
                .streams
                .iter()
                .map(|s| 100.0 * s.mb_per_s / cap_mb)
                .collect(),
            total: m.link_use_pct,
            note: format!("Jain {:.2}", m.jain),
        })
        .collect();
    // The study's patterns, as shares of its 1 GbE bottleneck (R1 counts 100 MB/s as 100 %).
    groups.push(crate::plot::BarGroup {
        label: "study: pattern 1".into(),
        streams: vec![5.3; 4],
        total: 21.2,
        note: "10G into 1G".into(),
    });
    groups.push(crate::plot::BarGroup {
        label: "study: pattern 2".into(),
        streams: vec![16.6, 26.6],
        total: 95.7,
        note: "senders at 1G (min, max stream)".into(),
    });
    let title = format!(
        "R1: 4 backups into {} (RTT {}, queue {}); % of the bottleneck",
        r.run.params.rate, r.run.params.rtt, r.run.params.queue
    );
    crate::plot::bars(&out.join("r1.png"), &title, &groups).context("plotting r1.png")?;
    Ok(())
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "r1.json")
}
