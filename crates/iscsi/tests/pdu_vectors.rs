//! Byte-exact vectors: hand-assembled PDUs checked against the RFC 7143 section 11 field
//! layout, and the CRC32C examples of RFC 3720 Appendix B.4.

use bytes::Bytes;
use iscsi::digest::{crc32c, to_wire};
use iscsi::pdu::*;

fn encode(pdu: &Pdu, digests: Digests) -> Vec<u8> {
    let mut out = Vec::new();
    pdu.encode(&mut out, digests);
    out
}

fn decode(wire: &[u8]) -> Pdu {
    let bhs: &[u8; BHS_LEN] = wire[..BHS_LEN].try_into().unwrap();
    let len = data_segment_len(bhs);
    Pdu::decode(bhs, &[], Bytes::copy_from_slice(&wire[48..48 + len])).unwrap()
}

#[test]
fn rfc3720_b4_crc_vectors() {
    assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    let ascending: Vec<u8> = (0..32).collect();
    assert_eq!(crc32c(&ascending), 0x46dd_794e);
    let descending: Vec<u8> = (0..32).rev().collect();
    assert_eq!(crc32c(&descending), 0x113f_db5c);
    // The appendix prints the digests as they appear on the wire.
    assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
    assert_eq!(to_wire(crc32c(&[0xffu8; 32])), [0x43, 0xab, 0xa8, 0x62]);
}

/// The iSCSI Read PDU of RFC 3720 B.4, as a header digest: wire bytes 56 3a 96 d9.
const B4_READ_PDU: [u8; 48] = [
    0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
    0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

#[test]
fn rfc3720_b4_read_pdu() {
    assert_eq!(to_wire(crc32c(&B4_READ_PDU)), [0x56, 0x3a, 0x96, 0xd9]);

    let Pdu::ScsiCommand(cmd) = decode(&B4_READ_PDU) else {
        panic!("not a SCSI Command")
    };
    assert!(!cmd.immediate && cmd.final_ && cmd.read && !cmd.write);
    assert_eq!(cmd.attr, 0);
    assert_eq!(cmd.lun, 0);
    assert_eq!(cmd.itt, 0x1400_0000);
    assert_eq!(cmd.edtl, 1024);
    assert_eq!(cmd.cmdsn, 0x14);
    assert_eq!(cmd.expstatsn, 0x18);
    assert_eq!(cmd.cdb[..10], [0x28, 0, 0, 0, 0, 0, 0, 0, 2, 0]);

    let digests = Digests {
        header: true,
        data: true,
    };
    let wire = encode(&Pdu::ScsiCommand(cmd), digests);
    assert_eq!(wire[..48], B4_READ_PDU);
    assert_eq!(wire[48..], [0x56, 0x3a, 0x96, 0xd9]);
}

#[test]
fn login_request_layout() {
    let text = b"InitiatorName=iqn.2024-01.org.example:host\0SessionType=Normal\0";
    assert_eq!(text.len(), 62);
    let pdu = Pdu::LoginRequest(LoginRequest {
        transit: true,
        cont: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0x12, 0x34, 0x56, 0x00, 0x01],
        tsih: 0,
        itt: 0x0000_0001,
        cid: 0x0002,
        cmdsn: 0x0000_0010,
        expstatsn: 0x0000_0005,
        data: Bytes::from_static(text),
    });
    #[rustfmt::skip]
    let header: [u8; 48] = [
        0x43, 0x87, 0x00, 0x00, // I=1 opcode 0x03 | T=1 C=0 CSG=1 NSG=3 | Version-max | -min
        0x00, 0x00, 0x00, 62,   // TotalAHSLength | DataSegmentLength
        0x80, 0x12, 0x34, 0x56, // ISID
        0x00, 0x01, 0x00, 0x00, // ISID (cont.) | TSIH
        0x00, 0x00, 0x00, 0x01, // ITT
        0x00, 0x02, 0x00, 0x00, // CID | reserved
        0x00, 0x00, 0x00, 0x10, // CmdSN
        0x00, 0x00, 0x00, 0x05, // ExpStatSN
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
    ];
    let wire = encode(&pdu, Digests::default());
    assert_eq!(wire[..48], header);
    assert_eq!(&wire[48..110], text);
    assert_eq!(wire[110..], [0, 0], "padded to 64 bytes of data");
    assert_eq!(decode(&wire), pdu);
}

