//! TLS 1.3 as a carrier: rustls runs the handshake, then the records are ours.
//!
//! The handshake is driven through rustls's unbuffered API over the TCP socket, fed one
//! whole record at a time, so that rustls takes nothing past its last handshake record:
//! application data the peer sent right behind its Finished stays in our buffer. Then
//! rustls hands over the traffic keys and sequence numbers
//! (`dangerous_into_kernel_connection`, made for kernel TLS) and keeps only what it alone
//! can do: computing the next keys at a KeyUpdate, and taking session tickets. Records
//! are sealed and opened by [`crate::record`] into and out of one buffer per direction:
//!
//! - [`Tx`]: plaintext from the caller's slices is sealed straight into the output
//!   segments (no copy for slices of 4 KiB and more; smaller ones are gathered into one
//!   record), and the sealed segments leave in one write; a large write of owned pieces
//!   (`poll_write_shared`) is numbered here and sealed on the sealing threads
//!   ([`crate::sealing`]), its records written in order once sealed;
//! - [`Rx`]: the socket is read in reads of up to 256 KiB, each record opened where it
//!   landed and its plaintext copied once, to the reader.
//!
//! Post-handshake messages: NewSessionTicket (client) goes to rustls; KeyUpdate switches
//! the receiving keys and, if the peer asks, makes the sender update its own. The sender
//! updates its keys by itself before the suite's confidentiality limit (2^23 records
//! for AES-256-GCM). close_notify ends the stream; any other alert is an error that
//! carries rustls's `Error::AlertReceived`, so `crate::tls::tls_failure` names it.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::Bytes;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, UnbufferedStatus};
use rustls::{AlertDescription, ConnectionTrafficSecrets, ExtractedSecrets};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::record::{self, Opener, RecordError, Sealer};
use crate::sealing::{self, Outbox, DIRECT_MIN};

/// Receive buffer: many records per socket read.
const RX_CAP: usize = 256 << 10;
/// A write of owned pieces at least this long is sealed on the sealing threads.
const SEAL_ELSEWHERE_MIN: usize = 64 << 10;
/// A KeyUpdate record (4-byte message) with its overhead.
const KEY_UPDATE_RECORD: usize = 4 + 1 + record::OVERHEAD;
/// Post-handshake messages buffered at most while incomplete.
const MAX_HANDSHAKE_MESSAGE: usize = 64 << 10;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

pub(crate) fn record_error(e: RecordError) -> io::Error {
    let tls = match e {
        RecordError::Decrypt => rustls::Error::DecryptError,
        RecordError::SequenceExhausted => rustls::Error::EncryptError,
        other => rustls::Error::General(other.to_string()),
    };
    tls_error(tls)
}

/// What rustls keeps after the handshake, shared by both directions.
struct Kernel {
    conn: Mutex<KernelSide>,
    /// The peer asked for our KeyUpdate (`update_requested`); the sender sends it.
    update_requested: AtomicBool,
}

enum KernelSide {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl KernelSide {
    fn update_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            KernelSide::Client(k) => k.update_tx_secret(),
            KernelSide::Server(k) => k.update_tx_secret(),
        }
    }

    fn update_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            KernelSide::Client(k) => k.update_rx_secret(),
            KernelSide::Server(k) => k.update_rx_secret(),
        }
    }

    fn new_session_ticket(&mut self, payload: &[u8]) -> Result<(), rustls::Error> {
        match self {
            KernelSide::Client(k) => k.handle_new_session_ticket(payload),
            KernelSide::Server(_) => Err(rustls::Error::General(
                "a NewSessionTicket from the client".into(),
            )),
        }
    }
}

/// What the handshake settled, for logs and access control.
#[derive(Clone, Debug)]
pub struct TlsInfo {
    /// `TLSv1_3 TLS13_AES_128_GCM_SHA256`.
    pub summary: String,
    /// SHA-256 of the peer's certificate, when it presented one.
    pub peer_certificate: Option<[u8; 32]>,
}

/// The receiving direction: undecrypted bytes, and the plaintext of the last record
/// opened, not yet handed out.
pub(crate) struct Rx {
    open: Opener,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    plain: Range<usize>,
    /// An incomplete post-handshake message.
    handshake: Vec<u8>,
    /// close_notify received.
    closed: bool,
    kernel: Arc<Kernel>,
}

