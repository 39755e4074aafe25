//! READ and WRITE in every size, their limits and refusals (ranges, protection fields,
//! short data), VERIFY, WRITE AND VERIFY, ORWRITE, COMPARE AND WRITE (atomic against a slow
//! store), WRITE ATOMIC, SYNCHRONIZE CACHE and PRE-FETCH, a read-only LUN and 4096-byte
//! blocks, against a RAM store.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{LogicalUnit, LuConfig};

use support::*;

#[test]
fn read_write_all_sizes() {
    let lu = lu();
    good(&exec(&lu, &write10(10, 2), &fill(0xa1, 2)));
    assert_eq!(good(&exec(&lu, &read10(10, 2), &[])), &fill(0xa1, 2)[..]);
    good(&exec(&lu, &[0x0a, 0, 0, 20, 1, 0], &fill(0xb2, 1)));
    assert_eq!(
        good(&exec(&lu, &[0x08, 0, 0, 20, 1, 0], &[])),
        &fill(0xb2, 1)[..]
    );
    good(&exec(&lu, &cdb12(0xaa, 30, 3), &fill(0xc3, 3)));
    assert_eq!(
        good(&exec(&lu, &cdb12(0xa8, 30, 3), &[])),
        &fill(0xc3, 3)[..]
    );
    good(&exec(&lu, &cdb16(0x8a, BLOCKS - 1, 1), &fill(0xd4, 1)));
    assert_eq!(
        good(&exec(&lu, &cdb16(0x88, BLOCKS - 1, 1), &[])),
        &fill(0xd4, 1)[..]
    );
    // Unwritten blocks read as zeros.
    assert_eq!(good(&exec(&lu, &read10(100, 1), &[])), &fill(0, 1)[..]);
}

#[test]
fn transfer_length_zero() {
    let lu = lu();
    assert!(good(&exec(&lu, &read10(0, 0), &[])).is_empty());
    assert!(good(&exec(&lu, &write10(0, 0), &[])).is_empty());
    // READ(6) with 0 means 256 blocks.
    assert_eq!(
        good(&exec(&lu, &[0x08, 0, 0, 0, 0, 0], &[])).len(),
        256 * BS
    );
    assert_eq!(
        LogicalUnit::data_out_len(&[0x0a, 0, 0, 0, 0, 0], 512),
        Some(256 * 512)
    );
    assert_eq!(LogicalUnit::data_out_len(&write10(0, 0), 512), Some(0));
    assert_eq!(
        LogicalUnit::data_out_len(&write10(0, 3), 4096),
        Some(3 * 4096)
    );
    assert_eq!(
        LogicalUnit::data_out_len(&[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0], 512),
        None,
        "CAW takes what came, to refuse a length that does not match"
    );
    assert_eq!(LogicalUnit::data_out_len(&[0xff, 0, 0, 0, 0, 0], 512), None);
}

#[test]
fn lba_out_of_range() {
    let lu = lu();
    let last = (BLOCKS - 1) as u32;
    good(&exec(&lu, &read10(last, 1), &[]));
    good(&exec(&lu, &read10(BLOCKS as u32, 0), &[]));
    assert_sense(&exec(&lu, &read10(last, 2), &[]), 0x05, 0x21, 0x00);
    assert_sense(
        &exec(&lu, &read10(BLOCKS as u32 + 1, 0), &[]),
        0x05,
        0x21,
        0x00,
    );
    assert_sense(&exec(&lu, &read10(u32::MAX, 1), &[]), 0x05, 0x21, 0x00);
    assert_sense(&exec(&lu, &cdb16(0x88, u64::MAX, 1), &[]), 0x05, 0x21, 0x00);
    assert_sense(
        &exec(&lu, &cdb16(0x8a, u64::MAX, 1), &fill(0, 1)),
        0x05,
        0x21,
        0x00,
    );
    assert_sense(&exec(&lu, &write10(last, 2), &fill(0, 2)), 0x05, 0x21, 0x00);
    assert_sense(
        &exec(&lu, &[0x35, 0, 0, 0, 0x10, 0, 0, 0, 1, 0], &[]),
        0x05,
        0x21,
        0x00,
    );
    assert_sense(&exec(&lu, &cdb16(0x90, BLOCKS, 1), &[]), 0x05, 0x21, 0x00);
}

