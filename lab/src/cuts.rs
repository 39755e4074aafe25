//! `rsv-lab run cuts`: cut links and restarted targets in the middle of a copy.
//!
//! Over one emulated link (R0's by default: 100 Mbit/s, 100 ms RTT, 1 % loss), each case
//! starts a transfer from site A, breaks it once a quarter has arrived, and mends it:
//! - **cut**: the link drops every packet (`rsv-lab wan set --loss 100%`) for D seconds, then
//!   carries them again;
//! - **restart**: the target across the link is killed with SIGKILL, stays down D seconds
//!   and is started again on the same store;
//! - **down** (`rsv cp` only): the link is cut for good, as far as the command can tell: it
//!   is mended only once the command has ended on its own, which must be exit 4 with a
//!   resumable state (or, past the time limit, the case is `hung`); the resume then runs
//!   over the mended link. The time from the cut to that exit is the bound the initiator
//!   keeps on a link that does not come back (`recovery_timeout` and the others, given
//!   with `--down-opts`).
//!
//! The transfers: `rsv cp` from a file to the remote LUN (`put`) and back (`get`), at
//! ErrorRecoveryLevel 2 and 0, and `rsv sync` from a target in A to one in B (the
//! coordinator in A). Each case must end with the destination byte-identical to the
//! source: at once (`identical`), or after the command exited with a resumable state
//! (`rsv cp` exit 4 and its `copied_prefix_bytes`; `rsv sync` exit 1 and its `--state`)
//! and the same transfer was resumed once (`resumed-identical`). Anything else is reported
//! as it happened: an error, a destination that differs (`DIFFERENT`: silently wrong),
//! or a command still running at the case's time limit (`hung`).
//!
//! Per case: the time from the mend (link back, target ready) to the first progress
//! after it, and the bytes that crossed the link in the data's direction beyond what the
//! same transfer without a break carried (measured once per transfer in the same run).

use crate::proc::{self, in_ns, rsv_bin, sysctl, Link, Proc};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::File;
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.reservoir:cuts";
const ISCSI_PORT: u16 = 3260;
const CONTROL_PORT: u16 = 3262;

/// The transfers a case breaks.
pub const FLOWS: &[&str] = &[
    "cp-put-erl2",
    "cp-get-erl2",
    "cp-put-erl0",
    "cp-get-erl0",
    "sync",
];
pub const EVENTS: &[&str] = &["cut", "restart", "down"];

/// `rsv-lab run cuts`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: crate::cli::Common,
    /// How long each break lasts, in seconds (default 5,30,120; --quick 4).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub cut: Vec<u64>,
    /// Only these cases, TRANSFER:BREAK (cp-put-erl2, cp-get-erl2, cp-put-erl0,
    /// cp-get-erl0, sync; cut, restart, and for cp down: the link cut until the copy gives
    /// up), e.g. cp-put-erl0:cut,sync:restart,cp-get-erl2:down.
    #[arg(long, value_delimiter = ',')]
    pub case: Vec<String>,
    /// Bytes each transfer moves, whole MiB (default 64M; --quick 32M).
    #[arg(long, value_parser = units::parse_size)]
    pub size: Option<u64>,
    /// The emulated link's name (default rel-cuts, --quick rel-cq), so that two runs can go
    /// side by side.
    #[arg(long)]
    pub link_name: Option<String>,
    /// URL options of the copies a `down` case breaks, e.g.
    /// recovery_timeout=10&command_timeout=10 (default: none, i.e. the defaults; --quick:
    /// recovery_timeout=5&command_timeout=5&nop_interval=2).
    #[arg(long)]
    pub down_opts: Option<String>,
}

impl Args {
    pub fn params(&self) -> Result<Params> {
        let mut p = Params::new(self.common.quick);
        p.durations = crate::cli::given_or(&self.cut, p.durations);
        p.link_name = self.link_name.clone().unwrap_or(p.link_name);
        p.down_opts = self.down_opts.clone().unwrap_or(p.down_opts);
        if let Some(s) = self.size {
            p.size = s.max(1 << 20) & !((1 << 20) - 1);
        }
        if !self.case.is_empty() {
            p.cases = self
                .case
                .iter()
                .map(|c| match c.split_once(':') {
                    Some((f, e)) => Ok((f.to_owned(), e.to_owned())),
                    None => bail!("--case {c}: expected TRANSFER:BREAK"),
                })
                .collect::<Result<_>>()?;
        }
        Ok(p)
    }
}