impl std::fmt::Debug for Rx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Rx({:?}, {} bytes waiting)",
            self.open,
            self.end - self.start
        )
    }
}

impl Rx {
    /// Reads plaintext into `dst`: what is opened already, then every whole record that
    /// is buffered, reading the socket only when nothing could be given.
    pub(crate) fn poll_read<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut gave = false;
        loop {
            if !self.plain.is_empty() {
                let n = self.plain.len().min(dst.remaining());
                dst.put_slice(&self.buf[self.plain.start..self.plain.start + n]);
                self.plain.start += n;
                gave |= n > 0;
                if dst.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
            }
            if self.closed {
                return Poll::Ready(Ok(()));
            }
            match record::record_len(&self.buf[self.start..self.end]) {
                Some(Err(e)) => return Poll::Ready(Err(record_error(e))),
                Some(Ok(n)) if self.end - self.start >= n => {
                    self.next_record(n)?;
                    continue;
                }
                _ => {}
            }
            if gave {
                return Poll::Ready(Ok(()));
            }
            // Nothing opened is left (`plain` is empty): the buffer may move.
            if self.start == self.end {
                (self.start, self.end) = (0, 0);
            } else if self.buf.len() - self.end < record::MAX_RECORD {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            }
            let mut rb = ReadBuf::new(&mut self.buf[self.end..]);
            ready!(Pin::new(&mut *io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection without sending TLS close_notify",
                )));
            }
            self.end += n;
        }
    }

    /// Opens the whole record of `n` bytes at `start`.
    fn next_record(&mut self, n: usize) -> io::Result<()> {
        let at = self.start;
        let (typ, r) = self
            .open
            .open(&mut self.buf[at..at + n])
            .map_err(record_error)?;
        self.start += n;
        let r = at + r.start..at + r.end;
        match typ {
            record::APPLICATION_DATA => self.plain = r,
            record::ALERT => self.alert(r)?,
            record::HANDSHAKE => self.post_handshake(r)?,
            t => {
                return Err(tls_error(rustls::Error::General(format!(
                    "TLS record of content type {t} after the handshake"
                ))))
            }
        }
        Ok(())
    }

    fn alert(&mut self, r: Range<usize>) -> io::Result<()> {
        let &[_level, desc] = &self.buf[r] else {
            return Err(tls_error(rustls::Error::General(
                "malformed TLS alert".into(),
            )));
        };
        match AlertDescription::from(desc) {
            AlertDescription::CloseNotify => {
                self.closed = true;
                Ok(())
            }
            // A warning a peer may send before closing (RFC 8446 6.1).
            AlertDescription::UserCanceled => Ok(()),
            a => Err(tls_error(rustls::Error::AlertReceived(a))),
        }
    }

    fn post_handshake(&mut self, r: Range<usize>) -> io::Result<()> {
        self.handshake.extend_from_slice(&self.buf[r]);
        if self.handshake.len() > MAX_HANDSHAKE_MESSAGE {
            return Err(tls_error(rustls::Error::General(
                "post-handshake message too long".into(),
            )));
        }
        while self.handshake.len() >= 4 {
            let h = &self.handshake;
            let len = u32::from_be_bytes([0, h[1], h[2], h[3]]) as usize;
            if h.len() < 4 + len {
                break;
            }
            let typ = h[0];
            let body: Vec<u8> = h[4..4 + len].to_vec();
            self.handshake.drain(..4 + len);
            let mut k = self.kernel.conn.lock().unwrap_or_else(|e| e.into_inner());
            match typ {
                NEW_SESSION_TICKET => k.new_session_ticket(&body).map_err(tls_error)?,
                KEY_UPDATE => {
                    // A key change ends the record (RFC 8446 5.1).
                    let (&[request], true) = (&body[..], self.handshake.is_empty()) else {
                        return Err(tls_error(rustls::Error::General(
                            "malformed KeyUpdate".into(),
                        )));
                    };
                    let (seq, secrets) = k.update_rx().map_err(tls_error)?;
                    self.open = Opener::new(&secrets, seq);
                    if request == 1 {
                        self.kernel.update_requested.store(true, Ordering::Release);
                    }
                }
                t => {
                    return Err(tls_error(rustls::Error::General(format!(
                        "handshake message {t} after the handshake"
                    ))))
                }
            }
        }
        Ok(())
    }
}

