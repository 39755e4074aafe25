//! Reads started on a store that completes them on a thread of its own
//! (`LogicalUnit::try_read_async`, `Backstore::read_async`): the same answers as
//! `execute`, blocks held against writes until the store is done, store errors as CHECK
//! CONDITION, and nothing at all for stores whose reads block.

mod support;

use std::io;
use std::sync::{mpsc, Arc, Mutex};

use backstore::buffers::Buf;
use backstore::{Backstore, FlushDone, RamBackstore, ReadDone, WriteDone};
use proptest::prelude::*;
use scsi::{Command, LogicalUnit, LuConfig, Nexus, Response};

const SIZE: u64 = 1 << 20;

/// What a [`Deferred`] store was asked to do, waiting for the test to complete it.
enum Queued {
    Read(Buf, u64, ReadDone),
    Write(Buf, u64, bool, WriteDone),
    Flush(FlushDone),
}

/// A RAM store whose asynchronous reads, writes and flushes wait in a queue until the test
/// completes them (`complete`), from whichever thread it likes; `fail` makes them fail
/// instead. `durable` records, per write completed, whether it was to be made durable.
struct Deferred {
    ram: RamBackstore,
    queued: Mutex<Vec<Queued>>,
    fail: std::sync::atomic::AtomicBool,
    durable: Mutex<Vec<bool>>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Deferred({} operations queued)",
            self.queued.lock().unwrap().len()
        )
    }
}

impl Deferred {
    fn new() -> Arc<Deferred> {
        Arc::new(Deferred {
            ram: RamBackstore::new(SIZE),
            queued: Mutex::default(),
            fail: Default::default(),
            durable: Mutex::default(),
        })
    }

    /// Completes every operation queued so far; how many.
    fn complete(&self) -> usize {
        let queued: Vec<_> = std::mem::take(&mut *self.queued.lock().unwrap());
        let n = queued.len();
        let fail = || {
            if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
                Err(io::Error::other("the device went away"))
            } else {
                Ok(())
            }
        };
        for q in queued {
            match q {
                Queued::Read(mut buf, offset, done) => {
                    let r = fail().and_then(|()| self.ram.read_at(&mut buf, offset));
                    done(buf, r);
                }
                Queued::Write(buf, offset, durable, done) => {
                    self.durable.lock().unwrap().push(durable);
                    let r = fail().and_then(|()| self.ram.write_at(&buf, offset));
                    done(buf, r);
                }
                Queued::Flush(done) => done(fail()),
            }
        }
        n
    }
}

impl Backstore for Deferred {
    backstore::forward! { ram =>
        size, read_at, write_at, flush, discard, write_zeroes, is_allocated, supports_discard,
    }
    fn reads_async(&self) -> bool {
        true
    }
    fn read_async(&self, buf: Buf, offset: u64, done: ReadDone) {
        self.queued
            .lock()
            .unwrap()
            .push(Queued::Read(buf, offset, done));
    }
    fn writes_async(&self) -> bool {
        true
    }
    fn write_async(&self, buf: Buf, offset: u64, durable: bool, done: WriteDone) {
        self.queued
            .lock()
            .unwrap()
            .push(Queued::Write(buf, offset, durable, done));
    }
    fn flush_async(&self, done: FlushDone) {
        self.queued.lock().unwrap().push(Queued::Flush(done));
    }
}

fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Starts `cmd` asynchronously if the LU takes it that way (a plain READ, WRITE or
/// SYNCHRONIZE CACHE): the receiver of its response.
fn start(lu: &LogicalUnit, cmd: &Command) -> Option<mpsc::Receiver<Response>> {
    let (tx, rx) = mpsc::channel();
    if let Some(read) = lu.try_read_async(cmd, u64::MAX) {
        read.start(move |r| tx.send(r).unwrap());
    } else if let Some(write) = lu.try_write_async(cmd, u64::MAX) {
        let mut data = Buf::take(write.len());
        data.copy_from_slice(cmd.data_out);
        write.start(data, move |r| tx.send(r).unwrap());
    } else {
        let flush = lu.try_flush_async(cmd)?;
        flush.start(move |r| tx.send(r).unwrap());
    }
    Some(rx)
}

/// Only reads start asynchronously: for the tests of reads.
fn start_read(lu: &LogicalUnit, cmd: &Command) -> Option<mpsc::Receiver<Response>> {
    let read = lu.try_read_async(cmd, u64::MAX)?;
    let (tx, rx) = mpsc::channel();
    read.start(move |r| tx.send(r).unwrap());
    Some(rx)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// A transport that starts reads, writes (FUA or not) and flushes asynchronously where
    /// the LU lets it, and executes everything else, sees exactly what one that only
    /// executes sees: the same data, unit attentions and errors, command for command.
    #[test]
    fn async_reads_and_writes_answer_as_execute_would(
        cmds in prop::collection::vec((
            prop::sample::select(&[0x28u8, 0x28, 0x2a, 0x00, 0x35][..]),
            0u32..2040, 0u16..16, any::<u8>(), 0u64..3), 1..16),
    ) {
        let store = Deferred::new();
        let fast = LogicalUnit::new(LuConfig::default(), store.clone());
        let plain = LogicalUnit::new(LuConfig::default(), Arc::new(RamBackstore::new(SIZE)));
        for (op, lba, blocks, fill, nexus) in cmds {
            let cdb = match op {
                0x28 => rw10(op, lba, blocks),
                0x2a => {
                    let mut c = rw10(op, lba, blocks);
                    c[1] = if fill & 1 == 1 { 0x08 } else { 0 };
                    c
                }
                0x35 => vec![0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                _ => vec![0; 6],
            };
            let data_out = vec![fill; if op == 0x2a { blocks as usize * 512 } else { 0 }];
            let cmd = Command { cdb: &cdb, data_out: &data_out, nexus: Nexus(nexus) };
            let a = match start(&fast, &cmd) {
                Some(rx) => {
                    prop_assert!(rx.try_recv().is_err(), "answered before the store was done");
                    prop_assert_eq!(store.complete(), 1);
                    rx.recv().unwrap()
                }
                None => fast.execute(&cmd),
            };
            let b = plain.execute(&cmd);
            prop_assert_eq!(a, b, "cdb {:02x?}", cdb);
        }
    }
}

/// A write to blocks whose asynchronous read is in flight waits until the store has read
/// them, so the read never shows it half done; the store's error is a CHECK CONDITION
/// with MEDIUM ERROR, UNRECOVERED READ ERROR; a store whose reads block is never asked.
#[test]
fn a_write_waits_for_the_async_read_of_its_blocks_and_errors_are_medium_errors() {
    let store = Deferred::new();
    let lu = Arc::new(LogicalUnit::new(LuConfig::default(), store.clone()));
    let n = Nexus(1);
    let exec = |cdb: &[u8], data: &[u8]| -> Response {
        lu.execute(&Command {
            cdb,
            data_out: data,
            nexus: n,
        })
    };
    assert_eq!(
        exec(&rw10(0x00, 0, 0)[..6], &[]).status,
        0x02,
        "power-on unit attention first"
    );
    let read = rw10(0x28, 8, 16);
    let rx = start_read(
        &lu,
        &Command {
            cdb: &read,
            data_out: &[],
            nexus: n,
        },
    )
    .expect("a plain read starts asynchronously");
    let writer = support::HeldWrite::start(&lu);
    // A waiting write holds off new asynchronous reads of its blocks.
    let overlapping = rw10(0x28, 24, 1);
    assert!(start_read(
        &lu,
        &Command {
            cdb: &overlapping,
            data_out: &[],
            nexus: n,
        }
    )
    .is_none());
    // Completed from another thread, as librbd's would be.
    let s = store.clone();
    std::thread::spawn(move || s.complete()).join().unwrap();
    let r = rx.recv().unwrap();
    assert_eq!(
        (r.status, r.data_in),
        (0, vec![0; 16 * 512]),
        "the old bytes"
    );
    writer.finishes();

    store.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    let rx = start_read(
        &lu,
        &Command {
            cdb: &rw10(0x28, 20, 8),
            data_out: &[],
            nexus: n,
        },
    )
    .unwrap();
    assert_eq!(store.complete(), 1);
    let r = rx.recv().unwrap();
    let sense = r.sense.expect("sense data");
    assert_eq!(r.status, 0x02);
    assert_eq!(
        (sense[2] & 0x0f, sense[12], sense[13]),
        (0x03, 0x11, 0x00),
        "MEDIUM ERROR, UNRECOVERED READ ERROR"
    );
    // The blocks were let go: a write to them goes at once.
    assert_eq!(exec(&rw10(0x2a, 20, 8), &[9; 8 * 512]).status, 0);

    let blocking = LogicalUnit::new(LuConfig::default(), Arc::new(RamBackstore::new(SIZE)));
    let _ = blocking.execute(&Command {
        cdb: &rw10(0x00, 0, 0)[..6],
        data_out: &[],
        nexus: n,
    });
    assert!(blocking
        .try_read_async(
            &Command {
                cdb: &read,
                data_out: &[],
                nexus: n,
            },
            u64::MAX
        )
        .is_none());
}

/// A write started asynchronously holds its blocks until the store has written them (a
/// read of them is not started meanwhile, and reads after see the new bytes); it asks
/// the store for durability when FUA is set or the write cache is off; the store's error
/// is a CHECK CONDITION with MEDIUM ERROR, WRITE ERROR at the write's LBA; data of another
/// length than the CDB's, and a write-protected LU, go the blocking way.
#[test]
fn async_writes_hold_their_blocks_ask_for_durability_and_fail_as_write_errors() {
    let store = Deferred::new();
    let lu = LogicalUnit::new(LuConfig::default(), store.clone());
    let n = Nexus(1);
    let cmd = |cdb: &[u8], data: &[u8]| -> Option<mpsc::Receiver<Response>> {
        start(
            &lu,
            &Command {
                cdb,
                data_out: data,
                nexus: n,
            },
        )
    };
    // The power-on unit attention goes the blocking way.
    assert!(cmd(&rw10(0x2a, 0, 1), &[1; 512]).is_none());
    assert_eq!(
        lu.execute(&Command {
            cdb: &rw10(0x2a, 0, 1),
            data_out: &[1; 512],
            nexus: n,
        })
        .status,
        0x02
    );
    let rx = cmd(&rw10(0x2a, 8, 8), &[5; 8 * 512]).expect("a plain write starts async");
    assert!(
        cmd(&rw10(0x28, 12, 1), &[]).is_none(),
        "a read of blocks being written waits"
    );
    assert!(rx.try_recv().is_err(), "answered before the store wrote");
    assert_eq!(store.complete(), 1);
    assert_eq!(rx.recv().unwrap().status, 0);
    let rx = cmd(&rw10(0x28, 12, 1), &[]).expect("free again");
    store.complete();
    assert_eq!(rx.recv().unwrap().data_in, vec![5; 512]);
    // FUA, then the write cache off (MODE SELECT of the caching page, WCE clear).
    let mut fua = rw10(0x2a, 16, 1);
    fua[1] = 0x08;
    let rx = cmd(&fua, &[6; 512]).unwrap();
    store.complete();
    assert_eq!(rx.recv().unwrap().status, 0);
    let sense6 = lu.execute(&Command {
        cdb: &[0x1a, 0x08, 0x08, 0, 255, 0],
        data_out: &[],
        nexus: n,
    });
    assert_eq!(sense6.status, 0);
    let mut page = sense6.data_in;
    page[0] = 0;
    page[4] &= 0x3f;
    assert_eq!(page[4], 0x08, "the caching page");
    assert!(page[6] & 0x04 != 0, "WCE on by default");
    page[6] &= !0x04;
    let r = lu.execute(&Command {
        cdb: &[0x15, 0x10, 0, 0, page.len() as u8, 0],
        data_out: &page,
        nexus: n,
    });
    assert_eq!(r.status, 0, "MODE SELECT: {:?}", r.sense);
    let rx = cmd(&rw10(0x2a, 17, 1), &[7; 512]).unwrap();
    store.complete();
    assert_eq!(rx.recv().unwrap().status, 0);
    assert_eq!(*store.durable.lock().unwrap(), vec![false, true, true]);
    // A flush, then errors.
    let sync = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let rx = cmd(&sync, &[]).expect("SYNCHRONIZE CACHE starts async");
    assert_eq!(store.complete(), 1);
    assert_eq!(rx.recv().unwrap().status, 0);
    store.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    let rx = cmd(&rw10(0x2a, 40, 2), &[8; 1024]).unwrap();
    store.complete();
    let r = rx.recv().unwrap();
    let sense = r.sense.expect("sense data");
    assert_eq!(r.status, 0x02);
    assert_eq!(
        (sense[2] & 0x0f, sense[12], sense[13]),
        (0x03, 0x0c, 0x00),
        "MEDIUM ERROR, WRITE ERROR"
    );
    assert_eq!(&sense[3..7], &40u32.to_be_bytes(), "INFORMATION: the LBA");
    let rx = cmd(&sync, &[]).unwrap();
    store.complete();
    assert_eq!(rx.recv().unwrap().status, 0x02, "a failed flush");
    store
        .fail
        .store(false, std::sync::atomic::Ordering::Relaxed);
    // Short data, and a range past the end, are execute()'s.
    assert!(cmd(&rw10(0x2a, 50, 2), &[8; 512]).is_none());
    assert!(cmd(&rw10(0x2a, (SIZE / 512) as u32, 1), &[8; 512]).is_none());
    assert_eq!(store.complete(), 0);
}
