//! Target-side login state machine driven by hand-written requests.

use iscsi::chap::ChapAlgorithm;
use iscsi::login::*;
use iscsi::negotiate::{ConnectionParams, SessionParams};
use iscsi::text::{decode_binary, encode_hex, parse_number, TextKeys};

const TARGET: &str = "iqn.2026-01.org.reservoir:disk1";
const INITIATOR: &str = "iqn.2026-01.org.example:host";
const ISID: [u8; 6] = [0x80, 0, 0, 1, 0, 1];

struct Policy {
    session: SessionParams,
    connection: ConnectionParams,
    auth: AuthRequirement,
    discovery: AuthRequirement,
    next_random: u8,
}

impl Policy {
    fn new(auth: AuthRequirement) -> Self {
        Policy {
            session: SessionParams {
                max_burst_length: 1 << 20,
                first_burst_length: 1 << 18,
                max_connections: 4,
                initial_r2t: false,
                ..SessionParams::default()
            },
            connection: ConnectionParams {
                header_digest: true,
                max_recv_data_segment_length: 65536,
                ..ConnectionParams::default()
            },
            auth,
            discovery: AuthRequirement::None,
            next_random: 1,
        }
    }
}

impl LoginPolicy for Policy {
    fn lookup_target(&self, target_name: &str, _initiator_name: &str) -> TargetLookup {
        match target_name {
            TARGET => TargetLookup::Found {
                alias: Some("disk one".into()),
                auth: self.auth.clone(),
            },
            "iqn.2026-01.org.reservoir:secret" => TargetLookup::Forbidden,
            _ => TargetLookup::NotFound,
        }
    }
    fn discovery_auth(&self) -> AuthRequirement {
        self.discovery.clone()
    }
    fn target_portal_group_tag(&self) -> u16 {
        7
    }
    fn session_preferences(&self) -> &SessionParams {
        &self.session
    }
    fn connection_preferences(&self) -> &ConnectionParams {
        &self.connection
    }
    fn random_bytes(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_random;
            self.next_random = self.next_random.wrapping_add(1);
        }
    }
}

fn chap_req() -> AuthRequirement {
    AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"initiator-secret".to_vec(),
        mutual: Some(("target-user".into(), b"target-secret!".to_vec())),
        algorithms: ChapAlgorithm::ALL.to_vec(),
    }
}

/// The response the exchanges below expect: CHAP_A=7,5,6 gets SHA-256.
fn chap_response(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
    ChapAlgorithm::Sha256.response(id, secret, challenge)
}

fn text(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut k = TextKeys::new();
    for (a, b) in pairs {
        k.push(*a, *b);
    }
    k.encode()
}

fn req(csg: u8, nsg: u8, transit: bool, data: &[u8]) -> LoginRequestView<'_> {
    LoginRequestView {
        transit,
        cont: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: ISID,
        tsih: 0,
        itt: 0x1234,
        cid: 0,
        cmdsn: 1,
        expstatsn: 0,
        data,
    }
}

fn keys_of(reply: &LoginReply) -> TextKeys {
    TextKeys::parse(&reply.data).unwrap()
}

fn expect_continue(step: LoginStep) -> LoginReply {
    match step {
        LoginStep::Continue(r) => {
            assert_eq!((r.status_class, r.status_detail), (0, 0));
            r
        }
        other => panic!("expected Continue, got {other:?}"),
    }
}

fn expect_failed(step: LoginStep, status: (u8, u8)) {
    match step {
        LoginStep::Failed(r) => {
            assert_eq!((r.status_class, r.status_detail), status);
            assert!(!r.transit);
        }
        other => panic!("expected Failed {status:?}, got {other:?}"),
    }
}