/// The sending direction: records sealed (here, or on the sealing threads) and not yet
/// taken by the socket, in order.
pub(crate) struct Tx {
    seal: Sealer,
    out: Outbox,
    /// Records per key: the sender updates its keys when it has sealed this many.
    limit: u64,
    /// close_notify sealed.
    closed: bool,
    kernel: Arc<Kernel>,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tx({:?}, {:?})", self.seal, self.out)
    }
}

impl Tx {
    fn new(seal: Sealer, limit: u64, kernel: Arc<Kernel>) -> Tx {
        Tx {
            seal,
            out: Outbox::new(),
            limit,
            closed: false,
            kernel,
        }
    }

    /// Seals as much of `bufs` as fits, here, and tries to send it; the bytes taken.
    /// What the socket does not take now waits for the next write or a flush.
    pub(crate) fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        if self.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let mut n = self.seal_from(bufs)?;
        if n == 0 {
            ready!(self.out.poll_send(io, cx))?;
            n = self.seal_from(bufs)?;
        }
        if let Poll::Ready(Err(e)) = self.out.poll_send(io, cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    /// Takes `pieces` as [`Tx::poll_write`] does, but owned, so that a large write's
    /// records may be sealed on the sealing threads (`crate::sealing`) while the socket
    /// takes the ones before them; the bytes taken.
    pub(crate) fn poll_write_shared<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        pieces: &[Bytes],
    ) -> Poll<io::Result<usize>> {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        if total < SEAL_ELSEWHERE_MIN {
            let slices: Vec<io::IoSlice<'_>> = pieces.iter().map(|p| io::IoSlice::new(p)).collect();
            return self.poll_write(io, cx, &slices);
        }
        if self.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let (mut i, mut off, mut taken) = (0usize, 0usize, 0usize);
        while taken < total {
            // A KeyUpdate goes before the records it concerns, sealed here; `false` only
            // when the outbox is full, as below.
            if !self.out.has_room() || !self.maybe_update_keys()? {
                match self.out.poll_send(io, cx) {
                    Poll::Ready(r) => r?,
                    Poll::Pending if taken > 0 => break,
                    Poll::Pending => return Poll::Pending,
                }
                continue;
            }
            if !self.out.has_room() {
                // The KeyUpdate took the last segment: fill it here.
                taken += self.seal_from_shared(pieces, &mut i, &mut off)?;
                continue;
            }
            let plan = sealing::plan(pieces, &mut i, &mut off, sealing::SEGMENT);
            let first = self
                .seal
                .reserve(plan.records.len() as u64)
                .map_err(record_error)?;
            taken += plan.taken;
            self.out
                .seal_elsewhere(self.seal.key().clone(), first, plan);
        }
        if let Poll::Ready(Err(e)) = self.out.poll_send(io, cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    /// What of `pieces` from (`i`, `off`) the last segment's room takes, sealed here.
    fn seal_from_shared(
        &mut self,
        pieces: &[Bytes],
        i: &mut usize,
        off: &mut usize,
    ) -> io::Result<usize> {
        let room = self.out.tail_room();
        let plan = sealing::plan(pieces, i, off, room);
        if plan.taken == 0 {
            return Ok(0);
        }
        let first = self
            .seal
            .reserve(plan.records.len() as u64)
            .map_err(record_error)?;
        let out = self
            .out
            .tail(plan.sealed_len())
            .expect("planned within the tail's room");
        let n = sealing::seal_plan(self.seal.key(), first, &plan, out).map_err(record_error)?;
        self.out.commit(n);
        Ok(plan.taken)
    }

    /// Seals plaintext from `bufs` here, record by record, while the outbox has room.
    fn seal_from(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let (mut i, mut off, mut taken) = (0usize, 0usize, 0usize);
        while i < bufs.len() {
            if bufs[i].len() == off {
                (i, off) = (i + 1, 0);
                continue;
            }
            if !self.maybe_update_keys()? {
                break;
            }
            // A whole record if a segment can hold one, else what the last one holds.
            let want = record::MAX_PLAINTEXT + record::OVERHEAD;
            let room = if self.out.tail_room() >= want || !self.out.has_room() {
                self.out.tail_room()
            } else {
                want
            };
            if room < record::OVERHEAD + 1 {
                break;
            }
            let max = record::MAX_PLAINTEXT.min(room - record::OVERHEAD);
            let out = self.out.tail(room).expect("room checked");
            let cur = &bufs[i][off..];
            let (n, len) = if cur.len() >= DIRECT_MIN.min(max) {
                let n = cur.len().min(max);
                let len = self
                    .seal
                    .seal(record::APPLICATION_DATA, &cur[..n], out)
                    .map_err(record_error)?;
                off += n;
                (n, len)
            } else {
                // Small pieces (PDU headers, small payloads) gathered into one record.
                let body = record::HEADER_LEN;
                let mut n = 0;
                while n < max && i < bufs.len() {
                    let cur = &bufs[i][off..];
                    if cur.is_empty() {
                        (i, off) = (i + 1, 0);
                        continue;
                    }
                    if n > 0 && cur.len() >= DIRECT_MIN {
                        break;
                    }
                    let k = cur.len().min(max - n);
                    out[body + n..body + n + k].copy_from_slice(&cur[..k]);
                    (n, off) = (n + k, off + k);
                }
                let len = self
                    .seal
                    .seal_in_place(record::APPLICATION_DATA, n, out)
                    .map_err(record_error)?;
                (n, len)
            };
            self.out.commit(len);
            taken += n;
        }
        Ok(taken)
    }

    /// Sends a KeyUpdate and switches to the next keys, when the peer asked for it or
    /// this key has sealed as many records as it should. False: it is due, but the
    /// outbox has no room for it until the socket takes some.
    fn maybe_update_keys(&mut self) -> io::Result<bool> {
        let asked = self.kernel.update_requested.load(Ordering::Acquire);
        if !asked && self.seal.seq() < self.limit {
            return Ok(true);
        }
        let Some(out) = self.out.tail(KEY_UPDATE_RECORD) else {
            return Ok(false);
        };
        self.kernel.update_requested.store(false, Ordering::Release);
        // update_not_requested: we answer, or update for ourselves.
        let msg = [KEY_UPDATE, 0, 0, 1, 0];
        let n = self
            .seal
            .seal(record::HANDSHAKE, &msg, out)
            .map_err(record_error)?;
        self.out.commit(n);
        let (seq, secrets) = self
            .kernel
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .update_tx()
            .map_err(tls_error)?;
        self.seal = Sealer::new(&secrets, seq);
        Ok(true)
    }

    pub(crate) fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.out.poll_send(io, cx))?;
        Pin::new(io).poll_flush(cx)
    }

