//! Reads whose data the store lends rather than copies (`LogicalUnit::try_read_lent`).

mod support;

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
    let writer = support::HeldWrite::start(&lu);
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
    writer.finishes();
    let after = cmd(&rw10(0x28, 20, 8), &[]);
    assert_eq!(after.data_in, vec![7; 8 * 512]);
}

/// A thin LU on `store`, its power-on unit attention consumed.
fn shm_lu(store: Arc<dyn Backstore>) -> LogicalUnit {
    let lu = LogicalUnit::new(LuConfig::default(), store);
    let tur = [0u8; 6];
    let r = lu.execute(&Command {
        cdb: &tur,
        data_out: &[],
        nexus: Nexus(1),
    });
    assert_eq!(r.status, 0x02, "power-on unit attention first");
    lu
}

/// A directory in /dev/shm (tmpfs), `None` where there is none.
fn shm_dir() -> Option<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    let dir = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
    if dir.is_none() {
        eprintln!("no /dev/shm: not run");
    }
    dir
}

/// GET LBA STATUS from LBA 0 as (blocks, provisioning status) per descriptor.
fn lba_status(lu: &LogicalUnit) -> Vec<(u32, u8)> {
    let mut cdb = vec![0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    cdb[2..10].copy_from_slice(&0u64.to_be_bytes());
    let r = lu.execute(&Command {
        cdb: &cdb,
        data_out: &[],
        nexus: Nexus(1),
    });
    assert_eq!(r.status, 0, "GET LBA STATUS: {r:?}");
    r.data_in[8..]
        .chunks(16)
        .map(|d| {
            (
                u32::from_be_bytes(d[8..12].try_into().unwrap()),
                d[12] & 0x0f,
            )
        })
        .collect()
}

/// A READ of `blocks` at `lba`, lent where the LU lends it, its bytes read as a socket
/// would send them.
fn read_lent(lu: &LogicalUnit, lba: u32, blocks: u16) -> Vec<u8> {
    let cdb = rw10(0x28, lba, blocks);
    let cmd = Command {
        cdb: &cdb,
        data_out: &[],
        nexus: Nexus(1),
    };
    match lu.try_read_lent(&cmd, u64::MAX, true) {
        Some(lent) => lent.as_ref().to_vec(),
        None => lu.execute(&cmd).data_in.to_vec(),
    }
}

/// libiscsi's SANITIZE BLOCK ERASE test on a LUN in /dev/shm: blocks written, erased,
/// read (lent: 128 KiB), then GET LBA STATUS must find no block mapped. Reading tmpfs
/// holes through the file's mapping allocated them, and the erased blocks that were read
/// came back MAPPED.
#[test]
fn reads_after_a_block_erase_on_tmpfs_leave_the_blocks_deallocated() {
    let Some(dir) = shm_dir() else { return };
    let store = FileBackstore::open(dir.path().join("lun.img"), Some(SIZE), true, false).unwrap();
    let lu = shm_lu(Arc::new(store));
    let last = (SIZE / 512) as u32 - 256;
    for lba in [0, last] {
        let w = lu.execute(&Command {
            cdb: &rw10(0x2a, lba, 256),
            data_out: &[b'a'; 256 * 512],
            nexus: Nexus(1),
        });
        assert_eq!(w.status, 0);
    }
    let erase = [0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0];
    let r = lu.execute(&Command {
        cdb: &erase,
        data_out: &[],
        nexus: Nexus(1),
    });
    assert_eq!(r.status, 0, "SANITIZE BLOCK ERASE: {r:?}");
    for (lba, blocks) in [(0, 256), (last, 256), (0, 1)] {
        let data = read_lent(&lu, lba, blocks);
        assert!(data.iter().all(|&b| b == 0), "blocks {lba}+{blocks} erased");
    }
    assert_eq!(
        lba_status(&lu),
        vec![((SIZE / 512) as u32, 1)],
        "all deallocated"
    );
}

/// A file store on tmpfs with an UNMAP of the blocks slipped in right after each lend, as
/// a concurrent command could: the UNMAP must wait for the lent read (whose lock is taken
/// before the store looks at the blocks) or the read's bytes fault freed pages back in.
#[derive(Debug)]
struct UnmapAfterLend {
    inner: FileBackstore,
    lu: std::sync::OnceLock<std::sync::Weak<LogicalUnit>>,
    unmaps: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Backstore for UnmapAfterLend {
    backstore::forward! { inner =>
        size, read_at, write_at, flush, discard, write_zeroes, is_allocated,
    }
    fn supports_discard(&self) -> bool {
        true
    }
    fn can_lend(&self) -> bool {
        true
    }
    fn lend(&self, offset: u64, len: u64, wait: bool) -> std::io::Result<Option<backstore::Lent>> {
        let lent = self.inner.lend(offset, len, wait)?;
        let lu = self.lu.get().and_then(|w| w.upgrade()).unwrap();
        let (lba, blocks) = (offset / 512, (len / 512) as u32);
        let (tx, rx) = mpsc::channel();
        self.unmaps
            .lock()
            .unwrap()
            .push(std::thread::spawn(move || {
                let mut list = vec![0u8; 24];
                list[0..2].copy_from_slice(&22u16.to_be_bytes());
                list[2..4].copy_from_slice(&16u16.to_be_bytes());
                list[8..16].copy_from_slice(&lba.to_be_bytes());
                list[16..20].copy_from_slice(&blocks.to_be_bytes());
                let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
                let r = lu.execute(&Command {
                    cdb: &cdb,
                    data_out: &list,
                    nexus: Nexus(1),
                });
                assert_eq!(r.status, 0, "UNMAP: {r:?}");
                let _ = tx.send(());
            }));
        // Long enough for an UNMAP that nothing holds back to be done.
        let _ = rx.recv_timeout(Duration::from_millis(300));
        Ok(lent)
    }
}

#[test]
fn an_unmap_racing_a_lent_read_on_tmpfs_leaves_the_blocks_deallocated() {
    let Some(dir) = shm_dir() else { return };
    let inner = FileBackstore::open(dir.path().join("lun.img"), Some(SIZE), true, false).unwrap();
    let store = Arc::new(UnmapAfterLend {
        inner,
        lu: Default::default(),
        unmaps: Default::default(),
    });
    let lu = Arc::new(shm_lu(store.clone()));
    store.lu.set(Arc::downgrade(&lu)).unwrap();
    let w = lu.execute(&Command {
        cdb: &rw10(0x2a, 0, 256),
        data_out: &[b'a'; 256 * 512],
        nexus: Nexus(1),
    });
    assert_eq!(w.status, 0);
    // Either may come first (the read then shows the data or zeros); the UNMAP must be the
    // last to touch the blocks' pages.
    read_lent(&lu, 0, 256);
    for t in std::mem::take(&mut *store.unmaps.lock().unwrap()) {
        t.join().unwrap();
    }
    assert_eq!(
        lba_status(&lu),
        vec![((SIZE / 512) as u32, 1)],
        "all deallocated"
    );
}
