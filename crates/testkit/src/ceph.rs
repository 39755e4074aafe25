//! A throw-away Ceph cluster (`scripts/ceph-cluster.sh`) and `rsv target` processes
//! exporting its images: what the tests of the `rbd` store and of gateway groups (several
//! targets exporting one image) share.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::target::Printed;
use crate::{have, rsv, run_ok};

/// The target name every [`Target`] here serves.
pub const IQN: &str = "iqn.2026-11.org.reservoir:rbd";
/// libiscsi's suite's two initiator names.
pub const INITIATOR_1: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test";
pub const INITIATOR_2: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2";

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh")
}

/// Whether Ceph's daemons and tools are installed (see [`have`] for what a missing one does).
pub fn have_ceph() -> bool {
    ["ceph-mon", "ceph-osd", "ceph-authtool", "monmaptool", "rbd"]
        .iter()
        .all(|t| have(t))
}

/// A cluster of `scripts/ceph-cluster.sh` in a directory of its own; stopped on drop.
pub struct Cluster {
    pub dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start(bluestore: bool) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let mut cmd = Command::new(script());
        cmd.arg("start").arg(dir.path());
        if bluestore {
            cmd.arg("--bluestore");
        }
        let out = cmd.output().expect("running ceph-cluster.sh");
        assert!(
            out.status.success(),
            "ceph-cluster.sh start failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "ceph cluster ({}) up in {:.1} s",
            if bluestore { "bluestore" } else { "memstore" },
            t.elapsed().as_secs_f32()
        );
        Cluster { dir }
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("ceph.conf")
    }

    pub fn rbd(&self, args: &[&str]) -> String {
        let conf = self.conf();
        let mut all = vec!["-c", conf.to_str().unwrap()];
        all.extend_from_slice(args);
        run_ok("rbd", &all)
    }

    pub fn create(&self, image: &str, size: &str) {
        self.rbd(&["create", "--size", size, image]);
    }

    pub fn script(&self, cmd: &str) {
        let out = Command::new(script())
            .arg(cmd)
            .arg(self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ceph-cluster.sh {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The image's bytes, read by the `rbd` tool (not through the target).
    pub fn export(&self, image: &str, to: &Path) -> Vec<u8> {
        self.rbd(&["export", "--no-progress", image, to.to_str().unwrap()]);
        std::fs::read(to).unwrap()
    }

    /// The store's spec for `image`.
    pub fn spec(&self, image: &str) -> String {
        format!("rbd:rbd/{image}?conf={}", self.conf().display())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// `rsv target` serving `luns` under [`IQN`] on two loopback portals.
pub struct Target {
    pub child: Option<Child>,
    pub portals: Vec<String>,
    pub log: PathBuf,
}

impl Target {
    /// With `suite_acl`, only libiscsi's test initiators may log in (its tests of ACLs).
    pub fn start(dir: &Path, luns: &str, suite_acl: bool) -> Target {
        Target::start_with(dir, "", luns, suite_acl)
    }

    /// A gateway of a group: portal group `group`, whose peers are the portal groups
    /// `peers` (other gateways exporting the same image).
    pub fn gateway(dir: &Path, group: u16, peers: &[u16], luns: &str, suite_acl: bool) -> Target {
        let top = format!("portal_group = {group}\npeer_portal_groups = {peers:?}\n");
        Target::start_with(dir, &top, luns, suite_acl)
    }

    /// With `top` (keys of the configuration's top level) before the target's table.
    pub fn start_with(dir: &Path, top: &str, luns: &str, suite_acl: bool) -> Target {
        Target::start_listening(dir, top, luns, suite_acl, &["127.0.0.1:0", "127.0.0.1:0"])
    }

    /// As [`Target::start_with`], on one portal `listen` (`127.0.0.1:PORT`): a gateway
    /// killed and started again where its initiators' `?portal=` lists expect it. The
    /// port of a process just killed may take a moment to be free: tried for 10 s.
    pub fn start_at(dir: &Path, top: &str, luns: &str, listen: &str) -> Target {
        let t = Instant::now();
        loop {
            match std::panic::catch_unwind(|| {
                Target::start_listening(dir, top, luns, false, &[listen])
            }) {
                Ok(t) => return t,
                Err(e) if t.elapsed().as_secs() >= 10 => std::panic::resume_unwind(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
            }
        }
    }

    fn start_listening(
        dir: &Path,
        top: &str,
        luns: &str,
        suite_acl: bool,
        listen: &[&str],
    ) -> Target {
        let cfg = dir.join("target.toml");
        let acl = if suite_acl {
            format!("allowed_initiators = [\"{INITIATOR_1}\", \"{INITIATOR_2}\"]\n")
        } else {
            String::new()
        };
        std::fs::write(
            &cfg,
            format!("{top}[[target]]\niqn = \"{IQN}\"\n{acl}{luns}"),
        )
        .unwrap();
        let log = dir.join("target.log");
        let mut cmd = Command::new(rsv());
        cmd.arg("target");
        for l in listen {
            cmd.args(["--listen", l]);
        }
        let mut child = cmd
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            // Appended: a gateway started again keeps its earlier runs' lines.
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            ))
            .spawn()
            .expect("starting rsv target");
        let portals = Printed::until_ready(&mut child, &log).portals;
        Target {
            child: Some(child),
            portals,
            log,
        }
    }

    pub fn url(&self, portal: usize, lun: u16) -> String {
        format!("iscsi://{}/{IQN}/{lun}", self.portals[portal])
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two gateways of one group exporting `luns` (portal groups 1 and 2, each the other's
/// peer), each in a directory of its own, once both report every group active/optimized
/// ([`wait_until_all_active`]).
pub struct Pair {
    pub a: Target,
    pub b: Target,
    /// Their directories, `a`'s then `b`'s (for a test's own files too).
    pub dirs: [tempfile::TempDir; 2],
}

/// Starts a [`Pair`] (with `suite_acl`: only libiscsi's initiators may log in).
pub fn gateway_pair(luns: &str, suite_acl: bool) -> Pair {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = Target::gateway(dirs[0].path(), 1, &[2], luns, suite_acl);
    let b = Target::gateway(dirs[1].path(), 2, &[1], luns, suite_acl);
    wait_until_all_active(&[a.url(0, 0), b.url(0, 0)], Duration::from_secs(30));
    Pair { a, b, dirs }
}

/// A `[[target.lun]]` table: LUN `id` on store `spec`, with `extra` keys.
pub fn lun(id: u16, spec: &str, extra: &str) -> String {
    format!("\n[[target.lun]]\nid = {id}\nstore = \"{spec}\"\n{extra}\n")
}

/// The names of the tests iscsi-test-cu reports FAILED, and how many ran and were skipped.
pub fn failures(out: &str) -> (Vec<String>, usize, usize) {
    let mut suite = String::new();
    let mut failed = Vec::new();
    let (mut ran, mut skipped) = (0, 0);
    let mut current = String::new();
    for line in out.lines() {
        if let Some(s) = line.strip_prefix("Suite: ") {
            suite = s.trim().to_owned();
        } else if let Some(rest) = line.trim_start().strip_prefix("Test: ") {
            ran += 1;
            let (name, tail) = rest.split_once(" ...").unwrap_or((rest, ""));
            current = format!("{suite}.{name}");
            // "passed" or "FAILED" right after the dots, or at the start of a later line;
            // "[FAILED]" in a test's messages is no verdict.
            if tail.trim_start().starts_with("FAILED") {
                failed.push(current.clone());
            }
        } else if line.starts_with("FAILED") {
            failed.push(current.clone());
        }
        if line.contains("[SKIPPED]") {
            skipped += 1;
        }
    }
    failed.dedup();
    (failed, ran, skipped)
}

/// Waits until every gateway of a group (`urls`, LUN 0 of each) reports every target port
/// group active/optimized in REPORT TARGET PORT GROUPS. The gateways judge each other from
/// heartbeats in the cluster, so for a few seconds after they start a peer is reported
/// transitioning, and its change to active raises ASYMMETRIC ACCESS STATE CHANGED on the
/// nexuses then logged in; a client that logs in after this wait meets none of that (a
/// test comparing exact answers, or libiscsi's suite, would count it as a failure).
pub fn wait_until_all_active(urls: &[String], limit: Duration) {
    crate::rt().block_on(async {
        let mut sessions = Vec::new();
        for u in urls {
            let url = initiator::IscsiUrl::parse(u).expect("a gateway's URL");
            // One of libiscsi's names: a gateway started with `suite_acl` admits only those.
            let opts = initiator::SessionOptions {
                initiator_name: INITIATOR_2.into(),
                ..Default::default()
            };
            let s = initiator::Session::connect(&url, &opts)
                .await
                .expect("login to a gateway");
            sessions.push(s);
        }
        let t = Instant::now();
        loop {
            let mut all = true;
            for s in &sessions {
                // REPORT TARGET PORT GROUPS, length-only format: a 4-byte header, then a
                // descriptor of 8 bytes and 4 per port (one port each here).
                let d = s
                    .command_ok(
                        0,
                        &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0],
                        initiator::DataDir::Read(1024),
                    )
                    .await
                    .expect("REPORT TARGET PORT GROUPS")
                    .data;
                all &= d.len() > 4 && d[4..].chunks(12).all(|g| g[0] & 0x0f == 0);
            }
            if all {
                break;
            }
            assert!(
                t.elapsed() < limit,
                "the gateways did not all report active/optimized within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for s in sessions {
            let _ = s.logout().await;
        }
    });
}
