//! Replicated sites: `rsv target` processes standing for hosts, each on a loopback address
//! of its own (127.0.0.K, as separate machines would be) with its sync agent on a control
//! endpoint, every agent signing with one key; a site is a file server whose LUN stripes a
//! volume over disk servers. What the tests of `rsv sync`, cuts, cycles and failover share.
//!
//! ```no_run
//! # use testkit::site::{key_file, Hosts, KEY};
//! let tmp = tempfile::tempdir().unwrap();
//! let key = key_file(&tmp.path().join("key"), KEY);
//! let hosts = Hosts::new("iqn.2026-11.org.reservoir:vol", testkit::free_port(), &key);
//! let a = hosts.site(None, 10, 2, "file:disk.img?size=8M", "");
//! let b = hosts.site(None, 20, 2, "file:disk.img?size=8M", "");
//! let out = hosts.sync_ok(&["--json", &a.volume(), &b.volume()]);
//! ```

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::rsv;
use crate::target::Printed;

/// A key the agents accept (they want 16 bytes or more).
pub const KEY: &str = "a shared key of more than 16 bytes";

/// Writes `text` to the key file `path`, readable by its owner only (the agents and
/// `rsv sync` refuse one that others may read), and returns the path.
pub fn key_file(path: &Path, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_owned()
}

/// What the hosts of one test share: the target name each serves, the port of every
/// agent (the same port on each host's own address), the key they sign with, and the
/// port of their iSCSI portals (0: one the OS chooses at each start).
#[derive(Clone, Debug)]
pub struct Hosts {
    pub iqn: String,
    pub control_port: u16,
    pub iscsi_port: u16,
    pub key: PathBuf,
}

impl Hosts {
    /// Hosts serving `iqn`, their agents on `control_port`, signing with `key`; iSCSI
    /// portals on ports the OS chooses.
    pub fn new(iqn: &str, control_port: u16, key: &Path) -> Hosts {
        Hosts {
            iqn: iqn.into(),
            control_port,
            iscsi_port: 0,
            key: key.into(),
        }
    }

    /// Every portal on `port` instead, so that a host restarted comes back where its
    /// peers (a file server's stripe members) look for it.
    pub fn with_iscsi_port(self, port: u16) -> Hosts {
        Hosts {
            iscsi_port: port,
            ..self
        }
    }

    /// An `rsv target` at `addr` serving `luns` (`[[target.lun]]` tables) from `dir`,
    /// made if missing and kept after the host for a restart on the same data; from a
    /// temporary directory of its own, removed with the host, when None. Returns once it
    /// is ready (panics with its log if it ends before).
    pub fn host(&self, dir: Option<&Path>, addr: &str, luns: &str) -> Host {
        let (dir, tmp) = match dir {
            Some(d) => {
                std::fs::create_dir_all(d).unwrap();
                (d.to_owned(), None)
            }
            None => {
                let t = tempfile::tempdir().unwrap();
                (t.path().to_owned(), Some(t))
            }
        };
        std::fs::write(
            dir.join("target.toml"),
            format!(
                "portals = [\"{addr}:{}\"]\ndata_dir = \"{}\"\n[control]\n\
                 listen = \"{addr}:{}\"\nkey_file = \"{}\"\n[[target]]\niqn = \"{}\"\n{luns}",
                self.iscsi_port,
                dir.display(),
                self.control_port,
                self.key.display(),
                self.iqn
            ),
        )
        .unwrap();
        let mut h = Host {
            child: None,
            addr: addr.into(),
            portal: String::new(),
            control: format!("{addr}:{}", self.control_port),
            iqn: self.iqn.clone(),
            dir,
            _tmp: tmp,
        };
        h.restart();
        h
    }

    /// A site at 127.0.0.{base}: `disks` disk servers at 127.0.0.{base+1}.., each with LUN
    /// 0 on `store` and the LUN keys `extra` (`"track = true\n"`), and a file server at
    /// 127.0.0.{base} whose LUN 0 stripes over them in 64 KiB units. Under `dir`
    /// (`disk0`, `disk1`…, `fs`) when given, else each host in a temporary directory.
    pub fn site(&self, dir: Option<&Path>, base: u8, disks: u8, store: &str, extra: &str) -> Site {
        let at = |name: &str| dir.map(|d| d.join(name));
        let disks: Vec<Host> = (0..disks)
            .map(|i| {
                self.host(
                    at(&format!("disk{i}")).as_deref(),
                    &format!("127.0.0.{}", base + 1 + i),
                    &format!("[[target.lun]]\nid = 0\nstore = \"{store}\"\n{extra}"),
                )
            })
            .collect();
        let members: Vec<String> = disks.iter().map(|d| d.url(0)).collect();
        let file_server = self.host(
            at("fs").as_deref(),
            &format!("127.0.0.{base}"),
            &format!(
                "[[target.lun]]\nid = 0\nstore = \"stripe:?unit=64K&members=[{}]\"\n",
                members.join(",")
            ),
        );
        Site { file_server, disks }
    }

