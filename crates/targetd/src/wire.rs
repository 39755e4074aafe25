//! The only module of the target that touches a connection's transport: the login's PDU
//! exchange, socket tuning and pacing, the reader's socket reads, and the writer task
//! that stamps sequence numbers and sends PDUs in vectored batches (lending stores' pages
//! where it may).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use bytes::BytesMut;
use iscsi::framing::PduDecoder;
use iscsi::login::LoginOutcome;
use iscsi::negotiate::TargetPacing;
use iscsi::pdu::{Digests, Pdu, BHS_LEN, RESERVED_TAG};
use net::transport::{ReadHalf, Stream, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::session::{self, Session};
use crate::shared::Shared;
use crate::task::unlend;

/// Tunes a new connection's socket as configured; see [`socket_tuning`].
pub(crate) fn tune(shared: &Shared, socket: Option<BorrowedFd<'_>>, peer: SocketAddr) {
    let Some(fd) = socket else {
        return;
    };
    let tuning = socket_tuning(&shared.config.session, fd, peer);
    let applied = net::apply(fd, &tuning);
    for w in &applied.warnings {
        warn!("{peer}: socket tuning: {w}");
    }
}

/// A portal's TLS as accepting connections uses it.
pub(crate) struct PortalTls {
    pub(crate) tls: net::tls::ServerTls,
    /// Plaintext logins refused (else served beside TLS ones).
    pub(crate) require: bool,
}

/// The first byte of a TLS handshake record; an iSCSI Login Request starts with 0x03 or
/// 0x43 (opcode with the immediate bit).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The text key a refusal for want of TLS carries in its Login Response, so that an
/// initiator of ours can say so (others see the status: authentication failure).
pub const TLS_REQUIRED_KEY: &str = "X-org.reservoir.TLS=Required";

/// What a new connection sent first, peeked (not taken): up to a BHS's worth, and how
/// many bytes of it there are. `None`: the connection is over (logged).
pub(crate) async fn first_bytes(
    shared: &Shared,
    tcp: &TcpStream,
    peer: SocketAddr,
) -> Option<([u8; BHS_LEN], usize)> {
    let limit = Duration::from_secs(shared.config.session.login_timeout.max(1));
    let mut first = [0u8; BHS_LEN];
    match tokio::time::timeout(limit, tcp.peek(&mut first)).await {
        Ok(Ok(0)) => None,
        Ok(Ok(n)) => Some((first, n)),
        Ok(Err(e)) => {
            debug!("{peer}: {e}");
            None
        }
        Err(_) => {
            let local = tcp
                .local_addr()
                .map_or_else(|_| "?".to_owned(), |a| a.to_string());
            info!("{peer}: portal {local}: nothing sent within {limit:?}; closed");
            None
        }
    }
}

/// The TSIH a plaintext Login Request names in its first bytes (`first_bytes`): the
/// session a new connection joins, when not 0.
pub(crate) fn login_tsih(first: &[u8]) -> Option<u16> {
    const LOGIN_REQUEST: u8 = 0x03;
    let tsih = u16::from_be_bytes([*first.get(14)?, *first.get(15)?]);
    (first[0] & 0x3f == LOGIN_REQUEST && tsih != 0).then_some(tsih)
}

/// Turns an accepted socket, whose first byte `first` is (`first_bytes`), into the
/// connection's stream: a TLS handshake on a TLS portal, plain TCP otherwise. Which one
/// the peer speaks is told by its first byte, so that each mismatch ends with a line that
/// names it, here and, where the peer is ours, in the initiator's error. `None`: the
/// connection is over (logged).
pub(crate) async fn accept(
    shared: &Shared,
    tcp: TcpStream,
    first: u8,
    peer: SocketAddr,
    portal: Option<&PortalTls>,
) -> Option<Stream> {
    let local = tcp
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let limit = Duration::from_secs(shared.config.session.login_timeout.max(1));
    let hello = first == TLS_HANDSHAKE_RECORD;
    match (portal, hello) {
        (Some(p), true) => match tokio::time::timeout(limit, Stream::tls_accept(tcp, &p.tls)).await
        {
            Ok(Ok(s)) => {
                debug!(
                    "{peer}: portal {local}: {}",
                    s.tls_summary().unwrap_or_default()
                );
                Some(s)
            }
            Ok(Err(e)) => {
                warn!("{peer}: TLS handshake on portal {local} failed: {e}");
                None
            }
            Err(_) => {
                warn!("{peer}: TLS handshake on portal {local} not finished within {limit:?}");
                None
            }
        },
        (Some(p), false) if p.require => {
            refuse_plaintext(shared, tcp, peer, &local, limit).await;
            None
        }
        (None, true) => {
            warn!(
                "{peer}: a TLS handshake on portal {local}, which is plaintext: closed (the \
                 initiator asked for TLS; give this portal tls, or connect without it)"
            );
            None
        }
        _ => Some(Stream::from(tcp)),
    }
}

/// Answers a plaintext login on a portal that requires TLS: Login Response status 0x0201
/// (authentication failure) with [`TLS_REQUIRED_KEY`], then closes.
async fn refuse_plaintext(
    shared: &Shared,
    tcp: TcpStream,
    peer: SocketAddr,
    local: &str,
    limit: Duration,
) {
    let mut stream = Stream::from(tcp);
    let mut dec = PduDecoder::new(iscsi::framing::FrameLimits::default());
    let mut buf = BytesMut::with_capacity(1024);
    let first = tokio::time::timeout(limit, read_pdu(&mut stream, &mut dec, &mut buf)).await;
    let Ok(Ok(Some(Pdu::LoginRequest(req)))) = first else {
        warn!("{peer}: plaintext (not TLS) on portal {local}, which requires TLS: closed");
        return;
    };
    let mut data = TLS_REQUIRED_KEY.as_bytes().to_vec();
    data.push(0);
    let (class, detail) = iscsi::login::status::AUTHENTICATION_FAILURE;
    let resp = Pdu::LoginResponse(iscsi::pdu::LoginResponse {
        isid: req.isid,
        tsih: req.tsih,
        itt: req.itt,
        statsn: req.expstatsn,
        expcmdsn: req.cmdsn,
        maxcmdsn: req.cmdsn,
        status_class: class,
        status_detail: detail,
        data: bytes::Bytes::from(data),
        ..Default::default()
    });
    let _ = send_now(&mut stream, &resp).await;
    let _ = stream.shutdown().await;
    shared.events.login_refused(crate::stats::Refusal::Tls);
    warn!(
        "{peer}: plaintext login on portal {local} refused (status 0x{class:02x}{detail:02x}): \
         this portal requires TLS"
    );
}

/// A duplicate of the descriptor of the TCP socket under `stream`, from which status
/// snapshots read TCP_INFO (`session::ConnInfo::tcp_info`) while the connection runs;
/// the connection closes it as it ends (`session::ConnInfo::release_socket`). `None`
/// without a TCP socket (an in-memory carrier), or when no descriptor is free: the
/// connection then shows no path, and runs as before.
pub(crate) fn socket_for_status(stream: &Stream, peer: SocketAddr) -> Option<OwnedFd> {
    match stream.socket()?.try_clone_to_owned() {
        Ok(fd) => Some(fd),
        Err(e) => {
            debug!("{peer}: no descriptor for status snapshots: {e}");
            None
        }
    }
}

/// The receiving side in full feature phase.
pub(crate) struct Reader(ReadHalf);

impl Reader {
    pub(crate) fn new(rd: ReadHalf) -> Reader {
        Reader(rd)
    }

    /// Reads what has arrived into `buf`'s spare capacity; 0 when the peer closed.
    /// Cancel-safe: nothing is lost when another branch of a `select!` wins.
    pub(crate) async fn fill(&mut self, buf: &mut impl bytes::BufMut) -> std::io::Result<usize> {
        self.0.read_buf(buf).await
    }

    /// Reads what has arrived, up to `dst.len()` bytes, into `dst`; 0 when the peer closed.
    /// Cancel-safe as [`Reader::fill`].
    pub(crate) async fn read_into(&mut self, dst: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(dst).await
    }
}

/// The configured socket options, with buffers auto-tuned where unset: the handshake's
/// RTT tells how much a long path keeps in flight, and where the kernel's autotuning
/// ceiling is lower, the buffers are set explicitly (see `net::buffers_for_rtt`).
fn socket_tuning(
    s: &crate::config::SessionDefaults,
    stream: BorrowedFd<'_>,
    peer: SocketAddr,
) -> net::SocketTuning {
    let mut t = net::SocketTuning {
        send_buffer: s.send_buffer,
        recv_buffer: s.recv_buffer,
        // Loss must not cost a long fat pipe its rate: the process's default (rsv where
        // it loads, decided at start, else BBR, else CUBIC) unless configured otherwise.
        congestion: s
            .congestion
            .clone()
            .or_else(|| match net::default_congestion_decided() {
                Some(c) => c.name.clone(),
                None => net::preferred_congestion(),
            }),
        pacing_rate: s.pacing_rate,
        start_rate: None,
        probe_rate: None,
        rsv_group: None,
        notsent_lowat: s.notsent_lowat,
        nodelay: true,
    };
    if !s.auto_tune || (t.send_buffer.is_some() && t.recv_buffer.is_some()) {
        return t;
    }
    let Ok(info) = net::tcp_info(stream) else {
        return t;
    };
    let rtt = std::time::Duration::from_micros(u64::from(info.rtt_us));
    let (snd, rcv) = net::buffers_for_rtt(rtt, &net::KernelLimits::read());
    if t.send_buffer.is_none() && snd.bytes.is_some() {
        debug!("{peer}: RTT {rtt:?}: send buffer {}", snd.why);
        t.send_buffer = snd.bytes;
        // A large explicit buffer must not become a deep queue of unsent Data-In.
        t.notsent_lowat = t.notsent_lowat.or(Some(1 << 20));
    }
    if t.recv_buffer.is_none() && rcv.bytes.is_some() {
        debug!("{peer}: RTT {rtt:?}: receive buffer {}", rcv.why);
        t.recv_buffer = rcv.bytes;
    }
    t
}

pub(crate) async fn read_pdu(
    stream: &mut Stream,
    dec: &mut PduDecoder,
    buf: &mut BytesMut,
) -> anyhow::Result<Option<Pdu>> {
    loop {
        match dec.decode(buf) {
            Ok(Some(p)) => return Ok(Some(p)),
            Ok(None) => {}
            Err(e) => return Err(anyhow!("during login: {e}")),
        }
        buf.reserve(16 * 1024);
        if stream.read_buf(buf).await? == 0 {
            return Ok(None);
        }
    }
}

pub(crate) async fn send_now(stream: &mut Stream, pdu: &Pdu) -> anyhow::Result<()> {
    let mut out = Vec::with_capacity(BHS_LEN + pdu.data().len() + 8);
    pdu.encode(&mut out, Digests::default());
    stream.write_all(&out).await?;
    Ok(())
}

/// Paces the connection's sends at the rate its login promised the initiator
/// (`X-org.reservoir.PacingRate`; a configured `pacing_rate` is in force since accept),
/// or starts them at the rate it said it applies (`X-org.reservoir.StartRate`). On `rsv`,
/// the connection joins its session's group, so that the session's connections take
/// turns at PROBE_RTT.
pub(crate) fn apply_pacing(
    stream: &Stream,
    outcome: &LoginOutcome,
    shared: &Shared,
    peer: SocketAddr,
    session: &Session,
    cid: u16,
) {
    let Some(fd) = stream.socket() else {
        return;
    };
    let tsih = session.tsih;
    net::group_rsv(fd, rsv_group(session));
    match outcome.pacing {
        TargetPacing::Paced(rate) if Some(rate) != shared.config.session.pacing_rate => {
            if let Err(e) = net::set_pacing_rate(fd, rate) {
                warn!("{peer}: session {tsih} cid {cid}: SO_MAX_PACING_RATE {rate}: {e}");
                return;
            }
            info!(
                "{peer}: session {tsih} cid {cid}: sends paced at {:.1} Mbit/s as the initiator \
                 asked (SO_MAX_PACING_RATE {})",
                rate as f64 * 8e-6,
                net::max_pacing_rate(fd).map_or_else(|e| e.to_string(), |r| r.to_string())
            );
        }
        TargetPacing::Paced(rate) => debug!(
            "{peer}: session {tsih} cid {cid}: the initiator's pacing hint answered with the \
             configured {rate} bytes/s"
        ),
        TargetPacing::NotPaced => debug!(
            "{peer}: session {tsih} cid {cid}: pacing hint ignored (accept_pacing_hint = false)"
        ),
        TargetPacing::Refused => {
            debug!("{peer}: session {tsih} cid {cid}: malformed pacing hint rejected")
        }
        TargetPacing::NotAsked | TargetPacing::NotUnderstood => {}
    }
    if let Some(rate) = outcome.start_rate {
        // With a probe rate the initiator knows no rate for the path: the first round of
        // Data-In goes at the probe rate and its ACKs give the start (the probed start).
        let started = match outcome.probe_rate {
            Some(probe) => net::start_rsv_probed(fd, rate, probe),
            None => net::start_rsv_at(fd, rate),
        };
        if started {
            match outcome.probe_rate {
                Some(probe) => info!(
                    "{peer}: session {tsih} cid {cid}: sends start from the rate their first \
                     round's ACKs show, that round ({:.1} Mbit/s x RTT) sent at {:.1} Mbit/s, \
                     as the initiator knows no rate for the path",
                    rate as f64 * 8e-6,
                    probe as f64 * 8e-6
                ),
                None => info!(
                    "{peer}: session {tsih} cid {cid}: sends start at {:.1} Mbit/s as the \
                     initiator remembers the path",
                    rate as f64 * 8e-6
                ),
            }
        } else {
            debug!(
                "{peer}: session {tsih} cid {cid}: start hint {rate} bytes/s unused (the \
                 connection does not run rsv)"
            );
        }
    }
}

/// The session's group for `rsv`: the same for each of its connections (ISID, TSIH and
/// initiator name), another for every other session and process.
pub(crate) fn rsv_group(session: &Session) -> u32 {
    let mut key = Vec::with_capacity(8 + session.initiator.len());
    key.extend_from_slice(&session.isid);
    key.extend_from_slice(&session.tsih.to_be_bytes());
    key.extend_from_slice(session.initiator.as_bytes());
    net::cc::group_for(&key)
}

pub(crate) enum Out {
    Pdu(Pdu),
    /// Pace the connection's sends at most at this many bytes per second from now on
    /// (`u64::MAX`: not at all).
    Pace(u64),
    Close,
}

/// Assigns the sequence numbers at send time.
fn stamp(p: &mut Pdu, statsn: &mut u32, (exp, max): (u32, u32)) {
    let mut next = || {
        let s = *statsn;
        *statsn = statsn.wrapping_add(1);
        s
    };
    match p {
        Pdu::ScsiResponse(r) => (r.statsn, r.expcmdsn, r.maxcmdsn) = (next(), exp, max),
        Pdu::DataIn(d) => {
            if d.status_present {
                d.statsn = next();
            }
            (d.expcmdsn, d.maxcmdsn) = (exp, max);
        }
        Pdu::R2t(r) => (r.statsn, r.expcmdsn, r.maxcmdsn) = (*statsn, exp, max),
        Pdu::NopIn(n) => {
            n.statsn = if n.itt != RESERVED_TAG {
                next()
            } else {
                *statsn
            };
            (n.expcmdsn, n.maxcmdsn) = (exp, max);
        }
        Pdu::TextResponse(r) => (r.statsn, r.expcmdsn, r.maxcmdsn) = (next(), exp, max),
        Pdu::LogoutResponse(r) => (r.statsn, r.expcmdsn, r.maxcmdsn) = (next(), exp, max),
        Pdu::TaskMgmtResponse(r) => (r.statsn, r.expcmdsn, r.maxcmdsn) = (next(), exp, max),
        Pdu::Reject(r) => (r.statsn, r.expcmdsn, r.maxcmdsn) = (next(), exp, max),
        Pdu::AsyncMessage(m) => (m.statsn, m.expcmdsn, m.maxcmdsn) = (next(), exp, max),
        _ => {}
    }
}

/// Most PDUs gathered into one `writev`; bounds the iovec count and the memory pinned.
const BATCH_PDUS: usize = 128;
const BATCH_BYTES: usize = 4 << 20;
/// Longest the socket may keep Data-In that the store lent (see `Job::respond_lent`)
/// waiting: then what is still unsent is copied and its blocks let go, so that a peer that
/// stops reading holds up no write to them, from any session, for longer.
pub(crate) const LENT_HOLD: Duration = Duration::from_secs(1);

pub(crate) async fn writer(
    mut wr: WriteHalf,
    mut rx: mpsc::UnboundedReceiver<Out>,
    session: Arc<Session>,
    digests: Digests,
    mut statsn: u32,
    info: Arc<session::ConnInfo>,
) -> std::io::Result<()> {
    let cid = info.cid;
    let erl2 = session.erl2();
    // As `Job::may_lend`: Data-In may hold a file's mapped bytes without data digests and
    // TLS (where the kernel alone reads it), and a memory store's bytes on any carrier.
    // Only a writer with neither can be sure it holds nothing lent; asked per batch, as
    // a configuration reload may add a memory store's LUN to the session.
    let lends_mapping = !digests.data && !wr.copies_in_user_space();
    let mut batch: Vec<Pdu> = Vec::with_capacity(BATCH_PDUS);
    // Headers (with their digests) of the whole batch, back to back, and per PDU the
    // header's range and the trailer (padding + data digest) that follows its payload.
    let mut headers: Vec<u8> = Vec::with_capacity(BATCH_PDUS * (BHS_LEN + 4));
    let mut layout: Vec<Layout> = Vec::with_capacity(BATCH_PDUS);
    // PDUs taken off the channel early, to copy their lent payloads; they go first.
    let mut backlog: VecDeque<Out> = VecDeque::new();
    // ERL 2: (ITT, StatSN) of the statuses in the batch, told to the session at once.
    let mut stamps: Vec<(u32, u32)> = Vec::new();
    loop {
        let first = match backlog.pop_front() {
            Some(o) => o,
            None => match rx.recv().await {
                Some(o) => o,
                None => break,
            },
        };
        let mut close = false;
        let mut bytes = 0usize;
        let mut next = Some(first);
        while let Some(o) = next.take() {
            match o {
                Out::Pdu(p) => {
                    bytes += p.data().len();
                    batch.push(p);
                }
                Out::Pace(rate) => {
                    if let Some(fd) = wr.socket() {
                        if let Err(e) = net::set_pacing_rate(fd, rate) {
                            warn!("cid {cid}: SO_MAX_PACING_RATE {rate}: {e}");
                        }
                    }
                }
                Out::Close => {
                    close = true;
                    break;
                }
            }
            if batch.len() < BATCH_PDUS && bytes < BATCH_BYTES {
                next = backlog.pop_front().or_else(|| rx.try_recv().ok());
            }
        }
        headers.clear();
        layout.clear();
        let window = session.window();
        for p in &mut batch {
            stamp(p, &mut statsn, window);
            if erl2 {
                if let Some(stamp) = session::status_of(p) {
                    stamps.push(stamp);
                }
            }
            let start = headers.len();
            p.encode_header(&mut headers, digests);
            let (trailer, n) = if p.data().is_empty() {
                ([0; 7], 0)
            } else {
                Pdu::data_trailer(p.data(), digests)
            };
            layout.push((start..headers.len(), trailer, n));
        }
        if !stamps.is_empty() {
            // Before the batch goes out: no acknowledgement can come ahead of it.
            session.stamped(cid, &stamps);
            stamps.clear();
        }
        let mut written = 0usize;
        // TLS: the batch as owned pieces, whose records the carrier may seal on other
        // threads while the socket takes the ones before (`net::sealing`).
        let shared = wr.seals_elsewhere();
        let lends = lends_mapping || session.lends_memory();
        let sent = if shared {
            let pieces = batch_pieces(&batch, &headers, &layout);
            let taken = try_write_shared_now(&mut wr, &pieces, &mut written)?;
            if taken || !lends {
                write_all_shared(&mut wr, &pieces, &mut written).await?;
                true
            } else {
                let w = write_all_shared(&mut wr, &pieces, &mut written);
                match tokio::time::timeout(LENT_HOLD, w).await {
                    Ok(r) => r.map(|()| true)?,
                    Err(_elapsed) => false,
                }
            }
        } else {
            let mut slices = batch_slices(&batch, &headers, &layout);
            let mut rest = &mut slices[..];
            // Most batches fit the socket now: no timer for them.
            let taken = try_write_now(&mut wr, &mut rest, &mut written)?;
            if taken || !lends {
                write_all_vectored(&mut wr, rest, &mut written).await?;
                true
            } else {
                let w = write_all_vectored(&mut wr, rest, &mut written);
                match tokio::time::timeout(LENT_HOLD, w).await {
                    Ok(r) => r.map(|()| true)?,
                    Err(_elapsed) => false,
                }
            }
        };
        if !sent {
            // The peer is slow to take data: copy what is unsent, here and queued.
            let mut end = 0;
            for (p, (range, _, n)) in batch.iter_mut().zip(&layout) {
                end += range.len() + p.data().len() + n;
                if end > written {
                    unlend(p)?;
                }
            }
            while let Ok(o) = rx.try_recv() {
                backlog.push_back(o);
            }
            for o in &mut backlog {
                if let Out::Pdu(p) = o {
                    unlend(p)?;
                }
            }
            debug!("cid {cid}: the peer is slow to read; lent Data-In copied after {LENT_HOLD:?}");
            if shared {
                let pieces = batch_pieces(&batch, &headers, &layout);
                write_all_shared(&mut wr, &pieces, &mut written).await?;
            } else {
                let mut slices = batch_slices(&batch, &headers, &layout);
                let mut rest = &mut slices[..];
                std::io::IoSlice::advance_slices(&mut rest, written);
                write_all_vectored(&mut wr, rest, &mut written).await?;
            }
        }
        // TLS may hold the batch's last records until flushed; TCP's flush is free.
        wr.flush().await?;
        info.sent(written);
        batch.clear();
        if close {
            let _ = wr.shutdown().await;
            return Ok(());
        }
    }
    Ok(())
}

/// Per PDU of a batch: its header's range in the headers buffer, and the trailer
/// (padding + data digest) that follows its payload, with its length.
type Layout = (std::ops::Range<usize>, [u8; 7], usize);

/// The iovecs of a batch: each PDU's header, payload and trailer, in order.
fn batch_slices<'a>(
    batch: &'a [Pdu],
    headers: &'a [u8],
    layout: &'a [Layout],
) -> Vec<std::io::IoSlice<'a>> {
    let mut slices = Vec::with_capacity(batch.len() * 3);
    for (p, (range, trailer, n)) in batch.iter().zip(layout) {
        slices.push(std::io::IoSlice::new(&headers[range.clone()]));
        if !p.data().is_empty() {
            slices.push(std::io::IoSlice::new(p.data()));
            if *n > 0 {
                slices.push(std::io::IoSlice::new(&trailer[..*n]));
            }
        }
    }
    slices
}

