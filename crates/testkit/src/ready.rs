//! A daemon of Reservoir's (`rsv target`, `rsv isns`, `rsv media`) started for a test and
//! waited for: each prints the addresses it listens on, then `ready`, on its stdout.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Starts `cmd` (with `RUST_LOG=info`, its stderr in `log`), waits for it to print `ready`
/// and returns it with the address of its first `listening ADDR` or `portal ADDR` line
/// (empty when it printed none). Panics with the log when it exits first.
pub fn spawn_ready(cmd: &mut Command, log: &Path) -> (Child, String) {
    let (child, said) = spawn_until_ready(cmd, log);
    let addr = said
        .iter()
        .find_map(|l| l.strip_prefix("listening ").or(l.strip_prefix("portal ")))
        .unwrap_or_default()
        .to_owned();
    (child, addr)
}

/// Starts `cmd` as [`spawn_ready`] does and returns it with the lines it printed before
/// `ready`, trimmed. Its stdout is then read to the end on a thread of its own, so that it
/// never blocks on a full pipe nor writes to a closed one.
pub fn spawn_until_ready(cmd: &mut Command, log: &Path) -> (Child, Vec<String>) {
    let mut child = cmd
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!(
                "{cmd:?} exited before ready:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        match line.trim() {
            "ready" => break,
            l => said.push(l.to_owned()),
        }
    }
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    (child, said)
}

/// `rsv isns` on loopback, its iSNS port and its `/metrics` port chosen by the kernel;
/// stopped on drop.
pub struct RsvIsns {
    child: Child,
    /// Where it takes iSNS requests (`listening ADDR`).
    pub addr: String,
    /// Where it serves `/metrics` (`metrics ADDR`).
    pub metrics: String,
}

impl RsvIsns {
    /// Started with `args` after its listening flags, its log in `log`; returns once it is
    /// ready.
    pub fn start(args: &[&OsStr], log: &Path) -> RsvIsns {
        let mut cmd = Command::new(crate::rsv());
        cmd.args([
            "isns",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
        ])
        .args(args);
        let (child, said) = spawn_until_ready(&mut cmd, log);
        let find = |word: &str| {
            said.iter()
                .find_map(|l| l.strip_prefix(word))
                .unwrap_or_default()
                .to_owned()
        };
        let server = RsvIsns {
            addr: find("listening "),
            metrics: find("metrics "),
            child,
        };
        assert!(
            !server.addr.is_empty() && !server.metrics.is_empty(),
            "rsv isns printed no addresses: {said:?}"
        );
        server
    }
}

impl Drop for RsvIsns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
