//! One connection, and the only module of the initiator that touches its transport:
//! connect and tune, the login exchange on the raw stream, and after login the writer task
//! that owns the write half and the [`Reader`] through which the session's reader task
//! reads.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use bytes::BytesMut;
use iscsi::framing::{FrameLimits, PduDecoder};
use iscsi::login::{
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginOutcome, LoginResponseView,
};
use iscsi::negotiate::TargetPacing;
use iscsi::pdu::{Digests, Pdu};
use iscsi::serial::sn_gt;
use net::transport::{Dialer, ReadHalf, Stream, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch};

use crate::{Error, Result, SessionOptions};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);

/// A connection before full feature phase: PDUs are exchanged one at a time.
pub(crate) struct RawConn {
    pub portal: String,
    stream: Stream,
    buf: BytesMut,
    dec: PduDecoder,
    digests: Digests,
    pub exp_statsn: u32,
    pub tuning: net::Applied,
}

pub(crate) struct LoginDone {
    pub outcome: LoginOutcome,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
}

/// The receive buffer a connection is dialled with (see `net::first_window_buffer`): the
/// one asked for, or with auto-tuning autotuning's ceiling, so that a long path's first
/// window is not the kernel's 64 KB.
pub(crate) fn first_window(opts: &SessionOptions) -> Option<usize> {
    net::first_window(opts.recv_buffer, opts.auto_tune)
}

/// Opens a connection to `portal` (`host:port`) through `dialer` (TCP without one), with
/// `recv_buffer` before the handshake, or says why it cannot.
pub(crate) async fn dial(
    portal: &str,
    dialer: Option<&Dialer>,
    recv_buffer: Option<usize>,
) -> Result<Stream> {
    let unreachable = |source| Error::Unreachable {
        portal: portal.to_owned(),
        source,
    };
    let connect = async {
        match dialer {
            Some(d) => d.dial(portal).await,
            None => Stream::connect_with(portal, recv_buffer).await,
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(unreachable(e)),
        Err(_) => Err(unreachable(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer within 10 s",
        ))),
    }
}

/// The host part of `host:port` or `[v6]:port`, which a certificate must name.
pub(crate) fn portal_host(portal: &str) -> &str {
    match portal.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => portal,
    }
}

/// Runs the TLS handshake over a dialled connection, as `opts` ask.
async fn start_tls(portal: &str, stream: Stream, opts: &SessionOptions) -> Result<Stream> {
    let fail = |why: String| Error::Tls {
        portal: portal.to_owned(),
        why,
    };
    let Stream::Tcp(tcp) = stream else {
        return Err(fail("TLS runs over TCP only".into()));
    };
    let tls = net::tls::ClientTls::new(&opts.tls_files).map_err(|e| fail(e.to_string()))?;
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        Stream::tls_connect(tcp, &tls, portal_host(portal)),
    )
    .await
    {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(_) => Err(fail("no TLS handshake within 10 s".into())),
    }
}

impl RawConn {
    pub async fn connect(portal: &str, opts: &SessionOptions) -> Result<RawConn> {
        let stream = dial(portal, opts.dialer.as_ref(), first_window(opts)).await?;
        RawConn::over(portal, stream, opts).await
    }

    /// A connection over `stream`, already connected to `portal` (the auto-tuning probe's
    /// handshakes are kept for this): the socket tuned and, if asked, TLS started.
    pub async fn over(portal: &str, stream: Stream, opts: &SessionOptions) -> Result<RawConn> {
        let tuning = stream
            .socket()
            .map(|fd| net::apply(fd, &opts.tuning()))
            .unwrap_or_default();
        for w in &tuning.warnings {
            tracing::debug!(portal, "socket tuning: {w}");
        }
        let stream = if opts.tls {
            start_tls(portal, stream, opts).await?
        } else {
            stream
        };
        Ok(RawConn {
            portal: portal.to_owned(),
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            dec: PduDecoder::new(FrameLimits::default()),
            digests: Digests::default(),
            exp_statsn: 0,
            tuning,
        })
    }