fn expect_done(step: LoginStep) -> (LoginReply, LoginOutcome) {
    match step {
        LoginStep::Done { reply, outcome } => {
            assert!(reply.transit);
            assert_eq!(reply.nsg, STAGE_FULL_FEATURE);
            assert_eq!((reply.status_class, reply.status_detail), (0, 0));
            (reply, outcome)
        }
        other => panic!("expected Done, got {other:?}"),
    }
}

#[test]
fn no_auth_to_full_feature_in_one_exchange() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
        ("HeaderDigest", "CRC32C,None"),
        ("DataDigest", "CRC32C,None"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("MaxBurstLength", "16776192"),
        ("FirstBurstLength", "262144"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxConnections", "8"),
    ]);
    let (reply, outcome) = expect_done(login.step(&req(1, 3, true, &data), &mut policy));
    assert_eq!(reply.csg, STAGE_OPERATIONAL);
    let keys = keys_of(&reply);
    assert_eq!(keys.get("TargetPortalGroupTag"), Some("7"));
    assert_eq!(keys.get("TargetAlias"), Some("disk one"));
    assert_eq!(keys.get("MaxRecvDataSegmentLength"), Some("65536"));
    assert_eq!(keys.get("HeaderDigest"), Some("CRC32C"));
    assert_eq!(keys.get("DataDigest"), Some("None"));
    assert_eq!(keys.get("MaxBurstLength"), Some("1048576"));
    assert_eq!(keys.get("FirstBurstLength"), Some("262144"));
    assert_eq!(keys.get("InitialR2T"), Some("No"));
    assert_eq!(keys.get("MaxConnections"), Some("4"));
    assert_eq!(outcome.initiator_name, INITIATOR);
    assert_eq!(outcome.target_name.as_deref(), Some(TARGET));
    assert_eq!(outcome.session_type, SessionType::Normal);
    assert_eq!(outcome.isid, ISID);
    assert_eq!(outcome.target_portal_group_tag, Some(7));
    assert_eq!(outcome.session.max_burst_length, 1 << 20);
    assert_eq!(outcome.session.first_burst_length, 1 << 18);
    assert!(!outcome.session.initial_r2t);
    assert_eq!(outcome.session.max_connections, 4);
    assert!(outcome.connection.header_digest);
    assert!(!outcome.connection.data_digest);
    assert_eq!(outcome.connection.max_send_data_segment_length, 262144);
    assert_eq!(outcome.connection.max_recv_data_segment_length, 65536);
    // Keys nobody offered keep the RFC defaults.
    assert_eq!(outcome.session.max_outstanding_r2t, 1);
    assert_eq!(outcome.session.default_time2wait, 2);
    // After Done the machine takes no more requests.
    expect_failed(
        login.step(&req(3, 0, false, &[]), &mut policy),
        status::INITIATOR_ERROR,
    );
}

#[test]
fn no_auth_in_two_exchanges_security_then_operational() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let first = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("AuthMethod", "None"),
    ]);
    let r = expect_continue(login.step(&req(0, 1, true, &first), &mut policy));
    assert!(r.transit);
    assert_eq!((r.csg, r.nsg), (0, 1));
    let keys = keys_of(&r);
    assert_eq!(keys.get("AuthMethod"), Some("None"));
    assert_eq!(keys.get("TargetPortalGroupTag"), Some("7"));
    // The alias is not disclosed before the operational stage.
    assert_eq!(keys.get("TargetAlias"), None);

    let second = text(&[("MaxOutstandingR2T", "16"), ("DefaultTime2Wait", "0")]);
    let (reply, outcome) = expect_done(login.step(&req(1, 3, true, &second), &mut policy));
    let keys = keys_of(&reply);
    assert_eq!(keys.get("MaxOutstandingR2T"), Some("1"));
    assert_eq!(keys.get("DefaultTime2Wait"), Some("2"));
    assert_eq!(keys.get("TargetAlias"), Some("disk one"));
    assert_eq!(keys.get("TargetPortalGroupTag"), None);
    assert_eq!(keys.get("MaxRecvDataSegmentLength"), Some("65536"));
    assert_eq!(outcome.session.max_outstanding_r2t, 1);
}

