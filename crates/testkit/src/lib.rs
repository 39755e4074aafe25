//! The harness Reservoir's tests share, one copy of each piece: `rsv target` as a process
//! ([`Target`]) or in this process ([`inproc`], [`raw`]), the real peers (tgt, libiscsi,
//! the tools' presence: [`have`], [`skip`]), a connection-cutting proxy, the notify socket,
//! the LUN-masking walk, replicated sites of targets with their sync agents ([`site`]), a
//! writer of sequence-stamped units ([`stamps`]), files of random bytes and the waits
//! around them.
//!
//! A dev-dependency only: no product crate depends on it (`publish = false`).

pub mod blocks;
pub mod ceph;
pub mod exposition;
pub mod inproc;
pub mod notify;
pub mod output;
pub mod proxy;
pub mod raw;
pub mod ready;
pub mod site;
pub mod stamps;
pub mod target;
pub mod tgt;
pub mod walk;
pub mod wan;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use inproc::busy_until;
pub use proxy::CuttingProxy;
pub use target::{Spawn, Target};
pub use tgt::{Chap, Tgt};

/// Whether a missing peer fails the test rather than skipping it: under CI or
/// `RESERVOIR_TEST_STRICT` (scripts/test.sh), where everything is installed and built.
pub fn strict() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some()
}

/// Notes why a test does not run; when [`strict`], fails it instead.
pub fn skip(why: &str) {
    if strict() {
        panic!("cannot run: {why}");
    }
    eprintln!("SKIP: {why}");
}

/// Whether a peer tool is installed. When [`strict`] a missing tool is a failure (the test
/// command installs them), elsewhere the test is skipped with a note.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        if strict() {
            panic!("{tool} is not installed; scripts/setup.sh should have installed it");
        }
        eprintln!("SKIP: {tool} not installed");
    }
    found
}

/// The `rsv` binary under test: `$RSV_BIN`, else the one cargo built beside this test
/// (a test runs from `target/PROFILE/deps/`, the binary is `target/PROFILE/rsv`; the
/// tests that run it are tests of `crates/rsv`, so cargo has built it first).
pub fn rsv() -> PathBuf {
    if let Some(p) = std::env::var_os("RSV_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let beside = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("rsv"))
        .filter(|p| p.exists());
    beside.unwrap_or_else(|| {
        panic!(
            "no rsv binary near {} (a test of crates/rsv has one; else set RSV_BIN)",
            exe.display()
        )
    })
}

/// `rsv` in the network namespace `ns` (`ip netns exec`).
pub fn rsv_in(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(rsv());
    c
}

/// Runs `cmd`, which must succeed, and parses what it printed as JSON.
pub fn run_json(cmd: &mut Command) -> serde_json::Value {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// The bench's binary (`rsv-lab wan`, `rsv-lab timing`) beside the `rsv` under test, where
/// a workspace build puts it; the `rsv` package does not build it, so `cargo test -p rsv
/// -p rsv-lab --test NAME` builds both. Missing, the test is skipped with a note (failed
/// when [`strict`]).
pub fn rsv_lab() -> Option<PathBuf> {
    let lab = rsv().with_file_name("rsv-lab");
    if lab.exists() {
        return Some(lab);
    }
    skip(&format!("no {} (cargo build -p rsv-lab)", lab.display()));
    None
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

/// Runs `cmd`, asserts it succeeded, and returns its standard output.
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

/// A file of `size` random bytes in which some whole megabytes are zeros, so that a copy's
/// sparse handling is exercised.
pub fn random_file_with_holes(path: &Path, size: usize, seed: u64) {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut f = std::fs::File::create(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len());
        rng.fill_bytes(&mut buf[..n]);
        if (left / (1 << 20)) % 7 == 3 {
            buf[..n].fill(0);
        }
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
}

/// `len` seeded pseudo-random bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Whether two files hold the same bytes.
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

/// A loopback TCP port free when asked (bound to port 0, then let go).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 50 ms until it gives a value, for at most `limit`; panics naming
/// `what` when it never does. A bound against hanging, not a measurement.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until something listens on `addr` (a TCP connect succeeds).
pub fn wait_for_port(addr: &str, limit: Duration) {
    wait_for(&format!("a listener on {addr}"), limit, || {
        std::net::TcpStream::connect(addr).ok().map(|_| ())
    })
}

/// `qemu-img convert` of the raw image `src` onto `url` (an existing LUN: `-n`).
pub fn qemu_write(src: &Path, url: &str) {
    let args = ["convert", "-n", "-f", "raw", "-O", "raw"];
    run_ok(
        "qemu-img",
        &[&args[..], &[src.to_str().unwrap(), url]].concat(),
    );
}

/// `qemu-img convert` of `url` (iscsi://, rbd:…) into the raw image file `dst`.
pub fn qemu_read(url: &str, dst: &Path) {
    let args = ["convert", "-f", "raw", "-O", "raw"];
    run_ok(
        "qemu-img",
        &[&args[..], &[url, dst.to_str().unwrap()]].concat(),
    );
}

/// `len` random bytes written to `url` by qemu-img (its iSCSI driver is libiscsi) and read
/// back into a file of `dir`: the same bytes.
pub fn qemu_round_trip(url: &str, dir: &Path, len: usize, seed: u64) {
    let src = dir.join(format!("src-{seed}.raw"));
    let back = dir.join(format!("back-{seed}.raw"));
    random_file(&src, len, seed);
    qemu_write(&src, url);
    qemu_read(url, &back);
    let a = std::fs::read(&src).unwrap();
    let b = std::fs::read(&back).unwrap();
    assert!(
        b.len() >= a.len(),
        "read back {} of {} bytes",
        b.len(),
        a.len()
    );
    assert!(
        a == b[..a.len()],
        "image read back differs from what was written"
    );
}

/// Runs libiscsi's `iscsi-test-cu` with `args`, killing it if it outlives `limit` (a bound
/// against hanging); its output, also written to `log`.
pub fn libiscsi_suite(args: &[&str], limit: Duration, log: &Path) -> String {
    let mut child = Command::new("iscsi-test-cu")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting iscsi-test-cu");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let deadline = Instant::now() + limit;
    let timed_out = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = reader.join().unwrap();
    std::fs::write(log, &out).unwrap();
    assert!(
        !timed_out,
        "iscsi-test-cu {args:?} ran longer than {limit:?}; output in {}:\n{}",
        log.display(),
        &out[out.len().saturating_sub(3000)..]
    );
    out
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

#[derive(clap::Parser)]
struct CpCli {
    #[command(flatten)]
    args: tools::cli::CpArgs,
}

/// `rsv cp`'s arguments as its command line would give them (`rsv cp ARGS`).
pub fn cp_args(args: &[&str]) -> tools::cli::CpArgs {
    use clap::Parser;
    CpCli::parse_from(std::iter::once("cp").chain(args.iter().copied())).args
}

/// A multi-threaded runtime, for a test that is not async itself.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Builds `libiscsi_cdb.c` (a libiscsi client that sends the CDBs it is given, one a line,
/// and answers status, sense and data) in `dir` with the system's cc; needs libiscsi-dev.
pub fn build_libiscsi_client(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/libiscsi_cdb.c");
    let bin = dir.join("libiscsi_cdb");
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-liscsi")
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "building {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}
