//! An emulated long path for a test: `rsv-lab wan` joins two network namespaces,
//! `NAME-a` and `NAME-b`, by a link of the given round trip and rate, and the link goes
//! down however the test ends, after the process the test runs in it (a target).

use std::path::PathBuf;
use std::process::{Child, Command};

use crate::{rsv_lab, run_json, skip};

/// A link that `rsv-lab wan` brought up, taken down on drop.
pub struct WanLink {
    name: String,
    /// `rsv-lab`, whose `wan` brings the link up and down.
    bench: PathBuf,
    /// The address of the `b` side, where a target listens.
    pub addr: String,
    /// What the test runs in the link (a target): killed before the link goes down.
    pub target: Option<Child>,
}

impl WanLink {
    /// The link `name` with `rtt` and `rate` (as `rsv-lab wan up` reads them: `20ms`,
    /// `60mbit`), a link of that name left by an earlier run taken down first. `None`
    /// when it cannot be (not root, no `rsv-lab`): the test is skipped with a note, or
    /// failed when [`crate::strict`].
    pub fn up(name: &str, rtt: &str, rate: &str) -> Option<WanLink> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip("needs root (network namespaces)");
            return None;
        }
        let mut link = WanLink {
            name: name.to_owned(),
            bench: rsv_lab()?,
            addr: String::new(),
            target: None,
        };
        link.down();
        let up = run_json(Command::new(&link.bench).args([
            "wan", "up", "--name", name, "--rtt", rtt, "--rate", rate, "--json",
        ]));
        link.addr = up["b"]["addr"].as_str().expect("wan up: b.addr").to_owned();
        Some(link)
    }

    /// The namespace of the `a` side (the initiator's).
    pub fn ns_a(&self) -> String {
        format!("{}-a", self.name)
    }

    /// The namespace of the `b` side (the target's).
    pub fn ns_b(&self) -> String {
        format!("{}-b", self.name)
    }

    fn down(&self) {
        let _ = Command::new(&self.bench)
            .args(["wan", "down", "--name", &self.name])
            .output();
    }
}

impl Drop for WanLink {
    fn drop(&mut self) {
        if let Some(mut t) = self.target.take() {
            let _ = t.kill();
            let _ = t.wait();
        }
        self.down();
    }
}