#[test]
fn target_never_transits_without_the_initiator() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let first = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("AuthMethod", "None"),
    ]);
    let r = expect_continue(login.step(&req(0, 0, false, &first), &mut policy));
    assert!(!r.transit);
    assert_eq!(r.csg, 0);
    let r = expect_continue(login.step(&req(0, 1, false, &[]), &mut policy));
    assert!(!r.transit);
    // The initiator asked for operational only: the target does not jump to FFP.
    let r = expect_continue(login.step(&req(0, 1, true, &[]), &mut policy));
    assert!(r.transit);
    assert_eq!(r.nsg, 1);
}

/// Runs the CHAP exchange up to the challenge; returns (login, id, challenge).
fn chap_until_challenge(policy: &mut Policy) -> (TargetLogin, u8, Vec<u8>) {
    let (login, id, challenge) = chap_offer(policy, "7,5,6", ChapAlgorithm::Sha256);
    (login, id, challenge)
}

/// The exchange up to the target's challenge, the initiator offering CHAP_A=`offer`;
/// the target must choose `alg` and send a challenge as long as its digest.
fn chap_offer(policy: &mut Policy, offer: &str, alg: ChapAlgorithm) -> (TargetLogin, u8, Vec<u8>) {
    let mut login = TargetLogin::new(true, None);
    let first = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("SessionType", "Normal"),
        ("AuthMethod", "CHAP,None"),
    ]);
    // open-iscsi asks to move on right away; the target holds it in the security stage.
    let r = expect_continue(login.step(&req(0, 1, true, &first), &mut *policy));
    assert!(!r.transit);
    assert_eq!(keys_of(&r).get("AuthMethod"), Some("CHAP"));
    let r =
        expect_continue(login.step(&req(0, 1, false, &text(&[("CHAP_A", offer)])), &mut *policy));
    let keys = keys_of(&r);
    assert_eq!(keys.get("CHAP_A"), Some(alg.code().to_string().as_str()));
    let id = parse_number(keys.get("CHAP_I").unwrap()).unwrap() as u8;
    let challenge = decode_binary(keys.get("CHAP_C").unwrap()).unwrap();
    assert_eq!(challenge.len(), alg.digest_len());
    (login, id, challenge)
}

#[test]
fn chap_one_way_success() {
    let mut policy = Policy::new(chap_req());
    let (mut login, id, challenge) = chap_until_challenge(&mut policy);
    let resp = encode_hex(&chap_response(id, b"initiator-secret", &challenge));
    let r = expect_continue(login.step(
        &req(0, 1, true, &text(&[("CHAP_N", "alice"), ("CHAP_R", &resp)])),
        &mut policy,
    ));
    assert!(r.transit);
    assert_eq!(r.nsg, 1);
    assert_eq!(keys_of(&r).get("CHAP_R"), None);
    let (_, outcome) = expect_done(login.step(&req(1, 3, true, &[]), &mut policy));
    assert_eq!(outcome.initiator_name, INITIATOR);
}

#[test]
fn chap_wrong_secret_or_user_fails_with_0201() {
    for (user, secret) in [
        ("alice", &b"wrong-secret"[..]),
        ("mallory", b"initiator-secret"),
    ] {
        let mut policy = Policy::new(chap_req());
        let (mut login, id, challenge) = chap_until_challenge(&mut policy);
        let resp = encode_hex(&chap_response(id, secret, &challenge));
        expect_failed(
            login.step(
                &req(0, 1, true, &text(&[("CHAP_N", user), ("CHAP_R", &resp)])),
                &mut policy,
            ),
            status::AUTHENTICATION_FAILURE,
        );
    }
}

