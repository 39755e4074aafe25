//! The login phase (RFC 7143 sections 6.3, 11.12, 11.13): the target-side state machine
//! [`TargetLogin`] and the initiator-side [`InitiatorLogin`]. Both are pure: they consume
//! the fields of a decoded PDU and produce the fields of the next one.

use std::collections::VecDeque;

use crate::chap::{self, ChapAlgorithm};
pub use crate::negotiate::SessionType;
use crate::negotiate::{
    ConnectionParams, KeyLedger, NegotiationContext, Originator, PacingPolicy, Phase, Responder,
    SessionParams, TargetPacing,
};
use crate::text::{
    encode_hex, parse_number, split_for_pdus, TextAccumulator, TextKeys, IRRELEVANT,
};

/// Stage codes of the CSG/NSG fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stage {
    Security = 0,
    Operational = 1,
    FullFeature = 3,
}

pub const STAGE_SECURITY: u8 = Stage::Security as u8;
pub const STAGE_OPERATIONAL: u8 = Stage::Operational as u8;
pub const STAGE_FULL_FEATURE: u8 = Stage::FullFeature as u8;

/// The only protocol version there is (RFC 7143 11.12.4).
pub const ISCSI_VERSION: u8 = 0x00;
/// Most login PDUs one login may take before we give up on it: bounds key floods and
/// endless continuation.
pub const MAX_LOGIN_PDUS: usize = 64;
/// Largest data segment either side sends during login: MaxRecvDataSegmentLength only
/// takes effect in full feature phase, so the default applies.
pub const LOGIN_MAX_SEGMENT: usize = 8192;

/// Login status classes and details (RFC 7143 11.13.5).
pub mod status {
    pub const SUCCESS: (u8, u8) = (0x00, 0x00);
    pub const TARGET_MOVED_TEMPORARILY: (u8, u8) = (0x01, 0x01);
    pub const TARGET_MOVED_PERMANENTLY: (u8, u8) = (0x01, 0x02);
    pub const INITIATOR_ERROR: (u8, u8) = (0x02, 0x00);
    pub const AUTHENTICATION_FAILURE: (u8, u8) = (0x02, 0x01);
    pub const AUTHORIZATION_FAILURE: (u8, u8) = (0x02, 0x02);
    pub const NOT_FOUND: (u8, u8) = (0x02, 0x03);
    pub const TARGET_REMOVED: (u8, u8) = (0x02, 0x04);
    pub const UNSUPPORTED_VERSION: (u8, u8) = (0x02, 0x05);
    pub const TOO_MANY_CONNECTIONS: (u8, u8) = (0x02, 0x06);
    pub const MISSING_PARAMETER: (u8, u8) = (0x02, 0x07);
    pub const CANT_INCLUDE_IN_SESSION: (u8, u8) = (0x02, 0x08);
    pub const SESSION_TYPE_NOT_SUPPORTED: (u8, u8) = (0x02, 0x09);
    pub const SESSION_DOES_NOT_EXIST: (u8, u8) = (0x02, 0x0a);
    pub const INVALID_DURING_LOGIN: (u8, u8) = (0x02, 0x0b);
    pub const TARGET_ERROR: (u8, u8) = (0x03, 0x00);
    pub const SERVICE_UNAVAILABLE: (u8, u8) = (0x03, 0x01);
    pub const OUT_OF_RESOURCES: (u8, u8) = (0x03, 0x02);

    /// Human-readable meaning of a status.
    pub fn describe(class: u8, detail: u8) -> &'static str {
        match (class, detail) {
            (0, 0) => "success",
            (1, 1) => "target moved temporarily",
            (1, 2) => "target moved permanently",
            (1, _) => "redirection",
            (2, 0) => "initiator error",
            (2, 1) => "authentication failed",
            (2, 2) => "authorization failed",
            (2, 3) => "target not found",
            (2, 4) => "target removed",
            (2, 5) => "unsupported version",
            (2, 6) => "too many connections",
            (2, 7) => "missing parameter",
            (2, 8) => "can't include in session",
            (2, 9) => "session type not supported",
            (2, 10) => "session does not exist",
            (2, 11) => "invalid request during login",
            (2, _) => "initiator error",
            (3, 0) => "target error",
            (3, 1) => "service unavailable",
            (3, 2) => "out of resources",
            (3, _) => "target error",
            _ => "unknown status",
        }
    }
}

/// The fields of a Login Request the state machine needs.
#[derive(Debug, Clone, Copy)]
pub struct LoginRequestView<'a> {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmdsn: u32,
    pub expstatsn: u32,
    pub data: &'a [u8],
}

/// The fields of the Login Response to send. ISID, ITT, TSIH (assigned by the session
/// layer on the final response of a leading login), StatSN and the version fields
/// (max = active = 0) are filled in by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginReply {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub status_class: u8,
    pub status_detail: u8,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginStep {
    /// Send the reply and wait for the next request.
    Continue(LoginReply),
    /// Send the reply (T=1, NSG=FullFeature): the connection is in full feature phase.
    Done {
        reply: LoginReply,
        outcome: LoginOutcome,
    },
    /// Send the reply (a Login reject) and close the connection.
    Failed(LoginReply),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    /// On the target: the TSIH of the request (0 on a leading login, where the session
    /// layer assigns one). On the initiator: the TSIH the target returned.
    pub tsih: u16,
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// The target's alias, as declared to the initiator.
    pub target_alias: Option<String>,
    /// As declared on a leading login (the target's own on the target side).
    pub target_portal_group_tag: Option<u16>,
    /// How `X-org.reservoir.PacingRate` went: on the target, the rate to pace this
    /// connection at; on the initiator, what the target answered.
    pub pacing: TargetPacing,
    /// How `X-org.reservoir.StartRate` went: on the target, the rate this connection's
    /// sends may start at; on the initiator, the start the target said it applies.
    pub start_rate: Option<u64>,
    /// How `X-org.reservoir.ProbeRate` went: on the target, the rate the start's first round
    /// may be sent at; on the initiator, the one the target said it applies.
    pub probe_rate: Option<u64>,
}

