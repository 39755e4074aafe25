//! RTT sweep: one link at a high rate, round-trip times from 1 to 300 ms, no loss;
//! iperf3 BBR as the network's ceiling and Reservoir's defaults (auto-tuned, nothing
//! set by hand) writing and reading. The goal: at least 90 % of the link at every point.

use crate::env::Environment;
use crate::peers::{rsv_target, ISCSI_PORT};
use crate::proc::{self, check_interrupt, Link};
use crate::r0::{self, IscsiConfig, Row, IQN};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    pub rate: String,
    pub rate_bps: u64,
    pub rtt_ms: Vec<u32>,
    pub seconds: u64,
    /// Also run Reservoir's rows with this congestion control at both ends (a second
    /// target beside the first, on port 3261).
    pub congestion: Option<String>,
    /// Reservoir's rows run this many times at each RTT, interleaved (every row once, then
    /// again); iperf3 once.
    #[serde(default)]
    pub repeat: u32,
    /// Only these rows (reservoir, reservoir-rate, and with a congestion control CC
    /// reservoir-CC, reservoir-remembered-CC, reservoir-rate-CC); empty: all.
    #[serde(default)]
    pub rows: Vec<String>,
}

/// `rsv-lab run rtt`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Repeated,
    /// Only these round-trip times, in milliseconds (e.g. 200,300).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rtt: Vec<u32>,
    /// Seconds per measurement instead of 30 (--quick 3).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Also run Reservoir's rows with this congestion control at both ends (`rsv`:
    /// Reservoir's own, loaded by the target and the initiator).
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// Only these of Reservoir's rows (reservoir, reservoir-rate, with --congestion CC
    /// reservoir-CC, reservoir-rate-CC and reservoir-remembered-CC: the rate from the path
    /// cache after a 10-s learning run at each point).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
}

impl Args {
    pub fn params(&self) -> Params {
        let mut p = Params::new(self.flags.common.quick);
        p.rtt_ms = crate::cli::given_or(&self.rtt, p.rtt_ms);
        p.seconds = self.seconds.unwrap_or(p.seconds);
        p.congestion = self.congestion.clone();
        p.repeat = self.flags.repeat.repeat;
        p.rows = self.rows.clone();
        p
    }
}