#[test]
fn chap_mutual_target_answers_the_initiator_challenge() {
    let mut policy = Policy::new(chap_req());
    let (mut login, id, challenge) = chap_until_challenge(&mut policy);
    let resp = encode_hex(&chap_response(id, b"initiator-secret", &challenge));
    let my_challenge = [0xa5u8; 16];
    let r = expect_continue(login.step(
        &req(
            0,
            1,
            true,
            &text(&[
                ("CHAP_N", "alice"),
                ("CHAP_R", &resp),
                ("CHAP_I", "77"),
                ("CHAP_C", &encode_hex(&my_challenge)),
            ]),
        ),
        &mut policy,
    ));
    assert!(r.transit);
    let keys = keys_of(&r);
    assert_eq!(keys.get("CHAP_N"), Some("target-user"));
    let expected = chap_response(77, b"target-secret!", &my_challenge);
    assert_eq!(
        decode_binary(keys.get("CHAP_R").unwrap()).unwrap(),
        expected
    );
}

#[test]
fn chap_reflected_challenge_is_refused() {
    let mut policy = Policy::new(chap_req());
    let (mut login, id, challenge) = chap_until_challenge(&mut policy);
    let resp = encode_hex(&chap_response(id, b"initiator-secret", &challenge));
    expect_failed(
        login.step(
            &req(
                0,
                1,
                true,
                &text(&[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &resp),
                    ("CHAP_I", &id.to_string()),
                    ("CHAP_C", &encode_hex(&challenge)),
                ]),
            ),
            &mut policy,
        ),
        status::AUTHENTICATION_FAILURE,
    );
}

#[test]
fn chap_mutual_request_without_target_secret_fails() {
    let mut policy = Policy::new(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"initiator-secret".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    });
    let (mut login, id, challenge) = chap_until_challenge(&mut policy);
    let resp = encode_hex(&chap_response(id, b"initiator-secret", &challenge));
    expect_failed(
        login.step(
            &req(
                0,
                1,
                true,
                &text(&[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &resp),
                    ("CHAP_I", "1"),
                    ("CHAP_C", "0x00112233445566778899aabbccddeeff"),
                ]),
            ),
            &mut policy,
        ),
        status::AUTHENTICATION_FAILURE,
    );
}

#[test]
fn chap_for_normal_sessions_does_not_guard_discovery_without_its_own() {
    // The policy asks CHAP of normal sessions and nothing of discovery: a discovery login
    // that starts in the operational stage is in (found by the property test below).
    let mut policy = Policy::new(chap_req());
    let mut login = TargetLogin::new(true, None);
    let (_, outcome) = expect_done(login.step(
        &req(1, 3, true, b"SessionType=Discovery\0InitiatorName=i\0"),
        &mut policy,
    ));
    assert_eq!(outcome.session_type, SessionType::Discovery);
}

#[test]
fn chap_required_but_not_offered_or_skipped() {
    let mut policy = Policy::new(chap_req());
    let mut login = TargetLogin::new(true, None);
    let first = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("AuthMethod", "None"),
    ]);
    expect_failed(
        login.step(&req(0, 1, true, &first), &mut policy),
        status::AUTHENTICATION_FAILURE,
    );

    // Starting in the operational stage would skip authentication.
    let mut login = TargetLogin::new(true, None);
    let first = text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]);
    expect_failed(
        login.step(&req(1, 3, true, &first), &mut policy),
        status::AUTHENTICATION_FAILURE,
    );

    // Asking to leave the security stage without any AuthMethod.
    let mut login = TargetLogin::new(true, None);
    expect_failed(
        login.step(&req(0, 1, true, &first), &mut policy),
        status::AUTHENTICATION_FAILURE,
    );
}