#[test]
fn protect_fields_are_invalid() {
    let lu = lu();
    let mut c = read10(0, 1);
    c[1] = 0x20;
    assert_invalid_cdb(&exec(&lu, &c, &[]), 1);
    let mut c = cdb16(0x8a, 0, 1);
    c[1] = 0x60;
    assert_invalid_cdb(&exec(&lu, &c, &fill(0, 1)), 1);
    let mut c = cdb12(0xaf, 0, 1);
    c[1] = 0x80;
    assert_invalid_cdb(&exec(&lu, &c, &[]), 1);
    // DPO and FUA are accepted.
    let mut c = write10(0, 1);
    c[1] = 0x18;
    good(&exec(&lu, &c, &fill(1, 1)));
    let mut c = read10(0, 1);
    c[1] = 0x18;
    good(&exec(&lu, &c, &[]));
}

#[test]
fn short_data_out_is_rejected_without_writing() {
    let lu = lu();
    assert_sense(&exec(&lu, &write10(0, 2), &fill(9, 1)), 0x05, 0x0e, 0x03);
    assert_eq!(good(&exec(&lu, &read10(0, 2), &[])), &fill(0, 2)[..]);
    // Extra data beyond the transfer length is ignored.
    let mut data = fill(7, 1);
    data.extend(fill(8, 1));
    good(&exec(&lu, &write10(0, 1), &data));
    assert_eq!(
        good(&exec(&lu, &read10(0, 2), &[])),
        &[fill(7, 1), fill(0, 1)].concat()[..]
    );
}

#[test]
fn transfer_limit_is_enforced() {
    let lu = lu_with(LuConfig {
        max_transfer_blocks: 8,
        ..LuConfig::default()
    });
    good(&exec(&lu, &read10(0, 8), &[]));
    assert_invalid_cdb(&exec(&lu, &read10(0, 9), &[]), 7);
    assert_invalid_cdb(&exec(&lu, &cdb16(0x88, 0, 9), &[]), 10);
}

#[test]
fn verify_and_miscompare() {
    let lu = lu();
    good(&exec(&lu, &write10(5, 2), &fill(0x5a, 2)));
    let mut c = [0x2f, 0, 0, 0, 0, 5, 0, 0, 2, 0];
    good(&exec(&lu, &c, &[]));
    c[1] = 0x02; // BYTCHK 01b
    good(&exec(&lu, &c, &fill(0x5a, 2)));
    let mut bad = fill(0x5a, 2);
    bad[700] = 0;
    let r = exec(&lu, &c, &bad);
    assert_sense(&r, 0x0e, 0x1d, 0x00);
    let s = r.sense.unwrap();
    assert_eq!(s[0] & 0x80, 0x80);
    assert_eq!(u32::from_be_bytes(s[3..7].try_into().unwrap()), 700);
    c[1] = 0x06; // BYTCHK 11b: one block compared with each
    good(&exec(&lu, &c, &fill(0x5a, 1)));
    c[1] = 0x04; // reserved
    assert_invalid_cdb(&exec(&lu, &c, &[]), 1);
    // VERIFY(16) beyond the end.
    assert_sense(&exec(&lu, &cdb16(0x8f, BLOCKS, 1), &[]), 0x05, 0x21, 0x00);
}

#[test]
fn write_and_verify() {
    let lu = lu();
    let mut c = cdb12(0xae, 7, 1);
    c[1] = 0x02;
    good(&exec(&lu, &c, &fill(0x77, 1)));
    assert_eq!(good(&exec(&lu, &read10(7, 1), &[])), &fill(0x77, 1)[..]);
    let mut c = cdb16(0x8e, 0, 1);
    c[1] = 0x20;
    assert_invalid_cdb(&exec(&lu, &c, &fill(0, 1)), 1);
}

#[test]
fn read_only_lun() {
    let lu = lu_with(LuConfig {
        read_only: true,
        ..LuConfig::default()
    });
    good(&exec(&lu, &read10(0, 1), &[]));
    assert_sense(&exec(&lu, &write10(0, 1), &fill(1, 1)), 0x07, 0x27, 0x00);
    assert_sense(
        &exec(&lu, &cdb16(0x93, 0, 1), &fill(1, 1)),
        0x07,
        0x27,
        0x00,
    );
    let unmap = unmap_list(&[(0, 1)]);
    assert_sense(
        &exec(&lu, &unmap_cdb(unmap.len()), &unmap),
        0x07,
        0x27,
        0x00,
    );
    let ms = good(&exec(&lu, &[0x1a, 0, 0x3f, 0, 255, 0], &[])).to_vec();
    assert_eq!(ms[2] & 0x80, 0x80, "WP in the mode parameter header");
}

