//! Login: how long a session takes to start across the emulated link, and to bring back
//! its first 4 KiB, at a few round-trip times. Each try is a fresh process in the
//! initiator's namespace, timed from its start to its exit: `rsv --version` (the cost of
//! starting a process there, no network), `rsv inq` (TCP, login, INQUIRY and its VPD
//! pages, READ CAPACITY, logout) and `rsv cp` of a 4 KiB LUN (the same and one READ). The
//! target's LUNs are `null` stores: no disk under the figures.

use crate::env::Environment;
use crate::peers::{rsv_target, ISCSI_PORT};
use crate::proc::{self, check_interrupt, in_ns, rsv_bin, Link};
use crate::r0::IQN;
use crate::stats::Spread;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    pub rate: String,
    pub rtt_ms: Vec<u32>,
    /// Fresh processes per step at each RTT.
    pub tries: u32,
}

/// `rsv-lab run login`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::cli::Common,
    /// Only these round-trip times, in milliseconds (e.g. 10,100).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rtt: Vec<u32>,
    /// Tries of each step at each RTT instead of 10 (--quick 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub tries: Option<u32>,
}

impl Args {
    pub fn params(&self) -> Params {
        let mut p = Params::new(self.common.quick);
        p.rtt_ms = crate::cli::given_or(&self.rtt, p.rtt_ms);
        p.tries = self.tries.unwrap_or(p.tries);
        p
    }
}

impl Params {
    pub fn new(quick: bool) -> Params {
        Params {
            rate: "100mbit".into(),
            rtt_ms: if quick {
                vec![10, 50]
            } else {
                vec![1, 10, 50, 100, 200]
            },
            tries: if quick { 3 } else { 10 },
        }
    }
}

/// The steps timed, in the order they run at each RTT.
pub const STEPS: [&str; 3] = ["start", "inq", "read4k"];

/// One timed process.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Try {
    pub rtt_ms: u32,
    /// One of [`STEPS`].
    pub step: String,
    pub try_no: u32,
    /// From the process's start to its exit.
    pub ms: f64,
    pub ok: bool,
    pub error: String,
}

/// One step at one RTT over its tries.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Summary {
    pub rtt_ms: u32,
    pub step: String,
    /// The successful tries' times.
    pub ms: Option<Spread>,
    /// The median less the median of `start` (the process's own cost), in round trips.
    pub rtts_over_start: Option<f64>,
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    pub scenario: String,
    pub quick: bool,
    pub command: String,
    pub params: Params,
    pub environment: Environment,
    pub tries: Vec<Try>,
    pub summary: Vec<Summary>,
}

/// Target configuration: LUN 0 large enough to look like a disk, LUN 1 exactly the 4 KiB
/// the read step copies; both without data.
fn target_toml() -> String {
    format!(
        "[[target]]\niqn = \"{IQN}\"\n\
         [[target.lun]]\nid = 0\nstore = \"null:?size=1GiB\"\n\
         [[target.lun]]\nid = 1\nstore = \"null:?size=4KiB\"\n"
    )
}

/// Runs `cmd` to its exit (at most 60 s, by `timeout`), timed from just before the spawn
/// to the exit: what a person waits.
fn timed(mut cmd: Command) -> Result<(f64, std::process::Output)> {
    cmd.stdin(Stdio::null());
    let start = Instant::now();
    let out = cmd.output()?;
    Ok((start.elapsed().as_secs_f64() * 1e3, out))
}

fn step_command(ns: &str, step: &str, base: &str, dest: &Path) -> Command {
    let mut c = in_ns(ns, "timeout");
    c.arg("60").arg(rsv_bin());
    match step {
        "start" => {
            c.arg("--version");
        }
        "inq" => {
            c.args(["inq", &format!("{base}/0"), "--json"]);
        }
        _ => {
            c.args(["cp", &format!("{base}/1")]).arg(dest).args([
                "--io-size",
                "4096",
                "--progress",
                "none",
            ]);
        }
    }
    c
}

