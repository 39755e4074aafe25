//! The `rsv sync` control channel's requests, as a disk server's agent takes them from the
//! network (`replicate::wire::serve`): bytes in pieces into `http::Parser`, the request
//! line, the `Authorization` header through `auth::Verifier` (a forged or malformed one
//! refused, a correctly signed one accepted once and then refused as a replay), and the
//! JSON bodies the agent decodes. Properties: no panic; only a request signed with the key
//! passes (the input's header checked against a key it cannot know); a nonce passes
//! once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replicate::api::{Pace, Release, SendRequest, SumsRequest};
use replicate::auth::{AuthError, Key, Verifier};
use replicate::http::Parser;

const NOW: u64 = 1_780_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split).min(rest.len());
    let mut parser = Parser::default();
    let message = match parser.push(&rest[..cut]) {
        Ok(Some(m)) => Some(m),
        Ok(None) => parser.push(&rest[cut..]).ok().flatten(),
        Err(_) => None,
    };
    let Some(m) = message else {
        return;
    };
    let _ = m.status();
    let _ = m.encode();
    let Ok((method, path)) = m.method_path() else {
        return;
    };
    // The corpus's signed requests use this key; no input knows the other.
    let key = Key::new(b"fuzzing-key-0123456789").unwrap();
    let unknown = Key::new(b"a key no input was signed with").unwrap();
    let header = m.header("Authorization");
    let got = Verifier::new(unknown).check(method, path, header, &m.body, NOW);
    assert!(got.is_err(), "a request passed without the key: {header:?}");
    let mut verifier = Verifier::new(key.clone());
    if verifier.check(method, path, header, &m.body, NOW).is_ok() {
        assert_eq!(
            verifier.check(method, path, header, &m.body, NOW),
            Err(AuthError::Replay)
        );
    }
    // Signed with the key (at a time near NOW the input chooses): in once, then a replay.
    let skew = u64::from(split) % 300;
    let (auth, nonce) = key.sign_request(method, path, &m.body, NOW - skew);
    assert_eq!(
        verifier.check(method, path, Some(&auth), &m.body, NOW),
        Ok(nonce)
    );
    assert_eq!(
        verifier.check(method, path, Some(&auth), &m.body, NOW),
        Err(AuthError::Replay)
    );
    let _ = serde_json::from_slice::<SendRequest>(&m.body);
    let _ = serde_json::from_slice::<SumsRequest>(&m.body);
    let _ = serde_json::from_slice::<Release>(&m.body);
    let _ = serde_json::from_slice::<Pace>(&m.body);
});
