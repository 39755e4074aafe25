//! InitiatorLogin and TargetLogin talking to each other through PDU fields.

use iscsi::chap::ChapAlgorithm;
use iscsi::login::*;
use iscsi::negotiate::{ConnectionParams, PacingPolicy, SessionParams, TargetPacing};

const TARGET: &str = "iqn.2026-01.org.reservoir:disk1";
const INITIATOR: &str = "iqn.2026-01.org.example:host";
const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0, 1];

struct Policy {
    session: SessionParams,
    connection: ConnectionParams,
    auth: AuthRequirement,
    alias: Option<String>,
    seed: u8,
    /// `None`: the target does not know X-org.reservoir.PacingRate (tgt, LIO).
    pacing: Option<PacingPolicy>,
}

impl LoginPolicy for Policy {
    fn lookup_target(&self, target_name: &str, _initiator: &str) -> TargetLookup {
        if target_name == TARGET {
            TargetLookup::Found {
                alias: self.alias.clone(),
                auth: self.auth.clone(),
            }
        } else {
            TargetLookup::NotFound
        }
    }
    fn discovery_auth(&self) -> AuthRequirement {
        AuthRequirement::None
    }
    fn target_portal_group_tag(&self) -> u16 {
        3
    }
    fn session_preferences(&self) -> &SessionParams {
        &self.session
    }
    fn connection_preferences(&self) -> &ConnectionParams {
        &self.connection
    }
    fn pacing_policy(&self) -> Option<PacingPolicy> {
        self.pacing
    }
    fn random_bytes(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.seed = self.seed.wrapping_mul(31).wrapping_add(7);
            *b = self.seed;
        }
    }
}

fn policy(auth: AuthRequirement) -> Policy {
    Policy {
        session: SessionParams {
            max_burst_length: 1 << 20,
            first_burst_length: 1 << 17,
            max_connections: 8,
            max_outstanding_r2t: 4,
            ..SessionParams::default()
        },
        connection: ConnectionParams {
            header_digest: true,
            data_digest: false,
            max_recv_data_segment_length: 131072,
            ..ConnectionParams::default()
        },
        auth,
        alias: Some("first disk".into()),
        seed: 5,
        pacing: None,
    }
}

fn config(auth: Option<ChapCredentials>) -> InitiatorLoginConfig {
    InitiatorLoginConfig {
        initiator_name: INITIATOR.into(),
        initiator_alias: Some("host".into()),
        target_name: Some(TARGET.into()),
        session_type: SessionType::Normal,
        isid: ISID,
        tsih: 0,
        cid: 0,
        auth,
        session: SessionParams {
            max_burst_length: 16_776_192,
            first_burst_length: 262_144,
            max_connections: 4,
            max_outstanding_r2t: 16,
            initial_r2t: false,
            ..SessionParams::default()
        },
        connection: ConnectionParams {
            header_digest: true,
            data_digest: true,
            max_recv_data_segment_length: 262_144,
            ..ConnectionParams::default()
        },
        leading: true,
        pacing_hint: None,
        start_hint: None,
        probe_hint: None,
    }
}

/// Initiator outcome, target outcome, number of exchanges.
type Success = (LoginOutcome, LoginOutcome, usize);
/// The initiator's own error, or the status of the target's reject.
type Failure = Result<LoginError, (u8, u8)>;

