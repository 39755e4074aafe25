//! Failover of the active gateway with a persistent reservation held (issue 40), on a
//! real Ceph cluster: two `rsv target` gateways (portal groups 1 and 2, each the other's
//! peer) export one RBD image; Reservoir's initiator logs in through the first with the
//! second as `?portal=`, registers a key and holds WRITE EXCLUSIVE – REGISTRANTS ONLY
//! (`?pr_key=...&pr_type=we_ro`), and four writers of stamped 4 KiB blocks run through it
//! while the gateway the session is on is killed with SIGKILL, twice (each time started
//! again on its port before the next). After each kill:
//! - the session is on the other gateway (one more failover), no writer saw an error;
//! - a second initiator, libiscsi's client (`crates/testkit/src/libiscsi_cdb.c`), logged
//!   in through the surviving gateway, has its WRITE refused with RESERVATION CONFLICT,
//!   and its READ RESERVATION shows the owner's key and type.
//!
//! At the end every acknowledged write reads back, and the stall of each kill (the
//! longest gap between completed writes across it) is printed.
//!
//! `RESERVOIR_TEST_PR_PER_GATEWAY=1` starts the gateways without `peer_portal_groups`:
//! each keeps its reservations to itself, as a gateway group that did not share them
//! would, and the test fails at the first kill (the check that it can: the other
//! initiator's WRITE through the survivor passes).
//!
//! WRITE EXCLUSIVE – REGISTRANTS ONLY rather than EXCLUSIVE ACCESS: every registered
//! I_T nexus of the owner may write (its sessions, and its nexus through whichever
//! gateway it moved to), reads stay open to others, and the reservation does not depend
//! on which nexus took it (as `fence_scsi` and Windows clustering use it).

use std::time::{Duration, Instant};

use initiator::{IscsiUrl, Lun, SessionOptions};
use testkit::blocks::{ReadBack, Writers};
use testkit::ceph::{have_ceph, lun, wait_until_all_active, Cluster, Target as Gateway, IQN};
use testkit::walk::{Client, Dir, Libiscsi};

const KEY: u64 = 0x0000_5e55_1011_0040;
/// WRITE EXCLUSIVE – REGISTRANTS ONLY.
const WE_RO: u8 = 5;
const KILLS: usize = 2;
const WRITERS: u64 = 4;
const BLOCKS_EACH: u64 = 64;
const INTRUDER: &str = "iqn.2026-11.org.reservoir:intruder";

/// A command again while it meets a UNIT ATTENTION (the new nexus's power-on, a
/// reservation change).
fn send(c: &mut Libiscsi, cdb: &[u8], dir: Dir) -> testkit::walk::Answer {
    for _ in 0..8 {
        let a = c.cmd(0, cdb, &dir).expect("the libiscsi client's command");
        if a.status != 0x02 || a.sense.0 != 0x06 {
            return a;
        }
    }
    panic!("CDB {cdb:02x?}: unit attentions keep coming");
}

/// Through `portal`, as another initiator: a WRITE meets RESERVATION CONFLICT and READ
/// RESERVATION shows the owner's key and type. Returns what failed, if anything.
fn intruder_refused(bin: &std::path::Path, portal: &str) -> Vec<String> {
    let mut c = Libiscsi::login(bin, portal, IQN, INTRUDER, 0);
    let mut failed = Vec::new();
    // READ CAPACITY (10): the block length for a one-block WRITE (10).
    let cap = send(&mut c, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], Dir::Read(8));
    assert_eq!(cap.status, 0, "READ CAPACITY through {portal}: {cap:?}");
    let bl = u32::from_be_bytes(cap.data[4..8].try_into().unwrap()) as usize;
    // Far from the writers' blocks: LBA 8192 (4 MiB in at 512-byte blocks).
    let w = send(
        &mut c,
        &[0x2a, 0, 0, 0, 0x20, 0, 0, 0, 1, 0],
        Dir::Write(vec![0xee; bl]),
    );
    if w.status != 0x18 {
        failed.push(format!(
            "the other initiator's WRITE through {portal} answered status 0x{:02x} {:?}, \
             not RESERVATION CONFLICT",
            w.status, w.sense
        ));
    }
    let r = send(
        &mut c,
        &initiator::multipath::read_reservation_cdb(64),
        Dir::Read(64),
    );
    let seen = (r.status == 0)
        .then(|| initiator::multipath::parse_read_reservation(&r.data))
        .flatten();
    if seen != Some((KEY, WE_RO)) {
        failed.push(format!(
            "READ RESERVATION through {portal}: {seen:x?} (status 0x{:02x}), not key \
             0x{KEY:x} type {WE_RO}",
            r.status
        ));
    }
    failed
}