    /// Sends close_notify, then shuts the socket's sending side.
    pub(crate) fn poll_shutdown<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.closed {
            if self.out.tail(2 + record::OVERHEAD).is_none() {
                ready!(self.out.poll_send(io, cx))?;
            }
            let out = self
                .out
                .tail(2 + record::OVERHEAD)
                .expect("the socket took every segment");
            let n = self
                .seal
                .seal(record::ALERT, &[1, 0], out)
                .map_err(record_error)?;
            self.out.commit(n);
            self.closed = true;
        }
        ready!(self.out.poll_send(io, cx))?;
        Pin::new(io).poll_shutdown(cx)
    }

    /// Makes the sender update its keys after `records` more records (tests; normally
    /// at the suite's confidentiality limit).
    pub(crate) fn update_keys_after(&mut self, records: u64) {
        self.limit = self.seal.seq().saturating_add(records);
    }
}

/// One side of a handshake through rustls's unbuffered API.
trait Handshaking: Sized {
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn common(&self) -> &rustls::CommonState;
    fn into_kernel(self) -> Result<(ExtractedSecrets, KernelSide), rustls::Error>;
}

/// `Handshaking` for rustls's unbuffered connection of one side: `$data` its connection
/// data, `$side` the `KernelSide` its secrets go to.
macro_rules! handshaking {
    ($conn:ty, $data:ty, $side:ident) => {
        impl Handshaking for $conn {
            type Data = $data;
            fn process<'c, 'i>(
                &'c mut self,
                incoming: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn common(&self) -> &rustls::CommonState {
                self
            }
            fn into_kernel(self) -> Result<(ExtractedSecrets, KernelSide), rustls::Error> {
                let (s, k) = self.dangerous_into_kernel_connection()?;
                Ok((s, KernelSide::$side(k)))
            }
        }
    };
}
handshaking!(UnbufferedClientConnection, ClientConnectionData, Client);
handshaking!(UnbufferedServerConnection, ServerConnectionData, Server);

/// Encodes a handshake flight's record onto `out`.
fn encode<D>(enc: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> io::Result<()> {
    let at = out.len();
    out.resize(at + 4096, 0);
    loop {
        match enc.encode(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(s)) => out.resize(at + s.required_size, 0),
            Err(e) => {
                return Err(io::Error::other(format!("TLS handshake: {e:?}")));
            }
        }
    }
}

/// The end of the next whole record after the `offered` bytes at the front of `buf`, or
/// all of `buf` when what follows is no record of TLS's sizes (rustls then says what it
/// is); `None` until it has arrived.
fn next_offer(buf: &[u8], offered: usize) -> Option<usize> {
    let rest = &buf[offered..];
    let h = rest.get(..record::HEADER_LEN)?;
    let len = record::HEADER_LEN + u16::from_be_bytes([h[3], h[4]]) as usize;
    if len > record::MAX_RECORD {
        return (buf.len() > offered).then_some(buf.len());
    }
    (rest.len() >= len).then_some(offered + len)
}

/// Runs the handshake of `conn` over `tcp`; then the carrier's two directions and what
/// was settled. Errors carry rustls's `Error` where it gave one
/// (`crate::tls::handshake_failure` words them).
async fn handshake<C: Handshaking>(
    mut conn: C,
    tcp: &mut TcpStream,
) -> io::Result<(Rx, Tx, TlsInfo)> {
    let mut buf = vec![0u8; RX_CAP].into_boxed_slice();
    let (mut start, mut end, mut offered) = (0usize, 0usize, 0usize);
    let mut out: Vec<u8> = Vec::new();
    let failed = loop {
        let UnbufferedStatus { discard, state } = conn.process(&mut buf[start..start + offered]);
        let mut read_more = false;
        let mut done = false;
        let mut failed = None;
        match state {
            Err(e) => failed = Some(e),
            Ok(ConnectionState::EncodeTlsData(mut enc)) => encode(&mut enc, &mut out)?,
            Ok(ConnectionState::TransmitTlsData(t)) => {
                tcp.write_all(&out).await?;
                out.clear();
                t.done();
            }
            Ok(ConnectionState::BlockedHandshake) => read_more = true,
            Ok(ConnectionState::WriteTraffic(_)) => {
                // A server may send before the client's Finished; the handshake is over
                // only when rustls says so.
                done = true;
            }
            Ok(ConnectionState::PeerClosed) | Ok(ConnectionState::Closed) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed TLS during the handshake",
                ))
            }
            Ok(_) => {
                return Err(tls_error(rustls::Error::General(
                    "application data during the handshake".into(),
                )))
            }
        }
        start += discard;
        offered -= discard;
        if let Some(e) = failed {
            break e;
        }
        if done && !conn.common().is_handshaking() {
            if offered != 0 || !out.is_empty() {
                return Err(io::Error::other("TLS handshake ended with bytes unsettled"));
            }
            let info = TlsInfo {
                summary: format!(
                    "{} {}",
                    conn.common()
                        .protocol_version()
                        .map_or_else(|| "TLS".into(), |v| format!("{v:?}")),
                    conn.common()
                        .negotiated_cipher_suite()
                        .map_or_else(|| "?".into(), |c| format!("{:?}", c.suite()))
                ),
                peer_certificate: conn
                    .common()
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(crate::tls::fingerprint),
            };
            let limit = conn
                .common()
                .negotiated_cipher_suite()
                .and_then(|s| s.tls13())
                .map_or(1 << 23, |s| s.common.confidentiality_limit);
            let (secrets, side) = conn.into_kernel().map_err(tls_error)?;
            let kernel = Arc::new(Kernel {
                conn: Mutex::new(side),
                update_requested: AtomicBool::new(false),
            });
            let rx = Rx {
                open: Opener::new(&secrets.rx.1, secrets.rx.0),
                buf,
                start,
                end,
                plain: 0..0,
                handshake: Vec::new(),
                closed: false,
                kernel: kernel.clone(),
            };
            // Well before the limit: a KeyUpdate in flight still counts against it.
            let tx = Tx::new(Sealer::new(&secrets.tx.1, secrets.tx.0), limit / 2, kernel);
            return Ok((rx, tx, info));
        }
        if !(read_more || done) {
            continue;
        }
        // Offer rustls the next whole record, or read until there is one.
        if let Some(next) = next_offer(&buf[start..end], offered) {
            offered = next;
            continue;
        }
        if end == buf.len() {
            buf.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        let n = tcp.read(&mut buf[end..]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tls handshake eof",
            ));
        }
        end += n;
    };
    // rustls queues an alert that says why; send it, as far as the socket takes it.
    for _ in 0..4 {
        // The same bytes as before: rustls may hold ranges of them (a message joined
        // from several records).
        let UnbufferedStatus { state, .. } = conn.process(&mut buf[start..start + offered]);
        match state {
            Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                if encode(&mut enc, &mut out).is_err() {
                    break;
                }
            }
            Ok(ConnectionState::TransmitTlsData(t)) => {
                let _ =
                    tokio::time::timeout(std::time::Duration::from_secs(1), tcp.write_all(&out))
                        .await;
                out.clear();
                t.done();
            }
            _ => break,
        }
    }
    if !out.is_empty() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), tcp.write_all(&out)).await;
    }
    Err(tls_error(failed))
}

