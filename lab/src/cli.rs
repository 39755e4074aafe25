//! `rsv-lab list/run/doc`: list and run the scenarios, regenerate the result documents.
//!
//! Each scenario is a subcommand of `run` with only its own flags: its `Args` lives in its
//! module and flattens the flags every run has ([`Common`]), those of a scenario with a
//! document ([`DocFlags`]) and, where rows repeat, [`Repeat`].

use crate::doc::Document;
use crate::proc;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Name the scenarios.
    List {
        /// One JSON array of {"name", "about"} instead of a line each.
        #[arg(long)]
        json: bool,
    },
    /// Run a scenario (`rsv-lab run SCENARIO --help`: its flags).
    Run {
        #[command(subcommand)]
        scenario: Scenario,
    },
    /// Rewrite result documents from results already on disk: with no arguments, every
    /// document in docs/ from its results under lab/results.
    Doc(DocArgs),
    /// The DR scenario's application, run by `run dr` inside a site's namespace.
    #[command(hide = true)]
    DrWriter(crate::dr::WriterArgs),
    /// The DR scenario's file-system application (`run dr --app ext4`), run against the
    /// file system mounted at the primary site.
    #[command(hide = true)]
    DrFsWriter(crate::drfs::FsWriterArgs),
}

/// The scenarios; `rsv-lab list` prints their names and first lines.
// Parsed once per process: the sizes of the variants do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Scenario {
    /// R0: backup writes/reads over 100 Mbit/s, 100 ms RTT, loss 0.001-5 %: study's before vs
    /// tuned (2b), Reservoir default, qemu-img into tgt and Reservoir, iperf3 CUBIC/BBR
    R0(crate::r0::Args),
    /// R1: 4 concurrent image backups into one 250 Mbit/s bottleneck with a shallow queue:
    /// unpaced CUBIC, unpaced BBR, paced to 1/4 each; per-stream, total, link use, Jain
    R1(crate::r1::Args),
    /// R2: Data Reservoir: a volume striped over N disk servers per site copied disk server
    /// to disk server at 350 and 200 ms: one stream, N unpaced, N paced to 1/N, Reservoir's
    /// cooperative pacing, iperf3 -P N, GridFTP -p N, qemu-img; per-stream throughput over
    /// time
    R2(crate::r2::Args),
    /// R3: secure transport: 1 MiB sequential reads and writes on loopback, over 1 Gbit/s
    /// 1 ms and R0's link: Reservoir plaintext and TLS 1.3 (each suite), tgt plaintext and
    /// behind stunnel; throughput, CPU s/GB each side, sender bursts, plaintext/TLS timeline
    R3(crate::r3::Args),
    /// R4: a media server reading a file in 32 KiB calls over 100 Mbit/s with 0-24 ms added
    /// each way, receive windows 64K/128K/default: Reservoir's initiator (ext4 read
    /// in-process) against Samba (smbclient); start-of-stream latency through rsv media
    R4(crate::r4::Args),
    /// Cut links and restarted targets mid-copy: rsv cp (to the LUN and back, ERL 2 and 0)
    /// and rsv sync over R0's link, the link cut or the target SIGKILLed for 5, 30, 120 s;
    /// each must end byte-identical, at once or resumed (not part of `all`)
    Cuts(crate::cuts::Args),
    /// Login time and first 4 KiB read across the link at a few RTTs (1-200 ms, 100
    /// Mbit/s): fresh rsv processes against null LUNs, in round trips over a process's start
    /// (not part of `all`)
    Login(crate::login::Args),
    /// DR: failovers of a striped volume replicated continuously (rsv sync --every) over
    /// 350 ms at 800 Mbit/s: the primary site killed at random moments, the far copy
    /// promoted and checked for a prefix of the application's writes, the old site
    /// resynced; RPO, write latency, barrier hold, resync bytes (not part of `all`)
    Dr(crate::dr::Args),
    /// RTT sweep 1-300 ms at 500 Mbit/s, no loss: iperf3 BBR and Reservoir's defaults
    /// writing and reading, as a share of the link
    Rtt(crate::rtt::Args),
    /// Every scenario but cuts, each with its own defaults (r0, r1, r2, r3, r4, rtt)
    All(AllArgs),
}

/// The flags every run has.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// A short version (about a minute a scenario): one point, small sizes.
    #[arg(long)]
    pub quick: bool,
    /// Where results go (default lab/results, with --quick lab/results-quick); with --out
    /// the documents in docs/ are left alone unless --doc names one.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl Common {
    pub fn out_dir(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            PathBuf::from(if self.quick {
                "lab/results-quick"
            } else {
                "lab/results"
            })
        })
    }
}

