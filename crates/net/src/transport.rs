//! The byte stream under one iSCSI connection, whatever carries it.
//!
//! Target and initiator reach the network only through these types: a [`Stream`] until
//! login ends, then its [`ReadHalf`] (the reader task) and [`WriteHalf`] (the writer task).
//! Carriers: TCP, and an in-memory pipe ([`memory_pair`]) on which whole sessions run in
//! one process without sockets, with a switch that cuts the connection for recovery tests.
//! TLS over TCP ([`Stream::tls_connect`], [`Stream::tls_accept`]; configured in
//! [`crate::tls`]) is a third, and the code above reads, writes and tunes the connection
//! as before. Socket options and TCP_INFO apply to the TCP socket under a carrier:
//! `socket()` lends it out, and is `None` where there is none (memory).
//!
//! A TLS writer must flush: bytes a write took may wait, encrypted, in the TLS session
//! until the socket takes them, and only a flush (or the next write) pushes them on. TCP's
//! and memory's flush cost nothing, so the writers flush after every batch whatever the
//! carrier.
//!
//! Enums rather than trait objects: a `match` on a variant costs nothing on the hot path,
//! and each variant keeps its own fast operations (vectored and non-blocking writes).

use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::tlsconn::{TlsRead, TlsStream, TlsWrite};

/// A connection before it is split: login runs on it.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream>),
    Memory(MemoryStream),
}

/// The receiving side of a split [`Stream`].
#[derive(Debug)]
pub enum ReadHalf {
    Tcp(OwnedReadHalf),
    Tls(Box<TlsRead>),
    Memory(tokio::io::ReadHalf<MemoryStream>),
}

/// The sending side of a split [`Stream`].
#[derive(Debug)]
pub enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Tls(Box<TlsWrite>),
    Memory(tokio::io::WriteHalf<MemoryStream>),
}

/// One end of an in-memory connection (see [`memory_pair`]).
#[derive(Debug)]
pub struct MemoryStream {
    pipe: Arc<Mutex<Option<DuplexStream>>>,
    local: SocketAddr,
    peer: SocketAddr,
}

/// Cuts an in-memory connection as a failed link would: both ends' reads and writes fail
/// (those waiting are woken), and so does everything after.
#[derive(Clone, Debug)]
pub struct Cut {
    ends: [Arc<Mutex<Option<DuplexStream>>>; 2],
}

impl Cut {
    pub fn cut(&self) {
        // Dropping both ends of the duplex wakes every reader and writer parked on it.
        for end in &self.ends {
            end.lock().unwrap().take();
        }
    }
}

/// An in-memory connection between `a` and `b` (the addresses each end reports), buffering
/// up to `buffer` bytes in each direction, and the switch that cuts it.
pub fn memory_pair(a: SocketAddr, b: SocketAddr, buffer: usize) -> (Stream, Stream, Cut) {
    let (x, y) = tokio::io::duplex(buffer);
    let (x, y) = (Arc::new(Mutex::new(Some(x))), Arc::new(Mutex::new(Some(y))));
    let cut = Cut {
        ends: [x.clone(), y.clone()],
    };
    let end = |pipe, local, peer| Stream::Memory(MemoryStream { pipe, local, peer });
    (end(x, a, b), end(y, b, a), cut)
}

fn cut_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "in-memory connection cut")
}

impl MemoryStream {
    fn with<T>(
        &self,
        f: impl FnOnce(Pin<&mut DuplexStream>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match self.pipe.lock().unwrap().as_mut() {
            Some(d) => f(Pin::new(d)),
            None => Poll::Ready(Err(cut_error())),
        }
    }
}

impl AsyncRead for MemoryStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.with(|d| d.poll_read(cx, buf))
    }
}

impl AsyncWrite for MemoryStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.with(|d| d.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|d| d.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|d| d.poll_shutdown(cx))
    }
}

