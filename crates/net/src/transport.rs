//! The byte stream under one iSCSI connection, whatever carries it.
//!
//! Target and initiator reach the network only through these types: a [`Stream`] until
//! login ends, then its [`ReadHalf`] (the reader task) and [`WriteHalf`] (the writer task).
//! TCP is the one carrier today; another (TLS) is a new variant here, and the code above
//! reads, writes and tunes the connection as before. Socket options and TCP_INFO apply to
//! the TCP socket under any carrier, so every type lends it out through [`AsFd`].
//!
//! Enums rather than trait objects: a `match` on one variant costs nothing on the hot
//! path, and each variant keeps its own fast operations (vectored and non-blocking writes).

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A connection before it is split: login runs on it.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
}

/// The receiving side of a split [`Stream`].
#[derive(Debug)]
pub enum ReadHalf {
    Tcp(OwnedReadHalf),
}

/// The sending side of a split [`Stream`].
#[derive(Debug)]
pub enum WriteHalf {
    Tcp(OwnedWriteHalf),
}

impl Stream {
    /// Opens a TCP connection to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> io::Result<Stream> {
        Ok(Stream::Tcp(TcpStream::connect(addr).await?))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr(),
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr(),
        }
    }

    /// Splits the stream for a reader task and a writer task that run at once.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
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
    pub fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => w.as_ref().try_write_vectored(bufs),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl AsFd for ReadHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            ReadHalf::Tcp(r) => r.as_ref().as_fd(),
        }
    }
}

impl AsFd for WriteHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            WriteHalf::Tcp(w) => w.as_ref().as_fd(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Tcp(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

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
        assert!(crate::tcp_info(&client).is_ok());

        let (mut rd, wr) = server.into_split();
        let parts = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
        let n = wr.try_write_vectored(&parts).unwrap();
        assert_eq!(n, 4);
        assert!(crate::tcp_info(&wr).is_ok() && crate::tcp_info(&rd).is_ok());
        let mut got = [0u8; 4];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");

        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        rd.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"ping");
    }
}
