//! What a gateway reads from the cluster that another gateway (or anyone who may write to
//! the image's pool) wrote about reservations (`rbd::wire`): the object's content, a
//! notification's payload, and `rados_notify2`'s reply of acknowledgements. Each decodes
//! or fails, never panics; what decodes writes back as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rbd::wire::{self, Content};

fuzz_target!(|data: &[u8]| {
    if let Some(c) = wire::parse(data) {
        // The content a gateway would write from what it read reads back the same.
        let again = wire::parse(&c.bytes());
        assert_eq!(again.as_ref(), Some(&c));
    }
    if let Some((sender, seq, state, event)) = wire::parse_event(data) {
        assert!(state.len() + event.len() < data.len());
        // A notification as `publish` builds it from these parts reads back as them.
        let mut p = wire::EVENT.to_vec();
        p.extend_from_slice(format!("{sender} {seq} {}\n", state.len()).as_bytes());
        p.extend_from_slice(state);
        p.extend_from_slice(event);
        assert_eq!(wire::parse_event(&p), Some((sender, seq, state, event)));
        if let Some(c) = wire::parse(state) {
            let _: &Content = &c;
        }
    }
    if let Some(ids) = wire::acked(data) {
        // Each id came from a payload of at least one byte, after 20 bytes of header.
        assert!(ids.len() * 21 <= data.len());
    }
});