/// The flags of a scenario with a result document.
#[derive(Args, Debug, Clone)]
pub struct DocFlags {
    /// Rewrite this result document (default: the scenario's own in docs/, unless --quick or
    /// --out).
    #[arg(long)]
    pub doc: Option<PathBuf>,
    /// Do not touch the result document.
    #[arg(long, conflicts_with = "doc")]
    pub no_doc: bool,
}

impl DocFlags {
    /// The document a run rewrites: the one --doc names, else the committed one
    /// (`docs/NAME`) for a full run into the committed results, else none.
    fn target(&self, common: &Common, document: Document) -> Option<(PathBuf, Document)> {
        let path = match &self.doc {
            Some(d) => d.clone(),
            None if self.no_doc || common.quick || common.out.is_some() => return None,
            None if Path::new("docs").is_dir() => Path::new("docs").join(document.file()),
            None => return None,
        };
        Some((path, document))
    }
}

/// `--repeat`, for the scenarios whose rows repeat (r0, r1, r2, rtt).
#[derive(Args, Debug, Clone)]
pub struct Repeat {
    /// Run each of Reservoir's rows (r1: each mode) this many times, interleaved; the
    /// results give the median and the range (min-max) and the plots the median. The peers
    /// (iperf3, qemu-img, tgt) run once a point.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
}

/// The flags of a scenario with a result document (r3, r4).
#[derive(Args, Debug, Clone)]
pub struct Documented {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub doc: DocFlags,
}

/// The flags of a scenario with a result document and rows that repeat (r0, r1, r2, rtt).
#[derive(Args, Debug, Clone)]
pub struct Repeated {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub doc: DocFlags,
    #[command(flatten)]
    pub repeat: Repeat,
}

/// The values a list flag was given, or the scenario's own where it was not given.
pub fn given_or<T: Clone>(given: &[T], own: Vec<T>) -> Vec<T> {
    if given.is_empty() {
        own
    } else {
        given.to_vec()
    }
}

/// `rsv-lab run all`: only the flags every scenario shares, and `--repeat` for those whose
/// rows repeat.
#[derive(Args, Debug, Clone)]
pub struct AllArgs {
    #[command(flatten)]
    pub common: Common,
    /// Run Reservoir's rows of r0, r1, r2 and rtt this many times each, interleaved (the
    /// committed results: 3); r3 and r4 run once.
    #[command(flatten)]
    pub repeat: Repeat,
    /// Rewrite this R0/R1 document, and the others beside it by their own names
    /// (lab-r2.md, lab-r3.md, lab-r4.md).
    #[arg(long)]
    pub doc: Option<PathBuf>,
    /// Do not touch the result documents.
    #[arg(long, conflicts_with = "doc")]
    pub no_doc: bool,
}

#[derive(Args, Debug)]
pub struct DocArgs {
    /// Which document (all of the committed ones when none is named).
    #[arg(value_enum, requires = "out")]
    pub document: Option<Document>,
    /// The results it is drawn from (default lab/results).
    #[arg(long, requires = "document")]
    pub results: Option<PathBuf>,
    /// The document written.
    #[arg(long, requires = "document")]
    pub out: Option<PathBuf>,
}

/// The scenarios by name, with the first line of their help.
fn scenarios() -> Vec<(String, String)> {
    Scenario::augment_subcommands(clap::Command::new("run"))
        .get_subcommands()
        .filter(|c| c.get_name() != "all")
        .map(|c| {
            let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
            (c.get_name().to_owned(), about)
        })
        .collect()
}

pub fn run(command: LabCommand) -> Result<()> {
    match command {
        LabCommand::List { json: false } => {
            for (name, about) in scenarios() {
                println!("{name}  {about}");
            }
            Ok(())
        }
        LabCommand::List { json: true } => {
            let list: Vec<serde_json::Value> = scenarios()
                .into_iter()
                .map(|(name, about)| serde_json::json!({ "name": name, "about": about }))
                .collect();
            println!("{}", serde_json::Value::from(list));
            Ok(())
        }
        LabCommand::Doc(DocArgs {
            document,
            results,
            out,
        }) => match (document, out) {
            (Some(d), Some(out)) => d.write(&results.unwrap_or_else(|| "lab/results".into()), &out),
            _ => crate::doc::write_committed(),
        },
        LabCommand::DrWriter(a) => crate::dr::writer(a),
        LabCommand::DrFsWriter(a) => crate::drfs::fs_writer(a),
        LabCommand::Run { scenario } => {
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
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            run_scenario(scenario, &command)
        }
    }
}

