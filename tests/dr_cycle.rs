//! The far copy is always whole (`backstore::undo`, `replicate::cycle`), and continuous
//! mode (`rsv sync --every`), with real `rsv target` processes on loopback: two sites,
//! each a file server striping a volume over two disk servers.
//!
//! - A sync cut off halfway (the source site SIGKILLed, then the coordinator) leaves the
//!   far copy equal to the image of the last sync, byte for byte, once the far disk
//!   servers restart (their start rolls the cycle back); a further sync completes it.
//!   With `RSV_DR_NO_UNDO=1` the far LUNs keep no undo log (`undo = false`) and this test
//!   fails: the far copy is then half one image, half the next.
//! - `rsv sync --every 1s` with a writer stamping sequence numbers: cycles commit, each
//!   reports its RPO (printed), `/metrics` carries `rsv_sync_rpo_seconds`, SIGTERM ends it
//!   with status 0, and the far copy holds a prefix of the writes (one moment).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use testkit::{random_file, rsv, run_ok};
use tools::crash::model::{self, Found, UNIT};

const IQN: &str = "iqn.2026-11.org.reservoir:drcycle";

/// An `rsv target` on its own loopback address, its data and configuration in `dir`
/// (kept across restarts).
struct Host {
    child: Option<Child>,
    addr: String,
    config: PathBuf,
    dir: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Host {
    fn start(
        dir: &Path,
        addr: &str,
        iscsi_port: u16,
        control_port: u16,
        key: &Path,
        luns: &str,
    ) -> Host {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("target.toml");
        std::fs::write(
            &config,
            format!(
                "portals = [\"{addr}:{iscsi_port}\"]\ndata_dir = \"{}\"\n[control]\n\
                 listen = \"{addr}:{control_port}\"\nkey_file = \"{}\"\n[[target]]\n\
                 iqn = \"{IQN}\"\n{luns}",
                dir.display(),
                key.display()
            ),
        )
        .unwrap();
        let mut h = Host {
            child: None,
            addr: addr.into(),
            config,
            dir: dir.into(),
        };
        h.restart();
        h
    }

    fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .unwrap();
        let mut child = Command::new(rsv())
            .args(["target", "--config"])
            .arg(&self.config)
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
            if line.trim() == "ready" {
                break;
            }
        }
        // Its stdout is not read any more: the target prints nothing after `ready`.
        self.child = Some(child);
    }

    /// SIGKILL: a crash, nothing flushed or closed.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

fn key_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("key");
    std::fs::write(&p, "a shared key of more than 16 bytes").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// A site: two disk servers of 16 MiB at 127.0.0.{base+1} and {base+2}, and a file
/// server at 127.0.0.{base} striping over them in 64 KiB units.
struct Site {
    file_server: Host,
    disks: Vec<Host>,
    base: u8,
    iscsi_port: u16,
}

fn site(dir: &Path, base: u8, iscsi_port: u16, control_port: u16, key: &Path, extra: &str) -> Site {
    let disks: Vec<Host> = (0..2u8)
        .map(|i| {
            Host::start(
                &dir.join(format!("disk{i}")),
                &format!("127.0.0.{}", base + 1 + i),
                iscsi_port,
                control_port,
                key,
                &format!("[[target.lun]]\nid = 0\nstore = \"file:disk.img?size=16M\"\n{extra}"),
            )
        })
        .collect();
    let members: Vec<String> = (0..2u8)
        .map(|i| format!("iscsi://127.0.0.{}:{iscsi_port}/{IQN}/0", base + 1 + i))
        .collect();
    let file_server = Host::start(
        &dir.join("fs"),
        &format!("127.0.0.{base}"),
        iscsi_port,
        control_port,
        key,
        &format!(
            "[[target.lun]]\nid = 0\nstore = \"stripe:?unit=64K&members=[{}]\"\n",
            members.join(",")
        ),
    );
    Site {
        file_server,
        disks,
        base,
        iscsi_port,
    }
}

impl Site {
    fn url(&self) -> String {
        format!("iscsi://127.0.0.{}:{}/{IQN}/0", self.base, self.iscsi_port)
    }

    fn volume(&self, control_port: u16) -> String {
        format!("127.0.0.{}:{control_port}/{IQN}/0", self.base)
    }

