//! Text key parser: never panics, and whatever it accepts encodes back to an equal parse.
#![no_main]

use iscsi::text::{decode_binary, parse_number, TextAccumulator, TextKeys};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(keys) = TextKeys::parse(data) {
        let again = TextKeys::parse(&keys.encode()).expect("own encoding parses");
        assert_eq!(again, keys);
        for (_, v) in keys.iter() {
            let _ = parse_number(v);
            let _ = decode_binary(v);
        }
    }
    // The same bytes delivered as a continued text in small pieces.
    let mut acc = TextAccumulator::new(4096);
    let mut pieces = data.chunks(97).peekable();
    while let Some(piece) = pieces.next() {
        match acc.push(piece, pieces.peek().is_some()) {
            Ok(Some(text)) => {
                let _ = TextKeys::parse(&text);
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
});
