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

use std::sync::Arc;
use std::time::Duration;

use testkit::site::{key_file, read_lun, result_line, Hosts, KEY};
use testkit::stamps::{holes, writes_in, Writer};
use testkit::{free_port, rsv, run_ok};
use tools::crash::model::UNIT;

const IQN: &str = "iqn.2026-11.org.reservoir:dr";

/// The hosts of a test: agents on one free port, signing with a key in `tmp`.
fn hosts(tmp: &std::path::Path) -> Hosts {
    Hosts::new(IQN, free_port(), &key_file(&tmp.join("key"), KEY))
}

/// Two disk servers of `size` each at 127.0.0.{base+1}.., a file server striping over
/// them in 64 KiB units at 127.0.0.{base}.
fn site(hosts: &Hosts, base: u8, size: &str) -> testkit::site::Site {
    hosts.site(None, base, 2, &format!("file:disk.img?size={size}"), "")
}

#[test]
fn a_volume_in_use_lands_as_one_moment() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let a = site(&hosts, 30, "16M");
    let b = site(&hosts, 40, "16M");
    let units = (32u64 << 20) / UNIT as u64;

    let w = Writer::start(&a.url(), units, Duration::from_micros(300));
    // Some writes before the sync starts: the copy must hold them all.
    w.wait_for(200);
    let before = w.acked();
    let mut args = vec!["--json", "--rate", "40mbit", "--unit", "256KiB"];
    if std::env::var_os("RSV_DR_LIVE").is_some() {
        args.push("--live");
    }
    let (source, dest) = (a.volume(), b.volume());
    args.extend([source.as_str(), dest.as_str()]);
    let out = hosts.sync(&args).output().unwrap();
    let after = w.acked();
    w.stop();
    assert!(
        out.status.success(),
        "rsv sync failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = result_line(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(done["event"], "done", "{done}");
    eprintln!("sync: {done}");
    // The writes went on through the sync: they must have had a chance to cut across it.
    assert!(
        after > before + 100,
        "only {} writes during the sync",
        after - before
    );

    // Read the far copy back through site B's file server.
    let copy = read_lun(&b.url(), &tmp.path().join("back"));
    let found = writes_in(&copy, units);
    let k = found.len() as u64;
    let holes = holes(&found);
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
        let leftover: Vec<_> = std::fs::read_dir(&d.dir)
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
    let hosts = hosts(tmp.path());
    let a = site(&hosts, 50, "8M");
    let units = (16u64 << 20) / UNIT as u64;
    let w = Writer::start(&a.url(), units, Duration::ZERO);
    let k = replicate::auth::Key::from_file(&hosts.key).unwrap();
    let members: Vec<replicate::coord::GroupMember> = a
        .disks
        .iter()
        .map(|d| replicate::coord::GroupMember {
            agent: replicate::wire::Client::new(d.control.clone(), k.clone()),
            iqn: IQN.into(),
            lun: 0,
        })
        .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rounds = 40;
    let mut held = Vec::new();
    let mut took = Vec::new();
    for _ in 0..rounds {
        let before = w.acked();
        let c = rt
            .block_on(replicate::coord::cut(&members, Duration::from_secs(5)))
            .expect("a cut");
        assert_eq!(c.held_us.len(), 2);
        assert!(c.held_us.iter().all(Option::is_some), "{c:?}");
        held.push(c.max_held_us());
        took.push((c.took_ms * 1000.0) as u64);
        rt.block_on(replicate::coord::drop_cut(&members, c.cut));
        // The writer goes on after the cut: its answers were released.
        w.wait_for(before + 6);
    }
    let acked = w.acked();
    w.stop();
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
    assert!(acked > rounds as u64 * 5);
}

/// The benchmarks' seconds per measurement and rounds: `RSV_BENCH_SECS` (default 5),
/// `RSV_BENCH_ROUNDS` (default 2).
fn bench_env() -> (f64, usize) {
    let var = |k: &str| std::env::var(k).ok();
    (
        var("RSV_BENCH_SECS")
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0),
        var("RSV_BENCH_ROUNDS")
            .and_then(|s| s.parse().ok())
            .unwrap_or(2),
    )
}

