//! MODE SENSE and MODE SELECT, the unit attentions a logical unit raises (power on,
//! reported LUNs and capacity changed, mode parameters changed) once per nexus, and a
//! removable medium.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{LogicalUnit, LuConfig, Nexus, Response};

use support::*;

#[test]
fn unit_attention_once_per_nexus() {
    let lu = lu();
    let other = Nexus(2);
    // INQUIRY and REPORT LUNS do not consume it.
    good(&exec_on(&lu, other, &[0x12, 0, 0, 0, 36, 0], &[]));
    good(&exec_on(
        &lu,
        other,
        &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
        &[],
    ));
    assert_sense(&exec_on(&lu, other, &read10(0, 1), &[]), 0x06, 0x29, 0x00);
    good(&exec_on(&lu, other, &read10(0, 1), &[]));
    good(&exec(&lu, &read10(0, 1), &[]));
    // REQUEST SENSE reports and clears it.
    let third = Nexus(3);
    let s = good(&exec_on(&lu, third, &[0x03, 0, 0, 0, 252, 0], &[])).to_vec();
    assert_eq!((s[2], s[12], s[13]), (0x06, 0x29, 0x00));
    good(&exec_on(&lu, third, &[0, 0, 0, 0, 0, 0], &[]));
    let s = good(&exec_on(&lu, third, &[0x03, 0, 0, 0, 252, 0], &[])).to_vec();
    assert_eq!((s[2], s[12], s[13]), (0, 0, 0));
    // Reset: every nexus sees it again, once.
    lu.reset();
    assert_sense(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]), 0x06, 0x29, 0x00);
    assert_sense(
        &exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]),
        0x06,
        0x29,
        0x00,
    );
    good(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    // A lost nexus that comes back starts afresh.
    lu.nexus_lost(other);
    assert_sense(
        &exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]),
        0x06,
        0x29,
        0x00,
    );
}

#[test]
fn reported_luns_data_has_changed() {
    let lu = lu();
    let tur = [0u8; 6];
    let report_luns = [0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0];
    // Only for the nexus named, once however often it is raised.
    lu.luns_changed(N);
    lu.luns_changed(N);
    assert_sense(&exec(&lu, &tur, &[]), 0x06, 0x3f, 0x0e);
    good(&exec(&lu, &tur, &[]));
    // A nexus that never used the LU gets its power-on attention, not this one.
    let other = Nexus(2);
    lu.luns_changed(other);
    assert_sense(&exec_on(&lu, other, &tur, &[]), 0x06, 0x29, 0x00);
    good(&exec_on(&lu, other, &tur, &[]));
    // REPORT LUNS answers what the attention would have said, and clears it.
    lu.luns_changed(N);
    good(&exec(&lu, &report_luns, &[]));
    good(&exec(&lu, &tur, &[]));
    let s = good(&exec(&lu, &[0x03, 0, 0, 0, 252, 0], &[])).to_vec();
    assert_eq!((s[2], s[12], s[13]), (0, 0, 0));
}

fn mode_sense6(lu: &LogicalUnit, nexus: Nexus, pc_page: u8, alloc: u8) -> Response {
    exec_on(lu, nexus, &[0x1a, 0, pc_page, 0, alloc, 0], &[])
}

fn find_page(ms: &[u8], header: usize, code: u8) -> Option<Vec<u8>> {
    let mut pos = header;
    while pos + 2 <= ms.len() {
        let len = ms[pos + 1] as usize + 2;
        if ms[pos] & 0x3f == code {
            return Some(ms[pos..pos + len].to_vec());
        }
        pos += len;
    }
    None
}