/// A TLS connection before it is split.
pub struct TlsStream {
    pub(crate) tcp: TcpStream,
    pub(crate) rx: Rx,
    pub(crate) tx: Tx,
    pub(crate) info: TlsInfo,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TlsStream({}, {:?}, {:?})",
            self.info.summary, self.rx, self.tx
        )
    }
}

impl TlsStream {
    pub(crate) async fn connect(
        mut tcp: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> io::Result<TlsStream> {
        let conn = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
        let (rx, tx, info) = handshake(conn, &mut tcp).await?;
        Ok(TlsStream { tcp, rx, tx, info })
    }

    pub(crate) async fn accept(
        mut tcp: TcpStream,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<TlsStream> {
        let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
        let (rx, tx, info) = handshake(conn, &mut tcp).await?;
        Ok(TlsStream { tcp, rx, tx, info })
    }
}

/// `AsyncRead` through `$rx` over the socket `$io` (the whole stream, or its read half).
macro_rules! read_through {
    ($t:ty, $io:ident) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                let s = self.get_mut();
                s.rx.poll_read(&mut s.$io, cx, buf)
            }
        }
    };
}

/// `AsyncWrite` through `tx` over the socket `$io` (the whole stream, or its write half).
macro_rules! write_through {
    ($t:ty, $io:ident) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                let s = self.get_mut();
                s.tx.poll_write(&mut s.$io, cx, &[io::IoSlice::new(buf)])
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                let s = self.get_mut();
                s.tx.poll_write(&mut s.$io, cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let s = self.get_mut();
                s.tx.poll_flush(&mut s.$io, cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let s = self.get_mut();
                s.tx.poll_shutdown(&mut s.$io, cx)
            }
        }
    };
}

