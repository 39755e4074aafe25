//! The login phase (RFC 7143 6): the target's login policy from its configuration, the
//! exchange of Login PDUs through the sans-IO state machine, and binding a finished login
//! to a new or existing session (reinstating an old one of the same initiator port).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::loglimit::peer_log;
use anyhow::bail;
use bytes::{Bytes, BytesMut};
use iscsi::framing::PduDecoder;
use iscsi::login::{
    status, AuthRequirement, LoginOutcome, LoginPolicy, LoginReply, LoginRequestView, LoginStep,
    SessionType, TargetLogin, TargetLookup,
};
use iscsi::negotiate::{ConnectionParams, PacingPolicy, SessionParams};
use iscsi::pdu::{LoginRequest, LoginResponse, Pdu};
use net::transport::Stream;
use rand::RngCore;

use crate::config::Chap;
use crate::node::TargetNode;
use crate::session::{ConnEvent, Session};
use crate::shared::Shared;
use crate::stats::{Limit, Refusal};
use crate::wire;
struct Policy<'a> {
    shared: &'a Shared,
    session: SessionParams,
    connection: ConnectionParams,
    /// The connection is TLS.
    tls: bool,
    /// The configured portal the connection came through.
    portal: Option<SocketAddr>,
    /// The target named requires TLS and this connection is plaintext.
    wants_tls: std::cell::Cell<bool>,
    /// Why the target refused, for the log (never a secret).
    refusal: std::cell::RefCell<Option<String>>,
}

impl Policy<'_> {
    fn refuse(&self, why: String, lookup: TargetLookup) -> TargetLookup {
        *self.refusal.borrow_mut() = Some(why);
        lookup
    }
}

fn chap_requirement(chap: &Option<Chap>) -> AuthRequirement {
    match chap {
        None => AuthRequirement::None,
        Some(c) => AuthRequirement::Chap {
            user: c.user.clone(),
            secret: c.secret.as_bytes().to_vec(),
            mutual: c
                .mutual_user
                .clone()
                .zip(c.mutual_secret.as_ref().map(|s| s.as_bytes().to_vec())),
            algorithms: c.accepted_algorithms(),
        },
    }
}

impl LoginPolicy for Policy<'_> {
    fn lookup_target(&self, target_name: &str, initiator_name: &str) -> TargetLookup {
        match self.shared.find_target(target_name) {
            None => self.refuse(format!("no target {target_name}"), TargetLookup::NotFound),
            Some(t) if !t.reachable_through(self.portal) => self.refuse(
                format!(
                    "target {} is not offered on this portal ({})",
                    t.iqn,
                    self.portal.map_or("none".into(), |p| p.to_string())
                ),
                TargetLookup::NotFound,
            ),
            Some(t) if !t.allows(initiator_name) => self.refuse(
                format!(
                    "initiator {initiator_name} is not allowed to target {}",
                    t.iqn
                ),
                TargetLookup::Forbidden,
            ),
            Some(t) if t.require_tls && !self.tls => {
                self.wants_tls.set(true);
                self.refuse(
                    format!(
                        "target {} requires TLS and this connection is plaintext",
                        t.iqn
                    ),
                    TargetLookup::Forbidden,
                )
            }
            Some(t) => match t.chap_for(initiator_name) {
                None if t.require_chap => self.refuse(
                    format!(
                        "target {} requires CHAP and has no secret for initiator \
                         {initiator_name}",
                        t.iqn
                    ),
                    TargetLookup::Forbidden,
                ),
                chap => TargetLookup::Found {
                    alias: t.alias.clone(),
                    auth: chap_requirement(&chap.cloned()),
                },
            },
        }
    }
    fn discovery_auth(&self) -> AuthRequirement {
        chap_requirement(&self.shared.live().discovery_chap)
    }
    fn target_portal_group_tag(&self) -> u16 {
        self.shared.config.portal_group
    }
    fn session_preferences(&self) -> &SessionParams {
        &self.session
    }
    fn connection_preferences(&self) -> &ConnectionParams {
        &self.connection
    }
    fn pacing_policy(&self) -> Option<PacingPolicy> {
        Some(self.shared.config.session.pacing_policy())
    }
    fn required_digests(&self) -> (bool, bool) {
        let s = &self.shared.config.session;
        let without_none = |l: &[String]| !l.iter().any(|d| d == "None");
        (without_none(&s.header_digest), without_none(&s.data_digest))
    }
    fn random_bytes(&mut self, buf: &mut [u8]) {
        rand::thread_rng().fill_bytes(buf);
    }
}

fn preferences(shared: &Shared) -> (SessionParams, ConnectionParams) {
    let s = &shared.config.session;
    let session = SessionParams {
        max_connections: s.max_connections,
        initial_r2t: s.initial_r2t,
        immediate_data: s.immediate_data,
        max_burst_length: s.max_burst_length,
        first_burst_length: s.first_burst_length,
        default_time2wait: s.default_time2wait,
        default_time2retain: s.default_time2retain,
        max_outstanding_r2t: s.max_outstanding_r2t,
        error_recovery_level: s.error_recovery_level,
        ..SessionParams::default()
    };
    let connection = ConnectionParams {
        header_digest: s.header_digest.iter().any(|d| d == "CRC32C"),
        data_digest: s.data_digest.iter().any(|d| d == "CRC32C"),
        max_recv_data_segment_length: s.max_recv_data_segment_length,
        ..ConnectionParams::default()
    };
    (session, connection)
}