#[test]
fn mode_sense_pages() {
    let lu = lu();
    let all = good(&mode_sense6(&lu, N, 0x3f, 255)).to_vec();
    assert_eq!(all[0] as usize, all.len() - 1);
    assert_eq!(all[2] & 0x10, 0x10, "DPOFUA");
    assert_eq!(all[3], 8);
    assert_eq!(
        u32::from_be_bytes(all[4..8].try_into().unwrap()),
        BLOCKS as u32
    );
    assert_eq!(
        u32::from_be_bytes(all[8..12].try_into().unwrap()) & 0xff_ffff,
        512
    );
    let caching = find_page(&all, 12, 0x08).unwrap();
    assert_eq!(caching[2] & 0x04, 0x04, "WCE");
    let control = find_page(&all, 12, 0x0a).unwrap();
    assert_eq!(control.len(), 12);
    assert!(find_page(&all, 12, 0x1c).is_some());
    // One page matches the same page in "all pages".
    let one = good(&mode_sense6(&lu, N, 0x0a, 255)).to_vec();
    assert_eq!(find_page(&one, 12, 0x0a).unwrap(), control);
    // DBD drops the block descriptor.
    let dbd = good(&exec(&lu, &[0x1a, 0x08, 0x08, 0, 255, 0], &[])).to_vec();
    assert_eq!(dbd[3], 0);
    assert_eq!(&dbd[4..], &caching[..]);
    // Truncation to the allocation length.
    assert_eq!(good(&mode_sense6(&lu, N, 0x3f, 4)), &all[..4]);
    // Changeable values: WCE, RCD and SWP.
    let ch = good(&mode_sense6(&lu, N, 0x7f, 255)).to_vec();
    assert_eq!(find_page(&ch, 12, 0x08).unwrap()[2], 0x05);
    assert_eq!(find_page(&ch, 12, 0x0a).unwrap()[4], 0x08);
    // Saved values are not supported.
    assert_sense(&mode_sense6(&lu, N, 0xff, 255), 0x05, 0x39, 0x00);
    assert_invalid_cdb(&mode_sense6(&lu, N, 0x19, 255), 2);
    assert_invalid_cdb(&exec(&lu, &[0x1a, 0, 0x08, 1, 255, 0], &[]), 3);
    // MODE SENSE(10) with a long LBA descriptor.
    let ten = good(&exec(&lu, &[0x5a, 0x10, 0x08, 0, 0, 0, 0, 0x01, 0, 0], &[])).to_vec();
    assert_eq!(u16::from_be_bytes([ten[0], ten[1]]) as usize, ten.len() - 2);
    assert_eq!(ten[4] & 1, 1);
    assert_eq!(u16::from_be_bytes([ten[6], ten[7]]), 16);
    assert_eq!(u64::from_be_bytes(ten[8..16].try_into().unwrap()), BLOCKS);
    assert_eq!(u32::from_be_bytes(ten[20..24].try_into().unwrap()), 512);
    assert_eq!(&ten[24..], &caching[..]);
}