fn run_scenario(scenario: Scenario, command: &str) -> Result<()> {
    let command = command.to_owned();
    // The results' directory and the document to rewrite, if any.
    let (out, doc) = match scenario {
        Scenario::R0(a) => {
            let out = a.flags.common.out_dir();
            crate::r0::run(a.params(), a.flags.common.quick, &out, command)?;
            (out, a.flags.doc.target(&a.flags.common, Document::R0R1))
        }
        Scenario::R1(a) => {
            let out = a.flags.common.out_dir();
            crate::r1::run(a.params(), a.flags.common.quick, &out, command)?;
            (out, a.flags.doc.target(&a.flags.common, Document::R0R1))
        }
        Scenario::Rtt(a) => {
            let out = a.flags.common.out_dir();
            crate::rtt::run(a.params(), a.flags.common.quick, &out, command)?;
            (out, a.flags.doc.target(&a.flags.common, Document::R0R1))
        }
        Scenario::R2(a) => {
            let out = a.flags.common.out_dir();
            crate::r2::run(a.params()?, a.flags.common.quick, &out, command)?;
            (out, a.flags.doc.target(&a.flags.common, Document::R2))
        }
        Scenario::R3(a) => {
            let out = a.flags.common.out_dir();
            crate::r3::run(a.params(), a.flags.common.quick, &out, command)?;
            (out, a.flags.doc.target(&a.flags.common, Document::R3))
        }
        Scenario::R4(a) => {
            let out = a.flags.common.out_dir();
            crate::r4::run(a.params()?, a.flags.common.quick, &out, command)?;
            (out, a.flags.doc.target(&a.flags.common, Document::R4))
        }
        Scenario::Cuts(a) => {
            let out = a.common.out_dir();
            let r = crate::cuts::run(a.params()?, &out, command)?;
            print!("{}", crate::cuts::table(&r));
            println!(
                "loadavg before: {}  after: {}",
                r.loadavg_before, r.loadavg_after
            );
            if !r.all_identical() {
                bail!("not every case ended byte-identical (see the table)");
            }
            (out, None)
        }
        Scenario::Login(a) => {
            let out = a.common.out_dir();
            crate::login::run(a.params(), a.common.quick, &out, command)?;
            (out, None)
        }
        Scenario::Dr(a) => {
            // Its results have a directory of their own (lab/results/dr).
            let quick = a.flags.common.quick;
            // The ext4 application's results and document sit beside the stamps' own.
            let ext4 = a.app == crate::dr::App::Ext4;
            let out = a.flags.common.out.clone().unwrap_or_else(|| {
                PathBuf::from(if quick {
                    "lab/results-quick"
                } else if ext4 {
                    "lab/results/dr-ext4"
                } else {
                    "lab/results/dr"
                })
            });
            let r = crate::dr::run(a.params()?, quick, &out, command)?;
            let doc =
                a.flags
                    .doc
                    .target(&a.flags.common, Document::Dr)
                    .map(|(d, document)| match (ext4, &a.flags.doc.doc) {
                        (true, None) => (d.with_file_name("lab-dr-ext4.md"), document),
                        _ => (d, document),
                    });
            if let Some((d, document)) = &doc {
                document.write(&out, d)?;
                eprintln!("lab: wrote {}", d.display());
            }
            eprintln!("lab: results in {}", out.display());
            let bad = r.violations();
            if bad > 0 {
                bail!("{bad} failover(s) left a far copy of no single moment, or one that failed its check (see the rounds)");
            }
            let failed = r
                .configs
                .iter()
                .flat_map(|c| &c.rounds)
                .filter(|x| !x.error.is_empty())
                .count();
            if failed > 0 {
                bail!("{failed} round(s) could not finish (see the rounds)");
            }
            return Ok(());
        }
        Scenario::All(a) => return run_all(a, &command),
    };
    eprintln!("lab: results in {}", out.display());
    if let Some((d, document)) = doc {
        document.write(&out, &d)?;
        eprintln!("lab: wrote {}", d.display());
    }
    Ok(())
}