pub(crate) struct LoginResult {
    pub(crate) outcome: LoginOutcome,
    pub(crate) session: Arc<Session>,
    pub(crate) cid: u16,
    pub(crate) statsn: u32,
}

fn login_response(
    req: &LoginRequest,
    reply: LoginReply,
    tsih: u16,
    statsn: u32,
    window: (u32, u32),
) -> Pdu {
    Pdu::LoginResponse(LoginResponse {
        transit: reply.transit,
        cont: reply.cont,
        csg: reply.csg,
        nsg: reply.nsg,
        version_max: 0,
        version_active: 0,
        isid: req.isid,
        tsih,
        itt: req.itt,
        statsn,
        expcmdsn: window.0,
        maxcmdsn: window.1,
        status_class: reply.status_class,
        status_detail: reply.status_detail,
        data: Bytes::from(reply.data),
    })
}

fn failure((class, detail): (u8, u8)) -> LoginReply {
    LoginReply {
        transit: false,
        cont: false,
        csg: 0,
        nsg: 0,
        status_class: class,
        status_detail: detail,
        data: Vec::new(),
    }
}

/// Login phase: returns None when the login failed (the reject was sent).
pub(crate) async fn login(
    shared: &Arc<Shared>,
    stream: &mut Stream,
    dec: &mut PduDecoder,
    buf: &mut BytesMut,
    peer: SocketAddr,
    tls: bool,
) -> anyhow::Result<Option<LoginResult>> {
    let (session_prefs, connection_prefs) = preferences(shared);
    let mut policy = Policy {
        shared,
        session: session_prefs,
        connection: connection_prefs,
        tls,
        portal: stream
            .local_addr()
            .ok()
            .and_then(|l| shared.configured_portal(l)),
        wants_tls: std::cell::Cell::new(false),
        refusal: Default::default(),
    };
    let queue_depth = shared.config.session.queue_depth;
    let mut machine: Option<(TargetLogin, Option<Arc<Session>>)> = None;
    let mut statsn = 0u32;
    loop {
        let Some(pdu) = wire::read_pdu(stream, dec, buf).await? else {
            bail!("closed during login");
        };
        let req = match pdu {
            Pdu::LoginRequest(r) => r,
            other => bail!("{:?} during login", other.opcode()),
        };
        if machine.is_none() {
            statsn = req.expstatsn;
            let existing = if req.tsih == 0 {
                None
            } else {
                match shared.session(req.tsih) {
                    Some(s) if s.isid == req.isid && !s.is_closed() => Some(s),
                    _ => {
                        shared
                            .events
                            .login_refused(Refusal::of(status::SESSION_DOES_NOT_EXIST, false));
                        let reply = failure(status::SESSION_DOES_NOT_EXIST);
                        wire::send_now(
                            stream,
                            &login_response(&req, reply, req.tsih, statsn, (req.cmdsn, req.cmdsn)),
                        )
                        .await?;
                        peer_log!(
                            info,
                            "{peer}: login refused: session {} does not exist",
                            req.tsih
                        );
                        return Ok(None);
                    }
                }
            };
            let params = existing.as_ref().map(|s| s.params.clone());
            machine = Some((TargetLogin::new(req.tsih == 0, params), existing));
        }
        let (m, existing) = machine.as_mut().expect("set above");
        let window = match existing {
            Some(s) => s.window(),
            None => (req.cmdsn, req.cmdsn.wrapping_add(queue_depth - 1)),
        };
        let view = LoginRequestView::from(&req);
        match m.step(&view, &mut policy) {
            LoginStep::Continue(reply) => {
                wire::send_now(
                    stream,
                    &login_response(&req, reply, req.tsih, statsn, window),
                )
                .await?;
                statsn = statsn.wrapping_add(1);
            }
            LoginStep::Failed(mut reply) => {
                shared.events.login_refused(Refusal::of(
                    (reply.status_class, reply.status_detail),
                    policy.wants_tls.get(),
                ));
                if policy.wants_tls.get() {
                    // Said in the response too, for an initiator that can tell its user.
                    reply.data = format!("{}\0", wire::TLS_REQUIRED_KEY).into_bytes();
                }
                let why = match (policy.refusal.borrow_mut().take(), m.auth_failure()) {
                    (Some(why), _) => why,
                    (None, Some(auth)) => format!("authentication failed: {auth}"),
                    (None, None) => {
                        iscsi::login::status::describe(reply.status_class, reply.status_detail)
                            .to_string()
                    }
                };
                peer_log!(
                    info,
                    "{peer}: login refused: {why} (0x{:02x}{:02x})",
                    reply.status_class,
                    reply.status_detail
                );
                wire::send_now(
                    stream,
                    &login_response(&req, reply, req.tsih, statsn, window),
                )
                .await?;
                return Ok(None);
            }
            LoginStep::Done { reply, outcome } => {
                let bound = bind_session(shared, &outcome, existing.clone(), req.cid, req.cmdsn);
                let session = match bound {
                    Ok(s) => s,
                    Err((code, why)) => {
                        shared.events.login_refused(Refusal::of(code, false));
                        peer_log!(info, "{peer}: login refused: {why}");
                        let reply = failure(code);
                        wire::send_now(
                            stream,
                            &login_response(&req, reply, req.tsih, statsn, window),
                        )
                        .await?;
                        return Ok(None);
                    }
                };
                // Paced before the last login response goes out: every Data-In is.
                wire::apply_pacing(stream, &outcome, shared, peer, &session, req.cid);
                let window = session.window();
                wire::send_now(
                    stream,
                    &login_response(&req, reply, session.tsih, statsn, window),
                )
                .await?;
                return Ok(Some(LoginResult {
                    outcome,
                    session,
                    cid: req.cid,
                    statsn: statsn.wrapping_add(1),
                }));
            }
        }
    }
}