    /// Disk server `i`'s member, read whole.
    fn member(&self, i: usize, tmp: &Path) -> Vec<u8> {
        let out = tmp.join(format!("member-{}-{i}", self.base));
        let url = format!(
            "iscsi://127.0.0.{}:{}/{IQN}/0",
            self.base + 1 + i as u8,
            self.iscsi_port
        );
        run_ok(
            rsv().to_str().unwrap(),
            &["cp", &url, out.to_str().unwrap()],
        );
        std::fs::read(out).unwrap()
    }

    fn volume_bytes(&self, tmp: &Path) -> Vec<u8> {
        let out = tmp.join(format!("volume-{}", self.base));
        run_ok(
            rsv().to_str().unwrap(),
            &["cp", &self.url(), out.to_str().unwrap()],
        );
        std::fs::read(out).unwrap()
    }
}

fn free_port(addr: &str) -> u16 {
    std::net::TcpListener::bind(format!("{addr}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn far_states(base: u8, port: u16, key: &Path) -> Vec<replicate::api::CycleAnswer> {
    let k = replicate::auth::Key::from_file(key).unwrap();
    let members: Vec<replicate::cycle::FarMember> = (0..2u8)
        .map(|i| replicate::cycle::FarMember {
            agent: replicate::wire::Client::new(
                format!("127.0.0.{}:{port}", base + 1 + i),
                k.clone(),
            ),
            iqn: IQN.into(),
            lun: 0,
        })
        .collect();
    testkit::rt()
        .block_on(replicate::cycle::states(&members))
        .unwrap()
}

fn sync_ok(key: &Path, args: &[&str], src: &str, dst: &str) -> serde_json::Value {
    let out = Command::new(rsv())
        .arg("sync")
        .arg("--key-file")
        .arg(key)
        .arg("--json")
        .args(args)
        .args([src, dst])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rsv sync failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .next_back()
        .expect("a result line")
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn a_sync_cut_off_halfway_leaves_the_far_copy_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let (iscsi, control) = (free_port("127.0.0.71"), free_port("127.0.0.71"));
    let no_undo = std::env::var_os("RSV_DR_NO_UNDO").is_some();
    let mut a = site(
        &tmp.path().join("a"),
        71,
        iscsi,
        control,
        &key,
        "track = true\n",
    );
    let mut b = site(
        &tmp.path().join("b"),
        75,
        iscsi,
        control,
        &key,
        if no_undo { "undo = false\n" } else { "" },
    );
    let (src, dst) = (a.volume(control), b.volume(control));
    let rsv_s = rsv();
    let rsv_s = rsv_s.to_str().unwrap();

    // The first image, synced whole.
    let image1 = tmp.path().join("image1");
    random_file(&image1, 32 << 20, 1);
    run_ok(rsv_s, &["cp", image1.to_str().unwrap(), &a.url()]);
    let first = sync_ok(&key, &["--pacing", "unpaced"], &src, &dst);
    eprintln!("first sync: {first}");
    assert_eq!(first["cycle"]["whole"], !no_undo, "{first}");
    let far1: Vec<Vec<u8>> = (0..2).map(|i| b.member(i, tmp.path())).collect();
    assert!(b.volume_bytes(tmp.path()) == std::fs::read(&image1).unwrap());

    // The second, cut off halfway: the source site is lost (SIGKILL), then the
    // coordinator.
    let image2 = tmp.path().join("image2");
    random_file(&image2, 32 << 20, 2);
    run_ok(rsv_s, &["cp", image2.to_str().unwrap(), &a.url()]);
    let mut slow = Command::new(rsv())
        .arg("sync")
        .arg("--key-file")
        .arg(&key)
        .args(["--json", "--interval", "100ms", "--rate", "40mbit"])
        .args([&src, &dst])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(slow.stdout.take().unwrap()).lines();
    let done_at_cut = loop {
        let line = lines
            .next()
            .expect("the slow sync ended before a quarter was sent")
            .unwrap();
        let tick: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(tick["event"], "progress", "{tick}");
        let (done, bytes) = (
            tick["done_bytes"].as_u64().unwrap(),
            tick["bytes"].as_u64().unwrap(),
        );
        if done * 4 >= bytes {
            break done;
        }
    };
    for d in &mut a.disks {
        d.kill();
    }
    a.file_server.kill();
    std::thread::sleep(Duration::from_millis(300));
    let _ = slow.kill();
    slow.wait().unwrap();
    eprintln!("cut off with {done_at_cut} bytes acknowledged at the far site");

    // The far disk servers still run with the cycle open, the medium half new.
    let states = far_states(75, control, &key);
    eprintln!("far site after the cut-off: {states:?}");
    if !no_undo {
        assert!(
            states.iter().all(|s| s.open.is_some() && s.saved_bytes > 0),
            "the cycle is open on every far member and saved what it overwrote: {states:?}"
        );
    }
    let mixed: Vec<Vec<u8>> = (0..2).map(|i| b.member(i, tmp.path())).collect();
    assert!(
        mixed != far1,
        "the cut-off sync wrote nothing to the far site: the test proves nothing"
    );

    // The far disk servers crash and start again: each rolls its cycle back before it
    // serves, and holds the first image byte for byte.
    for d in &mut b.disks {
        d.restart();
    }
    for (i, d) in b.disks.iter().enumerate() {
        let got = b.member(i, tmp.path());
        if let Some(at) = first_difference(&got, &far1[i]) {
            panic!(
                "far member {i} differs from the first image at byte {at} after its restart\n{}",
                d.log()
            );
        }
    }
    let states = far_states(75, control, &key);
    if !no_undo {
        assert!(
            states
                .iter()
                .all(|s| s.open.is_none() && s.rolled_back.is_some()),
            "{states:?}"
        );
    }
    b.file_server.restart();
    assert!(b.volume_bytes(tmp.path()) == std::fs::read(&image1).unwrap());

    // The source site comes back; a further sync completes the second image (every unit:
    // the far site rolled back what the source had counted as sent).
    for d in &mut a.disks {
        d.restart();
    }
    a.file_server.restart();
    let third = sync_ok(&key, &["--pacing", "unpaced"], &src, &dst);
    eprintln!("the sync after: {third}");
    assert!(b.volume_bytes(tmp.path()) == std::fs::read(&image2).unwrap());
    let states = far_states(75, control, &key);
    assert!(
        states
            .iter()
            .all(|s| s.open.is_none() && s.committed == third["cycle"]["cycle"].as_u64()),
        "{states:?} {third}"
    );
}

/// Where write `n` goes: spread over the volume, each unit written once.
fn unit_of(n: u64, units: u64) -> u64 {
    (n * 2473) % units
}

/// Writes stamped units one after the other (each after the last was acknowledged) until
/// `stop`; `acks` records when each was acknowledged (Unix time).
fn writer(
    url: String,
    units: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    acks: Arc<Mutex<Vec<f64>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let url = initiator::IscsiUrl::parse(&url).unwrap();
            let lun = initiator::Lun::open_url(&url, &initiator::SessionOptions::default())
                .await
                .unwrap();
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) && n < units {
                let mut buf = vec![0u8; UNIT];
                model::stamp(&mut buf, 1, n, n);
                lun.write_at(unit_of(n, units) * UNIT as u64, Bytes::from(buf))
                    .await
                    .unwrap();
                acks.lock().unwrap().push(unix_now());
                acked.store(n, Ordering::SeqCst);
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = lun.session().logout().await;
        })
    })
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The writes a copy holds, sorted; panics on a torn or foreign unit.
fn writes_in(copy: &[u8], units: u64) -> Vec<u64> {
    let mut found = Vec::new();
    for u in 0..units {
        let at = (u as usize) * UNIT;
        match model::parse(&copy[at..at + UNIT]) {
            Found::Empty => {}
            Found::Stamp { unit: n, gen, .. } => {
                assert_eq!(n, gen);
                assert_eq!(unit_of(n, units), u, "write {n} found in unit {u}");
                found.push(n);
            }
            Found::Garbage => panic!("unit {u} of the copy is torn or foreign"),
        }
    }
    found.sort_unstable();
    found
}