    pub async fn send(&mut self, pdu: &Pdu) -> Result<()> {
        let mut out = Vec::with_capacity(pdu.encoded_len(self.digests));
        pdu.encode(&mut out, self.digests);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| self.lost_io(e))
    }

    /// As [`RawConn::lost`], but a TLS failure (a client certificate the target refused
    /// after the handshake, as TLS 1.3 goes) is said as such.
    fn lost_io(&self, e: std::io::Error) -> Error {
        match net::tls::tls_failure(net::tls::Side::Initiator, &e) {
            Some(why) => Error::Tls {
                portal: self.portal.clone(),
                why,
            },
            None => self.lost(e),
        }
    }

    fn lost(&self, e: impl std::fmt::Display) -> Error {
        Error::ConnectionLost {
            portal: self.portal.clone(),
            why: e.to_string(),
        }
    }

    pub async fn recv(&mut self) -> Result<Pdu> {
        let fut = async {
            loop {
                match self.dec.decode(&mut self.buf) {
                    Ok(Some(p)) => return Ok(p),
                    Ok(None) => {}
                    Err(e) => return Err(Error::Protocol(e.to_string())),
                }
                let n = self
                    .stream
                    .read_buf(&mut self.buf)
                    .await
                    .map_err(|e| self.lost_io(e))?;
                if n == 0 {
                    return Err(self.lost("closed by the target"));
                }
            }
        };
        tokio::time::timeout(LOGIN_TIMEOUT, fut)
            .await
            .map_err(|_| Error::Timeout(format!("waiting for {}", self.portal)))?
    }

    /// Runs the login exchange. `cmdsn` is the session's next CmdSN (login does not
    /// advance it).
    pub async fn login(
        &mut self,
        cfg: InitiatorLoginConfig,
        itt: u32,
        cmdsn: u32,
    ) -> Result<LoginDone> {
        let target = cfg
            .target_name
            .clone()
            .unwrap_or_else(|| "discovery".to_owned());
        let mut login = InitiatorLogin::new(cfg).skip_security(true);
        let mut rng = |b: &mut [u8]| rand::Rng::fill(&mut rand::thread_rng(), b);
        let mut out = login.start(&mut rng);
        loop {
            let req = out.into_pdu(itt, cmdsn, self.exp_statsn);
            self.send(&Pdu::LoginRequest(req)).await?;
            let resp = match self.recv().await? {
                Pdu::LoginResponse(r) => r,
                other => {
                    return Err(Error::Protocol(format!(
                        "expected a Login Response, got {:?}",
                        other.opcode()
                    )))
                }
            };
            if resp.status_class == 0 {
                self.exp_statsn = resp.statsn.wrapping_add(1);
            } else if tls_required(&resp.data) {
                return Err(Error::TlsRequired {
                    target,
                    class: resp.status_class,
                    detail: resp.status_detail,
                });
            }
            let view = LoginResponseView::from(&resp);
            match login.on_response(&view, &mut rng) {
                InitiatorStep::Send(next) => out = next,
                InitiatorStep::Done(outcome) => {
                    self.digests = Digests {
                        header: outcome.connection.header_digest,
                        data: outcome.connection.data_digest,
                    };
                    self.dec.set_digests(self.digests);
                    self.dec
                        .set_max_recv_data_segment(outcome.connection.max_recv_data_segment_length);
                    return Ok(LoginDone {
                        outcome,
                        expcmdsn: resp.expcmdsn,
                        maxcmdsn: resp.maxcmdsn,
                    });
                }
                InitiatorStep::Failed(e) => return Err(login_error(&target, e)),
            }
        }
    }

    /// Protocol and cipher suite when the connection is TLS.
    pub fn tls_summary(&self) -> Option<String> {
        self.stream.tls_summary()
    }

    pub fn into_parts(self) -> (Reader, WriteHalf, BytesMut, PduDecoder, Digests) {
        let (r, w) = self.stream.into_split();
        (Reader(r), w, self.buf, self.dec, self.digests)
    }
}

/// The receiving side of a connection in full feature phase, for the session's reader.
pub(crate) struct Reader(ReadHalf);

