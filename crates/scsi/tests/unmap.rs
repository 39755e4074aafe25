//! Thin provisioning: UNMAP, WRITE SAME (with UNMAP and NDOB) and GET LBA STATUS, to the
//! end of a large LU.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{LogicalUnit, LuConfig};

use support::*;

fn lba_status(lu: &LogicalUnit, lba: u64) -> Vec<(u64, u32, u8)> {
    let mut c = cdb16(0x9e, lba, 1024);
    c[1] = 0x12;
    let d = good(&exec(lu, &c, &[])).to_vec();
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
        d.len() - 4
    );
    d[8..]
        .chunks(16)
        .map(|x| {
            (
                u64::from_be_bytes(x[0..8].try_into().unwrap()),
                u32::from_be_bytes(x[8..12].try_into().unwrap()),
                x[12],
            )
        })
        .collect()
}

#[test]
fn unmap_and_get_lba_status() {
    let lu = lu();
    assert_eq!(lba_status(&lu, 0), vec![(0, BLOCKS as u32, 1)]);
    good(&exec(&lu, &write10(0, 256), &fill(b'a', 256)));
    let st = lba_status(&lu, 0);
    assert_eq!(st[0].2, 0, "mapped after a write: {st:?}");
    let p = unmap_list(&[(0, 10), (20, 5), (BLOCKS, 0)]);
    good(&exec(&lu, &unmap_cdb(p.len()), &p));
    let d = good(&exec(&lu, &read10(0, 30), &[])).to_vec();
    for (i, block) in d.chunks(BS).enumerate() {
        let zero = i < 10 || (20..25).contains(&i);
        assert!(
            block.iter().all(|&b| b == if zero { 0 } else { b'a' }),
            "block {i}"
        );
    }
    // Whole ram chunks become unmapped.
    let p = unmap_list(&[(0, 2048)]);
    good(&exec(&lu, &unmap_cdb(p.len()), &p));
    assert_eq!(lba_status(&lu, 5), vec![(5, BLOCKS as u32 - 5, 1)]);
    // Parameter checks.
    good(&exec(&lu, &unmap_cdb(0), &[]));
    assert_sense(&exec(&lu, &unmap_cdb(4), &[0; 4]), 0x05, 0x1a, 0x00);
    let p = unmap_list(&[(BLOCKS - 1, 2)]);
    assert_sense(&exec(&lu, &unmap_cdb(p.len()), &p), 0x05, 0x21, 0x00);
    let mut c = unmap_cdb(p.len());
    c[1] = 1;
    assert_invalid_cdb(&exec(&lu, &c, &p), 1);
    let many: Vec<(u64, u32)> = (0..257).map(|i| (i, 1)).collect();
    let p = unmap_list(&many);
    assert_sense(&exec(&lu, &unmap_cdb(p.len()), &p), 0x05, 0x26, 0x00);
    // GET LBA STATUS beyond the end.
    let mut c = cdb16(0x9e, BLOCKS, 24);
    c[1] = 0x12;
    assert_sense(&exec(&lu, &c, &[]), 0x05, 0x21, 0x00);
    c[2..10].copy_from_slice(&(BLOCKS - 1).to_be_bytes());
    let d = good(&exec(&lu, &c, &[])).to_vec();
    assert_eq!(d.len(), 24);
}

