//! The target's control socket requests (`targetd::control::proto`), as the socket takes
//! them from a local client: bytes in two pieces into `RequestReader`, and whole as the
//! client's answer parser sees a target's reply. Properties: no panic; nothing longer than
//! `MAX_REQUEST` is taken; a request taken encodes to a line that parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use targetd::control::proto::{self, ProtoError, RequestReader, MAX_REQUEST};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = (usize::from(split) * 17).min(rest.len());
    let mut reader = RequestReader::default();
    let taken = match reader.feed(&rest[..cut]) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => match reader.feed(&rest[cut..]) {
            Ok(Some(r)) => Ok(r),
            Ok(None) => reader.finish(),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match taken {
        Ok(r) => {
            // What was taken is a line within the limit, and means what it encodes to.
            let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            assert!(line_end < MAX_REQUEST);
            let again = proto::encode(&r);
            let mut fresh = RequestReader::default();
            assert_eq!(fresh.feed(&again), Ok(Some(r)));
        }
        Err(ProtoError::TooLong) => assert!(rest.len() >= MAX_REQUEST),
        Err(_) => {}
    }
    if let Ok(resp) = proto::parse_response(rest) {
        assert_eq!(proto::parse_response(&proto::encode(&resp)), Ok(resp));
    }
});