impl Reader {
    /// Reads what has arrived into `dst`'s spare capacity; 0 when the target closed.
    /// Cancel-safe.
    pub async fn fill(&mut self, dst: &mut impl BufMut) -> std::io::Result<usize> {
        self.0.read_buf(dst).await
    }

    /// Reads exactly `n` more bytes into `v`'s spare capacity (not zeroed first).
    pub async fn read_exact_into(&mut self, v: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
        let mut dst = v.limit(n);
        while dst.has_remaining_mut() {
            if self.0.read_buf(&mut dst).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed by the target",
                ));
            }
        }
        Ok(())
    }
}

impl Reader {
    /// The TCP socket under the connection, for TCP_INFO and pacing; `None` on a carrier
    /// without one.
    pub fn socket(&self) -> Option<BorrowedFd<'_>> {
        self.0.socket()
    }
}

/// Whether a refused login's text says the target wants TLS (a Reservoir target's
/// `X-org.reservoir.TLS=Required`).
fn tls_required(data: &[u8]) -> bool {
    data.split(|b| *b == 0)
        .any(|kv| kv == b"X-org.reservoir.TLS=Required")
}

fn login_error(target: &str, e: iscsi::login::LoginError) -> Error {
    let target = target.to_owned();
    match (e.status_class, e.status_detail) {
        (0, 0) if e.message.starts_with("authentication failed") => Error::Auth {
            target,
            message: e.message,
        },
        (0, 0) => Error::Login {
            target,
            message: e.message,
        },
        (2, 1) => Error::Auth {
            target,
            message: e.message,
        },
        (class, detail) => Error::LoginRefused {
            target,
            class,
            detail,
            class_name: match class {
                1 => "redirection",
                2 => "initiator error",
                3 => "target error",
                _ => "unknown",
            },
            message: e.message,
            hint: match (class, detail) {
                (1, _) => "the target moved; connect to the address it gave",
                (2, 2) => "the target's ACL does not admit this initiator name; add it on the target or set ?initiator_name=",
                (2, 3) | (2, 4) => "check the target name; `rsv ls iscsi://HOST/` lists the targets",
                (2, 6) => "the target allows fewer connections per session; lower --connections",
                (2, 9) => "the target does not offer this session type",
                (2, 10) => "the session is gone; reconnect",
                (2, _) => "the target rejected our request; run with -vv for the exchange",
                (3, _) => "the target had a problem; retry later or check its logs",
                _ => "run with -vv for the exchange",
            },
        },
    }
}

/// A connection in full feature phase. The writer task owns the socket's write half; the
/// session's reader task owns the read half.
pub(crate) struct Conn {
    pub cid: u16,
    pub gen: u64,
    /// Unique per TCP connection of the process: a CID logged in again is a new serial.
    pub serial: u64,
    pub portal: String,
    tx: mpsc::UnboundedSender<Pdu>,
    /// Bytes of commands in flight: the scheduler's measure of outstanding work.
    pub outstanding: AtomicU64,
    alive: AtomicBool,
    pub max_send_segment: u32,
    pub exp_statsn: Arc<AtomicU32>,
    dead: Arc<watch::Sender<bool>>,
    /// Milliseconds since the session epoch at which the reader last got data.
    pub last_rx_ms: AtomicU64,
    /// The bytes of ours the target's TCP has acknowledged, as the reader last looked
    /// (TCP_INFO; at least once a second while nothing arrives): a connection whose
    /// acknowledgements still advance is slow, not dead.
    pub acked: AtomicU64,
    pub pinging: AtomicBool,
    /// The last TCP_INFO sample of this connection and the rate it measured.
    pub path: std::sync::Mutex<Option<PathSample>>,
    /// How the target answered the pacing hint at this connection's login.
    pub target_pacing: TargetPacing,
    /// Pacing rate set on this socket by the session's rate control (0: none).
    pub applied_pace: AtomicU64,
    /// Wakes the reader to apply a pacing rate set from outside now, not at its next
    /// sample: the share (and with `rsv`, the start) must reach the socket before the
    /// first data, not a second into it.
    pub repace: tokio::sync::Notify,
    /// The target's last answer to a pacing hint in full feature phase.
    pub ffp_pacing: std::sync::Mutex<Option<TargetPacing>>,
    /// The bytes that crossed the path, sampled, for a rate over a span.
    span: std::sync::Mutex<crate::tune::SpanRate>,
    /// The congestion control the socket runs, as the kernel read it back after tuning.
    pub congestion: std::sync::OnceLock<String>,
    /// The path's minimum round trip in microseconds as TCP_INFO last gave it (0: not
    /// sampled yet, or no TCP socket): whether the session may pack small commands on
    /// this connection (see `ConnSet::pick_for`).
    pub min_rtt_us: AtomicU32,
    /// Bytes per second `rsv`'s probed start found on this connection (its first round's
    /// ACKs; `docs/congestion.md`), as last sampled; 0: none (yet).
    pub start_found: AtomicU64,
}

