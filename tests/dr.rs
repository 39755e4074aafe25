//! A point-in-time copy of a volume in use: a writer issues dependent, sequence-stamped
//! writes (write n+1 only after write n was acknowledged, each to a unit of its own) to a
//! striped volume of two disk servers while `rsv sync` copies it to the far site. The far
//! copy must hold every write up to some n and none after (a prefix): one moment of the
//! volume, cut across both members at once. Copying the live members instead
//! (`RSV_DR_LIVE=1` passes `--live`, what `rsv sync` always did before images) gives a
//! copy of no single moment, and this test fails.
//!
//! Also the barrier on its own: cuts taken over and over across the two disk servers while
//! the writer writes, each one's longest hold of write answers printed (p50, p99).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use testkit::{rsv, run_ok};
use tools::crash::model::{self, Found, UNIT};

const IQN: &str = "iqn.2026-11.org.reservoir:dr";

/// An `rsv target` on its own loopback address with its agent on `control_port`.
struct Host {
    child: Child,
    portal: String,
    dir: tempfile::TempDir,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host(addr: &str, control_port: u16, key: &Path, luns: &str) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("target.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"{addr}:0\"]\ndata_dir = \"{}\"\n[control]\nlisten = \"{addr}:{control_port}\"\n\
             key_file = \"{}\"\n[[target]]\niqn = \"{IQN}\"\n{luns}",
            dir.path().display(),
            key.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(rsv())
        .args(["target", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(dir.path().join("log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut portal = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!(
                "rsv target on {addr} exited:\n{}",
                std::fs::read_to_string(dir.path().join("log")).unwrap_or_default()
            );
        }
        match line.trim() {
            l if l.starts_with("portal ") => portal = l[7..].to_owned(),
            "ready" => break,
            _ => {}
        }
    }
    Host { child, portal, dir }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn key_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("key");
    std::fs::write(&p, "a shared key of more than 16 bytes").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

struct Site {
    file_server: Host,
    disks: Vec<Host>,
}

/// Two disk servers of `size` each at 127.0.0.{base+1}.., a file server striping over
/// them in 64 KiB units at 127.0.0.{base}.
fn site(base: u8, size: &str, port: u16, key: &Path) -> Site {
    let disks: Vec<Host> = (0..2)
        .map(|i| {
            host(
                &format!("127.0.0.{}", base + 1 + i),
                port,
                key,
                &format!("[[target.lun]]\nid = 0\nstore = \"file:disk.img?size={size}\"\n"),
            )
        })
        .collect();
    let members: Vec<String> = disks
        .iter()
        .map(|d| format!("iscsi://{}/{IQN}/0", d.portal))
        .collect();
    let file_server = host(
        &format!("127.0.0.{base}"),
        port,
        key,
        &format!(
            "[[target.lun]]\nid = 0\nstore = \"stripe:?unit=64K&members=[{}]\"\n",
            members.join(",")
        ),
    );
    Site { file_server, disks }
}

/// Where write `n` (from 1) goes: units spread over the whole volume (both members, ahead
/// of and behind the sync's reading), each written once.
fn unit_of(n: u64, units: u64) -> u64 {
    (n * 2473) % units
}

/// Writes stamped units one after the other (each after the last was acknowledged) until
/// `stop`, or the units run out; `acked` counts the writes acknowledged.
fn writer(
    url: String,
    units: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    pause: Duration,
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
                let at = unit_of(n, units) * UNIT as u64;
                lun.write_at(at, Bytes::from(buf)).await.unwrap();
                acked.store(n, Ordering::SeqCst);
                n += 1;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            let _ = lun.session().logout().await;
        })
    })
}

