//! tgt (`tgtd`, configured through `tgtadm`) on a port of its own: the other target the
//! initiator's tests and the conformance runs compare with.

use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::{free_port, have};

pub struct Chap {
    pub user: &'static str,
    pub password: &'static str,
    /// The target's own account for mutual CHAP.
    pub target: Option<(&'static str, &'static str)>,
}

/// A tgtd of our own on a free port with one target and LUN 1 backed by a sparse file.
pub struct Tgt {
    child: Child,
    pub port: u16,
    control: u16,
    pub iqn: String,
    _dir: tempfile::TempDir,
}

impl Tgt {
    pub fn start(lun_size: u64, chap: Option<Chap>) -> Option<Tgt> {
        if !have("tgtd") || !have("tgtadm") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        // tgtd takes control ports up to about 32000; the listening port is unique, so is
        // this.
        let control = 1000 + port % 30000;
        let child = Command::new("tgtd")
            .args(["-f", "--iscsi", &format!("portal=127.0.0.1:{port}")])
            .args(["-C", &control.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let iqn = format!("iqn.2026-01.org.reservoir.test:tgt{port}");
        let t = Tgt {
            child,
            port,
            control,
            iqn,
            _dir: dir,
        };
        let mut ready = false;
        for _ in 0..100 {
            if t.adm(&["--op", "show", "--mode", "target"]) {
                ready = true;
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        assert!(ready, "tgtd did not come up");
        let img = t._dir.path().join("lun1.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(lun_size)
            .unwrap();
        let iqn = t.iqn.clone();
        assert!(t.adm(&["--op", "new", "--mode", "target", "--tid", "1", "-T", &iqn]));
        assert!(t.adm(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            img.to_str().unwrap()
        ]));
        assert!(t.adm(&["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"]));
        if let Some(c) = chap {
            t.account(c.user, c.password, false);
            if let Some((u, p)) = c.target {
                t.account(u, p, true);
            }
        }
        Some(t)
    }

    /// Sets a target parameter (e.g. HeaderDigest) on target 1.
    pub fn set_param(&self, name: &str, value: &str) {
        assert!(self
            .adm(&["--op", "update", "--mode", "target", "--tid", "1", "-n", name, "-v", value]));
    }

    /// A CHAP account bound to target 1: the initiator's, or with `outgoing` the target's
    /// own (mutual CHAP).
    fn account(&self, user: &str, password: &str, outgoing: bool) {
        let new = ["--op", "new", "--mode", "account", "--user", user];
        assert!(self.adm(&[&new[..], &["--password", password]].concat()));
        let bind = [
            "--op", "bind", "--mode", "account", "--tid", "1", "--user", user,
        ];
        let out: &[&str] = if outgoing { &["--outgoing"] } else { &[] };
        assert!(self.adm(&[&bind[..], out].concat()));
    }

    fn adm(&self, args: &[&str]) -> bool {
        Command::new("tgtadm")
            .args(["-C", &self.control.to_string(), "--lld", "iscsi"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    pub fn portal(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The URL of LUN `lun` of its target.
    pub fn url(&self, lun: u16) -> String {
        format!("iscsi://{}/{}/{lun}", self.portal(), self.iqn)
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