read_through!(TlsStream, tcp);
write_through!(TlsStream, tcp);

impl TlsStream {
    /// The two directions, for a reader task and a writer task that run at once.
    pub(crate) fn into_split(self) -> (TlsRead, TlsWrite) {
        let (r, w) = self.tcp.into_split();
        (
            TlsRead { io: r, rx: self.rx },
            TlsWrite { io: w, tx: self.tx },
        )
    }
}

/// The receiving direction of a split TLS connection.
#[derive(Debug)]
pub struct TlsRead {
    pub(crate) io: OwnedReadHalf,
    rx: Rx,
}

/// The sending direction of a split TLS connection.
#[derive(Debug)]
pub struct TlsWrite {
    pub(crate) io: OwnedWriteHalf,
    pub(crate) tx: Tx,
}

read_through!(TlsRead, io);
write_through!(TlsWrite, io);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_offered_to_rustls_one_at_a_time() {
        let rec = |len: u16| {
            let mut r = vec![22, 3, 3];
            r.extend_from_slice(&len.to_be_bytes());
            r.extend(std::iter::repeat_n(0u8, len as usize));
            r
        };
        let mut buf = rec(10);
        buf.extend(rec(3));
        buf.extend(&rec(7)[..6]);
        assert_eq!(next_offer(&buf, 0), Some(15));
        assert_eq!(next_offer(&buf, 15), Some(23));
        // Incomplete: wait for the rest.
        assert_eq!(next_offer(&buf, 23), None);
        assert_eq!(next_offer(&buf[..17], 15), None);
        // Not a TLS record: everything goes to rustls, which says what it is.
        let junk = [0x43u8, 0, 0xff, 0xff, 0xff, 0xff, 1, 2];
        assert_eq!(next_offer(&junk, 0), Some(junk.len()));
        assert_eq!(next_offer(&junk, junk.len()), None);
    }
}