/// `rsv bench` of 4 KiB random writes on `url` for `secs` (at `depth`, else its default
/// queue depth): its JSON report, with IOPS and latencies printed under `what`.
fn rand_write_bench(url: &str, secs: f64, depth: Option<usize>, what: &str) -> serde_json::Value {
    let secs = format!("{secs}");
    let depth = depth.map(|d| d.to_string());
    let mut args = vec![
        "bench",
        url,
        "--rw",
        "write",
        "--pattern",
        "rand",
        "--block-size",
        "4k",
    ];
    if let Some(d) = &depth {
        args.extend(["--queue-depth", d]);
    }
    args.extend(["--duration", &secs, "--json"]);
    let out = run_ok(rsv().to_str().unwrap(), &args);
    // One pretty-printed JSON object, after any lines of notes.
    let v: serde_json::Value = out
        .find('{')
        .and_then(|at| serde_json::from_str(&out[at..]).ok())
        .unwrap_or_else(|| panic!("no JSON from rsv bench ({what}):\n{out}"));
    let what = match &depth {
        Some(d) => format!("{what}, queue depth {d}"),
        None => what.to_owned(),
    };
    eprintln!(
        "{what}: {:.0} IOPS, p50 {} µs, p99 {} µs",
        v["iops"].as_f64().unwrap_or(0.0),
        v["latency_us_p50"],
        v["latency_us_p99"]
    );
    v
}

