//! An initiator that follows a gateway group: two `rsv target` processes export the same
//! file LUN (`portal_group = 1, peer_portal_groups = [2]` and the other way round; the
//! file store keeps no cache of its own: pread/pwrite and a shared mapping of the file,
//! so both processes see one page cache), and the active gateway is killed with SIGKILL
//! under a verified write load:
//! - through the library: stamped 4 KiB writes from four writers, the gateway killed and
//!   left down; no writer sees an error, every acknowledged write reads back, the
//!   session's group shows the move, and the stall (the longest gap between completed
//!   writes across the kill) is printed;
//! - through `rsv load` (`?portal=` in its URL): the other gateway killed in turn; no
//!   error, no mismatch.
//!
//! `RESERVOIR_TEST_NO_FAILOVER=1` leaves the second portal out, as a session without a
//! group: then the writers fail (the test's check that it can).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use initiator::{IscsiUrl, Lun, SessionOptions};
use testkit::blocks::{ReadBack, Writers};
use testkit::{Spawn, Target};

const IQN: &str = "iqn.2026-11.org.reservoir:mpath";

fn gateway(data: &std::path::Path, group: u16, peer: u16, port: u16) -> Target {
    let config = format!(
        "portal_group = {group}\npeer_portal_groups = [{peer}]\n\
         [[target]]\niqn = \"{IQN}\"\n\
         [[target.lun]]\nid = 0\nstore = \"file:lun.img?size=64M\"\n"
    );
    let listen = format!("127.0.0.1:{port}");
    Target::spawn(Spawn {
        config: Some(&config),
        data: Some(data),
        listen: Some(&listen),
        ..Spawn::default()
    })
}

fn no_failover() -> bool {
    std::env::var_os("RESERVOIR_TEST_NO_FAILOVER").is_some_and(|v| v == "1")
}

/// `iscsi://FIRST/IQN/0?portal=SECOND` (without the second when failover is off).
fn url(first: u16, second: u16) -> String {
    let mut u = format!("iscsi://127.0.0.1:{first}/{IQN}/0?recovery_timeout=8");
    if !no_failover() {
        u.push_str(&format!("&portal=127.0.0.1:{second}"));
    }
    u
}

const WRITERS: u64 = 4;
const BLOCKS_EACH: u64 = 64;

/// Four writers of stamped blocks through a session given `url` (two portals), the
/// gateway of the first killed by `kill` after 1.5 s and left down: no writer error,
/// every acknowledged write reads back, the session on `second` after one failover.
/// Returns the stall (the longest gap between completed writes across the kill).
fn writes_across_a_kill(url: &str, first: &str, second: &str, kill: impl FnOnce()) -> Duration {
    let rt = testkit::rt();
    let u = IscsiUrl::parse(url).unwrap();
    let opts = u
        .options(&SessionOptions {
            auto_tune: false,
            ..SessionOptions::default()
        })
        .unwrap();
    let lun = rt.block_on(Lun::open_url(&u, &opts)).unwrap();
    let group = lun.session().group();
    if !no_failover() {
        assert_eq!(group.paths.len(), 2, "{group:?}");
        assert_eq!(group.current, first, "{group:?}");
        // Both groups active/optimized (today's answer), the first's group is 1.
        assert_eq!(group.paths[0].group, Some(1), "{group:?}");
    }
    let mut writers = Writers::start(&rt, &lun, WRITERS, BLOCKS_EACH);
    std::thread::sleep(Duration::from_millis(1500));
    let killed = Instant::now();
    kill();
    std::thread::sleep(Duration::from_secs(4));
    let (errors, times) = writers.stop(&rt);
    assert!(
        errors.is_empty(),
        "the application saw errors: {errors:?}\ninitiator group: {:?}",
        lun.session().group()
    );
    let before = times.iter().filter(|t| **t < killed).count();
    let after = times.len() - before;
    // The longest gap between completed writes from just before the kill on.
    let mut last = times[..before].last().copied().unwrap_or(killed);
    let mut stall = Duration::ZERO;
    for t in &times[before..] {
        stall = stall.max(t.duration_since(last));
        last = *t;
    }
    let first_after = times[before..].first().map(|t| t.duration_since(killed));
    println!(
        "kill -9 of the active gateway: stall {:.3} s (longest gap between completed \
         writes), first completion {:.3} s after the kill; {before} writes before, {after} \
         after",
        stall.as_secs_f64(),
        first_after.map_or(f64::NAN, |d| d.as_secs_f64())
    );
    assert!(after > 0, "no write completed after the kill");
    // Every acknowledged write reads back (through the gateway left).
    for ReadBack {
        block,
        owner: w,
        want,
        writer,
        seq,
    } in writers.read_back(&rt, &lun)
    {
        // One write per writer in flight: a later, unacknowledged one may be there.
        assert!(
            writer == w && seq >= want,
            "block {block}: acknowledged write {want} of writer {w} lost (reads \
             writer {writer} seq {seq})"
        );
    }
    let group = lun.session().group();
    assert_eq!(group.current, second, "{group:?}");
    assert_eq!(group.failovers, 1, "{group:?}");
    let info = lun.session().info();
    assert_eq!(info.portal, second);
    assert!(info.multipath.is_some());
    let _ = rt.block_on(lun.session().logout());
    stall
}