pub fn run(params: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    if params.rtt_ms.is_empty() {
        bail!("login needs at least one RTT");
    }
    let environment = crate::env::collect();
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "login")?;
    let dir = &scratch.0;
    let link = Link::up(
        "llogin",
        &[
            "--rtt".into(),
            format!("{}ms", params.rtt_ms[0]),
            "--rate".into(),
            params.rate.clone(),
        ],
        1,
    )?;
    let (a, b) = (&link.a[0], &link.b[0]);
    let mut target = rsv_target(&b.ns, b.addr, &target_toml(), dir, "login")?;
    let base = format!("iscsi://{}:{ISCSI_PORT}/{IQN}", b.addr);
    let dest = dir.join("first-4k");
    let mut tries = Vec::new();
    for &rtt in &params.rtt_ms {
        check_interrupt()?;
        link.set(&["--rtt".into(), format!("{rtt}ms")])?;
        eprintln!("login: rtt {rtt} ms");
        for try_no in 1..=params.tries {
            for step in STEPS {
                check_interrupt()?;
                let _ = std::fs::remove_file(&dest);
                let (ms, o) = timed(step_command(&a.ns, step, &base, &dest))?;
                let mut error = String::new();
                if !o.status.success() {
                    error = format!(
                        "exit {}: {}",
                        o.status,
                        proc::tail(String::from_utf8_lossy(&o.stderr).trim(), 300)
                    );
                } else if step == "read4k" {
                    let got = std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
                    if got != 4096 {
                        error = format!("copied {got} bytes, not 4096");
                    }
                }
                // A CSV cell: no commas or line breaks.
                let error = error.replace([',', '\n'], ";");
                eprintln!(
                    "  {step:<7} try {try_no}: {ms:>8.1} ms{}",
                    if error.is_empty() {
                        String::new()
                    } else {
                        format!("  {error}")
                    }
                );
                tries.push(Try {
                    rtt_ms: rtt,
                    step: step.into(),
                    try_no,
                    ms,
                    ok: error.is_empty(),
                    error,
                });
            }
        }
    }
    if !target.alive() {
        bail!(
            "rsv target exited during the run:\n{}",
            proc::tail(&target.log_text(), 2000)
        );
    }
    target.stop();
    drop(link);
    let summary = summarize(&params, &tries);
    for s in &summary {
        eprintln!(
            "login: rtt {:>4} ms {:<7} {} ({} round trips over start)",
            s.rtt_ms,
            s.step,
            s.ms.as_ref().map_or("—".into(), |m| m.show(1, " ms")),
            s.rtts_over_start.map_or("—".into(), |r| format!("{r:.1}"))
        );
    }
    let results = Results {
        scenario: "login".into(),
        quick,
        command,
        params,
        environment,
        tries,
        summary,
    };
    crate::results::save(out, "login.json", &results)?;
    let mut csv = String::from("scenario,rtt_ms,step,try,ms,ok,error\n");
    for t in &results.tries {
        csv += &format!(
            "login,{},{},{},{:.3},{},{}\n",
            t.rtt_ms, t.step, t.try_no, t.ms, t.ok, t.error
        );
    }
    std::fs::write(out.join("login.csv"), csv)?;
    Ok(results)
}

/// Each step at each RTT over its successful tries.
fn summarize(params: &Params, tries: &[Try]) -> Vec<Summary> {
    let mut out = Vec::new();
    for &rtt in &params.rtt_ms {
        let spread = |step: &str| {
            Spread::of(
                tries
                    .iter()
                    .filter(|t| t.rtt_ms == rtt && t.step == step && t.ok)
                    .map(|t| t.ms),
            )
        };
        let start = spread("start");
        for step in STEPS {
            let ms = spread(step);
            let rtts_over_start = match (&ms, &start) {
                (Some(m), Some(s)) if step != "start" => {
                    Some((m.median - s.median) / f64::from(rtt))
                }
                _ => None,
            };
            out.push(Summary {
                rtt_ms: rtt,
                step: step.into(),
                ms,
                rtts_over_start,
            });
        }
    }
    out
}

/// The results read back: by the test of committed results (no document draws on them yet).
#[cfg(test)]
pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "login.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_round_trips_over_the_process_start() {
        let p = Params {
            rate: "100mbit".into(),
            rtt_ms: vec![10],
            tries: 2,
        };
        let t = |step: &str, ms: f64, ok: bool| Try {
            rtt_ms: 10,
            step: step.into(),
            try_no: 1,
            ms,
            ok,
            error: String::new(),
        };
        let tries = [
            t("start", 4.0, true),
            t("start", 6.0, true),
            t("inq", 45.0, true),
            t("inq", 55.0, true),
            // A failed try counts for nothing.
            t("read4k", 1.0, false),
            t("read4k", 75.0, true),
        ];
        let s = summarize(&p, &tries);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].rtts_over_start, None);
        assert_eq!(s[1].ms.as_ref().unwrap().median, 50.0);
        assert_eq!(s[1].rtts_over_start, Some(4.5));
        assert_eq!(s[2].ms.as_ref().unwrap().n, 1);
        assert_eq!(s[2].rtts_over_start, Some(7.0));
    }
}
