use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{sense, Command, Designator, LogicalUnit, LuConfig, Nexus, Reach, Response};

const BS: usize = 512;
const BLOCKS: u64 = 4096;
const N: Nexus = Nexus(1);

fn lu_with(config: LuConfig) -> LogicalUnit {
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(BLOCKS * config.block_size as u64));
    let lu = LogicalUnit::new(config, store);
    // Consume the power-on unit attention of the default nexus.
    let r = exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&r, 0x06, 0x29, 0x00);
    lu
}

fn lu() -> LogicalUnit {
    lu_with(LuConfig::default())
}

fn exec(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Response {
    exec_on(lu, N, cdb, data_out)
}

fn exec_on(lu: &LogicalUnit, nexus: Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
    lu.execute(&Command {
        cdb,
        data_out,
        nexus,
    })
}

#[track_caller]
fn good(r: &Response) -> &[u8] {
    assert_eq!(r.status, 0, "sense {:02x?}", r.sense);
    &r.data_in
}

#[track_caller]
fn assert_sense(r: &Response, key: u8, asc: u8, ascq: u8) {
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
fn assert_invalid_cdb(r: &Response, byte: u16) {
    assert_sense(r, 0x05, 0x24, 0x00);
    let s = r.sense.as_ref().unwrap();
    assert_eq!(s[15] & 0xc0, 0xc0, "SKSV and C/D");
    assert_eq!(u16::from_be_bytes([s[16], s[17]]), byte);
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

fn cdb16(op: u8, lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn cdb12(op: u8, lba: u32, blocks: u32) -> Vec<u8> {
    let mut c = vec![0u8; 12];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn fill(byte: u8, blocks: usize) -> Vec<u8> {
    vec![byte; blocks * BS]
}

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
fn invalid_opcode_and_service_action() {
    let lu = lu();
    assert_sense(&exec(&lu, &[0x04, 0, 0, 0, 0, 0], &[]), 0x05, 0x20, 0x00);
    assert_sense(&exec(&lu, &[0xc0, 0, 0, 0, 0, 0], &[]), 0x05, 0x20, 0x00);
    assert_invalid_cdb(&exec(&lu, &cdb16(0x9e, 0, 0), &[]), 1);
    // A CDB shorter than its opcode's group demands.
    assert_invalid_cdb(&exec(&lu, &[0x28, 0, 0, 0], &[]), 0);
}

#[test]
fn inquiry_standard_and_allocation_length() {
    let lu = lu();
    let d = good(&exec(&lu, &[0x12, 0, 0, 0, 255, 0], &[])).to_vec();
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 0x06);
    assert_eq!(d[3] & 0x1f, 0x12);
    assert_eq!(d[4] as usize, d.len() - 5);
    assert_eq!(d[7] & 0x02, 0x02);
    assert_eq!(&d[8..16], b"RESERVOI");
    assert!(
        d[58..74].chunks(2).any(|v| v == [0x04, 0xc0]),
        "claims SBC-3"
    );
    for alloc in 0..80u8 {
        let r = exec(&lu, &[0x12, 0, 0, 0, alloc, 0], &[]);
        assert_eq!(good(&r), &d[..(alloc as usize).min(d.len())]);
    }
    // 16-bit allocation length.
    assert_eq!(good(&exec(&lu, &[0x12, 0, 0, 0x01, 0xff, 0], &[])), &d[..]);
    assert_invalid_cdb(&exec(&lu, &[0x12, 0x02, 0, 0, 255, 0], &[]), 1);
    assert_invalid_cdb(&exec(&lu, &[0x12, 0, 1, 0, 255, 0], &[]), 2);
    let removable = lu_with(LuConfig {
        removable: true,
        ..LuConfig::default()
    });
    assert_eq!(
        good(&exec(&removable, &[0x12, 0, 0, 0, 36, 0], &[]))[1],
        0x80
    );
}

fn vpd(lu: &LogicalUnit, page: u8) -> Vec<u8> {
    let d = good(&exec(lu, &[0x12, 1, page, 0x10, 0, 0], &[])).to_vec();
    assert_eq!(d[1], page);
    assert_eq!(u16::from_be_bytes([d[2], d[3]]) as usize, d.len() - 4);
    d
}

#[test]
fn inquiry_vpd_pages() {
    let lu = lu_with(LuConfig {
        serial: "SER123".into(),
        naa_id: 0x6001_4050_0000_0042,
        ..LuConfig::default()
    });
    let pages = vpd(&lu, 0x00);
    assert_eq!(&pages[4..], &[0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]);
    for &p in &pages[4..] {
        vpd(&lu, p);
    }
    assert_eq!(&vpd(&lu, 0x80)[4..], b"SER123");
    let id = vpd(&lu, 0x83);
    // NAA designator first: binary, LU association, type 3, 16 bytes for NAA 6.
    assert_eq!(&id[4..8], &[0x01, 0x03, 0x00, 0x10]);
    assert_eq!(&id[8..16], &0x6001_4050_0000_0042u64.to_be_bytes());
    let t10 = &id[24..];
    assert_eq!(&t10[..2], &[0x02, 0x01]);
    assert_eq!(&t10[4..12], b"RESERVOI");
    let bl = vpd(&lu, 0xb0);
    assert_eq!(bl.len(), 64);
    assert_eq!(bl[5], 255, "max compare and write");
    assert_eq!(u32::from_be_bytes(bl[8..12].try_into().unwrap()), 16384);
    assert_ne!(
        u32::from_be_bytes(bl[20..24].try_into().unwrap()),
        0,
        "max unmap"
    );
    assert_ne!(
        u32::from_be_bytes(bl[24..28].try_into().unwrap()),
        0,
        "max unmap descriptors"
    );
    let bc = vpd(&lu, 0xb1);
    assert_eq!(&bc[4..6], &[0x00, 0x01]);
    let lbp = vpd(&lu, 0xb2);
    assert_eq!(lbp[5] & 0xe0, 0xe0);
    assert_eq!(lbp[6] & 0x07, 2);
    assert_invalid_cdb(&exec(&lu, &[0x12, 1, 0x99, 0, 255, 0], &[]), 2);
    // Thick LUN: no provisioning features.
    let thick = lu_with(LuConfig {
        thin: false,
        ..LuConfig::default()
    });
    let lbp = vpd(&thick, 0xb2);
    assert_eq!(lbp[5], 0);
    assert_eq!(
        u32::from_be_bytes(vpd(&thick, 0xb0)[20..24].try_into().unwrap()),
        0
    );
    assert_sense(
        &exec(&thick, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &[0; 24]),
        0x05,
        0x20,
        0x00,
    );
    // WRITE SAME with UNMAP, and SANITIZE BLOCK ERASE, need a thin LU (LBPME).
    let mut ws16 = [0u8; 16];
    ws16[0] = 0x93;
    ws16[1] = 0x08;
    ws16[13] = 1;
    assert_invalid_cdb(&exec(&thick, &ws16, &[0; 512]), 1);
    assert_invalid_cdb(&exec(&thick, &[0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]), 1);
    assert_invalid_cdb(&exec(&thick, &[0x48, 0x03, 0, 0, 0, 0, 0, 0, 0, 0], &[]), 1);
    let mut ws16_plain = ws16;
    ws16_plain[1] = 0;
    good(&exec(&thick, &ws16_plain, &[0; 512]));
}

#[test]
fn read_capacity() {
    let lu = lu();
    let d = good(&exec(&lu, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[])).to_vec();
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()),
        BLOCKS as u32 - 1
    );
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 512);
    let rc16 = |alloc: u32| {
        let mut c = vec![0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        c[10..14].copy_from_slice(&alloc.to_be_bytes());
        c
    };
    let d = good(&exec(&lu, &rc16(32), &[])).to_vec();
    assert_eq!(d.len(), 32);
    assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), BLOCKS - 1);
    assert_eq!(d[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
    for alloc in 0..16 {
        assert_eq!(good(&exec(&lu, &rc16(alloc), &[])), &d[..alloc as usize]);
    }
    // Over 2^32 blocks: READ CAPACITY(10) says "use 16".
    let huge: Arc<dyn Backstore> = Arc::new(RamBackstore::new((1u64 << 33) * 512));
    let big = LogicalUnit::new(LuConfig::default(), huge);
    exec(&big, &[0, 0, 0, 0, 0, 0], &[]);
    let d = good(&exec(&big, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[])).to_vec();
    assert_eq!(&d[0..4], &[0xff; 4]);
    let d = good(&exec(&big, &rc16(32), &[])).to_vec();
    assert_eq!(
        u64::from_be_bytes(d[0..8].try_into().unwrap()),
        (1 << 33) - 1
    );
}

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

#[test]
fn request_sense_descriptor_format() {
    let lu = lu();
    let s = good(&exec_on(&lu, Nexus(9), &[0x03, 1, 0, 0, 252, 0], &[])).to_vec();
    assert_eq!(&s[..4], &[0x72, 0x06, 0x29, 0x00]);
    assert_eq!(s[7] as usize, s.len() - 8);
    let s = good(&exec_on(&lu, Nexus(9), &[0x03, 0, 0, 0, 8, 0], &[])).to_vec();
    assert_eq!(s.len(), 8);
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

#[test]
fn report_supported_opcodes() {
    let lu = lu();
    let all = good(&exec(
        &lu,
        &[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0],
        &[],
    ))
    .to_vec();
    let len = u32::from_be_bytes(all[0..4].try_into().unwrap()) as usize;
    assert_eq!(len, all.len() - 4);
    let descriptors: Vec<&[u8]> = all[4..].chunks(8).collect();
    assert!(descriptors.iter().any(|d| d[0] == 0x28));
    assert!(descriptors
        .iter()
        .any(|d| d[0] == 0x9e && d[3] == 0x10 && d[5] & 1 == 1));
    for d in &descriptors {
        let servactv = d[5] & 1 == 1;
        let sa = u16::from_be_bytes([d[2], d[3]]);
        assert!(servactv || sa == 0);
        let options = if servactv { 2 } else { 1 };
        let mut c = [
            0xa3, 0x0c, options, d[0], d[2], d[3], 0, 0, 0xff, 0xff, 0, 0,
        ];
        let one = good(&exec(&lu, &c, &[])).to_vec();
        assert_eq!(one[1] & 0x07, 0x03);
        let cdb_len = u16::from_be_bytes([one[2], one[3]]) as usize;
        assert_eq!(cdb_len, u16::from_be_bytes([d[6], d[7]]) as usize);
        assert_eq!(one[4], d[0]);
        assert_eq!(one.len(), 4 + cdb_len);
        // The other option for this kind of command is wrong.
        c[2] = if servactv { 1 } else { 2 };
        assert_invalid_cdb(&exec(&lu, &c, &[]), 2);
    }
    // Reading with DPO/FUA advertised in the usage data.
    let one = good(&exec(
        &lu,
        &[0xa3, 0x0c, 1, 0x28, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(one[5] & 0x18, 0x18);
    // Timeouts descriptors with RCTD.
    let rctd = good(&exec(
        &lu,
        &[0xa3, 0x0c, 0x80, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0],
        &[],
    ))
    .to_vec();
    for d in rctd[4..].chunks(20) {
        assert_eq!(d[5] & 0x02, 0x02);
        assert_eq!(u16::from_be_bytes([d[8], d[9]]), 0x0a);
    }
    // An unsupported opcode is reported as such.
    let none = good(&exec(
        &lu,
        &[0xa3, 0x0c, 1, 0x04, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(none[1] & 0x07, 0x01);
}

fn unmap_list(ranges: &[(u64, u32)]) -> Vec<u8> {
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

fn unmap_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    c
}

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

/// A store whose reads take a while, so that a compare and the write after it are far apart.
#[derive(Debug)]
struct SlowReads(RamBackstore);

impl Backstore for SlowReads {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::thread::sleep(std::time::Duration::from_micros(200));
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.write_zeroes(offset, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, u64, bool)>> {
        self.0.is_allocated(offset, len)
    }
    fn supports_discard(&self) -> bool {
        true
    }
}

#[test]
fn compare_and_write_is_atomic() {
    let store: Arc<dyn Backstore> = Arc::new(SlowReads(RamBackstore::new(BLOCKS * BS as u64)));
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
fn read_defect_data_is_empty() {
    let lu = lu();
    let d = good(&exec(&lu, &[0x37, 0, 0x18, 0, 0, 0, 0, 0, 64, 0], &[])).to_vec();
    assert_eq!(d, vec![0, 0x18, 0, 0]);
    let d = good(&exec(
        &lu,
        &[0xb7, 0x0d, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(d, vec![0, 0x0d, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn report_luns_and_missing_lun() {
    let cdb = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = scsi::report_luns(&[0, 1, 300], &cdb);
    let d = good(&r);
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 24);
    assert_eq!(&d[8..16], &[0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&d[16..18], &[0, 1]);
    assert_eq!(&d[24..26], &[0x41, 0x2c]);
    let mut short = cdb;
    short[8] = 0;
    short[9] = 12;
    assert_eq!(good(&scsi::report_luns(&[0, 1, 300], &short)).len(), 12);
    let mut bad = cdb;
    bad[2] = 0x05;
    assert_invalid_cdb(&scsi::report_luns(&[0], &bad), 2);

    let inq = scsi::lun_not_supported(&[0x12, 0, 0, 0, 36, 0]);
    assert_eq!(good(&inq)[0], 0x7f);
    let rs = scsi::lun_not_supported(&[0x03, 0, 0, 0, 18, 0]);
    assert_eq!((good(&rs)[2], good(&rs)[12]), (0x05, 0x25));
    assert_sense(&scsi::lun_not_supported(&read10(0, 1)), 0x05, 0x25, 0x00);
    good(&scsi::lun_not_supported(&cdb));
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
fn sense_builders() {
    assert_eq!(sense::LBA_OUT_OF_RANGE.fixed()[12], 0x21);
    let p = sense::Sense::invalid_field_in_parameter_list(9, None).fixed();
    assert_eq!(p[15], 0x80, "SKSV without C/D for parameter data");
    assert_eq!(p[17], 9);
}

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

#[test]
fn target_port_groups_and_identifiers() {
    let lu = lu_with(LuConfig {
        target_port_group: 3,
        relative_port: 2,
        ..LuConfig::default()
    });
    let std_inq = good(&exec(&lu, &[0x12, 0, 0, 0, 96, 0], &[])).to_vec();
    assert_eq!(std_inq[5] & 0x30, 0x10, "TPGS: implicit ALUA");
    let d = good(&exec(&lu, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[])).to_vec();
    assert_eq!(u32::from_be_bytes(d[0..4].try_into().unwrap()), 12);
    // The whole byte: active/optimized and PREF clear. libiscsi before its fix of the
    // descriptor's bit fields took the high nibble for the state (a PREF gave state 8).
    assert_eq!(d[4], 0x00, "active/optimized, not marked preferred");
    assert_eq!(u16::from_be_bytes([d[6], d[7]]), 3);
    assert_eq!(d[11], 1);
    assert_eq!(u16::from_be_bytes([d[14], d[15]]), 2);
    let ext = good(&exec(&lu, &[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &[])).to_vec();
    assert_eq!(ext[4], 0x10);
    // VPD 83h: relative target port (type 4) and target port group (type 5).
    let v = good(&exec(&lu, &[0x12, 1, 0x83, 1, 0, 0], &[])).to_vec();
    let mut found = Vec::new();
    let mut i = 4;
    while i + 4 <= v.len() {
        let len = v[i + 3] as usize;
        found.push((v[i + 1] & 0x3f, v[i + 4..i + 4 + len].to_vec()));
        i += 4 + len;
    }
    assert!(found.contains(&(0x14, vec![0, 0, 0, 2])));
    assert!(found.contains(&(0x15, vec![0, 0, 0, 3])));
    assert!(found.iter().any(|(t, _)| *t == 0x18));
}

#[test]
fn sanitize_block_erase() {
    let lu = lu();
    good(&exec(&lu, &write10(7, 1), &fill(0x5a, 1)));
    let mut s = [0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0];
    good(&exec(&lu, &s, &[]));
    assert_eq!(good(&exec(&lu, &read10(7, 1), &[])), &fill(0, 1)[..]);
    // Reserved bits and bytes, parameter data and unknown service actions.
    s[1] = 0x42;
    assert_invalid_cdb(&exec(&lu, &s, &[]), 1);
    s[1] = 0x02;
    s[4] = 1;
    assert_invalid_cdb(&exec(&lu, &s, &[]), 4);
    s[4] = 0;
    s[8] = 8;
    assert_invalid_cdb(&exec(&lu, &s, &[0; 8]), 7);
    s[8] = 0;
    s[1] = 0x05; // no such service action
    assert_invalid_cdb(&exec(&lu, &s, &[]), 1);
    s[1] = 0x01; // OVERWRITE needs its parameter list
    assert_invalid_cdb(&exec(&lu, &s, &[]), 7);
    s[1] = 0x1f;
    good(&exec(&lu, &s, &[]));
    let ro = lu_with(LuConfig {
        read_only: true,
        ..LuConfig::default()
    });
    assert_sense(
        &exec(&ro, &[0x48, 0x03, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        0x07,
        0x27,
        0x00,
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

fn sanitize_overwrite(len: u16) -> [u8; 10] {
    let mut s = [0x48, 0x01, 0, 0, 0, 0, 0, 0, 0, 0];
    s[7..9].copy_from_slice(&len.to_be_bytes());
    s
}

#[test]
fn sanitize_overwrite_writes_the_pattern_everywhere() {
    let lu = lu();
    good(&exec(&lu, &write10(7, 1), &fill(0x5a, 1)));
    // One pass of a two-byte pattern.
    let p = [0x01, 0, 0, 2, 0xab, 0xcd];
    good(&exec(&lu, &sanitize_overwrite(6), &p));
    let want: Vec<u8> = [0xab, 0xcd].repeat(BS / 2);
    for lba in [0, 7, BLOCKS as u32 - 1] {
        assert_eq!(good(&exec(&lu, &read10(lba, 1), &[])), &want[..]);
    }
    // INVERT with two passes leaves the inverted pattern.
    let p = [0x82, 0, 0, 1, 0x0f];
    good(&exec(&lu, &sanitize_overwrite(5), &p));
    assert_eq!(good(&exec(&lu, &read10(3, 1), &[])), &[0xf0; BS][..]);
    // A whole block of pattern.
    let mut p = vec![0x01, 0, 0x02, 0x00];
    p.extend(fill(0x11, 1));
    good(&exec(&lu, &sanitize_overwrite(BS as u16 + 4), &p));
    assert_eq!(good(&exec(&lu, &read10(9, 1), &[])), &fill(0x11, 1)[..]);
}

#[test]
fn sanitize_overwrite_refuses_bad_parameters() {
    let lu = lu();
    let mut p = vec![0x01, 0, 0x02, 0x00];
    p.extend(fill(0xaa, 1));
    for len in [0u16, 4, BS as u16 + 5] {
        assert_invalid_cdb(&exec(&lu, &sanitize_overwrite(len), &p), 7);
    }
    let invalid_parameter = |p: &[u8]| {
        let r = exec(&lu, &sanitize_overwrite(p.len() as u16), p);
        assert_sense(&r, 0x05, 0x26, 0x00);
    };
    invalid_parameter(&[0x00, 0, 0, 1, 0xaa]); // no passes
    invalid_parameter(&[0x01, 0, 0, 0, 0xaa]); // empty pattern
    invalid_parameter(&[0x01, 0, 0, 2, 0xaa]); // longer than the list
    invalid_parameter(&[0x21, 0, 0, 1, 0xaa]); // TEST
    let mut long = vec![0x01, 0, 0x02, 0x04];
    long.extend(fill(0, 1));
    invalid_parameter(&long); // pattern longer than a block
                              // Too little data for the length in the CDB.
    assert_sense(
        &exec(&lu, &sanitize_overwrite(8), &[0x01, 0, 0, 4]),
        0x05,
        0x0e,
        0x03,
    );
    let ro = lu_with(LuConfig {
        read_only: true,
        ..LuConfig::default()
    });
    assert_sense(
        &exec(&ro, &sanitize_overwrite(5), &[0x01, 0, 0, 1, 0xaa]),
        0x07,
        0x27,
        0x00,
    );
    // Reported with its service action.
    let rsoc = [0xa3, 0x0c, 0x02, 0x48, 0, 0x01, 0, 0, 0, 64, 0, 0];
    assert_eq!(good(&exec(&lu, &rsoc, &[]))[1] & 0x07, 0x03);
}

#[test]
fn physical_block_exponent_is_reported() {
    let lu = lu_with(LuConfig {
        physical_block_exponent: 3,
        ..LuConfig::default()
    });
    let rc = good(&exec(
        &lu,
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(rc[13] & 0x0f, 3);
    assert_eq!(
        u16::from_be_bytes([rc[14], rc[15]]) & 0x3fff,
        0,
        "aligned at LBA 0"
    );
    let bl = good(&exec(&lu, &[0x12, 1, 0xb0, 0, 64, 0], &[])).to_vec();
    // OPTIMAL TRANSFER LENGTH GRANULARITY and OPTIMAL UNMAP GRANULARITY: a physical block.
    assert_eq!(u16::from_be_bytes([bl[6], bl[7]]), 8);
    assert_eq!(u32::from_be_bytes([bl[28], bl[29], bl[30], bl[31]]), 8);
    let one = lu_with(LuConfig::default());
    let rc = good(&exec(
        &one,
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(rc[13] & 0x0f, 0);
}

/// The NAA designator of a logical unit, from VPD page 83h.
fn naa_of(lu: &LogicalUnit) -> Vec<u8> {
    let v = good(&exec(lu, &[0x12, 1, 0x83, 1, 0, 0], &[])).to_vec();
    let mut i = 4;
    while i + 4 <= v.len() {
        let len = v[i + 3] as usize;
        if v[i + 1] & 0x0f == 3 {
            return v[i + 4..i + 4 + len].to_vec();
        }
        i += 4 + len;
    }
    panic!("no NAA designator");
}

fn cscd(naa: &[u8], block_size: u32) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xe4;
    d[4] = 0x01;
    d[5] = 0x03;
    d[7] = naa.len() as u8;
    d[8..8 + naa.len()].copy_from_slice(naa);
    d[29..32].copy_from_slice(&block_size.to_be_bytes()[1..]);
    d
}

fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut d = vec![0u8; 28];
    d[0] = 0x02;
    d[3] = 24;
    d[4..6].copy_from_slice(&src.to_be_bytes());
    d[6..8].copy_from_slice(&dst.to_be_bytes());
    d[10..12].copy_from_slice(&blocks.to_be_bytes());
    d[12..20].copy_from_slice(&src_lba.to_be_bytes());
    d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    d
}

fn copy_list(list_id: u8, usage: u8, cscds: &[Vec<u8>], segments: &[Vec<u8>]) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    let cl: usize = cscds.iter().map(Vec::len).sum();
    let sl: usize = segments.iter().map(Vec::len).sum();
    p[2..4].copy_from_slice(&(cl as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(sl as u32).to_be_bytes());
    cscds.iter().chain(segments).for_each(|d| p.extend(d));
    p
}

fn xcopy_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn xcopy(lu: &LogicalUnit, p: &[u8]) -> Response {
    exec(lu, &xcopy_cdb(p.len()), p)
}

/// EXTENDED COPY from a nexus that reaches the logical units `reach` finds.
fn xcopy_via(lu: &LogicalUnit, reach: &dyn Reach, p: &[u8]) -> Response {
    lu.execute_abortable(
        &Command {
            cdb: &xcopy_cdb(p.len()),
            data_out: p,
            nexus: N,
        },
        reach,
        &|| false,
    )
}

fn receive_copy_results(sa: u8, list_id: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

#[test]
fn extended_copy_within_one_logical_unit() {
    let lu = lu();
    let me = cscd(&naa_of(&lu), 512);
    let data: Vec<u8> = (0..8 * BS).map(|i| (i / 7) as u8).collect();
    good(&exec(&lu, &write10(10, 8), &data));
    let p = copy_list(
        1,
        0,
        std::slice::from_ref(&me),
        &[segment(0, 0, 8, 10, 1000)],
    );
    assert_eq!(
        LogicalUnit::data_out_len(&xcopy_cdb(p.len()), 512),
        Some(p.len() as u32)
    );
    good(&xcopy(&lu, &p));
    assert_eq!(good(&exec(&lu, &read10(1000, 8), &[])), &data[..]);

    // Status held for list 1, reported once.
    let st = good(&exec(&lu, &receive_copy_results(0, 1), &[])).to_vec();
    assert_eq!(st.len(), 12);
    assert_eq!((st[4], u16::from_be_bytes([st[5], st[6]])), (1, 1));
    assert_eq!(u32::from_be_bytes([st[8], st[9], st[10], st[11]]), 8 * 512);
    assert_invalid_cdb(&exec(&lu, &receive_copy_results(0, 1), &[]), 2);
    // LIST ID USAGE 11b: nothing kept.
    good(&xcopy(
        &lu,
        &copy_list(2, 3, std::slice::from_ref(&me), &[segment(0, 0, 1, 0, 1)]),
    ));
    assert_invalid_cdb(&exec(&lu, &receive_copy_results(0, 2), &[]), 2);

    // Overlapping ranges, destination above the source: copied as if read first.
    let src: Vec<u8> = (0..4096 * BS).map(|i| (i % 251) as u8).collect();
    let lu2 = lu_with(LuConfig::default());
    let me2 = cscd(&naa_of(&lu2), 512);
    for (lba, chunk) in src.chunks(256 * BS).enumerate() {
        good(&exec(&lu2, &write10(256 * lba as u32, 256), chunk));
    }
    good(&xcopy(
        &lu2,
        &copy_list(4, 3, &[me2], &[segment(0, 0, 3000, 0, 1000)]),
    ));
    for (i, want) in src[..3000 * BS].chunks(256 * BS).enumerate() {
        let got = good(&exec(
            &lu2,
            &read10(1000 + 256 * i as u32, (want.len() / BS) as u16),
            &[],
        ))
        .to_vec();
        assert_eq!(got, want, "block {}", 1000 + 256 * i);
    }
    // An empty parameter list copies nothing.
    good(&exec(&lu, &xcopy_cdb(0), &[]));
}

#[derive(Debug)]
struct Peers(Vec<Arc<LogicalUnit>>);

impl Reach for Peers {
    fn find(&self, d: &Designator) -> Option<Arc<LogicalUnit>> {
        self.0.iter().find(|lu| lu.has_designator(d)).cloned()
    }

    fn admits(&self, _: &str, _: &LogicalUnit) -> bool {
        true
    }
}

fn peer_config(naa: u64) -> LuConfig {
    LuConfig {
        naa_id: naa,
        device_id: format!("lu-{naa:x}"),
        ..LuConfig::default()
    }
}

#[test]
fn extended_copy_between_logical_units() {
    let a = Arc::new(lu_with(peer_config(0x6000_0000_0000_00a1)));
    let b = Arc::new(lu_with(peer_config(0x6000_0000_0000_00b2)));
    let ro = Arc::new(lu_with(LuConfig {
        read_only: true,
        ..peer_config(0x6000_0000_0000_00c3)
    }));
    let (da, db, dro) = (naa_of(&a), naa_of(&b), naa_of(&ro));
    let peers = Peers(vec![a.clone(), b.clone(), ro.clone()]);
    let list = copy_list(
        1,
        3,
        &[cscd(&da, 512), cscd(&db, 512)],
        &[segment(0, 1, 4, 0, 100)],
    );
    // Without a way to the other logical units, b cannot be reached.
    assert_sense(&xcopy(&a, &list), 0x0a, 0x08, 0x04);
    let xcopy = |lu: &LogicalUnit, p: &[u8]| xcopy_via(lu, &peers, p);
    good(&exec(&a, &write10(0, 4), &fill(0x77, 4)));
    good(&xcopy(&a, &list));
    assert_eq!(good(&exec(&b, &read10(100, 4), &[])), &fill(0x77, 4)[..]);
    // Sent to b, copying b to a.
    let back = copy_list(
        1,
        3,
        &[cscd(&db, 512), cscd(&da, 512)],
        &[segment(0, 1, 4, 100, 50)],
    );
    good(&xcopy(&b, &back));
    assert_eq!(good(&exec(&a, &read10(50, 4), &[])), &fill(0x77, 4)[..]);
    // A write-protected destination aborts the copy, pointing at the segment.
    let to_ro = copy_list(
        1,
        3,
        &[cscd(&da, 512), cscd(&dro, 512)],
        &[segment(0, 1, 4, 0, 0)],
    );
    let r = xcopy(&a, &to_ro);
    assert_sense(&r, 0x0a, 0x00, 0x00);
    let s = r.sense.unwrap();
    assert_eq!((s[15], u16::from_be_bytes([s[16], s[17]])), (0x80, 16 + 64));
    // A wrong block length in the CSCD descriptor, an unknown designator.
    let wrong = copy_list(1, 3, &[cscd(&da, 4096)], &[segment(0, 0, 1, 0, 1)]);
    assert_sense(&xcopy(&a, &wrong), 0x0a, 0x0d, 0x03);
    let unknown = copy_list(1, 3, &[cscd(&[0x60; 16], 512)], &[segment(0, 0, 1, 0, 1)]);
    assert_sense(&xcopy(&a, &unknown), 0x0a, 0x08, 0x04);
}

#[test]
fn extended_copy_refuses_bad_lists() {
    let lu = lu();
    let me = cscd(&naa_of(&lu), 512);
    // A segment naming a CSCD that is not in the list, one beyond the end of the medium.
    let r = xcopy(
        &lu,
        &copy_list(1, 0, std::slice::from_ref(&me), &[segment(0, 1, 8, 0, 8)]),
    );
    assert_sense(&r, 0x0a, 0x0d, 0x02);
    let r = xcopy(
        &lu,
        &copy_list(
            1,
            0,
            std::slice::from_ref(&me),
            &[segment(0, 0, 8, 0, BLOCKS - 1)],
        ),
    );
    assert_sense(&r, 0x0a, 0x00, 0x00);
    // The failed copy's status is held: completed with errors.
    let st = good(&exec(&lu, &receive_copy_results(0, 1), &[])).to_vec();
    assert_eq!((st[4], st[6]), (2, 0));
    // Truncated lists, too many descriptors, unsupported types.
    let p = copy_list(1, 0, std::slice::from_ref(&me), &[segment(0, 0, 8, 0, 8)]);
    for cut in [47, 75, 10] {
        assert_sense(&exec(&lu, &xcopy_cdb(cut), &p[..cut]), 0x05, 0x1a, 0x00);
    }
    let many = copy_list(1, 0, &vec![me.clone(); 9], &[segment(0, 0, 1, 0, 8)]);
    assert_sense(&xcopy(&lu, &many), 0x05, 0x26, 0x06);
    let many = copy_list(
        1,
        0,
        std::slice::from_ref(&me),
        &vec![segment(0, 0, 1, 0, 8); 65],
    );
    assert_sense(&xcopy(&lu, &many), 0x05, 0x26, 0x08);
    let mut fc = me.clone();
    fc[0] = 0xe0;
    assert_sense(
        &xcopy(&lu, &copy_list(1, 0, &[fc], &[segment(0, 0, 1, 0, 8)])),
        0x05,
        0x26,
        0x07,
    );
    let mut stream = segment(0, 0, 1, 0, 8);
    stream[0] = 0x03;
    assert_sense(
        &xcopy(&lu, &copy_list(1, 0, std::slice::from_ref(&me), &[stream])),
        0x05,
        0x26,
        0x09,
    );
    // Less data than the CDB announces; LID4 is not offered.
    assert_sense(&exec(&lu, &xcopy_cdb(76), &p[..60]), 0x05, 0x0e, 0x03);
    let mut lid4 = xcopy_cdb(p.len());
    lid4[1] = 0x01;
    assert_invalid_cdb(&exec(&lu, &lid4, &p), 1);
    // Random parameter lists never panic.
    let mut seed = 0x1234_5678u64;
    for _ in 0..2000 {
        let mut q = p.clone();
        for _ in 0..4 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (seed >> 33) as usize % q.len();
            q[i] = (seed >> 20) as u8;
        }
        let r = xcopy(&lu, &q);
        assert!(r.status == 0 || r.status == 2);
    }
}

#[test]
fn receive_copy_results_operating_parameters() {
    let lu = lu();
    let d = good(&exec(&lu, &receive_copy_results(3, 0), &[])).to_vec();
    let available = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    assert_eq!(available, d.len() - 4);
    assert!(d.len() >= 44);
    let max_cscd = u16::from_be_bytes([d[8], d[9]]) as usize;
    let max_seg = u16::from_be_bytes([d[10], d[11]]) as usize;
    let max_list = u32::from_be_bytes([d[12], d[13], d[14], d[15]]) as usize;
    // One more descriptor of either kind still fits the list length, so that too many
    // descriptors are told apart from too long a list.
    assert!((max_cscd + 1) * 32 + 28 <= max_list);
    assert!(32 + (max_seg + 1) * 28 <= max_list);
    assert_eq!(&d[44..44 + d[43] as usize], &[0x02, 0xe4]);
    // Other service actions are not offered; the 3PC bit says a copy manager is here.
    assert_invalid_cdb(&exec(&lu, &receive_copy_results(1, 0), &[]), 1);
    let inq = good(&exec(&lu, &[0x12, 0, 0, 0, 96, 0], &[])).to_vec();
    assert_eq!(inq[5] & 0x08, 0x08);
}

/// A RAM store whose erases wait until the test lets them go.
#[derive(Debug)]
struct GatedStore {
    ram: RamBackstore,
    started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Backstore for GatedStore {
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
        self.ram.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.started.lock().unwrap().send(()).unwrap();
        self.go.lock().unwrap().recv().unwrap();
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
}

/// A logical unit whose erases wait: the receiver tells an erase started, the sender lets
/// it go on.
fn gated_lu(
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

/// Copy targets as a nexus's view gives them, masked after `left` lookups: a
/// configuration reload that hides a LU while a copy to or from it runs.
#[derive(Debug)]
struct MaskedAfter {
    peers: Vec<Arc<LogicalUnit>>,
    left: std::sync::atomic::AtomicUsize,
}

impl Reach for MaskedAfter {
    fn find(&self, d: &Designator) -> Option<Arc<LogicalUnit>> {
        use std::sync::atomic::Ordering;
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()?;
        self.peers.iter().find(|lu| lu.has_designator(d)).cloned()
    }

    fn admits(&self, _: &str, _: &LogicalUnit) -> bool {
        true
    }
}

#[test]
fn a_copy_target_masked_while_copying_stops_the_copy() {
    let a = Arc::new(lu_with(peer_config(0x6000_0000_0000_00a1)));
    let b = Arc::new(lu_with(peer_config(0x6000_0000_0000_00b2)));
    // The whole LU, 2 MiB: two pieces of 1 MiB, the view asked before each.
    let blocks = BLOCKS as u16;
    let list = copy_list(
        1,
        0,
        &[cscd(&naa_of(&a), 512), cscd(&naa_of(&b), 512)],
        &[segment(0, 1, blocks, 0, 0)],
    );
    let reach = MaskedAfter {
        peers: vec![b.clone()],
        left: 2.into(),
    };
    // Found once to start, reached for the first piece, masked before the second.
    let r = xcopy_via(&a, &reach, &list);
    assert_sense(&r, 0x0a, 0x0d, 0x02);
    let st = good(&exec(&a, &receive_copy_results(0, 1), &[])).to_vec();
    assert_eq!(st[4], 2, "the copy ended with errors");
    // The same copy with the view unchanged completes.
    let reach = MaskedAfter {
        peers: vec![b.clone()],
        left: usize::MAX.into(),
    };
    good(&xcopy_via(&a, &reach, &list));
}

#[test]
fn a_copy_target_being_sanitized_is_not_reachable() {
    let a = Arc::new(lu_with(peer_config(0x6000_0000_0000_00a1)));
    let (b, started, go) = gated_lu(peer_config(0x6000_0000_0000_00b2));
    assert_sense(&exec(&b, &[0, 0, 0, 0, 0, 0], &[]), 0x06, 0x29, 0x00);
    let peers = Peers(vec![a.clone(), b.clone()]);
    let xcopy = |lu: &LogicalUnit, p: &[u8]| xcopy_via(lu, &peers, p);
    let list = copy_list(
        1,
        3,
        &[cscd(&naa_of(&a), 512), cscd(&naa_of(&b), 512)],
        &[segment(0, 1, 4, 0, 100)],
    );
    let erase = {
        let b = b.clone();
        std::thread::spawn(move || exec(&b, &[0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]))
    };
    started.recv().unwrap();
    assert_sense(&xcopy(&a, &list), 0x0a, 0x0d, 0x02);
    go.send(()).unwrap();
    good(&erase.join().unwrap());
    good(&xcopy(&a, &list));
}

#[test]
fn commands_during_a_sanitize_are_turned_away() {
    let (lu, started, go) = gated_lu(LuConfig::default());
    assert_sense(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]), 0x06, 0x29, 0x00);
    let other = Nexus(2);
    assert_sense(
        &exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]),
        0x06,
        0x29,
        0x00,
    );
    let erase = {
        let lu = lu.clone();
        std::thread::spawn(move || exec(&lu, &[0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]))
    };
    started.recv().unwrap();
    for cdb in [&[0u8, 0, 0, 0, 0, 0][..], &read10(0, 1), &write10(0, 1)] {
        assert_sense(&exec_on(&lu, other, cdb, &fill(1, 1)), 0x02, 0x04, 0x1b);
    }
    good(&exec_on(&lu, other, &[0x12, 0, 0, 0, 36, 0], &[]));
    let rs = good(&exec_on(&lu, other, &[0x03, 0, 0, 0, 18, 0], &[])).to_vec();
    assert_eq!((rs[2] & 0x0f, rs[12], rs[13]), (0x02, 0x04, 0x1b));
    go.send(()).unwrap();
    good(&erase.join().unwrap());
    good(&exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]));
}

/// A store whose size changes by itself, as an RBD image resized by another client.
#[derive(Debug)]
struct Resizable {
    inner: RamBackstore,
    size: std::sync::atomic::AtomicU64,
}

impl Backstore for Resizable {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, u64, bool)>> {
        self.inner.is_allocated(offset, len)
    }
    fn supports_discard(&self) -> bool {
        true
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

/// A logical unit that other targets export too: REPORT TARGET PORT GROUPS lists every
/// group, active/optimized, in the order of their ids whichever target answers; every
/// reservation command is refused as unsupported, and REPORT SUPPORTED OPERATION CODES
/// leaves them out.
#[test]
fn peer_port_groups_listed_and_reservations_refused() {
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    let answer = |own: u16, peers: Vec<u16>| {
        let lu = lu_with(LuConfig {
            target_port_group: own,
            relative_port: own,
            peer_port_groups: peers,
            ..LuConfig::default()
        });
        (good(&exec(&lu, &rtpg, &[])).to_vec(), lu)
    };
    let (a, lu) = answer(1, vec![2]);
    let (b, _) = answer(2, vec![1]);
    assert_eq!(a, b, "both targets answer alike");
    assert_eq!(u32::from_be_bytes(a[..4].try_into().unwrap()), 24);
    for (i, g) in [1u16, 2].iter().enumerate() {
        let d = &a[4 + 12 * i..16 + 12 * i];
        assert_eq!(d[0] & 0x0f, 0, "group {g} active/optimized");
        assert_eq!(u16::from_be_bytes([d[2], d[3]]), *g);
        assert_eq!(d[7], 1, "one port");
        assert_eq!(u16::from_be_bytes([d[10], d[11]]), *g, "relative port");
    }
    // TPGS: implicit ALUA.
    let inq = exec(&lu, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(good(&inq)[5] & 0x30, 0x10);
    // Reservations: every service action, SPC-2 too.
    let prin = [0x5e, 0x00, 0, 0, 0, 0, 0, 0x10, 0, 0];
    let prout = [0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0];
    for cdb in [
        &prin[..],
        &[0x5e, 0x01, 0, 0, 0, 0, 0, 0x10, 0, 0],
        &prout,
        &[0x16, 0, 0, 0, 0, 0],
        &[0x17, 0, 0, 0, 0, 0],
        &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ] {
        assert_sense(&exec(&lu, cdb, &[0u8; 24]), 0x05, 0x20, 0x00);
    }
    // One command asked of REPORT SUPPORTED OPERATION CODES: not supported (001b).
    let r = exec(&lu, &[0xa3, 0x0c, 0x02, 0x5f, 0, 0, 0, 0, 0, 64, 0, 0], &[]);
    assert_eq!(good(&r)[1] & 0x07, 0x01);
    let all = exec(&lu, &[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0], &[]);
    let list = &good(&all)[4..];
    assert!(
        list.chunks(8)
            .all(|d| ![0x5e, 0x5f, 0x16, 0x17, 0x56, 0x57].contains(&d[0])),
        "reservation commands listed"
    );
    // Alone, the same LU keeps them.
    let (_, alone) = answer(1, vec![]);
    good(&exec(&alone, &prin, &[]));
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

/// SANITIZE runs in the background (SBC-4 4.11): with IMMED the command answers at once
/// and the LU answers NOT READY, SANITIZE IN PROGRESS with a progress indication until it
/// ends; a second SANITIZE is turned away; an aborted waiter leaves it running.
#[test]
fn sanitize_runs_on_after_immed_and_abort() {
    // 4 MiB at 4 MiB/s: about a second.
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(4 << 20));
    let lu = Arc::new(LogicalUnit::new(
        LuConfig {
            sanitize_rate: Some(4 << 20),
            ..LuConfig::default()
        },
        store,
    ));
    exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    good(&exec(&lu, &write10(9, 1), &fill(0x77, 1)));
    let mut p = vec![0x01, 0, 0, 1, 0xee];
    let mut s = sanitize_overwrite(p.len() as u16);
    s[1] |= 0x80; // IMMED
    let started = std::time::Instant::now();
    good(&exec(&lu, &s, &p));
    let tur = exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&tur, 0x02, 0x04, 0x1b);
    assert_eq!(tur.sense.as_ref().unwrap()[15], 0x80, "progress indication");
    assert_sense(&exec(&lu, &read10(0, 1), &[]), 0x02, 0x04, 0x1b);
    good(&exec(&lu, &[0x12, 0, 0, 0, 36, 0], &[]));
    assert_sense(&exec(&lu, &s, &p), 0x02, 0x04, 0x1b);
    // A waiting SANITIZE that is aborted stops waiting; the first operation goes on.
    s[1] &= !0x80;
    while lu_busy(&lu) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(good(&exec(&lu, &read10(9, 1), &[])), &fill(0xee, 1)[..]);
    p[4] = 0x11;
    let r = lu.execute_abortable(
        &Command {
            cdb: &s,
            data_out: &p,
            nexus: N,
        },
        &scsi::OnlyItself,
        &|| true,
    );
    assert_sense(&r, 0x02, 0x04, 0x1b);
    assert!(lu_busy(&lu), "the operation outlives its aborted command");
    while lu_busy(&lu) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(good(&exec(&lu, &read10(9, 1), &[])), &fill(0x11, 1)[..]);
}

fn lu_busy(lu: &LogicalUnit) -> bool {
    exec(lu, &[0x00, 0, 0, 0, 0, 0], &[]).status != 0
}

/// A store whose reads fail: a medium the default self-test must find broken.
#[derive(Debug)]
struct FailingReads(RamBackstore);

impl Backstore for FailingReads {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other("the medium fails"))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.write_zeroes(offset, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, u64, bool)>> {
        self.0.is_allocated(offset, len)
    }
    fn supports_discard(&self) -> bool {
        true
    }
}

#[test]
fn send_diagnostic_runs_the_default_self_test() {
    let lu = lu();
    let self_test = [0x1d, 0x04, 0, 0, 0, 0];
    good(&exec(&lu, &self_test, &[]));
    // With PF, DEVOFFL and UNITOFFL set too, as smartctl and sg_senddiag send it.
    good(&exec(&lu, &[0x1d, 0x17, 0, 0, 0, 0], &[]));
    // PF, SELFTEST and PARAMETER LIST LENGTH zero: no test, no error.
    good(&exec(&lu, &[0x1d, 0, 0, 0, 0, 0], &[]));
    assert_eq!(LogicalUnit::data_out_len(&self_test, 512), Some(0));
    // The short and extended self-tests report in a log page there is none of.
    for code in 1..8u8 {
        assert_invalid_cdb(&exec(&lu, &[0x1d, code << 5, 0, 0, 0, 0], &[]), 1);
    }
    // The default self-test takes no parameter list.
    assert_invalid_cdb(&exec(&lu, &[0x1d, 0x04, 0, 0, 4, 0], &[0; 4]), 3);
    // A diagnostic page: none is supported, and the initiator sends it first.
    let page = [0x1d, 0x10, 0, 0, 8, 0];
    assert_eq!(LogicalUnit::data_out_len(&page, 512), Some(8));
    assert_sense(
        &exec(&lu, &page, &[0x80, 0, 0, 4, 0, 0, 0, 0]),
        0x05,
        0x26,
        0x00,
    );
    // Listed with its usage data.
    let one = good(&exec(
        &lu,
        &[0xa3, 0x0c, 1, 0x1d, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(one[1] & 0x07, 0x03);
    assert_eq!(&one[4..], &[0x1d, 0xf7, 0, 0xff, 0xff, 0]);
    // Another nexus's RESERVE keeps it out, as any command that may disturb the medium.
    let other = Nexus(2);
    exec_on(&lu, other, &[0x00, 0, 0, 0, 0, 0], &[]);
    good(&exec_on(&lu, other, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(exec(&lu, &self_test, &[]).status, 0x18);
    good(&exec_on(&lu, other, &[0x17, 0, 0, 0, 0, 0], &[]));

    // A medium whose reads fail fails the self-test.
    let store: Arc<dyn Backstore> = Arc::new(FailingReads(RamBackstore::new(BLOCKS * BS as u64)));
    let broken = LogicalUnit::new(LuConfig::default(), store);
    exec(&broken, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&exec(&broken, &self_test, &[]), 0x04, 0x3e, 0x03);
    good(&exec(&broken, &[0x1d, 0, 0, 0, 0, 0], &[]));
}
