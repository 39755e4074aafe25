//! PduDecoder on a byte stream: partial input, several PDUs per buffer, digest errors,
//! oversized segments and malformed PDUs.

use bytes::{Bytes, BytesMut};
use iscsi::framing::{FrameError, FrameLimits, PduDecoder};
use iscsi::pdu::*;

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

fn sample_pdus() -> Vec<Pdu> {
    vec![
        Pdu::ScsiCommand(ScsiCommand {
            write: true,
            edtl: 13,
            itt: 1,
            cdb: (0..32).collect(),
            bidi_read_length: Some(77),
            data: Bytes::from_static(b"thirteen byte"),
            ..Default::default()
        }),
        Pdu::NopOut(NopOut {
            itt: 2,
            ..Default::default()
        }),
        Pdu::DataIn(DataIn {
            itt: 3,
            final_: true,
            status_present: true,
            data: Bytes::from(vec![0x5a; 4097]),
            ..Default::default()
        }),
        Pdu::R2t(R2t {
            itt: 4,
            desired_data_transfer_length: 65536,
            ..Default::default()
        }),
        Pdu::TextResponse(TextResponse {
            itt: 5,
            data: Bytes::from_static(b"TargetName=iqn.x\0"),
            ..Default::default()
        }),
    ]
}

fn wire(pdus: &[Pdu], digests: Digests) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pdus {
        p.encode(&mut out, digests);
    }
    out
}

fn decoder(digests: Digests, max: u32) -> PduDecoder {
    let mut d = PduDecoder::new(FrameLimits {
        max_recv_data_segment: max,
    });
    d.set_digests(digests);
    d
}

#[test]
fn one_byte_at_a_time() {
    for digests in [Digests::default(), BOTH] {
        let pdus = sample_pdus();
        let bytes = wire(&pdus, digests);
        let mut dec = decoder(digests, 8192);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in bytes {
            buf.extend_from_slice(&[b]);
            if let Some(p) = dec.decode(&mut buf).unwrap() {
                got.push(p);
                assert!(dec.decode(&mut buf).unwrap().is_none());
            }
        }
        assert_eq!(got, pdus);
        assert!(buf.is_empty());
        assert!(!dec.is_mid_pdu(&buf));
    }
}

#[test]
fn several_pdus_in_one_buffer() {
    let pdus = sample_pdus();
    let mut buf = BytesMut::from(&wire(&pdus, BOTH)[..]);
    buf.extend_from_slice(&[0x01, 0x02]); // start of the next PDU
    let mut dec = decoder(BOTH, 8192);
    for p in &pdus {
        assert_eq!(dec.decode(&mut buf).unwrap().as_ref(), Some(p));
    }
    assert_eq!(dec.decode(&mut buf).unwrap(), None);
    assert_eq!(&buf[..], &[0x01, 0x02]);
    assert!(dec.is_mid_pdu(&buf));
}

#[test]
fn data_segment_is_not_copied() {
    let pdus = sample_pdus();
    let mut buf = BytesMut::from(&wire(&pdus[2..3], Digests::default())[..]);
    let start = buf.as_ptr() as usize;
    let pdu = decoder(Digests::default(), 8192)
        .decode(&mut buf)
        .unwrap()
        .unwrap();
    assert_eq!(pdu.data().as_ptr() as usize, start + BHS_LEN);
}

#[test]
fn corrupted_header_digest() {
    let pdus = sample_pdus();
    for at in [0, 5, 47, 48, 75, 76, 79] {
        let mut bytes = wire(&pdus[..1], BOTH);
        bytes[at] ^= 0x10;
        let mut buf = BytesMut::from(&bytes[..]);
        let err = decoder(BOTH, 8192).decode(&mut buf).unwrap_err();
        assert_eq!(err, FrameError::HeaderDigest, "flipped byte {at}");
        assert_eq!(err.reject_reason(), None);
    }
}

