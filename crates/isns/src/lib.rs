//! Sans-IO iSNS (RFC 4171): the iSNSP header and its PDUs, TLV attributes, messages split
//! over PDUs and put back together, and the messages a target and an initiator exchange
//! with a server (`objects`), and the registry of a server (`server`). No sockets, no runtime, no clock: the caller moves the bytes.

pub mod attr;
pub mod auth;
pub mod message;
pub mod objects;
pub mod pdu;
pub mod server;

pub use attr::{Attr, Tag};
pub use message::{Message, Reassembler, Received, Status};
pub use pdu::{Flags, FunctionId, Header, HEADER_LEN};

/// The IANA port of iSNS, TCP and UDP.
pub const DEFAULT_PORT: u16 = 3205;

/// `host`, `host:port`, `[v6]` or `[v6]:port` of a server as written on a command line,
/// in a URL or a configuration: the host (without brackets) and the port (3205 when
/// absent). A bare IPv6 address without brackets is taken whole.
pub fn server_address(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("{s:?}: expected HOST, HOST:PORT or [IPv6]:PORT");
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else if s.parse::<std::net::Ipv6Addr>().is_ok() {
        (s, None)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() || host.contains(['/', '?', '@', ' ']) {
        return Err(bad());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?,
    };
    Ok((host.to_owned(), port))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("iSNSP version {0} (only 1 is known)")]
    Version(u16),
    #[error("attribute {tag}: length {len} is not a multiple of 4")]
    Unaligned { tag: u32, len: u32 },
    #[error("attribute {tag}: length {len} runs past the end of the message")]
    Truncated { tag: u32, len: u32 },
    #[error("attribute {tag}: {len} bytes where the tag takes {want}")]
    BadLength {
        tag: u32,
        len: u32,
        want: &'static str,
    },
    #[error("a response without its status code")]
    NoStatus,
    #[error("message of {0} bytes is too long")]
    TooLong(usize),
    #[error(
        "PDU out of sequence: transaction {xid} sequence {seq}, expected {want_xid}/{want_seq}"
    )]
    Sequence {
        xid: u16,
        seq: u16,
        want_xid: u16,
        want_seq: u16,
    },
    #[error("a later PDU of transaction {0} claims to be first")]
    FirstAgain(u16),
    #[error(transparent)]
    Auth(#[from] auth::AuthError),
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_addresses() {
        use super::server_address as a;
        assert_eq!(a("isns.lan"), Ok(("isns.lan".into(), 3205)));
        assert_eq!(a("10.0.0.1:3206"), Ok(("10.0.0.1".into(), 3206)));
        assert_eq!(a("[fd00::1]"), Ok(("fd00::1".into(), 3205)));
        assert_eq!(a("[fd00::1]:99"), Ok(("fd00::1".into(), 99)));
        assert_eq!(a("fd00::1"), Ok(("fd00::1".into(), 3205)));
        for bad in ["", ":3205", "h:0", "h:x", "[::1", "[::1]x", "h/t"] {
            assert!(a(bad).is_err(), "{bad}");
        }
    }
}
