//! `rsv-lab list/run/doc`: list and run the scenarios, regenerate the result document.

use crate::proc;
use anyhow::{bail, Result};
use clap::Subcommand;
use std::path::{Path, PathBuf};

// Parsed once per process: the size of the Run variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Name the scenarios.
    List,
    /// Run a scenario: r0, r1, rtt, r2, r4, cuts, or all (all but cuts).
    Run {
        scenario: String,
        /// A short version (about a minute for both scenarios): one loss point, small sizes.
        #[arg(long)]
        quick: bool,
        /// Where results go (default lab/results, with --quick lab/results-quick); with --out the
        /// documents in docs/ are left alone unless --doc names one.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Rewrite this result document (default docs/lab-r0-r1.md unless --quick).
        #[arg(long)]
        doc: Option<PathBuf>,
        /// Do not touch the result document.
        #[arg(long, conflicts_with = "doc")]
        no_doc: bool,
        /// r0: only these loss rates, in percent (e.g. 1,5).
        #[arg(long, value_delimiter = ',')]
        loss: Vec<f64>,
        /// r4: only these delays added each way, in milliseconds (e.g. 0,12,24).
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..=1000))]
        delay: Vec<u32>,
        /// r4: only these receive windows (64K, 128K, default).
        #[arg(long, value_delimiter = ',')]
        window: Vec<String>,
        /// r2: disk servers per site (default 8).
        #[arg(long)]
        disk_servers: Option<usize>,
        /// r2: only these rows (one, unpaced, static, reservoir, reservoir-rate, iperf3,
        /// gridftp, qemu-img); r0: only these configurations (before, tuned, reservoir,
        /// reservoir-rate, with --congestion CC reservoir-CC, reservoir-rate-CC); rtt: only
        /// these of Reservoir's rows (the same names but before and tuned, and with
        /// --congestion CC reservoir-remembered-CC: the rate from the path cache after a
        /// 10-s learning run at each point); r1: only these
        /// modes (iperf3, cubic, bbr, paced, reservoir, reservoir-CC).
        #[arg(long, value_delimiter = ',')]
        rows: Vec<String>,
        /// r0, rtt and r1: run each of Reservoir's rows (r1: each mode) this many times,
        /// interleaved; the results give the median and the range (min-max) and the plots
        /// the median. The peers of r0 and rtt (iperf3, qemu-img, tgt) run once a point.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        repeat: u32,
        /// r2: the bottleneck's rate as tc writes it (800mbit) instead of calibrating it.
        #[arg(long, value_parser = units::parse_rate)]
        link_rate: Option<units::Rate>,
        /// rtt and r2: only these round-trip times, in milliseconds (e.g. 200,300).
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=10_000))]
        rtt: Vec<u32>,
        /// r0 and rtt: seconds per measurement instead of the scenario's own; r2: seconds of
        /// link time per transfer; r4: the time limit of each reader.
        #[arg(long)]
        seconds: Option<u64>,
        /// r0, rtt and r1: also run Reservoir's rows with this congestion control at both
        /// ends (`rsv`: Reservoir's own, loaded by the target and the initiator; needs root).
        #[arg(long, value_name = "NAME")]
        congestion: Option<String>,
        /// r0: only the iperf3 references and Reservoir's rows (no study configurations,
        /// qemu-img or tgt).
        #[arg(long)]
        reservoir_only: bool,
        /// cuts: how long each break lasts, in seconds (default 5,30,120; --quick 4).
        #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=3600))]
        cut: Vec<u64>,
        /// cuts: only these cases, TRANSFER:BREAK (cp-put-erl2, cp-get-erl2, cp-put-erl0,
        /// cp-get-erl0, sync; cut, restart, and for cp down: the link cut until the copy
        /// gives up), e.g. cp-put-erl0:cut,sync:restart,cp-get-erl2:down.
        #[arg(long, value_delimiter = ',')]
        case: Vec<String>,
        /// cuts: bytes each transfer moves (default 64M; --quick 32M).
        #[arg(long, value_parser = units::parse_size)]
        size: Option<u64>,
        /// cuts: the emulated link's name (default rel-cuts, --quick rel-cq), so that two
        /// runs can go side by side.
        #[arg(long)]
        link_name: Option<String>,
        /// cuts: URL options of the copies a `down` case breaks, e.g.
        /// recovery_timeout=10&command_timeout=10 (default: none, i.e. the defaults;
        /// --quick: recovery_timeout=5&command_timeout=5&nop_interval=2).
        #[arg(long)]
        down_opts: Option<String>,
    },
    /// Rewrite the result document from results already on disk (--out docs/lab-r4*.md:
    /// R4's).
    Doc {
        #[arg(long, default_value = "lab/results")]
        results: PathBuf,
        #[arg(long, default_value = "docs/lab-r0-r1.md")]
        out: PathBuf,
    },
}

