//! Arbitrary input never panics the decoder, and whatever decodes re-encodes to the same
//! PDU.

use bytes::{Bytes, BytesMut};
use iscsi::framing::{FrameError, FrameLimits, PduDecoder};
use iscsi::pdu::*;
use proptest::prelude::*;

fn reencodes_identically(pdu: &Pdu) {
    let mut wire = Vec::new();
    pdu.encode(&mut wire, Digests::default());
    let bhs: &[u8; BHS_LEN] = wire[..BHS_LEN].try_into().unwrap();
    let ahs_end = BHS_LEN + total_ahs_len(bhs);
    let data = Bytes::copy_from_slice(&wire[ahs_end..ahs_end + data_segment_len(bhs)]);
    let again = Pdu::decode(bhs, &wire[BHS_LEN..ahs_end], data).unwrap();
    assert_eq!(&again, pdu);
}

/// A header whose opcode is one iSCSI defines most of the time, so decoding gets past the
/// opcode check.
fn header() -> impl Strategy<Value = [u8; BHS_LEN]> {
    (any::<[u8; BHS_LEN]>(), 0usize..18, any::<bool>()).prop_map(|(mut bhs, op, keep)| {
        const OPS: [u8; 18] = [
            0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25,
            0x26, 0x31, 0x32, 0x3f,
        ];
        if !keep {
            bhs[0] = (bhs[0] & 0xc0) | OPS[op];
        }
        bhs
    })
}

/// AHS entries that are mostly well-formed: (AHSType, AHS-specific length), then random
/// content.
fn ahs() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((0u8..70, 0usize..40, any::<u8>()), 0..4).prop_map(|entries| {
        let mut out = Vec::new();
        for (ty, len, fill) in entries {
            out.extend_from_slice(&(len as u16).to_be_bytes());
            out.push(ty);
            out.extend(std::iter::repeat_n(fill, len));
            out.resize(out.len().next_multiple_of(4), 0);
        }
        out.truncate(MAX_AHS_LEN);
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn decode_arbitrary_bytes(
        bhs in any::<[u8; BHS_LEN]>(),
        ahs in prop::collection::vec(any::<u8>(), 0..64),
        data in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        if let Ok(pdu) = Pdu::decode(&bhs, &ahs, Bytes::from(data)) {
            reencodes_identically(&pdu);
        }
    }

    #[test]
    fn decode_consistent_lengths(
        mut bhs in header(),
        ahs in ahs(),
        data in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        bhs[4] = (ahs.len() / 4) as u8;
        bhs[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        if let Ok(pdu) = Pdu::decode(&bhs, &ahs, Bytes::from(data)) {
            reencodes_identically(&pdu);
        }
    }

    #[test]
    fn framing_arbitrary_stream(
        stream in prop::collection::vec(any::<u8>(), 0..2048),
        chunk in 1usize..300,
        header_digest: bool,
        data_digest: bool,
        max in 0u32..1024,
    ) {
        run_stream(&stream, chunk, Digests { header: header_digest, data: data_digest }, max);
    }

    #[test]
    fn framing_mutated_valid_stream(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        chunk in 1usize..200,
        header_digest: bool,
        data_digest: bool,
    ) {
        let digests = Digests { header: header_digest, data: data_digest };
        let mut stream = Vec::new();
        let pdus: [Pdu; 4] = [
            ScsiCommand { cdb: (0..40).collect(), bidi_read_length: Some(5), ..Default::default() }.into(),
            DataIn { data: Bytes::from_static(b"some data"), ..Default::default() }.into(),
            LoginRequest { data: Bytes::from_static(b"A=B\0"), ..Default::default() }.into(),
            R2t::default().into(),
        ];
        for p in &pdus {
            p.encode(&mut stream, digests);
        }
        for (at, x) in flips {
            let i = at.index(stream.len());
            stream[i] ^= x;
        }
        run_stream(&stream, chunk, digests, 8192);
    }
}

/// Feeds `stream` in chunks; the decoder must neither panic nor loop, and must never ask
/// for room beyond one maximal PDU.
fn run_stream(stream: &[u8], chunk: usize, digests: Digests, max: u32) {
    let mut dec = PduDecoder::new(FrameLimits {
        max_recv_data_segment: max,
    });
    dec.set_digests(digests);
    // The largest PDU the decoder may have to hold whole.
    let bound = BHS_LEN + MAX_AHS_LEN + 4 + max as usize + 3 + 4;
    let mut buf = BytesMut::new();
    for piece in stream.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            let before = buf.len();
            match dec.decode(&mut buf) {
                Ok(Some(pdu)) => {
                    assert!(pdu.data().len() <= max as usize);
                    reencodes_identically(&pdu);
                }
                Ok(None) => break,
                Err(FrameError::HeaderDigest) => return,
                Err(_) => assert!(
                    buf.len() < before,
                    "an error other than HeaderDigest consumes"
                ),
            }
        }
        // BytesMut may round a reservation up to twice the request.
        assert!(
            buf.capacity() <= 2 * (bound + chunk),
            "capacity {}",
            buf.capacity()
        );
    }
}
