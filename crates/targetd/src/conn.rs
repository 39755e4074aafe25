//! One connection: login, then the full feature phase.
//!
//! The reader (this task) decodes PDUs, collects write data and decides what runs; a writer
//! task (`wire::writer`) owns the transport's write half and stamps StatSN, ExpCmdSN and
//! MaxCmdSN on every PDU as it goes out, so numbers are assigned in the order the initiator
//! sees them. SCSI commands execute on blocking workers and queue their own Data-In and
//! response PDUs. Every byte to or from the peer goes through `wire`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use backstore::buffers::Buf;
use bytes::{Bytes, BytesMut};
use iscsi::ffp::{self, logout, tmf, DataRules, DataSequence, SequenceFault, WritePlan};
use iscsi::framing::{FrameError, FrameLimits, PduDecoder};
use iscsi::login::{
    AuthRequirement, LoginOutcome, LoginPolicy, LoginReply, LoginRequestView, LoginStep,
    SessionType, TargetLogin, TargetLookup,
};
use iscsi::negotiate::{ConnectionParams, PacingPolicy, SessionParams, TargetPacing};
use iscsi::pdu::{
    lun_from_wire, reject_reason, AsyncMessage, DataIn, DataOut, Digests, LoginRequest,
    LoginResponse, LogoutRequest, LogoutResponse, NopIn, NopOut, Pdu, R2t, Reject, ScsiCommand,
    ScsiResponse, TaskMgmtRequest, TaskMgmtResponse, TextRequest, TextResponse, BHS_LEN,
    RESERVED_TAG,
};
use iscsi::text::{split_for_pdus, TextAccumulator, TextKeys};
use net::transport::Stream;
use rand::RngCore;
use scsi::{LogicalUnit, Sense};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::server::{Shared, TargetNode};
use crate::session::{self, ConnEvent, ConnHandle, Ordered, Reassigned, Session, TaskCtl, TaskRec};
use crate::tags::TagMap;
use crate::wire::{self, Out, Reader};

/// Largest write a single command may ask us to buffer. Bigger transfers are refused with
/// CHECK CONDITION before any memory is committed; the Block Limits VPD page advertises
/// less than this.
const MAX_TASK_BYTES: u32 = 64 << 20;

pub async fn serve(shared: Arc<Shared>, stream: Stream, peer: SocketAddr) {
    wire::tune(&shared, &stream, peer);
    match run(shared, stream, peer).await {
        Ok(why) => debug!("{peer}: connection closed: {why}"),
        Err(e) => info!("{peer}: connection closed: {e:#}"),
    }
}

struct Policy<'a> {
    shared: &'a Shared,
    session: SessionParams,
    connection: ConnectionParams,
}

fn chap_requirement(chap: &Option<crate::config::Chap>) -> AuthRequirement {
    match chap {
        None => AuthRequirement::None,
        Some(c) => AuthRequirement::Chap {
            user: c.user.clone(),
            secret: c.secret.as_bytes().to_vec(),
            mutual: c
                .mutual_user
                .clone()
                .zip(c.mutual_secret.as_ref().map(|s| s.as_bytes().to_vec())),
        },
    }
}