/// The writes a copy holds, by sequence number, from its units; panics on a unit that
/// holds anything but a stamp of the writer's or zeros.
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
fn a_volume_in_use_lands_as_one_moment() {
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let port = free_port();
    let a = site(30, "16M", port, &key);
    let b = site(40, "16M", port, &key);
    let units = (32u64 << 20) / UNIT as u64;
    let a_url = format!("iscsi://{}/{IQN}/0", a.file_server.portal);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let w = writer(
        a_url,
        units,
        stop.clone(),
        acked.clone(),
        Duration::from_micros(300),
    );
    // Some writes before the sync starts: the copy must hold them all.
    while acked.load(Ordering::SeqCst) < 200 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = acked.load(Ordering::SeqCst);
    let source = format!("127.0.0.30:{port}/{IQN}/0");
    let dest = format!("127.0.0.40:{port}/{IQN}/0");
    let mut args = vec!["sync", "--json", "--rate", "40mbit", "--unit", "256KiB"];
    if std::env::var_os("RSV_DR_LIVE").is_some() {
        args.push("--live");
    }
    let out = Command::new(rsv())
        .args(&args)
        .arg("--key-file")
        .arg(&key)
        .args([&source, &dest])
        .output()
        .unwrap();
    let after = acked.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    assert!(
        out.status.success(),
        "rsv sync failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .next_back()
        .expect("a result line");
    assert_eq!(done["event"], "done", "{done}");
    eprintln!("sync: {done}");
    // The writes went on through the sync: they must have had a chance to cut across it.
    assert!(
        after > before + 100,
        "only {} writes during the sync",
        after - before
    );

    // Read the far copy back through site B's file server.
    let back = tmp.path().join("back");
    let b_url = format!("iscsi://{}/{IQN}/0", b.file_server.portal);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", &b_url, back.to_str().unwrap()],
    );
    let copy = std::fs::read(&back).unwrap();
    let found = writes_in(&copy, units);
    let k = found.len() as u64;
    let holes: Vec<u64> = (1..=found.last().copied().unwrap_or(0))
        .filter(|n| found.binary_search(n).is_err())
        .take(10)
        .collect();
    eprintln!(
        "far copy: {k} writes, last {:?}; {before} acknowledged before the sync, {after} by its end",
        found.last()
    );
    assert!(
        holes.is_empty(),
        "the far copy is of no single moment: it holds write {:?} but not writes {holes:?}",
        found.last()
    );
    assert!(
        k >= before,
        "a write acknowledged before the sync started is missing ({k} < {before})"
    );
    assert!(k <= after, "more writes than were issued");
    // The side stores went with the images.
    for d in &a.disks {
        let leftover: Vec<_> = std::fs::read_dir(d.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".image"))
            .collect();
        assert!(leftover.is_empty(), "side files left: {leftover:?}");
    }
    drop(b);
}