pub const SCENARIOS: &[(&str, &str)] = &[
    (
        "r0",
        "R0: backup writes/reads over 100 Mbit/s, 100 ms RTT, loss 0.001-5 %: study's before vs \
         tuned (2b), Reservoir default, qemu-img into tgt and Reservoir, iperf3 CUBIC/BBR",
    ),
    (
        "r1",
        "R1: 4 concurrent image backups into one 250 Mbit/s bottleneck with a shallow queue: \
         unpaced CUBIC, unpaced BBR, paced to 1/4 each; per-stream, total, link use, Jain",
    ),
    (
        "r2",
        "R2: Data Reservoir: a volume striped over N disk servers per site copied disk server \
         to disk server at 350 and 200 ms: one stream, N unpaced, N paced to 1/N, Reservoir's \
         cooperative pacing, iperf3 -P N, GridFTP -p N, qemu-img; per-stream throughput over time",
    ),
    (
        "r3",
        "R3: secure transport: 1 MiB sequential reads and writes on loopback, over 1 Gbit/s 1 ms \
         and R0's link: Reservoir plaintext and TLS 1.3 (each suite), tgt plaintext and behind \
         stunnel; throughput, CPU s/GB each side, sender bursts, plaintext/TLS timeline",
    ),
    (
        "r4",
        "R4: a media server reading a file in 32 KiB calls over 100 Mbit/s with 0-24 ms added \
         each way, receive windows 64K/128K/default: Reservoir's initiator (ext4 read in-process) \
         against Samba (smbclient); start-of-stream latency through rsv media",
    ),
    (
        "cuts",
        "cut links and restarted targets mid-copy: rsv cp (to the LUN and back, ERL 2 and 0) \
         and rsv sync over R0's link, the link cut or the target SIGKILLed for 5, 30, 120 s; \
         each must end byte-identical, at once or resumed (not part of `all`)",
    ),
    (
        "rtt",
        "RTT sweep 1-300 ms at 500 Mbit/s, no loss: iperf3 BBR and Reservoir's defaults \
         writing and reading, as a share of the link",
    ),
];

