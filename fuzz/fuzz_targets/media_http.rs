//! The media server's HTTP requests, as `media::server` takes them from a client: bytes
//! arriving in pieces until a head parses, then what the server does with its parts —
//! the path's and query's percent decoding and the `Range` header against a length.
//! Properties: no panic; a parsed request never claims more bytes than it was given; a
//! resolved range lies inside the resource; percent decoding undoes percent encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use media::http::{parse_request, percent_decode, percent_encode_path, resolve_range, Ranged};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    // The server parses again after each read: every prefix must be fine to look at.
    let cut = usize::from(split).min(rest.len());
    if let Ok(Some((_, used))) = parse_request(&rest[..cut]) {
        assert!(used <= cut);
    }
    let Ok(Some((req, used))) = parse_request(rest) else {
        return;
    };
    assert!(used <= rest.len());
    if let Some(path) = percent_decode(&req.path) {
        assert_eq!(
            percent_decode(&percent_encode_path(&path)).as_deref(),
            Some(path.as_str())
        );
    }
    if let Some(q) = &req.query {
        for pair in q.split('&') {
            let _ = percent_decode(pair);
        }
    }
    // Lengths at the edges and one from the input.
    let len_from_input = rest
        .iter()
        .take(8)
        .fold(0u64, |n, &b| (n << 8) | u64::from(b));
    for len in [0, 1, 4096, len_from_input, u64::MAX] {
        match resolve_range(req.header("range"), len) {
            Ranged::Full | Ranged::Unsatisfiable => {}
            Ranged::Part { start, end } => assert!(start <= end && end < len),
        }
    }
});
