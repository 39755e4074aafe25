//! Arbitrary bytes through `Pdu::decode` and through `PduDecoder` in arbitrary chunks:
//! nothing may panic, and every decoded PDU must re-encode to itself.

#![no_main]

use bytes::{Bytes, BytesMut};
use iscsi::framing::{FrameError, FrameLimits, PduDecoder};
use iscsi::pdu::{Digests, Pdu, BHS_LEN};
use libfuzzer_sys::fuzz_target;

fn check_reencode(pdu: &Pdu) {
    let mut wire = Vec::new();
    pdu.encode(&mut wire, Digests::default());
    let mut dec = PduDecoder::new(FrameLimits {
        max_recv_data_segment: u32::MAX,
    });
    let mut buf = BytesMut::from(&wire[..]);
    let again = dec.decode(&mut buf).expect("re-encoded PDU decodes");
    assert_eq!(again.as_ref(), Some(pdu));
    assert!(buf.is_empty());
}

fuzz_target!(|input: &[u8]| {
    let Some((&control, rest)) = input.split_first() else {
        return;
    };

    if let Some((bhs, tail)) = rest.split_first_chunk::<BHS_LEN>() {
        let split = usize::from(control).min(tail.len());
        let (ahs, data) = tail.split_at(split);
        if let Ok(pdu) = Pdu::decode(bhs, ahs, Bytes::copy_from_slice(data)) {
            check_reencode(&pdu);
        }
    }

    let digests = Digests {
        header: control & 1 != 0,
        data: control & 2 != 0,
    };
    let chunk = usize::from(control >> 2) + 1;
    let mut dec = PduDecoder::new(FrameLimits {
        max_recv_data_segment: 4096,
    });
    dec.set_digests(digests);
    let mut buf = BytesMut::new();
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(pdu)) => check_reencode(&pdu),
                Ok(None) => break,
                Err(FrameError::HeaderDigest) => return,
                Err(_) => {}
            }
        }
    }
});
