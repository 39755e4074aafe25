//! Property tests: any message round-trips through PDUs of any size, in any chunking of
//! the stream; random bytes never panic the decoders.

use isns::attr::{Attr, Tag};
use isns::message::{Message, Reassembler, Status};
use isns::pdu::{split_pdu, Flags, FunctionId};
use proptest::prelude::*;

fn attr() -> impl Strategy<Value = Attr> {
    prop_oneof![
        (1u32..64, any::<u32>()).prop_map(|(t, v)| Attr::u32(Tag(t), v)),
        (1u32..64, "[ -~]{0,40}").prop_map(|(t, s)| Attr::string(Tag(t), &s)),
        (1u32..64, any::<[u8; 16]>()).prop_map(|(t, b)| Attr::ip(Tag(t), b.into())),
        (0u32..64).prop_map(|t| Attr::empty(Tag(t))),
        (64u32..5000, proptest::collection::vec(any::<u8>(), 0..20)).prop_map(|(t, mut v)| {
            v.resize(v.len().next_multiple_of(4), 0);
            Attr {
                tag: Tag(t),
                value: v,
            }
        }),
    ]
    .prop_filter("values fit their tag", |a| match a.tag.fixed_len() {
        Some(n) => a.value.is_empty() || a.value.len() == n,
        None => true,
    })
}

fn message() -> impl Strategy<Value = Message> {
    (
        0u16..0x10,
        any::<bool>(),
        any::<bool>(),
        any::<u16>(),
        any::<u32>(),
        proptest::collection::vec(attr(), 0..30),
    )
        .prop_map(|(f, rsp, client, xid, status, attrs)| {
            let function = if rsp {
                FunctionId(f).response()
            } else {
                FunctionId(f)
            };
            Message {
                function,
                flags: Flags(if client { Flags::CLIENT } else { Flags::SERVER }),
                xid,
                status: rsp.then_some(Status(status)),
                attrs,
            }
        })
}

proptest! {
    #[test]
    fn round_trip(m in message(), max in 8usize..400, chunk in 1usize..97) {
        let wire = m.encode(max);
        let mut r = Reassembler::new();
        let mut got = Vec::new();
        for piece in wire.chunks(chunk) {
            r.push(piece);
            while let Some(msg) = r.next_message().unwrap() {
                got.push(msg);
            }
        }
        prop_assert_eq!(got, vec![m]);
        prop_assert_eq!(r.pending(), 0);
    }

    #[test]
    fn two_messages_in_one_stream(a in message(), b in message(), max in 8usize..200) {
        let mut wire = a.encode(max);
        wire.extend(b.encode(max));
        let mut r = Reassembler::new();
        r.push(&wire);
        prop_assert_eq!(r.next_message().unwrap(), Some(a));
        prop_assert_eq!(r.next_message().unwrap(), Some(b));
        prop_assert_eq!(r.next_message().unwrap(), None);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Attr::decode_all(&bytes);
        let _ = split_pdu(&bytes);
        let mut r = Reassembler::new();
        r.push(&bytes);
        while let Ok(Some(_)) = r.next_message() {}
    }

    #[test]
    fn random_payload_behind_a_valid_header(
        f in any::<u16>(), flags in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..300)
    ) {
        let h = isns::Header { version: 1, function: FunctionId(f), length: payload.len() as u16, flags: Flags(flags), xid: 1, seq: 0 };
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(&payload);
        let mut r = Reassembler::new();
        r.push(&wire);
        if let Ok(Some(m)) = r.next_message() {
            // What decodes encodes back to the same payload.
            let again = m.encode(65532);
            prop_assert_eq!(&again[12..], &wire[12..]);
        }
    }
}

proptest! {
    /// Whatever a client sends, the registry answers it and stays consistent enough to
    /// save, load and expire.
    #[test]
    fn registry_answers_anything(msgs in proptest::collection::vec(message(), 1..20)) {
        let mut r = isns::server::Registry::new(30);
        for (t, m) in msgs.iter().enumerate() {
            let mut m = m.clone();
            m.status = None;
            m.function = FunctionId(m.function.0 & 0x7fff);
            let (rsp, _) = r.handle(&m, t as u64);
            prop_assert!(rsp.status.is_some());
            prop_assert_eq!(rsp.xid, m.xid);
        }
        let again = isns::server::Registry::load(30, &r.save());
        prop_assert_eq!(again.nodes().count(), r.nodes().count());
        r.expire(1000);
        prop_assert_eq!(r.nodes().count(), 0);
    }
}