#[test]
fn mode_select_changes_and_unit_attention() {
    let lu = lu();
    let other = Nexus(2);
    exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]);
    // Set SWP through the control page.
    let cur = good(&mode_sense6(&lu, N, 0x0a, 255)).to_vec();
    let mut control = find_page(&cur, 12, 0x0a).unwrap();
    control[4] |= 0x08;
    let mut list = vec![0, 0, 0, 0];
    list.extend(&control);
    let cdb = [0x15, 0x10, 0, 0, list.len() as u8, 0];
    assert_eq!(
        LogicalUnit::data_out_len(&cdb, 512),
        Some(list.len() as u32)
    );
    good(&exec(&lu, &cdb, &list));
    assert_sense(&exec(&lu, &write10(0, 1), &fill(1, 1)), 0x07, 0x27, 0x00);
    let ms = good(&mode_sense6(&lu, N, 0x0a, 255)).to_vec();
    assert_eq!(ms[2] & 0x80, 0x80);
    // The other nexus learns of it once; this one does not.
    assert_sense(&exec_on(&lu, other, &read10(0, 1), &[]), 0x06, 0x2a, 0x01);
    good(&exec_on(&lu, other, &read10(0, 1), &[]));
    // Setting the same values again changes nothing and raises nothing.
    good(&exec(&lu, &cdb, &list));
    good(&exec_on(&lu, other, &read10(0, 1), &[]));
    // Clear SWP with MODE SELECT(10) and a block descriptor.
    control[4] &= !0x08;
    let mut list10 = vec![0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x02, 0x00];
    list10.extend(&control);
    let mut cdb10 = [0x55, 0x10, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb10[8] = list10.len() as u8;
    good(&exec(&lu, &cdb10, &list10));
    good(&exec(&lu, &write10(0, 1), &fill(1, 1)));

    // A non-changeable bit: QAM in the control page.
    let mut bad = list.clone();
    bad[4 + 3] = 0x00;
    bad[4 + 4] &= !0x08;
    let r = exec(&lu, &cdb, &bad);
    assert_sense(&r, 0x05, 0x26, 0x00);
    assert_eq!(
        u16::from_be_bytes(r.sense.unwrap()[16..18].try_into().unwrap()),
        7
    );
    // Unknown page, wrong block length, short header, saving.
    let mut unknown = vec![0, 0, 0, 0, 0x19, 2, 0, 0];
    assert_sense(
        &exec(&lu, &[0x15, 0x10, 0, 0, 8, 0], &unknown),
        0x05,
        0x26,
        0x00,
    );
    unknown.truncate(4);
    let wrong_bs = [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x10, 0x00];
    assert_sense(
        &exec(&lu, &[0x15, 0x10, 0, 0, 12, 0], &wrong_bs),
        0x05,
        0x26,
        0x00,
    );
    assert_sense(
        &exec(&lu, &[0x15, 0x10, 0, 0, 2, 0], &[0, 0]),
        0x05,
        0x1a,
        0x00,
    );
    assert_invalid_cdb(
        &exec(&lu, &[0x15, 0x11, 0, 0, list.len() as u8, 0], &list),
        1,
    );
    // Disable the write cache.
    let ms = good(&mode_sense6(&lu, N, 0x08, 255)).to_vec();
    let mut caching = find_page(&ms, 12, 0x08).unwrap();
    caching[2] &= !0x04;
    let mut l = vec![0, 0, 0, 0];
    l.extend(&caching);
    good(&exec(&lu, &[0x15, 0x10, 0, 0, l.len() as u8, 0], &l));
    let ms = good(&mode_sense6(&lu, N, 0x08, 255)).to_vec();
    assert_eq!(find_page(&ms, 12, 0x08).unwrap()[2] & 0x04, 0);
    good(&exec(&lu, &write10(0, 1), &fill(1, 1)));
    // A reset restores the defaults.
    lu.reset();
    exec(&lu, &[0, 0, 0, 0, 0, 0], &[]);
    let ms = good(&mode_sense6(&lu, N, 0x08, 255)).to_vec();
    assert_eq!(find_page(&ms, 12, 0x08).unwrap()[2] & 0x04, 0x04);
}