/// One connection's view of the path, sampled by its reader about once a second.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PathSample {
    pub at: std::time::Instant,
    pub info: net::TcpInfo,
    /// Bytes per second moved in either direction since the previous sample.
    pub rate: u64,
    /// Bytes that crossed the path in either direction since the connection began, as
    /// segments times their size: those delivered to the target (SACKed ones included,
    /// so that a hole filled after a loss does not count its whole window at once) and
    /// those that arrived from it (duplicates included: they used the path too).
    pub wire: u64,
    /// Bytes per second of `wire` over the last span (see [`crate::tune::SpanRate`]);
    /// `None` until the connection has run that long.
    pub span_rate: Option<u64>,
}

impl Conn {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cid: u16,
        gen: u64,
        portal: String,
        max_send_segment: u32,
        exp_statsn: u32,
        w: WriteHalf,
        digests: Digests,
        target_pacing: TargetPacing,
    ) -> (Arc<Conn>, watch::Receiver<bool>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (dead, dead_rx) = watch::channel(false);
        let dead = Arc::new(dead);
        let exp = Arc::new(AtomicU32::new(exp_statsn));
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let conn = Arc::new(Conn {
            cid,
            gen,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            portal,
            tx,
            outstanding: AtomicU64::new(0),
            alive: AtomicBool::new(true),
            max_send_segment,
            exp_statsn: exp.clone(),
            dead,
            last_rx_ms: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            pinging: AtomicBool::new(false),
            path: std::sync::Mutex::new(None),
            target_pacing,
            applied_pace: AtomicU64::new(0),
            repace: tokio::sync::Notify::new(),
            ffp_pacing: std::sync::Mutex::new(None),
            span: Default::default(),
            congestion: std::sync::OnceLock::new(),
            min_rtt_us: AtomicU32::new(0),
            start_found: AtomicU64::new(0),
        });
        tokio::spawn(writer(rx, w, digests, exp, conn.dead.clone(), cid));
        (conn, dead_rx)
    }

    /// Samples TCP_INFO (the reader calls it every so often); false if it could not.
    /// `at`: time since the session began; `span`: what the span rate is measured over.
    pub fn sample_path(&self, sock: BorrowedFd<'_>, at: Duration, span: Duration) -> bool {
        let Ok(info) = net::tcp_info(sock) else {
            return false;
        };
        self.acked.store(info.bytes_acked, Ordering::Relaxed);
        self.min_rtt_us.store(info.min_rtt_us, Ordering::Relaxed);
        if self.start_found.load(Ordering::Relaxed) == 0 {
            if let Some(Ok(Some(c))) = net::cc::current().map(|l| l.socket_counts(sock)) {
                self.start_found.store(c.found_rate, Ordering::Relaxed);
            }
        }
        let now = std::time::Instant::now();
        let mut g = self.path.lock().unwrap();
        // Reads leave the initiator's delivery_rate (its own sent data) near zero: the
        // received bytes tell the rate then.
        let rate = match *g {
            Some(p) => {
                let dt = now.duration_since(p.at).as_secs_f64();
                let moved = (info.bytes_received - p.info.bytes_received)
                    .max(info.bytes_acked - p.info.bytes_acked);
                (moved as f64 / dt) as u64
            }
            None => 0,
        };
        let wire = match *g {
            Some(p) => {
                p.wire
                    + u64::from(info.delivered.wrapping_sub(p.info.delivered))
                        * u64::from(info.snd_mss)
                    + u64::from(info.data_segs_in.wrapping_sub(p.info.data_segs_in))
                        * u64::from(info.rcv_mss)
            }
            None => 0,
        };
        let span_rate = self.span.lock().unwrap().push(at, wire, span);
        *g = Some(PathSample {
            at: now,
            info,
            rate,
            wire,
            span_rate,
        });
        true
    }

    /// How the target paces this connection now: its answer to the last hint in full
    /// feature phase, else the login's.
    pub fn target_pacing_now(&self) -> TargetPacing {
        self.ffp_pacing
            .lock()
            .unwrap()
            .unwrap_or(self.target_pacing)
    }

    /// Whether a pacing hint may go to the target in full feature phase: only when it
    /// answered a number to the one at login (it knows the key: tgt resets the connection
    /// on a Text request it does not know), and paced at the last hint since.
    pub fn target_takes_hints(&self) -> bool {
        match *self.ffp_pacing.lock().unwrap() {
            Some(answer) => matches!(answer, TargetPacing::Paced(_)),
            None => matches!(
                self.target_pacing,
                TargetPacing::Paced(_) | TargetPacing::NotPaced
            ),
        }
    }

    pub fn send(&self, pdu: Pdu) -> bool {
        self.is_alive() && self.tx.send(pdu).is_ok()
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Stops both tasks; the reader then reports the failure to the session.
    /// Notes how far the target's TCP has acknowledged our bytes (see [`Conn::acked`]).
    pub fn note_acked(&self, sock: BorrowedFd<'_>) {
        if let Ok(info) = net::tcp_info(sock) {
            self.acked.store(info.bytes_acked, Ordering::Relaxed);
        }
    }

    pub fn kill(&self) {
        self.alive.store(false, Ordering::Release);
        let _ = self.dead.send(true);
    }

    pub fn advance_statsn(&self, statsn: u32) {
        let next = statsn.wrapping_add(1);
        let _ = self
            .exp_statsn
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                sn_gt(next, cur).then_some(next)
            });
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.dead.send(true);
    }
}