/// Opens connections for an initiator: TCP by default; tests hand it in-memory ones.
#[derive(Clone)]
pub struct Dialer(Arc<DialFn>);

type DialFn =
    dyn Fn(String) -> Pin<Box<dyn Future<Output = io::Result<Stream>> + Send>> + Send + Sync;

impl Dialer {
    /// A dialer that calls `f` with the portal (`host:port`) to reach.
    pub fn new<F, Fut>(f: F) -> Dialer
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<Stream>> + Send + 'static,
    {
        Dialer(Arc::new(move |portal| Box::pin(f(portal))))
    }

    pub async fn dial(&self, portal: &str) -> io::Result<Stream> {
        (self.0)(portal.to_owned()).await
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dialer")
    }
}

impl PartialEq for Dialer {
    fn eq(&self, other: &Dialer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Stream {
    /// Opens a TCP connection to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> io::Result<Stream> {
        Ok(Stream::Tcp(TcpStream::connect(addr).await?))
    }

    /// As [`Stream::connect`], with `SO_RCVBUF` of `recv_buffer` set before the handshake,
    /// so that the connection's first window is that buffer's
    /// ([`crate::first_window_buffer`]). Each address `addr` resolves to is tried in turn.
    pub async fn connect_with(addr: &str, recv_buffer: Option<usize>) -> io::Result<Stream> {
        let Some(n) = recv_buffer else {
            return Stream::connect(addr).await;
        };
        let mut last = None;
        for a in tokio::net::lookup_host(addr).await? {
            let sock = if a.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            // A buffer refused (no privilege, a lower rmem_max) leaves the kernel's.
            let _ = crate::set_recv_buffer(std::os::fd::AsFd::as_fd(&sock), n);
            match sock.connect(a).await {
                Ok(s) => return Ok(Stream::Tcp(s)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: no address"))
        }))
    }

    /// Runs a TLS handshake as the client over `tcp`, verifying the target's certificate
    /// against `host` (or the name `tls` was given). The error's text is one line that
    /// names the cause ([`crate::tls::handshake_failure`]).
    pub async fn tls_connect(
        tcp: TcpStream,
        tls: &crate::tls::ClientTls,
        host: &str,
    ) -> io::Result<Stream> {
        let name = tls.server_name(host)?;
        match TlsStream::connect(tcp, tls.config.clone(), name).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s))),
            Err(e) => Err(io::Error::new(
                e.kind(),
                crate::tls::handshake_failure(crate::tls::Side::Initiator, &e),
            )),
        }
    }

    /// Runs a TLS handshake as the server over `tcp`; errors as [`Stream::tls_connect`]'s.
    pub async fn tls_accept(tcp: TcpStream, tls: &crate::tls::ServerTls) -> io::Result<Stream> {
        match TlsStream::accept(tcp, tls.config.clone()).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s))),
            Err(e) => Err(io::Error::new(
                e.kind(),
                crate::tls::handshake_failure(crate::tls::Side::Target, &e),
            )),
        }
    }

    /// The protocol and cipher suite of a TLS stream (`TLSv1_3 TLS13_AES_128_GCM_SHA256`);
    /// `None` for a carrier without TLS.
    pub fn tls_summary(&self) -> Option<String> {
        let Stream::Tls(s) = self else {
            return None;
        };
        Some(s.info.summary.clone())
    }

    /// The client certificate's SHA-256 fingerprint on a TLS stream accepted with mutual TLS.
    pub fn peer_certificate(&self) -> Option<[u8; 32]> {
        let Stream::Tls(s) = self else {
            return None;
        };
        s.info.peer_certificate
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr(),
            Stream::Tls(s) => s.tcp.local_addr(),
            Stream::Memory(m) => Ok(m.local),
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr(),
            Stream::Tls(s) => s.tcp.peer_addr(),
            Stream::Memory(m) => Ok(m.peer),
        }
    }

    /// The TCP socket under the carrier, for socket options and TCP_INFO.
    pub fn socket(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Stream::Tcp(s) => Some(s.as_fd()),
            Stream::Tls(s) => Some(s.tcp.as_fd()),
            Stream::Memory(_) => None,
        }
    }

    /// Splits the stream for a reader task and a writer task that run at once.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Tls(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tls(Box::new(r)), WriteHalf::Tls(Box::new(w)))
            }
            Stream::Memory(m) => {
                let (r, w) = tokio::io::split(m);
                (ReadHalf::Memory(r), WriteHalf::Memory(w))
            }
        }
    }
}