impl LoginPolicy for Policy<'_> {
    fn lookup_target(&self, target_name: &str, initiator_name: &str) -> TargetLookup {
        match self.shared.find_target(target_name) {
            None => TargetLookup::NotFound,
            Some(t) if !t.allows(initiator_name) => TargetLookup::Forbidden,
            Some(t) => TargetLookup::Found {
                alias: t.alias.clone(),
                auth: chap_requirement(&t.chap),
            },
        }
    }
    fn discovery_auth(&self) -> AuthRequirement {
        chap_requirement(&self.shared.config.discovery.chap)
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

struct LoginResult {
    outcome: LoginOutcome,
    session: Arc<Session>,
    cid: u16,
    statsn: u32,
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

fn failure(class: u8, detail: u8) -> LoginReply {
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
async fn login(
    shared: &Arc<Shared>,
    stream: &mut Stream,
    dec: &mut PduDecoder,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> anyhow::Result<Option<LoginResult>> {
    let (session_prefs, connection_prefs) = preferences(shared);
    let mut policy = Policy {
        shared,
        session: session_prefs,
        connection: connection_prefs,
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
                        let reply = failure(2, 0x0a);
                        wire::send_now(
                            stream,
                            &login_response(&req, reply, req.tsih, statsn, (req.cmdsn, req.cmdsn)),
                        )
                        .await?;
                        info!("{peer}: login refused: session {} does not exist", req.tsih);
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
            LoginStep::Failed(reply) => {
                info!(
                    "{peer}: login refused: {} (0x{:02x}{:02x})",
                    iscsi::login::status::describe(reply.status_class, reply.status_detail),
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
                    Err((class, detail, why)) => {
                        info!("{peer}: login refused: {why}");
                        let reply = failure(class, detail);
                        wire::send_now(
                            stream,
                            &login_response(&req, reply, req.tsih, statsn, window),
                        )
                        .await?;
                        return Ok(None);
                    }
                };
                // Paced before the last login response goes out: every Data-In is.
                wire::apply_pacing(stream, &outcome, shared, peer, session.tsih, req.cid);
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

/// Finds or creates the session a finished login joins (RFC 7143 6.3).
fn bind_session(
    shared: &Arc<Shared>,
    outcome: &LoginOutcome,
    existing: Option<Arc<Session>>,
    cid: u16,
    cmdsn: u32,
) -> Result<Arc<Session>, (u8, u8, String)> {
    if shared.shutting_down() {
        return Err((3, 1, "target is shutting down".into()));
    }
    if let Some(s) = existing {
        if s.is_discovery() {
            return Err((2, 8, "discovery sessions take one connection".into()));
        }
        if !s.has_connection(cid) && s.connection_count() >= s.params.max_connections as usize {
            return Err((
                2,
                6,
                format!(
                    "session already has MaxConnections={}",
                    s.params.max_connections
                ),
            ));
        }
        return Ok(s);
    }
    let target = match outcome.session_type {
        SessionType::Discovery => None,
        SessionType::Normal => {
            let name = outcome.target_name.as_deref().unwrap_or("");
            Some(
                shared
                    .find_target(name)
                    .ok_or_else(|| (2, 3, format!("no target {name}")))?,
            )
        }
    };
    // Session reinstatement: a leading login from the same initiator port replaces the
    // old session (RFC 7143 6.3.5).
    for old in shared.sessions_of(
        &outcome.initiator_name,
        outcome.isid,
        target.as_ref().map(|t| t.iqn.as_str()),
    ) {
        info!(
            "session {} of {} reinstated by a new login",
            old.tsih, old.initiator
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
    Ok(shared.add_session(|tsih| {
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
    }))
}

async fn run(shared: Arc<Shared>, mut stream: Stream, peer: SocketAddr) -> anyhow::Result<String> {
    let local = stream.local_addr()?;
    let mut dec = PduDecoder::new(FrameLimits::default());
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let login_timeout = Duration::from_secs(shared.config.session.login_timeout.max(1));
    let result = match tokio::time::timeout(
        login_timeout,
        login(&shared, &mut stream, &mut dec, &mut buf, peer),
    )
    .await
    {
        Err(_) => bail!("login not finished within {login_timeout:?}"),
        Ok(r) => r?,
    };
    let Some(LoginResult {
        outcome,
        session,
        cid,
        statsn,
    }) = result
    else {
        return Ok("login failed".into());
    };
    info!(
        "{peer}: {} logged in to {} (session {}, cid {cid}, {} connection(s); digests h={} d={}, MRDSL {}/{})",
        outcome.initiator_name,
        session.target.as_ref().map_or("discovery", |t| t.iqn.as_str()),
        session.tsih,
        session.connection_count() + 1,
        outcome.connection.header_digest,
        outcome.connection.data_digest,
        outcome.connection.max_recv_data_segment_length,
        outcome.connection.max_send_data_segment_length,
    );
    let digests = Digests {
        header: outcome.connection.header_digest,
        data: outcome.connection.data_digest,
    };
    dec.set_digests(digests);
    dec.set_max_recv_data_segment(outcome.connection.max_recv_data_segment_length);

    let (rd, wr) = stream.into_split();
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(wire::writer(
        wr,
        out_rx,
        session.clone(),
        digests,
        statsn,
        cid,
    ));
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let handle = ConnHandle { events: ev_tx };
    if session.erl2() && session.close_for_recovery(cid).await {
        // Connection reinstatement at ERL 2 is an implicit logout for recovery: the old
        // connection's tasks are handed over before this one may reassign them.
        debug!(
            "session {}: cid {cid} reinstated for recovery",
            session.tsih
        );
    }
    if let Some(old) = session.add_connection(cid, handle.clone()) {
        // Connection reinstatement: same CID logged in again.
        let _ = old.events.send(ConnEvent::Close("connection reinstated"));
    }
    let mut conn = Conn {
        shared: shared.clone(),
        session: session.clone(),
        cid,
        params: outcome.connection.clone(),
        out: out_tx,
        tasks: TagMap::default(),
        next_ttt: 1,
        text_in: TextAccumulator::default(),
        text_out: None,
        local,
        executing: Arc::new(Executing::default()),
        ping: None,
        closing: false,
        keep_tasks: true,
        acked: None,
    };
    let why = conn.serve(Reader::new(rd), dec, buf, &mut ev_rx).await;
    let recovering = session.erl2() && conn.keep_tasks && !session.is_closed();
    let last = if recovering {
        let tasks = std::mem::take(&mut conn.tasks);
        let last = session.retire_connection(cid, &handle, tasks, &mut ev_rx);
        tokio::spawn(expire_retained(shared.clone(), session.clone(), last));
        last
    } else {
        conn.cleanup();
        session.remove_connection(cid, &handle)
    };
    if last && !recovering {
        // Below ERL 2 (or after a logout), losing the last connection ends the session.
        session.close();
        shared.remove_session(session.tsih);
        debug!("session {} ended", session.tsih);
    }
    let _ = conn.out.send(Out::Close);
    drop(conn);
    let _ = writer.await;
    why
}

/// ERL 2: after a connection failed, what waited for reassignment longer than the
/// session's DefaultTime2Wait + DefaultTime2Retain goes; so does the session when no
/// connection came back to it (RFC 7143 6.3.6).
async fn expire_retained(shared: Arc<Shared>, session: Arc<Session>, was_last: bool) {
    tokio::time::sleep(session.retention() + Duration::from_millis(100)).await;
    session.purge_retained();
    if was_last && session.connection_count() == 0 && session.close() {
        for (_, _, ctl) in session.tasks_on(None) {
            ctl.abort();
        }
        shared.remove_session(session.tsih);
        debug!("session {} ended: no connection came back", session.tsih);
    }
}

/// Commands of this connection running on workers; logout waits for them.
#[derive(Default)]
struct Executing {
    count: AtomicUsize,
    idle: Notify,
}

impl Executing {
    async fn wait(&self) {
        loop {
            let n = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            n.await;
        }
    }
}

/// A SCSI command whose data is still arriving or whose turn has not come.
pub(crate) struct Task {
    cmd: ScsiCommand,
    lun: Option<u16>,
    ctl: Arc<TaskCtl>,
    /// The write's data as it arrives, at its buffer offsets. From the pool, so it holds
    /// stale bytes until the data sequences have covered all of it, which they must before
    /// the command runs.
    buf: Buf,
    received: u32,
    /// The data sequences still open: the unsolicited one (TTT 0xffffffff) and one per
    /// R2T out.
    unsolicited: Option<DataSequence>,
    r2ts: Vec<DataSequence>,
    next_solicit: u32,
    next_r2tsn: u32,
    delivered: bool,
    /// Data is taken off the wire but not kept (the command is refused anyway).
    sink: Option<scsi::Response>,
}

impl Task {
    pub(crate) fn mark_delivered(&mut self) {
        self.delivered = true;
    }

    fn data_complete(&self) -> bool {
        !self.cmd.write || self.received >= self.cmd.edtl
    }
}

struct Conn {
    shared: Arc<Shared>,
    session: Arc<Session>,
    cid: u16,
    params: ConnectionParams,
    out: mpsc::UnboundedSender<Out>,
    tasks: TagMap<u32, Task>,
    next_ttt: u32,
    text_in: TextAccumulator,
    /// The rest of a Text Response that did not fit in one PDU: (ITT, TTT, chunks).
    text_out: Option<(u32, u32, VecDeque<Vec<u8>>)>,
    local: SocketAddr,
    executing: Arc<Executing>,
    /// A NOP-In ping of ours awaiting its NOP-Out: (TTT, sent at).
    ping: Option<(u32, Instant)>,
    closing: bool,
    /// ERL 2: when the connection ends, its tasks wait for reassignment (a failure or a
    /// logout for recovery), rather than end with it (a logout, a session's end).
    keep_tasks: bool,
    /// ERL 2: the last ExpStatSN handed to the session; the same again acknowledges
    /// nothing new, and needs no trip through the session's lock.
    acked: Option<u32>,
}

/// Why the connection must close, when it is not the peer's doing.
type Close = anyhow::Error;

fn header_of(pdu: &Pdu) -> [u8; BHS_LEN] {
    let mut v = Vec::with_capacity(BHS_LEN + 4);
    pdu.encode_header(&mut v, Digests::default());
    let mut bhs = [0u8; BHS_LEN];
    bhs.copy_from_slice(&v[..BHS_LEN]);
    bhs
}

impl Conn {
    fn send(&self, p: impl Into<Pdu>) {
        let _ = self.out.send(Out::Pdu(p.into()));
    }

    fn reject(&self, reason: u8, bhs: &[u8; BHS_LEN]) {
        self.send(Reject::for_header(reason, bhs));
    }

    fn new_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        t
    }

    async fn serve(
        &mut self,
        mut rd: Reader,
        mut dec: PduDecoder,
        mut buf: BytesMut,
        events: &mut mpsc::UnboundedReceiver<ConnEvent>,
    ) -> anyhow::Result<String> {
        let nop_interval = self.shared.config.session.nop_interval;
        let nop_every = (nop_interval > 0).then(|| Duration::from_secs(nop_interval));
        let mut last_heard = Instant::now();
        loop {
            // Whatever is already buffered is handled before reading more.
            loop {
                match dec.decode(&mut buf) {
                    Ok(Some(pdu)) => {
                        last_heard = Instant::now();
                        self.on_pdu(pdu).await?;
                        if self.closing {
                            return Ok("logged out".into());
                        }
                    }
                    Ok(None) => break,
                    Err(FrameError::HeaderDigest) => bail!("header digest error"),
                    Err(e) => {
                        warn!("connection {}: rejecting PDU: {e}", self.cid);
                        if let (Some(bhs), Some(reason)) = (e.rejected_header(), e.reject_reason())
                        {
                            self.reject(reason, bhs);
                        }
                        if matches!(e, FrameError::DataSegmentTooLarge { .. }) {
                            bail!("{e}");
                        }
                    }
                }
            }
            if buf.capacity() - buf.len() < 64 * 1024 {
                buf.reserve(512 * 1024);
            }
            let nop_at = nop_every.map(|d| last_heard + d);
            tokio::select! {
                biased;
                ev = events.recv() => match ev {
                    Some(ConnEvent::Deliver(o)) => {
                        self.deliver(o).await?;
                        if self.closing {
                            return Ok("logged out".into());
                        }
                    }
                    Some(ConnEvent::Abort(itt)) => self.drop_task(itt),
                    Some(ConnEvent::Close(why)) => {
                        self.keep_tasks = false;
                        return Ok(why.into());
                    }
                    Some(ConnEvent::Recover) => return Ok("closed for recovery".into()),
                    Some(ConnEvent::Send(pdus)) => {
                        for p in pdus {
                            self.send(p);
                        }
                    }
                    Some(ConnEvent::RequestLogout) => self.send(AsyncMessage {
                        async_event: 1,
                        parameter3: 5,
                        ..Default::default()
                    }),
                    None => return Ok("session gone".into()),
                },
                n = rd.fill(&mut buf) => {
                    if n? == 0 {
                        return Ok("closed by the initiator".into());
                    }
                }
                _ = sleep_until_opt(nop_at) => {
                    if let Some((_, sent)) = self.ping {
                        if sent.elapsed() >= nop_every.unwrap_or_default() {
                            bail!("no answer to NOP-In within {nop_interval}s");
                        }
                    } else {
                        let ttt = self.new_ttt();
                        self.ping = Some((ttt, Instant::now()));
                        self.send(NopIn { ttt, ..Default::default() });
                    }
                    last_heard = Instant::now();
                }
            }
        }
    }

    async fn on_pdu(&mut self, pdu: Pdu) -> Result<(), Close> {
        if self.session.erl2() {
            if let Some(exp) = session::exp_statsn(&pdu) {
                if self.acked.replace(exp) != Some(exp) {
                    self.session.acknowledge(self.cid, exp);
                }
            }
        }
        match pdu {
            Pdu::ScsiCommand(c) => self.on_scsi(c),
            Pdu::DataOut(d) => self.on_data_out(d),
            Pdu::SnackRequest(_) => {
                // ErrorRecoveryLevel 0: SNACK is not supported (RFC 7143 11.16).
                self.reject(reject_reason::PROTOCOL_ERROR, &header_of(&pdu));
                Ok(())
            }
            Pdu::NopOut(ref n) if n.itt == RESERVED_TAG => {
                // Either the answer to our ping, or an ExpStatSN update: no response.
                if self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
                    self.ping = None;
                }
                Ok(())
            }
            Pdu::NopOut(_)
            | Pdu::TextRequest(_)
            | Pdu::TaskMgmtRequest(_)
            | Pdu::LogoutRequest(_) => {
                let (immediate, cmdsn) = match &pdu {
                    Pdu::NopOut(p) => (p.immediate, p.cmdsn),
                    Pdu::TextRequest(p) => (p.immediate, p.cmdsn),
                    Pdu::TaskMgmtRequest(p) => (p.immediate, p.cmdsn),
                    Pdu::LogoutRequest(p) => (p.immediate, p.cmdsn),
                    _ => unreachable!("matched above"),
                };
                if immediate {
                    self.run_ordered(pdu).await
                } else {
                    match self
                        .session
                        .order(self.cid, cmdsn, Ordered::Pdu(Box::new(pdu)))
                    {
                        Ok(ready) => self.dispatch(ready).await,
                        Err(e) => {
                            debug!("connection {}: command ignored: {e:?}", self.cid);
                            Ok(())
                        }
                    }
                }
            }
            other => {
                // Target-to-initiator opcodes, or a Login Request after login.
                warn!("connection {}: unexpected {:?}", self.cid, other.opcode());
                self.reject(reject_reason::PROTOCOL_ERROR, &header_of(&other));
                Ok(())
            }
        }
    }

    async fn dispatch(&mut self, ready: Vec<(u16, Ordered)>) -> Result<(), Close> {
        for (cid, item) in ready {
            if cid == self.cid {
                self.deliver(item).await?;
            } else if !self.session.send_to(cid, ConnEvent::Deliver(item)) {
                debug!("connection {cid} is gone; its command is dropped");
            }
        }
        Ok(())
    }

    async fn deliver(&mut self, item: Ordered) -> Result<(), Close> {
        match item {
            Ordered::Scsi(itt) => {
                self.deliver_now(itt);
                Ok(())
            }
            Ordered::Pdu(p) => self.run_ordered(*p).await,
        }
    }

    async fn run_ordered(&mut self, pdu: Pdu) -> Result<(), Close> {
        match pdu {
            Pdu::NopOut(n) => {
                self.on_nop_out(n);
                Ok(())
            }
            Pdu::TextRequest(t) => {
                self.on_text(t);
                Ok(())
            }
            Pdu::TaskMgmtRequest(t) => {
                self.on_tmf(t).await;
                Ok(())
            }
            Pdu::LogoutRequest(l) => self.on_logout(l).await,
            _ => Ok(()),
        }
    }

    fn on_nop_out(&mut self, n: NopOut) {
        let mut data = n.data;
        data.truncate(self.params.max_send_data_segment_length as usize);
        self.send(NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            data,
            ..Default::default()
        });
    }

    fn on_scsi(&mut self, cmd: ScsiCommand) -> Result<(), Close> {
        // Only a refusal needs the header back; building it is not free on the hot path.
        let reject = |conn: &Self, cmd: ScsiCommand, reason: u8| {
            conn.reject(reason, &header_of(&Pdu::ScsiCommand(cmd)));
        };
        if self.session.is_discovery() {
            // Discovery sessions carry no SCSI (RFC 7143 4.3).
            reject(self, cmd, reject_reason::PROTOCOL_ERROR);
            return Ok(());
        }
        let imm = cmd.data.len() as u32;
        let rules = DataRules::from(&self.session.params);
        let plan = match WritePlan::target(cmd.write, cmd.edtl, imm, cmd.final_, &rules) {
            Ok(plan) => plan,
            Err(e) => {
                warn!("connection {}: ITT {:#x}: {e}", self.cid, cmd.itt);
                reject(self, cmd, reject_reason::PROTOCOL_ERROR);
                return Ok(());
            }
        };
        if !cmd.immediate {
            let (exp, max) = self.session.window();
            if !iscsi::serial::sn_in_window(cmd.cmdsn, exp, max) {
                debug!(
                    "connection {}: CmdSN {} outside [{exp}, {max}]: ignored",
                    self.cid, cmd.cmdsn
                );
                return Ok(());
            }
        }
        let lun = lun_from_wire(cmd.lun);
        let ctl = Arc::new(TaskCtl::default());
        if !self.session.register_task(
            cmd.itt,
            TaskRec {
                cid: self.cid,
                lun: lun.unwrap_or(u16::MAX),
                ctl: ctl.clone(),
            },
        ) {
            warn!("connection {}: ITT {:#x} already in use", self.cid, cmd.itt);
            reject(self, cmd, reject_reason::INVALID_PDU_FIELD);
            return Ok(());
        }
        let sink = (cmd.write && cmd.edtl > MAX_TASK_BYTES)
            .then(|| scsi::Response::check_condition(&Sense::invalid_field_in_cdb(0, None)));
        let keep = if sink.is_some() || !cmd.write {
            0
        } else {
            cmd.edtl as usize
        };
        let mut buf = Buf::take(keep);
        if keep > 0 {
            buf[..imm as usize].copy_from_slice(&cmd.data);
        }
        let unsolicited_end = plan.unsolicited_end;
        let unsolicited =
            (unsolicited_end > imm).then(|| DataSequence::new(RESERVED_TAG, imm..unsolicited_end));
        let itt = cmd.itt;
        let immediate = cmd.immediate;
        let cmdsn = cmd.cmdsn;
        let write = cmd.write;
        let mut task = Task {
            cmd: ScsiCommand {
                data: Bytes::new(),
                ..cmd
            },
            lun,
            ctl,
            buf,
            received: imm,
            unsolicited,
            r2ts: Vec::new(),
            next_solicit: unsolicited_end,
            next_r2tsn: 0,
            delivered: false,
            sink,
        };
        if write {
            self.solicit(&mut task);
        }
        self.tasks.insert(itt, task);
        if immediate {
            self.deliver_now(itt);
            return Ok(());
        }
        match self.session.order(self.cid, cmdsn, Ordered::Scsi(itt)) {
            Ok(ready) => {
                // SCSI commands never need an await to deliver, but other PDUs in the
                // queue behind this one might; hand those to the event path.
                for (cid, item) in ready {
                    match item {
                        Ordered::Scsi(i) if cid == self.cid => self.deliver_now(i),
                        other => {
                            if !self.session.send_to(cid, ConnEvent::Deliver(other)) {
                                debug!("connection {cid} is gone; its command is dropped");
                            }
                        }
                    }
                }
            }
            Err(e) => {
                debug!(
                    "connection {}: command ITT {itt:#x} ignored: {e:?}",
                    self.cid
                );
                self.drop_task(itt);
            }
        }
        Ok(())
    }

    fn deliver_now(&mut self, itt: u32) {
        match self.tasks.get_mut(&itt) {
            Some(t) => {
                t.delivered = true;
                if t.data_complete() {
                    self.execute(itt);
                }
            }
            // A command of an earlier connection with this CID, waiting for reassignment.
            None => self.session.deliver_orphan(itt),
        }
    }

    /// Sends R2Ts until MaxOutstandingR2T are out or everything is asked for.
    fn solicit(&mut self, task: &mut Task) {
        let rules = DataRules::from(&self.session.params);
        let max_out = rules.max_outstanding_r2t.max(1) as usize;
        while task.r2ts.len() < max_out {
            let Some(range) = ffp::next_r2t(task.next_solicit, task.cmd.edtl, &rules) else {
                break;
            };
            let ttt = self.new_ttt();
            let r2tsn = task.next_r2tsn;
            task.next_r2tsn += 1;
            task.next_solicit = range.end;
            let _ = self.out.send(Out::Pdu(Pdu::R2t(R2t {
                lun: task.cmd.lun,
                itt: task.cmd.itt,
                ttt,
                r2tsn,
                buffer_offset: range.start,
                desired_data_transfer_length: range.end - range.start,
                ..Default::default()
            })));
            task.r2ts.push(DataSequence::new(ttt, range));
        }
    }

    fn on_data_out(&mut self, d: DataOut) -> Result<(), Close> {
        let Some(mut task) = self.tasks.remove(&d.itt) else {
            // The task was aborted or refused; its remaining data is dropped.
            debug!(
                "connection {}: Data-Out for unknown ITT {:#x}",
                self.cid, d.itt
            );
            return Ok(());
        };
        let len = d.data.len() as u32;
        let seq = if d.ttt == RESERVED_TAG {
            task.unsolicited.as_mut()
        } else {
            task.r2ts.iter_mut().find(|s| s.ttt == d.ttt)
        };
        // At ErrorRecoveryLevel 0 a broken data sequence cannot be repaired: the command
        // ends with CHECK CONDITION and the connection goes on (SPC-5 "DATA PHASE ERROR"
        // family), so one bad command does not cost the initiator its session.
        let checked = match seq {
            None => Err(SequenceFault::unknown_ttt(d.ttt)),
            Some(seq) => seq.check(d.datasn, d.buffer_offset, len, d.final_),
        };
        if let Err(fault) = checked {
            warn!(
                "connection {}: Data-Out ITT {:#x}: {fault}; command ended",
                self.cid, d.itt
            );
            self.session.unregister_task(d.itt);
            let sense = Sense::new(scsi::sense::key::ABORTED_COMMAND, 0x4b, fault.ascq);
            self.send(ScsiResponse {
                itt: d.itt,
                expdatasn: task.next_r2tsn,
                ..ScsiResponse::with_sense(&sense.fixed())
            });
            return Ok(());
        }
        let seq = if d.ttt == RESERVED_TAG {
            task.unsolicited.as_mut()
        } else {
            task.r2ts.iter_mut().find(|s| s.ttt == d.ttt)
        }
        .expect("checked above");
        if !task.buf.is_empty() {
            let off = d.buffer_offset as usize;
            task.buf[off..off + len as usize].copy_from_slice(&d.data);
        }
        seq.advance(len);
        let seq_done = seq.is_done();
        task.received += len;
        if seq_done {
            if d.ttt == RESERVED_TAG {
                task.unsolicited = None;
            } else {
                task.r2ts.retain(|s| s.ttt != d.ttt);
                self.solicit(&mut task);
            }
        }
        let itt = d.itt;
        let ready = task.delivered && task.data_complete();
        self.tasks.insert(itt, task);
        if ready {
            self.execute(itt);
        }
        Ok(())
    }

    /// Runs the command on a blocking worker; its data and status go back on this
    /// connection (allegiance).
    fn execute(&mut self, itt: u32) {
        let Some(task) = self.tasks.remove(&itt) else {
            return;
        };
        if task.ctl.is_aborted() {
            self.session.unregister_task(itt);
            return;
        }
        let target = self.session.target.clone().expect("normal session");
        task.ctl.executing.store(true, Ordering::Release);
        self.shared.task_started();
        self.executing.count.fetch_add(1, Ordering::AcqRel);
        let job = Job {
            task,
            target,
            nexus: self.session.nexus,
            out: self.out.clone(),
            max_seg: self.params.max_send_data_segment_length,
            max_burst: self.session.params.max_burst_length,
            // A data digest reads the bytes in user space: it copies. At ERL 2 an answer
            // kept for reassignment keeps its blocks for a second at most (the writer).
            lend: !self.params.data_digest,
        };
        let session = self.session.clone();
        let shared = self.shared.clone();
        let executing = self.executing.clone();
        let cid = self.cid;
        let finish = move |job: Job, pdus: Vec<Pdu>| {
            let ctl = &job.task.ctl;
            if ctl.claim_answer() {
                if let Some(pdus) = session.answer_here(cid, itt, pdus) {
                    for p in pdus {
                        let _ = job.out.send(Out::Pdu(p));
                    }
                }
            }
            // erl2() first: may_lend() looks the LU up, and this runs for every command.
            if session.erl2() && job.may_lend() {
                // At ERL 2 the session keeps the answer until its status is acknowledged,
                // and with it the blocks of a lent read: an initiator that goes quiet
                // after the read would hold writes to them up. After LENT_HOLD a kept
                // answer is copied and the blocks go (the writer does the same for what
                // the socket has not taken).
                let session = session.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(wire::LENT_HOLD).await;
                    session.unlend_retained(&[itt]);
                });
            }
            session.unregister_task(itt);
            ctl.finished.store(true, Ordering::Release);
            ctl.done.notify_waiters();
            if executing.count.fetch_sub(1, Ordering::AcqRel) == 1 {
                executing.idle.notify_waiters();
            }
            shared.task_finished();
        };
        // A read the page cache can answer costs less than the hand-over to a worker.
        if let Some(pdus) = job.run_now() {
            finish(job, pdus);
            return;
        }
        tokio::task::spawn_blocking(move || {
            let pdus = job.run();
            finish(job, pdus);
        });
    }

    /// Forgets a task that has not started executing.
    fn drop_task(&mut self, itt: u32) {
        if self.tasks.remove(&itt).is_some() {
            self.session.unregister_task(itt);
        }
    }

    fn cleanup(&mut self) {
        for itt in self.tasks.keys().copied().collect::<Vec<_>>() {
            self.drop_task(itt);
        }
    }

    fn on_text(&mut self, t: TextRequest) {
        let max = self.params.max_send_data_segment_length as usize;
        if t.ttt != RESERVED_TAG {
            // The initiator asks for the next part of a long response.
            match self.text_out.take() {
                Some((itt, ttt, mut rest)) if itt == t.itt && ttt == t.ttt => {
                    let chunk = rest.pop_front().unwrap_or_default();
                    let more = !rest.is_empty();
                    self.send(TextResponse {
                        final_: !more,
                        cont: more,
                        lun: t.lun,
                        itt: t.itt,
                        ttt: if more { ttt } else { RESERVED_TAG },
                        data: Bytes::from(chunk),
                        ..Default::default()
                    });
                    if more {
                        self.text_out = Some((itt, ttt, rest));
                    }
                }
                _ => self.reject(
                    reject_reason::INVALID_PDU_FIELD,
                    &header_of(&Pdu::TextRequest(t)),
                ),
            }
            return;
        }
        self.text_out = None;
        let whole = match self.text_in.push(&t.data, t.cont) {
            Ok(Some(whole)) => whole,
            Ok(None) => {
                // More of the request follows: answer empty, as RFC 7143 11.10.2 asks.
                let ttt = self.new_ttt();
                self.send(TextResponse {
                    final_: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt,
                    ..Default::default()
                });
                return;
            }
            Err(e) => {
                warn!("connection {}: text request: {e}", self.cid);
                self.reject(
                    reject_reason::PROTOCOL_ERROR,
                    &header_of(&Pdu::TextRequest(t)),
                );
                return;
            }
        };
        let keys = match TextKeys::parse(&whole) {
            Ok(k) => k,
            Err(e) => {
                warn!("connection {}: text request: {e}", self.cid);
                self.reject(
                    reject_reason::PROTOCOL_ERROR,
                    &header_of(&Pdu::TextRequest(t)),
                );
                return;
            }
        };
        let mut answer = TextKeys::new();
        for (k, v) in keys.iter() {
            if k == "SendTargets" {
                self.send_targets(v, &mut answer);
            } else if k == iscsi::negotiate::PACING_RATE_KEY {
                self.pacing_hint(v, &mut answer);
            } else if k.starts_with("X-")
                || k.starts_with("X#")
                || iscsi::negotiate::lookup(k).is_none()
            {
                answer.push(k, iscsi::text::NOT_UNDERSTOOD);
            } else {
                // Renegotiation in full feature phase is not offered: the value in force
                // stays (RFC 7143 6.2).
                answer.push(k, iscsi::text::REJECT);
            }
        }
        let mut chunks: VecDeque<Vec<u8>> = split_for_pdus(&answer.encode(), max).into();
        let first = chunks.pop_front().unwrap_or_default();
        let more = !chunks.is_empty();
        let ttt = if more { self.new_ttt() } else { RESERVED_TAG };
        self.send(TextResponse {
            final_: !more,
            cont: more,
            lun: t.lun,
            itt: t.itt,
            ttt,
            data: Bytes::from(first),
            ..Default::default()
        });
        if more {
            self.text_out = Some((t.itt, ttt, chunks));
        }
    }

    /// `X-org.reservoir.PacingRate` in full feature phase: the initiator's rate control
    /// found the bottleneck and asks for this connection's share of it. Answered as at
    /// login (the target's own rate wins; hints may be off); applied by the writer, so
    /// that the answer goes out already paced. Discovery sessions send no data to pace.
    fn pacing_hint(&self, offered: &str, answer: &mut TextKeys) {
        let key = iscsi::negotiate::PACING_RATE_KEY;
        if self.session.is_discovery() {
            answer.push(key, iscsi::text::IRRELEVANT);
            return;
        }
        let s = &self.shared.config.session;
        let (a, pacing) = iscsi::negotiate::answer_pacing_hint(offered, &s.pacing_policy());
        match pacing {
            TargetPacing::Paced(rate) if Some(rate) != s.pacing_rate => {
                debug!(
                    "cid {}: Data-In paced at {rate} bytes/s as the initiator asks",
                    self.cid
                );
                let _ = self.out.send(Out::Pace(rate));
            }
            TargetPacing::NotPaced if s.pacing_rate.is_none() && s.accept_pacing_hint => {
                // "0": the initiator no longer wants this connection paced.
                let _ = self.out.send(Out::Pace(u64::MAX));
            }
            _ => {}
        }
        answer.push(key, a.wire().unwrap_or(iscsi::text::REJECT));
    }

    fn portal_addresses(&self) -> Vec<String> {
        self.shared
            .portals
            .iter()
            .map(|p| {
                let ip = if p.ip().is_unspecified() {
                    self.local.ip()
                } else {
                    p.ip()
                };
                let addr = SocketAddr::new(ip, p.port());
                format!("{addr},1")
            })
            .collect()
    }

    fn send_targets(&self, which: &str, answer: &mut TextKeys) {
        let visible: Vec<&Arc<TargetNode>> = match &self.session.target {
            // A normal session sees only its own target.
            Some(t) => vec![t],
            None => self
                .shared
                .targets
                .iter()
                .filter(|t| t.allows(&self.session.initiator))
                .collect(),
        };
        let wanted: Vec<&Arc<TargetNode>> = match which {
            "All" => visible,
            "" => match &self.session.target {
                Some(t) => vec![t],
                None => Vec::new(),
            },
            name => visible
                .into_iter()
                .filter(|t| t.iqn.eq_ignore_ascii_case(name))
                .collect(),
        };
        let addrs = self.portal_addresses();
        for t in wanted {
            answer.push("TargetName", t.iqn.clone());
            for a in &addrs {
                answer.push("TargetAddress", a.clone());
            }
        }
    }

    async fn on_logout(&mut self, l: LogoutRequest) -> Result<(), Close> {
        let p = &self.session.params;
        let (t2w, t2r) = (p.default_time2wait, p.default_time2retain);
        let response = match l.reason & 0x7f {
            logout::CLOSE_SESSION => {
                self.keep_tasks = false;
                self.executing.wait().await;
                self.session.close();
                for (_, _, ctl) in self.session.tasks_on(None) {
                    ctl.abort();
                }
                self.session
                    .broadcast(|| ConnEvent::Close("session logged out"));
                self.shared.remove_session(self.session.tsih);
                self.closing = true;
                logout::CLOSED
            }
            logout::CLOSE_CONNECTION if l.cid == self.cid => {
                self.keep_tasks = false;
                self.executing.wait().await;
                self.closing = true;
                logout::CLOSED
            }
            logout::CLOSE_CONNECTION => {
                if self
                    .session
                    .send_to(l.cid, ConnEvent::Close("logged out by another connection"))
                {
                    logout::CLOSED
                } else {
                    logout::CID_NOT_FOUND
                }
            }
            logout::REMOVE_FOR_RECOVERY => self.logout_for_recovery(l.cid).await,
            _ => logout::RECOVERY_NOT_SUPPORTED,
        };
        self.send(LogoutResponse {
            response,
            itt: l.itt,
            time2wait: t2w,
            time2retain: t2r,
            ..Default::default()
        });
        Ok(())
    }

    /// Logout reason 2, "remove the connection for recovery" (RFC 7143 11.14.1): the
    /// connection closes and its tasks wait for TASK REASSIGN elsewhere. Below ERL 2 the
    /// answer is 2, "connection recovery is not supported".
    async fn logout_for_recovery(&mut self, cid: u16) -> u8 {
        if !self.session.erl2() {
            return logout::RECOVERY_NOT_SUPPORTED;
        }
        if cid == self.cid {
            self.closing = true;
            return logout::CLOSED;
        }
        if self.session.close_for_recovery(cid).await {
            logout::CLOSED
        } else {
            // It failed and was handed over already.
            logout::CID_NOT_FOUND
        }
    }

    /// Carries on a task reassigned to this connection (RFC 7143 6.2.2).
    fn adopt(&mut self, itt: u32, how: Reassigned) {
        match how {
            Reassigned::Running => {}
            Reassigned::Answered(pdus) => {
                for p in pdus {
                    self.send(p);
                }
            }
            Reassigned::Pending(mut task) => {
                self.resolicit(&mut task);
                let ready = task.delivered && task.data_complete();
                self.tasks.insert(itt, *task);
                if ready {
                    self.execute(itt);
                }
            }
        }
    }

    /// The R2Ts the old connection had out, and unsolicited data it was still receiving,
    /// are void after reassignment: asks again for what they had not brought, then goes
    /// on soliciting as usual. More gaps than MaxOutstandingR2T allows are asked for in
    /// one range from the first to the last; data received twice lands twice, harmlessly.
    fn resolicit(&mut self, task: &mut Task) {
        if !task.cmd.write {
            return;
        }
        let mut missing: Vec<(u32, u32)> = task
            .unsolicited
            .take()
            .into_iter()
            .chain(task.r2ts.drain(..))
            .filter(|s| !s.is_done())
            .map(|s| {
                let m = s.missing();
                (m.start, m.end)
            })
            .collect();
        missing.sort_unstable();
        let max_out = self.session.params.max_outstanding_r2t.max(1) as usize;
        if missing.len() > max_out {
            let (start, end) = (missing[0].0, missing[missing.len() - 1].1);
            missing = vec![(start, end)];
        }
        let asked: u32 = missing.iter().map(|(a, b)| b - a).sum();
        task.received = task.next_solicit.saturating_sub(asked);
        for (start, end) in missing {
            let ttt = self.new_ttt();
            let r2tsn = task.next_r2tsn;
            task.next_r2tsn += 1;
            task.r2ts.push(DataSequence::new(ttt, start..end));
            self.send(R2t {
                lun: task.cmd.lun,
                itt: task.cmd.itt,
                ttt,
                r2tsn,
                buffer_offset: start,
                desired_data_transfer_length: end - start,
                ..Default::default()
            });
        }
        self.solicit(task);
    }

    /// Stops the listed tasks: those not yet running are dropped, running ones finish
    /// with their responses suppressed before this returns. True when every task was
    /// stopped before it answered.
    async fn abort_tasks(&mut self, tasks: Vec<(u32, u16, Arc<TaskCtl>)>) -> bool {
        let mut all = true;
        for (itt, cid, ctl) in &tasks {
            all &= ctl.abort();
            if !ctl.executing.load(Ordering::Acquire) {
                if *cid == self.cid {
                    self.drop_task(*itt);
                } else {
                    self.session.send_to(*cid, ConnEvent::Abort(*itt));
                }
            }
        }
        for (_, _, ctl) in tasks {
            if ctl.executing.load(Ordering::Acquire) {
                let done = ctl.done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if !ctl.finished.load(Ordering::Acquire) {
                    done.await;
                }
            }
        }
        all
    }

    async fn on_tmf(&mut self, t: TaskMgmtRequest) {
        let function = t.function & 0x7f;
        let lun = lun_from_wire(t.lun);
        let target = self.session.target.clone();
        let lu: Option<Arc<LogicalUnit>> = match (&target, lun) {
            (Some(tg), Some(l)) => tg.luns.get(&l).cloned(),
            _ => None,
        };
        let mut reassigned = None;
        let response = match function {
            tmf::ABORT_TASK => match self.session.task(t.referenced_task_tag) {
                None => tmf::NO_TASK,
                Some((_, _, ctl)) if ctl.finished.load(Ordering::Acquire) => tmf::NO_TASK,
                Some((cid, _, ctl)) => {
                    // A task that answered while we got here "does not exist" any more.
                    if self
                        .abort_tasks(vec![(t.referenced_task_tag, cid, ctl)])
                        .await
                    {
                        tmf::COMPLETE
                    } else {
                        tmf::NO_TASK
                    }
                }
            },
            tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET | tmf::LOGICAL_UNIT_RESET => match &lu {
                None => tmf::NO_LUN,
                Some(lu) => {
                    let tasks = self.session.tasks_on(lun);
                    self.abort_tasks(tasks).await;
                    if function == tmf::LOGICAL_UNIT_RESET {
                        lu.reset();
                    }
                    tmf::COMPLETE
                }
            },
            tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => match &target {
                None => tmf::NOT_SUPPORTED,
                Some(tg) => {
                    let tasks = self.session.tasks_on(None);
                    self.abort_tasks(tasks).await;
                    for lu in tg.luns.values() {
                        lu.reset();
                    }
                    tmf::COMPLETE
                }
            },
            tmf::CLEAR_ACA => tmf::NOT_SUPPORTED,
            tmf::TASK_REASSIGN => {
                match self
                    .session
                    .reassign(t.referenced_task_tag, self.cid, t.expdatasn)
                {
                    Ok(how) => {
                        reassigned = Some(how);
                        tmf::COMPLETE
                    }
                    Err(response) => response,
                }
            }
            _ => tmf::NOT_SUPPORTED,
        };
        info!(
            "connection {}: task management function {function} on LUN {:?}: response {response}",
            self.cid, lun
        );
        self.send(TaskMgmtResponse {
            response,
            itt: t.itt,
            ..Default::default()
        });
        if let Some(how) = reassigned {
            self.adopt(t.referenced_task_tag, how);
        }
        if function == tmf::TARGET_COLD_RESET && response == tmf::COMPLETE {
            // A cold reset ends every session of the target (RFC 7143 11.5.1).
            if let Some(tg) = target {
                for s in self.shared.all_sessions() {
                    if s.target.as_ref().is_some_and(|x| Arc::ptr_eq(x, &tg)) {
                        s.broadcast(|| ConnEvent::Close("target cold reset"));
                    }
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Largest read copied on the connection's task when the page cache holds it.
const INLINE_READ_MAX: u32 = 128 * 1024;
/// Smallest read whose data the store lends rather than copies: below it the copy costs
/// less than the lock held until the bytes are sent.
const LEND_MIN: u32 = 32 * 1024;

/// A command ready to run, with what it needs to answer.
struct Job {
    task: Task,
    target: Arc<TargetNode>,
    nexus: scsi::Nexus,
    out: mpsc::UnboundedSender<Out>,
    max_seg: u32,
    max_burst: u32,
    /// Large reads may send the store's bytes without a copy (see `LogicalUnit::try_read_lent`).
    lend: bool,
}

impl Job {
    /// Whether the answer may send the store's lent bytes.
    fn may_lend(&self) -> bool {
        let t = &self.task;
        self.lend
            && !t.cmd.write
            && t.sink.is_none()
            && t.cmd.edtl >= LEND_MIN
            && t.lun
                .and_then(|l| self.target.luns.get(&l))
                .is_some_and(|lu| lu.can_lend())
    }

    /// The answer to a read that needs no wait for a device, or `None`: use [`Job::run`]
    /// on a thread that may block.
    fn run_now(&self) -> Option<Vec<Pdu>> {
        let t = &self.task;
        if t.cmd.write || t.sink.is_some() {
            return None;
        }
        let lu = self.target.luns.get(&t.lun?)?;
        let cmd = scsi::Command {
            cdb: &t.cmd.cdb,
            data_out: &[],
            nexus: self.nexus,
        };
        if self.may_lend() {
            if let Some(lent) = lu.try_read_lent(&cmd, u64::MAX, false) {
                return Some(self.respond_lent(lent));
            }
        }
        // A large read copied inline would hold up this connection's other commands; on a
        // worker the copy overlaps with the sending of the previous ones.
        if t.cmd.edtl > INLINE_READ_MAX {
            return None;
        }
        let resp = lu.try_read_now(&cmd, INLINE_READ_MAX.into())?;
        Some(self.respond(resp, None))
    }

    /// The Data-In PDUs and status that carry `resp` back on this connection.
    fn respond(&self, resp: scsi::Response, spdtl_out: Option<u32>) -> Vec<Pdu> {
        self.answer(Answer::from(resp), spdtl_out)
    }

    /// A GOOD read whose Data-In PDUs send the store's lent bytes: its blocks stay locked
    /// against writes until the writer has handed the last of them to the socket.
    fn respond_lent(&self, lent: scsi::LentRead) -> Vec<Pdu> {
        let answer = Answer {
            status: scsi::status::GOOD,
            sense: None,
            data: Bytes::from_owner(lent),
        };
        self.answer(answer, None)
    }

    fn answer(&self, answer: Answer, spdtl_out: Option<u32>) -> Vec<Pdu> {
        build_response(
            &self.task.cmd,
            answer,
            spdtl_out,
            self.task.next_r2tsn,
            self.max_seg.max(512),
            self.max_burst.max(512),
        )
    }

    fn run(&self) -> Vec<Pdu> {
        let t = &self.task;
        let cdb = &t.cmd.cdb[..];
        let edtl = t.cmd.edtl;
        let lu = t.lun.and_then(|l| self.target.luns.get(&l));
        if let Some(lu) = lu.filter(|_| self.may_lend()) {
            let cmd = scsi::Command {
                cdb,
                data_out: &[],
                nexus: self.nexus,
            };
            if let Some(lent) = lu.try_read_lent(&cmd, u64::MAX, true) {
                return self.respond_lent(lent);
            }
        }
        // Residuals for data the initiator sends are judged against what the CDB asks for.
        let spdtl_out = match lu {
            Some(lu) if t.cmd.write => LogicalUnit::data_out_len(cdb, lu.config().block_size),
            _ => None,
        };
        let resp = if let Some(r) = &t.sink {
            r.clone()
        } else if let Some(lu) = lu {
            let run = |data_out: &[u8]| {
                lu.execute(&scsi::Command {
                    cdb,
                    data_out,
                    nexus: self.nexus,
                })
            };
            // FCP-4 / SAM: when EDTL and the CDB disagree, the command is processed
            // normally except that no data beyond EDTL is transferred.
            match spdtl_out {
                Some(n) if n < edtl => run(&t.buf[..n as usize]),
                Some(n) if n > edtl => match self.fill_from_medium(lu, cdb, n) {
                    Some(mut full) => {
                        full[..t.buf.len()].copy_from_slice(&t.buf);
                        run(&full)
                    }
                    None => scsi::Response::check_condition(
                        &scsi::sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
                    ),
                },
                _ => run(&t.buf),
            }
        } else if cdb.first() == Some(&0xa0) {
            scsi::report_luns(&self.target.lun_ids(), cdb)
        } else {
            scsi::lun_not_supported(cdb)
        };
        let resp = match (lu, cdb.first()) {
            // REPORT LUNS is answered for the target whatever LUN it is addressed to.
            (Some(_), Some(0xa0)) if resp.status == scsi::status::GOOD || resp.sense.is_some() => {
                scsi::report_luns(&self.target.lun_ids(), cdb)
            }
            _ => resp,
        };
        self.respond(resp, spdtl_out)
    }

    /// For a write whose CDB covers more than the initiator sent: the blocks as they are on
    /// the medium, so that writing them back with the sent bytes in front changes only
    /// what was sent.
    fn fill_from_medium(&self, lu: &LogicalUnit, cdb: &[u8], len: u32) -> Option<Vec<u8>> {
        let lba = write_lba(cdb)?;
        let bs = lu.config().block_size;
        let blocks = len / bs;
        let mut read16 = [0u8; 16];
        read16[0] = 0x88;
        read16[2..10].copy_from_slice(&lba.to_be_bytes());
        read16[10..14].copy_from_slice(&blocks.to_be_bytes());
        let r = lu.execute(&scsi::Command {
            cdb: &read16,
            data_out: &[],
            nexus: self.nexus,
        });
        (r.status == scsi::status::GOOD && r.data_in.len() == len as usize).then_some(r.data_in)
    }
}

/// The LBA of the plain write commands (WRITE and WRITE AND VERIFY 6/10/12/16).
fn write_lba(cdb: &[u8]) -> Option<u64> {
    let be = |r: std::ops::Range<usize>| {
        cdb.get(r)
            .map(|b| b.iter().fold(0u64, |a, &x| (a << 8) | x as u64))
    };
    match *cdb.first()? {
        0x0a => be(1..4).map(|v| v & 0x1f_ffff),
        0x2a | 0x2e | 0xaa | 0xae => be(2..6),
        0x8a | 0x8e => be(2..10),
        _ => None,
    }
}

/// What a finished command sends back: its status, sense data, and Data-In bytes (copied
/// into a pooled buffer, or lent by the store).
struct Answer {
    status: u8,
    sense: Option<Vec<u8>>,
    data: Bytes,
}

impl From<scsi::Response> for Answer {
    fn from(r: scsi::Response) -> Self {
        Self {
            status: r.status,
            sense: r.sense,
            // Back to the pool when the writer has sent the last PDU that refers to it.
            data: if r.data_in.is_empty() {
                Bytes::new()
            } else {
                Bytes::from_owner(Buf::from_vec(r.data_in))
            },
        }
    }
}

/// The Data-In PDUs and the status for a finished command (RFC 7143 11.4, 11.7).
fn build_response(
    cmd: &ScsiCommand,
    resp: impl Into<Answer>,
    spdtl_out: Option<u32>,
    r2t_count: u32,
    max_seg: u32,
    max_burst: u32,
) -> Vec<Pdu> {
    let resp: Answer = resp.into();
    let edtl = cmd.edtl;
    let produced = resp.data.len() as u32;
    let sent = if cmd.read { produced.min(edtl) } else { 0 };
    let (overflow, underflow, residual) = if cmd.write && !cmd.read {
        match spdtl_out {
            Some(n) if n > edtl => (true, false, n - edtl),
            Some(n) if n < edtl => (false, true, edtl - n),
            _ => (false, false, 0),
        }
    } else if produced > edtl || (!cmd.read && produced > 0) {
        (true, false, produced - sent)
    } else if produced < edtl {
        (false, true, edtl - produced)
    } else {
        (false, false, 0)
    };
    let mut pdus = Vec::new();
    let good = resp.status == scsi::status::GOOD && resp.sense.is_none();
    if sent > 0 {
        let data = resp.data;
        for seg in ffp::data_in(sent, max_seg, max_burst) {
            let (off, n) = (seg.offset, seg.len);
            let with_status = off + n == sent && good;
            pdus.push(Pdu::DataIn(DataIn {
                final_: seg.final_,
                status_present: with_status,
                status: if with_status { resp.status } else { 0 },
                overflow: with_status && overflow,
                underflow: with_status && underflow,
                residual_count: if with_status { residual } else { 0 },
                lun: cmd.lun,
                itt: cmd.itt,
                datasn: seg.datasn,
                buffer_offset: off,
                data: data.slice(off as usize..(off + n) as usize),
                ..Default::default()
            }));
        }
        if good {
            return pdus;
        }
    }
    let data_in_count = pdus.len() as u32;
    let base = match &resp.sense {
        Some(s) => ScsiResponse::with_sense(s),
        None => ScsiResponse::default(),
    };
    pdus.push(Pdu::ScsiResponse(ScsiResponse {
        status: resp.status,
        overflow,
        underflow,
        residual_count: residual,
        itt: cmd.itt,
        expdatasn: if cmd.read { data_in_count } else { r2t_count },
        ..base
    }));
    pdus
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_cmd(edtl: u32) -> ScsiCommand {
        ScsiCommand {
            read: true,
            edtl,
            itt: 7,
            ..Default::default()
        }
    }

    #[test]
    fn read_is_split_by_segment_and_burst_with_status_in_last_pdu() {
        let pdus = build_response(
            &read_cmd(10_000),
            scsi::Response::good(vec![1; 10_000]),
            None,
            0,
            4096,
            8192,
        );
        let dis: Vec<&DataIn> = pdus
            .iter()
            .map(|p| match p {
                Pdu::DataIn(d) => d,
                _ => panic!("only Data-In expected"),
            })
            .collect();
        let lens: Vec<usize> = dis.iter().map(|d| d.data.len()).collect();
        assert_eq!(lens, vec![4096, 4096, 1808]);
        assert_eq!(
            dis.iter().map(|d| d.final_).collect::<Vec<_>>(),
            vec![false, true, true]
        );
        assert_eq!(
            dis.iter().map(|d| d.datasn).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(dis[2].buffer_offset, 8192);
        assert!(dis[2].status_present && !dis[1].status_present);
        assert!(!dis[2].overflow && !dis[2].underflow);
    }

    #[test]
    fn read_residuals() {
        // Less data than expected: underflow.
        let pdus = build_response(
            &read_cmd(10_000),
            scsi::Response::good(vec![0; 512]),
            None,
            0,
            8192,
            1 << 20,
        );
        let Pdu::DataIn(d) = &pdus[0] else { panic!() };
        assert!(d.underflow && d.residual_count == 10_000 - 512);
        // More than expected: only EDTL bytes go out, overflow.
        let pdus = build_response(
            &read_cmd(200),
            scsi::Response::good(vec![0; 512]),
            None,
            0,
            8192,
            1 << 20,
        );
        let Pdu::DataIn(d) = &pdus[0] else { panic!() };
        assert_eq!(d.data.len(), 200);
        assert!(d.overflow && d.residual_count == 312);
        // EDTL 0: no Data-In at all, a SCSI Response with overflow.
        let pdus = build_response(
            &read_cmd(0),
            scsi::Response::good(vec![0; 512]),
            None,
            0,
            8192,
            1 << 20,
        );
        assert_eq!(pdus.len(), 1);
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert!(r.overflow && r.residual_count == 512);
    }

    #[test]
    fn check_condition_goes_in_a_scsi_response_with_sense() {
        let sense = Sense::invalid_field_in_cdb(2, None);
        let pdus = build_response(
            &read_cmd(512),
            scsi::Response::check_condition(&sense),
            None,
            0,
            8192,
            1 << 20,
        );
        assert_eq!(pdus.len(), 1);
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert_eq!(r.status, 2);
        assert_eq!(r.sense().unwrap()[2] & 0x0f, 5);
        assert!(r.underflow && r.residual_count == 512);
    }

    #[test]
    fn write_residuals_follow_the_cdb() {
        let cmd = ScsiCommand {
            write: true,
            edtl: 1024,
            ..Default::default()
        };
        let pdus = build_response(
            &cmd,
            scsi::Response::good(vec![]),
            Some(512),
            1,
            8192,
            1 << 20,
        );
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert!(r.underflow && r.residual_count == 512 && r.expdatasn == 1);
        let pdus = build_response(
            &cmd,
            scsi::Response::good(vec![]),
            Some(4096),
            1,
            8192,
            1 << 20,
        );
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert!(r.overflow && r.residual_count == 3072);
    }
}
