//! Arbitrary bytes through the iSNS reassembler in arbitrary chunks: nothing may panic,
//! and every message that decodes must encode back to a stream that decodes to itself.

#![no_main]

use isns::attr::Attr;
use isns::message::Reassembler;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&control, rest)) = input.split_first() else {
        return;
    };
    let _ = Attr::decode_all(rest);
    let chunk = usize::from(control) + 1;
    let mut r = Reassembler::new();
    for piece in rest.chunks(chunk) {
        r.push(piece);
        loop {
            match r.next_message() {
                Ok(Some(m)) => {
                    let mut again = Reassembler::new();
                    again.push(&m.encode(usize::from(control) * 4 + 8));
                    assert_eq!(again.next_message(), Ok(Some(m)));
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