#[test]
fn scsi_command_read10_layout() {
    let read10 = [0x28, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x08, 0x00];
    let mut cdb = read10.to_vec();
    cdb.resize(16, 0);
    let pdu = Pdu::ScsiCommand(ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: 1,
        lun: lun_to_wire(1),
        itt: 0x1122_3344,
        edtl: 4096,
        cmdsn: 0x20,
        expstatsn: 0x07,
        cdb,
        bidi_read_length: None,
        data: Bytes::new(),
    });
    #[rustfmt::skip]
    let header: [u8; 48] = [
        0x01, 0xc1, 0x00, 0x00, // opcode | F=1 R=1 W=0 ATTR=SIMPLE | reserved
        0x00, 0x00, 0x00, 0x00, // TotalAHSLength | DataSegmentLength
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // LUN 1
        0x11, 0x22, 0x33, 0x44, // ITT
        0x00, 0x00, 0x10, 0x00, // Expected Data Transfer Length
        0x00, 0x00, 0x00, 0x20, // CmdSN
        0x00, 0x00, 0x00, 0x07, // ExpStatSN
        0x28, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x08, 0x00, 0, 0, 0, 0, 0, 0, // CDB
    ];
    let wire = encode(&pdu, Digests::default());
    assert_eq!(wire, header);
    assert_eq!(decode(&wire), pdu);

    let with_digest = encode(
        &pdu,
        Digests {
            header: true,
            data: true,
        },
    );
    assert_eq!(with_digest[..48], header);
    assert_eq!(with_digest[48..], to_wire(crc32c(&header)));
    assert_eq!(with_digest.len(), 52, "no data digest without data");
}

#[test]
fn nop_in_layout() {
    let pdu = Pdu::NopIn(NopIn {
        lun: 0,
        itt: RESERVED_TAG,
        ttt: 0x0000_abcd,
        statsn: 0x10,
        expcmdsn: 0x21,
        maxcmdsn: 0x40,
        data: Bytes::from_static(b"ping!"),
    });
    #[rustfmt::skip]
    let header: [u8; 48] = [
        0x20, 0x80, 0x00, 0x00, // opcode | F=1 | reserved
        0x00, 0x00, 0x00, 0x05, // TotalAHSLength | DataSegmentLength
        0, 0, 0, 0, 0, 0, 0, 0, // LUN
        0xff, 0xff, 0xff, 0xff, // ITT
        0x00, 0x00, 0xab, 0xcd, // TTT
        0x00, 0x00, 0x00, 0x10, // StatSN
        0x00, 0x00, 0x00, 0x21, // ExpCmdSN
        0x00, 0x00, 0x00, 0x40, // MaxCmdSN
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
    ];
    let digests = Digests {
        header: true,
        data: true,
    };
    let wire = encode(&pdu, digests);
    assert_eq!(wire[..48], header);
    assert_eq!(wire[48..52], to_wire(crc32c(&header)));
    assert_eq!(&wire[52..57], b"ping!");
    assert_eq!(wire[57..60], [0, 0, 0]);
    assert_eq!(
        wire[60..],
        to_wire(crc32c(b"ping!\0\0\0")),
        "digest covers padding"
    );
    assert_eq!(decode(&encode(&pdu, Digests::default())), pdu);
}

#[test]
fn data_trailer_bytes() {
    let both = Digests {
        header: true,
        data: true,
    };
    assert_eq!(data_trailer(b"", both), ([0; 7], 0));
    assert_eq!(data_trailer(b"abcd", Digests::default()), ([0; 7], 0));
    let (t, n) = data_trailer(b"abc", Digests::default());
    assert_eq!(&t[..n], &[0]);
    let (t, n) = data_trailer(b"a", both);
    assert_eq!(n, 7);
    assert_eq!(t[..3], [0, 0, 0]);
    assert_eq!(t[3..], to_wire(crc32c(b"a\0\0\0")));
}

#[test]
fn reserved_fields_are_ignored_on_receipt() {
    let mut wire = encode(&Pdu::NopIn(NopIn::default()), Digests::default());
    wire[0] |= 0xc0; // reserved bits beside the opcode
    wire[1] |= 0x7f;
    wire[2] = 0xaa;
    wire[40] = 0x55;
    assert_eq!(decode(&wire), Pdu::NopIn(NopIn::default()));
}

fn decode_err(wire: &[u8], ahs: &[u8], data: &[u8]) -> PduError {
    let bhs: &[u8; 48] = wire[..48].try_into().unwrap();
    Pdu::decode(bhs, ahs, Bytes::copy_from_slice(data)).unwrap_err()
}