#[test]
fn continuous_mode_commits_whole_images_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let (iscsi, control) = (free_port("127.0.0.81"), free_port("127.0.0.81"));
    let a = site(
        &tmp.path().join("a"),
        81,
        iscsi,
        control,
        &key,
        "track = true\n",
    );
    let b = site(&tmp.path().join("b"), 85, iscsi, control, &key, "");
    let units = (32u64 << 20) / UNIT as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let w = writer(a.url(), units, stop.clone(), acked.clone(), acks.clone());
    while acked.load(Ordering::SeqCst) < 50 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let metrics_port = free_port("127.0.0.1");
    let t0 = unix_now();
    let mut sync = Command::new(rsv())
        .arg("sync")
        .arg("--key-file")
        .arg(&key)
        .args([
            "--json",
            "--every",
            "1s",
            "--pacing",
            "unpaced",
            "--interval",
            "100ms",
        ])
        .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
        .args([a.volume(control), b.volume(control)])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(tmp.path().join("sync.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(sync.stdout.take().unwrap()).lines();
    let mut cycles = Vec::new();
    let mut scraped = None;
    let started = Instant::now();
    while cycles.len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "three cycles never came"
        );
        let Some(line) = lines.next() else {
            panic!(
                "rsv sync --every exited:\n{}",
                std::fs::read_to_string(tmp.path().join("sync.log")).unwrap_or_default()
            );
        };
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["event"] != "cycle" {
            continue;
        }
        let now = unix_now();
        eprintln!("{v}");
        assert_eq!(v["committed"], true, "{v}");
        assert_eq!(v["whole"], true, "{v}");
        let cut = v["cut_unix"].as_f64().unwrap();
        let rpo = v["rpo_seconds"].as_f64().unwrap();
        // The lag is from the cut of the image just committed: no less than the cycle
        // after the cut took, no more than now minus the cut.
        assert!(cut >= t0 && cut <= now, "cut {cut} outside [{t0}, {now}]");
        assert!(
            rpo >= 0.0 && rpo <= now - cut + 0.001,
            "rpo {rpo} > {} (now - cut)",
            now - cut
        );
        if scraped.is_none() {
            let text = run_ok(
                "curl",
                &["-sf", &format!("http://127.0.0.1:{metrics_port}/metrics")],
            );
            let at = unix_now();
            let rpo: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("rsv_sync_rpo_seconds "))
                .unwrap_or_else(|| panic!("no rsv_sync_rpo_seconds in\n{text}"))
                .parse()
                .unwrap();
            assert!(rpo >= 0.0 && rpo <= at - cut + 0.001, "scraped rpo {rpo}");
            assert!(text.contains("rsv_sync_last_complete_timestamp_seconds "));
            scraped = Some(rpo);
        }
        cycles.push(v);
    }
    // SIGTERM while the writer writes: the cycle running finishes, the command exits 0.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(sync.id() as i32, libc::SIGTERM);
    }
    let status = sync.wait().unwrap();
    let rest: Vec<serde_json::Value> = lines
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .filter(|v: &serde_json::Value| v["event"] == "cycle")
        .collect();
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    assert!(
        status.success(),
        "exit status {status} after SIGTERM:\n{}",
        std::fs::read_to_string(tmp.path().join("sync.log")).unwrap_or_default()
    );
    let last = rest.last().unwrap_or(cycles.last().unwrap()).clone();
    eprintln!("after SIGTERM: {rest:?}");
    let rpos: Vec<f64> = cycles
        .iter()
        .chain(&rest)
        .filter_map(|c| c["rpo_seconds"].as_f64())
        .collect();
    eprintln!(
        "RPO at each cycle's end (s): {rpos:?}; scraped after the first: {:?}",
        scraped
    );

    // The far copy: one moment, the last committed cycle's cut.
    let states = far_states(85, control, &key);
    assert!(states.iter().all(|s| s.open.is_none()), "{states:?}");
    let id = last["id"].as_u64();
    assert!(
        states.iter().all(|s| s.committed == id),
        "{states:?} {last}"
    );
    let copy = b.volume_bytes(tmp.path());
    let found = writes_in(&copy, units);
    let k = found.len() as u64;
    let holes: Vec<u64> = (1..=found.last().copied().unwrap_or(0))
        .filter(|n| found.binary_search(n).is_err())
        .take(10)
        .collect();
    assert!(
        holes.is_empty(),
        "the far copy is no single moment: holes {holes:?} below {k}"
    );
    let cut = last["cut_unix"].as_f64().unwrap();
    let acks = acks.lock().unwrap();
    let before_cut = acks.iter().filter(|&&t| t <= cut).count() as u64;
    eprintln!(
        "far copy: writes 1..={k}; {before_cut} acknowledged before the last cut, {} in all",
        acks.len()
    );
    assert!(
        k >= before_cut,
        "a write acknowledged before the cut is missing ({k} < {before_cut})"
    );
    assert!(k <= acks.len() as u64);
}
