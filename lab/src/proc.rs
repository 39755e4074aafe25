//! Processes, namespaces and links the lab starts, each owned by a guard that removes it on
//! every way out (error, panic, SIGINT/SIGTERM).

use crate::busy::Sample;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT/SIGTERM/SIGHUP only set a flag: the run stops at its next check and unwinds, so
/// the guards take down links, targets and peers instead of leaving them behind.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

pub fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleeps in small steps so that a signal is noticed promptly.
pub fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_interrupt()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

/// The product's binary the scenarios measure (`rsv target`, `rsv bench`, `rsv cp`, `rsv
/// sync`, ...): the `rsv` beside this one, where cargo builds and installs both, so that a
/// run measures the build it was started from rather than whatever `rsv` is on PATH.
pub fn rsv_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("rsv")))
        .unwrap_or_else(|| PathBuf::from("rsv"))
}

/// This binary, which carries the WAN emulator (`rsv-lab wan up/set/stats/down`).
pub fn lab_bin() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("rsv-lab"))
}

/// A command run inside network namespace `ns` (`ip netns exec` execs the program, so the
/// child's pid is the program's own). Without the path cache (`net::paths`) unless the
/// lab's caller chose one with `RSV_PATH_CACHE`: each row starts from what it is told,
/// not from what the row before it learnt.
pub fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    if std::env::var_os("RSV_PATH_CACHE").is_none() {
        c.env("RSV_PATH_CACHE", "off");
    }
    c
}

/// A background process, killed when the guard goes.
pub struct Proc {
    child: Option<Child>,
    pub what: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(mut cmd: Command, what: &str, log: &Path) -> Result<Proc> {
        let f = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        Ok(Proc {
            child: Some(child),
            what: what.to_owned(),
            log: log.to_owned(),
        })
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `ready` holds for the log text, failing if the process dies first.
    pub fn wait_log(&mut self, timeout: Duration, ready: impl Fn(&str) -> bool) -> Result<()> {
        let end = Instant::now() + timeout;
        loop {
            if ready(&self.log_text()) {
                return Ok(());
            }
            if !self.alive() {
                bail!("{} exited:\n{}", self.what, tail(&self.log_text(), 2000));
            }
            if Instant::now() > end {
                bail!(
                    "{} not ready in {timeout:?}:\n{}",
                    self.what,
                    tail(&self.log_text(), 2000)
                );
            }
            sleep(Duration::from_millis(50))?;
        }
    }

    /// SIGKILL at once (a crash, as the cuts scenario needs), and the exit reaped.
    pub fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, a grace period, then SIGKILL.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid, which we have not yet reaped.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

pub struct Outcome {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub timed_out: bool,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.map(|s| s.success()).unwrap_or(false)
    }

    pub fn describe(&self) -> String {
        match self.status {
            Some(s) => {
                // A Rust tool's error comes before its backtrace (RUST_BACKTRACE=1).
                let err = self.stderr.split("\nStack backtrace:").next().unwrap_or("");
                format!("exit {s}: {}", tail(err.trim(), 300))
            }
            None => format!("killed after {:.1} s", self.elapsed.as_secs_f64()),
        }
    }
}

/// Fails, naming the first one missing, unless every program in `tools` is on the PATH.
pub fn require(scenario: &str, tools: &[&str]) -> Result<()> {
    for t in tools {
        if Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            bail!("{scenario} needs {t} (scripts/setup.sh installs it)");
        }
    }
    Ok(())
}

/// Runs `cmd` to the end or until `timeout`, when it is killed (SIGINT, then SIGKILL).
pub fn run(cmd: Command, timeout: Duration, scratch: &Path) -> Result<Outcome> {
    Ok(run_many(vec![cmd], timeout, scratch)?.remove(0))
}

/// Starts `cmd` with no input, its output to `dir/STEM.out` and `dir/STEM.err`; the child
/// and those two paths.
pub fn spawn_to_files(
    cmd: &mut Command,
    dir: &Path,
    stem: &str,
) -> Result<(Child, PathBuf, PathBuf)> {
    let out = dir.join(format!("{stem}.out"));
    let err = dir.join(format!("{stem}.err"));
    let child = cmd
        .stdin(Stdio::null())
        .stdout(File::create(&out)?)
        .stderr(File::create(&err)?)
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    Ok((child, out, err))
}