#[test]
fn corrupted_data_digest_consumes_the_pdu() {
    let pdus = sample_pdus();
    let first_len = pdus[0].encoded_len(BOTH);
    // Flip a payload byte, a padding byte, and a digest byte of the first PDU.
    for at in [first_len - 20, first_len - 6, first_len - 1] {
        let mut bytes = wire(&pdus, BOTH);
        bytes[at] ^= 0x01;
        let mut buf = BytesMut::from(&bytes[..]);
        let mut dec = decoder(BOTH, 8192);
        let err = dec.decode(&mut buf).unwrap_err();
        let mut expected_bhs = Vec::new();
        pdus[0].encode_header(&mut expected_bhs, Digests::default());
        match &err {
            FrameError::DataDigest { bhs } => assert_eq!(bhs[..], expected_bhs[..48]),
            other => panic!("flipped byte {at}: {other:?}"),
        }
        assert_eq!(err.reject_reason(), Some(reject_reason::DATA_DIGEST_ERROR));
        assert_eq!(err.rejected_header().unwrap()[..], expected_bhs[..48]);
        assert_eq!(dec.decode(&mut buf).unwrap().as_ref(), Some(&pdus[1]));
    }
}

#[test]
fn oversized_segment_is_skipped_without_buffering() {
    let big = Pdu::DataOut(DataOut {
        itt: 9,
        data: Bytes::from(vec![7u8; 100_001]),
        ..Default::default()
    });
    let next = Pdu::NopOut(NopOut {
        itt: 10,
        ..Default::default()
    });
    for digests in [Digests::default(), BOTH] {
        let bytes = wire(&[big.clone(), next.clone()], digests);
        let mut dec = decoder(digests, 8192);
        let mut buf = BytesMut::with_capacity(256);
        let mut errors = Vec::new();
        let mut got = Vec::new();
        for chunk in bytes.chunks(100) {
            buf.extend_from_slice(chunk);
            loop {
                match dec.decode(&mut buf) {
                    Ok(Some(p)) => got.push(p),
                    Ok(None) => break,
                    Err(e) => errors.push(e),
                }
            }
            assert!(buf.capacity() < 16 * 1024, "buffered {}", buf.capacity());
        }
        assert_eq!(errors.len(), 1);
        match &errors[0] {
            FrameError::DataSegmentTooLarge { bhs, len, max } => {
                assert_eq!((*len, *max), (100_001, 8192));
                assert_eq!(bhs[0], Opcode::DataOut as u8);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(got, vec![next.clone()]);
    }
}

#[test]
fn limit_is_settable() {
    let pdu = Pdu::DataOut(DataOut {
        data: Bytes::from(vec![1u8; 8193]),
        ..Default::default()
    });
    let bytes = wire(std::slice::from_ref(&pdu), Digests::default());

    let mut dec = PduDecoder::new(FrameLimits::default());
    assert_eq!(dec.limits().max_recv_data_segment, 8192);
    let mut buf = BytesMut::from(&bytes[..]);
    assert!(matches!(
        dec.decode(&mut buf),
        Err(FrameError::DataSegmentTooLarge { len: 8193, .. })
    ));
    assert!(buf.is_empty());

    dec.set_max_recv_data_segment(262_144);
    let mut buf = BytesMut::from(&bytes[..]);
    assert_eq!(dec.decode(&mut buf).unwrap(), Some(pdu));
}

#[test]
fn malformed_pdu_is_consumed() {
    let good = Pdu::NopOut(NopOut::default());
    let mut bytes = wire(
        &[
            Pdu::NopOut(NopOut {
                data: Bytes::from_static(b"abc"),
                ..Default::default()
            }),
            good.clone(),
        ],
        BOTH,
    );
    bytes[0] = 0x1d; // vendor-specific opcode we do not know
    let fix = iscsi::digest::to_wire(iscsi::digest::crc32c(&bytes[..48]));
    bytes[48..52].copy_from_slice(&fix);
    let mut buf = BytesMut::from(&bytes[..]);
    let mut dec = decoder(BOTH, 8192);
    let err = dec.decode(&mut buf).unwrap_err();
    assert!(
        matches!(&err, FrameError::Pdu { bhs, err: PduError::UnknownOpcode(0x1d) } if bhs[0] == 0x1d),
        "{err:?}"
    );
    assert_eq!(
        err.reject_reason(),
        Some(reject_reason::COMMAND_NOT_SUPPORTED)
    );
    assert_eq!(dec.decode(&mut buf).unwrap(), Some(good));
}

#[test]
fn digests_switch_between_pdus() {
    let login = Pdu::LoginResponse(LoginResponse {
        transit: true,
        csg: 1,
        nsg: 3,
        data: Bytes::from_static(b"HeaderDigest=CRC32C\0DataDigest=CRC32C\0"),
        ..Default::default()
    });
    let cmd = sample_pdus().swap_remove(0);
    let mut bytes = wire(std::slice::from_ref(&login), Digests::default());
    bytes.extend_from_slice(&wire(std::slice::from_ref(&cmd), BOTH));
    let mut buf = BytesMut::from(&bytes[..]);
    let mut dec = decoder(Digests::default(), 8192);
    assert_eq!(dec.decode(&mut buf).unwrap(), Some(login));
    dec.set_digests(BOTH);
    assert_eq!(dec.digests(), BOTH);
    assert_eq!(dec.decode(&mut buf).unwrap(), Some(cmd));
}

#[test]
fn header_taken_alone_leaves_the_segment_to_the_caller() {
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: false,
        },
    ] {
        let data_in = DataIn {
            itt: 7,
            datasn: 3,
            buffer_offset: 65536,
            data: Bytes::from(vec![0xa5; 8192]),
            ..Default::default()
        };
        let next = Pdu::NopIn(NopIn {
            itt: 8,
            ..Default::default()
        });
        let bytes = wire(&[Pdu::DataIn(data_in.clone()), next.clone()], digests);
        let mut dec = decoder(digests, 1 << 20);
        // Part of the header: nothing to peek yet.
        let mut buf = BytesMut::from(&bytes[..40]);
        assert_eq!(dec.peek_header(&buf).unwrap(), None);
        buf.extend_from_slice(&bytes[40..100]);
        let h = dec.peek_header(&buf).unwrap().expect("whole header");
        assert_eq!(h.data_len, 8192);
        assert_eq!(h.header_len, if digests.header { 52 } else { 48 });
        // Peeking again, or decoding, sees the same PDU.
        assert_eq!(dec.peek_header(&buf).unwrap(), Some(h));
        let hdr = dec.take_header(&mut buf, &h).unwrap();
        let Pdu::DataIn(d) = hdr else {
            panic!("{hdr:?}")
        };
        assert_eq!((d.itt, d.datasn, d.buffer_offset), (7, 3, 65536));
        assert!(d.data.is_empty());
        // The caller takes the segment: what is buffered, then the rest of the stream.
        let seg_start = h.header_len;
        assert_eq!(&buf[..], &bytes[seg_start..100]);
        let mut buf = BytesMut::from(&bytes[seg_start + h.data_len..]);
        assert_eq!(dec.decode(&mut buf).unwrap(), Some(next));
        assert!(buf.is_empty());
    }
    // With a data digest the decoder keeps the PDU; decode returns it whole.
    let bytes = wire(
        &[Pdu::DataIn(DataIn {
            data: Bytes::from(vec![1; 100]),
            ..Default::default()
        })],
        BOTH,
    );
    let mut dec = decoder(BOTH, 1 << 20);
    let mut buf = BytesMut::from(&bytes[..]);
    assert_eq!(dec.peek_header(&buf).unwrap(), None);
    assert!(matches!(dec.decode(&mut buf), Ok(Some(Pdu::DataIn(_)))));
}
