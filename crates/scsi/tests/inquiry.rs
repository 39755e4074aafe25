//! What a logical unit says of itself: INQUIRY and its VPD pages, READ CAPACITY, REQUEST
//! SENSE, REPORT SUPPORTED OPERATION CODES, REPORT LUNS, READ DEFECT DATA, READ MEDIA SERIAL NUMBER, REPORT TARGET
//! PORT GROUPS (alone and exported by peers), the physical block exponent, unknown opcodes,
//! the sense builders.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{sense, LogicalUnit, LuConfig, Nexus};

use support::*;

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
fn request_sense_descriptor_format() {
    let lu = lu();
    let s = good(&exec_on(&lu, Nexus(9), &[0x03, 1, 0, 0, 252, 0], &[])).to_vec();
    assert_eq!(&s[..4], &[0x72, 0x06, 0x29, 0x00]);
    assert_eq!(s[7] as usize, s.len() - 8);
    let s = good(&exec_on(&lu, Nexus(9), &[0x03, 0, 0, 0, 8, 0], &[])).to_vec();
    assert_eq!(s.len(), 8);
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
fn sense_builders() {
    assert_eq!(sense::LBA_OUT_OF_RANGE.fixed()[12], 0x21);
    let p = sense::Sense::invalid_field_in_parameter_list(9, None).fixed();
    assert_eq!(p[15], 0x80, "SKSV without C/D for parameter data");
    assert_eq!(p[17], 9);
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
    // A store that keeps no states (a RAM store): the fixed answer, AO_SUP alone, and no
    // SET TARGET PORT GROUPS (a known opcode, an unknown service action).
    assert!(a[4..].chunks(12).all(|d| d[1] == 0x01 && d[5] == 0));
    let stpg = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    assert_invalid_cdb(&exec(&lu, &stpg, &[0, 0, 0, 0, 2, 0, 0, 1]), 1);
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

#[test]
fn read_media_serial_number_answers_none() {
    let lu = lu();
    let rmsn = |alloc: u32| {
        let a = alloc.to_be_bytes();
        [0xab, 0x01, 0, 0, 0, 0, a[0], a[1], a[2], a[3], 0, 0]
    };
    // No serial number: a MEDIA SERIAL NUMBER LENGTH of zero, cut to the allocation length.
    assert_eq!(good(&exec(&lu, &rmsn(64), &[])), &[0, 0, 0, 0]);
    assert_eq!(good(&exec(&lu, &rmsn(2), &[])), &[0, 0]);
    assert!(good(&exec(&lu, &rmsn(0), &[])).is_empty());
    assert_eq!(LogicalUnit::data_out_len(&rmsn(64), 512), Some(0));
    // Another service action of SERVICE ACTION IN (12) is a bad field, not a bad opcode.
    assert_invalid_cdb(
        &exec(&lu, &[0xab, 0x02, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], &[]),
        1,
    );
    // Listed with its usage data.
    let one = good(&exec(
        &lu,
        &[0xa3, 0x0c, 2, 0xab, 0, 0x01, 0, 0, 0, 64, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(one[1] & 0x07, 0x03);
    assert_eq!(
        &one[4..],
        &[0xab, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0]
    );
    // Another nexus's RESERVE does not keep it out (SPC-5 table 70: allowed).
    let other = Nexus(2);
    exec_on(&lu, other, &[0x00, 0, 0, 0, 0, 0], &[]);
    good(&exec_on(&lu, other, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(good(&exec(&lu, &rmsn(4), &[])), &[0, 0, 0, 0]);
    good(&exec_on(&lu, other, &[0x17, 0, 0, 0, 0, 0], &[]));

    // With the medium ejected, there is no serial number to speak of: NOT READY.
    let removable = lu_with(LuConfig {
        removable: true,
        ..LuConfig::default()
    });
    good(&exec(&removable, &[0x1b, 0, 0, 0, 0x02, 0], &[]));
    assert_sense(&exec(&removable, &rmsn(4), &[]), 0x02, 0x3a, 0x00);
}
