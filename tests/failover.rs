//! Failover and failback end to end (`rsv sync promote|demote|resync`): two sites, each an
//! `rsv target` process with its agent on its own loopback address, a file LUN with
//! change tracking on each. A is synced to B, written more, killed; B is promoted and
//! written; A comes back, is demoted and resynced from B with only the units that differ;
//! then both are promoted and a sync between them is refused.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use testkit::rsv;

const IQN: &str = "iqn.2026-11.org.reservoir:dr";
const SIZE: u64 = 16 << 20;
const UNIT: u64 = 64 << 10;

/// An `rsv target` whose configuration and data outlive it (it can be killed and started
/// again on the same data).
struct Site {
    addr: String,
    control: u16,
    dir: PathBuf,
    child: Option<Child>,
    portal: String,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Site {
    fn new(root: &Path, addr: &str, control: u16, key: &Path) -> Site {
        let dir = root.join(addr);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("target.toml"),
            format!(
                "portals = [\"{addr}:0\"]\ndata_dir = \"{}\"\n[control]\nlisten = \"{addr}:{control}\"\n\
                 key_file = \"{}\"\n[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\n\
                 store = \"file:disk.img?size={SIZE}\"\ntrack = true\ntrack_unit = \"64KiB\"\n",
                dir.display(),
                key.display()
            ),
        )
        .unwrap();
        let mut s = Site {
            addr: addr.into(),
            control,
            dir,
            child: None,
            portal: String::new(),
        };
        s.start();
        s
    }

    fn start(&mut self) {
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
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!(
                    "rsv target on {} exited:\n{}",
                    self.addr,
                    std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
                );
            }
            match line.trim() {
                l if l.starts_with("portal ") => self.portal = l[7..].to_owned(),
                "ready" => break,
                _ => {}
            }
        }
        self.child = Some(child);
    }

    /// SIGKILL: the site is lost as it stands.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn volume(&self) -> String {
        format!("{}:{}/{IQN}/0", self.addr, self.control)
    }

    fn url(&self) -> String {
        format!("iscsi://{}/{IQN}/0", self.portal)
    }

    /// The LUN's bytes, read from its file (the target writes it in place).
    fn image(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("disk.img")).unwrap()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes `data` at `offset` as an application does (the initiator's own name, not a
/// replica's writer); the SCSI error, if refused.
fn app_write(url: &str, offset: u64, data: Vec<u8>) -> Result<(), initiator::Error> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = initiator::IscsiUrl::parse(url).unwrap();
        let lun = initiator::Lun::open_url(&url, &initiator::SessionOptions::default())
            .await
            .unwrap();
        let r = lun.write_at(offset, Bytes::from(data)).await;
        let _ = lun.flush().await;
        let _ = lun.session().logout().await;
        r
    })
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write_protected(e: &initiator::Error) -> bool {
    matches!(e, initiator::Error::Scsi { sense: Some(s), .. } if s.key == 0x07 && s.asc == 0x27)
}

