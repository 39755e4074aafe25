//! `rsv target` as a process: started on an OS-chosen loopback port, its portals, control
//! endpoints and IQNs read from what it prints, its log in a file of its directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::rsv;

/// How to start a [`Target`]; `Spawn::default()` is the embedded default's LUN on
/// 127.0.0.1, port chosen, data under the target's own temporary directory.
#[derive(Default)]
pub struct Spawn<'a> {
    /// The directory the target runs in (data under `data/`, `target.toml`,
    /// `target.log`); a new temporary one when None.
    pub dir: Option<tempfile::TempDir>,
    /// The configuration, written to `target.toml` and passed with `--config`.
    pub config: Option<&'a str>,
    /// More arguments after `rsv target`.
    pub args: &'a [&'a str],
    /// Environment variables for the target.
    pub env: &'a [(&'a str, &'a str)],
    /// `--data-dir`: `data/` in `dir` when None.
    pub data: Option<&'a std::path::Path>,
    /// `--listen`: "127.0.0.1:0" when None.
    pub listen: Option<&'a str>,
    /// No `--listen`: the configuration's own portals (TLS portals, several).
    pub config_portals: bool,
}

/// What `rsv target` prints on its standard output before `ready`, one line each: its
/// portals, the sync agent's and the local control socket's endpoints, `/metrics`, its
/// targets.
#[derive(Debug, Default)]
pub struct Printed {
    /// Every `portal ADDR` line, in order.
    pub portals: Vec<String>,
    pub control: Option<String>,
    pub control_socket: Option<PathBuf>,
    pub metrics: Option<String>,
    /// Every `target IQN` line, in order.
    pub iqns: Vec<String>,
}

impl Printed {
    /// Reads what the just spawned `child` (its stdout piped, its stderr to the file
    /// `log`) prints until `ready`; if it ends before, waits for it and panics with `log`.
    /// Its stdout is not read after: the target prints nothing more.
    pub fn until_ready(child: &mut Child, log: &Path) -> Printed {
        let mut out = BufReader::new(child.stdout.take().expect("a piped stdout"));
        let mut p = Printed::default();
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                let _ = child.wait();
                panic!(
                    "rsv target exited before ready:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            let l = line.trim();
            if let Some(v) = l.strip_prefix("portal ") {
                p.portals.push(v.to_owned());
            } else if let Some(v) = l.strip_prefix("control ") {
                p.control = Some(v.to_owned());
            } else if let Some(v) = l.strip_prefix("control-socket ") {
                p.control_socket = Some(PathBuf::from(v));
            } else if let Some(v) = l.strip_prefix("metrics ") {
                p.metrics = Some(v.to_owned());
            } else if let Some(v) = l.strip_prefix("target ") {
                p.iqns.push(v.to_owned());
            } else if l == "ready" {
                return p;
            }
        }
    }
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
    /// Every portal it printed, in order (`portal` is the last).
    pub portals: Vec<String>,
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
        Self::spawn(Spawn {
            dir: Some(dir),
            config,
            env,
            ..Spawn::default()
        })
    }

    /// `rsv target ARGS` on the embedded default's LUN unless the arguments say otherwise.
    pub fn with_args(args: &[&str]) -> Target {
        Self::spawn(Spawn {
            args,
            ..Spawn::default()
        })
    }

    /// Starts `rsv target` as `how` says; returns once it printed "ready" (panics with its
    /// log if it ends before).
    pub fn spawn(how: Spawn) -> Target {
        let dir = how.dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let mut cmd = Command::new(rsv());
        cmd.envs(how.env.iter().copied());
        cmd.arg("target");
        if !how.config_portals {
            cmd.arg("--listen").arg(how.listen.unwrap_or("127.0.0.1:0"));
        }
        let data = how
            .data
            .map_or_else(|| dir.path().join("data"), PathBuf::from);
        cmd.arg("--data-dir").arg(data);
        if let Some(c) = how.config {
            let p = dir.path().join("target.toml");
            std::fs::write(&p, c).unwrap();
            cmd.arg("--config").arg(&p);
        }
        cmd.args(how.args);
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("target.log")).unwrap(),
            ))
            .spawn()
            .expect("starting rsv target");
        let p = Printed::until_ready(&mut child, &dir.path().join("target.log"));
        Target {
            child: Some(child),
            portal: p.portals.last().cloned().unwrap_or_default(),
            control: p.control,
            control_socket: p.control_socket,
            metrics: p.metrics,
            iqns: p.iqns,
            portals: p.portals,
            dir,
        }
    }

    /// The first target's IQN.
    pub fn iqn(&self) -> &str {
        &self.iqns[0]
    }

    /// Where the target keeps its stores (`lun0.img` is the embedded default's LUN).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn url(&self, lun: u16) -> String {
        format!("iscsi://{}/{}/{lun}", self.portal, self.iqns[0])
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("target.log")).unwrap_or_default()
    }

    /// Waits (up to 5 s) for a log line containing `what`, and returns it.
    pub fn log_line(&self, what: &str) -> String {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log();
            if let Some(l) = log.lines().find(|l| l.contains(what)) {
                return l.to_owned();
            }
            assert!(
                Instant::now() < until,
                "no log line with {what:?} in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many log lines contain `what`.
    pub fn log_count(&self, what: &str) -> usize {
        self.log().lines().filter(|l| l.contains(what)).count()
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