impl Params {
    pub fn new(quick: bool) -> Params {
        // The emulator holds 1 Gbit/s on an idle machine; with the target, the initiator
        // and the relay on two shared cores, 500 Mbit/s is what it holds steadily.
        let (rate, rate_bps) = if quick {
            ("100mbit", 100_000_000)
        } else {
            ("500mbit", 500_000_000)
        };
        Params {
            rate: rate.into(),
            rate_bps,
            rtt_ms: if quick {
                vec![50]
            } else {
                vec![1, 10, 50, 100, 200, 300]
            },
            seconds: if quick { 3 } else { 30 },
            congestion: None,
            repeat: 1,
            rows: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Point {
    pub rtt_ms: u32,
    pub row: Row,
    /// Payload rate as a share of the link rate.
    pub link_pct: f64,
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    pub environment: Environment,
    /// Every run, each repetition its own point.
    pub points: Vec<Point>,
    /// Each row over its repetitions: median and range.
    #[serde(default)]
    pub summary: Vec<RttSummary>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RttSummary {
    pub rtt_ms: u32,
    /// Payload rate as a share of the link rate.
    pub link_pct: Option<crate::stats::Spread>,
    #[serde(flatten)]
    pub row: crate::stats::RowSummary,
}

/// The second target's port (`--congestion`).
const CC_PORT: u16 = 3261;
/// The run before each measurement of the remembered-rate row, from which the path cache
/// learns the path (`net::paths`).
const LEARN_SECONDS: u64 = 10;

fn reservoir() -> IscsiConfig {
    IscsiConfig {
        key: "reservoir".into(),
        label: "Reservoir default".into(),
        sysctl: r0::linux_default_tcp(),
        target_session: String::new(),
        connections: None,
        queue_depth: None,
        io_size: "1m".into(),
        initiator_opts: Vec::new(),
        path_cache: None,
    }
}

pub fn run(params: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    let environment = crate::env::collect();
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "rtt")?;
    let dir = &scratch.0;
    let link = Link::up(
        "lrtt",
        &[
            "--rtt".into(),
            format!("{}ms", params.rtt_ms[0]),
            "--rate".into(),
            params.rate.clone(),
        ],
        1,
    )?;
    r0::set_tcp(&link, &r0::linux_default_tcp())?;
    let b = &link.b[0];
    let mut target = rsv_target(&b.ns, b.addr, &r0::target_toml(""), dir, "rtt")?;
    let url = format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", b.addr);
    let cfg = reservoir();
    let with_cc = match &params.congestion {
        Some(cc) => {
            let mut c = reservoir();
            c.key = format!("reservoir-{cc}");
            c.label = format!("Reservoir congestion={cc}");
            c.initiator_opts.push(format!("congestion={cc}"));
            let toml = r0::target_toml(&format!("congestion = \"{cc}\"\n"));
            let t = crate::peers::rsv_target_on(&b.ns, b.addr, CC_PORT, &toml, dir, "rtt-cc")?;
            Some((c, t, format!("iscsi://{}:{CC_PORT}/{IQN}/0", b.addr)))
        }
        None => None,
    };
    // Reservoir's rows: its defaults; with a congestion control, the same on it, the same
    // again starting from the rate its path cache remembers (a learning run before each
    // measurement, not counted), and both with the link's rate declared (the start and the
    // pacing the congestion control is given, against the kernel's BBR given the same).
    let mut configs = vec![(cfg.clone(), url.clone())];
    if let Some((c, _, cc_url)) = &with_cc {
        configs.push((c.clone(), cc_url.clone()));
        let mut remembered = c.clone();
        remembered.key = c.key.replacen("reservoir", "reservoir-remembered", 1);
        remembered.label = format!("{}, rate remembered", c.label);
        remembered.path_cache = Some(dir.join("paths"));
        configs.push((remembered, cc_url.clone()));
        for (base, u) in [(&cfg, &url), (c, cc_url)] {
            let mut rated = base.clone();
            rated.key = base.key.replacen("reservoir", "reservoir-rate", 1);
            rated.label = format!("{} --rate {}", base.label, params.rate);
            rated.initiator_opts.push(format!("rate={}", params.rate));
            configs.push((rated, u.clone()));
        }
    }
    let keys: Vec<&str> = configs.iter().map(|(c, _)| c.key.as_str()).collect();
    if let Some(r) = params.rows.iter().find(|r| !keys.contains(&r.as_str())) {
        anyhow::bail!("rtt has no row {r:?}; its rows: {}", keys.join(", "));
    }
    configs.retain(|(c, _)| params.rows.is_empty() || params.rows.contains(&c.key));
    let mut points = Vec::new();
    let show = |row: &Row, link_pct: f64| {
        eprintln!(
            "  {:<7} {:<22} {:>8.2} Mbit/s  {:>5.1} % of the link{}",
            row.direction,
            row.config,
            row.mbit_per_s,
            link_pct,
            row.note()
        );
    };
    // Each row shown, and kept as a point with its share of the link.
    let record = |points: &mut Vec<Point>, rtt: u32, row: Row| {
        let link_pct = row.mbit_per_s * 1e6 / params.rate_bps as f64 * 100.0;
        show(&row, link_pct);
        points.push(Point {
            rtt_ms: rtt,
            row,
            link_pct,
        });
    };
    for &rtt in &params.rtt_ms {
        check_interrupt()?;
        // The queue stays one BDP (the emulator's default) as the RTT changes.
        link.set(&["--rtt".into(), format!("{rtt}ms")])?;
        eprintln!("rtt: {rtt} ms");
        let row = r0::iperf3(&link, 0.0, "bbr", params.seconds, dir)?;
        record(&mut points, rtt, row);
        for rep in 1..=params.repeat.max(1) {
            if params.repeat > 1 {
                eprintln!("rtt: {rtt} ms, repetition {rep} of {}", params.repeat);
            }
            for (c, u) in &configs {
                if c.path_cache.is_some() {
                    // What the path cache will remember: a short run at this RTT.
                    check_interrupt()?;
                    let learn = r0::bench(&link, u, c, "write", 0.0, LEARN_SECONDS, dir)?;
                    eprintln!(
                        "  (learning run for {}: {:.2} Mbit/s, not counted)",
                        c.label, learn.mbit_per_s
                    );
                }
                for rw in ["write", "read"] {
                    check_interrupt()?;
                    let mut row = r0::bench(&link, u, c, rw, 0.0, params.seconds, dir)?;
                    row.repeat = rep;
                    record(&mut points, rtt, row);
                }
            }
        }
    }
    if let Some((_, mut t, _)) = with_cc {
        if let Some(p) = points.last_mut() {
            r0::check_target(&mut t, std::slice::from_mut(&mut p.row));
        }
    }
    if let Some(p) = points.iter_mut().rev().find(|p| p.row.config == cfg.label) {
        r0::check_target(&mut target, std::slice::from_mut(&mut p.row));
    }
    drop(link);
    let mut summary = Vec::new();
    for &rtt in &params.rtt_ms {
        let at: Vec<&Point> = points.iter().filter(|p| p.rtt_ms == rtt).collect();
        for row in crate::stats::summarize(at.iter().map(|p| &p.row)) {
            let link_pct = crate::stats::Spread::of(
                at.iter()
                    .filter(|p| {
                        p.row.ok() && p.row.direction == row.direction && p.row.config == row.config
                    })
                    .map(|p| p.link_pct),
            );
            if params.repeat > 1 && row.direction != "network" {
                eprintln!(
                    "rtt: {rtt} ms {:<7} {:<40} {} of the link, full after {}",
                    row.direction,
                    row.config,
                    link_pct.map_or("—".into(), |l| l.show(1, " %")),
                    row.full_after_s.map_or("—".into(), |f| f.show(1, " s"))
                );
            }
            summary.push(RttSummary {
                rtt_ms: rtt,
                link_pct,
                row,
            });
        }
    }
    let results = Results {
        run: crate::results::Run::new("rtt", quick, command, params),
        environment,
        points,
        summary,
    };
    crate::results::save_with_csv(
        out,
        "rtt",
        &results,
        "scenario,rtt_ms,direction,config,tool,repeat,bytes,seconds,mbit_per_s,link_pct,complete,\
         error",
        results.points.iter().map(|p| {
            let r = &p.row;
            format!(
                "rtt,{},{},{},{},{},{},{:.3},{:.3},{:.1},{},{}",
                p.rtt_ms,
                r.direction,
                r.config,
                r.tool,
                r.repeat,
                r.bytes,
                r.seconds,
                r.mbit_per_s,
                p.link_pct,
                r.complete,
                r.error
            )
        }),
    )?;
    Ok(results)
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "rtt.json")
}
