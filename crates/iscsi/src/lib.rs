//! Sans-IO iSCSI (RFC 7143): PDU codec, digests, serial-number arithmetic, text keys and
//! their negotiation, CHAP, the login state machines, and the full-feature-phase data
//! transfer rules both ends share (`ffp`). No sockets, no runtime, no clock.

pub mod chap;
pub mod digest;
pub mod ffp;
pub mod framing;
pub mod login;
pub mod negotiate;
pub mod pdu;
pub mod serial;
pub mod text;
