//! Shared harness for the end-to-end tests: start `rsv target` on an OS-chosen loopback
//! port, find the real peers, run them.
#![allow(dead_code)]

pub mod walk;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn rsv() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rsv"))
}

/// The bench's binary (`rsv-lab wan`, `rsv-lab timing`) beside the `rsv` under test, where
/// a workspace build puts it; this package does not build it, so `cargo test -p rsv -p
/// rsv-lab --test NAME` builds both. Missing, the test is skipped with a note (under CI or
/// RESERVOIR_TEST_STRICT it fails instead).
pub fn rsv_lab() -> Option<PathBuf> {
    let lab = rsv().with_file_name("rsv-lab");
    if lab.exists() {
        return Some(lab);
    }
    let why = format!("no {} (cargo build -p rsv-lab)", lab.display());
    if std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some() {
        panic!("cannot run: {why}");
    }
    eprintln!("SKIP: {why}");
    None
}

/// Whether a peer tool is installed. Under CI a missing tool is a failure (the test
/// command installs them), elsewhere the test is skipped with a note.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        if std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some() {
            panic!("{tool} is not installed; scripts/setup.sh should have installed it");
        }
        eprintln!("SKIP: {tool} not installed");
    }
    found
}

pub struct Target {
    child: Option<Child>,
    pub portal: String,
    /// The sync agent's control endpoint, with `[control]`.
    pub control: Option<String>,
    /// The local control socket (`rsv target status`), with `[control] socket`.
    pub control_socket: Option<PathBuf>,
    /// Where `/metrics` is served, with `[metrics]`.
    pub metrics: Option<String>,
    pub iqns: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl Target {
    /// Starts `rsv target` with `config` (TOML, portals forced to 127.0.0.1:0) or the
    /// embedded default when None.
    pub fn start(config: Option<&str>) -> Target {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, config)
    }

    pub fn start_in(dir: tempfile::TempDir, config: Option<&str>) -> Target {
        Self::start_in_env(dir, config, &[])
    }

    /// [`Target::start_in`] with these environment variables set for the target.
    pub fn start_in_env(
        dir: tempfile::TempDir,
        config: Option<&str>,
        env: &[(&str, &str)],
    ) -> Target {
        let mut cmd = Command::new(rsv());
        cmd.envs(env.iter().copied());
        cmd.arg("target")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        if let Some(c) = config {
            let p = dir.path().join("target.toml");
            std::fs::write(&p, c).unwrap();
            cmd.arg("--config").arg(&p);
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("target.log")).unwrap(),
            ))
            .spawn()
            .expect("starting rsv target");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut portal = String::new();
        let mut control = None;
        let mut control_socket = None;
        let mut metrics = None;
        let mut iqns = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                let log =
                    std::fs::read_to_string(dir.path().join("target.log")).unwrap_or_default();
                panic!("rsv target exited before ready:\n{log}");
            }
            let l = line.trim();
            if let Some(p) = l.strip_prefix("portal ") {
                portal = p.to_owned();
            } else if let Some(c) = l.strip_prefix("control ") {
                control = Some(c.to_owned());
            } else if let Some(c) = l.strip_prefix("control-socket ") {
                control_socket = Some(PathBuf::from(c));
            } else if let Some(m) = l.strip_prefix("metrics ") {
                metrics = Some(m.to_owned());
            } else if let Some(t) = l.strip_prefix("target ") {
                iqns.push(t.to_owned());
            } else if l == "ready" {
                break;
            }
        }
        Target {
            child: Some(child),
            portal,
            control,
            control_socket,
            metrics,
            iqns,
            dir,
        }
    }

    pub fn url(&self, lun: u16) -> String {
        format!("iscsi://{}/{}/{lun}", self.portal, self.iqns[0])
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("target.log")).unwrap_or_default()
    }

    /// Writes `config` over the target's file, sends SIGHUP and waits for the reload's log
    /// line ("reloaded …" or "reload of … refused …"), which it returns.
    pub fn reload(&mut self, config: &str) -> String {
        let done = |log: &str| {
            log.lines()
                .filter(|l| l.contains("reloaded ") || l.contains("reload of "))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let before = done(&self.log()).len();
        std::fs::write(self.dir.path().join("target.toml"), config).unwrap();
        self.signal(libc::SIGHUP);
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(line) = done(&self.log()).get(before) {
                return line.clone();
            }
            assert!(
                self.running(),
                "rsv target ended on SIGHUP:\n{}",
                self.log()
            );
            assert!(Instant::now() < end, "no reload in 20 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (SIGHUP: reload the configuration) to the running target.
    pub fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().expect("running").id();
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    }

    /// Whether the target process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("rsv target did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the target and hands its directory back, for a restart on the same data.
    pub fn into_dir(mut self) -> tempfile::TempDir {
        let st = self.stop();
        assert!(st.success(), "rsv target exited with {st}");
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    out
}

pub fn run_ok(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A file of `len` pseudo-random bytes (xorshift; no entropy needed).
pub fn random_file(path: &Path, len: usize, seed: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x = seed | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
}

/// Counts from CUnit's "Run Summary": (run, passed, failed) tests.
pub fn cunit_summary(out: &str) -> Option<(u32, u32, u32)> {
    out.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.first() == Some(&"tests") && w.len() >= 5).then(|| {
            (
                w[2].parse().unwrap_or(0),
                w[3].parse().unwrap_or(0),
                w[4].parse().unwrap_or(u32::MAX),
            )
        })
    })
}