impl ReadHalf {
    /// The TCP socket under the carrier, for socket options and TCP_INFO.
    pub fn socket(&self) -> Option<BorrowedFd<'_>> {
        match self {
            ReadHalf::Tcp(r) => Some(r.as_ref().as_fd()),
            ReadHalf::Tls(r) => Some(r.io.as_ref().as_fd()),
            ReadHalf::Memory(_) => None,
        }
    }
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Stream {
        Stream::Tcp(s)
    }
}

impl WriteHalf {
    /// Writes what the connection takes now without waiting (`WouldBlock` when nothing).
    /// Lets a writer send most batches without arming a timer.
    pub fn try_write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => w.as_ref().try_write_vectored(bufs),
            WriteHalf::Tls(w) => try_now(Pin::new(w), bufs),
            WriteHalf::Memory(w) => try_now(Pin::new(w), bufs),
        }
    }

    /// Whether the bytes written are copied in user space (encrypted) before the socket
    /// takes them: pages lent from a store's `mmap` would then be read outside the
    /// kernel, where a file cut short is SIGBUS rather than EFAULT.
    pub fn copies_in_user_space(&self) -> bool {
        matches!(self, WriteHalf::Tls(..))
    }

    /// Writes from `pieces` as `poll_write_vectored` does, the bytes taken; but owned, so
    /// that a carrier that encrypts may seal a large write's records on other threads
    /// (`crate::sealing`) while the socket takes the records before them. A piece (a
    /// store's lent bytes among them) is held only until its records are sealed.
    pub fn poll_write_shared(
        &mut self,
        cx: &mut Context<'_>,
        pieces: &[bytes::Bytes],
    ) -> Poll<io::Result<usize>> {
        match self {
            WriteHalf::Tls(w) => {
                let w = &mut **w;
                w.tx.poll_write_shared(&mut w.io, cx, pieces)
            }
            other => {
                let slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
                Pin::new(other).poll_write_vectored(cx, &slices)
            }
        }
    }

    /// [`WriteHalf::poll_write_shared`] without waiting (`WouldBlock` when nothing).
    pub fn try_write_shared(&mut self, pieces: &[bytes::Bytes]) -> io::Result<usize> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.poll_write_shared(&mut cx, pieces) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Whether [`WriteHalf::poll_write_shared`] gains anything over a vectored write:
    /// the carrier seals records, and may do so on other threads (TLS).
    pub fn seals_elsewhere(&self) -> bool {
        matches!(self, WriteHalf::Tls(..))
    }

    /// TLS: send a KeyUpdate and switch to the next keys after `records` more records
    /// (done by itself before the suite's confidentiality limit; for tests). Nothing on
    /// other carriers.
    pub fn update_tls_keys_after(&mut self, records: u64) {
        if let WriteHalf::Tls(w) = self {
            w.tx.update_keys_after(records);
        }
    }

    /// The TCP socket under the carrier, for socket options and TCP_INFO.
    pub fn socket(&self) -> Option<BorrowedFd<'_>> {
        match self {
            WriteHalf::Tcp(w) => Some(w.as_ref().as_fd()),
            WriteHalf::Tls(w) => Some(w.io.as_ref().as_fd()),
            WriteHalf::Memory(_) => None,
        }
    }
}

