//! Reads whose data the store lends rather than copies (`LogicalUnit::try_read_lent`).

use std::sync::{mpsc, Arc};
use std::time::Duration;

use backstore::{Backstore, FileBackstore, RamBackstore};
use proptest::prelude::*;
use scsi::{Command, LogicalUnit, LuConfig, Nexus, Response};

const SIZE: u64 = 1 << 20;

fn file_lu(dir: &tempfile::TempDir) -> LogicalUnit {
    let store = FileBackstore::open(dir.path().join("lun.img"), Some(SIZE), true, false).unwrap();
    LogicalUnit::new(LuConfig::default(), Arc::new(store))
}

fn ram_lu() -> LogicalUnit {
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(SIZE));
    LogicalUnit::new(LuConfig::default(), store)
}

fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A transport that asks for lent reads first (waiting or not), then for a copied one,
    /// then executes, sees exactly what one that only executes sees: the same data, the same
    /// unit attentions and errors, command for command.
    #[test]
    fn lent_reads_answer_as_execute_would(
        cmds in prop::collection::vec((
            prop::sample::select(&[0x28u8, 0x28, 0x2a, 0x00, 0x35][..]),
            0u32..2040, 1u16..16, any::<u8>(), 0u64..3, any::<bool>()), 1..16),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let fast = file_lu(&dir);
        let plain = ram_lu();
        // The ram store lends too (its chunks, zeros where never written).
        let ram_fast = ram_lu();
        for (op, lba, blocks, fill, nexus, wait) in cmds {
            let cdb = match op {
                0x28 | 0x2a => rw10(op, lba, blocks),
                0x35 => vec![0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                _ => vec![0; 6],
            };
            let data_out = vec![fill; if op == 0x2a { blocks as usize * 512 } else { 0 }];
            let cmd = Command { cdb: &cdb, data_out: &data_out, nexus: Nexus(nexus) };
            let a = if let Some(lent) = fast.try_read_lent(&cmd, u64::MAX, wait) {
                Response::good(lent.as_ref().to_vec())
            } else {
                fast.try_read_now(&cmd, u64::MAX).unwrap_or_else(|| fast.execute(&cmd))
            };
            let c = if let Some(lent) = ram_fast.try_read_lent(&cmd, u64::MAX, wait) {
                Response::good(lent.as_ref().to_vec())
            } else {
                ram_fast.try_read_now(&cmd, u64::MAX).unwrap_or_else(|| ram_fast.execute(&cmd))
            };
            let b = plain.execute(&cmd);
            prop_assert_eq!(&a, &b, "cdb {:02x?}", cdb);
            prop_assert_eq!(c, b, "ram, cdb {:02x?}", cdb);
        }
    }
}

/// A write to blocks a lent read still holds waits until the read's bytes are dropped
/// (sent), so the read never shows it half done; writes elsewhere go at once.
#[test]
fn a_write_waits_for_the_lent_read_of_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let lu = Arc::new(file_lu(&dir));
    let n = Nexus(1);
    let read = rw10(0x28, 8, 16);
    let cmd = |cdb: &[u8], data: &[u8]| -> Response {
        lu.execute(&Command {
            cdb,
            data_out: data,
            nexus: n,
        })
    };
    assert_eq!(
        cmd(&read, &[]).status,
        0x02,
        "power-on unit attention first"
    );
    let lent = lu
        .try_read_lent(
            &Command {
                cdb: &read,
                data_out: &[],
                nexus: n,
            },
            u64::MAX,
            true,
        )
        .expect("blocks are lent");
    assert!(lent.as_ref().iter().all(|&b| b == 0));
    assert_eq!(
        cmd(&rw10(0x2a, 0, 8), &[1; 8 * 512]).status,
        0,
        "blocks 0..8 are free"
    );
    let (tx, rx) = mpsc::channel();
    let writer = {
        let lu = lu.clone();
        std::thread::spawn(move || {
            let r = lu.execute(&Command {
                cdb: &rw10(0x2a, 20, 8),
                data_out: &[7; 8 * 512],
                nexus: Nexus(1),
            });
            tx.send(r.status).unwrap();
        })
    };
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the overlapping write waited"
    );
    assert!(
        lent.as_ref().iter().all(|&b| b == 0),
        "the lent bytes did not change"
    );
    // A waiting write holds off new reads of its blocks, copied or lent, without waiting.
    let overlapping = rw10(0x28, 24, 1);
    let c = Command {
        cdb: &overlapping,
        data_out: &[],
        nexus: n,
    };
    assert!(lu.try_read_now(&c, u64::MAX).is_none());
    assert!(lu.try_read_lent(&c, u64::MAX, false).is_none());
    drop(lent);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(0));
    writer.join().unwrap();
    let after = cmd(&rw10(0x28, 20, 8), &[]);
    assert_eq!(after.data_in, vec![7; 8 * 512]);
}
