//! The login phase (RFC 7143 sections 6.3, 11.12, 11.13): the target-side state machine
//! [`TargetLogin`] and the initiator-side [`InitiatorLogin`]. Both are pure: they consume
//! the fields of a decoded PDU and produce the fields of the next one.

use std::collections::VecDeque;

use crate::chap::{self, ChapError, CHALLENGE_LEN, CHAP_MD5};
pub use crate::negotiate::SessionType;
use crate::negotiate::{
    ConnectionParams, KeyLedger, NegotiationContext, Phase, Responder, SessionParams,
};
use crate::text::{encode_hex, split_for_pdus, TextAccumulator, TextKeys, IRRELEVANT};

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
    /// As the target declared it (initiator side only).
    pub target_alias: Option<String>,
    /// As the target declared it (initiator side only).
    pub target_portal_group_tag: Option<u16>,
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
    sent_tpgt: bool,
    sent_declarations: bool,
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
            sent_tpgt: false,
            sent_declarations: false,
        }
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

        if self.leading && !self.sent_tpgt {
            out.push(
                "TargetPortalGroupTag",
                policy.target_portal_group_tag().to_string(),
            );
            self.sent_tpgt = true;
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
        if transit {
            self.stage = req.nsg;
        }
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
            return Err(status::AUTHENTICATION_FAILURE);
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
        self.responder = Some(Responder::new(
            ctx,
            policy.session_preferences().clone(),
            policy.connection_preferences().clone(),
            self.existing_session.clone(),
        ));
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
                _ => return Err(AUTH_FAILED),
            }
        }
        if let Some(algs) = keys.get("CHAP_A") {
            if !matches!(self.auth, TargetAuth::AwaitAlgorithm) {
                return Err(AUTH_FAILED);
            }
            chap::select_algorithm(algs).map_err(|_| AUTH_FAILED)?;
            let mut id = [0u8; 1];
            policy.random_bytes(&mut id);
            let mut challenge = vec![0u8; CHALLENGE_LEN];
            policy.random_bytes(&mut challenge);
            out.push("CHAP_A", CHAP_MD5.to_string());
            out.push("CHAP_I", id[0].to_string());
            out.push("CHAP_C", encode_hex(&challenge));
            self.auth = TargetAuth::AwaitResponse {
                id: id[0],
                challenge,
            };
        }
        let has_response = keys.get("CHAP_N").is_some() || keys.get("CHAP_R").is_some();
        let has_mutual = keys.get("CHAP_I").is_some() || keys.get("CHAP_C").is_some();
        if has_response || has_mutual {
            let TargetAuth::AwaitResponse { id, challenge } = &self.auth else {
                return Err(AUTH_FAILED);
            };
            let AuthRequirement::Chap {
                user,
                secret,
                mutual,
            } = &auth
            else {
                return Err(AUTH_FAILED);
            };
            let (Some(name), Some(resp)) = (keys.get("CHAP_N"), keys.get("CHAP_R")) else {
                return Err(AUTH_FAILED);
            };
            if name != user {
                return Err(AUTH_FAILED);
            }
            chap::verify_response(*id, secret, challenge, resp).map_err(|_| AUTH_FAILED)?;
            if has_mutual {
                let (Some(peer_id), Some(peer_challenge)) =
                    (keys.get("CHAP_I"), keys.get("CHAP_C"))
                else {
                    return Err(AUTH_FAILED);
                };
                let Some((target_user, target_secret)) = mutual else {
                    return Err(AUTH_FAILED);
                };
                let peer_id = chap::parse_identifier(peer_id).map_err(|_| AUTH_FAILED)?;
                let peer_challenge = chap::parse_challenge(peer_challenge, Some(challenge))
                    .map_err(|_: ChapError| AUTH_FAILED)?;
                out.push("CHAP_N", target_user.clone());
                out.push(
                    "CHAP_R",
                    encode_hex(&chap::chap_response(
                        peer_id,
                        target_secret,
                        &peer_challenge,
                    )),
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
                return Err(AUTH_FAILED);
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
            target_portal_group_tag: None,
        })
    }
}

fn responder_decls(responder: Option<&Responder>) -> TextKeys {
    responder.map(Responder::declarations).unwrap_or_default()
}
