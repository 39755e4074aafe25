//! Reservations through the logical unit: persistent (PERSISTENT RESERVE OUT/IN between two
//! nexuses), RESERVE/RELEASE(6) and nexus loss, APTPL across a restart.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{LogicalUnit, LuConfig, Nexus, Response};

use support::*;

const A: Nexus = Nexus(11);
const B: Nexus = Nexus(12);

/// A LU with two named nexuses whose power-on unit attentions are consumed.
fn two_nexus_lu(config: LuConfig) -> LogicalUnit {
    let lu = lu_with(config);
    lu.name_nexus(A, "iqn.2000-01.x:a,i,0x000000000001");
    lu.name_nexus(B, "iqn.2000-01.x:b,i,0x000000000001");
    for n in [A, B] {
        assert_sense(&exec_on(&lu, n, &[0; 6], &[]), 0x06, 0x29, 0x00);
    }
    lu
}

fn prout(sa: u8, kind: u8, key: u64, sa_key: u64, flags: u8) -> (Vec<u8>, Vec<u8>) {
    let mut cdb = vec![0x5f, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    cdb[1] = sa;
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    (cdb, p)
}

fn pr_out(lu: &LogicalUnit, n: Nexus, sa: u8, kind: u8, key: u64, sa_key: u64) -> Response {
    let (cdb, p) = prout(sa, kind, key, sa_key, 0);
    exec_on(lu, n, &cdb, &p)
}

#[test]
fn persistent_reservations_through_the_lu() {
    let lu = two_nexus_lu(LuConfig::default());
    // The parameter list must be 24 bytes.
    let (mut cdb, p) = prout(0, 0, 0, 1, 0);
    cdb[8] = 20;
    assert_sense(&exec_on(&lu, A, &cdb, &p[..20]), 0x05, 0x1a, 0x00);
    good(&pr_out(&lu, A, 0, 0, 0, 0xaa));
    good(&pr_out(&lu, B, 6, 0, 0, 0xbb));
    // Registered with another key: conflict, no sense.
    let r = pr_out(&lu, B, 0, 0, 0x99, 0xcc);
    assert_eq!((r.status, r.sense.is_none()), (0x18, true));
    good(&pr_out(&lu, A, 1, 3, 0xaa, 0)); // EXCLUSIVE ACCESS
    assert_eq!(exec_on(&lu, B, &read10(0, 1), &[]).status, 0x18);
    good(&exec_on(&lu, A, &read10(0, 1), &[]));
    // INQUIRY and PERSISTENT RESERVE IN are never blocked.
    good(&exec_on(&lu, B, &[0x12, 0, 0, 0, 36, 0], &[]));
    let rk = good(&exec_on(&lu, B, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 64, 0], &[])).to_vec();
    assert_eq!(u32::from_be_bytes(rk[4..8].try_into().unwrap()), 16);
    // B preempts A: A gets REGISTRATIONS PREEMPTED once, then B holds the LU.
    good(&pr_out(&lu, B, 4, 1, 0xbb, 0xaa));
    assert_sense(&exec_on(&lu, A, &[0; 6], &[]), 0x06, 0x2a, 0x05);
    assert_eq!(exec_on(&lu, A, &write10(0, 1), &fill(1, 1)).status, 0x18);
    good(&exec_on(&lu, A, &read10(0, 1), &[])); // WRITE EXCLUSIVE lets reads through
                                                // CLEAR by B.
    good(&pr_out(&lu, B, 3, 0, 0xbb, 0));
    good(&exec_on(&lu, A, &write10(0, 1), &fill(1, 1)));
}

#[test]
fn reserve_release_6_and_nexus_loss() {
    let lu = two_nexus_lu(LuConfig::default());
    good(&exec_on(&lu, A, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(exec_on(&lu, B, &[0x16, 0, 0, 0, 0, 0], &[]).status, 0x18);
    assert_eq!(
        exec_on(&lu, B, &[0x1a, 0, 0x3f, 0, 255, 0], &[]).status,
        0x18
    );
    good(&exec_on(&lu, B, &[0x17, 0, 0, 0, 0, 0], &[]));
    lu.nexus_lost(A);
    good(&exec_on(&lu, B, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    lu.reset();
    assert_sense(&exec_on(&lu, A, &[0; 6], &[]), 0x06, 0x29, 0x00);
    good(&exec_on(&lu, A, &write10(0, 1), &fill(1, 1)));
}

#[test]
fn aptpl_survives_a_restart() {
    let dir = tempfile_dir();
    let config = LuConfig {
        pr_file: Some(dir.join("lun0.pr")),
        ..LuConfig::default()
    };
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(BLOCKS * BS as u64));
    {
        let lu = LogicalUnit::new(config.clone(), store.clone());
        lu.name_nexus(A, "iqn.2000-01.x:a,i,0x000000000001");
        exec_on(&lu, A, &[0; 6], &[]);
        let (cdb, p) = prout(0, 0, 0, 0x77, 0x01);
        good(&exec_on(&lu, A, &cdb, &p));
        good(&pr_out(&lu, A, 1, 1, 0x77, 0));
        // REPORT CAPABILITIES: PTPL_C and PTPL_A.
        let caps = good(&exec_on(&lu, A, &[0x5e, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[])).to_vec();
        assert_eq!((caps[2] & 1, caps[3] & 1), (1, 1));
    }
    let lu = LogicalUnit::new(config.clone(), store.clone());
    lu.name_nexus(Nexus(40), "iqn.2000-01.x:a,i,0x000000000001");
    lu.name_nexus(Nexus(41), "iqn.2000-01.x:b,i,0x000000000001");
    for n in [Nexus(40), Nexus(41)] {
        exec_on(&lu, n, &[0; 6], &[]);
    }
    assert_eq!(
        exec_on(&lu, Nexus(41), &write10(0, 1), &fill(1, 1)).status,
        0x18
    );
    good(&exec_on(&lu, Nexus(40), &write10(0, 1), &fill(1, 1)));
    // Unregistering without APTPL removes the file.
    good(&pr_out(&lu, Nexus(40), 0, 0, 0x77, 0));
    assert!(!dir.join("lun0.pr").exists());
    std::fs::remove_dir_all(&dir).unwrap();
    // Without a place to keep them, APTPL is refused.
    let lu = two_nexus_lu(LuConfig::default());
    let (cdb, p) = prout(0, 0, 0, 0x77, 0x01);
    assert_sense(&exec_on(&lu, A, &cdb, &p), 0x05, 0x26, 0x00);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "scsi-pr-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
