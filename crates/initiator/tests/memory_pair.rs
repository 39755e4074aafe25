//! Whole sessions between the real initiator and the real target in one process, over the
//! in-memory carrier (`net::transport::memory_pair`): no sockets, no ports, and a switch
//! that cuts a connection exactly when the test says. Login, reads and writes (the writes
//! by R2T alone, in many bursts), several connections, and a connection lost mid-transfer
//! at ERL 2, recovered by task reassignment.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use initiator::{IscsiUrl, Session, SessionOptions};
use net::transport::{memory_pair, Cut, Dialer};
use testkit::inproc;

const IQN: &str = "iqn.2026-11.org.reservoir:memory";
const BLOCK: usize = 512;

/// A target served in memory: every connection the dialer opens is a new in-memory pair,
/// whose far end the target serves; `cuts[i]` cuts the i-th connection opened.
struct Pair {
    url: IscsiUrl,
    dialer: Dialer,
    cuts: Arc<Mutex<Vec<Cut>>>,
    _target: targetd::Running,
}

async fn pair(lun_mib: u64) -> Pair {
    let target = inproc::spawn(&inproc::one_lun(
        "",
        IQN,
        &inproc::ram(&format!("{lun_mib}MiB")),
    ))
    .await;
    let connector = target.connector();
    let cuts = Arc::new(Mutex::new(Vec::new()));
    let dialer = {
        let cuts = cuts.clone();
        Dialer::new(move |portal: String| {
            let connector = connector.clone();
            let cuts = cuts.clone();
            async move {
                let initiator: SocketAddr = "127.0.0.1:40000".parse().unwrap();
                let target: SocketAddr = portal.parse().unwrap();
                let (near, far, cut) = memory_pair(initiator, target, 256 << 10);
                cuts.lock().unwrap().push(cut);
                connector.serve(far);
                Ok(near)
            }
        })
    };
    Pair {
        url: IscsiUrl::parse(&format!("iscsi://127.0.0.1:3260/{IQN}/0")).unwrap(),
        dialer,
        cuts,
        _target: target,
    }
}

impl Pair {
    fn options(&self, connections: u16) -> SessionOptions {
        SessionOptions {
            connections,
            auto_tune: false,
            dialer: Some(self.dialer.clone()),
            ..SessionOptions::default()
        }
    }
}

/// Deterministic contents for `len` bytes at byte `offset` of the LUN, by block.
/// One MiB: what each write and read of these tests moves.
const MIB: usize = 1 << 20;

/// `count` writes of a MiB each, the i-th of `pattern(i MiB, 1 MiB, seed)` at MiB i, all in
/// flight at once.
fn write_mibs(s: &Session, count: u64, seed: u8) -> tokio::task::JoinSet<initiator::Result<()>> {
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..count {
        let s = s.clone();
        writes.spawn(async move {
            let off = i * MIB as u64;
            s.write(0, off / BLOCK as u64, pattern(off, MIB, seed))
                .await
        });
    }
    writes
}

/// Reads back the first `count` MiB, each of which must hold what [`write_mibs`] wrote
/// with `seed`; `when` says when, in the failure.
async fn check_mibs(s: &Session, count: u64, seed: u8, when: &str) {
    for i in 0..count {
        let off = i * MIB as u64;
        let got = s
            .read(0, off / BLOCK as u64, (MIB / BLOCK) as u32)
            .await
            .unwrap();
        assert!(
            got == pattern(off, MIB, seed),
            "MiB {i} read back differs{when}"
        );
    }
}

fn pattern(offset: u64, len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| {
            let at = offset + i as u64;
            ((at / BLOCK as u64) as u8) ^ (at as u8).rotate_left(3) ^ seed
        })
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_reads_and_writes_by_r2t_over_two_connections() {
    let p = pair(16).await;
    // Writes by R2T alone: no immediate or unsolicited data, 64 KiB per burst.
    let opts = SessionOptions {
        initial_r2t: true,
        immediate_data: false,
        max_burst: 64 << 10,
        first_burst: 64 << 10,
        ..p.options(2)
    };
    let s = Session::connect(&p.url, &opts).await.unwrap();
    let info = s.info();
    assert_eq!(info.connections, 2);
    assert!(info.initial_r2t && !info.immediate_data);
    assert_eq!(info.max_burst_length, 64 << 10);
    assert_eq!(s.read_capacity(0).await.unwrap().block_size as usize, BLOCK);

    let mut writes = write_mibs(&s, 8, 1);
    while let Some(r) = writes.join_next().await {
        r.unwrap().unwrap();
    }
    check_mibs(&s, 8, 1, "").await;
    assert_eq!(
        p.cuts.lock().unwrap().len(),
        2,
        "one in-memory pair per connection"
    );
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_transfer_is_recovered_by_task_reassignment() {
    let p = pair(64).await;
    let opts = SessionOptions {
        error_recovery_level: 2,
        queue_depth: 32,
        max_burst: 64 << 10,
        first_burst: 64 << 10,
        ..p.options(2)
    };
    let s = Session::connect(&p.url, &opts).await.unwrap();
    assert_eq!(s.info().error_recovery_level, 2);

    let count = 48u64;
    let mut writes = write_mibs(&s, count, 7);
    // Once one write is done the queue still holds dozens, on both connections: the cut
    // catches some of them half sent.
    writes.join_next().await.unwrap().unwrap().unwrap();
    p.cuts.lock().unwrap()[0].cut();
    while let Some(r) = writes.join_next().await {
        r.unwrap().unwrap();
    }
    assert!(s.reassigned_tasks() > 0, "no task was reassigned");
    check_mibs(&s, count, 7, " after the cut").await;
    // The cut connection's CID logs in again in the background, through the dialer.
    for _ in 0..100 {
        if s.reconnections() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(s.reconnections() > 0, "the cut connection never came back");
    assert!(p.cuts.lock().unwrap().len() >= 3);
    s.logout().await.unwrap();
}