#[test]
fn identity_errors() {
    let cases: Vec<(Vec<u8>, (u8, u8))> = vec![
        (text(&[("TargetName", TARGET)]), status::MISSING_PARAMETER),
        (
            text(&[("InitiatorName", INITIATOR)]),
            status::MISSING_PARAMETER,
        ),
        (
            text(&[("InitiatorName", INITIATOR), ("TargetName", "iqn.nope")]),
            status::NOT_FOUND,
        ),
        (
            text(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", "iqn.2026-01.org.reservoir:secret"),
            ]),
            status::AUTHORIZATION_FAILURE,
        ),
        (
            text(&[("InitiatorName", INITIATOR), ("SessionType", "Weird")]),
            status::SESSION_TYPE_NOT_SUPPORTED,
        ),
        (b"InitiatorName".to_vec(), status::INITIATOR_ERROR),
    ];
    for (data, st) in cases {
        let mut policy = Policy::new(AuthRequirement::None);
        let mut login = TargetLogin::new(true, None);
        expect_failed(login.step(&req(1, 3, true, &data), &mut policy), st);
    }
}

#[test]
fn unsupported_version() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let data = text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]);
    let mut r = req(1, 3, true, &data);
    r.version_min = 1;
    r.version_max = 2;
    expect_failed(login.step(&r, &mut policy), status::UNSUPPORTED_VERSION);
}

#[test]
fn protocol_errors_in_flags_and_identifiers() {
    let data = text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]);
    type Mutation = Box<dyn Fn(&mut LoginRequestView)>;
    let bad: Vec<Mutation> = vec![
        Box::new(|r| r.isid = [0; 6]),
        Box::new(|r| r.itt = 99),
        Box::new(|r| r.cid = 3),
        Box::new(|r| r.cont = true),                  // C and T together
        Box::new(|r| r.nsg = 2),                      // no such stage
        Box::new(|r| r.csg = 1),                      // not the stage we are in
        Box::new(|r| (r.transit, r.nsg) = (true, 0)), // transit backwards
    ];
    for mutate in bad {
        let mut policy = Policy::new(AuthRequirement::None);
        let mut login = TargetLogin::new(true, None);
        let first = req(0, 1, false, &data);
        expect_continue(login.step(&first, &mut policy));
        let mut second = req(0, 1, true, &[]);
        mutate(&mut second);
        expect_failed(login.step(&second, &mut policy), status::INITIATOR_ERROR);
    }
}

#[test]
fn key_flood_ends_with_initiator_error() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let data = text(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]);
    expect_continue(login.step(&req(1, 3, false, &data), &mut policy));
    let mut n = 1;
    loop {
        let key = format!("X-flood{n}");
        let data = text(&[(&key, "1")]);
        n += 1;
        match login.step(&req(1, 3, false, &data), &mut policy) {
            LoginStep::Continue(r) => {
                assert_eq!(keys_of(&r).get(&key), Some("NotUnderstood"));
                assert!(n <= MAX_LOGIN_PDUS);
            }
            LoginStep::Failed(r) => {
                assert_eq!((r.status_class, r.status_detail), status::INITIATOR_ERROR);
                assert_eq!(n, MAX_LOGIN_PDUS + 1);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_key_negotiated_twice_is_an_initiator_error() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("MaxBurstLength", "65536"),
    ]);
    expect_continue(login.step(&req(1, 3, false, &data), &mut policy));
    // Repeating a name unchanged is tolerated...
    let again = text(&[("InitiatorName", INITIATOR)]);
    expect_continue(login.step(&req(1, 3, false, &again), &mut policy));
    // ...renegotiating a key is not.
    let again = text(&[("MaxBurstLength", "65536")]);
    expect_failed(
        login.step(&req(1, 3, true, &again), &mut policy),
        status::INITIATOR_ERROR,
    );

    let mut login = TargetLogin::new(true, None);
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("ImmediateData", "Yes"),
        ("ImmediateData", "No"),
    ]);
    expect_failed(
        login.step(&req(1, 3, true, &data), &mut policy),
        status::INITIATOR_ERROR,
    );
}