/// Runs a whole login. Returns both outcomes, or the initiator's error, or the target's
/// reject status.
fn run(
    mut initiator: InitiatorLogin,
    mut target: TargetLogin,
    policy: &mut Policy,
    tsih_assigned: u16,
) -> Result<Success, Failure> {
    let mut counter = 100u8;
    let mut rng = move |buf: &mut [u8]| {
        for b in buf {
            counter = counter.wrapping_add(13);
            *b = counter;
        }
    };
    let mut out = initiator.start(&mut rng);
    let mut exchanges = 0;
    loop {
        exchanges += 1;
        assert!(exchanges < 100, "login does not converge");
        assert!(out.data.len() <= LOGIN_MAX_SEGMENT);
        let view = LoginRequestView {
            transit: out.transit,
            cont: out.cont,
            csg: out.csg,
            nsg: out.nsg,
            version_max: out.version_max,
            version_min: out.version_min,
            isid: out.isid,
            tsih: out.tsih,
            itt: 42,
            cid: out.cid,
            cmdsn: 1,
            expstatsn: exchanges,
            data: &out.data,
        };
        let (reply, target_outcome, failed) = match target.step(&view, policy) {
            LoginStep::Continue(r) => (r, None, false),
            LoginStep::Done { reply, outcome } => (reply, Some(outcome), false),
            LoginStep::Failed(r) => (r, None, true),
        };
        assert!(reply.data.len() <= LOGIN_MAX_SEGMENT);
        let tsih = if target_outcome.is_some() {
            tsih_assigned
        } else {
            out.tsih
        };
        let resp = LoginResponseView {
            transit: reply.transit,
            cont: reply.cont,
            csg: reply.csg,
            nsg: reply.nsg,
            version_max: 0,
            version_active: 0,
            isid: ISID,
            tsih,
            itt: 42,
            statsn: exchanges,
            status_class: reply.status_class,
            status_detail: reply.status_detail,
            data: &reply.data,
        };
        match initiator.on_response(&resp, &mut rng) {
            InitiatorStep::Send(next) => {
                assert!(!failed, "initiator goes on after a reject");
                assert!(target_outcome.is_none(), "target done, initiator not");
                out = next;
            }
            InitiatorStep::Done(init_outcome) => {
                let t = target_outcome.expect("initiator done, target not");
                return Ok((init_outcome, t, exchanges as usize));
            }
            InitiatorStep::Failed(e) => {
                if failed {
                    assert_eq!(
                        (e.status_class, e.status_detail),
                        (reply.status_class, reply.status_detail)
                    );
                    return Err(Err((reply.status_class, reply.status_detail)));
                }
                return Err(Ok(e));
            }
        }
    }
}

fn assert_agree(i: &LoginOutcome, t: &LoginOutcome) {
    assert_eq!(i.session, t.session);
    assert_eq!(i.connection.header_digest, t.connection.header_digest);
    assert_eq!(i.connection.data_digest, t.connection.data_digest);
    assert_eq!(
        i.connection.max_send_data_segment_length,
        t.connection.max_recv_data_segment_length
    );
    assert_eq!(
        i.connection.max_recv_data_segment_length,
        t.connection.max_send_data_segment_length
    );
    assert_eq!(i.isid, t.isid);
    assert_eq!(i.session_type, t.session_type);
}

