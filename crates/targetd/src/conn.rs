//! One connection: login (`crate::login`), then the full feature phase: the connection's
//! state, its run loop, and the dispatch of each PDU, in CmdSN order where it has one.
//!
//! The reader (this task) decodes PDUs, collects write data and decides what runs; a writer
//! task (`wire::writer`) owns the transport's write half and stamps StatSN, ExpCmdSN and
//! MaxCmdSN on every PDU as it goes out, so numbers are assigned in the order the initiator
//! sees them. SCSI commands execute on blocking workers and queue their own Data-In and
//! response PDUs. Every byte to or from the peer goes through `wire`.
//!
//! What each PDU asks for is done in the submodules, as `impl Conn` blocks on this state:
//! SCSI command intake and write data (`transfer`), running commands and building their
//! answers (`exec`), Text requests (`text`), task management and logout (`tmf`). They use
//! what this module defines; it uses nothing of theirs but `Conn`'s methods.

mod exec;
mod text;
mod tmf;
mod transfer;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use bytes::{BufMut, BytesMut};
use iscsi::framing::{FrameError, FrameLimits, PduDecoder};
use iscsi::negotiate::ConnectionParams;
use iscsi::pdu::{
    async_event, reject_reason, AsyncMessage, Digests, NopIn, NopOut, Pdu, Reject, BHS_LEN,
    RESERVED_TAG,
};
use iscsi::text::TextAccumulator;
use net::transport::Stream;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tracing::debug;

use crate::loglimit::peer_log;

use crate::login;
use crate::session::{self, ConnEvent, ConnHandle, Ordered, Session};
use crate::shared::Shared;
use crate::stats::Recovery;
use crate::tags::TagMap;
use crate::task::Task;
use crate::wire::{self, Out, Reader};

/// Serves a connection whose socket is tuned and whose TLS, if any, is set up.
pub(crate) async fn serve(shared: Arc<Shared>, stream: Stream, peer: SocketAddr) {
    match run(shared, stream, peer).await {
        Ok(why) => debug!("{peer}: connection closed: {why}"),
        Err(e) => peer_log!(info, "{peer}: connection closed: {e:#}"),
    }
}