#[test]
fn synchronize_cache_and_prefetch() {
    let lu = lu();
    good(&exec(&lu, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    good(&exec(&lu, &cdb16(0x91, BLOCKS - 1, 1), &[]));
    good(&exec(&lu, &[0x34, 0x02, 0, 0, 0, 0, 3, 0, 1, 0], &[]));
    good(&exec(&lu, &cdb16(0x90, BLOCKS - 256, 256), &[]));
}

#[test]
fn compare_and_write() {
    let lu = lu();
    good(&exec(&lu, &write10(3, 1), &fill(0x01, 1)));
    let caw = |lba: u64, n: u8| {
        let mut c = vec![0u8; 16];
        c[0] = 0x89;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[13] = n;
        c
    };
    let mut data = fill(0x01, 1);
    data.extend(fill(0x02, 1));
    good(&exec(&lu, &caw(3, 1), &data));
    assert_eq!(good(&exec(&lu, &read10(3, 1), &[])), &fill(0x02, 1)[..]);
    // Now the compare fails at byte 0 and nothing is written.
    let r = exec(&lu, &caw(3, 1), &data);
    assert_sense(&r, 0x0e, 0x1d, 0x00);
    assert_eq!(
        u32::from_be_bytes(r.sense.unwrap()[3..7].try_into().unwrap()),
        0
    );
    assert_eq!(good(&exec(&lu, &read10(3, 1), &[])), &fill(0x02, 1)[..]);
    // Miscompare offset inside the second block.
    good(&exec(&lu, &write10(8, 2), &fill(0, 2)));
    let mut d2 = fill(0, 2);
    d2[BS + 17] = 1;
    d2.extend(fill(5, 2));
    let r = exec(&lu, &caw(8, 2), &d2);
    assert_eq!(
        u32::from_be_bytes(r.sense.unwrap()[3..7].try_into().unwrap()),
        (BS + 17) as u32
    );
    // Zero blocks is a no-op; wrong sizes and ranges fail.
    good(&exec(&lu, &caw(0, 0), &[]));
    assert_sense(&exec(&lu, &caw(0, 1), &fill(0, 1)), 0x05, 0x0e, 0x03);
    assert_sense(&exec(&lu, &caw(BLOCKS, 1), &fill(0, 2)), 0x05, 0x21, 0x00);
    let limited = lu_with(LuConfig {
        max_transfer_blocks: 4,
        ..LuConfig::default()
    });
    assert_invalid_cdb(&exec(&limited, &caw(0, 5), &fill(0, 10)), 13);
}

#[test]
fn compare_and_write_is_atomic() {
    let store: Arc<dyn Backstore> = Arc::new(ReadsThrough {
        ram: RamBackstore::new(BLOCKS * BS as u64),
        read: |ram, buf, offset| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            ram.read_at(buf, offset)
        },
    });
    let lu = Arc::new(LogicalUnit::new(LuConfig::default(), store));
    exec(&lu, &[0, 0, 0, 0, 0, 0], &[]);
    good(&exec(&lu, &write10(0, 1), &fill(0, 1)));
    // Each thread increments a counter in block 0 with COMPARE AND WRITE, retrying on
    // miscompare; another thread overwrites neighbouring blocks at the same time. Lost
    // updates would show as a final count below the number of increments.
    let threads = 6;
    let per = 50u32;
    std::thread::scope(|s| {
        for _ in 0..threads {
            let lu = lu.clone();
            s.spawn(move || {
                let mut c = vec![0u8; 16];
                c[0] = 0x89;
                c[13] = 1;
                let mut done = 0;
                while done < per {
                    let cur = exec(&lu, &read10(0, 1), &[]).data_in;
                    let n = u32::from_be_bytes(cur[0..4].try_into().unwrap());
                    let mut next = cur.clone();
                    next[0..4].copy_from_slice(&(n + 1).to_be_bytes());
                    let mut data = cur;
                    data.extend(next);
                    let r = exec(&lu, &c, &data);
                    if r.status == 0 {
                        done += 1;
                    } else {
                        assert_eq!(r.sense.unwrap()[2], 0x0e);
                    }
                }
            });
        }
        let lu = lu.clone();
        s.spawn(move || {
            for i in 0..100u32 {
                good(&exec(&lu, &write10(1, 8), &fill(i as u8, 8)));
            }
        });
    });
    let d = good(&exec(&lu, &read10(0, 1), &[])).to_vec();
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()),
        threads * per
    );
}

