//! The BHS of every PDU type the vectors in pdu_vectors.rs do not cover, as twelve
//! big-endian words read off the RFC 7143 section 11 figures. A round trip cannot catch a
//! field at the wrong offset; these can.

use bytes::Bytes;
use iscsi::pdu::*;

fn words(pdu: impl Into<Pdu>) -> [u32; 12] {
    let mut wire = Vec::new();
    pdu.into().encode(&mut wire, Digests::default());
    std::array::from_fn(|i| u32::from_be_bytes(wire[4 * i..4 * i + 4].try_into().unwrap()))
}

const LUN: u64 = 0x0001_0000_0000_0000;

#[test]
fn nop_out() {
    let w = words(NopOut {
        immediate: true,
        lun: LUN,
        itt: 0xa1,
        ttt: 0xa2,
        cmdsn: 0xa3,
        expstatsn: 0xa4,
        data: Bytes::from_static(b"ab"),
    });
    assert_eq!(
        w,
        [
            0x4080_0000,
            2,
            0x0001_0000,
            0,
            0xa1,
            0xa2,
            0xa3,
            0xa4,
            0,
            0,
            0,
            0
        ]
    );
}

#[test]
fn task_mgmt_request() {
    let w = words(TaskMgmtRequest {
        immediate: true,
        function: 1,
        lun: LUN,
        itt: 0xb1,
        referenced_task_tag: 0xb2,
        cmdsn: 0xb3,
        expstatsn: 0xb4,
        refcmdsn: 0xb5,
        expdatasn: 0xb6,
    });
    assert_eq!(
        w,
        [
            0x4281_0000,
            0,
            0x0001_0000,
            0,
            0xb1,
            0xb2,
            0xb3,
            0xb4,
            0xb5,
            0xb6,
            0,
            0
        ]
    );
}

#[test]
fn text_request() {
    let w = words(TextRequest {
        immediate: true,
        final_: false,
        cont: true,
        lun: 0,
        itt: 0xc1,
        ttt: 0xc2,
        cmdsn: 0xc3,
        expstatsn: 0xc4,
        data: Bytes::from_static(b"k=v\0"),
    });
    assert_eq!(
        w,
        [0x4440_0000, 4, 0, 0, 0xc1, 0xc2, 0xc3, 0xc4, 0, 0, 0, 0]
    );
}

#[test]
fn data_out() {
    let w = words(DataOut {
        final_: true,
        lun: LUN,
        itt: 0xd1,
        ttt: 0xd2,
        expstatsn: 0xd3,
        datasn: 0xd4,
        buffer_offset: 0xd5,
        data: Bytes::from_static(&[0; 8]),
    });
    assert_eq!(
        w,
        [
            0x0580_0000,
            8,
            0x0001_0000,
            0,
            0xd1,
            0xd2,
            0,
            0xd3,
            0,
            0xd4,
            0xd5,
            0
        ]
    );
}

#[test]
fn logout_request() {
    let w = words(LogoutRequest {
        immediate: true,
        reason: 2,
        itt: 0xe1,
        cid: 0xe2,
        cmdsn: 0xe3,
        expstatsn: 0xe4,
    });
    assert_eq!(
        w,
        [
            0x4682_0000,
            0,
            0,
            0,
            0xe1,
            0x00e2_0000,
            0xe3,
            0xe4,
            0,
            0,
            0,
            0
        ]
    );
}

#[test]
fn snack_request() {
    let w = words(SnackRequest {
        snack_type: 1,
        lun: LUN,
        itt: 0xf1,
        ttt: 0xf2,
        expstatsn: 0xf3,
        begrun: 0xf4,
        runlength: 0xf5,
    });
    assert_eq!(
        w,
        [
            0x1081_0000,
            0,
            0x0001_0000,
            0,
            0xf1,
            0xf2,
            0,
            0xf3,
            0,
            0,
            0xf4,
            0xf5
        ]
    );
}

