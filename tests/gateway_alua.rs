//! ALUA that follows health in a gateway group: two `rsv target` processes export one RBD
//! image of a throw-away Ceph cluster (`scripts/ceph-cluster.sh`) and keep their target
//! port groups' states in it (`rbd::alua`). One test, one cluster (starting one costs
//! ~5-10 s): REPORT TARGET PORT GROUPS agrees through both; SET TARGET PORT GROUPS
//! through one changes what the other reports and serves, with its unit attention; a
//! SIGKILLed gateway turns unavailable in the other's answer and active again when it
//! returns; libiscsi's MultipathIO family passes on one path through each; and a gateway
//! whose cluster goes away answers NOT READY with the ALUA sense instead of hanging.
//!
//! Without Ceph the test skips with a note, unless CI or RESERVOIR_TEST_STRICT is set.

use std::time::{Duration, Instant};

use initiator::{DataDir, Session};
use testkit::ceph::{failures, have_ceph, lun, Cluster, Target};
use testkit::{have, libiscsi_suite};

const RTPG_EXT: [u8; 12] = [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
const TUR: [u8; 6] = [0; 6];

/// What REPORT TARGET PORT GROUPS (extended header) said: the header's implicit
/// transition time, and per group (id, state, supported states, status code).
#[derive(Debug, PartialEq, Eq, Clone)]
struct Rtpg {
    transition_time: u8,
    groups: Vec<(u16, u8, u8, u8)>,
}

fn parse_rtpg(d: &[u8]) -> Rtpg {
    assert!(d.len() >= 8, "{d:02x?}");
    let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len(), "RETURN DATA LENGTH");
    assert_eq!(d[4], 0x10, "FORMAT TYPE 001b");
    let mut groups = Vec::new();
    let mut at = 8;
    while at < d.len() {
        let g = &d[at..];
        let ports = g[7] as usize;
        groups.push((u16::from_be_bytes([g[2], g[3]]), g[0] & 0x0f, g[1], g[5]));
        at += 8 + 4 * ports;
    }
    Rtpg {
        transition_time: d[5],
        groups,
    }
}

/// One command with a deadline: a gateway must answer, never hang.
async fn cmd(s: &Session, cdb: &[u8], dir: DataDir) -> initiator::ScsiResult {
    tokio::time::timeout(Duration::from_secs(20), s.command(0, cdb, dir))
        .await
        .expect("the gateway did not answer within 20 s")
        .expect("command")
}

async fn rtpg(s: &Session) -> Rtpg {
    // A unit attention may come first; REPORT TARGET PORT GROUPS then answers.
    for _ in 0..4 {
        let r = cmd(s, &RTPG_EXT, DataDir::Read(1024)).await;
        if r.status == 0 {
            return parse_rtpg(&r.data);
        }
    }
    panic!("REPORT TARGET PORT GROUPS keeps failing");
}

/// The sense (key, ASC, ASCQ) of a command, or `None` for GOOD.
async fn sense_of(s: &Session, cdb: &[u8], dir: DataDir) -> Option<(u8, u8, u8)> {
    let r = cmd(s, cdb, dir).await;
    r.sense.map(|x| (x.key, x.asc, x.ascq))
}

/// REQUEST SENSE: (key, ASC, ASCQ) of a pending unit attention (taken), or NO SENSE. (The
/// initiator's `command` repeats a command that met a unit attention, so that is how a
/// test sees one.)
async fn request_sense(s: &Session) -> (u8, u8, u8) {
    let r = cmd(s, &[0x03, 0, 0, 0, 252, 0], DataDir::Read(252)).await;
    let d = &r.data;
    assert!(d.len() >= 14, "short sense data {d:?}");
    (d[2] & 0x0f, d[12], d[13])
}

async fn drain(s: &Session) {
    for _ in 0..16 {
        if sense_of(s, &TUR, DataDir::None).await.is_none() {
            return;
        }
    }
    panic!("TEST UNIT READY keeps failing");
}

/// Group `g`'s state as `s` reports it.
async fn state_of(s: &Session, g: u16) -> u8 {
    let r = rtpg(s).await;
    r.groups.iter().find(|x| x.0 == g).expect("group listed").1
}