/// `rsv sync ARGS --key-file KEY`: exit status, stdout, stderr.
fn sync(key: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(rsv())
        .arg("sync")
        .args(args)
        .arg("--key-file")
        .arg(key)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn sync_ok(key: &Path, args: &[&str]) -> String {
    let (ok, out, err) = sync(key, args);
    assert!(ok, "rsv sync {args:?} failed:\n{out}\n{err}");
    out
}

fn status(key: &Path, site: &Site) -> serde_json::Value {
    let out = sync_ok(key, &["status", &site.volume(), "--json"]);
    serde_json::from_str(out.trim()).unwrap()
}

/// Units of `UNIT` bytes in which `a` and `b` differ, and their bytes.
fn differing(a: &[u8], b: &[u8]) -> (u64, u64) {
    let units = a
        .chunks(UNIT as usize)
        .zip(b.chunks(UNIT as usize))
        .filter(|(x, y)| x != y)
        .count() as u64;
    (units, units * UNIT)
}

#[test]
fn failover_then_failback_sends_only_what_differs() {
    let root = tempfile::tempdir().unwrap();
    let key = root.path().join("control.key");
    std::fs::write(&key, "failover test key 0123456789abcdef").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let port = free_port();
    let mut a = Site::new(root.path(), "127.0.0.71", port, &key);
    let b = Site::new(root.path(), "127.0.0.72", port, &key);

    // A is the primary: written, synced to B.
    app_write(&a.url(), 0, noise(4 << 20, 1)).unwrap();
    sync_ok(&key, &[&a.volume(), &b.volume(), "--json"]);
    let (sa, sb) = (status(&key, &a), status(&key, &b));
    assert_eq!(
        (sa["role"].as_str(), sa["epoch"].as_u64()),
        (Some("primary"), Some(1))
    );
    assert_eq!(
        (sb["role"].as_str(), sb["epoch"].as_u64()),
        (Some("replica"), Some(1))
    );
    assert_eq!(sa["image"], sb["image"], "both hold the sync's image");
    assert!(sa["image"].is_string());
    // A replica is read-only to applications.
    let e = app_write(&b.url(), 0, vec![1; 4096]).unwrap_err();
    assert!(
        write_protected(&e),
        "an application write to the replica: {e:?}"
    );
    assert_eq!(a.image(), b.image());

    // A is written more; these never reach B. Then site A is lost.
    app_write(&a.url(), 8 << 20, noise(1 << 20, 2)).unwrap();
    app_write(&a.url(), 14 << 20, noise(100 << 10, 3)).unwrap();
    a.kill();

    // B takes over at a new epoch and is written: over part of A's lost writes, and
    // elsewhere.
    let p = sync_ok(&key, &["promote", &b.volume(), "--json"]);
    let p: serde_json::Value = serde_json::from_str(p.trim()).unwrap();
    assert_eq!(
        (p["role"].as_str(), p["epoch"].as_u64()),
        (Some("primary"), Some(2))
    );
    app_write(&b.url(), (8 << 20) + (512 << 10), noise(1 << 20, 4)).unwrap();
    app_write(&b.url(), 2 << 20, noise(256 << 10, 5)).unwrap();

    // A comes back (primary at epoch 1 as it knows), is demoted, and resynced from B.
    a.start();
    let d = sync_ok(&key, &["demote", &a.volume(), "--json"]);
    let d: serde_json::Value = serde_json::from_str(d.trim()).unwrap();
    assert_eq!(
        (d["role"].as_str(), d["epoch"].as_u64()),
        (Some("replica"), Some(1))
    );
    let (units, differ) = differing(&a.image(), &b.image());
    assert!(units > 0);
    let out = sync_ok(&key, &["resync", &b.volume(), &a.volume(), "--json"]);
    let done: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "done")
        .expect("a done line");
    let sent = done["data_bytes"].as_u64().unwrap() + done["zero_bytes"].as_u64().unwrap();
    println!(
        "resync: {units} unit(s) of {UNIT} bytes differed ({differ} bytes); sent {sent} bytes ({} as data), {:.3}x",
        done["data_bytes"],
        sent as f64 / differ as f64
    );
    assert!(
        a.image() == b.image(),
        "A equals B byte for byte after the resync"
    );
    assert!(
        sent >= differ,
        "sent {sent} bytes, less than the {differ} that differ"
    );
    assert!(
        sent * 10 <= differ * 11,
        "sent {sent} bytes for {differ} that differ: more than 1.1x"
    );
    // A is B's replica now, at B's epoch, read-only to applications.
    let sa = status(&key, &a);
    assert_eq!(
        (sa["role"].as_str(), sa["epoch"].as_u64()),
        (Some("replica"), Some(2))
    );
    assert_eq!(sa["image"], status(&key, &b)["image"]);
    let e = app_write(&a.url(), 0, vec![1; 4096]).unwrap_err();
    assert!(
        write_protected(&e),
        "an application write to the demoted A: {e:?}"
    );

    // Two primaries: both promoted; a sync either way is refused before any data moves,
    // naming the stale site and what to run.
    sync_ok(&key, &["promote", &a.volume()]);
    app_write(&b.url(), 0, noise(64 << 10, 6)).unwrap();
    let before = a.image();
    for (src, dst) in [(&b, &a), (&a, &b)] {
        let (ok, out, err) = sync(&key, &[&src.volume(), &dst.volume()]);
        assert!(!ok, "a sync between two primaries ran:\n{out}");
        assert!(err.contains("two primaries"), "{err}");
        assert!(
            err.contains(&format!("{} is stale", b.volume())),
            "B (epoch 2) is stale beside A (epoch 3): {err}"
        );
        assert!(
            err.contains(&format!("rsv sync demote {}", b.volume())),
            "{err}"
        );
    }
    assert!(a.image() == before, "a refused sync wrote A");
}