#[test]
fn the_reservation_holds_while_the_active_gateway_is_killed_under_writes() {
    if !have_ceph() || !testkit::have("cc") {
        return testkit::skip("no Ceph (ceph-mon, ceph-osd, rbd...) or no cc");
    }
    let cluster = Cluster::start(false);
    cluster.create("failover", "64M");
    let luns = lun(0, &cluster.spec("failover"), "");
    let work = tempfile::tempdir().unwrap();
    let bin = Libiscsi::build(work.path());
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let portals: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", testkit::free_port()))
        .collect();
    let per_gateway = std::env::var_os("RESERVOIR_TEST_PR_PER_GATEWAY").is_some_and(|v| v == "1");
    let start = |i: usize| {
        let top = if per_gateway {
            format!("portal_group = {}\n", i + 1)
        } else {
            format!(
                "portal_group = {}\npeer_portal_groups = [{}]\n",
                i + 1,
                2 - i
            )
        };
        Gateway::start_at(dirs[i].path(), &top, &luns, &portals[i])
    };
    let urls: Vec<String> = portals
        .iter()
        .map(|p| format!("iscsi://{p}/{IQN}/0"))
        .collect();
    let mut gws = [Some(start(0)), Some(start(1))];
    wait_until_all_active(&urls, Duration::from_secs(30));

    let rt = testkit::rt();
    let url = format!(
        "{}?recovery_timeout=20&portal={}&pr_key=0x{KEY:x}&pr_type=we_ro",
        urls[0], portals[1]
    );
    let u = IscsiUrl::parse(&url).unwrap();
    let opts = u
        .options(&SessionOptions {
            auto_tune: false,
            ..SessionOptions::default()
        })
        .unwrap();
    let lun = rt.block_on(Lun::open_url(&u, &opts)).unwrap();
    // Held before any kill, through the gateway it was taken through (both are checked
    // at the end).
    let f = intruder_refused(&bin, &portals[0]);
    assert!(f.is_empty(), "before any kill: {f:?}");

    let mut writers = Writers::start(&rt, &lun, WRITERS, BLOCKS_EACH);

    let mut kills = Vec::new();
    for k in 0..KILLS {
        std::thread::sleep(Duration::from_secs(1));
        let group = lun.session().group();
        let on = portals
            .iter()
            .position(|p| *p == group.current)
            .unwrap_or_else(|| panic!("the session is on no gateway of ours: {group:?}"));
        let other = 1 - on;
        let killed = Instant::now();
        gws[on].take().unwrap().kill();
        kills.push(killed);
        // The session moves, and writes complete again after the kill.
        let t = Instant::now();
        loop {
            let g = lun.session().group();
            let written = writers.completions().last().is_some_and(|c| *c > killed);
            if g.failovers == group.failovers + 1 && g.current == portals[other] && written {
                break;
            }
            let errs = writers.errors();
            assert!(
                errs.is_empty(),
                "kill {k}: the application saw errors: {errs:?}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "kill {k}: the session did not move to {} within 30 s: {g:?}",
                portals[other]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let f = intruder_refused(&bin, &portals[other]);
        assert!(f.is_empty(), "kill {k} of {}: {f:?}", portals[on]);
        gws[on] = Some(start(on));
        wait_until_all_active(&urls, Duration::from_secs(30));
    }
    std::thread::sleep(Duration::from_secs(1));
    let (errs, times) = writers.stop(&rt);
    assert!(
        errs.is_empty(),
        "the application saw errors: {errs:?}\ninitiator group: {:?}",
        lun.session().group()
    );
    // Every acknowledged write reads back.
    for ReadBack {
        block,
        owner: w,
        want,
        writer,
        seq,
    } in writers.read_back(&rt, &lun)
    {
        assert!(
            writer == w && seq == want,
            "block {block}: acknowledged write {want} of writer {w} lost (reads writer \
             {writer} seq {seq})"
        );
    }
    // The registration and the reservation are still the owner's, through both.
    for p in &portals {
        let f = intruder_refused(&bin, p);
        assert!(f.is_empty(), "after the kills: {f:?}");
    }
    let mut stalls = Vec::new();
    for (k, killed) in kills.iter().enumerate() {
        let until = kills.get(k + 1).copied();
        let mut last = times
            .iter()
            .rev()
            .find(|t| *t < killed)
            .copied()
            .unwrap_or(*killed);
        let mut stall = Duration::ZERO;
        for t in times
            .iter()
            .filter(|t| *t >= killed && until.is_none_or(|u| **t < u))
        {
            stall = stall.max(t.duration_since(last));
            last = *t;
        }
        stalls.push(format!("{:.3} s", stall.as_secs_f64()));
    }
    println!(
        "{KILLS} kills of the active gateway with WRITE EXCLUSIVE - REGISTRANTS ONLY held: \
         stalls {} (longest gap between completed writes across each), {} writes, 0 \
         errors, every acknowledged write read back, the other initiator refused after \
         each move",
        stalls.join(", "),
        times.len()
    );
    let _ = rt.block_on(lun.session().logout());
}
