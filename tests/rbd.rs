//! The `rbd` store against a real Ceph cluster that each test starts for itself with
//! `scripts/ceph-cluster.sh` (one monitor, one OSD; memstore unless the test restarts the
//! OSD): libiscsi's suite on an RBD-backed LUN with zero failures, a qemu-img round trip
//! read back through qemu's own rbd driver, a SIGKILL of the target mid-write that loses
//! no flushed data, an OSD killed and restarted mid-copy (a pause or errors, never wrong
//! data), the store's own errors and reconnection (its asynchronous reads, writes and
//! flushes among them), and reads and writes whose completions arrive after their
//! connection has gone.
//!
//! Without Ceph (ceph-mon, ceph-osd, rbd) the tests skip with a note, unless CI or
//! RESERVOIR_TEST_STRICT is set: then they fail (scripts/setup.sh installs Ceph).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backstore::Backstore;
use testkit::ceph::{failures, have_ceph, lun, Cluster, Target};
use testkit::{have, libiscsi_suite, qemu_read, qemu_write, random_file, run_ok};

/// libiscsi's suite (the ALL family, data loss and SANITIZE allowed, the multipath pair)
/// on an RBD-backed LUN: zero failures. Sanitize.Reset is left out as in
/// tests/conformance.rs: it sends a SANITIZE OVERWRITE of zeros, expects it still running
/// 3 s later, then sends ABORT TASK, ABORT TASK SET, LUN, warm and cold resets, logs in
/// again and expects it still running. On RBD the overwrite of zeros is one
/// `rbd_write_zeroes` of the image (64 MiB here: 16 objects; not timed); and even on
/// an image large enough to take longer, the target's ABORT TASK waits for a running
/// command to end (conn/tmf.rs), so the SANITIZE would be over by the time the test looks
/// again. Passing it needs a SANITIZE that outlives task management (SBC-4 lets it), not
/// an RBD change.
#[test]
fn libiscsi_suite_on_rbd_lun_has_no_failures() {
    if !have_ceph() || !have("iscsi-test-cu") {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("suite", "64M");
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(
        dir.path(),
        &lun(0, &cluster.spec("suite"), "removable = true"),
        true,
    );
    let t = Instant::now();
    let out = libiscsi_suite(
        &[
            "-d",
            "-S",
            "-t",
            "ALL",
            &target.url(0, 0),
            &target.url(1, 0),
        ],
        Duration::from_secs(900),
        &dir.path().join("suite.txt"),
    );
    let (failed, ran, skipped) = failures(&out);
    let summary = testkit::cunit_summary(&out).expect("iscsi-test-cu's run summary");
    assert_eq!(
        summary.2 as usize,
        failed.len(),
        "failures counted {failed:?}, the summary says {summary:?}"
    );
    let failed: Vec<String> = failed
        .into_iter()
        .filter(|t| t != "Sanitize.Reset")
        .collect();
    println!(
        "iscsi-test-cu on an RBD LUN: {ran} tests in {:.0} s, {} failed, {skipped} skip notes; failed: {failed:?}",
        t.elapsed().as_secs_f32(),
        failed.len()
    );
    assert!(ran > 100, "iscsi-test-cu ran too few tests:\n{out}");
    assert!(
        failed.is_empty(),
        "failures on the RBD LUN: {failed:?}\n{}",
        target
            .log()
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// qemu-img writes an image through the target into RBD; qemu's own rbd driver and the
/// rbd tool read the same bytes back from the cluster, and qemu-img reads them back
/// through the target.
#[test]
fn qemu_img_round_trip() {
    if !have_ceph() || !have("qemu-img") {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("qemu", "32M");
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path(), &lun(0, &cluster.spec("qemu"), ""), false);
    let src = dir.path().join("src.img");
    random_file(&src, 32 << 20, 23);
    let url = target.url(0, 0);
    qemu_write(&src, &url);
    let want = std::fs::read(&src).unwrap();
    let by_rbd_tool = cluster.export("qemu", &dir.path().join("exported.img"));
    assert!(
        by_rbd_tool == want,
        "rbd export differs from what was written"
    );
    let back = dir.path().join("back.img");
    let rbd_url = format!("rbd:rbd/qemu:conf={}", cluster.conf().display());
    qemu_read(&rbd_url, &back);
    assert!(
        std::fs::read(&back).unwrap() == want,
        "qemu's rbd driver reads other bytes"
    );
    let back2 = dir.path().join("back2.img");
    qemu_read(&url, &back2);
    assert!(
        std::fs::read(&back2).unwrap() == want,
        "reading back through the target gives other bytes"
    );
}

/// 64 KiB of a pattern naming chunk `i` in generation `g`.
fn chunk(i: u64, g: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(64 << 10);
    while v.len() < 64 << 10 {
        v.extend_from_slice(&(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ g).to_le_bytes());
        v.extend_from_slice(&(v.len() as u64).to_le_bytes());
    }
    v
}

/// Writers keep writing 64 KiB chunks, each followed by SYNCHRONIZE CACHE (or a FUA
/// write), while others write without flushing; the target is killed with SIGKILL in
/// the middle. Every chunk whose flush (or FUA write) had completed must be in the image,
/// as the rbd tool reads it after the crash.
#[test]
fn sigkill_of_target_mid_write_loses_no_flushed_data() {
    if !have_ceph() {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("crash", "64M");
    let dir = tempfile::tempdir().unwrap();
    let mut target = Target::start(dir.path(), &lun(0, &cluster.spec("crash"), ""), false);
    let url = initiator::IscsiUrl::parse(&target.url(0, 0)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // (offset, generation) of each chunk known durable.
    let durable: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let lun = rt
        .block_on(initiator::Lun::open_url(
            &url,
            &initiator::SessionOptions::default(),
        ))
        .expect("login");
    const CHUNK: u64 = 64 << 10;
    let mut tasks = Vec::new();
    // Four flushing writers over the first 32 MiB (each its own 8 MiB), FUA in one of them;
    // two unflushed writers over the second 32 MiB.
    for w in 0..6u64 {
        let (lun, durable, stop) = (lun.clone(), durable.clone(), stop.clone());
        tasks.push(rt.spawn(async move {
            let mut g = 0u64;
            while !stop.load(Ordering::Relaxed) {
                g += 1;
                for k in 0..128u64 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let off = w * (8 << 20) + k * CHUNK;
                    let data = chunk(off / CHUNK, g);
                    let ok = if w == 3 {
                        lun.write_fua(off, data.into()).await.is_ok()
                    } else {
                        lun.write_at(off, data.into()).await.is_ok()
                            && (w >= 4 || lun.flush().await.is_ok())
                    };
                    if !ok {
                        return;
                    }
                    if w < 4 {
                        durable.lock().unwrap().push((off, g));
                    }
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let before = durable.lock().unwrap().len();
    target.kill();
    let after = durable.lock().unwrap().len();
    stop.store(true, Ordering::Relaxed);
    drop(lun);
    rt.shutdown_timeout(Duration::from_secs(5));
    // The last known generation of each durable chunk; a chunk acknowledged after the kill
    // cannot be (the process is gone), so `after` counts what was durable at the kill.
    let mut last = std::collections::BTreeMap::new();
    for (off, g) in durable.lock().unwrap().iter().copied() {
        last.insert(off, g);
    }
    assert!(before > 20, "only {before} flushed chunks in 1.5 s");
    let image = cluster.export("crash", &dir.path().join("after-crash.img"));
    let mut lost = Vec::new();
    for (&off, &g) in &last {
        let have = &image[off as usize..(off + CHUNK) as usize];
        // A later generation may have reached the cluster unflushed (or in flight): only
        // the durable generation and newer are acceptable.
        let ok = (g..g + 2).any(|gen| have == chunk(off / CHUNK, gen).as_slice());
        if !ok {
            lost.push((off, g));
        }
    }
    println!(
        "{after} flushed or FUA chunks acknowledged before SIGKILL ({} distinct); lost: {}",
        last.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "flushed data lost at {lost:?}");
}

/// An OSD (bluestore, so its data survives) killed with SIGKILL while qemu-img copies an
/// image through the target, then started again: the copy pauses or fails, and once it
/// has succeeded (again, if it failed; on the same target) the image holds exactly what
/// was copied.
#[test]
fn osd_killed_and_restarted_mid_copy_pauses_or_fails_never_corrupts() {
    if !have_ceph() || !have("qemu-img") {
        return;
    }
    let cluster = Cluster::start(true);
    cluster.create("osd", "64M");
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(
        dir.path(),
        &lun(0, &format!("{}&timeout=20s", cluster.spec("osd")), ""),
        false,
    );
    let src = dir.path().join("src.img");
    random_file(&src, 64 << 20, 5);
    let url = target.url(0, 0);
    let copy = || {
        Command::new("qemu-img")
            .args(["convert", "-n", "-r", "24M", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&url)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let t = Instant::now();
    let child = copy();
    std::thread::sleep(Duration::from_millis(800));
    cluster.script("kill-osd");
    let killed_at = t.elapsed();
    std::thread::sleep(Duration::from_millis(1500));
    cluster.script("start-osd");
    let out = child.wait_with_output().unwrap();
    println!(
        "OSD killed at {:.1} s, back at {:.1} s; copy ended at {:.1} s: {}",
        killed_at.as_secs_f32(),
        (killed_at + Duration::from_millis(1500)).as_secs_f32(),
        t.elapsed().as_secs_f32(),
        if out.status.success() {
            "success (paused)".to_owned()
        } else {
            format!("failed: {}", String::from_utf8_lossy(&out.stderr).trim())
        }
    );
    assert!(
        killed_at < Duration::from_millis(2500),
        "the OSD was killed after the copy could have ended"
    );
    if !out.status.success() {
        // Errors are allowed; the same target must then take the copy again.
        let again = copy().wait_with_output().unwrap();
        assert!(
            again.status.success(),
            "the copy fails again after the OSD came back: {}\n{}",
            String::from_utf8_lossy(&again.stderr),
            target.log()
        );
    }
    let want = std::fs::read(&src).unwrap();
    let image = cluster.export("osd", &dir.path().join("exported.img"));
    assert!(image == want, "the image differs from the copied file");
    let back = dir.path().join("back.img");
    qemu_read(&url, &back);
    assert!(
        std::fs::read(&back).unwrap() == want,
        "reads through the target differ"
    );
}

/// Reads and writes started on librbd (asynchronously) and still in flight when their
/// initiator's connection goes away: with the OSD down they complete only at the store's timeout,
/// after the connection is gone (and the commands with it). The target takes those late
/// completions, serves a new session, and reads return the right data once the OSD is back.
#[test]
fn reads_in_flight_when_the_connection_goes_complete_safely() {
    if !have_ceph() {
        return;
    }
    let cluster = Cluster::start(true);
    cluster.create("late", "16M");
    let dir = tempfile::tempdir().unwrap();
    // Without librbd's cache, so that every read goes to the OSD.
    let mut target = Target::start(
        dir.path(),
        &lun(
            0,
            &format!("{}&timeout=3s&cache=no", cluster.spec("late")),
            "",
        ),
        false,
    );
    let url = initiator::IscsiUrl::parse(&target.url(0, 0)).unwrap();
    let opts = initiator::SessionOptions::default();
    let data = bytes::Bytes::from(
        (0..4u32 << 20)
            .map(|i| ((i * 7) >> 3) as u8)
            .collect::<Vec<_>>(),
    );
    let first = tokio::runtime::Runtime::new().unwrap();
    let lun = first
        .block_on(initiator::Lun::open_url(&url, &opts))
        .expect("login");
    first.block_on(async {
        lun.write_at(0, data.clone()).await.unwrap();
        lun.flush().await.unwrap();
        assert_eq!(lun.read_at(0, 4 << 20).await.unwrap(), data);
    });
    cluster.script("kill-osd");
    for i in 0..32u64 {
        let lun = lun.clone();
        first.spawn(async move { lun.read_at(i * 131072, 4096).await });
    }
    // Writes too (started on librbd the same way), elsewhere in the image.
    for i in 0..16u64 {
        let lun = lun.clone();
        let d = bytes::Bytes::from(vec![i as u8; 8192]);
        first.spawn(async move { lun.write_at((8 << 20) + i * 65536, d).await });
    }
    // The reads reach the target and librbd; then the initiator is gone, connections and
    // all, without a logout.
    std::thread::sleep(Duration::from_millis(500));
    drop(lun);
    first.shutdown_background();
    // librbd gives up on them (timeout=3s) after the connection has closed.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        target.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the target died:\n{}",
        target.log()
    );
    cluster.script("start-osd");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = Instant::now();
    let back = loop {
        let got = rt.block_on(async {
            let lun = initiator::Lun::open_url(&url, &opts).await?;
            lun.read_at(0, 4 << 20).await
        });
        match got {
            Ok(b) => break b,
            Err(e) if t.elapsed() < Duration::from_secs(40) => {
                println!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!(
                "no read 40 s after the OSD came back: {e}\n{}",
                target.log()
            ),
        }
    };
    assert!(back == data, "reads after the outage differ");
    let log = target.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        log.contains("backstore I/O error"),
        "the reads in flight did not fail in the store:\n{log}"
    );
    target.kill();
}

fn open(spec: &str) -> Result<Arc<dyn Backstore>, backstore::OpenError> {
    let mut reg = backstore::Registry::with_builtins();
    rbd::register(&mut reg);
    let spec: backstore::StoreSpec = spec.parse().unwrap();
    reg.context(Path::new("/")).open(&spec)
}

/// The store itself: zeroing and discarding ranges smaller than librbd's discard
/// granularity reads back zeros; allocation status; clear errors for a missing image and
/// an unreachable cluster; an OSD that stops answering fails commands after `timeout`,
/// and the same store works again once it is back.
#[test]
fn store_zeroes_errors_and_reconnection() {
    if !have_ceph() {
        return;
    }
    let cluster = Cluster::start(true);
    cluster.create("store", "16M");
    let store = open(&format!("{}&timeout=3s", cluster.spec("store"))).expect("open");
    assert_eq!(store.size(), 16 << 20);
    assert!(store.description().contains("rbd/store"));

    // Zeroing and discard below the 64 KiB granularity.
    let data = vec![0xa5u8; 1 << 20];
    store.write_at(&data, 0).unwrap();
    store.flush().unwrap();
    store.discard(4096, 4096).unwrap();
    store.write_zeroes(65536 + 512, 1024).unwrap();
    let mut back = vec![0u8; 1 << 20];
    store.read_at(&mut back, 0).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0xa5));
    assert!(
        back[4096..8192].iter().all(|&b| b == 0),
        "a small discard reads as zeros"
    );
    assert!(back[8192..65536 + 512].iter().all(|&b| b == 0xa5));
    assert!(back[65536 + 512..65536 + 1536].iter().all(|&b| b == 0));
    assert!(back[65536 + 1536..].iter().all(|&b| b == 0xa5));
    // Allocation: the first MiB written, the rest never.
    let ext = store.is_allocated(0, 16 << 20).unwrap();
    assert_eq!(ext.iter().map(|e| e.1).sum::<u64>(), 16 << 20, "{ext:?}");
    assert!(ext[0].2 && ext[0].0 == 0, "{ext:?}");
    assert!(!ext.last().unwrap().2, "{ext:?}");
    // A whole object (4 MiB) discarded is deallocated.
    store.write_at(&data, 4 << 20).unwrap();
    store.discard(4 << 20, 4 << 20).unwrap();
    let ext = store.is_allocated(4 << 20, 4 << 20).unwrap();
    assert_eq!(ext, vec![(4 << 20, 4 << 20, false)], "discarded object");

    // librados' completion threads: one by default, any count a LUN asks for; nonsense
    // refused before connecting.
    let two = open(&format!("{}&timeout=3s&threads=2", cluster.spec("store"))).expect("threads=2");
    let mut again = vec![0u8; 1 << 20];
    two.read_at(&mut again, 0).unwrap();
    assert!(
        again == back,
        "threads=2 reads what the default store reads"
    );
    drop(two);
    for bad in ["0", "x", "65"] {
        let e = open(&format!("{}&threads={bad}", cluster.spec("store")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("threads=") && e.contains("1 to 64"), "{e}");
    }

    // Clear errors.
    let e = open(&cluster.spec("nonesuch")).unwrap_err().to_string();
    assert!(
        e.contains("no such image") && e.contains("rbd/nonesuch"),
        "{e}"
    );
    let t = Instant::now();
    let e = open(&format!(
        "{}&mon_host=v2:127.0.0.1:9&timeout=2s",
        cluster.spec("store")
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("cannot reach"), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );

    // Asynchronous reads (completed by librbd's callback) read what the blocking ones do,
    // many at once; a range past the end fails at once.
    assert!(
        store.reads_async(),
        "a connected RBD store reads asynchronously"
    );
    let mut want = vec![0u8; 16 << 20];
    store.read_at(&mut want, 0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let ranges: Vec<(u64, usize)> = (0..64u64)
        .map(|i| ((i * 7919 % 4000) * 4096, 4096 << (i % 3)))
        .collect();
    for (i, &(off, len)) in ranges.iter().enumerate() {
        let tx = tx.clone();
        let buf = backstore::buffers::Buf::take(len);
        store.read_async(buf, off, Box::new(move |b, r| tx.send((i, b, r)).unwrap()));
    }
    for _ in 0..ranges.len() {
        let (i, b, r) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a read's completion");
        r.unwrap_or_else(|e| panic!("async read {i}: {e}"));
        let (off, len) = ranges[i];
        assert!(
            b[..] == want[off as usize..off as usize + len],
            "async read {i} at {off}+{len} differs"
        );
    }
    store.read_async(
        backstore::buffers::Buf::take(8192),
        (16 << 20) - 4096,
        Box::new(move |b, r| tx.send((0, b, r)).unwrap()),
    );
    let (_, _, r) = rx.recv_timeout(Duration::from_secs(1)).unwrap();
    assert!(r.is_err(), "a read past the end succeeded");

    // Lent reads (librbd's own buffers through the C++ shim): 64 KiB and more, none below;
    // within one object (one segment, lent as it is) and across the 4 MiB objects (several,
    // copied into one buffer), many at once: the bytes are the image's.
    assert!(store.reads_lent_async(64 << 10) && !store.reads_lent_async(4096));
    let (ltx, lrx) = std::sync::mpsc::channel();
    let lent: Vec<(u64, usize)> = (0..32u64)
        .map(|i| match i % 4 {
            3 => ((4 << 20) * (1 + i % 3) - (64 << 10), 256 << 10),
            _ => ((i * 7919 % 3000) * 4096, (64 << 10) << (i % 5)),
        })
        .collect();
    for (i, &(off, len)) in lent.iter().enumerate() {
        let ltx = ltx.clone();
        store.read_lent_async(off, len, Box::new(move |r| ltx.send((i, r)).unwrap()));
    }
    for _ in 0..lent.len() {
        let (i, r) = lrx
            .recv_timeout(Duration::from_secs(20))
            .expect("a lent read's completion");
        let got = r.unwrap_or_else(|e| panic!("lent read {i}: {e}"));
        let (off, len) = lent[i];
        assert_eq!(got.len(), len, "lent read {i}");
        assert!(got.readable_in_user_space());
        assert!(
            got.as_ref() == &want[off as usize..off as usize + len],
            "lent read {i} at {off}+{len} differs"
        );
    }
    store.read_lent_async(
        (16 << 20) - (64 << 10),
        128 << 10,
        Box::new(move |r| ltx.send((0, r)).unwrap()),
    );
    let (_, r) = lrx.recv_timeout(Duration::from_secs(1)).unwrap();
    assert!(r.is_err(), "a lent read past the end succeeded");

    // Asynchronous writes (completed by librbd's callback; half of them durable: flushed
    // before their completion), many at once, then an asynchronous flush: read back as
    // written. A write past the end fails at once.
    assert!(
        store.writes_async(),
        "a connected RBD store writes asynchronously"
    );
    let (wtx, wrx) = std::sync::mpsc::channel();
    let mut expect = want.clone();
    let writes: Vec<(u64, usize)> = (0..64u64)
        .map(|i| {
            (
                (10 << 20) + (i * 37 % 64) * 65536 + (i % 3) * 4096,
                4096 << (i % 4),
            )
        })
        .collect();
    for (i, &(off, len)) in writes.iter().enumerate() {
        let mut buf = backstore::buffers::Buf::take(len);
        buf.fill(i as u8 ^ 0x3c);
        expect[off as usize..off as usize + len].fill(i as u8 ^ 0x3c);
        let wtx = wtx.clone();
        store.write_async(
            buf,
            off,
            i % 2 == 0,
            Box::new(move |b, r| wtx.send((i, b.len(), r)).unwrap()),
        );
    }
    for _ in 0..writes.len() {
        let (i, len, r) = wrx
            .recv_timeout(Duration::from_secs(20))
            .expect("a write's completion");
        r.unwrap_or_else(|e| panic!("async write {i}: {e}"));
        assert_eq!(len, writes[i].1, "the buffer comes back");
    }
    let (ftx, frx) = std::sync::mpsc::channel();
    store.flush_async(Box::new(move |r| ftx.send(r).unwrap()));
    frx.recv_timeout(Duration::from_secs(20))
        .expect("a flush's completion")
        .expect("async flush");
    store.read_at(&mut want, 0).unwrap();
    assert!(want == expect, "async writes read back differently");
    store.write_async(
        backstore::buffers::Buf::take(8192),
        (16 << 20) - 4096,
        true,
        Box::new(move |b, r| wtx.send((0, b.len(), r)).unwrap()),
    );
    let (_, _, r) = wrx.recv_timeout(Duration::from_secs(1)).unwrap();
    assert!(r.is_err(), "a write past the end succeeded");

    // The OSD gone: an asynchronous read fails within the timeout, and the store stops
    // reading asynchronously until the blocking path has connected again; writes fail
    // within the timeout; back, the same store works again.
    // A second handle without librbd's cache, for a durable write with the OSD down: with
    // the cache (write-around, after the first flush) librbd acknowledged such a write and
    // its flush although it logged the write's ETIMEDOUT (seen 2026-11-25, Ceph 16.2.15).
    let uncached =
        open(&format!("{}&timeout=3s&cache=no", cluster.spec("store"))).expect("open uncached");
    cluster.script("kill-osd");
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    store.read_async(
        backstore::buffers::Buf::take(4096),
        8 << 20,
        Box::new(move |b, r| tx.send((b, r)).unwrap()),
    );
    // A lent read (into librbd's bufferlist) fails within the timeout too: its completion
    // comes, and the bufferlist is freed with the error.
    let (ltx, lrx) = std::sync::mpsc::channel();
    uncached.read_lent_async(4 << 20, 1 << 20, Box::new(move |r| ltx.send(r).unwrap()));
    // A durable asynchronous write queued beside it fails too (not acknowledged).
    let (wtx, wrx) = std::sync::mpsc::channel();
    uncached.write_async(
        backstore::buffers::Buf::take(4096),
        12 << 20,
        true,
        Box::new(move |_, r| wtx.send(r).unwrap()),
    );
    let (_, r) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("no completion for an asynchronous read with the OSD down");
    let w = wrx
        .recv_timeout(Duration::from_secs(20))
        .expect("no completion for an asynchronous write with the OSD down");
    let l = lrx
        .recv_timeout(Duration::from_secs(20))
        .expect("no completion for a lent read with the OSD down");
    println!(
        "lent read with the OSD down: {:?}",
        l.as_ref().map(|b| b.len())
    );
    assert!(l.is_err(), "a lent read with the OSD down succeeded");
    println!("async write with the OSD down: {w:?}");
    assert!(
        w.is_err(),
        "an asynchronous write with the OSD down succeeded"
    );
    println!(
        "async read with the OSD down: {r:?} after {:?}",
        t.elapsed()
    );
    let e = r.expect_err("an asynchronous read with the OSD down succeeded");
    assert!(e.to_string().contains("rbd/store"), "{e}");
    assert!(
        !store.reads_async(),
        "still asynchronous on a lost connection"
    );
    let t = Instant::now();
    let r = store.write_at(&data, 8 << 20).and_then(|()| store.flush());
    let waited = t.elapsed();
    println!("with the OSD down: {r:?} after {waited:?}");
    assert!(r.is_err(), "a write with the OSD down succeeded");
    assert!(waited < Duration::from_secs(20), "took {waited:?}");
    cluster.script("start-osd");
    drop(uncached);
    let t = Instant::now();
    let mut ok = false;
    while t.elapsed() < Duration::from_secs(30) {
        if store
            .write_at(&data, 8 << 20)
            .and_then(|()| store.flush())
            .is_ok()
        {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(ok, "the store did not come back after the OSD did");
    store.read_at(&mut back, 8 << 20).unwrap();
    assert!(back == data);
    assert!(store.reads_async(), "asynchronous again once connected");
    let (tx, rx) = std::sync::mpsc::channel();
    store.read_async(
        backstore::buffers::Buf::take(1 << 20),
        8 << 20,
        Box::new(move |b, r| tx.send((b, r)).unwrap()),
    );
    let (b, r) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    r.unwrap();
    assert!(b[..] == data[..], "asynchronous read after the outage");
    let (ltx, lrx) = std::sync::mpsc::channel();
    store.read_lent_async(8 << 20, 1 << 20, Box::new(move |r| ltx.send(r).unwrap()));
    let l = lrx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
    assert!(l.as_ref() == &data[..], "lent read after the outage");
    store.read_at(&mut back, 0).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == 0xa5),
        "data before the outage"
    );
}

/// REQUEST SENSE on `lun`: (key, ASC, ASCQ) of the sense it returns (a pending unit
/// attention, or NO SENSE), taking the unit attention as the initiator's command would.
async fn request_sense(s: &initiator::Session, lun: u16) -> (u8, u8, u8) {
    let r = s
        .command_ok(lun, &[0x03, 0, 0, 0, 252, 0], initiator::DataDir::Read(252))
        .await
        .expect("REQUEST SENSE");
    let d = &r.data;
    assert!(d.len() >= 14, "short sense data {d:?}");
    (d[2] & 0x0f, d[12], d[13])
}

/// Takes the unit attentions pending for a nexus (POWER ON RESET after login).
async fn drain_unit_attentions(s: &initiator::Session, lun: u16) {
    for _ in 0..8 {
        if request_sense(s, lun).await.0 == 0 {
            return;
        }
    }
    panic!("unit attentions keep coming");
}

/// `rbd resize` of an exported image, bigger then smaller: each of two nexuses (one per
/// portal) gets CAPACITY DATA HAS CHANGED (ASC 2Ah, ASCQ 09h) once, READ CAPACITY then
/// reports the new size (through the initiator and through libiscsi's
/// iscsi-readcapacity16), the blocks past the old end are writable and read back, and after
/// shrinking the ones past the new end are out of range.
#[test]
fn rbd_resize_raises_capacity_changed_on_every_nexus() {
    if !have_ceph() {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("grow", "16M");
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path(), &lun(0, &cluster.spec("grow"), ""), false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = initiator::SessionOptions::default();
    let connect = |portal: usize| {
        let url = initiator::IscsiUrl::parse(&target.url(portal, 0)).unwrap();
        rt.block_on(initiator::Session::connect(&url, &opts))
            .expect("login")
    };
    let (a, b) = (connect(0), connect(1));
    rt.block_on(async {
        drain_unit_attentions(&a, 0).await;
        drain_unit_attentions(&b, 0).await;
        assert_eq!(a.read_capacity(0).await.unwrap().bytes(), 16 << 20);
    });
    const CHANGED: (u8, u8, u8) = (0x06, 0x2a, 0x09);
    // Polls nexus `s` until it reports the unit attention; how long that took.
    let wait_changed = |s: &initiator::Session| {
        let t = Instant::now();
        rt.block_on(async {
            loop {
                let got = request_sense(s, 0).await;
                if got == CHANGED {
                    return t.elapsed();
                }
                assert_eq!(got.0, 0, "another sense {got:x?} while waiting");
                assert!(
                    t.elapsed() < Duration::from_secs(15),
                    "no CAPACITY DATA HAS CHANGED 15 s after the resize"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let readcap16 =
        |portal: usize| -> String { run_ok("iscsi-readcapacity16", &[&target.url(portal, 0)]) };

    cluster.rbd(&["resize", "--size", "48M", "grow"]);
    let took = wait_changed(&a);
    println!("grown to 48 MiB: unit attention after {took:?}");
    rt.block_on(async {
        // The other nexus was idle: its unit attention waits for it, once.
        assert_eq!(request_sense(&b, 0).await, CHANGED, "second nexus");
        assert_eq!(request_sense(&b, 0).await.0, 0, "reported twice");
        assert_eq!(request_sense(&a, 0).await.0, 0, "reported twice");
        assert_eq!(a.read_capacity(0).await.unwrap().bytes(), 48 << 20);
        assert_eq!(b.read_capacity(0).await.unwrap().bytes(), 48 << 20);
        // The new blocks take data.
        let data = bytes::Bytes::from(vec![0x5au8; 1 << 20]);
        let lba = (40u64 << 20) / 512;
        b.write(0, lba, data.clone())
            .await
            .expect("write past the old end");
        b.sync_cache(0).await.unwrap();
        assert_eq!(a.read(0, lba, 2048).await.unwrap(), data);
    });
    let out = readcap16(0);
    assert!(
        out.contains(&format!("{}", (48u64 << 20) / 512 - 1)) || out.contains("50331648"),
        "iscsi-readcapacity16 after growing:\n{out}"
    );

    cluster.rbd(&["resize", "--allow-shrink", "--size", "8M", "grow"]);
    let took = wait_changed(&b);
    println!("shrunk to 8 MiB: unit attention after {took:?}");
    rt.block_on(async {
        assert_eq!(
            request_sense(&a, 0).await,
            CHANGED,
            "first nexus after shrinking"
        );
        assert_eq!(a.read_capacity(0).await.unwrap().bytes(), 8 << 20);
        let past = a
            .command(
                0,
                &[0x28, 0, 0, 0, 0x40, 0, 0, 0, 8, 0],
                initiator::DataDir::Read(4096),
            )
            .await
            .unwrap();
        let s = past.sense.expect("a read past the new end fails");
        assert_eq!((s.key, s.asc), (0x05, 0x21), "LBA OUT OF RANGE: {s:?}");
    });
    let out = readcap16(1);
    assert!(
        out.contains(&format!("{}", (8u64 << 20) / 512 - 1)) || out.contains("8388608"),
        "iscsi-readcapacity16 after shrinking:\n{out}"
    );
}

/// The designator of `kind` (VPD page 83h designator type) in a page's bytes.
fn designator(page: &[u8], kind: u8) -> Option<Vec<u8>> {
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = page[at + 3] as usize;
        if page[at + 1] & 0x0f == kind {
            return Some(page[at + 4..at + 4 + len].to_vec());
        }
        at += 4 + len;
    }
    None
}

/// Two targets export one image (the same IQN and LUN, portal groups 1 and 2, each naming
/// the other as its peer): both say implicit and explicit ALUA in INQUIRY, give the same LU designator
/// and their own target port group in VPD 83h, and answer REPORT TARGET PORT GROUPS with
/// the same two active/optimized groups; reservations are refused on both (ILLEGAL
/// REQUEST, INVALID COMMAND OPERATION CODE); a write through one is read through the
/// other even after the other has read the block (no librbd cache on a shared image); a
/// LOGICAL UNIT RESET through one gives a nexus of the other its unit attention; and
/// libiscsi's MultipathIO family, given one path through each target, passes with the
/// reservation families skipped rather than failed. A shared store refuses `cache=yes`.
#[test]
fn two_targets_one_image_alua_and_reservations() {
    if !have_ceph() || !have("iscsi-test-cu") {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("mp", "64M");
    // Started once the gateways agree on their states, within a few heartbeats of their
    // start (ALUA that follows health: tests/gateway_alua.rs).
    let testkit::ceph::Pair { a, b, dirs } =
        testkit::ceph::gateway_pair(&lun(0, &cluster.spec("mp"), ""), false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = initiator::SessionOptions::default();
    let connect = |t: &Target| {
        let url = initiator::IscsiUrl::parse(&t.url(0, 0)).unwrap();
        rt.block_on(initiator::Session::connect(&url, &opts))
            .expect("login")
    };
    let (sa, sb) = (connect(&a), connect(&b));
    rt.block_on(async {
        drain_unit_attentions(&sa, 0).await;
        drain_unit_attentions(&sb, 0).await;
        let mut rtpg = Vec::new();
        for (s, group) in [(&sa, 1u16), (&sb, 2)] {
            let inq = s
                .command_ok(0, &[0x12, 0, 0, 0, 96, 0], initiator::DataDir::Read(96))
                .await
                .unwrap();
            // Implicit and explicit: the gateway group keeps its states in the cluster
            // (tests/gateway_alua.rs).
            assert_eq!(inq.data[5] & 0x30, 0x30, "TPGS: implicit and explicit ALUA");
            let vpd = s.vpd(0, 0x83).await.unwrap();
            let tpg = designator(&vpd, 5).expect("target port group designator");
            assert_eq!(u16::from_be_bytes([tpg[2], tpg[3]]), group);
            let rel = designator(&vpd, 4).expect("relative port designator");
            assert_eq!(u16::from_be_bytes([rel[2], rel[3]]), group);
            rtpg.push((
                designator(&vpd, 3).expect("NAA designator"),
                s.command_ok(
                    0,
                    &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0],
                    initiator::DataDir::Read(1024),
                )
                .await
                .unwrap()
                .data,
            ));
            // SPC-2 reservations are refused (an I_T nexus's reservation cannot hold
            // through the other gateway); persistent ones are kept in the cluster
            // (tests/gateway_pr.rs).
            for cdb in [&[0x16, 0, 0, 0, 0, 0][..]] {
                let dir = if cdb[0] == 0x5f {
                    initiator::DataDir::Write(vec![0u8; 24].into())
                } else {
                    initiator::DataDir::Read(4096)
                };
                let r = s.command(0, cdb, dir).await.unwrap();
                let sense = r.sense.unwrap_or_else(|| panic!("{:02x} accepted", cdb[0]));
                assert_eq!((sense.key, sense.asc, sense.ascq), (0x05, 0x20, 0x00));
            }
        }
        assert_eq!(
            rtpg[0].0, rtpg[1].0,
            "one LU designator through both targets"
        );
        assert_eq!(rtpg[0].1, rtpg[1].1, "REPORT TARGET PORT GROUPS differs");
        let d = &rtpg[0].1;
        assert_eq!(
            u32::from_be_bytes(d[..4].try_into().unwrap()),
            24,
            "{d:02x?}"
        );
        for (i, g) in [1u16, 2].into_iter().enumerate() {
            let grp = &d[4 + 12 * i..16 + 12 * i];
            assert_eq!(
                (grp[0] & 0x0f, u16::from_be_bytes([grp[2], grp[3]])),
                (0, g)
            );
        }

        // One path reads a block, the other writes it, the first reads the new bytes.
        let lba = 1000;
        let old = sa.read(0, lba, 8).await.unwrap();
        let new = bytes::Bytes::from(vec![!old[0]; 4096]);
        sb.write(0, lba, new.clone()).await.unwrap();
        assert_eq!(
            sa.read(0, lba, 8).await.unwrap(),
            new,
            "stale read through A"
        );

        // A reset through A reaches B's nexus.
        assert_eq!(sa.lun_reset(0).await.unwrap(), 0);
        let (key, asc, _) = request_sense(&sb, 0).await;
        assert_eq!(
            (key, asc),
            (0x06, 0x29),
            "no reset unit attention through B"
        );
    });
    drop((sa, sb));

    let out = libiscsi_suite(
        &[
            "-d",
            "-S",
            "-t",
            "ALL.MultipathIO,ALL.ProutRegister,ALL.PrinReadKeys,ALL.Reserve6",
            &a.url(0, 0),
            &b.url(0, 0),
        ],
        Duration::from_secs(300),
        &dirs[0].path().join("suite.txt"),
    );
    let (failed, ran, skipped) = failures(&out);
    println!("iscsi-test-cu, one path through each target: {ran} tests, failed {failed:?}, {skipped} skip notes");
    // The family runs only when both paths lead to one LU (VPD 83h), and skips otherwise.
    for t in ["Simple", "Reset", "CompareAndWrite"] {
        assert!(
            out.contains(&format!("Test: {t} ...passed\n")),
            "MultipathIO.{t} did not run and pass:\n{out}"
        );
    }
    assert!(ran >= 13, "too few tests ran:\n{out}");
    assert!(failed.is_empty(), "failures: {failed:?}\n{out}");
    assert!(!out.contains("PROUT Not Supported"), "{out}");

    // A shared image refuses librbd's cache, and one librados completion thread (the
    // watch of peers' resets waits on it).
    let mut reg = backstore::Registry::with_builtins();
    rbd::register(&mut reg);
    let refusal = |param: &str| {
        let spec: backstore::StoreSpec = format!("{}&{param}", cluster.spec("mp")).parse().unwrap();
        let e = reg.context(Path::new("/")).shared(true).open(&spec);
        e.unwrap_err().to_string()
    };
    let e = refusal("cache=yes");
    assert!(e.contains("cache=yes"), "{e}");
    let e = refusal("threads=1");
    assert!(
        e.contains("threads=1 on an image that other targets export"),
        "{e}"
    );
}

/// LUN masking on an RBD LUN: the walk of tests/access.rs (every listed opcode and
/// service action, EXTENDED COPY and reservations crafted to reach it) by an initiator
/// masked from the RBD LUN, through raw PDUs, Reservoir's initiator and libiscsi: the hidden LUN
/// answers as an absent one, and keeps its bytes and reservations.
#[test]
fn masked_initiator_cannot_reach_a_hidden_rbd_lun() {
    use testkit::walk::{walk, Layout, Libiscsi, Ours, RawPdus, ADMIN, MASKED};
    if !have_ceph() || !have("cc") {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("hidden", "16M");
    let iqn = "iqn.2026-11.org.reservoir:rbd-masked";
    let config = format!(
        "[[target]]\niqn = \"{iqn}\"\n[[target.initiator]]\nname = \"{ADMIN}\"\n\
         [[target.initiator]]\nname = \"{MASKED}\"\nluns = [1]\n\
         [[target.lun]]\nid = 0\nstore = \"{}\"\n\
         [[target.lun]]\nid = 1\nstore = \"file:visible.img?size=8MiB\"\n",
        cluster.spec("hidden")
    );
    let target = testkit::Target::start(Some(&config));
    let layout = Layout {
        visible: 1,
        hidden: 0,
        absent: 9,
        block_size: 512,
    };
    let mut admin = Ours::login(&target.portal, iqn, ADMIN);
    let mut masked = RawPdus::login(&target.portal, iqn, MASKED);
    let r = walk(&mut masked, &mut admin, &layout);
    eprintln!(
        "rbd: raw PDUs walked {} commands: 0 cross-LU reads or writes",
        r.commands
    );
    let mut masked = Ours::login(&target.portal, iqn, MASKED);
    let r = walk(&mut masked, &mut admin, &layout);
    eprintln!(
        "rbd: Reservoir's initiator walked {} commands: 0 cross-LU reads or writes",
        r.commands
    );
    let dir = tempfile::tempdir().unwrap();
    let bin = Libiscsi::build(dir.path());
    let mut masked = Libiscsi::login(&bin, &target.portal, iqn, MASKED, 1);
    let r = walk(&mut masked, &mut admin, &layout);
    eprintln!(
        "rbd: libiscsi walked {} commands: 0 cross-LU reads or writes",
        r.commands
    );
}