/// Runs the commands at the same time, each to its end or until `timeout`. Output goes
/// through files so that a chatty child never blocks on a full pipe.
pub fn run_many(cmds: Vec<Command>, timeout: Duration, scratch: &Path) -> Result<Vec<Outcome>> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    struct Running {
        child: Child,
        out: PathBuf,
        err: PathBuf,
        status: Option<ExitStatus>,
        elapsed: Duration,
        killed: bool,
    }
    impl Drop for Running {
        fn drop(&mut self) {
            if self.status.is_none() && !self.killed {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
            let _ = std::fs::remove_file(&self.out);
            let _ = std::fs::remove_file(&self.err);
        }
    }
    let start = Instant::now();
    let mut running = Vec::new();
    for mut cmd in cmds {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let (child, out, err) = spawn_to_files(&mut cmd, scratch, &format!("run{n}"))?;
        running.push(Running {
            child,
            out,
            err,
            status: None,
            elapsed: Duration::ZERO,
            killed: false,
        });
    }
    let mut interrupted = false;
    loop {
        let mut left = 0;
        for r in running
            .iter_mut()
            .filter(|r| r.status.is_none() && !r.killed)
        {
            if let Some(st) = r.child.try_wait()? {
                r.status = Some(st);
                r.elapsed = start.elapsed();
            } else {
                left += 1;
            }
        }
        if left == 0 {
            break;
        }
        interrupted = INTERRUPTED.load(Ordering::SeqCst);
        if start.elapsed() > timeout || interrupted {
            for r in running.iter_mut().filter(|r| r.status.is_none()) {
                // SAFETY: kill(2) on our own unreaped child.
                unsafe {
                    libc::kill(r.child.id() as i32, libc::SIGINT);
                }
            }
            let end = Instant::now() + Duration::from_secs(3);
            for r in running.iter_mut().filter(|r| r.status.is_none()) {
                while Instant::now() < end && r.child.try_wait()?.is_none() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = r.child.kill();
                let _ = r.child.wait();
                r.killed = true;
                r.elapsed = start.elapsed();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if interrupted {
        bail!("interrupted");
    }
    Ok(running
        .iter()
        .map(|r| Outcome {
            status: r.status,
            stdout: std::fs::read_to_string(&r.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&r.err).unwrap_or_default(),
            elapsed: r.elapsed,
            timed_out: r.killed,
        })
        .collect())
}

/// Runs a short command and returns its stdout, failing on a non-zero exit.
pub fn run_ok(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sets sysctls inside a namespace (the TCP ones are per namespace on this kernel).
pub fn sysctl(ns: &str, settings: &[(String, String)]) -> Result<()> {
    let mut c = in_ns(ns, "sysctl");
    c.arg("-q");
    for (k, v) in settings {
        c.arg("-w").arg(format!("{k}={v}"));
    }
    run_ok(&mut c).map(|_| ())
}

pub struct Host {
    pub ns: String,
    pub addr: Ipv4Addr,
}

/// One emulated link (`rsv-lab wan up`), taken down with `rsv-lab wan down` when dropped.
pub struct Link {
    pub name: String,
    pub a: Vec<Host>,
    pub b: Vec<Host>,
    /// The bottleneck's rate each way as brought up, bits per second.
    pub rate_bps: u64,
    /// The relay process (`rsv-lab wan relay`), whose CPU time a row can report.
    pub relay_pid: Option<u32>,
    /// The name held for this run while the link is up ([`hold_link_name`]); let go
    /// after the link is taken down (fields drop after `Drop::drop`).
    _name: File,
}

/// The bottleneck's counters read on a thread every so often while a measurement runs
/// (`Link::watch`), each way: a→b and b→a.
pub struct Watch {
    stop: std::sync::Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Watched>,
}

/// What a [`Watch`] read: the byte samples a→b and b→a, and the a→b queue.
type Watched = ((Vec<Sample>, Vec<Sample>), Vec<QueueSample>);

/// The a→b bottleneck's queue at one reading: when (Unix time, as the readings' own
/// clock has it), bytes queued, and packets its queue dropped so far.
#[derive(Clone, Copy, Debug)]
pub struct QueueSample {
    pub at: f64,
    pub queue_bytes: u64,
    pub drops: u64,
}

impl Watch {
    /// Stops the readings and returns them, a→b and b→a.
    pub fn finish(self) -> (Vec<Sample>, Vec<Sample>) {
        self.finish_with_queue().0
    }

    /// As [`Watch::finish`], with the a→b queue at each reading: when a run's drops
    /// happened, not only how many.
    pub fn finish_with_queue(self) -> Watched {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// `rsv-lab wan stats --json` of link `name`.
fn wan_stats(name: &str) -> Result<Value> {
    let out = run_ok(Command::new(lab_bin()).args(["wan", "stats", "--name", name, "--json"]))?;
    Ok(serde_json::from_str(&out)?)
}

/// One direction's counters ("ab" or "ba") in `wan_stats`, at the top or under "stats".
fn direction<'a>(v: &'a Value, dir: &str) -> &'a Value {
    if v[dir].is_object() {
        &v[dir]
    } else {
        &v["stats"][dir]
    }
}

pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One reading of the link's counters: when `rsv-lab wan stats` was started and when it
/// returned (Unix time), the relay's own clock when it took the counters, and the bytes
/// that had left the bottleneck each way.
#[derive(Clone, Copy)]
struct Reading {
    before: f64,
    after: f64,
    uptime: Option<f64>,
    ab: Option<u64>,
    ba: Option<u64>,
    /// The a→b queue's bytes and drops so far.
    queue: Option<(u64, u64)>,
}

/// The watch's readings as samples on one clock. Starting `rsv-lab wan stats` takes
/// milliseconds to tens of them on a loaded machine, so the middle of that span is a poor
/// time for the counters: an interval between two readings came out too long or too
/// short by as much, and the link looked idle in one and over its rate in the next. The
/// relay's own clock (`uptime_s`, read with the counters) times them instead, placed on
/// The a→b queue at each reading that had it, at the middle of the reading.
fn queue_samples(readings: &[Reading]) -> Vec<QueueSample> {
    readings
        .iter()
        .filter_map(|r| {
            let (queue_bytes, drops) = r.queue?;
            Some(QueueSample {
                at: (r.before + r.after) / 2.0,
                queue_bytes,
                drops,
            })
        })
        .collect()
}

/// Unix time by the reading that took least time to get; without it, the middle.
fn timed_samples(readings: &[Reading]) -> (Vec<Sample>, Vec<Sample>) {
    let offset = readings
        .iter()
        .filter_map(|r| Some((r.after - r.before, (r.before + r.after) / 2.0 - r.uptime?)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, off)| off);
    let (mut ab, mut ba) = (Vec::new(), Vec::new());
    for r in readings {
        let at = match (offset, r.uptime) {
            (Some(off), Some(up)) => up + off,
            _ => (r.before + r.after) / 2.0,
        };
        for (bytes, list) in [(r.ab, &mut ab), (r.ba, &mut ba)] {
            if let Some(bytes) = bytes {
                list.push(Sample { at, bytes });
            }
        }
    }
    (ab, ba)
}

fn hosts(site: &Value) -> Result<Vec<Host>> {
    let list = site["hosts"]
        .as_array()
        .ok_or_else(|| anyhow!("no hosts in {site}"))?;
    list.iter()
        .map(|h| {
            Ok(Host {
                ns: h["netns"].as_str().unwrap_or_default().to_owned(),
                addr: h["addr"]
                    .as_str()
                    .unwrap_or_default()
                    .parse()
                    .with_context(|| format!("address of {h}"))?,
            })
        })
        .collect()
}

impl Link {
    pub fn up(name: &str, params: &[String], hosts_a: u32) -> Result<Link> {
        // RSV_LAB_PREFIX keeps concurrent runs (several people on one machine) apart: the
        // link's namespaces are PREFIXname-a/-b.
        let name = &format!(
            "{}{name}",
            std::env::var("RSV_LAB_PREFIX").unwrap_or_default()
        );
        let held = hold_link_name(name)?;
        // A link of the same name left by a killed run would make `up` fail.
        let _ = run_ok(Command::new(lab_bin()).args(["wan", "down", "--name", name]));
        let mut link = Link {
            name: name.to_owned(),
            a: Vec::new(),
            b: Vec::new(),
            rate_bps: 0,
            relay_pid: None,
            _name: held,
        };
        let out = run_ok(
            Command::new(lab_bin())
                .args(["wan", "up", "--name", name, "--json"])
                .args(["--hosts-a", &hosts_a.to_string()])
                .args(params),
        )?;
        let v: Value = serde_json::from_str(&out)
            .with_context(|| format!("rsv-lab wan up --json printed {out:?}"))?;
        link.a = hosts(&v["a"])?;
        link.b = hosts(&v["b"])?;
        link.rate_bps = v["ab"]["rate_bps"].as_u64().unwrap_or(0);
        link.relay_pid = v["pid"].as_u64().map(|p| p as u32);
        if link.a.is_empty() || link.b.is_empty() {
            bail!("rsv-lab wan up: no hosts in {out}");
        }
        Ok(link)
    }

    pub fn set(&self, params: &[String]) -> Result<()> {
        run_ok(
            Command::new(lab_bin())
                .args(["wan", "set", "--name", &self.name])
                .args(params),
        )
        .map(|_| ())
    }

    /// Bytes that left the bottleneck from A to B so far, and the queue-overflow drops.
    pub fn ab_counters(&self) -> Result<(u64, u64)> {
        let v = wan_stats(&self.name)?;
        let ab = direction(&v, "ab");
        Ok((
            ab["tx_bytes"].as_u64().unwrap_or(0),
            ab["drop_queue"].as_u64().unwrap_or(0),
        ))
    }

    /// Bytes that left the emulator in direction `dir` ("ab": toward site b, or "ba") so far.
    pub fn tx_bytes(&self, dir: &str) -> Result<u64> {
        let v = wan_stats(&self.name)?;
        Ok(direction(&v, dir)["tx_bytes"].as_u64().unwrap_or(0))
    }

    /// Reads the bottleneck's byte counters every `every` until the watch is finished,
    /// each reading timed by the relay's clock ([`timed_samples`]). Returns once the first
    /// reading is in (or failed), so that a measurement started next is covered from its
    /// start.
    pub fn watch(&self, every: Duration) -> Watch {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (name, flag) = (self.name.clone(), stop.clone());
        let (first_tx, first_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut readings = Vec::new();
            // One reading after the stop too: the window ends as the measurement does.
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                let before = unix_now();
                let stats = wan_stats(&name);
                let after = unix_now();
                if let Ok(v) = stats {
                    let bytes = |dir| direction(&v, dir)["tx_bytes"].as_u64();
                    let uptime = v["uptime_s"]
                        .as_f64()
                        .or_else(|| v["stats"]["uptime_s"].as_f64());
                    readings.push(Reading {
                        before,
                        after,
                        uptime,
                        ab: bytes("ab"),
                        ba: bytes("ba"),
                        queue: direction(&v, "ab")["queue_bytes"]
                            .as_u64()
                            .zip(direction(&v, "ab")["drop_queue"].as_u64()),
                    });
                }
                let _ = first_tx.send(());
                if stopping {
                    break;
                }
                std::thread::sleep(every);
            }
            (timed_samples(&readings), queue_samples(&readings))
        });
        let _ = first_rx.recv_timeout(Duration::from_secs(5));
        Watch { stop, thread }
    }

    pub fn all_ns(&self) -> impl Iterator<Item = &str> {
        self.a.iter().chain(&self.b).map(|h| h.ns.as_str())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new(lab_bin())
            .args(["wan", "down", "--name", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A file of `len` pseudo-random bytes: backup sources must not be all zeros, which
/// `qemu-img convert` and `rsv cp` would skip.
pub fn random_file(path: &Path, len: u64) -> Result<()> {
    use std::io::Write;
    if std::fs::metadata(path)
        .map(|m| m.len() == len)
        .unwrap_or(false)
    {
        return Ok(());
    }
    let mut f = std::io::BufWriter::new(File::create(path)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// A scratch directory removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(base: &Path, tag: &str) -> Result<Scratch> {
        let p = base.join(format!("rsv-lab-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Scratch(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // RSV_LAB_KEEP=1 keeps the logs and configurations of a run for a post-mortem.
        if std::env::var_os("RSV_LAB_KEEP").is_some() {
            eprintln!("lab: kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A namespace may only default to a congestion control in the host's
/// net.ipv4.tcp_allowed_congestion_control. Peers that cannot choose per socket (qemu-img,
/// tgtd) get the namespace default, so the algorithms a scenario sets are added for the run
/// and the list is put back afterwards. This widens only what unprivileged sockets may pick.
///
/// Several lab runs may overlap (the test suite runs two at a time, an operator may start
/// one beside another): the list is put back only when the last of them ends, so one run's
/// end never takes an algorithm from under another. The runs agree through a directory
/// (`$RSV_LAB_STATE`, default `/run/reservoir-lab`) under an exclusive `flock`: one file per
/// holder named by its process, and the list as it was before the first of them. A holder
/// whose process is gone (killed) is dropped by the next run that looks.
pub struct AllowedCc {
    holder: Option<PathBuf>,
    dir: PathBuf,
    allowed: PathBuf,
}

const ALLOWED_CC: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

fn lab_state_dir() -> PathBuf {
    std::env::var_os("RSV_LAB_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/reservoir-lab"))
}

/// Holds link name `name` for this run: an exclusive `flock` on
/// `$RSV_LAB_STATE/link-NAME.lock`, which the kernel lets go however the run ends. A second
/// run of the same name on the machine (the test suite beside an operator's run of the
/// same scenario, two test runs at once) waits here for the first to end; before, its
/// clean-up of a leftover link (`wan down`) took the first run's link down under it.
fn hold_link_name(name: &str) -> Result<File> {
    use std::os::fd::AsRawFd;
    let dir = lab_state_dir();
    let file = format!("link-{name}.lock");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(&file);
    let f = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(f);
    }
    eprintln!(
        "lab: link {name} is up for another run on this machine; waiting for it to end (RSV_LAB_PREFIX=P names this run's links P{name}-a/-b instead)"
    );
    drop(f);
    lock_file(&dir, &file)
}

/// An exclusive `flock` on `dir/name`, released when the file is dropped.
fn lock_file(dir: &Path, name: &str) -> Result<File> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let f = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
}

/// The holder files in `dir` (`cc-holder.PID.N`) whose process still runs; the others are
/// removed.
fn live_holders(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut live = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("cc-holder.")) else {
            continue;
        };
        let pid: Option<libc::pid_t> = rest.split('.').next().and_then(|p| p.parse().ok());
        let alive = pid.is_some_and(|pid| {
            // SAFETY: kill with signal 0 only checks that the process exists.
            let rc = unsafe { libc::kill(pid, 0) };
            rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        });
        if alive {
            live.push(e.path());
        } else {
            let _ = std::fs::remove_file(e.path());
        }
    }
    live
}

impl AllowedCc {
    pub fn ensure(ccs: &[&str]) -> Result<AllowedCc> {
        Self::ensure_in(&lab_state_dir(), Path::new(ALLOWED_CC), ccs)
    }

    fn ensure_in(dir: &Path, allowed: &Path, ccs: &[&str]) -> Result<AllowedCc> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let _lock = lock_file(dir, "cc.lock")?;
        let current = std::fs::read_to_string(allowed)
            .with_context(|| format!("reading {}", allowed.display()))?
            .trim()
            .to_owned();
        let orig = dir.join("cc-original");
        // The first holder keeps the list as it was; one left by a run that was killed
        // (no live holder, the file still there) is still the list from before it.
        if live_holders(dir).is_empty() && !orig.exists() {
            std::fs::write(&orig, &current)
                .with_context(|| format!("writing {}", orig.display()))?;
        }
        let mut list: Vec<&str> = current.split_whitespace().collect();
        let missing: Vec<&str> = ccs.iter().copied().filter(|c| !list.contains(c)).collect();
        if !missing.is_empty() {
            list.extend(&missing);
            std::fs::write(allowed, list.join(" "))
                .with_context(|| format!("allowing {missing:?} in {}", allowed.display()))?;
            eprintln!(
                "lab: added {missing:?} to net.ipv4.tcp_allowed_congestion_control for this run"
            );
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let holder = dir.join(format!("cc-holder.{}.{n}", std::process::id()));
        std::fs::write(&holder, "").with_context(|| format!("writing {}", holder.display()))?;
        Ok(AllowedCc {
            holder: Some(holder),
            dir: dir.to_owned(),
            allowed: allowed.to_owned(),
        })
    }
}

impl Drop for AllowedCc {
    /// Drops this run's hold; the last live holder puts the original list back.
    fn drop(&mut self) {
        let (dir, allowed) = (&self.dir, &self.allowed);
        let Some(holder) = self.holder.take() else {
            return;
        };
        let Ok(_lock) = lock_file(dir, "cc.lock") else {
            return;
        };
        let _ = std::fs::remove_file(&holder);
        if !live_holders(dir).is_empty() {
            return;
        }
        let orig = dir.join("cc-original");
        if let Ok(old) = std::fs::read_to_string(&orig) {
            let _ = std::fs::write(allowed, old.trim());
            let _ = std::fs::remove_file(&orig);
        }
    }
}

/// Waits until something in `ns` listens on TCP `port` (servers that buffer their output
/// give no other sign).
pub fn wait_listen(ns: &str, port: u16, server: &mut Proc) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run_ok(in_ns(ns, "ss").args(["-Hltn", &format!("sport = :{port}")]))?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        if !server.alive() || Instant::now() > end {
            bail!(
                "{} is not listening on {port}:\n{}",
                server.what,
                server.log_text()
            );
        }
        sleep(Duration::from_millis(30))?;
    }
}

/// What a measurement cost the machine, read before and after it: all CPUs' busy time
/// (`/proc/stat`), the link relay's CPU time and the bottleneck's queue-overflow drops.
/// On two shared cores a Reservoir row that leaves the machine busy is CPU-bound, and a
/// relay near a whole core cannot keep the link's pace: both make a figure the
/// machine's, not the protocol's.
pub struct CostMark {
    at: Instant,
    cpu: Option<(u64, u64)>,
    relay: Option<u64>,
    drops: u64,
    tun_drops: Option<u64>,
}

/// The cost between two marks.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Cost {
    /// Busy share of all CPUs (100 % = every core busy).
    pub cpu_busy_pct: Option<f64>,
    /// The relay's CPU time over the span, in % of one core.
    pub relay_cpu_pct: Option<f64>,
    /// Packets dropped by the bottleneck's full queue, a to b.
    pub queue_drops: u64,
    /// Packets site a's TUN device dropped before the relay read them (a relay short of
    /// CPU): losses of the machine, not of the emulated path.
    pub host_drops: Option<u64>,
}

impl CostMark {
    pub fn take(link: &Link) -> CostMark {
        CostMark {
            at: Instant::now(),
            cpu: cpu_ticks(),
            relay: link.relay_pid.and_then(process_ticks),
            drops: link.ab_counters().map_or(0, |(_, d)| d),
            tun_drops: link.a.first().and_then(|h| tun_tx_dropped(&h.ns)),
        }
    }

    pub fn cost(&self, link: &Link) -> Cost {
        let now = CostMark::take(link);
        let secs = now.at.duration_since(self.at).as_secs_f64().max(1e-3);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Cost {
            cpu_busy_pct: match (self.cpu, now.cpu) {
                (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                    Some(100.0 * (b1 - b0) as f64 / (t1 - t0) as f64)
                }
                _ => None,
            },
            relay_cpu_pct: match (self.relay, now.relay) {
                (Some(a), Some(b)) if b >= a => Some(100.0 * (b - a) as f64 / hz / secs),
                _ => None,
            },
            queue_drops: now.drops.saturating_sub(self.drops),
            host_drops: match (self.tun_drops, now.tun_drops) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            },
        }
    }
}

/// `tx dropped` of the emulator's TUN device in namespace `ns`.
fn tun_tx_dropped(ns: &str) -> Option<u64> {
    let out = Command::new("ip")
        .args(["-j", "-s", "-n", ns, "link", "show", "wan0"])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0]["stats64"]["tx"]["dropped"].as_u64()
}

/// (busy, total) clock ticks of all CPUs from `/proc/stat`.
fn cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// utime + stime of a process, clock ticks.
fn process_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields count from after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_runs_keep_the_widened_list_until_the_last_ends() {
        let dir = std::env::temp_dir().join(format!("rsv-allowed-cc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let allowed = dir.join("allowed");
        std::fs::write(&allowed, "reno bbr\n").unwrap();
        let read = || std::fs::read_to_string(&allowed).unwrap();

        // A holder left by a run that was killed: its process no longer exists.
        let mut dead = Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        std::fs::write(dir.join(format!("cc-holder.{dead_pid}.0")), "").unwrap();

        let first = AllowedCc::ensure_in(&dir, &allowed, &["cubic", "bbr"]).unwrap();
        assert_eq!(read(), "reno bbr cubic");
        // The second finds cubic there and adds nothing, but still holds it.
        let second = AllowedCc::ensure_in(&dir, &allowed, &["cubic"]).unwrap();
        assert_eq!(read(), "reno bbr cubic");
        drop(first);
        assert_eq!(
            read(),
            "reno bbr cubic",
            "the first run's end took cubic from the second"
        );
        drop(second);
        assert_eq!(read(), "reno bbr", "the last run's end puts the list back");
        assert!(!dir.join(format!("cc-holder.{dead_pid}.0")).exists());
        assert!(!dir.join("cc-original").exists());

        // A run killed with the list widened: the next one restores the list from before.
        std::fs::write(&allowed, "reno bbr cubic").unwrap();
        std::fs::write(dir.join("cc-original"), "reno bbr").unwrap();
        let again = AllowedCc::ensure_in(&dir, &allowed, &["cubic"]).unwrap();
        drop(again);
        assert_eq!(read(), "reno bbr");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn readings_are_timed_by_the_relays_clock() {
        // The relay took its counters every 0.2 s of its clock (started at Unix 1000.0);
        // the reader's process took 0.02 to 0.3 s to answer, its middle off by up to 0.075 s.
        let spans = [0.3, 0.02, 0.2, 0.1];
        let readings: Vec<Reading> = spans
            .iter()
            .enumerate()
            .map(|(i, &span)| {
                let up = 0.2 * i as f64;
                let at = 1000.0 + up;
                // The counters were read 1/4 of the way into the call.
                Reading {
                    before: at - span / 4.0,
                    after: at + 3.0 * span / 4.0,
                    uptime: Some(up),
                    ab: Some(i as u64 * 100),
                    ba: None,
                    queue: None,
                }
            })
            .collect();
        let (ab, ba) = timed_samples(&readings);
        assert!(ba.is_empty());
        assert_eq!(ab.len(), 4);
        // Placed by the quickest reading (0.02 s long: 0.005 s off), spaced exactly.
        for (i, s) in ab.iter().enumerate() {
            let want = 1000.0 + 0.2 * i as f64 + 0.005;
            assert!((s.at - want).abs() < 1e-9, "{i}: {} vs {want}", s.at);
            assert_eq!(s.bytes, i as u64 * 100);
        }
        // Without the relay's clock: the middle of each call.
        let old: Vec<Reading> = readings
            .iter()
            .map(|r| Reading { uptime: None, ..*r })
            .collect();
        let (ab, _) = timed_samples(&old);
        assert!((ab[0].at - (1000.0 + 0.075)).abs() < 1e-9, "{}", ab[0].at);
    }
}
