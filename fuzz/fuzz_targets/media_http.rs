//! The media server's requests after hyper has parsed them (here with httparse, hyper's
//! own parser): what `media::server` does with their parts — the path routed and
//! percent-decoded, the query read, the `Range` header resolved against a length.
//! Properties: no panic; a routed file path is absolute and has no `.` or `..` segment;
//! a resolved range lies inside the resource; percent decoding undoes percent encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use media::http::{percent_decode, percent_encode_path, resolve_range, wants_refresh, Ranged};
use media::listing::{route, Route};

fuzz_target!(|data: &[u8]| {
    // The first byte once chose where the head was cut; it still varies the lengths.
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(rest), Ok(httparse::Status::Complete(_))) {
        return;
    }
    let Some(target) = req.path else {
        return;
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let _ = wants_refresh(query);
    match route(path) {
        Route::File { path, storage, .. } | Route::Player { path, storage, .. } => {
            assert!(path.starts_with('/') && !storage.is_empty(), "{path:?}");
            assert!(
                !path.split('/').any(|s| s == "." || s == ".."),
                "{path:?} escapes its volume"
            );
        }
        Route::Page | Route::Json | Route::NotFound => {}
    }
    if let Some(p) = percent_decode(path) {
        assert_eq!(
            percent_decode(&percent_encode_path(&p)).as_deref(),
            Some(p.as_str())
        );
    }
    let range = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("range"))
        .and_then(|h| std::str::from_utf8(h.value).ok());
    // Lengths at the edges and one from the input.
    let len_from_input = rest
        .iter()
        .take(8)
        .fold(u64::from(first), |n, &b| (n << 8) | u64::from(b));
    for len in [0, 1, 4096, len_from_input, u64::MAX] {
        match resolve_range(range, len) {
            Ranged::Full | Ranged::Unsatisfiable => {}
            Ranged::Part { start, end } => assert!(start <= end && end < len),
        }
    }
});
