//! Sans-IO iSNS (RFC 4171): the iSNSP header and its PDUs, TLV attributes, messages split
//! over PDUs and put back together, and the messages a target and an initiator exchange
//! with a server (`objects`). No sockets, no runtime, no clock: the caller moves the bytes.

pub mod attr;
pub mod message;
pub mod objects;
pub mod pdu;

pub use attr::{Attr, Tag};
pub use message::{Message, Reassembler, Status};
pub use pdu::{Flags, FunctionId, Header, HEADER_LEN};

/// The IANA port of iSNS, TCP and UDP.
pub const DEFAULT_PORT: u16 = 3205;

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
}