#[test]
fn no_auth_normal_session() {
    let mut p = policy(AuthRequirement::None);
    let (i, t, exchanges) = run(
        InitiatorLogin::new(config(None)),
        TargetLogin::new(true, None),
        &mut p,
        0x77,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert_eq!(exchanges, 2);
    assert_eq!(i.tsih, 0x77);
    assert_eq!(i.target_alias.as_deref(), Some("first disk"));
    assert_eq!(i.target_portal_group_tag, Some(3));
    assert_eq!(i.session.max_burst_length, 1 << 20);
    assert_eq!(i.session.first_burst_length, 1 << 17);
    assert_eq!(i.session.max_connections, 4);
    assert_eq!(i.session.max_outstanding_r2t, 4);
    // InitialR2T is OR: the target wants Yes.
    assert!(i.session.initial_r2t);
    assert!(i.connection.header_digest);
    assert!(!i.connection.data_digest);
    assert_eq!(i.connection.max_send_data_segment_length, 131072);
    assert_eq!(t.initiator_alias.as_deref(), Some("host"));
}

#[test]
fn no_auth_login_skipping_the_security_stage_takes_one_exchange() {
    let mut p = policy(AuthRequirement::None);
    let (i, t, exchanges) = run(
        InitiatorLogin::new(config(None)).skip_security(true),
        TargetLogin::new(true, None),
        &mut p,
        0x77,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert_eq!(exchanges, 1);
    assert_eq!(i.tsih, 0x77);
    // The same answers as through the security stage.
    assert_eq!(i.target_alias.as_deref(), Some("first disk"));
    assert_eq!(i.target_portal_group_tag, Some(3));
    assert_eq!(i.session.max_burst_length, 1 << 20);
    assert!(i.session.initial_r2t);
    assert!(i.connection.header_digest);
}

#[test]
fn skipping_the_security_stage_is_refused_where_chap_is_required() {
    let mut p = policy(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    });
    let r = run(
        InitiatorLogin::new(config(None)).skip_security(true),
        TargetLogin::new(true, None),
        &mut p,
        1,
    );
    assert!(matches!(r, Err(Err((2, 1)))), "{r:?}");
}

#[test]
fn with_credentials_skip_security_still_authenticates() {
    let mut p = policy(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    });
    let creds = ChapCredentials {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    };
    let (i, t, exchanges) = run(
        InitiatorLogin::new(config(Some(creds))).skip_security(true),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert_eq!(exchanges, 4);
}

#[test]
fn chap_one_way() {
    let mut p = policy(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    });
    let creds = ChapCredentials {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    };
    let (i, t, exchanges) = run(
        InitiatorLogin::new(config(Some(creds))),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert_eq!(exchanges, 4);
}

#[test]
fn chap_wrong_secret_is_reported_as_0201() {
    let mut p = policy(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    });
    let creds = ChapCredentials {
        user: "alice".into(),
        secret: b"not-the-secret".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    };
    let err = run(
        InitiatorLogin::new(config(Some(creds))),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap_err();
    assert_eq!(err, Err(status::AUTHENTICATION_FAILURE));
}

#[test]
fn chap_mutual_both_directions() {
    let target_auth = AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: Some(("iqn.target-chap".into(), b"target-secret-34".to_vec())),
        algorithms: ChapAlgorithm::ALL.to_vec(),
    };
    let creds = |target_secret: &[u8]| ChapCredentials {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: Some(target_secret.to_vec()),
        algorithms: ChapAlgorithm::ALL.to_vec(),
    };
    let mut p = policy(target_auth.clone());
    let (i, t, _) = run(
        InitiatorLogin::new(config(Some(creds(b"target-secret-34")))),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_agree(&i, &t);

    // An impostor target that does not know the target secret is caught by the initiator.
    let mut p = policy(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: Some(("iqn.target-chap".into(), b"guessed-secret".to_vec())),
        algorithms: ChapAlgorithm::ALL.to_vec(),
    });
    let err = run(
        InitiatorLogin::new(config(Some(creds(b"target-secret-34")))),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap_err()
    .unwrap();
    assert_eq!(err.status_class, 2);
    assert_eq!(err.status_detail, 1);
    assert!(
        err.message.contains("authentication failed"),
        "{}",
        err.message
    );

    // A target that offers no authentication at all does not satisfy mutual CHAP.
    let mut p = policy(AuthRequirement::None);
    let err = run(
        InitiatorLogin::new(config(Some(creds(b"target-secret-34")))),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap_err();
    // The target refuses (only CHAP was offered), before the initiator has to.
    assert_eq!(err, Err(status::AUTHENTICATION_FAILURE));
}

#[test]
fn chap_credentials_against_a_target_without_auth() {
    let mut p = policy(AuthRequirement::None);
    let creds = ChapCredentials {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: ChapAlgorithm::ALL.to_vec(),
    };
    let (i, t, _) = run(
        InitiatorLogin::new(config(Some(creds))),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_agree(&i, &t);
}

#[test]
fn discovery_session() {
    let mut p = policy(AuthRequirement::None);
    let mut c = config(None);
    c.session_type = SessionType::Discovery;
    c.target_name = None;
    let (i, t, _) = run(
        InitiatorLogin::new(c),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert_eq!(t.session_type, SessionType::Discovery);
    assert_eq!(t.target_name, None);
    assert_eq!(i.target_alias, None);
    // No session keys are negotiated in discovery: defaults.
    assert_eq!(i.session, SessionParams::default());
}

#[test]
fn mcs_non_leading_connection() {
    let mut p = policy(AuthRequirement::None);
    let (lead_i, lead_t, _) = run(
        InitiatorLogin::new(config(None)),
        TargetLogin::new(true, None),
        &mut p,
        0x21,
    )
    .unwrap();
    assert_eq!(lead_i.tsih, 0x21);
    let mut c = config(None);
    c.leading = false;
    c.tsih = lead_i.tsih;
    c.cid = 1;
    c.session = lead_i.session.clone();
    c.connection.data_digest = false;
    let (i, t, _) = run(
        InitiatorLogin::new(c),
        TargetLogin::new(false, Some(lead_t.session.clone())),
        &mut p,
        0x21,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert_eq!(i.session, lead_i.session);
    assert_eq!(t.session, lead_t.session);
    assert_eq!(t.tsih, 0x21);
    assert_eq!(i.target_portal_group_tag, None);
    assert!(!i.connection.data_digest);
}

#[test]
fn unknown_target_is_reported() {
    let mut p = policy(AuthRequirement::None);
    let mut c = config(None);
    c.target_name = Some("iqn.2026-01.org.reservoir:nothing".into());
    let err = run(
        InitiatorLogin::new(c),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap_err();
    assert_eq!(err, Err(status::NOT_FOUND));
}

#[test]
fn long_target_response_is_reassembled_by_the_initiator() {
    let mut p = policy(AuthRequirement::None);
    p.alias = Some("a".repeat(8000));
    let (i, t, exchanges) = run(
        InitiatorLogin::new(config(None)),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_agree(&i, &t);
    assert!(exchanges >= 3, "the split response takes an extra exchange");
    assert_eq!(i.target_alias.as_deref().map(str::len), Some(8000));
}

#[test]
fn initiator_error_messages() {
    let mut login = InitiatorLogin::new(config(None));
    let mut rng = |_: &mut [u8]| {};
    let _ = login.start(&mut rng);
    let resp = LoginResponseView {
        transit: false,
        cont: false,
        csg: 0,
        nsg: 0,
        version_max: 0,
        version_active: 0,
        isid: ISID,
        tsih: 0,
        itt: 1,
        statsn: 0,
        status_class: 1,
        status_detail: 1,
        data: b"TargetAddress=10.0.0.2:3260,1\0",
    };
    match login.on_response(&resp, &mut rng) {
        InitiatorStep::Failed(e) => {
            assert_eq!(e.target_address.as_deref(), Some("10.0.0.2:3260,1"));
            assert!(e.message.contains("moved temporarily"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }

    // A target that jumps to full feature phase although we asked for operational.
    let mut login = InitiatorLogin::new(config(None));
    let first = login.start(&mut rng);
    assert!(first.transit);
    assert_eq!(first.nsg, 1);
    let resp = LoginResponseView {
        transit: true,
        nsg: 3,
        status_class: 0,
        status_detail: 0,
        data: b"",
        ..resp
    };
    assert!(matches!(
        login.on_response(&resp, &mut rng),
        InitiatorStep::Failed(_)
    ));
}

/// Every connection's login carries X-org.reservoir.PacingRate; a target that knows it
/// paces that connection at the hint and says so, one that does not answers NotUnderstood
/// and the login goes on exactly as without the key.
#[test]
fn pacing_hint_on_leading_and_non_leading_logins() {
    let accepting = Some(PacingPolicy {
        accept_hint: true,
        configured: None,
    });
    let login = |pacing: Option<PacingPolicy>,
                 leading: Option<&LoginOutcome>,
                 hint: Option<u64>,
                 auth: bool| {
        let mut p = policy(AuthRequirement::None);
        p.pacing = pacing;
        let creds = auth.then(|| ChapCredentials {
            user: "alice".into(),
            secret: b"alice-secret-12".to_vec(),
            mutual: None,
            algorithms: ChapAlgorithm::ALL.to_vec(),
        });
        if auth {
            p.auth = AuthRequirement::Chap {
                user: "alice".into(),
                secret: b"alice-secret-12".to_vec(),
                mutual: None,
                algorithms: ChapAlgorithm::ALL.to_vec(),
            };
        }
        let mut c = config(creds);
        c.pacing_hint = hint;
        let target = match leading {
            None => TargetLogin::new(true, None),
            Some(lead) => {
                c.leading = false;
                c.tsih = lead.tsih;
                c.cid = 1;
                c.session = lead.session.clone();
                TargetLogin::new(false, Some(lead.session.clone()))
            }
        };
        run(InitiatorLogin::new(c), target, &mut p, 0x31).unwrap()
    };
    // Reservoir's target: leading, non-leading, and through CHAP.
    let (lead_i, lead_t, _) = login(accepting, None, Some(1_640_625), false);
    assert_agree(&lead_i, &lead_t);
    assert_eq!(lead_i.pacing, TargetPacing::Paced(1_640_625));
    assert_eq!(lead_t.pacing, TargetPacing::Paced(1_640_625));
    let (i, t, _) = login(accepting, Some(&lead_i), Some(1_640_625), false);
    assert_agree(&i, &t);
    assert_eq!(
        (i.pacing, t.pacing),
        (
            TargetPacing::Paced(1_640_625),
            TargetPacing::Paced(1_640_625)
        )
    );
    let (i, t, exchanges) = login(accepting, None, Some(1_000_000), true);
    assert_eq!(
        (i.pacing, t.pacing),
        (
            TargetPacing::Paced(1_000_000),
            TargetPacing::Paced(1_000_000)
        )
    );
    assert_eq!(exchanges, 4);
    // An absurdly low hint is raised to the floor, and the initiator learns the rate.
    let (i, t, _) = login(accepting, None, Some(10), false);
    assert_eq!(
        i.pacing,
        TargetPacing::Paced(iscsi::negotiate::PACING_HINT_MIN)
    );
    assert_eq!(t.pacing, i.pacing);
    // Without a hint nothing is sent, nothing applied.
    let (i, t, _) = login(accepting, None, None, false);
    assert_eq!(
        (i.pacing, t.pacing),
        (TargetPacing::NotAsked, TargetPacing::NotAsked)
    );

    // A target that does not know the key (what tgt and LIO do): NotUnderstood, and the
    // session's parameters come out as they do without the key.
    let (plain_i, plain_t, _) = login(None, None, None, false);
    let (i, t, exchanges) = login(None, None, Some(1_640_625), false);
    assert_eq!(i.pacing, TargetPacing::NotUnderstood);
    assert_eq!(t.pacing, TargetPacing::NotAsked);
    assert_eq!(exchanges, 2);
    assert_eq!(
        (&i.session, &i.connection),
        (&plain_i.session, &plain_i.connection)
    );
    assert_agree(&i, &t);
    assert_agree(&plain_i, &plain_t);
    let (i, _, _) = login(None, Some(&lead_i), Some(1_640_625), false);
    assert_eq!(i.pacing, TargetPacing::NotUnderstood);

    // A target configured to ignore hints says it does not pace.
    let ignoring = Some(PacingPolicy {
        accept_hint: false,
        configured: None,
    });
    let (i, t, _) = login(ignoring, None, Some(1_640_625), false);
    assert_eq!(
        (i.pacing, t.pacing),
        (TargetPacing::NotPaced, TargetPacing::NotPaced)
    );
}

/// The key is answered in the login only: in a discovery session it is irrelevant.
#[test]
fn pacing_hint_is_not_sent_in_discovery() {
    let mut p = policy(AuthRequirement::None);
    p.pacing = Some(PacingPolicy {
        accept_hint: true,
        configured: None,
    });
    let mut c = config(None);
    c.session_type = SessionType::Discovery;
    c.target_name = None;
    c.pacing_hint = Some(1_000_000);
    let (i, t, _) = run(
        InitiatorLogin::new(c),
        TargetLogin::new(true, None),
        &mut p,
        1,
    )
    .unwrap();
    assert_eq!(
        (i.pacing, t.pacing),
        (TargetPacing::NotAsked, TargetPacing::NotAsked)
    );
}

/// Our initiator and our target, for each algorithm alone and for the default lists,
/// one-way and mutual; the algorithm they agree on is the initiator's first that the
/// target accepts.
#[test]
fn chap_every_algorithm_both_ways() {
    use ChapAlgorithm::*;
    let target = |algorithms: Vec<ChapAlgorithm>, mutual: bool| AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: mutual.then(|| ("iqn.target-chap".into(), b"target-secret-34".to_vec())),
        algorithms,
    };
    let creds = |algorithms: Vec<ChapAlgorithm>, mutual: bool| ChapCredentials {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: mutual.then(|| b"target-secret-34".to_vec()),
        algorithms,
    };
    let cases: Vec<(Vec<ChapAlgorithm>, Vec<ChapAlgorithm>)> = vec![
        (vec![Md5], ChapAlgorithm::ALL.to_vec()),
        (vec![Sha256], ChapAlgorithm::ALL.to_vec()),
        (vec![Sha3_256], ChapAlgorithm::ALL.to_vec()),
        (ChapAlgorithm::ALL.to_vec(), vec![Md5]),
        (ChapAlgorithm::ALL.to_vec(), vec![Sha256]),
        (ChapAlgorithm::ALL.to_vec(), vec![Sha3_256]),
        (vec![Md5, Sha256], vec![Sha3_256, Sha256]),
    ];
    for mutual in [false, true] {
        for (offered, accepted) in &cases {
            let mut p = policy(target(accepted.clone(), mutual));
            let (i, t, _) = run(
                InitiatorLogin::new(config(Some(creds(offered.clone(), mutual)))),
                TargetLogin::new(true, None),
                &mut p,
                1,
            )
            .unwrap_or_else(|e| panic!("{offered:?} to {accepted:?}: {e:?}"));
            assert_agree(&i, &t);
            // The wrong secret fails with each of them.
            let mut wrong = creds(offered.clone(), mutual);
            wrong.secret = b"not-the-secret".to_vec();
            let mut p = policy(target(accepted.clone(), mutual));
            let err = run(
                InitiatorLogin::new(config(Some(wrong))),
                TargetLogin::new(true, None),
                &mut p,
                1,
            )
            .unwrap_err();
            assert_eq!(err, Err(status::AUTHENTICATION_FAILURE), "{offered:?}");
            if mutual {
                // And an impostor target is caught by the initiator, with each of them.
                let mut impostor = target(accepted.clone(), true);
                if let AuthRequirement::Chap { mutual, .. } = &mut impostor {
                    *mutual = Some(("iqn.target-chap".into(), b"guessed-secret".to_vec()));
                }
                let mut p = policy(impostor);
                let err = run(
                    InitiatorLogin::new(config(Some(creds(offered.clone(), true)))),
                    TargetLogin::new(true, None),
                    &mut p,
                    1,
                )
                .unwrap_err()
                .unwrap();
                assert_eq!((err.status_class, err.status_detail), (2, 1));
                assert!(err.message.contains("response is wrong"), "{}", err.message);
            }
        }
    }
}

#[test]
fn chap_md5_only_initiator_refused_by_a_target_without_md5() {
    use ChapAlgorithm::*;
    let mut p = policy(AuthRequirement::Chap {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: vec![Sha3_256, Sha256],
    });
    let mut login = TargetLogin::new(true, None);
    let creds = ChapCredentials {
        user: "alice".into(),
        secret: b"alice-secret-12".to_vec(),
        mutual: None,
        algorithms: vec![Md5],
    };
    let mut initiator = InitiatorLogin::new(config(Some(creds)));
    let mut rng = |b: &mut [u8]| b.fill(3);
    let mut out = initiator.start(&mut rng);
    // AuthMethod, then CHAP_A=5: the second exchange ends in the target's 0x0201.
    for _ in 0..2 {
        let view = LoginRequestView {
            transit: out.transit,
            cont: out.cont,
            csg: out.csg,
            nsg: out.nsg,
            version_max: 0,
            version_min: 0,
            isid: ISID,
            tsih: 0,
            itt: 42,
            cid: 0,
            cmdsn: 1,
            expstatsn: 0,
            data: &out.data,
        };
        match login.step(&view, &mut p) {
            LoginStep::Continue(r) => {
                let resp = LoginResponseView {
                    transit: r.transit,
                    cont: r.cont,
                    csg: r.csg,
                    nsg: r.nsg,
                    version_max: 0,
                    version_active: 0,
                    isid: ISID,
                    tsih: 0,
                    itt: 42,
                    statsn: 0,
                    status_class: 0,
                    status_detail: 0,
                    data: &r.data,
                };
                match initiator.on_response(&resp, &mut rng) {
                    InitiatorStep::Send(next) => out = next,
                    other => panic!("{other:?}"),
                }
            }
            LoginStep::Failed(r) => {
                assert_eq!(
                    (r.status_class, r.status_detail),
                    status::AUTHENTICATION_FAILURE
                );
                assert_eq!(
                    login.auth_failure(),
                    Some("initiator offered CHAP_A=5; accepted here: SHA3-256, SHA-256")
                );
                return;
            }
            other => panic!("{other:?}"),
        }
    }
    panic!("the target did not refuse");
}