#[test]
fn cuts_hold_write_answers_briefly_and_release_them() {
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let port = free_port();
    let a = site(50, "8M", port, &key);
    let units = (16u64 << 20) / UNIT as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let w = writer(
        format!("iscsi://{}/{IQN}/0", a.file_server.portal),
        units,
        stop.clone(),
        acked.clone(),
        Duration::ZERO,
    );
    let k = replicate::auth::Key::from_file(&key).unwrap();
    let members: Vec<replicate::coord::GroupMember> = a
        .disks
        .iter()
        .enumerate()
        .map(|(i, _)| replicate::coord::GroupMember {
            agent: replicate::wire::Client::new(format!("127.0.0.{}:{port}", 51 + i), k.clone()),
            iqn: IQN.into(),
            lun: 0,
        })
        .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rounds = 40;
    let mut held = Vec::new();
    let mut took = Vec::new();
    for _ in 0..rounds {
        let before = acked.load(Ordering::SeqCst);
        let c = rt
            .block_on(replicate::coord::cut(&members, Duration::from_secs(5)))
            .expect("a cut");
        assert_eq!(c.held_us.len(), 2);
        assert!(c.held_us.iter().all(Option::is_some), "{c:?}");
        held.push(c.max_held_us());
        took.push((c.took_ms * 1000.0) as u64);
        rt.block_on(replicate::coord::drop_cut(&members, c.cut));
        // The writer goes on after the cut: its answers were released.
        while acked.load(Ordering::SeqCst) <= before + 5 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    held.sort_unstable();
    took.sort_unstable();
    let pct = |v: &[u64], p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    eprintln!(
        "barrier over 2 disk servers, {rounds} cuts with a writer running: longest hold per cut \
         p50 {} µs, p99 {} µs, max {} µs; whole cut p50 {} µs, p99 {} µs",
        pct(&held, 50),
        pct(&held, 99),
        held[held.len() - 1],
        pct(&took, 50),
        pct(&took, 99)
    );
    // An image left behind would refuse the next cut's image: every one was dropped.
    assert!(acked.load(Ordering::SeqCst) > rounds as u64 * 5);
}

/// `rsv bench` 4 KiB random writes against a file LUN with no image and with an image
/// held, alternating in one sitting; and, in process, the write path through the image
/// layer with no image against the store alone. Prints the figures; with
/// `RSV_BENCH_JSON=PATH` also writes them there. Run by `scripts/bench-image.sh`.
#[test]
#[ignore = "a benchmark: scripts/bench-image.sh"]
fn bench_image_write_overhead() {
    use backstore::Backstore;
    let secs: f64 = std::env::var("RSV_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let rounds: usize = std::env::var("RSV_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);

    // In process: 4 KiB writes to a RAM store, alone and through the layer (no image).
    let ram: Arc<dyn Backstore> = Arc::new(backstore::RamBackstore::new(64 << 20));
    let layered = backstore::Imaged::new(
        ram.clone(),
        backstore::ImageOptions {
            side: backstore::SidePlace::Memory,
            unit: backstore::image::DEFAULT_UNIT,
            limit: 64 << 20,
        },
    )
    .unwrap();
    let buf = vec![7u8; 4096];
    let per_write = |s: &dyn Backstore| {
        let n = 400_000u64;
        let t = std::time::Instant::now();
        for i in 0..n {
            s.write_at(&buf, (i * 2473 % 16384) * 4096).unwrap();
        }
        t.elapsed().as_nanos() as f64 / n as f64
    };
    let mut alone = Vec::new();
    let mut through = Vec::new();
    for _ in 0..3 {
        alone.push(per_write(&*ram));
        through.push(per_write(&layered));
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (alone, through) = (best(&alone), best(&through));

    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let port = free_port();
    let h = host(
        "127.0.0.60",
        port,
        &key,
        "[[target.lun]]\nid = 0\nstore = \"file:lun.img?size=256MiB\"\n",
    );
    let url = format!("iscsi://{}/{IQN}/0", h.portal);
    // Write the whole LUN once, so that neither run writes to holes.
    let fill = tmp.path().join("fill");
    testkit::random_file(&fill, 256 << 20, 3);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", fill.to_str().unwrap(), &url],
    );
    std::fs::remove_file(&fill).unwrap();
    let k = replicate::auth::Key::from_file(&key).unwrap();
    let member = [replicate::coord::GroupMember {
        agent: replicate::wire::Client::new(format!("127.0.0.60:{port}"), k),
        iqn: IQN.into(),
        lun: 0,
    }];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bench = |what: &str| -> serde_json::Value {
        let out = run_ok(
            rsv().to_str().unwrap(),
            &[
                "bench",
                &url,
                "--rw",
                "write",
                "--pattern",
                "rand",
                "--block-size",
                "4k",
                "--duration",
                &format!("{secs}"),
                "--json",
            ],
        );
        // One pretty-printed JSON object, after any lines of notes.
        let v: serde_json::Value = out
            .find('{')
            .and_then(|at| serde_json::from_str(&out[at..]).ok())
            .unwrap_or_else(|| panic!("no JSON from rsv bench ({what}):\n{out}"));
        eprintln!(
            "{what}: {:.0} IOPS, p50 {} µs, p99 {} µs",
            v["iops"].as_f64().unwrap_or(0.0),
            v["latency_us_p50"],
            v["latency_us_p99"]
        );
        v
    };
    let mut none = Vec::new();
    let mut held = Vec::new();
    let mut holds = Vec::new();
    for _ in 0..rounds {
        none.push(bench("no image"));
        let c = rt
            .block_on(replicate::coord::cut(&member, Duration::from_secs(5)))
            .expect("a cut");
        held.push(bench("image held"));
        rt.block_on(replicate::coord::drop_cut(&member, c.cut));
        holds.push(c.max_held_us());
    }
    let iops = |v: &[serde_json::Value]| {
        let mut x: Vec<f64> = v
            .iter()
            .map(|r| r["iops"].as_f64().unwrap_or(0.0))
            .collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let p99 = |v: &[serde_json::Value]| {
        let mut x: Vec<u64> = v
            .iter()
            .map(|r| r["latency_us_p99"].as_u64().unwrap_or(0))
            .collect();
        x.sort_unstable();
        x[x.len() / 2]
    };
    let (a, b) = (iops(&none), iops(&held));
    let summary = serde_json::json!({
        "bench": "image",
        "rsv_bench": format!("rsv bench URL --rw write --pattern rand --block-size 4k --duration {secs}"),
        "lun": "file, 256 MiB, written whole first",
        "rounds": rounds,
        "no_image_iops_median": a,
        "image_held_iops_median": b,
        "ratio": b / a,
        "no_image_p99_us": p99(&none),
        "image_held_p99_us": p99(&held),
        "cut_hold_us": holds,
        "in_process_4k_write_ns": {"ram_store": alone, "through_layer_no_image": through},
        "runs": {"no_image": none, "image_held": held},
    });
    eprintln!(
        "4 KiB random write, file LUN: no image {a:.0} IOPS, image held {b:.0} IOPS (ratio {:.3}); \
         in process, 4 KiB to RAM: {alone:.0} ns alone, {through:.0} ns through the layer with no image",
        b / a
    );
    if let Some(path) = std::env::var_os("RSV_BENCH_JSON") {
        std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap()).unwrap();
    }
}

/// What a far cycle's undo log costs a write: one `rsv target` on loopback with a 256 MiB
/// file LUN (written whole first) and its agent; `rsv bench` 4 KiB random writes at queue
/// depth 1 and 32 with no cycle open, then with one opened through the agent (as a sync
/// opens it at the far site; each unit's first change saves its old 64 KiB durably before
/// the write goes on), rolled back after each run; ROUNDS times alternating. Prints p50 and
/// p99; with `RSV_BENCH_JSON=PATH` also writes them there. Run by `scripts/bench-undo.sh`.
#[test]
#[ignore = "a benchmark: scripts/bench-undo.sh"]
fn bench_undo_write_overhead() {
    let secs: f64 = std::env::var("RSV_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let rounds: usize = std::env::var("RSV_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let port = free_port();
    let h = host(
        "127.0.0.61",
        port,
        &key,
        "[[target.lun]]\nid = 0\nstore = \"file:lun.img?size=256MiB\"\n",
    );
    let url = format!("iscsi://{}/{IQN}/0", h.portal);
    let fill = tmp.path().join("fill");
    testkit::random_file(&fill, 256 << 20, 4);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", fill.to_str().unwrap(), &url],
    );
    std::fs::remove_file(&fill).unwrap();
    let agent = replicate::wire::Client::new(
        format!("127.0.0.61:{port}"),
        replicate::auth::Key::from_file(&key).unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cycle = |what: &str, id: u64| -> replicate::api::CycleAnswer {
        let req = replicate::api::CycleRequest {
            iqn: IQN.into(),
            lun: 0,
            cycle: id,
            cut_ms: 0,
        };
        rt.block_on(agent.call("POST", &format!("/v1/cycle/{what}"), &req))
            .unwrap_or_else(|e| panic!("cycle {what}: {e:#}"))
    };
    let bench = |what: &str, depth: usize| -> serde_json::Value {
        let out = run_ok(
            rsv().to_str().unwrap(),
            &[
                "bench",
                &url,
                "--rw",
                "write",
                "--pattern",
                "rand",
                "--block-size",
                "4k",
                "--queue-depth",
                &depth.to_string(),
                "--duration",
                &format!("{secs}"),
                "--json",
            ],
        );
        let v: serde_json::Value = out
            .find('{')
            .and_then(|at| serde_json::from_str(&out[at..]).ok())
            .unwrap_or_else(|| panic!("no JSON from rsv bench ({what}):\n{out}"));
        eprintln!(
            "{what}, queue depth {depth}: {:.0} IOPS, p50 {} µs, p99 {} µs",
            v["iops"].as_f64().unwrap_or(0.0),
            v["latency_us_p50"],
            v["latency_us_p99"]
        );
        v
    };
    let mut rows = Vec::new();
    for depth in [1usize, 32] {
        let (mut closed, mut open, mut saved) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            closed.push(bench("no cycle", depth));
            cycle("open", 1000 + r as u64);
            open.push(bench("cycle open", depth));
            let st = cycle("state", 0);
            saved.push(st.saved_bytes);
            cycle("rollback", 0);
        }
        let median = |v: &[serde_json::Value], k: &str| {
            let mut x: Vec<u64> = v.iter().map(|r| r[k].as_u64().unwrap_or(0)).collect();
            x.sort_unstable();
            x[x.len() / 2]
        };
        let row = serde_json::json!({
            "queue_depth": depth,
            "no_cycle_p50_us": median(&closed, "latency_us_p50"),
            "no_cycle_p99_us": median(&closed, "latency_us_p99"),
            "cycle_open_p50_us": median(&open, "latency_us_p50"),
            "cycle_open_p99_us": median(&open, "latency_us_p99"),
            "saved_bytes": saved,
            "runs": {"no_cycle": closed, "cycle_open": open},
        });
        eprintln!(
            "4 KiB random write, queue depth {depth}: p50 {} -> {} µs, p99 {} -> {} µs (no cycle -> cycle open); saved {:?} bytes",
            row["no_cycle_p50_us"], row["cycle_open_p50_us"], row["no_cycle_p99_us"], row["cycle_open_p99_us"], row["saved_bytes"]
        );
        rows.push(row);
    }
    let summary = serde_json::json!({
        "bench": "undo",
        "rsv_bench": format!("rsv bench URL --rw write --pattern rand --block-size 4k --queue-depth D --duration {secs}"),
        "lun": "file, 256 MiB, written whole first; undo unit 64 KiB",
        "rounds": rounds,
        "rows": rows,
    });
    if let Some(path) = std::env::var_os("RSV_BENCH_JSON") {
        std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap()).unwrap();
    }
}