/// A RAM store whose compare-and-write is atomic within `unit` bytes only (as librbd's
/// within a 512-byte sector), or absent; it counts the calls that reach it.
#[derive(Debug)]
struct UnitCaw {
    ram: RamBackstore,
    unit: Option<u64>,
    calls: std::sync::atomic::AtomicU64,
}

impl Backstore for UnitCaw {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.ram.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.ram.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.write_zeroes(offset, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, u64, bool)>> {
        self.ram.is_allocated(offset, len)
    }
    fn supports_discard(&self) -> bool {
        true
    }
    fn atomic_compare_and_write_unit(&self) -> Option<u64> {
        self.unit
    }
    fn compare_and_write(
        &self,
        offset: u64,
        verify: &[u8],
        write: &[u8],
    ) -> std::io::Result<backstore::Compared> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let unit = self
            .unit
            .expect("asked for a compare-and-write it does not offer");
        assert!(
            backstore::within_unit(offset, verify.len() as u64, unit),
            "asked for {} bytes at {offset} across a unit of {unit}",
            verify.len()
        );
        self.ram.compare_and_write(offset, verify, write)
    }
}

fn unit_caw_lu(unit: Option<u64>, shared: bool) -> (LogicalUnit, Arc<UnitCaw>) {
    let store = Arc::new(UnitCaw {
        ram: RamBackstore::new(BLOCKS * BS as u64),
        unit,
        calls: Default::default(),
    });
    let config = LuConfig {
        target_port_group: 1,
        relative_port: 1,
        peer_port_groups: if shared { vec![2] } else { Vec::new() },
        ..LuConfig::default()
    };
    let lu = LogicalUnit::new(config, store.clone());
    exec(&lu, &[0, 0, 0, 0, 0, 0], &[]);
    (lu, store)
}

fn caw_cdb(lba: u64, n: u8) -> Vec<u8> {
    let mut c = cdb16(0x89, lba, 0);
    c[13] = n;
    c
}

fn max_compare_and_write(lu: &LogicalUnit) -> u8 {
    good(&exec(lu, &[0x12, 1, 0xb0, 0, 64, 0], &[]))[5]
}

/// A store that compares and writes atomically within a unit gets the logical unit's
/// COMPARE AND WRITE when the range fits (the MISCOMPARE's INFORMATION is the store's
/// offset); on a logical unit that other targets export too (a gateway group) it is
/// the only way: the Block Limits page says so, and longer ranges, or any at all over a
/// store without it, are refused rather than compared under a lock of this process alone.
#[test]
fn compare_and_write_goes_through_a_store_that_makes_it_atomic() {
    let calls = |s: &UnitCaw| s.calls.load(std::sync::atomic::Ordering::SeqCst);
    let (lu, store) = unit_caw_lu(Some(512), true);
    assert_eq!(max_compare_and_write(&lu), 1);
    good(&exec(&lu, &write10(7, 1), &fill(3, 1)));
    let mut data = fill(3, 1);
    data[300] = 9;
    data.extend(fill(4, 1));
    let r = exec(&lu, &caw_cdb(7, 1), &data);
    assert_sense(&r, 0x0e, 0x1d, 0x00);
    assert_eq!(
        u32::from_be_bytes(r.sense.unwrap()[3..7].try_into().unwrap()),
        300
    );
    data[300] = 3;
    good(&exec(&lu, &caw_cdb(7, 1), &data));
    assert_eq!(good(&exec(&lu, &read10(7, 1), &[])), &fill(4, 1)[..]);
    assert_eq!(calls(&store), 2);
    let mut two = fill(0, 2);
    two.extend(fill(1, 2));
    assert_invalid_cdb(&exec(&lu, &caw_cdb(20, 2), &two), 13);
    assert_eq!(
        calls(&store),
        2,
        "a range across the unit reached the store"
    );
    assert_eq!(good(&exec(&lu, &read10(20, 2), &[])), &fill(0, 2)[..]);

    // A unit of two blocks: two blocks are allowed, but not across the unit's edge.
    let (lu, store) = unit_caw_lu(Some(1024), true);
    assert_eq!(max_compare_and_write(&lu), 2);
    assert_invalid_cdb(&exec(&lu, &caw_cdb(21, 2), &two), 13);
    assert_eq!(good(&exec(&lu, &read10(21, 2), &[])), &fill(0, 2)[..]);
    good(&exec(&lu, &caw_cdb(20, 2), &two));
    assert_eq!(calls(&store), 1);

    // Not shared: a range the store cannot take is compared under the LU's lock.
    let (lu, store) = unit_caw_lu(Some(512), false);
    assert!(max_compare_and_write(&lu) > 1);
    good(&exec(&lu, &caw_cdb(20, 2), &two));
    assert_eq!(good(&exec(&lu, &read10(20, 2), &[])), &fill(1, 2)[..]);
    assert_eq!(calls(&store), 0);

    // Shared, and the store has none: COMPARE AND WRITE is not offered.
    let (lu, _) = unit_caw_lu(None, true);
    assert_eq!(max_compare_and_write(&lu), 0);
    assert_invalid_cdb(&exec(&lu, &caw_cdb(7, 1), &fill(0, 2)), 13);
}