fn set_expstatsn(pdu: &mut Pdu, v: u32) {
    match pdu {
        Pdu::NopOut(p) => p.expstatsn = v,
        Pdu::ScsiCommand(p) => p.expstatsn = v,
        Pdu::TaskMgmtRequest(p) => p.expstatsn = v,
        Pdu::TextRequest(p) => p.expstatsn = v,
        Pdu::DataOut(p) => p.expstatsn = v,
        Pdu::LogoutRequest(p) => p.expstatsn = v,
        Pdu::SnackRequest(p) => p.expstatsn = v,
        _ => {}
    }
}

async fn writer(
    mut rx: mpsc::UnboundedReceiver<Pdu>,
    w: WriteHalf,
    digests: Digests,
    exp_statsn: Arc<AtomicU32>,
    dead_tx: Arc<watch::Sender<bool>>,
    cid: u16,
) {
    let mut dead = dead_tx.subscribe();
    let mut w = BufWriter::with_capacity(256 * 1024, w);
    let mut header = Vec::with_capacity(128);
    let result: std::io::Result<()> = async {
        loop {
            let mut pdu = tokio::select! {
                p = rx.recv() => match p { Some(p) => p, None => return Ok(()) },
                _ = dead.changed() => return Ok(()),
            };
            loop {
                set_expstatsn(&mut pdu, exp_statsn.load(Ordering::Acquire));
                header.clear();
                pdu.encode_header(&mut header, digests);
                w.write_all(&header).await?;
                let data = pdu.data();
                if !data.is_empty() {
                    w.write_all(data).await?;
                    let (trailer, n) = iscsi::pdu::data_trailer(data, digests);
                    w.write_all(&trailer[..n]).await?;
                }
                match rx.try_recv() {
                    Ok(p) => pdu = p,
                    Err(_) => break,
                }
            }
            w.flush().await?;
        }
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(cid, "writer: {e}");
        let _ = dead_tx.send(true);
    }
    let _ = w.shutdown().await;
}