/// `rsv bench` 4 KiB random writes against a file LUN with no image and with an image
/// held, alternating in one sitting; and, in process, the write path through the image
/// layer with no image against the store alone. Prints the figures; with
/// `RSV_BENCH_JSON=PATH` also writes them there. Run by `scripts/bench-image.sh`.
#[test]
#[ignore = "a benchmark: scripts/bench-image.sh"]
fn bench_image_write_overhead() {
    use backstore::Backstore;
    let (secs, rounds) = bench_env();

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
    let hosts = hosts(tmp.path());
    let h = hosts.host(
        None,
        "127.0.0.60",
        "[[target.lun]]\nid = 0\nstore = \"file:lun.img?size=256MiB\"\n",
    );
    let url = h.url(0);
    // Write the whole LUN once, so that neither run writes to holes.
    let fill = tmp.path().join("fill");
    testkit::random_file(&fill, 256 << 20, 3);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", fill.to_str().unwrap(), &url],
    );
    std::fs::remove_file(&fill).unwrap();
    let k = replicate::auth::Key::from_file(&hosts.key).unwrap();
    let member = [replicate::coord::GroupMember {
        agent: replicate::wire::Client::new(h.control.clone(), k),
        iqn: IQN.into(),
        lun: 0,
    }];
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bench = |what: &str| rand_write_bench(&url, secs, None, what);
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
    let (secs, rounds) = bench_env();
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let (key, port) = (hosts.key.clone(), hosts.control_port);
    let h = hosts.host(
        None,
        "127.0.0.61",
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
            ..Default::default()
        };
        rt.block_on(agent.call("POST", &format!("/v1/cycle/{what}"), &req))
            .unwrap_or_else(|e| panic!("cycle {what}: {e:#}"))
    };
    let bench = |what: &str, depth: usize| rand_write_bench(&url, secs, Some(depth), what);
    let mut rows = Vec::new();
    for depth in [1usize, 32] {
        let (mut closed, mut open, mut saved) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..rounds {
            closed.push(bench("no cycle", depth));
            cycle("open", 1000 + r as u64);
            open.push(bench("cycle open", depth));
            let st = cycle("state", 0);
            saved.push(serde_json::json!({
                "bytes": st.saved_bytes,
                "units": st.saved_units,
                "log_syncs": st.log_syncs,
            }));
            cycle("rollback", 0);
        }
        let median = |v: &[serde_json::Value], k: &str| {
            let mut x: Vec<u64> = v.iter().map(|r| r[k].as_u64().unwrap_or(0)).collect();
            x.sort_unstable();
            x[x.len() / 2]
        };
        let iops = |v: &[serde_json::Value]| {
            let mut x: Vec<f64> = v
                .iter()
                .map(|r| r["iops"].as_f64().unwrap_or(0.0))
                .collect();
            x.sort_by(f64::total_cmp);
            x[x.len() / 2]
        };
        let row = serde_json::json!({
            "queue_depth": depth,
            "no_cycle_iops": iops(&closed),
            "cycle_open_iops": iops(&open),
            "no_cycle_p50_us": median(&closed, "latency_us_p50"),
            "no_cycle_p99_us": median(&closed, "latency_us_p99"),
            "cycle_open_p50_us": median(&open, "latency_us_p50"),
            "cycle_open_p99_us": median(&open, "latency_us_p99"),
            "saved": saved,
            "runs": {"no_cycle": closed, "cycle_open": open},
        });
        eprintln!(
            "4 KiB random write, queue depth {depth}: {:.0} -> {:.0} IOPS, p50 {} -> {} µs, p99 {} -> {} µs (no cycle -> cycle open); saved {}",
            iops(&closed), iops(&open), row["no_cycle_p50_us"], row["cycle_open_p50_us"], row["no_cycle_p99_us"], row["cycle_open_p99_us"], row["saved"]
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

/// What a far cycle costs the sync itself: `rsv sync --full --pacing unpaced` of a 256 MiB
/// file LUN (random data: nothing to skip or compress) over loopback into a far LUN that
/// keeps an undo log (each sync a cycle: every 64 KiB unit's first write saves its old
/// content durably first) and into one that does not (`undo = false`), alternating
/// ROUNDS times; the sync's own rate (bytes over its transfer's seconds) and its wall
/// time with verify and commit. With `RSV_BENCH_SYNC_JSON=PATH` writes them there. Run by
/// `scripts/bench-undo.sh` after the write benchmark.
#[test]
#[ignore = "a benchmark: scripts/bench-undo.sh"]
fn bench_undo_sync_rate() {
    let (_, rounds) = bench_env();
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let lun = |extra: &str| {
        format!("[[target.lun]]\nid = 0\nstore = \"file:lun.img?size=256MiB\"\n{extra}")
    };
    let pairs = [
        ("undo", "127.0.0.62", "127.0.0.63", ""),
        ("no undo", "127.0.0.64", "127.0.0.65", "undo = false\n"),
    ];
    let fill = tmp.path().join("fill");
    testkit::random_file(&fill, 256 << 20, 9);
    let hosts_of: Vec<_> = pairs
        .iter()
        .map(|(what, src, dst, extra)| {
            let s = hosts.host(None, src, &lun("track = true\n"));
            let d = hosts.host(None, dst, &lun(extra));
            run_ok(
                rsv().to_str().unwrap(),
                &["cp", fill.to_str().unwrap(), &s.url(0)],
            );
            (*what, s, d)
        })
        .collect();
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for r in 0..rounds {
        for (what, s, d) in &hosts_of {
            let t0 = std::time::Instant::now();
            let out = hosts.sync_ok(&[
                "--json",
                "--full",
                "--pacing",
                "unpaced",
                &s.volume(0),
                &d.volume(0),
            ]);
            let wall = t0.elapsed().as_secs_f64();
            let done = result_line(&out);
            let rate = done["rate_bytes_per_s"].as_u64().unwrap_or(0);
            eprintln!(
                "round {r}, {what}: {:.1} MB/s over {:.2} s of transfer, {wall:.2} s in all (cycle {})",
                rate as f64 / 1e6,
                done["seconds"].as_f64().unwrap_or(0.0),
                done["cycle"]
            );
            rows.push(serde_json::json!({
                "far": what,
                "round": r,
                "rate_bytes_per_s": rate,
                "transfer_s": done["seconds"],
                "wall_s": wall,
                "cycle": done["cycle"],
            }));
        }
    }
    let median = |what: &str| {
        let mut x: Vec<u64> = rows
            .iter()
            .filter(|r| r["far"] == what)
            .map(|r| r["rate_bytes_per_s"].as_u64().unwrap_or(0))
            .collect();
        x.sort_unstable();
        x[x.len() / 2]
    };
    let (u, n) = (median("undo"), median("no undo"));
    eprintln!(
        "sync of 256 MiB unpaced on loopback: {:.1} MB/s into a far cycle, {:.1} MB/s with no undo log (ratio {:.3})",
        u as f64 / 1e6,
        n as f64 / 1e6,
        u as f64 / n.max(1) as f64
    );
    if let Some(path) = std::env::var_os("RSV_BENCH_SYNC_JSON") {
        let summary = serde_json::json!({
            "bench": "undo-sync",
            "sync": "rsv sync --json --full --pacing unpaced SRC DST",
            "lun": "file, 256 MiB of random data; far undo unit 64 KiB",
            "rounds": rounds,
            "undo_rate_median": u,
            "no_undo_rate_median": n,
            "runs": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap()).unwrap();
    }
}

/// `rsv sync` of a volume (two disk servers of `RSV_BENCH_SIZE` each, default 512M, random
/// data) onto far volumes that are fresh sparse files under `RSV_BENCH_DIR` (default
/// /dev/shm, where the lab keeps its sites): with the far LUNs' undo log on (the default)
/// and off (`undo = false`), alternating `RSV_BENCH_ROUNDS` times, each onto a new far
/// site (`--full`: the source's change tracking would send the second nothing). Prints
/// each sync's seconds and rate and the far undo logs' largest total size
/// seen while it ran (sampled every 50 ms); with `RSV_BENCH_JSON=PATH` also writes them
/// there. Run by `scripts/bench-undo.sh fresh`.
#[test]
#[ignore = "a benchmark: scripts/bench-undo.sh fresh"]
fn bench_sync_to_fresh_far_luns() {
    let (_, rounds) = bench_env();
    let size = std::env::var("RSV_BENCH_SIZE").unwrap_or_else(|_| "512M".into());
    let root = std::env::var("RSV_BENCH_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let tmp = tempfile::tempdir_in(&root).unwrap();
    let hosts = hosts(tmp.path());
    let store = format!("file:disk.img?size={size}");
    let a = hosts.site(
        Some(tmp.path().join("a").as_path()),
        111,
        2,
        &store,
        "track = true\n",
    );
    let fill = tmp.path().join("fill");
    let bytes = 2 * units::parse_size(&size).unwrap();
    testkit::random_file(&fill, bytes as usize, 7);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", fill.to_str().unwrap(), &a.url()],
    );
    std::fs::remove_file(&fill).unwrap();
    // The far undo logs' total size under `dir`, largest seen until `stop`.
    fn log_bytes(dir: &std::path::Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return 0;
        };
        rd.flatten()
            .map(|e| {
                let p = e.path();
                if p.is_dir() {
                    log_bytes(&p)
                } else if p.to_string_lossy().ends_with(".undo") {
                    // Bytes the file holds (its blocks), not its length.
                    use std::os::unix::fs::MetadataExt;
                    e.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
                } else {
                    0
                }
            })
            .sum()
    }
    let mut rows = Vec::new();
    let mut base = 114u8;
    for r in 0..rounds {
        for undo in [true, false] {
            let dir = tmp.path().join(format!("far-{r}-{undo}"));
            let extra = if undo { "" } else { "undo = false\n" };
            let b = hosts.site(Some(dir.as_path()), base, 2, &store, extra);
            base += 3;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sampler = {
                let (stop, dir) = (stop.clone(), dir.clone());
                std::thread::spawn(move || {
                    let mut most = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        most = most.max(log_bytes(&dir));
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    most
                })
            };
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let out = hosts.sync_ok(&[
                "--json",
                "--full",
                "--pacing",
                "unpaced",
                &a.volume(),
                &b.volume(),
            ]);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let most = sampler.join().unwrap();
            let res = result_line(&out);
            let row = serde_json::json!({
                "round": r,
                "undo": undo,
                "seconds": res["seconds"],
                "rate_bytes_per_s": res["rate_bytes_per_s"],
                "whole": res["cycle"]["whole"],
                "undo_log_bytes_most": most,
                "load_before": load.split_whitespace().next().unwrap_or(""),
            });
            eprintln!(
                "sync of {} MiB to a fresh far volume, undo {}: {:.2} s, {:.0} MB/s, undo logs up to {} KiB (load before {})",
                bytes >> 20,
                if undo { "on " } else { "off" },
                res["seconds"].as_f64().unwrap_or(0.0),
                res["rate_bytes_per_s"].as_f64().unwrap_or(0.0) / 1e6,
                most >> 10,
                row["load_before"].as_str().unwrap_or("")
            );
            rows.push(row);
        }
    }
    let summary = serde_json::json!({
        "bench": "undo-fresh",
        "volume": format!("2 disk servers x {size}, random data; far: fresh sparse files under {root}"),
        "sync": "rsv sync --json --full --pacing unpaced SRC DST (loopback)",
        "rows": rows,
    });
    if let Some(path) = std::env::var_os("RSV_BENCH_JSON") {
        std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap()).unwrap();
    }
}