#[test]
fn orwrite() {
    let lu = lu();
    good(&exec(&lu, &write10(4, 1), &fill(0x0f, 1)));
    good(&exec(&lu, &cdb16(0x8b, 4, 1), &fill(0xf0, 1)));
    assert_eq!(good(&exec(&lu, &read10(4, 1), &[])), &fill(0xff, 1)[..]);
    assert_sense(
        &exec(&lu, &cdb16(0x8b, BLOCKS, 1), &fill(0, 1)),
        0x05,
        0x21,
        0x00,
    );
}

#[test]
fn block_size_4096() {
    let lu = lu_with(LuConfig {
        block_size: 4096,
        ..LuConfig::default()
    });
    let d = good(&exec(&lu, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[])).to_vec();
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 4096);
    good(&exec(&lu, &write10(1, 1), &vec![0x42; 4096]));
    assert_eq!(good(&exec(&lu, &read10(1, 1), &[])), &vec![0x42; 4096][..]);
    assert_sense(
        &exec(&lu, &write10(1, 1), &vec![0x42; 512]),
        0x05,
        0x0e,
        0x03,
    );
}

#[test]
fn compare_and_write_with_no_blocks_but_data_is_refused() {
    let lu = lu();
    let mut c = cdb16(0x89, 0, 0);
    c[13] = 0;
    good(&exec(&lu, &c, &[]));
    assert_invalid_cdb(&exec(&lu, &c, &fill(0, 2)), 13);
    assert_eq!(LogicalUnit::data_out_len(&c, 512), None);
    // One block in the CDB, two blocks' worth of data: refused, nothing written.
    c[13] = 1;
    assert_invalid_cdb(&exec(&lu, &c, &fill(0, 4)), 13);
}