/// `rsv load` through `url` (two portals), the first's gateway killed by `kill` 2.5 s
/// in: 0 errors, 0 mismatches, the move logged.
fn load_across_a_kill(url: &str, kill: impl FnOnce()) {
    let load = Command::new(testkit::rsv())
        .args([
            "load",
            url,
            "--sessions",
            "4",
            "--duration",
            "6s",
            "--region",
            "4MiB",
            "--json",
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    kill();
    let out = load.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(r["errors"], 0, "{r:#}\n{stderr}");
    assert_eq!(r["mismatches"], 0, "{r:#}\n{stderr}");
    assert!(r["writes"].as_u64().unwrap() > 0, "{r:#}");
    assert!(
        stderr.contains("multipath: session to"),
        "no move logged:\n{stderr}"
    );
    println!(
        "rsv load across the kill of its gateway: {} writes, {} verified reads, 0 errors, \
         longest command {:.3} s",
        r["writes"],
        r["verified_reads"],
        r["latency_us_max"].as_f64().unwrap_or(f64::NAN) / 1e6
    );
}

#[test]
fn the_initiator_moves_to_the_other_gateway_when_the_active_one_is_killed() {
    let data = tempfile::tempdir().unwrap();
    let (pa, pb) = (testkit::free_port(), testkit::free_port());
    let a = gateway(data.path(), 1, 2, pa);
    let b = gateway(data.path(), 2, 1, pb);
    let (first, second) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    writes_across_a_kill(&url(pa, pb), &first, &second, || a.signal(libc::SIGKILL));
    // A again on its port, B killed under `rsv load`.
    drop(a);
    let _a = gateway(data.path(), 1, 2, pa);
    load_across_a_kill(&url(pb, pa), || b.signal(libc::SIGKILL));
}

/// The same on a real Ceph cluster: two gateways on one RBD image (then a third for the
/// `rsv load` part, where the first stays down).
#[cfg(feature = "rbd")]
#[test]
fn on_ceph_the_initiator_moves_to_the_other_gateway_when_the_active_one_is_killed() {
    use testkit::ceph::{have_ceph, lun, Cluster, Target as Gateway};
    if !have_ceph() {
        return testkit::skip("no Ceph (ceph-mon, ceph-osd, rbd...)");
    }
    let cluster = Cluster::start(false);
    cluster.create("mpath", "64M");
    let luns = lun(0, &cluster.spec("mpath"), "");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let gw = |i: usize, top: &str| Gateway::start_with(dirs[i].path(), top, &luns, false);
    let mut a = gw(0, "portal_group = 1\npeer_portal_groups = [2, 3]\n");
    let mut b = gw(1, "portal_group = 2\npeer_portal_groups = [1, 3]\n");
    let with = |t: &Gateway, other: &Gateway| {
        let mut u = t.url(0, 0) + "?recovery_timeout=8";
        if !no_failover() {
            u += &format!("&portal={}", other.portals[0]);
        }
        u
    };
    let (first, second) = (a.portals[0].clone(), b.portals[0].clone());
    writes_across_a_kill(&with(&a, &b), &first, &second, || a.kill());
    let _c = gw(2, "portal_group = 3\npeer_portal_groups = [1, 2]\n");
    load_across_a_kill(&with(&b, &_c), || b.kill());
}