#[test]
fn malformed_headers_are_rejected() {
    let nop = encode(&Pdu::NopOut(NopOut::default()), Digests::default());

    let mut unknown = nop.clone();
    unknown[0] = 0x1c;
    assert_eq!(
        decode_err(&unknown, &[], &[]),
        PduError::UnknownOpcode(0x1c)
    );
    assert_eq!(
        PduError::UnknownOpcode(0x1c).reject_reason(),
        reject_reason::COMMAND_NOT_SUPPORTED
    );

    assert!(matches!(
        decode_err(&nop, &[], b"x"),
        PduError::DataLength {
            expected: 0,
            actual: 1
        }
    ));
    assert!(matches!(
        decode_err(&nop, &[0; 4], &[]),
        PduError::AhsLength {
            expected: 0,
            actual: 4
        }
    ));

    let mut r2t = encode(&Pdu::R2t(R2t::default()), Digests::default());
    r2t[7] = 1;
    assert_eq!(
        decode_err(&r2t, &[], b"x"),
        PduError::UnexpectedData(Opcode::R2t)
    );

    let mut bad_ahs = nop.clone();
    bad_ahs[4] = 2;
    // An Extended CDB AHS on a NOP-Out.
    let ext = [0, 5, 1, 0, 1, 2, 3, 4];
    assert_eq!(
        decode_err(&bad_ahs, &ext, &[]),
        PduError::UnexpectedAhs(Opcode::NopOut)
    );
    // A reserved AHS type.
    assert!(matches!(
        decode_err(&bad_ahs, &[0, 5, 7, 0, 0, 0, 0, 0], &[]),
        PduError::BadAhs(_)
    ));
    // An AHSLength running past TotalAHSLength.
    assert!(matches!(
        decode_err(&bad_ahs, &[0, 9, 60, 0, 0, 0, 0, 0], &[]),
        PduError::BadAhs(_)
    ));
    // A non-iSCSI extension AHS is skipped.
    let bhs: &[u8; 48] = bad_ahs[..48].try_into().unwrap();
    assert!(Pdu::decode(bhs, &[0, 5, 60, 0, 0, 0, 0, 0], Bytes::new()).is_ok());
}

#[test]
fn bad_command_ahs_is_rejected() {
    let mut cmd = encode(
        &Pdu::ScsiCommand(ScsiCommand::default()),
        Digests::default(),
    );
    cmd[4] = 2;
    for ahs in [
        [0, 4, 2, 0, 0, 0, 0, 0], // bidi AHSLength must be 5
        [0, 0, 1, 0, 0, 0, 0, 0], // empty Extended CDB AHS
    ] {
        assert!(matches!(decode_err(&cmd, &ahs, &[]), PduError::BadAhs(_)));
    }
    cmd[4] = 4;
    let twice = [0, 5, 2, 0, 0, 0, 0, 1, 0, 5, 2, 0, 0, 0, 0, 2];
    assert!(matches!(decode_err(&cmd, &twice, &[]), PduError::BadAhs(_)));
}

#[test]
fn contradictory_flags_are_rejected() {
    let cases: [(Pdu, u8); 6] = [
        (ScsiResponse::default().into(), 0x86),  // O and U
        (ScsiResponse::default().into(), 0x98),  // o and u
        (DataIn::default().into(), 0x86),        // O and U
        (DataIn::default().into(), 0x01),        // S without F
        (TextRequest::default().into(), 0xc0),   // F and C
        (LoginResponse::default().into(), 0xc0), // T and C
    ];
    for (pdu, byte1) in cases {
        let mut wire = encode(&pdu, Digests::default());
        wire[1] = byte1;
        let err = decode_err(&wire, &[], &[]);
        assert!(
            matches!(err, PduError::InvalidFlags { opcode, .. } if opcode == pdu.opcode()),
            "{err:?}"
        );
        assert_eq!(err.reject_reason(), reject_reason::INVALID_PDU_FIELD);
    }
}

#[test]
fn reject_carries_the_header() {
    let bad = [0x1cu8; 48];
    let reject = Reject {
        statsn: 3,
        ..Reject::for_header(reject_reason::PROTOCOL_ERROR, &bad)
    };
    let wire = encode(&Pdu::Reject(reject.clone()), Digests::default());
    assert_eq!(wire[0], 0x3f);
    assert_eq!(wire[2], reject_reason::PROTOCOL_ERROR);
    assert_eq!(wire[16..20], [0xff; 4]);
    assert_eq!(wire[48..96], bad);
    assert_eq!(decode(&wire), Pdu::Reject(reject));
}

#[test]
fn async_message_layout() {
    let pdu = Pdu::AsyncMessage(AsyncMessage {
        lun: lun_to_wire(2),
        statsn: 1,
        expcmdsn: 2,
        maxcmdsn: 3,
        async_event: 1,
        async_vcode: 0,
        parameter1: 0x1111,
        parameter2: 0x2222,
        parameter3: 0x3333,
        data: Bytes::new(),
    });
    let wire = encode(&pdu, Digests::default());
    assert_eq!(wire[..2], [0x32, 0x80]);
    assert_eq!(wire[8..10], [0x00, 0x02]);
    assert_eq!(wire[16..20], [0xff; 4]);
    assert_eq!(wire[36..44], [1, 0, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33]);
    assert_eq!(pdu.itt(), RESERVED_TAG);
}