#[test]
fn removable_medium() {
    let lu = lu_with(LuConfig {
        removable: true,
        ..LuConfig::default()
    });
    let ssu = |loej_start: u8| [0x1b, 0, 0, 0, loej_start, 0];
    // Stop without eject keeps the medium usable.
    good(&exec(&lu, &ssu(0x00), &[]));
    good(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    // Eject.
    good(&exec(&lu, &ssu(0x02), &[]));
    assert_sense(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]), 0x02, 0x3a, 0x00);
    assert_sense(&exec(&lu, &read10(0, 1), &[]), 0x02, 0x3a, 0x00);
    assert_sense(
        &exec(&lu, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        0x02,
        0x3a,
        0x00,
    );
    good(&exec(&lu, &[0x12, 0, 0, 0, 36, 0], &[]));
    let s = good(&exec(&lu, &[0x03, 0, 0, 0, 18, 0], &[])).to_vec();
    assert_eq!((s[2], s[12]), (0x02, 0x3a));
    // Load.
    good(&exec(&lu, &ssu(0x03), &[]));
    good(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    // A power condition leaves the medium alone.
    good(&exec(&lu, &[0x1b, 0, 0, 0, 0x12, 0], &[]));
    good(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    // Prevent removal: eject and load refused until allowed by that nexus.
    good(&exec(&lu, &[0x1e, 0, 0, 0, 1, 0], &[]));
    assert_sense(&exec(&lu, &ssu(0x02), &[]), 0x05, 0x53, 0x02);
    good(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    good(&exec(&lu, &[0x1e, 0, 0, 0, 0, 0], &[]));
    good(&exec(&lu, &ssu(0x02), &[]));
    good(&exec(&lu, &ssu(0x03), &[]));
    // Nexus loss releases that nexus's prevention; so does a reset.
    good(&exec(&lu, &[0x1e, 0, 0, 0, 1, 0], &[]));
    lu.nexus_lost(N);
    exec(&lu, &[0, 0, 0, 0, 0, 0], &[]);
    good(&exec(&lu, &ssu(0x02), &[]));
    good(&exec(&lu, &ssu(0x03), &[]));
    good(&exec(&lu, &[0x1e, 0, 0, 0, 1, 0], &[]));
    lu.reset();
    exec(&lu, &[0, 0, 0, 0, 0, 0], &[]);
    good(&exec(&lu, &ssu(0x02), &[]));
    assert_invalid_cdb(&exec(&lu, &[0x1e, 0, 0, 0, 2, 0], &[]), 4);
}

/// A store whose size changes by itself, as an RBD image resized by another client.
#[derive(Debug)]
struct Resizable {
    inner: RamBackstore,
    size: std::sync::atomic::AtomicU64,
}

impl Backstore for Resizable {
    backstore::forward! { inner =>
        read_at, write_at, flush, discard, write_zeroes, is_allocated, supports_discard,
    }
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[test]
fn capacity_change_is_a_unit_attention_on_every_nexus() {
    let store = Arc::new(Resizable {
        inner: RamBackstore::new(BLOCKS * 2 * BS as u64),
        size: (BLOCKS * BS as u64).into(),
    });
    let lu = LogicalUnit::new(LuConfig::default(), store.clone());
    let other = Nexus(2);
    for n in [N, other] {
        assert_sense(&exec_on(&lu, n, &[0; 6], &[]), 0x06, 0x29, 0x00);
    }
    let rc16 = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let last = |r: &Response| u64::from_be_bytes(good(r)[..8].try_into().unwrap());
    assert_eq!(last(&exec(&lu, &rc16, &[])), BLOCKS - 1);
    assert_sense(&exec(&lu, &read10(BLOCKS as u32, 1), &[]), 0x05, 0x21, 0x00);

    store
        .size
        .store(BLOCKS * 2 * BS as u64, std::sync::atomic::Ordering::Release);
    // The first command of each nexus reports it, once; a read of a new block works after.
    assert_sense(&exec(&lu, &read10(BLOCKS as u32, 1), &[]), 0x06, 0x2a, 0x09);
    good(&exec(&lu, &read10(BLOCKS as u32, 1), &[]));
    assert_eq!(last(&exec(&lu, &rc16, &[])), 2 * BLOCKS - 1);
    assert_sense(&exec_on(&lu, other, &rc16, &[]), 0x06, 0x2a, 0x09);
    assert_eq!(last(&exec_on(&lu, other, &rc16, &[])), 2 * BLOCKS - 1);
    assert_eq!(lu.capacity_blocks(), 2 * BLOCKS);

    // Shrunk: reported again, and the blocks past the new end are out of range.
    store
        .size
        .store(BLOCKS / 2 * BS as u64, std::sync::atomic::Ordering::Release);
    let r = exec_on(&lu, other, &[0x03, 0, 0, 0, 252, 0], &[]);
    assert_eq!(
        (good(&r)[2], r.data_in[12], r.data_in[13]),
        (0x06, 0x2a, 0x09)
    );
    assert_sense(&exec(&lu, &[0; 6], &[]), 0x06, 0x2a, 0x09);
    assert_sense(
        &exec(&lu, &read10(BLOCKS as u32 / 2, 1), &[]),
        0x05,
        0x21,
        0x00,
    );
    // The capacity of READ CAPACITY (10) too.
    let r = exec(&lu, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(
        u32::from_be_bytes(good(&r)[..4].try_into().unwrap()) as u64,
        BLOCKS / 2 - 1
    );
}