async fn run(shared: Arc<Shared>, mut stream: Stream, peer: SocketAddr) -> anyhow::Result<String> {
    let local = stream.local_addr()?;
    let tls = stream.tls_summary();
    let mut dec = PduDecoder::new(FrameLimits::default());
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let login_timeout = Duration::from_secs(shared.config.session.login_timeout.max(1));
    let result = match tokio::time::timeout(
        login_timeout,
        login::login(
            &shared,
            &mut stream,
            &mut dec,
            &mut buf,
            peer,
            tls.is_some(),
        ),
    )
    .await
    {
        Err(_) => bail!("login not finished within {login_timeout:?}"),
        Ok(r) => r?,
    };
    let Some(login::LoginResult {
        outcome,
        session,
        cid,
        statsn,
    }) = result
    else {
        return Ok("login failed".into());
    };
    peer_log!(info,
        "{peer}: {} logged in to {} (session {}, cid {cid}, {} connection(s); digests h={} d={}, MRDSL {}/{}; {})",
        outcome.initiator_name,
        session.target_name().as_deref().unwrap_or("discovery"),
        session.tsih,
        session.connection_count() + 1,
        outcome.connection.header_digest,
        outcome.connection.data_digest,
        outcome.connection.max_recv_data_segment_length,
        outcome.connection.max_send_data_segment_length,
        tls.as_deref().unwrap_or("plain TCP"),
    );
    let digests = Digests {
        header: outcome.connection.header_digest,
        data: outcome.connection.data_digest,
    };
    dec.set_digests(digests);
    dec.set_max_recv_data_segment(outcome.connection.max_recv_data_segment_length);

    let socket = wire::socket_for_status(&stream, peer);
    let (rd, wr) = stream.into_split();

    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let info = Arc::new(
        session::ConnInfo::new(
            &session,
            cid,
            (local, peer),
            tls.clone(),
            outcome.connection.clone(),
        )
        .with_socket(socket),
    );
    // However this function ends (a panic too), the duplicate of the socket goes with it.
    let released = ReleaseSocket(info.clone());
    let handle = ConnHandle {
        events: ev_tx,
        info: info.clone(),
    };
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(wire::writer(
        wr,
        out_rx,
        session.clone(),
        digests,
        statsn,
        info.clone(),
    ));
    if session.erl2() && session.close_for_recovery(cid).await {
        // Connection reinstatement at ERL 2 is an implicit logout for recovery: the old
        // connection's tasks are handed over before this one may reassign them.
        shared.events.recovery(Recovery::ConnectionReinstated);
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
        tls: tls.is_some(),
        executing: Arc::new(Executing::default()),
        info,
        ping: None,
        closing: false,
        keep_tasks: true,
        acked: None,
    };
    let why = conn.serve(Reader::new(rd), dec, buf, &mut ev_rx).await;
    let recovering = session.erl2() && conn.keep_tasks && !session.is_closed();
    let last = if recovering {
        shared.events.recovery(Recovery::ConnectionRetired);
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
    // Reader and writer have let the socket go: the duplicate is its last descriptor.
    drop(released);
    why
}

/// Releases a connection's duplicate socket (`ConnInfo::release_socket`) when dropped.
struct ReleaseSocket(Arc<session::ConnInfo>);

impl Drop for ReleaseSocket {
    fn drop(&mut self) {
        self.0.release_socket();
    }
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
        shared.events.recovery(Recovery::SessionExpired);
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

/// A connection in full feature phase. Its reader task owns it; the methods that act on
/// it are spread over this module and its submodules, one job each.
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
    /// Over TLS: Data-In is encrypted in user space, so the store's pages are not lent.
    tls: bool,
    executing: Arc<Executing>,
    /// Its identity and byte counts, as status snapshots read them.
    info: Arc<session::ConnInfo>,
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
        rd: Reader,
        dec: PduDecoder,
        buf: BytesMut,
        events: &mut mpsc::UnboundedReceiver<ConnEvent>,
    ) -> anyhow::Result<String> {
        let mut placing = None;
        let why = self.serve_pdus(rd, dec, buf, events, &mut placing).await;
        // A segment cut off mid-way: its buffer goes back to its task.
        if let Some(p) = placing.take() {
            self.place_abandoned(p);
        }
        why
    }

    async fn serve_pdus(
        &mut self,
        mut rd: Reader,
        mut dec: PduDecoder,
        mut buf: BytesMut,
        events: &mut mpsc::UnboundedReceiver<ConnEvent>,
        placing: &mut Option<transfer::Placing>,
    ) -> anyhow::Result<String> {
        let nop_interval = self.shared.config.session.nop_interval;
        let nop_every = (nop_interval > 0).then(|| Duration::from_secs(nop_interval));
        let mut last_heard = Instant::now();
        // After a segment was read into its command's buffer, the next read takes only the
        // next header, so that the segment after it (the write's next Data-Out, typically)
        // can go straight to its place too rather than into `buf`.
        let header_only = BHS_LEN + if dec.digests().header { 4 } else { 0 };
        let mut read_limit = usize::MAX;
        loop {
            // Whatever is already buffered is handled before reading more.
            loop {
                if let Some(p) = placing.as_ref() {
                    if !p.is_full() {
                        break;
                    }
                    let p = placing.take().expect("just seen");
                    last_heard = Instant::now();
                    self.place_done(p);
                    read_limit = header_only;
                    continue;
                }
                // A large Data-Out segment goes from the socket straight into its command's
                // buffer (see `Conn::placeable`); a bad header is `decode`'s to report.
                if let Ok(Some(h)) = dec.peek_header(&buf) {
                    if let Some(d) = self.placeable(&h) {
                        let Ok(Pdu::DataOut(_)) = dec.take_header(&mut buf, &h) else {
                            bail!("Data-Out header decoded once, not twice");
                        };
                        *placing = Some(self.place_start(d, h.data_len, &mut buf));
                        continue;
                    }
                }
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
                        peer_log!(warn, "connection {}: rejecting PDU: {e}", self.cid);
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
            let limit = read_limit;
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
                    Some(ConnEvent::RequestLogout(within)) => self.send(AsyncMessage {
                        async_event: async_event::LOGOUT_REQUESTED,
                        parameter3: within,
                        ..Default::default()
                    }),
                    None => return Ok("session gone".into()),
                },
                n = async {
                    match placing.as_mut() {
                        Some(p) => rd.read_into(p.rest()).await,
                        None => rd.fill(&mut (&mut buf).limit(limit)).await,
                    }
                } => {
                    let n = n?;
                    if n == 0 {
                        return Ok("closed by the initiator".into());
                    }
                    self.info.received(n);
                    match placing.as_mut() {
                        Some(p) => p.filled(n),
                        None => read_limit = usize::MAX,
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
                peer_log!(
                    warn,
                    "connection {}: unexpected {:?}",
                    self.cid,
                    other.opcode()
                );
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
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
