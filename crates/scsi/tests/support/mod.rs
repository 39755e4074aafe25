//! What the command tests share: a logical unit over a RAM store with its power-on unit
//! attention consumed, commands executed on a nexus, answers checked, CDBs built.
#![allow(dead_code)]

use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use backstore::{Backstore, RamBackstore};
use scsi::{Command, LogicalUnit, LuConfig, Nexus, Response};

pub const BS: usize = 512;
pub const BLOCKS: u64 = 4096;
pub const N: Nexus = Nexus(1);

pub fn lu_with(config: LuConfig) -> LogicalUnit {
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(BLOCKS * config.block_size as u64));
    let lu = LogicalUnit::new(config, store);
    // Consume the power-on unit attention of the default nexus.
    let r = exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&r, 0x06, 0x29, 0x00);
    lu
}

pub fn lu() -> LogicalUnit {
    lu_with(LuConfig::default())
}

pub fn exec(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Response {
    exec_on(lu, N, cdb, data_out)
}

pub fn exec_on(lu: &LogicalUnit, nexus: Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
    lu.execute(&Command {
        cdb,
        data_out,
        nexus,
    })
}

#[track_caller]
pub fn good(r: &Response) -> &[u8] {
    assert_eq!(r.status, 0, "sense {:02x?}", r.sense);
    &r.data_in
}

#[track_caller]
pub fn assert_sense(r: &Response, key: u8, asc: u8, ascq: u8) {
    assert_eq!(r.status, 0x02);
    let s = r.sense.as_ref().expect("sense with CHECK CONDITION");
    assert_eq!(s[0] & 0x7f, 0x70);
    assert_eq!(
        (s[2] & 0x0f, s[12], s[13]),
        (key, asc, ascq),
        "sense {s:02x?}"
    );
}

#[track_caller]
pub fn assert_invalid_cdb(r: &Response, byte: u16) {
    assert_sense(r, 0x05, 0x24, 0x00);
    let s = r.sense.as_ref().unwrap();
    assert_eq!(s[15] & 0xc0, 0xc0, "SKSV and C/D");
    assert_eq!(u16::from_be_bytes([s[16], s[17]]), byte);
}

pub fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

pub fn cdb16(op: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn cdb12(op: u8, lba: u32, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 12];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn fill(byte: u8, blocks: usize) -> Vec<u8> {
    vec![byte; blocks * BS]
}

/// A RAM store whose erases wait until the test lets them go.
#[derive(Debug)]
pub struct GatedStore {
    ram: RamBackstore,
    started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Backstore for GatedStore {
    backstore::forward! { ram =>
        size, read_at, write_at, flush, write_zeroes, is_allocated, supports_discard,
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.started.lock().unwrap().send(()).unwrap();
        self.go.lock().unwrap().recv().unwrap();
        self.ram.discard(offset, len)
    }
}

/// A logical unit whose erases wait: the receiver tells an erase started, the sender lets
/// it go on.
pub fn gated_lu(
    config: LuConfig,
) -> (
    Arc<LogicalUnit>,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let store = GatedStore {
        ram: RamBackstore::new(BLOCKS * BS as u64),
        started: std::sync::Mutex::new(started_tx),
        go: std::sync::Mutex::new(go_rx),
    };
    let lu = Arc::new(LogicalUnit::new(config, Arc::new(store)));
    (lu, started, go)
}

pub fn unmap_list(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut p = vec![0u8; 8];
    for &(lba, n) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    let len = p.len();
    p[0..2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    p[2..4].copy_from_slice(&((len - 8) as u16).to_be_bytes());
    p
}

pub fn unmap_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    c
}

/// A RAM store whose reads go through `read` (to slow them down, or to fail them); the
/// rest is the RAM store's.
#[derive(Debug)]
pub struct ReadsThrough {
    pub ram: RamBackstore,
    pub read: fn(&RamBackstore, &mut [u8], u64) -> std::io::Result<()>,
}

impl Backstore for ReadsThrough {
    backstore::forward! { ram =>
        size, write_at, flush, discard, write_zeroes, is_allocated, supports_discard,
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        (self.read)(&self.ram, buf, offset)
    }
}

/// A WRITE(10) of blocks 20..28 from nexus 1 on another thread, for the tests of what
/// holds a write back (blocks a read still holds).
pub struct HeldWrite {
    status: mpsc::Receiver<u8>,
    thread: JoinHandle<()>,
}

impl HeldWrite {
    /// Starts the write and checks that it waits.
    #[track_caller]
    pub fn start(lu: &Arc<LogicalUnit>) -> HeldWrite {
        let (tx, status) = mpsc::channel();
        let lu = lu.clone();
        let thread = std::thread::spawn(move || {
            let r = lu.execute(&Command {
                cdb: &write10(20, 8),
                data_out: &[7; 8 * 512],
                nexus: Nexus(1),
            });
            tx.send(r.status).unwrap();
        });
        assert!(
            status.recv_timeout(Duration::from_millis(300)).is_err(),
            "the overlapping write waited"
        );
        HeldWrite { status, thread }
    }

    /// Checks that, let go, the write ends with GOOD.
    #[track_caller]
    pub fn finishes(self) {
        assert_eq!(self.status.recv_timeout(Duration::from_secs(10)), Ok(0));
        self.thread.join().unwrap();
    }
}