#[test]
fn write_same() {
    let lu = lu();
    let mut c = cdb16(0x93, 10, 300);
    good(&exec(&lu, &c, &fill(0x3c, 1)));
    assert_eq!(
        good(&exec(&lu, &read10(10, 300), &[])),
        &fill(0x3c, 300)[..]
    );
    assert_eq!(good(&exec(&lu, &read10(310, 1), &[])), &fill(0, 1)[..]);
    // UNMAP with zero data deallocates.
    c[1] = 0x08;
    good(&exec(&lu, &c, &fill(0, 1)));
    assert_eq!(good(&exec(&lu, &read10(10, 300), &[])), &fill(0, 300)[..]);
    // NDOB: zeros without a data-out buffer.
    good(&exec(&lu, &cdb16(0x93, 0, 4), &fill(9, 1)));
    let mut ndob = cdb16(0x93, 0, 4);
    ndob[1] = 0x09;
    assert_eq!(LogicalUnit::data_out_len(&ndob, 512), None);
    good(&exec(&lu, &ndob, &[]));
    assert_eq!(good(&exec(&lu, &read10(0, 4), &[])), &fill(0, 4)[..]);
    // UNMAP deallocates whatever the data block holds; LBPRZ: reads return zeros.
    good(&exec(&lu, &cdb16(0x8a, 0, 4), &fill(7, 4)));
    let mut unmap = cdb16(0x93, 0, 4);
    unmap[1] = 0x08;
    good(&exec(&lu, &unmap, &fill(0xff, 1)));
    assert_eq!(good(&exec(&lu, &read10(0, 4), &[])), &fill(0, 4)[..]);
    // More data than one block is refused.
    assert_invalid_cdb(&exec(&lu, &cdb16(0x93, 0, 1), &fill(1, 2)), 10);
    // WRITE SAME(10).
    let ws10 = [0x41, 0, 0, 0, 0, 50, 0, 0, 2, 0];
    good(&exec(&lu, &ws10, &fill(0x11, 1)));
    assert_eq!(good(&exec(&lu, &read10(50, 2), &[])), &fill(0x11, 2)[..]);
    // No blocks: to the end of the medium (WSNZ clear).
    good(&exec(&lu, &cdb16(0x93, BLOCKS - 3, 0), &fill(0x22, 1)));
    assert_eq!(
        good(&exec(&lu, &read10(BLOCKS as u32 - 3, 3), &[])),
        &fill(0x22, 3)[..]
    );
    // Errors: ANCHOR, more than MAXIMUM WRITE SAME LENGTH, beyond the end, short data.
    let mut a = cdb16(0x93, 0, 1);
    a[1] = 0x10;
    assert_invalid_cdb(&exec(&lu, &a, &fill(0, 1)), 1);
    a[1] = 0x18;
    assert_invalid_cdb(&exec(&lu, &a, &fill(0, 1)), 1);
    assert_invalid_cdb(&exec(&lu, &cdb16(0x93, 0, 0x10000), &fill(0, 1)), 10);
    assert_sense(
        &exec(&lu, &cdb16(0x93, BLOCKS, 0), &fill(0, 1)),
        0x05,
        0x21,
        0x00,
    );
    assert_sense(
        &exec(&lu, &cdb16(0x93, BLOCKS, 1), &fill(0, 1)),
        0x05,
        0x21,
        0x00,
    );
    assert_sense(&exec(&lu, &cdb16(0x93, 0, 1), &[0; 100]), 0x05, 0x0e, 0x03);
    let mut ws10bad = ws10;
    ws10bad[1] = 0x01;
    assert_invalid_cdb(&exec(&lu, &ws10bad, &fill(0, 1)), 1);
}

/// GET LBA STATUS covers the whole LU, however large, with one descriptor per run: a
/// 2 GiB thin LU (4 Mi blocks, four times the store window asked at first), one block
/// written near the middle, reads as three descriptors to the end (libiscsi's
/// Sanitize.BlockErase checks that the descriptors of a 256-byte answer cover the LU).
#[test]
fn get_lba_status_covers_a_large_lu_to_its_end() {
    let blocks: u64 = 4 << 20;
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(blocks * BS as u64));
    let lu = LogicalUnit::new(LuConfig::default(), store);
    exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_eq!(lba_status(&lu, 0), vec![(0, blocks as u32, 1)]);
    assert_eq!(
        lba_status(&lu, 3_000_000),
        vec![(3_000_000, (blocks - 3_000_000) as u32, 1)]
    );
    good(&exec(&lu, &write10(3_000_000, 1), &fill(1, 1)));
    let st = lba_status(&lu, 0);
    assert_eq!(st.len(), 3, "{st:?}");
    assert_eq!(st[1].2, 0);
    assert!(st[1].0 <= 3_000_000 && st[1].0 + st[1].1 as u64 > 3_000_000);
    assert_eq!(st[2].0 + st[2].1 as u64, blocks, "to the end: {st:?}");
    // An allocation length of one descriptor gets the first run, whole.
    let mut c = cdb16(0x9e, 0, 24);
    c[1] = 0x12;
    let d = good(&exec(&lu, &c, &[])).to_vec();
    assert_eq!(
        u32::from_be_bytes(d[16..20].try_into().unwrap()) as u64,
        st[0].1 as u64
    );
}