#[test]
fn not_understood_irrelevant_and_reject_answers() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("X-com.example.Feature", "Yes"),
        ("RDMAExtensions", "Yes"),
        ("MaxBurstLength", "lots"),
        ("ErrorRecoveryLevel", "7"),
        ("InitialR2T", "Maybe"),
        ("HeaderDigest", "MD5"),
        ("OFMarker", "Yes"),
        ("OFMarkInt", "2048~8192"),
        ("TargetAlias", "spoofed"),
    ]);
    let (reply, outcome) = expect_done(login.step(&req(1, 3, true, &data), &mut policy));
    let keys = keys_of(&reply);
    assert_eq!(keys.get("X-com.example.Feature"), Some("NotUnderstood"));
    assert_eq!(keys.get("RDMAExtensions"), Some("NotUnderstood"));
    assert_eq!(keys.get("MaxBurstLength"), Some("Reject"));
    assert_eq!(keys.get("ErrorRecoveryLevel"), Some("Reject"));
    assert_eq!(keys.get("InitialR2T"), Some("Reject"));
    assert_eq!(keys.get("HeaderDigest"), Some("Reject"));
    assert_eq!(keys.get("OFMarker"), Some("No"));
    assert_eq!(keys.get("OFMarkInt"), Some("Irrelevant"));
    // The initiator's TargetAlias is answered, ours is declared after it.
    assert_eq!(keys.get("TargetAlias"), Some("Irrelevant"));
    assert!(keys
        .iter()
        .any(|(k, v)| k == "TargetAlias" && v == "disk one"));
    assert_eq!(outcome.session.max_burst_length, 262144);
}

#[test]
fn discovery_session_answers_session_keys_irrelevant() {
    let mut policy = Policy::new(chap_req());
    let mut login = TargetLogin::new(true, None);
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("SessionType", "Discovery"),
        ("MaxConnections", "1"),
        ("InitialR2T", "Yes"),
        ("MaxBurstLength", "65536"),
        ("HeaderDigest", "None"),
        ("MaxRecvDataSegmentLength", "32768"),
    ]);
    let (reply, outcome) = expect_done(login.step(&req(1, 3, true, &data), &mut policy));
    let keys = keys_of(&reply);
    assert_eq!(keys.get("MaxConnections"), Some("Irrelevant"));
    assert_eq!(keys.get("InitialR2T"), Some("Irrelevant"));
    assert_eq!(keys.get("MaxBurstLength"), Some("Irrelevant"));
    assert_eq!(keys.get("HeaderDigest"), Some("None"));
    assert_eq!(keys.get("TargetAlias"), None);
    assert_eq!(outcome.session_type, SessionType::Discovery);
    assert_eq!(outcome.target_name, None);
    assert_eq!(outcome.connection.max_send_data_segment_length, 32768);
}

#[test]
fn non_leading_connection_keeps_session_keys() {
    let mut policy = Policy::new(AuthRequirement::None);
    let fixed = SessionParams {
        max_burst_length: 131072,
        max_connections: 4,
        ..SessionParams::default()
    };
    let mut login = TargetLogin::new(false, Some(fixed.clone()));
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("MaxBurstLength", "4096"),
        ("HeaderDigest", "CRC32C"),
    ]);
    let mut r = req(1, 3, true, &data);
    r.tsih = 9;
    r.cid = 2;
    let (reply, outcome) = expect_done(login.step(&r, &mut policy));
    let keys = keys_of(&reply);
    assert_eq!(keys.get("MaxBurstLength"), Some("Irrelevant"));
    assert_eq!(keys.get("HeaderDigest"), Some("CRC32C"));
    assert_eq!(keys.get("TargetPortalGroupTag"), None);
    assert_eq!(outcome.session, fixed);
    assert_eq!(outcome.tsih, 9);
    assert!(outcome.connection.header_digest);
}

