//! Login state machines fed arbitrary PDU sequences: they must never panic, never exceed
//! the login PDU bound, and the target must never transit without the initiator's T bit.
#![no_main]

use iscsi::chap::ChapAlgorithm;
use iscsi::login::*;
use iscsi::negotiate::{ConnectionParams, PacingPolicy, SessionParams};
use libfuzzer_sys::fuzz_target;

struct Policy {
    session: SessionParams,
    connection: ConnectionParams,
    auth: AuthRequirement,
    n: u8,
}

impl LoginPolicy for Policy {
    fn lookup_target(&self, target_name: &str, _initiator_name: &str) -> TargetLookup {
        match target_name {
            "t" => TargetLookup::Found {
                alias: Some("alias".into()),
                auth: self.auth.clone(),
            },
            "f" => TargetLookup::Forbidden,
            _ => TargetLookup::NotFound,
        }
    }
    fn discovery_auth(&self) -> AuthRequirement {
        self.auth.clone()
    }
    fn target_portal_group_tag(&self) -> u16 {
        1
    }
    fn session_preferences(&self) -> &SessionParams {
        &self.session
    }
    fn connection_preferences(&self) -> &ConnectionParams {
        &self.connection
    }
    fn pacing_policy(&self) -> Option<PacingPolicy> {
        Some(PacingPolicy {
            accept_hint: true,
            configured: None,
        })
    }
    fn random_bytes(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.n = self.n.wrapping_add(1);
            *b = self.n;
        }
    }
}

/// Splits the input into (flags, data) records: one flags byte, one length byte, data.
fn records(mut data: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 2 && out.len() < 80 {
        let (flags, len) = (data[0], data[1] as usize * 4);
        let len = len.min(data.len() - 2);
        out.push((flags, &data[2..2 + len]));
        data = &data[2 + len..];
    }
    out
}

fn fuzz_target_side(mode: u8, input: &[u8]) {
    let auth = if mode & 2 == 0 {
        AuthRequirement::None
    } else {
        AuthRequirement::Chap {
            user: "u".into(),
            secret: b"0123456789ab".to_vec(),
            mutual: (mode & 4 != 0).then(|| ("tn".into(), b"ba9876543210".to_vec())),
            algorithms: if mode & 16 == 0 {
                ChapAlgorithm::ALL.to_vec()
            } else {
                vec![ChapAlgorithm::Sha3_256, ChapAlgorithm::Sha256]
            },
        }
    };
    let mut policy = Policy {
        session: SessionParams::default(),
        connection: ConnectionParams::default(),
        auth,
        n: 0,
    };
    let leading = mode & 8 == 0;
    let mut login = TargetLogin::new(leading, (!leading).then(SessionParams::default));
    for (i, (flags, data)) in records(input).into_iter().enumerate() {
        let req = LoginRequestView {
            transit: flags & 0x80 != 0,
            cont: flags & 0x40 != 0,
            csg: (flags >> 2) & 3,
            nsg: flags & 3,
            version_max: 0,
            version_min: (flags >> 4) & 1,
            isid: [0x80, 0, 0, 0, 0, (flags >> 5) & 1],
            tsih: if leading { 0 } else { 1 },
            itt: 1,
            cid: 0,
            cmdsn: i as u32,
            expstatsn: 0,
            data,
        };
        let step = login.step(&req, &mut policy);
        assert!(i < MAX_LOGIN_PDUS || matches!(step, LoginStep::Failed(_)));
        match step {
            LoginStep::Continue(r) => {
                assert!(!r.transit || req.transit);
                assert!(!(r.transit && r.cont));
                assert!(r.data.len() <= LOGIN_MAX_SEGMENT);
            }
            LoginStep::Done { reply, .. } => {
                assert!(req.transit || req.data.is_empty());
                assert_eq!(reply.nsg, STAGE_FULL_FEATURE);
                break;
            }
            LoginStep::Failed(_) => break,
        }
    }
}

fn fuzz_initiator_side(mode: u8, input: &[u8]) {
    let config = InitiatorLoginConfig {
        initiator_name: "i".into(),
        initiator_alias: None,
        target_name: Some("t".into()),
        session_type: SessionType::Normal,
        isid: [0x80, 0, 0, 0, 0, 0],
        tsih: 0,
        cid: 0,
        auth: (mode & 2 != 0).then(|| ChapCredentials {
            user: "u".into(),
            secret: b"0123456789ab".to_vec(),
            mutual: (mode & 4 != 0).then(|| b"ba9876543210".to_vec()),
            algorithms: if mode & 32 == 0 {
                ChapAlgorithm::ALL.to_vec()
            } else {
                vec![ChapAlgorithm::Md5]
            },
        }),
        session: SessionParams::default(),
        connection: ConnectionParams::default(),
        leading: true,
        pacing_hint: (mode & 8 != 0).then_some(12_500_000),
        start_hint: (mode & 16 != 0).then_some(12_500_000),
        probe_hint: (mode & 16 != 0).then_some(62_500_000),
    };
    let mut login = InitiatorLogin::new(config);
    let mut rng = |buf: &mut [u8]| buf.fill(7);
    let _ = login.start(&mut rng);
    for (flags, data) in records(input) {
        let resp = LoginResponseView {
            transit: flags & 0x80 != 0,
            cont: flags & 0x40 != 0,
            csg: (flags >> 2) & 3,
            nsg: flags & 3,
            version_max: 0,
            version_active: 0,
            isid: [0x80, 0, 0, 0, 0, 0],
            tsih: 1,
            itt: 1,
            statsn: 0,
            status_class: (flags >> 4) & 1,
            status_detail: (flags >> 5) & 1,
            data,
        };
        match login.on_response(&resp, &mut rng) {
            InitiatorStep::Send(out) => assert!(out.data.len() <= LOGIN_MAX_SEGMENT),
            InitiatorStep::Done(_) | InitiatorStep::Failed(_) => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        fuzz_target_side(mode, rest);
    } else {
        fuzz_initiator_side(mode, rest);
    }
});