/// What the target daemon knows that the login needs.
pub trait LoginPolicy {
    fn lookup_target(&self, target_name: &str, initiator_name: &str) -> TargetLookup;
    fn discovery_auth(&self) -> AuthRequirement;
    fn target_portal_group_tag(&self) -> u16;
    /// The target's configured limits and preferences for session keys.
    fn session_preferences(&self) -> &SessionParams;
    /// The target's digest preferences and its MaxRecvDataSegmentLength.
    fn connection_preferences(&self) -> &ConnectionParams;
    /// Header and data digests the target insists on (CRC32C whatever the initiator
    /// prefers); by default neither.
    fn required_digests(&self) -> (bool, bool) {
        (false, false)
    }
    /// How to answer `X-org.reservoir.PacingRate`; `None` (the default): NotUnderstood,
    /// like a target that does not know the key.
    fn pacing_policy(&self) -> Option<PacingPolicy> {
        None
    }
    /// Fills `buf` with unpredictable bytes (CHAP identifiers and challenges).
    fn random_bytes(&mut self, buf: &mut [u8]);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetLookup {
    NotFound,
    Forbidden,
    Found {
        alias: Option<String>,
        auth: AuthRequirement,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthRequirement {
    None,
    Chap {
        user: String,
        secret: Vec<u8>,
        /// The target's CHAP name and secret, used when the initiator asks the target to
        /// authenticate itself.
        mutual: Option<(String, Vec<u8>)>,
        /// The algorithms the target accepts (CHAP_A); it takes the first of the
        /// initiator's offer that is here (see [`chap::select_algorithm`]).
        algorithms: Vec<ChapAlgorithm>,
    },
}

const IDENTITY_KEYS: &[&str] = &[
    "InitiatorName",
    "InitiatorAlias",
    "TargetName",
    "SessionType",
];

fn is_security_key(k: &str) -> bool {
    k == "AuthMethod" || k.starts_with("CHAP_")
}

#[derive(Debug, Clone)]
enum TargetAuth {
    /// AuthMethod not yet agreed.
    Start,
    AwaitAlgorithm,
    AwaitResponse {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
}

/// Rest of a response that did not fit in one PDU.
#[derive(Debug)]
struct PendingReply {
    chunks: VecDeque<Vec<u8>>,
    transit: bool,
    csg: u8,
    nsg: u8,
    outcome: Option<LoginOutcome>,
}

#[derive(Debug)]
struct Identity {
    initiator_name: String,
    initiator_alias: Option<String>,
    target_name: Option<String>,
    session_type: SessionType,
    target_alias: Option<String>,
    auth: AuthRequirement,
}

type Status = (u8, u8);

/// Target side of one connection's login.
#[derive(Debug)]
pub struct TargetLogin {
    leading: bool,
    existing_session: Option<SessionParams>,
    finished: bool,
    pdus: usize,
    /// ISID, ITT, CID and TSIH of the first request; every later one must repeat them.
    ids: Option<([u8; 6], u32, u16, u16)>,
    stage: u8,
    accumulator: TextAccumulator,
    pending: Option<PendingReply>,
    identity: Option<Identity>,
    auth: TargetAuth,
    ledger: KeyLedger,
    responder: Option<Responder>,
    /// The TargetPortalGroupTag we declared, once we have.
    sent_tpgt: Option<u16>,
    sent_declarations: bool,
    /// Why authentication failed, for the target's log (never a secret).
    auth_failure: Option<String>,
}

impl TargetLogin {
    pub fn new(leading: bool, existing_session: Option<SessionParams>) -> Self {
        TargetLogin {
            leading,
            existing_session,
            finished: false,
            pdus: 0,
            ids: None,
            stage: STAGE_SECURITY,
            accumulator: TextAccumulator::default(),
            pending: None,
            identity: None,
            auth: TargetAuth::Start,
            ledger: KeyLedger::default(),
            responder: None,
            sent_tpgt: None,
            sent_declarations: false,
            auth_failure: None,
        }
    }

    /// Why authentication failed, when it did: which step of CHAP went wrong (the
    /// algorithms offered and accepted, a wrong name or response), for the log line of a
    /// 0x0201 refusal. It never holds a secret.
    pub fn auth_failure(&self) -> Option<&str> {
        self.auth_failure.as_deref()
    }

    /// Records why authentication failed and gives the status that says so.
    fn auth_failed(&mut self, why: impl Into<String>) -> Status {
        self.auth_failure = Some(why.into());
        status::AUTHENTICATION_FAILURE
    }

    fn fail(&mut self, (class, detail): Status) -> LoginStep {
        self.finished = true;
        LoginStep::Failed(LoginReply {
            transit: false,
            cont: false,
            csg: self.stage,
            nsg: 0,
            status_class: class,
            status_detail: detail,
            data: Vec::new(),
        })
    }

    fn reply(&self, transit: bool, nsg: u8, data: Vec<u8>) -> LoginReply {
        LoginReply {
            transit,
            cont: false,
            csg: self.stage,
            nsg: if transit { nsg } else { 0 },
            status_class: 0,
            status_detail: 0,
            data,
        }
    }

    pub fn step(&mut self, req: &LoginRequestView, policy: &mut dyn LoginPolicy) -> LoginStep {
        match self.step_inner(req, policy) {
            Ok(step) => step,
            Err(st) => self.fail(st),
        }
    }

    fn step_inner(
        &mut self,
        req: &LoginRequestView,
        policy: &mut dyn LoginPolicy,
    ) -> Result<LoginStep, Status> {
        if self.finished {
            return Err(status::INITIATOR_ERROR);
        }
        self.pdus += 1;
        if self.pdus > MAX_LOGIN_PDUS {
            return Err(status::INITIATOR_ERROR);
        }
        if req.version_min > ISCSI_VERSION {
            return Err(status::UNSUPPORTED_VERSION);
        }
        let ids = (req.isid, req.itt, req.cid, req.tsih);
        match self.ids {
            None => {
                self.ids = Some(ids);
                if req.csg == STAGE_OPERATIONAL {
                    self.stage = STAGE_OPERATIONAL;
                }
            }
            Some(first) if first != ids => return Err(status::INITIATOR_ERROR),
            Some(_) => {}
        }
        // C and T together, a stage that is not ours, or a transit that goes nowhere or
        // backwards are protocol errors (RFC 7143 11.12.1-11.12.3).
        if (req.transit && req.cont) || req.csg != self.stage {
            return Err(status::INITIATOR_ERROR);
        }
        if req.transit
            && (req.nsg <= req.csg
                || !(req.nsg == STAGE_OPERATIONAL || req.nsg == STAGE_FULL_FEATURE))
        {
            return Err(status::INITIATOR_ERROR);
        }

        if self.pending.is_some() {
            // The initiator acknowledges each partial response with an empty request.
            if !req.data.is_empty() || req.cont {
                return Err(status::INITIATOR_ERROR);
            }
            return Ok(self.next_pending_chunk());
        }

        let text = match self.accumulator.push(req.data, req.cont) {
            Err(_) => return Err(status::INITIATOR_ERROR),
            Ok(None) => return Ok(LoginStep::Continue(self.reply(false, 0, Vec::new()))),
            Ok(Some(text)) => text,
        };
        let keys = TextKeys::parse(&text).map_err(|_| status::INITIATOR_ERROR)?;

        if self.identity.is_none() {
            self.establish_identity(&keys, policy)?;
        }

        let mut out = TextKeys::new();
        let mut operational = TextKeys::new();
        let mut security = TextKeys::new();
        for (k, v) in keys.iter() {
            if IDENTITY_KEYS.contains(&k) {
                // Names may be repeated unchanged; a different value is a renegotiation.
                self.ledger
                    .record(k, v)
                    .map_err(|_| status::INITIATOR_ERROR)?;
            } else if is_security_key(k) {
                if self.stage == STAGE_SECURITY {
                    security.push(k, v);
                } else {
                    out.push(k, IRRELEVANT);
                }
            } else {
                operational.push(k, v);
            }
        }

        if self.leading && self.sent_tpgt.is_none() {
            let tag = policy.target_portal_group_tag();
            out.push("TargetPortalGroupTag", tag.to_string());
            self.sent_tpgt = Some(tag);
        }

        if self.stage == STAGE_SECURITY {
            self.security_step(&security, req.transit, policy, &mut out)?;
        }

        let responder = self.responder.as_mut().ok_or(status::TARGET_ERROR)?;
        let answers = responder
            .respond(&operational)
            .map_err(|_| status::INITIATOR_ERROR)?;
        out.0.extend(answers.0);

        let auth_done = matches!(self.auth, TargetAuth::Done);
        let transit = req.transit && (self.stage != STAGE_SECURITY || auth_done);
        let entering_operational =
            self.stage == STAGE_OPERATIONAL || (transit && req.nsg == STAGE_FULL_FEATURE);
        if entering_operational && !self.sent_declarations {
            self.sent_declarations = true;
            let identity = self.identity.as_ref().ok_or(status::TARGET_ERROR)?;
            if identity.session_type == SessionType::Normal {
                if let Some(alias) = &identity.target_alias {
                    out.push("TargetAlias", alias.clone());
                }
            }
            out.0.extend(responder_decls(self.responder.as_ref()).0);
        }

        let outcome = if transit && req.nsg == STAGE_FULL_FEATURE {
            Some(self.outcome()?)
        } else {
            None
        };
        let csg = self.stage;
        let mut chunks: VecDeque<Vec<u8>> = split_for_pdus(&out.encode(), LOGIN_MAX_SEGMENT).into();
        let first = chunks.pop_front().unwrap_or_default();
        if !chunks.is_empty() {
            self.pending = Some(PendingReply {
                chunks,
                transit,
                csg,
                nsg: req.nsg,
                outcome,
            });
            return Ok(LoginStep::Continue(LoginReply {
                transit: false,
                cont: true,
                csg,
                nsg: 0,
                status_class: 0,
                status_detail: 0,
                data: first,
            }));
        }
        if transit {
            self.stage = req.nsg;
        }
        let reply = LoginReply {
            transit,
            cont: false,
            csg,
            nsg: if transit { req.nsg } else { 0 },
            status_class: 0,
            status_detail: 0,
            data: first,
        };
        Ok(match outcome {
            Some(outcome) => {
                self.finished = true;
                LoginStep::Done { reply, outcome }
            }
            None => LoginStep::Continue(reply),
        })
    }

    fn next_pending_chunk(&mut self) -> LoginStep {
        let Some(mut pending) = self.pending.take() else {
            return self.fail(status::TARGET_ERROR);
        };
        let data = pending.chunks.pop_front().unwrap_or_default();
        if !pending.chunks.is_empty() {
            let reply = LoginReply {
                transit: false,
                cont: true,
                csg: pending.csg,
                nsg: 0,
                status_class: 0,
                status_detail: 0,
                data,
            };
            self.pending = Some(pending);
            return LoginStep::Continue(reply);
        }
        // The initiator stays in the old stage until the last part arrives.
        if pending.transit {
            self.stage = pending.nsg;
        }
        let reply = LoginReply {
            transit: pending.transit,
            cont: false,
            csg: pending.csg,
            nsg: if pending.transit { pending.nsg } else { 0 },
            status_class: 0,
            status_detail: 0,
            data,
        };
        match pending.outcome {
            Some(outcome) => {
                self.finished = true;
                LoginStep::Done { reply, outcome }
            }
            None => LoginStep::Continue(reply),
        }
    }

    fn establish_identity(
        &mut self,
        keys: &TextKeys,
        policy: &mut dyn LoginPolicy,
    ) -> Result<(), Status> {
        let initiator_name = keys
            .get("InitiatorName")
            .filter(|n| !n.is_empty())
            .ok_or(status::MISSING_PARAMETER)?
            .to_owned();
        let session_type = match keys.get("SessionType") {
            None => SessionType::Normal,
            Some(v) => SessionType::parse(v).ok_or(status::SESSION_TYPE_NOT_SUPPORTED)?,
        };
        let target_name = keys.get("TargetName").map(str::to_owned);
        let (target_alias, auth) = match session_type {
            SessionType::Discovery => (None, policy.discovery_auth()),
            SessionType::Normal => {
                let name = target_name
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .ok_or(status::MISSING_PARAMETER)?;
                match policy.lookup_target(name, &initiator_name) {
                    TargetLookup::NotFound => return Err(status::NOT_FOUND),
                    TargetLookup::Forbidden => return Err(status::AUTHORIZATION_FAILURE),
                    TargetLookup::Found { alias, auth } => (alias, auth),
                }
            }
        };
        // Starting in the operational stage skips authentication altogether.
        if self.stage == STAGE_OPERATIONAL && auth != AuthRequirement::None {
            return Err(
                self.auth_failed("the login skipped the security stage, and CHAP is required")
            );
        }
        if auth == AuthRequirement::None && self.stage == STAGE_OPERATIONAL {
            self.auth = TargetAuth::Done;
        }
        let ctx = NegotiationContext {
            session_type,
            leading: self.leading,
            phase: Phase::Operational,
            we_are_target: true,
        };
        let (header, data) = policy.required_digests();
        self.responder = Some(
            Responder::new(
                ctx,
                policy.session_preferences().clone(),
                policy.connection_preferences().clone(),
                self.existing_session.clone(),
            )
            .require_digests(header, data)
            .pacing(policy.pacing_policy()),
        );
        self.identity = Some(Identity {
            initiator_name,
            initiator_alias: keys.get("InitiatorAlias").map(str::to_owned),
            target_name,
            session_type,
            target_alias,
            auth,
        });
        Ok(())
    }

    fn security_step(
        &mut self,
        keys: &TextKeys,
        transit: bool,
        policy: &mut dyn LoginPolicy,
        out: &mut TextKeys,
    ) -> Result<(), Status> {
        let auth = self
            .identity
            .as_ref()
            .map(|i| i.auth.clone())
            .ok_or(status::TARGET_ERROR)?;
        for (k, v) in keys.iter() {
            self.ledger
                .record(k, v)
                .map_err(|_| status::INITIATOR_ERROR)?;
        }
        const AUTH_FAILED: Status = status::AUTHENTICATION_FAILURE;
        if let Some(methods) = keys.get("AuthMethod") {
            if !matches!(self.auth, TargetAuth::Start) {
                return Err(status::INITIATOR_ERROR);
            }
            let offered: Vec<&str> = methods.split(',').collect();
            match &auth {
                AuthRequirement::None if offered.contains(&"None") => {
                    out.push("AuthMethod", "None");
                    self.auth = TargetAuth::Done;
                }
                AuthRequirement::Chap { .. } if offered.contains(&"CHAP") => {
                    out.push("AuthMethod", "CHAP");
                    self.auth = TargetAuth::AwaitAlgorithm;
                }
                AuthRequirement::None => {
                    return Err(self.auth_failed(format!(
                        "AuthMethod={methods} offered, and this target takes None"
                    )))
                }
                AuthRequirement::Chap { .. } => {
                    return Err(self.auth_failed(format!(
                        "AuthMethod={methods} offered, and this target requires CHAP"
                    )))
                }
            }
        }
        if let Some(algs) = keys.get("CHAP_A") {
            if !matches!(self.auth, TargetAuth::AwaitAlgorithm) {
                return Err(self.auth_failed("CHAP_A out of turn"));
            }
            let AuthRequirement::Chap { algorithms, .. } = &auth else {
                return Err(AUTH_FAILED);
            };
            let alg = match chap::select_algorithm(algs, algorithms) {
                Ok(alg) => alg,
                Err(e) => return Err(self.auth_failed(e.to_string())),
            };
            let mut id = [0u8; 1];
            policy.random_bytes(&mut id);
            // As long as the digest, as LIO and open-iscsi size theirs.
            let mut challenge = vec![0u8; alg.digest_len()];
            policy.random_bytes(&mut challenge);
            out.push("CHAP_A", alg.code().to_string());
            out.push("CHAP_I", id[0].to_string());
            out.push("CHAP_C", encode_hex(&challenge));
            self.auth = TargetAuth::AwaitResponse {
                alg,
                id: id[0],
                challenge,
            };
        }
        let has_response = keys.get("CHAP_N").is_some() || keys.get("CHAP_R").is_some();
        let has_mutual = keys.get("CHAP_I").is_some() || keys.get("CHAP_C").is_some();
        if has_response || has_mutual {
            let TargetAuth::AwaitResponse { alg, id, challenge } = self.auth.clone() else {
                return Err(self.auth_failed("CHAP response before a challenge"));
            };
            let AuthRequirement::Chap {
                user,
                secret,
                mutual,
                ..
            } = &auth
            else {
                return Err(AUTH_FAILED);
            };
            let (Some(name), Some(resp)) = (keys.get("CHAP_N"), keys.get("CHAP_R")) else {
                return Err(self.auth_failed("CHAP_N or CHAP_R missing"));
            };
            if name != user {
                return Err(
                    self.auth_failed(format!("CHAP user {name:?} is not the one configured"))
                );
            }
            if let Err(e) = chap::verify_response(alg, id, secret, &challenge, resp) {
                return Err(
                    self.auth_failed(format!("CHAP ({alg}) response of user {name:?}: {e}"))
                );
            }
            if has_mutual {
                let (Some(peer_id), Some(peer_challenge)) =
                    (keys.get("CHAP_I"), keys.get("CHAP_C"))
                else {
                    return Err(self.auth_failed("mutual CHAP: CHAP_I or CHAP_C missing"));
                };
                let Some((target_user, target_secret)) = mutual else {
                    return Err(self.auth_failed(
                        "the initiator asks the target to authenticate itself, and this \
                         target has no mutual_user/mutual_secret",
                    ));
                };
                let peer = chap::parse_identifier(peer_id).and_then(|i| {
                    chap::parse_challenge(peer_challenge, Some(&challenge)).map(|c| (i, c))
                });
                let (peer_id, peer_challenge) = match peer {
                    Ok(p) => p,
                    Err(e) => return Err(self.auth_failed(format!("mutual CHAP: {e}"))),
                };
                out.push("CHAP_N", target_user.clone());
                out.push(
                    "CHAP_R",
                    encode_hex(&alg.response(peer_id, target_secret, &peer_challenge)),
                );
            }
            self.auth = TargetAuth::Done;
        }
        // An initiator that wants to leave the security stage before authentication has
        // completed, when there is nothing left for it to answer, has failed.
        if transit && auth != AuthRequirement::None {
            let waiting_for_initiator =
                matches!(self.auth, TargetAuth::Start | TargetAuth::AwaitAlgorithm)
                    && out.get("AuthMethod").is_none()
                    && out.get("CHAP_C").is_none();
            if waiting_for_initiator {
                return Err(self.auth_failed("left the security stage before authenticating"));
            }
        }
        if transit && matches!(self.auth, TargetAuth::Start) && auth == AuthRequirement::None {
            // AuthMethod defaults to None (RFC 7143 12.1).
            self.auth = TargetAuth::Done;
        }
        Ok(())
    }

    fn outcome(&self) -> Result<LoginOutcome, Status> {
        let identity = self.identity.as_ref().ok_or(status::TARGET_ERROR)?;
        let responder = self.responder.as_ref().ok_or(status::TARGET_ERROR)?;
        let (isid, _, _, tsih) = self.ids.ok_or(status::TARGET_ERROR)?;
        Ok(LoginOutcome {
            session_type: identity.session_type,
            initiator_name: identity.initiator_name.clone(),
            initiator_alias: identity.initiator_alias.clone(),
            target_name: identity.target_name.clone(),
            isid,
            tsih,
            session: responder.session.clone(),
            connection: responder.connection.clone(),
            target_alias: identity.target_alias.clone(),
            target_portal_group_tag: self.sent_tpgt,
            pacing: responder.pacing,
            start_rate: responder.start,
            probe_rate: responder.probe,
        })
    }
}

fn responder_decls(responder: Option<&Responder>) -> TextKeys {
    responder.map(Responder::declarations).unwrap_or_default()
}

/// CHAP credentials of an initiator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: String,
    pub secret: Vec<u8>,
    /// The target's secret: when set, the target must authenticate itself too.
    pub mutual: Option<Vec<u8>>,
    /// The algorithms to offer in CHAP_A, in order of preference; the target takes the
    /// first it accepts.
    pub algorithms: Vec<ChapAlgorithm>,
}

#[derive(Debug, Clone)]
pub struct InitiatorLoginConfig {
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// Required for normal sessions.
    pub target_name: Option<String>,
    pub session_type: SessionType,
    pub isid: [u8; 6],
    /// 0 for a new session; the session's TSIH when adding a connection.
    pub tsih: u16,
    pub cid: u16,
    pub auth: Option<ChapCredentials>,
    /// Our proposals on a leading login; the session's values in force on a non-leading one.
    pub session: SessionParams,
    /// What we offer (digests) and declare (MaxRecvDataSegmentLength).
    pub connection: ConnectionParams,
    pub leading: bool,
    /// Bytes per second to ask the target to pace this connection's sends at
    /// (`X-org.reservoir.PacingRate`); `None` sends no key.
    pub pacing_hint: Option<u64>,
    /// Bytes per second at which the target's sends on this connection may start
    /// (`X-org.reservoir.StartRate`, sent only without a pacing hint); `None` sends no key.
    pub start_hint: Option<u64>,
    /// Bytes per second at which the target may send the start's first round
    /// (`X-org.reservoir.ProbeRate`, sent only beside a start hint); `None` sends no key.
    pub probe_hint: Option<u64>,
}

/// The fields of the Login Request to send. ITT, CmdSN and ExpStatSN belong to the
/// connection and are filled in by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequestOut {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    pub data: Vec<u8>,
}

impl LoginRequestOut {
    /// The Login Request PDU, with the connection's ITT, CmdSN and ExpStatSN.
    pub fn into_pdu(self, itt: u32, cmdsn: u32, expstatsn: u32) -> crate::pdu::LoginRequest {
        crate::pdu::LoginRequest {
            transit: self.transit,
            cont: self.cont,
            csg: self.csg,
            nsg: self.nsg,
            version_max: self.version_max,
            version_min: self.version_min,
            isid: self.isid,
            tsih: self.tsih,
            itt,
            cid: self.cid,
            cmdsn,
            expstatsn,
            data: self.data.into(),
        }
    }
}

impl<'a> From<&'a crate::pdu::LoginRequest> for LoginRequestView<'a> {
    fn from(r: &'a crate::pdu::LoginRequest) -> Self {
        LoginRequestView {
            transit: r.transit,
            cont: r.cont,
            csg: r.csg,
            nsg: r.nsg,
            version_max: r.version_max,
            version_min: r.version_min,
            isid: r.isid,
            tsih: r.tsih,
            itt: r.itt,
            cid: r.cid,
            cmdsn: r.cmdsn,
            expstatsn: r.expstatsn,
            data: &r.data,
        }
    }
}

impl<'a> From<&'a crate::pdu::LoginResponse> for LoginResponseView<'a> {
    fn from(r: &'a crate::pdu::LoginResponse) -> Self {
        LoginResponseView {
            transit: r.transit,
            cont: r.cont,
            csg: r.csg,
            nsg: r.nsg,
            version_max: r.version_max,
            version_active: r.version_active,
            isid: r.isid,
            tsih: r.tsih,
            itt: r.itt,
            statsn: r.statsn,
            status_class: r.status_class,
            status_detail: r.status_detail,
            data: &r.data,
        }
    }
}