/// Finds or creates the session a finished login joins (RFC 7143 6.3); Err is the login
/// status to refuse it with, and why.
fn bind_session(
    shared: &Arc<Shared>,
    outcome: &LoginOutcome,
    existing: Option<Arc<Session>>,
    cid: u16,
    cmdsn: u32,
) -> Result<Arc<Session>, ((u8, u8), String)> {
    if shared.shutting_down() {
        return Err((
            status::SERVICE_UNAVAILABLE,
            "target is shutting down".into(),
        ));
    }
    if let Some(s) = existing {
        if s.is_discovery() {
            return Err((
                status::CANT_INCLUDE_IN_SESSION,
                "discovery sessions take one connection".into(),
            ));
        }
        if !s.has_connection(cid) && s.connection_count() >= s.params.max_connections as usize {
            shared.events.limit(Limit::Connections);
            return Err((
                status::TOO_MANY_CONNECTIONS,
                format!(
                    "session already has MaxConnections={}",
                    s.params.max_connections
                ),
            ));
        }
        return Ok(s);
    }
    // A login that reinstates a session takes its place rather than a new one.
    let max = shared.config.session.max_sessions;
    let replaced = shared
        .sessions_of(
            &outcome.initiator_name,
            outcome.isid,
            outcome.target_name.as_deref(),
        )
        .len();
    if shared.session_count().saturating_sub(replaced) >= max {
        shared.events.limit(Limit::Sessions);
        return Err((
            status::OUT_OF_RESOURCES,
            format!("{max} sessions already (max_sessions)"),
        ));
    }
    // LUN masking: the session holds the target as this initiator sees it.
    let view_of = |t: Arc<TargetNode>| t.view_of(&outcome.initiator_name);
    let node = match outcome.session_type {
        SessionType::Discovery => None,
        SessionType::Normal => {
            let name = outcome.target_name.as_deref().unwrap_or("");
            Some(
                shared
                    .find_target(name)
                    .ok_or_else(|| (status::NOT_FOUND, format!("no target {name}")))?,
            )
        }
    };
    let target = node.clone().map(view_of);
    // Session reinstatement: a leading login from the same initiator port replaces the
    // old session (RFC 7143 6.3.5).
    for old in shared.sessions_of(
        &outcome.initiator_name,
        outcome.isid,
        target.as_ref().map(|t| t.iqn.as_str()),
    ) {
        peer_log!(
            info,
            "session {} of {} reinstated by a new login",
            old.tsih,
            old.initiator
        );
        old.close();
        old.broadcast(|| ConnEvent::Close("session reinstated"));
        shared.remove_session(old.tsih);
    }
    let nexus = shared.nexus(&outcome.initiator_name, outcome.isid);
    let mut params = outcome.session.clone();
    if target.is_none() {
        params.max_connections = 1;
    }
    let queue_depth = shared.config.session.queue_depth;
    let session = shared.add_session(|tsih| {
        Session::new(
            tsih,
            outcome.isid,
            outcome.initiator_name.clone(),
            target,
            params,
            nexus,
            queue_depth,
            cmdsn,
        )
    });
    // A configuration reload between the lookup above and the session's registration
    // did not see the session: it takes the targets as they are now.
    if let Some(node) = node {
        match shared.find_target(&node.iqn) {
            Some(now) if Arc::ptr_eq(&now, &node) => {}
            Some(now) if !now.allows(&outcome.initiator_name) => {
                shared.remove_session(session.tsih);
                return Err((
                    status::AUTHORIZATION_FAILURE,
                    format!(
                        "initiator {} no longer admitted to target {} by a configuration reload",
                        outcome.initiator_name, node.iqn
                    ),
                ));
            }
            Some(now) => {
                session.set_target(view_of(now));
            }
            None => {
                shared.remove_session(session.tsih);
                return Err((
                    status::NOT_FOUND,
                    format!("target {} removed by a configuration reload", node.iqn),
                ));
            }
        }
    }
    Ok(session)
}