/// Polls until `s` reports group `g` in `want` (or `limit` passes); the time it took.
async fn until_state(s: &Session, g: u16, want: u8, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        if state_of(s, g).await == want {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < limit,
            "group {g} not in state {want:x} after {limit:?}: {:?}",
            rtpg(s).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SET TARGET PORT GROUPS with (state, group) descriptors.
fn stpg(states: &[(u8, u16)]) -> (Vec<u8>, Vec<u8>) {
    let mut list = vec![0u8; 4];
    for (s, g) in states {
        list.extend_from_slice(&[*s, 0]);
        list.extend_from_slice(&g.to_be_bytes());
    }
    let mut cdb = vec![0xa4, 0x0a, 0, 0, 0, 0];
    cdb.extend_from_slice(&(list.len() as u32).to_be_bytes());
    cdb.extend_from_slice(&[0, 0]);
    (cdb, list)
}

const AO: u8 = 0;
const ANO: u8 = 1;
const STANDBY: u8 = 2;
const UNAVAILABLE: u8 = 3;
const TRANSITIONING: u8 = 0xf;

#[test]
fn gateway_group_alua_follows_health_and_set_target_port_groups() {
    if !have_ceph() || !have("iscsi-test-cu") {
        return;
    }
    let cluster = Cluster::start(false);
    cluster.create("alua", "64M");
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let luns = lun(0, &cluster.spec("alua"), "");
    let a = Target::gateway(da.path(), 1, &[2], &luns, false);
    let mut b = Target::gateway(db.path(), 2, &[1], &luns, false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = initiator::SessionOptions::default();
    let connect = |t: &Target| {
        let url = initiator::IscsiUrl::parse(&t.url(0, 0)).unwrap();
        rt.block_on(Session::connect(&url, &opts)).expect("login")
    };
    let (sa, sb) = (connect(&a), connect(&b));
    // A second nexus on A that only listens: the polls of `sa` take its unit attentions.
    let sa2 = connect(&a);
    rt.block_on(async {
        // Each gateway sees the other's heartbeat move within a beat or two.
        for s in [&sa, &sb] {
            for g in [1, 2] {
                until_state(s, g, AO, Duration::from_secs(20)).await;
            }
            drain(s).await;
        }
        drain(&sa2).await;

        // Both say implicit and explicit ALUA, and report the same groups.
        let mut reports = Vec::new();
        for s in [&sa, &sb] {
            let inq = cmd(s, &[0x12, 0, 0, 0, 96, 0], DataDir::Read(96)).await;
            assert_eq!(inq.data[5] & 0x30, 0x30, "TPGS: implicit and explicit ALUA");
            reports.push(rtpg(s).await);
        }
        assert_eq!(reports[0], reports[1], "the gateways disagree");
        assert_eq!(
            reports[0],
            Rtpg {
                transition_time: 6,
                groups: vec![(1, AO, 0x8f, 0), (2, AO, 0x8f, 0)],
            },
            "two active/optimized groups, T/U/S/AN/AO supported"
        );

        // SET TARGET PORT GROUPS through A: B reports it, raises its unit attention and
        // serves as a standby port; A's own nexus has no unit attention.
        let (c, list) = stpg(&[(STANDBY, 2), (ANO, 1)]);
        let r = cmd(&sa, &c, DataDir::Write(list.into())).await;
        assert_eq!(r.status, 0, "SET TARGET PORT GROUPS: {:?}", r.sense);
        let ua = request_sense(&sb).await;
        assert_eq!(
            ua,
            (0x06, 0x2a, 0x06),
            "B's nexus: ASYMMETRIC ACCESS STATE CHANGED; A:\n{}\nB:\n{}",
            a.log(),
            b.log()
        );
        let rb = rtpg(&sb).await;
        assert_eq!(
            rb.groups,
            vec![(1, ANO, 0x8f, 1), (2, STANDBY, 0x8f, 1)],
            "B's report: altered by SET TARGET PORT GROUPS"
        );
        assert_eq!(rtpg(&sa).await, rb, "A's report");
        assert_eq!(
            sense_of(&sb, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], DataDir::Read(512)).await,
            Some((0x02, 0x04, 0x0b)),
            "a READ through the standby port: NOT READY, TARGET PORT IN STANDBY STATE"
        );
        assert_eq!(
            request_sense(&sa).await.0,
            0,
            "the nexus that set the states has no unit attention for it"
        );
        assert_eq!(
            request_sense(&sa2).await,
            (0x06, 0x2a, 0x06),
            "A's other nexus: ASYMMETRIC ACCESS STATE CHANGED"
        );
        let read = cmd(&sa, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], DataDir::Read(512)).await;
        assert_eq!(read.status, 0, "A (active/non-optimized) serves reads");
        // A standby port takes SET TARGET PORT GROUPS: both back to active/optimized.
        let (c, list) = stpg(&[(AO, 2), (AO, 1)]);
        let r = cmd(&sb, &c, DataDir::Write(list.into())).await;
        assert_eq!(
            r.status, 0,
            "SET TARGET PORT GROUPS through B: {:?}",
            r.sense
        );
        assert_eq!(
            request_sense(&sa).await,
            (0x06, 0x2a, 0x06),
            "A's nexus: ASYMMETRIC ACCESS STATE CHANGED"
        );
        assert_eq!(state_of(&sa, 2).await, AO);
        drain(&sb).await;
        // A bad list: a group that does not exist, transitioning; nothing changes.
        for bad in [stpg(&[(AO, 9)]), stpg(&[(TRANSITIONING, 1)])] {
            let r = cmd(&sa, &bad.0, DataDir::Write(bad.1.into())).await;
            let s = r.sense.expect("refused");
            assert_eq!(
                (s.key, s.asc),
                (0x05, 0x26),
                "INVALID FIELD IN PARAMETER LIST"
            );
        }
    });

    // libiscsi's multipath family, one path through each gateway. (Before the SIGKILL below:
    // for ~30 s after it the dead gateway's watch lingers in the OSD, a LUN reset's
    // announcement waits 5 s for it, and MultipathIO.Reset then finds no unit attention.)
    let out = libiscsi_suite(
        &[
            "-d",
            "-S",
            "-t",
            "ALL.MultipathIO",
            &a.url(0, 0),
            &b.url(0, 0),
        ],
        Duration::from_secs(300),
        &da.path().join("suite.txt"),
    );
    let (failed, ran, skipped) = failures(&out);
    println!("iscsi-test-cu ALL.MultipathIO through A and B: {ran} tests, failed {failed:?}, {skipped} skip notes");
    assert!(ran >= 4, "too few tests ran:\n{out}");
    assert!(failed.is_empty(), "failures: {failed:?}\n{out}");

    rt.block_on(async {
        drain(&sa).await;
        drain(&sa2).await;
    });
    // SIGKILL of B: A reports B's group transitioning, then unavailable.
    let killed = Instant::now();
    b.kill();
    drop(sb);
    let (to_transitioning, to_unavailable) = rt.block_on(async {
        let t = until_state(&sa, 2, TRANSITIONING, Duration::from_secs(30)).await;
        let u = until_state(&sa, 2, UNAVAILABLE, Duration::from_secs(30)).await;
        (t, t + u)
    });
    let detect = killed.elapsed();
    println!(
        "gateway B SIGKILLed: A reports its group transitioning after {:.1} s, unavailable \
         after {:.1} s (bound: lease 6 s + beat 1 s + a read)",
        to_transitioning.as_secs_f32(),
        to_unavailable.as_secs_f32()
    );
    assert!(detect < Duration::from_secs(30));
    rt.block_on(async {
        assert_eq!(
            request_sense(&sa2).await,
            (0x06, 0x2a, 0x06),
            "A's other nexus hears of the implicit change"
        );
        let r = rtpg(&sa).await;
        assert_eq!(r.groups[1], (2, UNAVAILABLE, 0x8f, 2), "altered implicitly");
        assert_eq!(r.groups[0].1, AO, "A itself stays active");
        drain(&sa).await;
    });

    // B back: active again in A's answer.
    let restarted = Instant::now();
    let b = Target::gateway(db.path(), 2, &[1], &luns, false);
    let back = rt.block_on(until_state(&sa, 2, AO, Duration::from_secs(30)));
    println!(
        "gateway B restarted: A reports its group active/optimized {:.1} s after the start \
         ({:.1} s after B's process was ready)",
        restarted.elapsed().as_secs_f32(),
        back.as_secs_f32()
    );
    let sb = connect(&b);
    rt.block_on(async {
        until_state(&sb, 1, AO, Duration::from_secs(20)).await;
        until_state(&sb, 2, AO, Duration::from_secs(20)).await;
        drain(&sa).await;
        drain(&sb).await;
    });
    drop(sb);

    // The cluster goes away: A turns transitioning, then unavailable, in its own eyes,
    // and answers NOT READY with the ALUA sense rather than hanging or serving.
    rt.block_on(drain(&sa));
    cluster.script("kill-osd");
    let lost = Instant::now();
    let sense = rt.block_on(async {
        loop {
            let s = sense_of(&sa, &TUR, DataDir::None).await;
            match s {
                Some((0x02, 0x04, 0x0a | 0x0c)) => return s.unwrap(),
                // The unit attention of the change comes first.
                None | Some((0x06, 0x2a, 0x06)) => {}
                other => panic!("unexpected answer {other:x?}"),
            }
            assert!(lost.elapsed() < Duration::from_secs(30), "still serving");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    println!(
        "OSD killed: A answers NOT READY {:02x}/{:02x} after {:.1} s",
        sense.1,
        sense.2,
        lost.elapsed().as_secs_f32()
    );
    rt.block_on(async {
        let t = Instant::now();
        let read = sense_of(&sa, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], DataDir::Read(512)).await;
        assert!(
            matches!(
                read,
                Some((0x02, 0x04, 0x0a | 0x0c)) | Some((0x06, 0x2a, 0x06))
            ),
            "a READ: {read:x?}"
        );
        println!(
            "a READ through A with its cluster gone: answered in {:.2} s",
            t.elapsed().as_secs_f32()
        );
        let r = rtpg(&sa).await;
        assert!(
            matches!(r.groups[0].1, TRANSITIONING | UNAVAILABLE),
            "A's own group: {r:?}"
        );
    });
    drop(sa);
    drop(a);
}