/// The fields of a Login Response the initiator needs.
#[derive(Debug, Clone, Copy)]
pub struct LoginResponseView<'a> {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub statsn: u32,
    pub status_class: u8,
    pub status_detail: u8,
    pub data: &'a [u8],
}

/// Why a login failed, for people and for retry logic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LoginError {
    /// The status the target returned; `(0, 0)` when we detected the failure ourselves.
    pub status_class: u8,
    pub status_detail: u8,
    pub message: String,
    /// With a redirection (class 1): where the target went.
    pub target_address: Option<String>,
}

impl LoginError {
    fn local(message: impl Into<String>) -> Self {
        LoginError {
            status_class: 0,
            status_detail: 0,
            message: message.into(),
            target_address: None,
        }
    }

    fn from_status(class: u8, detail: u8, data: &[u8]) -> Self {
        let target_address = TextKeys::parse(data)
            .ok()
            .and_then(|k| k.get("TargetAddress").map(str::to_owned));
        let mut message = format!(
            "{} (0x{class:02x}{detail:02x})",
            status::describe(class, detail)
        );
        if let Some(addr) = &target_address {
            message.push_str(&format!(" to {addr}"));
        }
        LoginError {
            status_class: class,
            status_detail: detail,
            message,
            target_address,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorStep {
    Send(LoginRequestOut),
    /// The target accepted the transit to full feature phase.
    Done(LoginOutcome),
    /// Close the connection.
    Failed(LoginError),
}

#[derive(Debug, Clone)]
enum InitiatorAuth {
    /// AuthMethod offered, answer pending.
    OfferedMethod,
    /// CHAP chosen, CHAP_A sent.
    SentAlgorithm,
    /// CHAP_N/CHAP_R sent; with mutual CHAP the algorithm, our identifier and challenge.
    SentResponse {
        mutual: Option<(ChapAlgorithm, u8, Vec<u8>)>,
    },
    Done,
}

/// Initiator side of one connection's login.
#[derive(Debug)]
pub struct InitiatorLogin {
    config: InitiatorLoginConfig,
    stage: u8,
    /// NSG we asked for with T=1 in the last request, if any.
    asked_transit: Option<u8>,
    auth: InitiatorAuth,
    originator: Originator,
    offered_operational: bool,
    /// Keys to send, waiting for the next request.
    replies: TextKeys,
    incoming: TextAccumulator,
    outgoing: VecDeque<Vec<u8>>,
    /// Flags of the request whose data is being sent in several PDUs.
    outgoing_flags: (bool, u8),
    responses: usize,
    finished: bool,
    target_alias: Option<String>,
    target_portal_group_tag: Option<u16>,
    skip_security: bool,
}

impl InitiatorLogin {
    pub fn new(config: InitiatorLoginConfig) -> Self {
        let ctx = NegotiationContext {
            session_type: config.session_type,
            leading: config.leading,
            phase: Phase::Operational,
            we_are_target: false,
        };
        let existing = (!config.leading).then(|| config.session.clone());
        let originator = Originator::new(
            ctx,
            config.session.clone(),
            config.connection.clone(),
            existing,
        )
        .pacing_hint(config.pacing_hint)
        .start_hint(config.start_hint)
        .probe_hint(config.probe_hint);
        InitiatorLogin {
            config,
            stage: STAGE_SECURITY,
            asked_transit: None,
            auth: InitiatorAuth::OfferedMethod,
            originator,
            offered_operational: false,
            replies: TextKeys::new(),
            incoming: TextAccumulator::default(),
            outgoing: VecDeque::new(),
            outgoing_flags: (false, 0),
            responses: 0,
            finished: false,
            target_alias: None,
            target_portal_group_tag: None,
            skip_security: false,
        }
    }

    /// With no credentials to present, start in the operational stage (RFC 7143 6.3:
    /// the security stage is optional): the first request carries the identity and every
    /// operational key and asks for full feature phase at once, so that a login takes
    /// one exchange instead of two, a round trip saved per connection. A target that
    /// requires authentication refuses it (0x0201), as it would refuse AuthMethod=None.
    pub fn skip_security(mut self, yes: bool) -> Self {
        self.skip_security = yes;
        self
    }

    /// The first request: identity keys and AuthMethod in the security stage (or, with
    /// [`InitiatorLogin::skip_security`] and no credentials, the operational keys). It needs no
    /// randomness (CHAP challenges come later); the parameter keeps both calls alike.
    pub fn start(&mut self, _rng: &mut dyn FnMut(&mut [u8])) -> LoginRequestOut {
        let c = &self.config;
        let mut keys = TextKeys::new();
        keys.push("InitiatorName", c.initiator_name.clone());
        if let Some(alias) = &c.initiator_alias {
            keys.push("InitiatorAlias", alias.clone());
        }
        if c.session_type == SessionType::Normal {
            if let Some(t) = &c.target_name {
                keys.push("TargetName", t.clone());
            }
        }
        if c.leading {
            keys.push("SessionType", c.session_type.as_str());
        }
        if self.skip_security && c.auth.is_none() {
            self.stage = STAGE_OPERATIONAL;
            self.auth = InitiatorAuth::Done;
            self.offered_operational = true;
            keys.0.extend(self.originator.offer().0);
            return self.request(true, STAGE_FULL_FEATURE, keys);
        }
        let transit = match &c.auth {
            None => {
                keys.push("AuthMethod", "None");
                true
            }
            // Mutual authentication is not optional for us, so None is not offered then.
            Some(cred) if cred.mutual.is_some() => {
                keys.push("AuthMethod", "CHAP");
                false
            }
            Some(_) => {
                keys.push("AuthMethod", "CHAP,None");
                false
            }
        };
        self.request(transit, STAGE_OPERATIONAL, keys)
    }

    fn request(&mut self, transit: bool, nsg: u8, keys: TextKeys) -> LoginRequestOut {
        let mut chunks: VecDeque<Vec<u8>> =
            split_for_pdus(&keys.encode(), LOGIN_MAX_SEGMENT).into();
        let first = chunks.pop_front().unwrap_or_default();
        let cont = !chunks.is_empty();
        self.outgoing = chunks;
        self.outgoing_flags = (transit, nsg);
        let transit = transit && !cont;
        self.asked_transit = transit.then_some(nsg);
        self.out(transit, cont, nsg, first)
    }

    fn out(&self, transit: bool, cont: bool, nsg: u8, data: Vec<u8>) -> LoginRequestOut {
        LoginRequestOut {
            transit,
            cont,
            csg: self.stage,
            nsg: if transit { nsg } else { 0 },
            version_max: ISCSI_VERSION,
            version_min: ISCSI_VERSION,
            isid: self.config.isid,
            tsih: self.config.tsih,
            cid: self.config.cid,
            data,
        }
    }

    pub fn on_response(
        &mut self,
        resp: &LoginResponseView,
        rng: &mut dyn FnMut(&mut [u8]),
    ) -> InitiatorStep {
        match self.on_response_inner(resp, rng) {
            Ok(step) => step,
            Err(e) => {
                self.finished = true;
                InitiatorStep::Failed(e)
            }
        }
    }

    fn on_response_inner(
        &mut self,
        resp: &LoginResponseView,
        rng: &mut dyn FnMut(&mut [u8]),
    ) -> Result<InitiatorStep, LoginError> {
        if self.finished {
            return Err(LoginError::local("login response after the login ended"));
        }
        self.responses += 1;
        if self.responses > MAX_LOGIN_PDUS {
            return Err(LoginError::local("login takes too many exchanges"));
        }
        if resp.status_class != 0 {
            return Err(LoginError::from_status(
                resp.status_class,
                resp.status_detail,
                resp.data,
            ));
        }
        if resp.version_active != ISCSI_VERSION {
            return Err(LoginError::local(format!(
                "target chose unsupported version {}",
                resp.version_active
            )));
        }
        if resp.isid != self.config.isid {
            return Err(LoginError::local("login response for another ISID"));
        }
        if resp.csg != self.stage || (resp.transit && resp.cont) {
            return Err(LoginError::local(format!(
                "login response with CSG {} (T={}, C={}) while in stage {}",
                resp.csg, resp.transit as u8, resp.cont as u8, self.stage
            )));
        }
        // The target may only transit when we asked to, and never beyond where we asked.
        if resp.transit {
            match self.asked_transit {
                Some(asked) if resp.nsg > self.stage && resp.nsg <= asked && resp.nsg != 2 => {}
                _ => {
                    return Err(LoginError::local(format!(
                        "target moved to stage {} without our request",
                        resp.nsg
                    )))
                }
            }
        }
        if !self.outgoing.is_empty() {
            // The target acknowledges each part of our request with an empty response.
            if !resp.data.is_empty() || resp.transit {
                return Err(LoginError::local("target answered a partial request"));
            }
            let data = self.outgoing.pop_front().unwrap_or_default();
            let cont = !self.outgoing.is_empty();
            let (transit, nsg) = self.outgoing_flags;
            let transit = transit && !cont;
            self.asked_transit = transit.then_some(nsg);
            return Ok(InitiatorStep::Send(self.out(transit, cont, nsg, data)));
        }
        let text = match self.incoming.push(resp.data, resp.cont) {
            Err(e) => return Err(LoginError::local(format!("login response text: {e}"))),
            Ok(None) => {
                // The target's final part answers the request that asked for the transit,
                // so asked_transit stays as it is.
                return Ok(InitiatorStep::Send(self.out(false, false, 0, Vec::new())));
            }
            Ok(Some(t)) => t,
        };
        let keys = TextKeys::parse(&text)
            .map_err(|e| LoginError::local(format!("malformed login response text: {e}")))?;

        let mut operational = TextKeys::new();
        let mut security = TextKeys::new();
        for (k, v) in keys.iter() {
            match k {
                "TargetAlias" => self.target_alias = Some(v.to_owned()),
                "TargetPortalGroupTag" => {
                    let tag = parse_number(v)
                        .ok()
                        .and_then(|n| u16::try_from(n).ok())
                        .ok_or_else(|| LoginError::local("malformed TargetPortalGroupTag"))?;
                    self.target_portal_group_tag = Some(tag);
                }
                "TargetAddress" => {}
                _ if is_security_key(k) => security.push(k, v),
                _ => operational.push(k, v),
            }
        }
        if self.stage == STAGE_SECURITY {
            self.security_response(&security, rng)?;
        }
        let answers = self
            .originator
            .on_response(&operational)
            .map_err(|e| LoginError::local(format!("negotiation: {e}")))?;
        self.replies.0.extend(answers.0);

        if resp.transit {
            self.stage = resp.nsg;
        }
        if self.stage == STAGE_FULL_FEATURE {
            if !matches!(self.auth, InitiatorAuth::Done) {
                return Err(LoginError::local("target skipped authentication"));
            }
            self.originator.finish();
            self.finished = true;
            return Ok(InitiatorStep::Done(self.outcome(resp.tsih)));
        }
        if self.stage == STAGE_SECURITY {
            return Ok(InitiatorStep::Send(self.next_security_request()));
        }
        let mut keys = std::mem::take(&mut self.replies);
        if !self.offered_operational {
            self.offered_operational = true;
            let offer = self.originator.offer();
            keys.0.splice(0..0, offer.0);
        }
        Ok(InitiatorStep::Send(self.request(
            true,
            STAGE_FULL_FEATURE,
            keys,
        )))
    }

    fn security_response(
        &mut self,
        keys: &TextKeys,
        rng: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), LoginError> {
        let auth_failed = |why: &str| LoginError {
            status_class: status::AUTHENTICATION_FAILURE.0,
            status_detail: status::AUTHENTICATION_FAILURE.1,
            message: format!("authentication failed (0x0201): {why}"),
            target_address: None,
        };
        match self.auth.clone() {
            InitiatorAuth::OfferedMethod => match keys.get("AuthMethod") {
                Some("CHAP") => {
                    let Some(cred) = &self.config.auth else {
                        return Err(auth_failed("target chose CHAP and we have no credentials"));
                    };
                    self.replies.push("CHAP_A", chap::offer(&cred.algorithms));
                    self.auth = InitiatorAuth::SentAlgorithm;
                }
                Some("None") | None => {
                    if self
                        .config
                        .auth
                        .as_ref()
                        .is_some_and(|c| c.mutual.is_some())
                    {
                        return Err(auth_failed("target declined to authenticate itself"));
                    }
                    if keys.get("AuthMethod").is_some() || self.asked_transit.is_some() {
                        self.auth = InitiatorAuth::Done;
                    }
                }
                Some(other) => {
                    return Err(auth_failed(&format!("target chose AuthMethod={other}")))
                }
            },
            InitiatorAuth::SentAlgorithm => {
                let cred = self
                    .config
                    .auth
                    .clone()
                    .ok_or_else(|| auth_failed("no credentials"))?;
                let (Some(a), Some(i), Some(c)) =
                    (keys.get("CHAP_A"), keys.get("CHAP_I"), keys.get("CHAP_C"))
                else {
                    return Err(auth_failed("target sent no CHAP challenge"));
                };
                let alg = chap::parse_choice(a, &cred.algorithms).map_err(|e| {
                    auth_failed(&format!("{e} (offered {})", chap::names(&cred.algorithms)))
                })?;
                let id = chap::parse_identifier(i).map_err(|e| auth_failed(&e.to_string()))?;
                let challenge =
                    chap::parse_challenge(c, None).map_err(|e| auth_failed(&e.to_string()))?;
                self.replies.push("CHAP_N", cred.user.clone());
                self.replies.push(
                    "CHAP_R",
                    encode_hex(&alg.response(id, &cred.secret, &challenge)),
                );
                let mutual = if cred.mutual.is_some() {
                    let mut our_id = [0u8; 1];
                    rng(&mut our_id);
                    // As long as the digest, as open-iscsi sizes its challenge.
                    let mut ours = vec![0u8; alg.digest_len()];
                    rng(&mut ours);
                    // Never hand the target its own challenge back (RFC 7143 9.2.1).
                    if ours == challenge {
                        ours[0] ^= 0xff;
                    }
                    self.replies.push("CHAP_I", our_id[0].to_string());
                    self.replies.push("CHAP_C", encode_hex(&ours));
                    Some((alg, our_id[0], ours))
                } else {
                    None
                };
                self.auth = InitiatorAuth::SentResponse { mutual };
            }
            InitiatorAuth::SentResponse { mutual } => {
                if let Some((alg, id, challenge)) = mutual {
                    let target_secret = self
                        .config
                        .auth
                        .as_ref()
                        .and_then(|c| c.mutual.clone())
                        .unwrap_or_default();
                    let (Some(_name), Some(r)) = (keys.get("CHAP_N"), keys.get("CHAP_R")) else {
                        return Err(auth_failed("target did not authenticate itself"));
                    };
                    chap::verify_response(alg, id, &target_secret, &challenge, r).map_err(
                        |_| auth_failed(&format!("target's CHAP ({alg}) response is wrong")),
                    )?;
                }
                self.auth = InitiatorAuth::Done;
            }
            InitiatorAuth::Done => {}
        }
        Ok(())
    }

    fn next_security_request(&mut self) -> LoginRequestOut {
        let keys = std::mem::take(&mut self.replies);
        // With the CHAP response sent (or nothing left to do) we ask to move on; while the
        // CHAP exchange is still running we stay.
        let ready = matches!(
            self.auth,
            InitiatorAuth::SentResponse { .. } | InitiatorAuth::Done
        );
        self.request(ready, STAGE_OPERATIONAL, keys)
    }

    fn outcome(&self, tsih: u16) -> LoginOutcome {
        let c = &self.config;
        LoginOutcome {
            session_type: c.session_type,
            initiator_name: c.initiator_name.clone(),
            initiator_alias: c.initiator_alias.clone(),
            target_name: c.target_name.clone(),
            isid: c.isid,
            tsih,
            session: self.originator.session.clone(),
            connection: self.originator.connection.clone(),
            target_alias: self.target_alias.clone(),
            target_portal_group_tag: self.target_portal_group_tag,
            pacing: self.originator.pacing,
            start_rate: self.originator.start,
            probe_rate: self.originator.probe,
        }
    }
}