#[test]
fn continued_request_is_gathered_before_answering() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let data = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("MaxBurstLength", "65536"),
    ]);
    let (a, b) = data.split_at(20);
    let mut first = req(1, 3, false, a);
    first.cont = true;
    let r = expect_continue(login.step(&first, &mut policy));
    assert!(r.data.is_empty());
    assert!(!r.transit && !r.cont);
    let (reply, outcome) = expect_done(login.step(&req(1, 3, true, b), &mut policy));
    assert_eq!(keys_of(&reply).get("MaxBurstLength"), Some("65536"));
    assert_eq!(outcome.session.max_burst_length, 65536);
}

#[test]
fn long_response_is_split_with_the_c_bit() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let mut pairs = vec![
        ("InitiatorName".to_string(), INITIATOR.to_string()),
        ("TargetName".to_string(), TARGET.to_string()),
    ];
    for i in 0..600 {
        pairs.push((format!("X-k{i}"), "1".into()));
    }
    let data = TextKeys(pairs).encode();
    assert!(data.len() < LOGIN_MAX_SEGMENT);
    let mut step = login.step(&req(1, 3, true, &data), &mut policy);
    let mut joined = Vec::new();
    let mut parts = 0;
    let outcome = loop {
        parts += 1;
        match step {
            LoginStep::Continue(r) => {
                assert!(r.cont, "only partial replies before Done");
                assert!(!r.transit);
                assert!(r.data.len() <= LOGIN_MAX_SEGMENT);
                joined.extend_from_slice(&r.data);
                step = login.step(&req(1, 3, false, &[]), &mut policy);
            }
            LoginStep::Done { reply, outcome } => {
                assert!(!reply.cont && reply.transit);
                joined.extend_from_slice(&reply.data);
                break outcome;
            }
            LoginStep::Failed(r) => panic!("{r:?}"),
        }
    };
    assert!(parts >= 2);
    let keys = TextKeys::parse(&joined).unwrap();
    assert_eq!(keys.get("X-k599"), Some("NotUnderstood"));
    assert_eq!(outcome.initiator_name, INITIATOR);
}