    /// `rsv sync ARGS --key-file KEY` (the key last, where both the copy and the
    /// subcommands take it), to be run or spawned.
    pub fn sync(&self, args: &[&str]) -> Command {
        let mut c = Command::new(rsv());
        c.arg("sync").args(args).arg("--key-file").arg(&self.key);
        c
    }

    /// Spawns [`Hosts::sync`] with `args` (which hold `--json`; its stderr dropped) and
    /// reads its progress lines until `until` picks one: the sync, still running, and what
    /// `until` gave. Panics if it ends before (`what` says what was awaited) or prints
    /// another event.
    pub fn sync_until<T>(
        &self,
        args: &[&str],
        what: &str,
        mut until: impl FnMut(&serde_json::Value) -> Option<T>,
    ) -> (Child, T) {
        // The sync is returned running, the caller's to end; a panic here (it ended first,
        // or printed something else) leaves it to end on its own.
        #[allow(clippy::zombie_processes)]
        let mut child = self
            .sync(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("rsv sync ended before {what}"))
                .unwrap();
            let tick: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(tick["event"], "progress", "{tick}");
            if let Some(v) = until(&tick) {
                return (child, v);
            }
        }
    }

    /// Runs [`Hosts::sync`], which must succeed; what it printed.
    #[track_caller]
    pub fn sync_ok(&self, args: &[&str]) -> String {
        let out = self.sync(args).output().unwrap();
        assert!(
            out.status.success(),
            "rsv sync {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The JSON lines of `--json` output (other lines passed over).
pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The last JSON line of `--json` output: a sync's result.
pub fn result_line(out: &str) -> serde_json::Value {
    json_lines(out)
        .pop()
        .unwrap_or_else(|| panic!("no result line in:\n{out}"))
}

/// An `rsv target` of [`Hosts::host`]: its configuration (`target.toml`), log (`log`,
/// appended across restarts) and stores in `dir`. Killed when dropped.
pub struct Host {
    child: Option<Child>,
    /// The loopback address it listens on.
    pub addr: String,
    /// Its iSCSI portal, as it printed it at its last start.
    pub portal: String,
    /// Its agent's endpoint, `ADDR:PORT`.
    pub control: String,
    iqn: String,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Host {
    /// Starts it (again, after a kill: on the same configuration and data) and waits
    /// until it is ready.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .unwrap();
        let mut child = Command::new(rsv())
            .args(["target", "--config"])
            .arg(self.dir.join("target.toml"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting rsv target");
        let printed = Printed::until_ready(&mut child, &self.dir.join("log"));
        self.portal = printed.portals.last().cloned().unwrap_or_default();
        self.child = Some(child);
    }

    /// SIGKILL: a crash, nothing flushed or closed.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// `iscsi://PORTAL/IQN/LUN`.
    pub fn url(&self, lun: u16) -> String {
        format!("iscsi://{}/{}/{lun}", self.portal, self.iqn)
    }

    /// The LUN as `rsv sync` names a volume: `ADDR:CONTROL_PORT/IQN/LUN`.
    pub fn volume(&self, lun: u16) -> String {
        format!("{}/{}/{lun}", self.control, self.iqn)
    }
}

/// A file server and the disk servers its LUN 0 stripes over ([`Hosts::site`]).
pub struct Site {
    pub file_server: Host,
    pub disks: Vec<Host>,
}

impl Site {
    /// The volume's iSCSI URL (the file server's LUN 0).
    pub fn url(&self) -> String {
        self.file_server.url(0)
    }

    /// The volume as `rsv sync` names it.
    pub fn volume(&self) -> String {
        self.file_server.volume(0)
    }

    /// The whole site lost as it stands (SIGKILL), disk servers first.
    pub fn kill(&mut self) {
        for d in &mut self.disks {
            d.kill();
        }
        self.file_server.kill();
    }

    /// The whole site started again, disk servers first (the file server opens them).
    pub fn restart(&mut self) {
        for d in &mut self.disks {
            d.restart();
        }
        self.file_server.restart();
    }
}

/// The bytes of the LUN at `url`, copied out by `rsv cp` into the file `to`.
pub fn read_lun(url: &str, to: &Path) -> Vec<u8> {
    crate::run_ok(rsv().to_str().unwrap(), &["cp", url, to.to_str().unwrap()]);
    std::fs::read(to).unwrap()
}
