//! Every PDU type survives encode -> decode unchanged, with and without digests, for data
//! segments of every padding length.

use bytes::Bytes;
use iscsi::pdu::*;
use proptest::prelude::*;

/// Field values from a seed, so that two fields swapped in the codec show up as a
/// difference.
struct Values(u64);

impl Values {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn u64(&mut self) -> u64 {
        self.next()
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    fn u16(&mut self) -> u16 {
        self.next() as u16
    }
    fn u8(&mut self) -> u8 {
        self.next() as u8
    }
    fn bits(&mut self, n: u32) -> u8 {
        (self.next() as u8) & ((1 << n) - 1)
    }
    fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
    fn isid(&mut self) -> [u8; 6] {
        self.u64().to_be_bytes()[..6].try_into().unwrap()
    }
}

/// One PDU of every type with fields drawn from `seed`; PDU types that carry data get
/// `data`.
fn all_pdus(seed: u64, data: Bytes, cdb_len: usize) -> Vec<Pdu> {
    let mut v = Values(seed);
    let v = &mut v;
    let (o, u) = match v.bits(2) {
        0 => (false, false),
        1 => (true, false),
        _ => (false, true),
    };
    let f = v.bool();
    let s = f && v.bool();
    let t = v.bool();
    let c = !t && v.bool();
    let text_f = v.bool();
    let text_c = !text_f && v.bool();
    let mut cdb: Vec<u8> = (0..cdb_len).map(|_| v.u8()).collect();
    if cdb.is_empty() {
        cdb = vec![0; 16];
    }
    vec![
        NopOut {
            immediate: v.bool(),
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            cmdsn: v.u32(),
            expstatsn: v.u32(),
            data: data.clone(),
        }
        .into(),
        ScsiCommand {
            immediate: v.bool(),
            final_: v.bool(),
            read: v.bool(),
            write: v.bool(),
            attr: v.bits(3),
            lun: v.u64(),
            itt: v.u32(),
            edtl: v.u32(),
            cmdsn: v.u32(),
            expstatsn: v.u32(),
            cdb,
            bidi_read_length: v.bool().then(|| v.u32()),
            data: data.clone(),
        }
        .into(),
        TaskMgmtRequest {
            immediate: v.bool(),
            function: v.bits(7),
            lun: v.u64(),
            itt: v.u32(),
            referenced_task_tag: v.u32(),
            cmdsn: v.u32(),
            expstatsn: v.u32(),
            refcmdsn: v.u32(),
            expdatasn: v.u32(),
        }
        .into(),
        LoginRequest {
            transit: t,
            cont: c,
            csg: v.bits(2),
            nsg: v.bits(2),
            version_max: v.u8(),
            version_min: v.u8(),
            isid: v.isid(),
            tsih: v.u16(),
            itt: v.u32(),
            cid: v.u16(),
            cmdsn: v.u32(),
            expstatsn: v.u32(),
            data: data.clone(),
        }
        .into(),
        TextRequest {
            immediate: v.bool(),
            final_: text_f,
            cont: text_c,
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            cmdsn: v.u32(),
            expstatsn: v.u32(),
            data: data.clone(),
        }
        .into(),
        DataOut {
            final_: v.bool(),
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            expstatsn: v.u32(),
            datasn: v.u32(),
            buffer_offset: v.u32(),
            data: data.clone(),
        }
        .into(),
        LogoutRequest {
            immediate: v.bool(),
            reason: v.bits(7),
            itt: v.u32(),
            cid: v.u16(),
            cmdsn: v.u32(),
            expstatsn: v.u32(),
        }
        .into(),
        SnackRequest {
            snack_type: v.bits(4),
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            expstatsn: v.u32(),
            begrun: v.u32(),
            runlength: v.u32(),
        }
        .into(),
        NopIn {
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            data: data.clone(),
        }
        .into(),
        ScsiResponse {
            bidi_overflow: u,
            bidi_underflow: o,
            overflow: o,
            underflow: u,
            response: v.u8(),
            status: v.u8(),
            itt: v.u32(),
            snack_tag: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            expdatasn: v.u32(),
            bidi_read_residual_count: v.u32(),
            residual_count: v.u32(),
            data: data.clone(),
        }
        .into(),
        TaskMgmtResponse {
            response: v.u8(),
            itt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
        }
        .into(),
        LoginResponse {
            transit: t,
            cont: c,
            csg: v.bits(2),
            nsg: v.bits(2),
            version_max: v.u8(),
            version_active: v.u8(),
            isid: v.isid(),
            tsih: v.u16(),
            itt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            status_class: v.u8(),
            status_detail: v.u8(),
            data: data.clone(),
        }
        .into(),
        TextResponse {
            final_: text_f,
            cont: text_c,
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            data: data.clone(),
        }
        .into(),
        DataIn {
            final_: f,
            ack: v.bool(),
            overflow: o,
            underflow: u,
            status_present: s,
            status: v.u8(),
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            datasn: v.u32(),
            buffer_offset: v.u32(),
            residual_count: v.u32(),
            data: data.clone(),
        }
        .into(),
        LogoutResponse {
            response: v.u8(),
            itt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            time2wait: v.u16(),
            time2retain: v.u16(),
        }
        .into(),
        R2t {
            lun: v.u64(),
            itt: v.u32(),
            ttt: v.u32(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            r2tsn: v.u32(),
            buffer_offset: v.u32(),
            desired_data_transfer_length: v.u32(),
        }
        .into(),
        AsyncMessage {
            lun: v.u64(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            async_event: v.u8(),
            async_vcode: v.u8(),
            parameter1: v.u16(),
            parameter2: v.u16(),
            parameter3: v.u16(),
            data: data.clone(),
        }
        .into(),
        Reject {
            reason: v.u8(),
            statsn: v.u32(),
            expcmdsn: v.u32(),
            maxcmdsn: v.u32(),
            datasn: v.u32(),
            data,
        }
        .into(),
    ]
}

const ALL_DIGESTS: [Digests; 4] = [
    Digests {
        header: false,
        data: false,
    },
    Digests {
        header: true,
        data: false,
    },
    Digests {
        header: false,
        data: true,
    },
    Digests {
        header: true,
        data: true,
    },
];

/// Splits one encoded PDU by hand, checking lengths, padding and digests, and decodes it.
fn decode_wire(wire: &[u8], digests: Digests) -> Pdu {
    let bhs: &[u8; BHS_LEN] = wire[..BHS_LEN].try_into().unwrap();
    let ahs_len = total_ahs_len(bhs);
    let data_len = data_segment_len(bhs);
    let mut at = BHS_LEN + ahs_len;
    if digests.header {
        let crc = iscsi::digest::crc32c(&wire[..at]);
        assert_eq!(
            wire[at..at + 4],
            iscsi::digest::to_wire(crc),
            "header digest"
        );
        at += 4;
    }
    let data = &wire[at..at + data_len];
    let padded = data_len + pad_len(data_len);
    assert!(
        wire[at + data_len..at + padded].iter().all(|b| *b == 0),
        "padding is zero"
    );
    let mut end = at + padded;
    if digests.data && data_len > 0 {
        let crc = iscsi::digest::crc32c(&wire[at..end]);
        assert_eq!(
            wire[end..end + 4],
            iscsi::digest::to_wire(crc),
            "data digest"
        );
        end += 4;
    }
    assert_eq!(end, wire.len(), "no trailing bytes");
    Pdu::decode(
        bhs,
        &wire[BHS_LEN..BHS_LEN + ahs_len],
        Bytes::copy_from_slice(data),
    )
    .unwrap()
}

fn check_round_trip(pdu: &Pdu, digests: Digests) {
    let mut wire = Vec::new();
    pdu.encode(&mut wire, digests);
    assert_eq!(
        wire.len() % 4,
        0,
        "{:?}: PDU length is a multiple of 4",
        pdu.opcode()
    );
    assert_eq!(wire.len(), pdu.encoded_len(digests));
    assert_eq!(wire[0] & 0x3f, pdu.opcode() as u8);
    assert_eq!(&decode_wire(&wire, digests), pdu, "{digests:?}");

    let mut split = Vec::new();
    pdu.encode_header(&mut split, digests);
    split.extend_from_slice(pdu.data());
    let (trailer, n) = data_trailer(pdu.data(), digests);
    split.extend_from_slice(&trailer[..n]);
    assert_eq!(split, wire, "encode_header + data + data_trailer == encode");
}

#[test]
fn every_type_round_trips_with_every_padding() {
    let payload: Vec<u8> = (0..=255u8).cycle().take(1031).collect();
    for len in [0, 1, 2, 3, 4, 5, 7, 512, 1031] {
        let data = Bytes::copy_from_slice(&payload[..len]);
        for (seed, cdb_len) in [(1, 16), (2, 32), (3, 17), (4, 260)] {
            let pdus = all_pdus(seed, data.clone(), cdb_len);
            let mut opcodes: Vec<u8> = pdus.iter().map(|p| p.opcode() as u8).collect();
            opcodes.dedup();
            assert_eq!(opcodes.len(), 18);
            for pdu in &pdus {
                for digests in ALL_DIGESTS {
                    check_round_trip(pdu, digests);
                }
            }
        }
    }
}

#[test]
fn types_without_data_segment_encode_none() {
    for pdu in all_pdus(9, Bytes::from_static(b"xyz"), 16) {
        let mut wire = Vec::new();
        pdu.encode(&mut wire, Digests::default());
        let has = !pdu.data().is_empty();
        assert_eq!(has, pdu.opcode().has_data_segment(), "{:?}", pdu.opcode());
        assert_eq!(
            data_segment_len(wire[..48].try_into().unwrap()),
            if has { 3 } else { 0 }
        );
    }
}

#[test]
fn defaults_round_trip() {
    let pdus: Vec<Pdu> = vec![
        NopOut::default().into(),
        ScsiCommand::default().into(),
        TaskMgmtRequest::default().into(),
        LoginRequest::default().into(),
        TextRequest::default().into(),
        DataOut::default().into(),
        LogoutRequest::default().into(),
        SnackRequest::default().into(),
        NopIn::default().into(),
        ScsiResponse::default().into(),
        TaskMgmtResponse::default().into(),
        LoginResponse::default().into(),
        TextResponse::default().into(),
        DataIn::default().into(),
        LogoutResponse::default().into(),
        R2t::default().into(),
        AsyncMessage::default().into(),
        Reject::default().into(),
    ];
    for pdu in &pdus {
        check_round_trip(pdu, Digests::default());
    }
}

#[test]
fn short_cdb_is_zero_padded_to_sixteen() {
    let cmd = ScsiCommand {
        cdb: vec![0x00; 6],
        ..Default::default()
    };
    let mut wire = Vec::new();
    Pdu::from(cmd).encode(&mut wire, Digests::default());
    assert_eq!(wire.len(), 48);
    let Pdu::ScsiCommand(back) = decode_wire(&wire, Digests::default()) else {
        panic!()
    };
    assert_eq!(back.cdb, vec![0; 16]);
}

#[test]
fn extended_cdb_and_bidi_ahs_layout() {
    let cdb: Vec<u8> = (1..=32).collect();
    let cmd = ScsiCommand {
        cdb: cdb.clone(),
        bidi_read_length: Some(0x0102_0304),
        ..Default::default()
    };
    let mut wire = Vec::new();
    Pdu::from(cmd).encode(&mut wire, Digests::default());
    assert_eq!(
        wire[4], 7,
        "TotalAHSLength: 20-byte Extended CDB AHS + 8-byte bidi AHS"
    );
    assert_eq!(&wire[32..48], &cdb[..16]);
    // Extended CDB AHS: AHSLength = CDB length - 15, type 1, reserved, CDB bytes 16..32.
    assert_eq!(&wire[48..52], &[0, 17, 1, 0]);
    assert_eq!(&wire[52..68], &cdb[16..]);
    // Bidirectional read length AHS: AHSLength 5, type 2, reserved, length.
    assert_eq!(&wire[68..76], &[0, 5, 2, 0, 1, 2, 3, 4]);
    assert_eq!(wire.len(), 76);
}

proptest! {
    #[test]
    fn arbitrary_fields_round_trip(
        seed: u64,
        data in proptest::collection::vec(any::<u8>(), 0..70),
        cdb_len in 16usize..80,
        header: bool,
        data_digest: bool,
    ) {
        let digests = Digests { header, data: data_digest };
        for pdu in all_pdus(seed, Bytes::from(data.clone()), cdb_len) {
            check_round_trip(&pdu, digests);
        }
    }
}
