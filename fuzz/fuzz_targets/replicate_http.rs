//! The `rsv sync` control channel's requests, as a disk server's agent takes them once
//! hyper has parsed them (here with httparse, hyper's own parser; the body is what
//! follows the head): the `Authorization` header through `auth::Verifier` (a forged or
//! malformed one refused, a correctly signed one accepted once and then refused as a
//! replay), and the JSON bodies the agent decodes (the cycle requests too, and the
//! coordinator's decisions on the far site's cycle states). Properties: no panic; only a request
//! signed with the key passes (the input's header checked against a key it cannot know);
//! a nonce passes once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replicate::api::{
    ConnectRequest, CutAnswer, CutRequest, CycleAnswer, CycleRequest, JobStatus, Pace, Release,
    SendRequest, SumsRequest,
};
use replicate::auth::{AuthError, Key, Verifier};

const NOW: u64 = 1_780_000_000;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(head)) = req.parse(rest) else {
        return;
    };
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return;
    };
    let body = &rest[head..];
    let header = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("authorization"))
        .and_then(|h| std::str::from_utf8(h.value).ok());
    // The corpus's signed requests use this key; no input knows the other.
    let key = Key::new(b"fuzzing-key-0123456789").unwrap();
    let unknown = Key::new(b"a key no input was signed with").unwrap();
    let got = Verifier::new(unknown).check(method, path, header, body, NOW);
    assert!(got.is_err(), "a request passed without the key: {header:?}");
    let mut verifier = Verifier::new(key.clone());
    if verifier.check(method, path, header, body, NOW).is_ok() {
        assert_eq!(
            verifier.check(method, path, header, body, NOW),
            Err(AuthError::Replay)
        );
    }
    // Signed with the key (at a time near NOW the input chooses): in once, then a replay.
    let skew = u64::from(split) % 300;
    let (auth, nonce) = key.sign_request(method, path, body, NOW - skew);
    assert_eq!(verifier.check(method, path, Some(&auth), body, NOW), Ok(nonce));
    assert_eq!(
        verifier.check(method, path, Some(&auth), body, NOW),
        Err(AuthError::Replay)
    );
    let _ = serde_json::from_slice::<SendRequest>(body);
    // A session logged in ahead of its send (`POST /v1/connect`), and a send's status as
    // the coordinator reads it (its login and first acknowledgment times).
    let _ = serde_json::from_slice::<ConnectRequest>(body);
    let _ = serde_json::from_slice::<JobStatus>(body);
    let _ = serde_json::from_slice::<SumsRequest>(body);
    let _ = serde_json::from_slice::<Release>(body);
    let _ = serde_json::from_slice::<Pace>(body);
    let _ = serde_json::from_slice::<CutRequest>(body);
    let _ = serde_json::from_slice::<CutAnswer>(body);
    // Failover's requests and answers (`replicate::failover`).
    let _ = serde_json::from_slice::<replicate::failover::LunAsk>(body);
    let _ = serde_json::from_slice::<replicate::failover::PromoteAsk>(body);
    let _ = serde_json::from_slice::<replicate::failover::DemoteAsk>(body);
    let _ = serde_json::from_slice::<replicate::failover::SyncedAsk>(body);
    let _ = serde_json::from_slice::<replicate::failover::RoleState>(body);
    let _ = serde_json::from_slice::<replicate::failover::Changes>(body);
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = backstore::role::RoleRecord::decode(text);
    }
    let _ = serde_json::from_slice::<CycleRequest>(body);
    // The far site's states as a coordinator decides on them: any answers, no panic, and
    // a roll forward only of a cycle that is prepared where it is asked and committed elsewhere.
    if let Ok(states) = serde_json::from_slice::<Vec<CycleAnswer>>(body) {
        for (i, c) in replicate::cycle::roll_forward(&states) {
            assert_eq!(states[i].open, Some(c));
            assert_eq!(states[i].prepared, Some(c), "only a prepared cycle rolls forward");
            assert!(states.iter().any(|s| s.committed == Some(c)));
        }
        let _ = replicate::cycle::far_image(&states);
        // A promote's decision: a roll back only of an open cycle, a roll forward only of
        // a prepared one that another member committed.
        match replicate::cycle::settle(&states) {
            Ok(s) => {
                for &i in &s.back {
                    assert!(states[i].open.is_some(), "only an open cycle rolls back");
                }
                if let Some((c, members)) = &s.forward {
                    for &i in members {
                        assert_eq!(states[i].prepared, Some(*c));
                        assert_eq!(states[i].open, Some(*c));
                    }
                    assert!(states.iter().any(|o| o.committed == Some(*c)));
                }
            }
            Err(u) => {
                let _ = u.shown(|i| i.to_string());
            }
        }
    }
});