#[test]
fn continuation_flood_is_bounded() {
    let mut policy = Policy::new(AuthRequirement::None);
    let mut login = TargetLogin::new(true, None);
    let chunk = vec![b'a'; 8192];
    let mut failed = false;
    for _ in 0..MAX_LOGIN_PDUS + 1 {
        let mut r = req(0, 0, false, &chunk);
        r.cont = true;
        match login.step(&r, &mut policy) {
            LoginStep::Continue(_) => {}
            LoginStep::Failed(r) => {
                assert_eq!((r.status_class, r.status_detail), status::INITIATOR_ERROR);
                failed = true;
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(failed);
}

mod arbitrary_sequences {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = (u8, Vec<u8>)> {
        let keyish = proptest::collection::vec(
            prop_oneof![
                Just(b"InitiatorName=i\0".to_vec()),
                Just(format!("TargetName={TARGET}\0").into_bytes()),
                Just(b"AuthMethod=CHAP,None\0".to_vec()),
                Just(b"CHAP_A=5\0".to_vec()),
                Just(b"CHAP_N=alice\0".to_vec()),
                Just(b"CHAP_R=0x00112233445566778899aabbccddeeff\0".to_vec()),
                Just(b"CHAP_I=1\0CHAP_C=0x0102\0".to_vec()),
                Just(b"MaxBurstLength=4096\0".to_vec()),
                Just(b"SessionType=Discovery\0".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..40),
            ],
            0..6,
        )
        .prop_map(|parts| parts.concat());
        (any::<u8>(), keyish)
    }

    proptest! {
        /// What the fuzz target checks, on every test run.
        #[test]
        fn target_login_survives_any_sequence(
            chap in any::<bool>(),
            records in proptest::collection::vec(record(), 1..20),
        ) {
            let mut policy = Policy::new(if chap { chap_req() } else { AuthRequirement::None });
            let mut login = TargetLogin::new(true, None);
            for (flags, data) in &records {
                let mut r = req((flags >> 2) & 3, flags & 3, flags & 0x80 != 0, data);
                r.cont = flags & 0x40 != 0;
                match login.step(&r, &mut policy) {
                    LoginStep::Continue(reply) => {
                        prop_assert!(!reply.transit || r.transit);
                        prop_assert!(!(reply.transit && reply.cont));
                        prop_assert!(reply.nsg <= r.nsg || !reply.transit);
                    }
                    LoginStep::Done { reply, outcome } => {
                        prop_assert_eq!(reply.nsg, STAGE_FULL_FEATURE);
                        // Nobody reaches full feature phase past CHAP with a made-up response;
                        // CHAP guards normal sessions here, discovery asks for nothing.
                        prop_assert!(!chap || outcome.session_type == SessionType::Discovery);
                        break;
                    }
                    LoginStep::Failed(_) => break,
                }
            }
        }
    }
}

#[test]
fn chap_each_algorithm_one_way_and_mutual() {
    use ChapAlgorithm::*;
    for alg in ChapAlgorithm::ALL {
        let mut policy = Policy::new(chap_req());
        let (mut login, id, challenge) = chap_offer(&mut policy, &alg.code().to_string(), alg);
        let resp = encode_hex(&alg.response(id, b"initiator-secret", &challenge));
        let mine = vec![0x5au8; alg.digest_len()];
        let r = expect_continue(login.step(
            &req(
                0,
                1,
                true,
                &text(&[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &resp),
                    ("CHAP_I", "9"),
                    ("CHAP_C", &encode_hex(&mine)),
                ]),
            ),
            &mut policy,
        ));
        assert!(r.transit, "{alg}");
        let got = decode_binary(keys_of(&r).get("CHAP_R").unwrap()).unwrap();
        assert_eq!(got, alg.response(9, b"target-secret!", &mine), "{alg}");
        // The same exchange answered with another algorithm's response fails.
        let other = if alg == Md5 { Sha256 } else { Md5 };
        let mut policy = Policy::new(chap_req());
        let (mut login, id, challenge) = chap_offer(&mut policy, &alg.code().to_string(), alg);
        let resp = encode_hex(&other.response(id, b"initiator-secret", &challenge));
        expect_failed(
            login.step(
                &req(0, 1, true, &text(&[("CHAP_N", "alice"), ("CHAP_R", &resp)])),
                &mut policy,
            ),
            status::AUTHENTICATION_FAILURE,
        );
    }
}

#[test]
fn chap_takes_the_initiators_first_accepted_algorithm() {
    use ChapAlgorithm::*;
    let mut policy = Policy::new(chap_req());
    chap_offer(&mut policy, "5,8,7", Md5);
    let mut policy = Policy::new(chap_req());
    chap_offer(&mut policy, "6,8,5", Sha3_256);
    // A target that refuses MD5 passes over it in the offer.
    let sha_only = AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"initiator-secret".to_vec(),
        mutual: None,
        algorithms: vec![Sha3_256, Sha256],
    };
    let mut policy = Policy::new(sha_only);
    chap_offer(&mut policy, "5,7", Sha256);
}

#[test]
fn chap_md5_refused_where_only_sha_is_accepted() {
    let mut policy = Policy::new(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"initiator-secret".to_vec(),
        mutual: None,
        algorithms: vec![ChapAlgorithm::Sha3_256, ChapAlgorithm::Sha256],
    });
    let mut login = TargetLogin::new(true, None);
    let first = text(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("AuthMethod", "CHAP"),
    ]);
    expect_continue(login.step(&req(0, 1, false, &first), &mut policy));
    expect_failed(
        login.step(&req(0, 1, false, &text(&[("CHAP_A", "5")])), &mut policy),
        status::AUTHENTICATION_FAILURE,
    );
    assert_eq!(
        login.auth_failure(),
        Some("initiator offered CHAP_A=5; accepted here: SHA3-256, SHA-256")
    );
}