/// One vectored write that does not wait: `WouldBlock` where it would.
fn try_now(w: Pin<&mut impl AsyncWrite>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let mut cx = Context::from_waker(Waker::noop());
    match w.poll_write_vectored(&mut cx, bufs) {
        Poll::Ready(r) => r,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

/// `AsyncRead` for a receiving enum: each call goes to its variant's own.
macro_rules! delegate_async_read {
    ($t:ident) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $t::Tcp(s) => Pin::new(s).poll_read(cx, buf),
                    $t::Tls(s, ..) => Pin::new(s).poll_read(cx, buf),
                    $t::Memory(m) => Pin::new(m).poll_read(cx, buf),
                }
            }
        }
    };
}

delegate_async_read!(Stream);
delegate_async_read!(ReadHalf);

/// `AsyncWrite` for a sending enum: each call goes to its variant's own.
macro_rules! delegate_async_write {
    ($t:ident) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $t::Tcp(s) => Pin::new(s).poll_write(cx, buf),
                    $t::Tls(s, ..) => Pin::new(s).poll_write(cx, buf),
                    $t::Memory(m) => Pin::new(m).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $t::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    $t::Tls(s, ..) => Pin::new(s).poll_write_vectored(cx, bufs),
                    $t::Memory(m) => Pin::new(m).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $t::Tcp(s) => s.is_write_vectored(),
                    $t::Tls(s, ..) => s.is_write_vectored(),
                    $t::Memory(m) => m.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $t::Tcp(s) => Pin::new(s).poll_flush(cx),
                    $t::Tls(s, ..) => Pin::new(s).poll_flush(cx),
                    $t::Memory(m) => Pin::new(m).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $t::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                    $t::Tls(s, ..) => Pin::new(s).poll_shutdown(cx),
                    $t::Memory(m) => Pin::new(m).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_async_write!(Stream);
delegate_async_write!(WriteHalf);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn halves_carry_bytes_both_ways_and_lend_the_socket() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (client, accepted) = tokio::join!(Stream::connect(&addr), l.accept());
        let mut client = client.unwrap();
        let server = Stream::from(accepted.unwrap().0);
        assert_eq!(client.peer_addr().unwrap(), server.local_addr().unwrap());
        assert!(crate::tcp_info(client.socket().unwrap()).is_ok());

        let (mut rd, mut wr) = server.into_split();
        let parts = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
        let n = wr.try_write_vectored(&parts).unwrap();
        assert_eq!(n, 4);
        assert!(crate::tcp_info(wr.socket().unwrap()).is_ok());
        assert!(crate::tcp_info(rd.socket().unwrap()).is_ok());
        let mut got = [0u8; 4];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");

        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        rd.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"ping");
    }

    #[tokio::test]
    async fn a_memory_pair_carries_bytes_until_cut() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:3260".parse().unwrap();
        let (x, y, cut) = memory_pair(a, b, 1 << 10);
        assert_eq!((x.local_addr().unwrap(), x.peer_addr().unwrap()), (a, b));
        assert!(x.socket().is_none());
        let (mut xr, mut xw) = x.into_split();
        let (mut yr, mut yw) = y.into_split();
        assert_eq!(xw.try_write_vectored(&[IoSlice::new(b"hi")]).unwrap(), 2);
        let mut got = [0u8; 2];
        yr.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hi");
        // A full pipe says so instead of waiting.
        let big = vec![0u8; 4 << 10];
        let n = xw.try_write_vectored(&[IoSlice::new(&big)]).unwrap();
        assert_eq!(n, 1 << 10);
        assert_eq!(
            xw.try_write_vectored(&[IoSlice::new(&big)])
                .unwrap_err()
                .kind(),
            io::ErrorKind::WouldBlock
        );
        // A reader parked on the pipe wakes with an error when the link is cut.
        let parked = tokio::spawn(async move {
            let mut one = [0u8; 1];
            xr.read(&mut one).await
        });
        tokio::task::yield_now().await;
        cut.cut();
        let e = parked.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert!(yw.write_all(b"x").await.is_err());
    }
}