pub fn run(command: LabCommand) -> Result<()> {
    match command {
        LabCommand::List => {
            for (name, what) in SCENARIOS {
                println!("{name}  {what}");
            }
            Ok(())
        }
        LabCommand::Doc { results, out } => {
            // The scenarios with a document of their own, by the name it has (R4's:
            // lab-r4*.md, a run of some windows may have one of its own).
            if out
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("lab-r4"))
            {
                crate::r4::write_doc(&results, &out)
            } else {
                crate::doc::write(&results, &out)
            }
        }
        LabCommand::Run {
            scenario,
            quick,
            out,
            doc,
            no_doc,
            loss,
            rtt,
            seconds,
            disk_servers,
            rows,
            repeat,
            link_rate,
            delay,
            window,
            congestion,
            reservoir_only,
            cut,
            case,
            size,
            link_name,
            down_opts,
        } => {
            let names: Vec<&str> = match scenario.as_str() {
                "all" => SCENARIOS
                    .iter()
                    .map(|s| s.0)
                    .filter(|s| *s != "cuts")
                    .collect(),
                s if SCENARIOS.iter().any(|x| x.0 == s) => vec![s],
                s => bail!("unknown scenario {s:?}; `rsv-lab list` names them"),
            };
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                bail!("rsv-lab needs root (network namespaces and TUN devices)");
            }
            let rsv = proc::rsv_bin();
            if !rsv.exists() {
                bail!(
                    "no rsv at {}: the lab runs the rsv beside rsv-lab; build both with one \
                     profile (cargo build [--release] -p rsv -p rsv-lab)",
                    rsv.display()
                );
            }
            proc::install_signal_handlers();
            // A run whose results go elsewhere (--out) leaves the committed documents alone
            // unless --doc names one.
            let out_given = out.is_some();
            let out = out.unwrap_or_else(|| {
                PathBuf::from(if quick {
                    "lab/results-quick"
                } else {
                    "lab/results"
                })
            });
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            for &name in &names {
                match name {
                    "r0" => {
                        let mut p = crate::r0::Params::new(quick);
                        if !loss.is_empty() {
                            p.loss_pct = loss.clone();
                        }
                        if let Some(s) = seconds {
                            p.seconds = s;
                        }
                        p.congestion = congestion.clone();
                        p.reservoir_only = reservoir_only;
                        p.repeat = repeat;
                        p.rows = rows.clone();
                        crate::r0::run(p, quick, &out, command.clone())?;
                    }
                    "rtt" => {
                        let mut p = crate::rtt::Params::new(quick);
                        if !rtt.is_empty() {
                            p.rtt_ms = rtt.clone();
                        }
                        if let Some(s) = seconds {
                            p.seconds = s;
                        }
                        p.congestion = congestion.clone();
                        p.repeat = repeat;
                        p.rows = rows.clone();
                        crate::rtt::run(p, quick, &out, command.clone())?;
                    }
                    "r2" => {
                        let mut p = crate::r2::Params::new(quick);
                        if !rtt.is_empty() {
                            p.rtt_ms = rtt.iter().map(|&r| u64::from(r)).collect();
                        }
                        if let Some(s) = seconds {
                            p.link_seconds = s;
                        }
                        if let Some(n) = disk_servers {
                            p.disk_servers = n.max(1);
                        }
                        const ROWS: &[&str] = &[
                            "one",
                            "unpaced",
                            "static",
                            "reservoir",
                            "reservoir-rate",
                            "iperf3",
                            "gridftp",
                            "qemu-img",
                        ];
                        if let Some(r) = rows.iter().find(|r| !ROWS.contains(&r.as_str())) {
                            bail!("r2 has no row {r:?}; its rows: {}", ROWS.join(", "));
                        }
                        p.rows = rows.clone();
                        p.link_rate = link_rate.map(|r| r.bits_per_sec());
                        crate::r2::run(p, quick, &out, command.clone())?;
                        let r2_doc = match (&doc, no_doc, quick) {
                            (Some(d), _, _) => Some(d.with_file_name("lab-r2.md")),
                            (None, false, false) if !out_given && Path::new("docs").is_dir() => {
                                Some(PathBuf::from("docs/lab-r2.md"))
                            }
                            _ => None,
                        };
                        if let Some(d) = r2_doc {
                            crate::r2::write_doc(&out, &d)?;
                            eprintln!("lab: wrote {}", d.display());
                        }
                    }
                    "r3" => {
                        let mut p = crate::r3::Params::new(quick);
                        if let Some(s) = seconds {
                            for path in &mut p.paths {
                                path.seconds = s;
                            }
                        }
                        crate::r3::run(p, quick, &out, command.clone())?;
                        let r3_doc = match (&doc, no_doc, quick) {
                            (Some(d), _, _) => Some(d.with_file_name("lab-r3.md")),
                            (None, false, false) if !out_given && Path::new("docs").is_dir() => {
                                Some(PathBuf::from("docs/lab-r3.md"))
                            }
                            _ => None,
                        };
                        if let Some(d) = r3_doc {
                            crate::r3::write_doc(&out, &d)?;
                            eprintln!("lab: wrote {}", d.display());
                        }
                    }
                    "cuts" => {
                        let mut p = crate::cuts::Params::new(quick);
                        if !cut.is_empty() {
                            p.durations = cut.clone();
                        }
                        if let Some(n) = &link_name {
                            p.link_name = n.clone();
                        }
                        if let Some(o) = &down_opts {
                            p.down_opts = o.clone();
                        }
                        if let Some(s) = size {
                            p.size = s.max(1 << 20) & !((1 << 20) - 1);
                        }
                        if !case.is_empty() {
                            p.cases = case
                                .iter()
                                .map(|c| match c.split_once(':') {
                                    Some((f, e)) => Ok((f.to_owned(), e.to_owned())),
                                    None => bail!("--case {c}: expected TRANSFER:BREAK"),
                                })
                                .collect::<Result<_>>()?;
                        }
                        let r = crate::cuts::run(p, &out, command.clone())?;
                        print!("{}", crate::cuts::table(&r));
                        println!(
                            "loadavg before: {}  after: {}",
                            r.loadavg_before, r.loadavg_after
                        );
                        if !r.all_identical() {
                            bail!("not every case ended byte-identical (see the table)");
                        }
                    }
                    "r4" => {
                        let mut p = crate::r4::Params::new(quick);
                        if !delay.is_empty() {
                            p.delays_ms = delay.clone();
                        }
                        if !window.is_empty() {
                            p.windows = window
                                .iter()
                                .map(|w| crate::r4::parse_window(w))
                                .collect::<Result<_>>()?;
                        }
                        if let Some(s) = seconds {
                            p.timeout_s = s;
                        }
                        crate::r4::run(p, quick, &out, command.clone())?;
                        let r4_doc = match (&doc, no_doc, quick) {
                            // R4 alone writes the document --doc names (a window's own
                            // run beside the full one); with others, lab-r4.md beside theirs.
                            (Some(d), _, _) if names == ["r4"] => Some(d.clone()),
                            (Some(d), _, _) => Some(d.with_file_name("lab-r4.md")),
                            (None, false, false) if !out_given && Path::new("docs").is_dir() => {
                                Some(PathBuf::from("docs/lab-r4.md"))
                            }
                            _ => None,
                        };
                        if let Some(d) = r4_doc {
                            crate::r4::write_doc(&out, &d)?;
                            eprintln!("lab: wrote {}", d.display());
                        }
                    }
                    _ => {
                        let mut p = crate::r1::Params::new(quick);
                        p.congestion = congestion.clone();
                        p.repeat = repeat;
                        p.modes = rows.clone();
                        crate::r1::run(p, quick, &out, command.clone())?;
                    }
                }
                eprintln!("lab: {name} results in {}", out.display());
            }
            let doc = match (doc, no_doc, quick) {
                _ if names == ["r2"] || names == ["r3"] || names == ["r4"] || names == ["cuts"] => {
                    None
                }
                (Some(d), _, _) => Some(d),
                (None, false, false) if !out_given && Path::new("docs").is_dir() => {
                    Some(PathBuf::from("docs/lab-r0-r1.md"))
                }
                _ => None,
            };
            if let Some(d) = doc {
                crate::doc::write(&out, &d)?;
                eprintln!("lab: wrote {}", d.display());
            }
            Ok(())
        }
    }
}
