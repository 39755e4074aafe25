//! Peers for the end-to-end tests: tgtd configured through tgtadm, Reservoir's own target
//! (the `rsv` binary), and a TCP proxy that cuts a connection after some bytes.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub fn random_file(path: &Path, size: usize, seed: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut f = std::fs::File::create(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len());
        rng.fill_bytes(&mut buf[..n]);
        // Some zero megabytes, so sparse handling is exercised.
        if (left / (1 << 20)) % 7 == 3 {
            buf[..n].fill(0);
        }
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
}

pub fn same_files(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

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
            assert!(t.adm(&[
                "--op",
                "new",
                "--mode",
                "account",
                "--user",
                c.user,
                "--password",
                c.password
            ]));
            assert!(t.adm(&["--op", "bind", "--mode", "account", "--tid", "1", "--user", c.user]));
            if let Some((u, p)) = c.target {
                assert!(t.adm(&[
                    "--op",
                    "new",
                    "--mode",
                    "account",
                    "--user",
                    u,
                    "--password",
                    p
                ]));
                assert!(t.adm(&[
                    "--op",
                    "bind",
                    "--mode",
                    "account",
                    "--tid",
                    "1",
                    "--user",
                    u,
                    "--outgoing"
                ]));
            }
        }
        Some(t)
    }

    /// Sets a target parameter (e.g. HeaderDigest) on target 1.
    pub fn set_param(&self, name: &str, value: &str) {
        assert!(self
            .adm(&["--op", "update", "--mode", "target", "--tid", "1", "-n", name, "-v", value]));
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
}

impl Drop for Tgt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `rsv` binary: $RSV_BIN, the one next to this test's directory (same target
/// directory), or the workspace's target/debug/rsv.
/// Notes why a test does not run; under `scripts/test.sh` (RESERVOIR_TEST_STRICT) or CI,
/// where everything it needs is installed and built, fails it instead.
pub fn skip(why: &str) {
    if std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some() {
        panic!("cannot run: {why}");
    }
    eprintln!("SKIP: {why}");
}

pub fn rsv_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("RSV_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("rsv")));
    beside
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/rsv")])
        .find(|p| p.exists())
}

/// Reservoir's target on a free port with a data directory of its own.
pub struct RsvTarget {
    child: Child,
    pub portal: String,
    pub iqn: String,
    _dir: tempfile::TempDir,
}

impl RsvTarget {
    pub fn start(extra: &[&str]) -> Option<RsvTarget> {
        let bin = rsv_bin()?;
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin)
            .args(["target", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let out = BufReader::new(child.stdout.take().unwrap());
        let (mut portal, mut iqn) = (None, None);
        for line in out.lines() {
            let Ok(line) = line else { break };
            if let Some(p) = line.strip_prefix("portal ") {
                portal = Some(p.trim().to_owned());
            } else if let Some(t) = line.strip_prefix("target ") {
                iqn = Some(t.trim().to_owned());
            } else if line.trim() == "ready" {
                break;
            }
        }
        match (portal, iqn) {
            (Some(portal), Some(iqn)) => Some(RsvTarget {
                child,
                portal,
                iqn,
                _dir: dir,
            }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }
}

impl RsvTarget {
    /// The target's data directory (`lun0.img` is the default LUN's image).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn url(&self, lun: u16) -> String {
        format!("iscsi://{}/{}/{lun}", self.portal, self.iqn)
    }
}

impl Drop for RsvTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Forwards connections to `upstream`; the first connection is cut (both directions,
/// abruptly) once `cut_after` bytes went from client to target (or, with
/// [`CuttingProxy::start_on_replies`], from target to client). Later connections pass.
pub struct CuttingProxy {
    pub portal: String,
    pub cuts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl CuttingProxy {
    pub fn start(upstream: String, cut_after: usize) -> CuttingProxy {
        Self::start_counting(upstream, cut_after, false)
    }

    /// Like [`CuttingProxy::start`], but counts the bytes from the target to the client:
    /// the cut then falls among answers the target has sent, in the middle of a read.
    pub fn start_on_replies(upstream: String, cut_after: usize) -> CuttingProxy {
        Self::start_counting(upstream, cut_after, true)
    }

    fn start_counting(upstream: String, cut_after: usize, replies: bool) -> CuttingProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let portal = l.local_addr().unwrap().to_string();
        let cuts = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (cuts2, stop2) = (cuts.clone(), stop.clone());
        let armed = Arc::new(AtomicBool::new(true));
        thread::spawn(move || {
            for c in l.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(c) = c else { continue };
                let Ok(u) = TcpStream::connect(&upstream) else {
                    continue;
                };
                // Only the first connection that carries enough bytes is cut (not the
                // first one: auto-tuning's RTT probe connects and goes).
                let limit = armed.load(Ordering::Acquire).then_some(cut_after);
                let (c2, u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
                let (c3, u3) = (c.try_clone().unwrap(), u.try_clone().unwrap());
                let cut = Some((c3, u3, cuts2.clone(), armed.clone()));
                if replies {
                    thread::spawn(move || pump(c, u, None, None));
                    thread::spawn(move || pump(u2, c2, limit, cut));
                } else {
                    thread::spawn(move || pump(c, u, limit, cut));
                    thread::spawn(move || pump(u2, c2, None, None));
                }
            }
        });
        CuttingProxy { portal, cuts, stop }
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.portal);
    }
}

type Cut = (TcpStream, TcpStream, Arc<AtomicUsize>, Arc<AtomicBool>);

fn pump(mut from: TcpStream, mut to: TcpStream, limit: Option<usize>, cut: Option<Cut>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n;
        if limit.is_some_and(|l| total >= l) {
            match &cut {
                Some((a, b, cuts, armed)) if armed.swap(false, Ordering::AcqRel) => {
                    cuts.fetch_add(1, Ordering::SeqCst);
                    let _ = a.shutdown(Shutdown::Both);
                    let _ = b.shutdown(Shutdown::Both);
                    break;
                }
                // Another connection was cut already: this one carries on.
                _ => continue,
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Runs `depth` reads of 1 MiB at a time (within the first 8 MiB of `lun`) on `s` until
/// `done` says so (checked every 100 ms) or `limit` passes; true if `done` did.
pub async fn busy_until(
    s: &initiator::Session,
    lun: u16,
    depth: usize,
    limit: std::time::Duration,
    done: impl Fn(&initiator::Session) -> bool,
) -> bool {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..depth {
        let (s, stop) = (s.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let data = s.read(lun, (i as u64 % 8) * 2048, 2048).await.unwrap();
                assert_eq!(data.len(), 1 << 20);
            }
        }));
    }
    let end = std::time::Instant::now() + limit;
    let mut ok = false;
    while std::time::Instant::now() < end {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if done(s) {
            ok = true;
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    ok
}