pub struct Params {
    pub link_name: String,
    pub rate: String,
    pub rtt: String,
    pub loss: String,
    /// Bytes each transfer moves.
    pub size: u64,
    /// How long each break lasts, seconds.
    pub durations: Vec<u64>,
    /// (flow, event) pairs to run, each at every duration.
    pub cases: Vec<(String, String)>,
    /// A case's command gets this long past the break before it counts as hung.
    pub grace: Duration,
    /// URL options (`recovery_timeout=10&command_timeout=10`) of the `rsv cp` commands of
    /// `down` cases: how soon they must give up.
    pub down_opts: String,
}

impl Params {
    pub fn new(quick: bool) -> Params {
        let all = || {
            FLOWS
                .iter()
                .flat_map(|f| EVENTS.iter().map(|e| (f.to_string(), e.to_string())))
                .collect::<Vec<(String, String)>>()
        };
        if quick {
            // The short version CI runs: a quick link, short breaks, small copies.
            Params {
                link_name: "rel-cq".into(),
                rate: "100mbit".into(),
                rtt: "10ms".into(),
                loss: "0".into(),
                size: 32 << 20,
                durations: vec![4],
                cases: [
                    ("cp-put-erl2", "cut"),
                    ("cp-put-erl0", "cut"),
                    ("cp-put-erl2", "restart"),
                    ("cp-get-erl0", "restart"),
                    ("sync", "cut"),
                    ("cp-put-erl2", "down"),
                    ("cp-get-erl0", "down"),
                ]
                .iter()
                .map(|(f, e)| (f.to_string(), e.to_string()))
                .collect(),
                grace: Duration::from_secs(150),
                // Short limits: a link that does not come back ends the copy in well under
                // a minute instead of about two.
                down_opts: "recovery_timeout=5&command_timeout=5&nop_interval=2".into(),
            }
        } else {
            Params {
                link_name: "rel-cuts".into(),
                rate: "100mbit".into(),
                rtt: "100ms".into(),
                loss: "1%".into(),
                size: 64 << 20,
                durations: vec![5, 30, 120],
                // `down` only where asked for (--case): it measures the bound, once.
                cases: all()
                    .into_iter()
                    .filter(|(_, e): &(String, String)| e != "down")
                    .collect(),
                grace: Duration::from_secs(300),
                down_opts: String::new(),
            }
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct CaseResult {
    pub flow: String,
    pub event: String,
    pub break_s: u64,
    /// identical, resumed-identical, DIFFERENT, hung, error
    pub outcome: String,
    /// The first command's exit status and, when it failed, its last words.
    pub first_exit: Option<i32>,
    /// Seconds from the break to the first command's end.
    pub first_end_s: f64,
    pub error: String,
    /// From the mend (link back, target ready) to the first progress after it.
    pub recover_s: Option<f64>,
    /// Seconds from the first command's start to the transfer's end (resume included).
    pub total_s: f64,
    /// Bytes that crossed the link in the data's direction, and beyond the same transfer
    /// without a break.
    pub wire_bytes: u64,
    pub extra_wire_bytes: i64,
    /// Resumed from this offset (cp); 0 for a sync run again (from its `--state`).
    pub resumed_from: Option<u64>,
    pub retries: Option<u64>,
    pub reassigned_tasks: Option<u64>,
    pub reinstatements: Option<u64>,
    pub reconnections: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Results {
    pub command: String,
    pub link: String,
    pub size: u64,
    pub loadavg_before: String,
    pub loadavg_after: String,
    pub baseline_wire_bytes: Vec<(String, u64)>,
    pub cases: Vec<CaseResult>,
    pub environment: crate::env::Environment,
}

impl Results {
    pub fn all_identical(&self) -> bool {
        self.cases.iter().all(|c| c.outcome.ends_with("identical"))
    }
}

/// Everything a run shares: the link, its hosts, the scratch directory and key.
struct Lab<'a> {
    p: &'a Params,
    link: Link,
    dir: PathBuf,
    key: PathBuf,
    a: (String, Ipv4Addr),
    b: (String, Ipv4Addr),
    seq: std::cell::Cell<u32>,
}

/// A target of the lab that can be SIGKILLed and started again on its store.
struct Target {
    proc: Option<Proc>,
    ns: String,
    addr: Ipv4Addr,
    config: PathBuf,
    tag: String,
    starts: u32,
}

impl Target {
    fn start(lab: &Lab, host: &(String, Ipv4Addr), store: &Path, tag: &str) -> Result<Target> {
        let config = lab.dir.join(format!("{tag}.toml"));
        std::fs::write(
            &config,
            format!(
                "portals = [\"{addr}:{ISCSI_PORT}\"]\ndata_dir = \"{dir}\"\n[control]\n\
                 listen = \"{addr}:{CONTROL_PORT}\"\nkey_file = \"{key}\"\n[[target]]\n\
                 iqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nstore = \"file:{store}\"\n",
                addr = host.1,
                dir = lab.dir.join(format!("{tag}-data")).display(),
                key = lab.key.display(),
                store = store.display()
            ),
        )?;
        let mut t = Target {
            proc: None,
            ns: host.0.clone(),
            addr: host.1,
            config,
            tag: tag.to_owned(),
            starts: 0,
        };
        t.up()?;
        Ok(t)
    }

    fn up(&mut self) -> Result<()> {
        self.starts += 1;
        let mut cmd = in_ns(&self.ns, rsv_bin());
        cmd.arg("target")
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn");
        let log = self
            .config
            .with_file_name(format!("{}-{}.log", self.tag, self.starts));
        let mut p = Proc::spawn(cmd, "rsv target", &log)?;
        p.wait_log(Duration::from_secs(30), |l| {
            l.lines().any(|x| x.trim() == "ready")
        })
        .with_context(|| format!("rsv target on {}", self.addr))?;
        self.proc = Some(p);
        Ok(())
    }

    fn sigkill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.sigkill();
        }
    }
}

/// The last progress figure a command printed: `bytes` of `rsv cp --progress json` (on
/// stderr), `done_bytes` of `rsv sync --json` (on stdout).
fn progress_of(path: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v[key].as_u64())
        .unwrap_or(0)
}