#[test]
fn scsi_response() {
    let w = words(ScsiResponse {
        bidi_overflow: true,
        underflow: true,
        itt: 0x21,
        snack_tag: 0x22,
        statsn: 0x23,
        expcmdsn: 0x24,
        maxcmdsn: 0x25,
        expdatasn: 0x26,
        bidi_read_residual_count: 0x27,
        residual_count: 0x28,
        ..ScsiResponse::with_sense(&[0x70, 0, 5])
    });
    // F, o and U set; Response 0; Status CHECK CONDITION; SenseLength + 3 bytes of sense.
    assert_eq!(
        w,
        [
            0x2192_0002,
            5,
            0,
            0,
            0x21,
            0x22,
            0x23,
            0x24,
            0x25,
            0x26,
            0x27,
            0x28
        ]
    );
}

#[test]
fn task_mgmt_response() {
    let w = words(TaskMgmtResponse {
        response: 5,
        itt: 0x31,
        statsn: 0x32,
        expcmdsn: 0x33,
        maxcmdsn: 0x34,
    });
    assert_eq!(
        w,
        [0x2280_0500, 0, 0, 0, 0x31, 0, 0x32, 0x33, 0x34, 0, 0, 0]
    );
}

#[test]
fn login_response() {
    let w = words(LoginResponse {
        transit: true,
        cont: false,
        csg: 0,
        nsg: 1,
        version_max: 0,
        version_active: 0,
        isid: [1, 2, 3, 4, 5, 6],
        tsih: 0x0708,
        itt: 0x41,
        statsn: 0x42,
        expcmdsn: 0x43,
        maxcmdsn: 0x44,
        status_class: 2,
        status_detail: 1,
        data: Bytes::new(),
    });
    assert_eq!(
        w,
        [
            0x2381_0000,
            0,
            0x0102_0304,
            0x0506_0708,
            0x41,
            0,
            0x42,
            0x43,
            0x44,
            0x0201_0000,
            0,
            0
        ]
    );
}

#[test]
fn text_response() {
    let w = words(TextResponse {
        final_: true,
        cont: false,
        lun: 0,
        itt: 0x51,
        ttt: 0x52,
        statsn: 0x53,
        expcmdsn: 0x54,
        maxcmdsn: 0x55,
        data: Bytes::new(),
    });
    assert_eq!(
        w,
        [0x2480_0000, 0, 0, 0, 0x51, 0x52, 0x53, 0x54, 0x55, 0, 0, 0]
    );
}

#[test]
fn data_in() {
    let w = words(DataIn {
        final_: true,
        ack: true,
        overflow: true,
        underflow: false,
        status_present: true,
        status: 0,
        lun: LUN,
        itt: 0x61,
        ttt: RESERVED_TAG,
        statsn: 0x62,
        expcmdsn: 0x63,
        maxcmdsn: 0x64,
        datasn: 0x65,
        buffer_offset: 0x66,
        residual_count: 0x67,
        data: Bytes::from_static(&[9; 4]),
    });
    assert_eq!(
        w,
        [
            0x25c5_0000,
            4,
            0x0001_0000,
            0,
            0x61,
            0xffff_ffff,
            0x62,
            0x63,
            0x64,
            0x65,
            0x66,
            0x67
        ]
    );
}

#[test]
fn logout_response() {
    let w = words(LogoutResponse {
        response: 1,
        itt: 0x71,
        statsn: 0x72,
        expcmdsn: 0x73,
        maxcmdsn: 0x74,
        time2wait: 2,
        time2retain: 20,
    });
    assert_eq!(
        w,
        [
            0x2680_0100,
            0,
            0,
            0,
            0x71,
            0,
            0x72,
            0x73,
            0x74,
            0,
            0x0002_0014,
            0
        ]
    );
}

#[test]
fn r2t() {
    let w = words(R2t {
        lun: LUN,
        itt: 0x81,
        ttt: 0x82,
        statsn: 0x83,
        expcmdsn: 0x84,
        maxcmdsn: 0x85,
        r2tsn: 0x86,
        buffer_offset: 0x87,
        desired_data_transfer_length: 0x88,
    });
    assert_eq!(
        w,
        [
            0x3180_0000,
            0,
            0x0001_0000,
            0,
            0x81,
            0x82,
            0x83,
            0x84,
            0x85,
            0x86,
            0x87,
            0x88
        ]
    );
}