fn write_atomic(lba: u64, blocks: u16) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x9c;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[12..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn write_atomic_16() {
    let lu = lu();
    assert_eq!(
        LogicalUnit::data_out_len(&write_atomic(0, 3), 512),
        Some(1536)
    );
    good(&exec(&lu, &write_atomic(5, 3), &fill(0x3c, 3)));
    assert_eq!(good(&exec(&lu, &read10(5, 3), &[])), &fill(0x3c, 3)[..]);
    good(&exec(&lu, &write_atomic(0, 0), &[]));
    assert_sense(
        &exec(&lu, &write_atomic(BLOCKS, 1), &fill(0, 1)),
        0x05,
        0x21,
        0x00,
    );
    // Atomic boundaries are not offered; WRPROTECT is refused.
    let mut b = write_atomic(0, 1);
    b[11] = 1;
    assert_invalid_cdb(&exec(&lu, &b, &fill(0, 1)), 10);
    let mut p = write_atomic(0, 1);
    p[1] = 0x20;
    assert_invalid_cdb(&exec(&lu, &p, &fill(0, 1)), 1);
    // Block Limits VPD reports the maximum atomic transfer length.
    let bl = good(&exec(&lu, &[0x12, 1, 0xb0, 0, 64, 0], &[])).to_vec();
    assert_eq!(u32::from_be_bytes(bl[44..48].try_into().unwrap()), 16384);
    let ro = lu_with(LuConfig {
        read_only: true,
        ..LuConfig::default()
    });
    assert_sense(
        &exec(&ro, &write_atomic(0, 1), &fill(0, 1)),
        0x07,
        0x27,
        0x00,
    );
}

/// WRITE COMPRESSED (16), Reservoir's own: the frame lands as its blocks, FUA or not; a
/// frame of another length, or no frame, is refused and nothing is written.
#[test]
fn write_compressed() {
    let lu = lu();
    exec(&lu, &[0, 0, 0, 0, 0, 0], &[]);
    let data: Vec<u8> = (0..8 * BS).map(|i| (i / 100) as u8).collect();
    let frame = zstd::bulk::compress(&data, 1).unwrap();
    assert!(frame.len() < data.len());
    let cdb = scsi::cdb::write_compressed16(16, 8, false);
    good(&exec(&lu, &cdb, &frame));
    assert_eq!(good(&exec(&lu, &read10(16, 8), &[])), &data[..]);
    good(&exec(
        &lu,
        &scsi::cdb::write_compressed16(32, 8, true),
        &frame,
    ));
    assert_eq!(good(&exec(&lu, &read10(32, 8), &[])), &data[..]);
    // The CDB says 7 blocks, the frame holds 8: refused, block 48 untouched.
    let r = exec(&lu, &scsi::cdb::write_compressed16(48, 7, false), &frame);
    assert_sense(&r, 0x05, 0x26, 0x00);
    // Raw data where a frame should be.
    let r = exec(&lu, &scsi::cdb::write_compressed16(48, 8, false), &data);
    assert_sense(&r, 0x05, 0x26, 0x00);
    assert!(good(&exec(&lu, &read10(48, 8), &[]))
        .iter()
        .all(|&b| b == 0));
    // Beyond the end, and a reserved bit.
    let r = exec(
        &lu,
        &scsi::cdb::write_compressed16(BLOCKS - 4, 8, false),
        &frame,
    );
    assert_sense(&r, 0x05, 0x21, 0x00);
    let mut bad = scsi::cdb::write_compressed16(48, 8, false);
    bad[1] = 0x10;
    assert_invalid_cdb(&exec(&lu, &bad, &frame), 1);
}

/// A replica's fence (`rsv sync demote`): only the named writer changes the medium; any
/// other nexus gets DATA PROTECT, WRITE PROTECTED for WRITE, WRITE SAME and UNMAP, and
/// still reads.
#[test]
fn a_fenced_lun_takes_writes_only_from_its_writers() {
    let lu = lu_with(LuConfig {
        thin: true,
        ..LuConfig::default()
    });
    let (app, writer) = (scsi::Nexus(1), scsi::Nexus(2));
    lu.name_nexus(app, "iqn.2026-01.org.example:app,i,0x000000000001");
    lu.name_nexus(
        writer,
        "iqn.2026-01.org.reservoir:sync.0011,i,0x000000000002",
    );
    let _ = exec_on(&lu, writer, &[0x00, 0, 0, 0, 0, 0], &[]);
    lu.fence()
        .set(Some(vec!["iqn.2026-01.org.reservoir:sync.0011".into()]));
    let r = exec_on(&lu, app, &write10(0, 1), &fill(0xaa, 1));
    assert_sense(&r, 0x07, 0x27, 0x00);
    let r = exec_on(&lu, app, &cdb16(0x93, 0, 1), &fill(0, 1));
    assert_sense(&r, 0x07, 0x27, 0x00);
    let list = unmap_list(&[(0, 1)]);
    let r = exec_on(&lu, app, &unmap_cdb(list.len()), &list);
    assert_sense(&r, 0x07, 0x27, 0x00);
    good(&exec_on(&lu, app, &read10(0, 1), &[]));
    good(&exec_on(&lu, writer, &write10(0, 1), &fill(0xbb, 1)));
    assert_eq!(lu.fence().writing(), 1);
    assert_eq!(
        good(&exec_on(&lu, app, &read10(0, 1), &[])),
        &fill(0xbb, 1)[..]
    );
    lu.fence().set(None);
    good(&exec_on(&lu, app, &write10(0, 1), &fill(0xcc, 1)));
}