/// Compares two files byte for byte; the first offset where they differ, if any.
fn first_difference(a: &Path, b: &Path, len: u64) -> Result<Option<u64>> {
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(ba.len() as u64) as usize;
        fa.read_exact(&mut ba[..n])
            .with_context(|| format!("reading {}", a.display()))?;
        fb.read_exact(&mut bb[..n])
            .with_context(|| format!("reading {}", b.display()))?;
        if ba[..n] != bb[..n] {
            let i = ba[..n].iter().zip(&bb[..n]).position(|(x, y)| x != y);
            return Ok(Some(off + i.unwrap_or(0) as u64));
        }
        off += n as u64;
    }
    Ok(None)
}

/// One command of a case, running in the background with its output in files.
struct Running {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Running {
    fn spawn(mut cmd: Command, dir: &Path, n: u32) -> Result<Running> {
        let (child, out, err) = proc::spawn_to_files(&mut cmd, dir, &format!("cmd{n}"))?;
        Ok(Running { child, out, err })
    }

    /// Waits for the end until `deadline`; None when it had to be killed.
    fn wait_until(&mut self, deadline: Instant, mut tick: impl FnMut()) -> Result<Option<i32>> {
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st.code().unwrap_or(-1)));
            }
            if Instant::now() > deadline || proc::check_interrupt().is_err() {
                let _ = self.child.kill();
                let _ = self.child.wait();
                proc::check_interrupt()?;
                return Ok(None);
            }
            tick();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sleeps `d`, watching the command: when it ended meanwhile (a copy that gave up
    /// while the link was still cut), the moment it was first seen ended.
    fn sleep_watching(&mut self, d: Duration) -> Result<Option<Instant>> {
        let end = Instant::now() + d;
        let mut ended = None;
        while Instant::now() < end {
            if ended.is_none() && self.child.try_wait()?.is_some() {
                ended = Some(Instant::now());
            }
            proc::sleep((end - Instant::now()).min(Duration::from_millis(100)))?;
        }
        Ok(ended)
    }

    fn stderr_tail(&self) -> String {
        let e = std::fs::read_to_string(&self.err).unwrap_or_default();
        // A Rust tool's error comes before its backtrace (RUST_BACKTRACE=1).
        let e = e.split("\nStack backtrace:").next().unwrap_or("");
        let lines: Vec<&str> = e
            .lines()
            .filter(|l| !l.trim_start().starts_with('{') && !l.trim().is_empty())
            .collect();
        let last = lines[lines.len().saturating_sub(3)..].join(" | ");
        proc::tail(&last, 400).to_owned()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a flow copies from and to, and how its command line is built.
struct Flow {
    name: String,
    /// The file the data comes from and the one it must end up in.
    src: PathBuf,
    dst: PathBuf,
    /// The target across the link (B): the one a restart kills.
    remote: Target,
    /// Sync only: the source's target in A.
    _local: Option<Target>,
    /// `ab` when the data goes from A to B, `ba` back.
    dir: &'static str,
    state: PathBuf,
}

impl Lab<'_> {
    fn next(&self) -> u32 {
        let n = self.seq.get() + 1;
        self.seq.set(n);
        n
    }

    fn url(&self) -> String {
        format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", self.b.1)
    }

    /// Fresh stores and targets for one run of `flow`.
    fn flow(&self, flow: &str) -> Result<Flow> {
        let n = self.next();
        let data = self.dir.join("source.img");
        proc::random_file(&data, self.p.size)?;
        let fresh = |name: &str| -> Result<PathBuf> {
            let p = self.dir.join(format!("{name}-{n}.img"));
            File::create(&p)?.set_len(self.p.size)?;
            Ok(p)
        };
        let copy_of_data = |name: &str| -> Result<PathBuf> {
            let p = self.dir.join(format!("{name}-{n}.img"));
            std::fs::copy(&data, &p)?;
            Ok(p)
        };
        let state = self.dir.join(format!("sync-{n}.state"));
        Ok(if flow == "sync" {
            let src = copy_of_data("sync-src")?;
            let dst = fresh("sync-dst")?;
            let local = Target::start(self, &self.a, &src, &format!("a-{n}"))?;
            let remote = Target::start(self, &self.b, &dst, &format!("b-{n}"))?;
            Flow {
                name: flow.into(),
                src,
                dst,
                remote,
                _local: Some(local),
                dir: "ab",
                state,
            }
        } else if flow.starts_with("cp-put") {
            let dst = fresh("lun")?;
            let remote = Target::start(self, &self.b, &dst, &format!("b-{n}"))?;
            Flow {
                name: flow.into(),
                src: data,
                dst,
                remote,
                _local: None,
                dir: "ab",
                state,
            }
        } else {
            let src = copy_of_data("lun")?;
            let remote = Target::start(self, &self.b, &src, &format!("b-{n}"))?;
            Flow {
                name: flow.into(),
                src,
                dst: self.dir.join(format!("got-{n}.img")),
                remote,
                _local: None,
                dir: "ba",
                state,
            }
        })
    }

    /// The command that runs `flow` from site A, from `resume` on (cp) or again (sync).
    fn command(&self, f: &Flow, resume: Option<u64>, opts: &str) -> Command {
        let mut c = in_ns(&self.a.0, rsv_bin());
        if f.name == "sync" {
            c.args(["sync", "--json", "--interval", "1s", "--key-file"])
                .arg(&self.key)
                .arg("--state")
                .arg(&f.state)
                .arg(format!("{}:{CONTROL_PORT}/{IQN}/0", self.a.1))
                .arg(format!("{}:{CONTROL_PORT}/{IQN}/0", self.b.1));
            return c;
        }
        let erl = if f.name.ends_with("erl0") { "0" } else { "2" };
        let mut url = format!("{}?erl={erl}", self.url());
        if !opts.is_empty() {
            url = format!("{url}&{opts}");
        }
        c.args(["cp", "--json", "--progress", "json"]);
        if f.name.starts_with("cp-put") {
            c.arg(&f.src).arg(&url);
        } else {
            c.arg(&url).arg(&f.dst);
        }
        if let Some(off) = resume {
            c.args(["--resume-from", &off.to_string()]);
        }
        c
    }

    fn progress_key(f: &Flow) -> &'static str {
        if f.name == "sync" {
            "done_bytes"
        } else {
            "bytes"
        }
    }

    /// The same transfer without a break: how many bytes it puts on the link.
    fn baseline(&self, flow: &str) -> Result<(u64, f64)> {
        let f = self.flow(flow)?;
        let before = self.link.tx_bytes(f.dir).unwrap_or(0);
        let start = Instant::now();
        let mut r = Running::spawn(self.command(&f, None, ""), &self.dir, self.next())?;
        let code = r.wait_until(start + self.p.grace, || {})?;
        if code != Some(0) {
            bail!(
                "{flow} without a break failed ({code:?}): {}",
                r.stderr_tail()
            );
        }
        if let Some(at) = first_difference(&f.src, &f.dst, self.p.size)? {
            bail!("{flow} without a break: the copy differs at offset {at}");
        }
        Ok((
            self.link.tx_bytes(f.dir).unwrap_or(0) - before,
            start.elapsed().as_secs_f64(),
        ))
    }

    fn case(&self, flow: &str, event: &str, secs: u64, baseline: u64) -> Result<CaseResult> {
        let mut res = CaseResult {
            flow: flow.into(),
            event: event.into(),
            break_s: secs,
            ..CaseResult::default()
        };
        let mut f = self.flow(flow)?;
        let key = Self::progress_key(&f);
        let progress_file = |r: &Running| {
            if f.name == "sync" {
                r.out.clone()
            } else {
                r.err.clone()
            }
        };
        if event == "down" && f.name == "sync" {
            bail!("the down break is for rsv cp only");
        }
        let opts = if event == "down" {
            self.p.down_opts.as_str()
        } else {
            ""
        };
        let before = self.link.tx_bytes(f.dir).unwrap_or(0);
        let start = Instant::now();
        let mut run = Running::spawn(self.command(&f, None, opts), &self.dir, self.next())?;
        let pfile = progress_file(&run);
        // Break it once a quarter has arrived (or after a minute, whatever it did).
        let trigger = start + Duration::from_secs(60);
        let mut early_exit = None;
        while progress_of(&pfile, key) < self.p.size / 4 && Instant::now() < trigger {
            if let Some(st) = run.child.try_wait()? {
                early_exit = Some(st.code().unwrap_or(-1));
                break;
            }
            proc::sleep(Duration::from_millis(50))?;
        }
        if let Some(code) = early_exit {
            res.outcome = "error".into();
            res.error = format!(
                "ended (exit {code}) before the break: {}",
                run.stderr_tail()
            );
            return Ok(res);
        }
        // The break and the mend on this thread, the command watched meanwhile.
        let mended: Arc<Mutex<Option<(Instant, u64)>>> = Arc::default();
        let recovered: Arc<Mutex<Option<Instant>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        // The file whose progress counts: the first run's, then the resume's (any
        // progress of which is a recovery).
        let watched: Arc<Mutex<(PathBuf, bool)>> = Arc::new(Mutex::new((pfile.clone(), false)));
        let watcher = {
            let (mended, recovered, stop, watched) = (
                mended.clone(),
                recovered.clone(),
                stop.clone(),
                watched.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let m = *mended.lock().unwrap();
                    let (file, resumed) = watched.lock().unwrap().clone();
                    if let Some((_, at)) = m {
                        let floor = if resumed { 0 } else { at };
                        if recovered.lock().unwrap().is_none() && progress_of(&file, key) > floor {
                            *recovered.lock().unwrap() = Some(Instant::now());
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        let broken = Instant::now();
        let loss = self.p.loss.clone();
        // A down link's command ends (or is killed as hung) before the mend.
        let mut ended_down = None;
        // When the command was seen ended during the break: its exit is timed from the
        // break to then, not to the mend (which is when it would be noticed otherwise).
        let mut ended_in_break = None;
        match event {
            "cut" => {
                self.link.set(&["--loss".into(), "100%".into()])?;
                let r = run.sleep_watching(Duration::from_secs(secs));
                self.link.set(&["--loss".into(), loss])?;
                ended_in_break = r?;
            }
            "restart" => {
                f.remote.sigkill();
                ended_in_break = run.sleep_watching(Duration::from_secs(secs))?;
                f.remote.up()?;
            }
            "down" => {
                self.link.set(&["--loss".into(), "100%".into()])?;
                let code = run.wait_until(broken + self.p.grace, || {});
                res.first_end_s = broken.elapsed().as_secs_f64();
                res.break_s = res.first_end_s.ceil() as u64;
                self.link.set(&["--loss".into(), loss])?;
                ended_down = Some(code?);
            }
            other => bail!("unknown event {other}"),
        }
        *mended.lock().unwrap() = Some((Instant::now(), progress_of(&pfile, key)));
        let code = match ended_down {
            Some(code) => code,
            None => {
                let code = run.wait_until(Instant::now() + self.p.grace, || {})?;
                res.first_end_s = ended_in_break
                    .unwrap_or_else(Instant::now)
                    .duration_since(broken)
                    .as_secs_f64();
                code
            }
        };
        res.first_exit = code;
        // A resumable end: cp's exit 4 with its prefix, a failed sync run again.
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(&run.out).unwrap_or_default())
                .unwrap_or_default();
        for (k, slot) in [
            ("retries", &mut res.retries),
            ("reassigned_tasks", &mut res.reassigned_tasks),
            ("reinstatements", &mut res.reinstatements),
            ("reconnections", &mut res.reconnections),
        ] {
            *slot = summary[k].as_u64();
        }
        let resume = match (code, f.name.as_str()) {
            (Some(0), _) | (None, _) => None,
            (Some(4), _) => summary["copied_prefix_bytes"].as_u64(),
            (Some(1), "sync") => Some(0),
            _ => None,
        };
        if code.is_some_and(|c| c != 0) {
            res.error = run.stderr_tail();
        }
        let mut ok = code == Some(0);
        if let Some(off) = resume {
            res.resumed_from = Some(off);
            let mut again = Running::spawn(
                self.command(&f, (f.name != "sync").then_some(off), opts),
                &self.dir,
                self.next(),
            )?;
            *watched.lock().unwrap() = (progress_file(&again), true);
            let c2 = again.wait_until(Instant::now() + self.p.grace, || {})?;
            if c2 == Some(0) {
                ok = true;
            } else {
                res.error = format!(
                    "{}; the resume: {}",
                    res.error,
                    match c2 {
                        Some(c) => format!("exit {c}: {}", again.stderr_tail()),
                        None => "still running at the time limit".into(),
                    }
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = watcher.join();
        res.total_s = start.elapsed().as_secs_f64();
        res.wire_bytes = self.link.tx_bytes(f.dir).unwrap_or(0) - before;
        res.extra_wire_bytes = res.wire_bytes as i64 - baseline as i64;
        let m = *mended.lock().unwrap();
        let r = *recovered.lock().unwrap();
        res.recover_s = match (m, r) {
            (Some((m, _)), Some(r)) => Some(r.duration_since(m).as_secs_f64()),
            _ => None,
        };
        res.outcome = if code.is_none() && event == "down" {
            format!(
                "hung (still running {} s into the cut)",
                self.p.grace.as_secs()
            )
        } else if code.is_none() {
            format!("hung (killed {} s after the mend)", self.p.grace.as_secs())
        } else if event == "down" && code != Some(4) {
            // A link that never came back must end the copy with a resumable state.
            format!(
                "error (exit {} with the link down, not 4)",
                code.unwrap_or(-1)
            )
        } else if !ok {
            "error".into()
        } else {
            match first_difference(&f.src, &f.dst, self.p.size)? {
                Some(at) => format!("DIFFERENT at offset {at}"),
                None if resume.is_some() => "resumed-identical".into(),
                None => "identical".into(),
            }
        };
        Ok(res)
    }
}

fn mib(b: i64) -> String {
    format!("{:.1}", b as f64 / (1 << 20) as f64)
}

/// The table `rsv-lab run cuts` prints.
pub fn table(r: &Results) -> String {
    let mut s = format!(
        "{:<12} {:<8} {:>5}  {:<20} {:>9} {:>8} {:>11}  {}\n",
        "transfer", "break", "s", "outcome", "recover_s", "total_s", "resent_MiB", "notes"
    );
    for c in &r.cases {
        let mut notes = Vec::new();
        if let Some(off) = c.resumed_from {
            notes.push(format!(
                "exit {} {:.0} s after the break, {}",
                c.first_exit.unwrap_or(-1),
                c.first_end_s,
                if c.flow == "sync" {
                    "run again".to_owned()
                } else {
                    format!("resumed from {} MiB", off >> 20)
                }
            ));
        }
        for (k, v) in [
            ("reassigned", c.reassigned_tasks),
            ("retries", c.retries),
            ("reinstatements", c.reinstatements),
            ("reconnections", c.reconnections),
        ] {
            if let Some(v) = v.filter(|v| *v > 0) {
                notes.push(format!("{k} {v}"));
            }
        }
        if !c.error.is_empty() {
            // The cause, without the resume hint that follows it.
            let e = c.error.split(" | rsv cp: to go on").next().unwrap_or("");
            let e = e.rsplit("all done: ").next().unwrap_or(e);
            notes.push(proc::tail(e, 160).to_owned());
        }
        s += &format!(
            "{:<12} {:<8} {:>5}  {:<20} {:>9} {:>8.1} {:>11}  {}\n",
            c.flow,
            c.event,
            c.break_s,
            c.outcome,
            c.recover_s.map_or("-".into(), |x| format!("{x:.1}")),
            c.total_s,
            mib(c.extra_wire_bytes),
            notes.join("; ")
        );
    }
    s
}

pub fn run(p: Params, out: &Path, command: String) -> Result<Results> {
    for (f, e) in &p.cases {
        if !FLOWS.contains(&f.as_str()) || !EVENTS.contains(&e.as_str()) {
            bail!(
                "unknown case {f}:{e}; transfers: {}; breaks: {}",
                FLOWS.join(", "),
                EVENTS.join(", ")
            );
        }
    }
    let loadavg_before = crate::env::loadavg();
    let environment = crate::env::collect();
    // The namespaces run CUBIC as R0's (a host whose allowed list is "reno bbr" refuses
    // it otherwise), as every lab scenario does.
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "cuts")?;
    let dir = scratch.0.clone();
    let key = dir.join("control.key");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&key, "a control key for the cuts scenario")?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    }
    let link = Link::up(
        &p.link_name,
        &[
            "--rtt".into(),
            p.rtt.clone(),
            "--rate".into(),
            p.rate.clone(),
            "--loss".into(),
            p.loss.clone(),
        ],
        1,
    )?;
    for ns in link.all_ns() {
        sysctl(ns, &crate::r0::linux_default_tcp()).with_context(|| format!("sysctls in {ns}"))?;
    }
    let a = (link.a[0].ns.clone(), link.a[0].addr);
    let b = (link.b[0].ns.clone(), link.b[0].addr);
    let lab = Lab {
        p: &p,
        link,
        dir,
        key,
        a,
        b,
        seq: Default::default(),
    };
    let desc = format!("{} {} RTT, loss {}", p.rate, p.rtt, p.loss);
    eprintln!(
        "cuts: link {desc}; {} MiB a transfer; loadavg {loadavg_before}",
        p.size >> 20
    );
    let mut baselines: Vec<(String, u64)> = Vec::new();
    let mut cases = Vec::new();
    for (flow, event) in &p.cases {
        let base = match baselines.iter().find(|b| &b.0 == flow) {
            Some(b) => b.1,
            None => {
                let (bytes, secs) = lab.baseline(flow)?;
                eprintln!(
                    "cuts: {flow} without a break: {secs:.1} s, {} MiB on the link",
                    mib(bytes as i64)
                );
                baselines.push((flow.clone(), bytes));
                bytes
            }
        };
        let once = [0];
        let durations: &[u64] = if event == "down" { &once } else { &p.durations };
        for &d in durations {
            if event == "down" {
                eprintln!("cuts: {flow}, link down until it gives up ...");
            } else {
                eprintln!("cuts: {flow}, {event} for {d} s ...");
            }
            let r = lab.case(flow, event, d, base)?;
            eprintln!(
                "cuts: {flow}, {event} {} s: {} (recovered in {}, {:.1} s in all){}",
                r.break_s,
                r.outcome,
                r.recover_s.map_or("-".into(), |x| format!("{x:.1} s")),
                r.total_s,
                if r.error.is_empty() {
                    String::new()
                } else {
                    format!("; {}", r.error)
                }
            );
            cases.push(r);
        }
    }
    let results = Results {
        command,
        link: desc,
        size: p.size,
        loadavg_before,
        loadavg_after: crate::env::loadavg(),
        baseline_wire_bytes: baselines,
        cases,
        environment,
    };
    crate::results::save(out, "cuts.json", &results)?;
    std::fs::write(out.join("cuts.txt"), table(&results))?;
    Ok(results)
}