/// Every scenario but cuts with its defaults; the documents last, each beside --doc by its
/// own name.
fn run_all(a: AllArgs, command: &str) -> Result<()> {
    let (quick, out) = (a.common.quick, a.common.out_dir());
    let command = || command.to_owned();
    let repeat = a.repeat.repeat;
    let (mut r0, mut r1, mut r2, mut rtt) = (
        crate::r0::Params::new(quick),
        crate::r1::Params::new(quick),
        crate::r2::Params::new(quick),
        crate::rtt::Params::new(quick),
    );
    (r0.repeat, r1.repeat, r2.repeat, rtt.repeat) = (repeat, repeat, repeat, repeat);
    crate::r0::run(r0, quick, &out, command())?;
    crate::r1::run(r1, quick, &out, command())?;
    crate::r2::run(r2, quick, &out, command())?;
    crate::r3::run(crate::r3::Params::new(quick), quick, &out, command())?;
    crate::r4::run(crate::r4::Params::new(quick), quick, &out, command())?;
    crate::rtt::run(rtt, quick, &out, command())?;
    eprintln!("lab: results in {}", out.display());
    let flags = DocFlags {
        doc: a.doc,
        no_doc: a.no_doc,
    };
    for document in [Document::R2, Document::R3, Document::R4, Document::R0R1] {
        let Some((d, _)) = flags.target(&a.common, document) else {
            continue;
        };
        let d = match document {
            Document::R0R1 => d,
            _ => d.with_file_name(document.file()),
        };
        document.write(&out, &d)?;
        eprintln!("lab: wrote {}", d.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: LabCommand,
    }

    fn scenario(args: &str) -> Result<Scenario, clap::Error> {
        let args = std::iter::once("rsv-lab").chain(args.split_whitespace());
        match Cli::try_parse_from(args)?.command {
            LabCommand::Run { scenario } => Ok(scenario),
            other => panic!("not a run: {other:?}"),
        }
    }

    #[test]
    fn a_scenarios_flags_reach_its_parameters() {
        let Scenario::R0(a) =
            scenario("run r0 --loss 1,5 --seconds 10 --rows reservoir --repeat 2").unwrap()
        else {
            panic!("not r0");
        };
        let p = a.params();
        assert_eq!(
            (p.loss_pct, p.seconds, p.rows, p.repeat),
            (vec![1.0, 5.0], 10, vec!["reservoir".to_owned()], 2)
        );
        let Scenario::R2(a) = scenario("run r2 --rtt 350 --rows reservoir --repeat 3").unwrap()
        else {
            panic!("not r2");
        };
        let p = a.params().unwrap();
        assert_eq!(
            (p.rtt_ms, p.rows, p.repeat),
            (vec![350], vec!["reservoir".to_owned()], 3)
        );
        let Scenario::All(a) = scenario("run all --repeat 3").unwrap() else {
            panic!("not all");
        };
        assert_eq!(a.repeat.repeat, 3);
        // Flags not given leave the scenario's own (here the quick version's).
        let Scenario::R4(a) = scenario("run r4 --quick --window default").unwrap() else {
            panic!("not r4");
        };
        let p = a.params().unwrap();
        assert_eq!((p.delays_ms, p.windows), (vec![4], vec![None]));
        let Scenario::Login(a) = scenario("run login --quick --rtt 100").unwrap() else {
            panic!("not login");
        };
        let p = a.params();
        assert_eq!((p.rtt_ms, p.tries), (vec![100], 3));
        let Scenario::Dr(a) =
            scenario("run dr --quick --failovers 3 --app-share 30,70 --rtt 100 --interval 2s")
                .unwrap()
        else {
            panic!("not dr");
        };
        let p = a.params().unwrap();
        assert_eq!(
            (
                p.failovers,
                p.app_shares,
                p.rtt_ms,
                p.interval_ms,
                p.disk_servers
            ),
            (3, vec![0.3, 0.7], 100, 2000, 2)
        );
        assert_eq!(p.app, crate::dr::App::Stamps);
        let Scenario::Dr(a) = scenario("run dr --app ext4 --outage 0s").unwrap() else {
            panic!("not dr");
        };
        let p = a.params().unwrap();
        assert_eq!((p.app, p.outage_s), (crate::dr::App::Ext4, 0.0));
        assert!(scenario("run dr --app zfs").is_err());
    }

    #[test]
    fn another_scenarios_flags_are_refused() {
        for wrong in [
            "run r0 --window 64K",
            "run r4 --loss 1",
            "run r3 --repeat 2",
            "run cuts --doc docs/x.md",
            "run all --loss 1",
            "run r2 --rows before",
            "run login --repeat 2",
            "run login --doc docs/x.md",
            "run dr --rows one",
            "run dr --repeat 2",
            "run dr --app-share 0",
        ] {
            assert!(scenario(wrong).is_err(), "{wrong} was taken");
        }
    }
}