/// The batch as owned pieces, in the order of [`batch_slices`]: the headers copied once
/// into one buffer, payloads shared (a store's lent bytes stay lent until sealed).
fn batch_pieces(batch: &[Pdu], headers: &[u8], layout: &[Layout]) -> Vec<bytes::Bytes> {
    let headers = bytes::Bytes::copy_from_slice(headers);
    let mut pieces = Vec::with_capacity(batch.len() * 3);
    for (p, (range, trailer, n)) in batch.iter().zip(layout) {
        pieces.push(headers.slice(range.clone()));
        if !p.data().is_empty() {
            pieces.push(p.data().clone());
            if *n > 0 {
                pieces.push(bytes::Bytes::copy_from_slice(&trailer[..*n]));
            }
        }
    }
    pieces
}

/// `pieces` after their first `n` bytes.
fn pieces_after(pieces: &[bytes::Bytes], mut n: usize) -> Vec<bytes::Bytes> {
    let mut rest = Vec::with_capacity(pieces.len());
    for p in pieces {
        if n >= p.len() {
            n -= p.len();
        } else {
            rest.push(p.slice(n..));
            n = 0;
        }
    }
    rest
}

/// As [`try_write_now`], through [`WriteHalf::try_write_shared`]: writes `pieces` after
/// the `written` bytes already taken, without waiting; true when all were taken.
fn try_write_shared_now(
    wr: &mut WriteHalf,
    pieces: &[bytes::Bytes],
    written: &mut usize,
) -> std::io::Result<bool> {
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut rest = pieces_after(pieces, *written);
    while *written < total {
        match wr.try_write_shared(&rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n;
                rest = pieces_after(&rest, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// As [`write_all_vectored`], through [`WriteHalf::poll_write_shared`]: writes `pieces`
/// after the `written` bytes already taken, counting on in `written`.
async fn write_all_shared(
    wr: &mut WriteHalf,
    pieces: &[bytes::Bytes],
    written: &mut usize,
) -> std::io::Result<()> {
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut rest = pieces_after(pieces, *written);
    while *written < total {
        let n = std::future::poll_fn(|cx| wr.poll_write_shared(cx, &rest)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        *written += n;
        rest = pieces_after(&rest, n);
    }
    Ok(())
}

/// Writes what the socket takes without waiting; true when that was everything.
fn try_write_now(
    wr: &mut WriteHalf,
    slices: &mut &mut [std::io::IoSlice<'_>],
    written: &mut usize,
) -> std::io::Result<bool> {
    while !slices.is_empty() {
        match wr.try_write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                *written += n;
                std::io::IoSlice::advance_slices(slices, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `slices`, counting in `written` as it goes (so that a caller that stops
/// waiting knows how far it got).
async fn write_all_vectored(
    wr: &mut WriteHalf,
    mut slices: &mut [std::io::IoSlice<'_>],
    written: &mut usize,
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = wr.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        *written += n;
        std::io::IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi::pdu::{DataIn, NopIn, R2t, ScsiResponse};

    #[test]
    fn statsn_advances_only_for_responses() {
        let mut sn = 10;
        let mut r2t = Pdu::R2t(R2t::default());
        stamp(&mut r2t, &mut sn, (1, 2));
        let mut di = Pdu::DataIn(DataIn::default());
        stamp(&mut di, &mut sn, (1, 2));
        assert_eq!(sn, 10);
        let mut resp = Pdu::ScsiResponse(ScsiResponse::default());
        stamp(&mut resp, &mut sn, (1, 2));
        let Pdu::ScsiResponse(r) = resp else { panic!() };
        assert_eq!((r.statsn, r.expcmdsn, r.maxcmdsn, sn), (10, 1, 2, 11));
        let mut ping = Pdu::NopIn(NopIn::default());
        stamp(&mut ping, &mut sn, (1, 2));
        assert_eq!(sn, 11);
    }
}
