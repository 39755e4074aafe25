//! An iSNS message: function, transaction, a status code in responses, and its
//! attributes in order (source, message key, delimiter, operating attributes, RFC 4171
//! 5.6.5). Encoded into as many PDUs as its size needs, and put back together from a
//! byte stream by [`Reassembler`].

use crate::attr::{Attr, Tag};
use crate::auth::{AuthBlock, Seal};
use crate::pdu::{split_pdu, Flags, FunctionId, Header, HEADER_LEN, MAX_PAYLOAD, VERSION};
use crate::Error;

/// A whole message may be no longer than this; a peer announcing more is cut off.
pub const MAX_MESSAGE: usize = 4 << 20;

/// Response status codes (RFC 4171 5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

impl Status {
    pub const SUCCESS: Status = Status(0);
    pub const UNKNOWN_ERROR: Status = Status(1);
    pub const MESSAGE_FORMAT_ERROR: Status = Status(2);
    pub const INVALID_REGISTRATION: Status = Status(3);
    pub const INVALID_QUERY: Status = Status(5);
    pub const SOURCE_UNKNOWN: Status = Status(6);
    pub const SOURCE_ABSENT: Status = Status(7);
    pub const SOURCE_UNAUTHORIZED: Status = Status(8);
    pub const NO_SUCH_ENTRY: Status = Status(9);
    pub const VERSION_NOT_SUPPORTED: Status = Status(10);
    pub const INTERNAL_ERROR: Status = Status(11);
    pub const BUSY: Status = Status(12);
    pub const OPTION_NOT_UNDERSTOOD: Status = Status(13);
    pub const INVALID_UPDATE: Status = Status(14);
    pub const MESSAGE_NOT_SUPPORTED: Status = Status(15);
    pub const SCN_EVENT_REJECTED: Status = Status(16);
    pub const SCN_REGISTRATION_REJECTED: Status = Status(17);
    pub const ATTRIBUTE_NOT_IMPLEMENTED: Status = Status(18);
    pub const ESI_NOT_AVAILABLE: Status = Status(21);
    pub const INVALID_DEREGISTRATION: Status = Status(22);
    pub const REGISTRATION_FEATURE_NOT_SUPPORTED: Status = Status(23);

    pub fn is_success(self) -> bool {
        self == Status::SUCCESS
    }

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "Successful",
            1 => "Unknown Error",
            2 => "Message Format Error",
            3 => "Invalid Registration",
            5 => "Invalid Query",
            6 => "Source Unknown",
            7 => "Source Absent",
            8 => "Source Unauthorized",
            9 => "No Such Entry",
            10 => "Version Not Supported",
            11 => "Internal Error",
            12 => "Busy",
            13 => "Option Not Understood",
            14 => "Invalid Update",
            15 => "Message Not Supported",
            16 => "SCN Event Rejected",
            17 => "SCN Registration Rejected",
            18 => "Attribute Not Implemented",
            19 => "FC_DOMAIN_ID Not Available",
            20 => "FC_DOMAIN_ID Not Allocated",
            21 => "ESI Not Available",
            22 => "Invalid Deregistration",
            23 => "Registration Feature Not Supported",
            _ => "Reserved",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub function: FunctionId,
    /// CLIENT or SERVER (who sends it), REPLACE, AUTH; FIRST_PDU and LAST_PDU are the
    /// encoder's business and are ignored here.
    pub flags: Flags,
    pub xid: u16,
    /// Present exactly in responses (function IDs from 0x8000).
    pub status: Option<Status>,
    pub attrs: Vec<Attr>,
}

impl Message {
    /// A request from a client: `source`, then `keys`, the delimiter, then `operating`.
    pub fn request(
        function: FunctionId,
        xid: u16,
        source: Attr,
        keys: Vec<Attr>,
        operating: Vec<Attr>,
    ) -> Message {
        let mut attrs = Vec::with_capacity(2 + keys.len() + operating.len());
        attrs.push(source);
        attrs.extend(keys);
        attrs.push(Attr::empty(Tag::DELIMITER));
        attrs.extend(operating);
        Message {
            function,
            flags: Flags(Flags::CLIENT),
            xid,
            status: None,
            attrs,
        }
    }

    /// A response to `req` from the side that did not send it.
    pub fn response_to(req: &Message, status: Status, attrs: Vec<Attr>) -> Message {
        let sender = if req.flags.has(Flags::CLIENT) {
            Flags::SERVER
        } else {
            Flags::CLIENT
        };
        Message {
            function: req.function.response(),
            flags: Flags(sender),
            xid: req.xid,
            status: Some(status),
            attrs,
        }
    }

    /// The attributes before the delimiter (all of them when there is none).
    pub fn before_delimiter(&self) -> &[Attr] {
        match self.attrs.iter().position(Attr::is_delimiter) {
            Some(i) => &self.attrs[..i],
            None => &self.attrs,
        }
    }

    /// The operating attributes: those after the delimiter (none when there is none).
    pub fn operating(&self) -> &[Attr] {
        match self.attrs.iter().position(Attr::is_delimiter) {
            Some(i) => &self.attrs[i + 1..],
            None => &[],
        }
    }

    /// A request's source attribute.
    pub fn source(&self) -> Option<&Attr> {
        self.attrs.first().filter(|a| !a.is_delimiter())
    }

    /// A request's message key: after the source, before the delimiter.
    pub fn keys(&self) -> &[Attr] {
        self.before_delimiter().get(1..).unwrap_or(&[])
    }

    /// A response's first message key attribute as a string (a DevGetNext's next name).
    pub fn keys_of_response(&self) -> Option<&str> {
        self.before_delimiter().first().and_then(Attr::as_str)
    }

    pub fn first(&self, tag: Tag) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.tag == tag)
    }

    fn payload(&self) -> Vec<u8> {
        let mut p = Vec::new();
        if let Some(s) = self.status {
            p.extend_from_slice(&s.0.to_be_bytes());
        }
        for a in &self.attrs {
            a.encode(&mut p);
        }
        p
    }

    /// The message as PDUs back to back, ready for a TCP stream: split between
    /// attributes so that no PDU's payload exceeds `max_payload` bytes (an attribute
    /// larger than that, which Reservoir never builds, is cut where it must be).
    pub fn encode(&self, max_payload: usize) -> Vec<u8> {
        let max = max_payload.clamp(8, MAX_PAYLOAD) / 4 * 4;
        let payload = self.payload();
        // Attribute boundaries, as offsets into the payload.
        let mut cuts = Vec::new();
        let mut at = if self.status.is_some() { 4 } else { 0 };
        for a in &self.attrs {
            cuts.push(at);
            at += a.encoded_len();
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        while payload.len() - start > max {
            let limit = start + max;
            let end = cuts
                .iter()
                .copied()
                .rfind(|&c| c > start && c <= limit)
                .unwrap_or(limit);
            pieces.push(&payload[start..end]);
            start = end;
        }
        pieces.push(&payload[start..]);
        let n = pieces.len();
        let mut out = Vec::with_capacity(payload.len() + n * HEADER_LEN);
        for (i, piece) in pieces.into_iter().enumerate() {
            let mut flags = self.flags.0 & !(Flags::FIRST_PDU | Flags::LAST_PDU);
            if i == 0 {
                flags |= Flags::FIRST_PDU;
            }
            if i + 1 == n {
                flags |= Flags::LAST_PDU;
            }
            let h = Header {
                version: VERSION,
                function: self.function,
                length: piece.len() as u16,
                flags: Flags(flags),
                xid: self.xid,
                seq: i as u16,
            };
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(piece);
        }
        out
    }

    /// A message from its first PDU's header and the whole payload.
    pub fn decode(first: &Header, payload: &[u8]) -> Result<Message, Error> {
        let (status, attrs) = if first.function.is_response() {
            let (s, rest) = payload.split_first_chunk::<4>().ok_or(Error::NoStatus)?;
            (Some(Status(u32::from_be_bytes(*s))), rest)
        } else {
            (None, payload)
        };
        Ok(Message {
            function: first.function,
            flags: Flags(first.flags.0 & !(Flags::FIRST_PDU | Flags::LAST_PDU)),
            xid: first.xid,
            status,
            attrs: Attr::decode_all(attrs)?,
        })
    }
}

/// Messages out of a byte stream: PDUs of one transaction, sequence numbers from 0, are
/// joined until the one marked last. Fed with whatever the socket read; an error leaves
/// the stream unusable (close the connection).
#[derive(Debug, Default)]
pub struct Reassembler {
    buf: Vec<u8>,
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    first: Header,
    next_seq: u16,
    payload: Vec<u8>,
    pdus: usize,
    seals: Vec<Seal>,
}

/// A whole message as received: how many PDUs carried it and the authentication blocks
/// of those that had one (in order), for [`crate::auth::Verifier::check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub message: Message,
    pub pdus: usize,
    pub seals: Vec<Seal>,
}

impl Reassembler {
    pub fn new() -> Reassembler {
        Reassembler::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet part of a whole message.
    pub fn pending(&self) -> usize {
        self.buf.len() + self.partial.as_ref().map_or(0, |p| p.payload.len())
    }

    /// The next whole message, `Ok(None)` when more bytes are needed; authentication
    /// blocks are dropped unread (see [`Reassembler::next_received`]).
    pub fn next_message(&mut self) -> Result<Option<Message>, Error> {
        Ok(self.next_received()?.map(|r| r.message))
    }

    /// The next whole message with its authentication blocks, `Ok(None)` when more bytes
    /// are needed.
    pub fn next_received(&mut self) -> Result<Option<Received>, Error> {
        loop {
            let Some((h, payload, auth, used)) = split_pdu(&self.buf)? else {
                if self.buf.len() > MAX_MESSAGE {
                    return Err(Error::TooLong(self.buf.len()));
                }
                return Ok(None);
            };
            let part = match self.partial.take() {
                None => {
                    if h.seq != 0 {
                        return Err(Error::Sequence {
                            xid: h.xid,
                            seq: h.seq,
                            want_xid: h.xid,
                            want_seq: 0,
                        });
                    }
                    Partial {
                        first: h,
                        next_seq: 0,
                        payload: Vec::new(),
                        pdus: 0,
                        seals: Vec::new(),
                    }
                }
                Some(p) => {
                    if h.xid != p.first.xid || h.function != p.first.function || h.seq != p.next_seq
                    {
                        return Err(Error::Sequence {
                            xid: h.xid,
                            seq: h.seq,
                            want_xid: p.first.xid,
                            want_seq: p.next_seq,
                        });
                    }
                    if h.flags.has(Flags::FIRST_PDU) {
                        return Err(Error::FirstAgain(h.xid));
                    }
                    p
                }
            };
            let mut part = part;
            part.payload.extend_from_slice(payload);
            part.next_seq = part.next_seq.wrapping_add(1);
            part.pdus += 1;
            if let Some(block) = auth {
                let signed_len = HEADER_LEN + payload.len();
                part.seals.push(Seal {
                    signed: self.buf[..signed_len].to_vec(),
                    block: AuthBlock::decode(block)?,
                });
            }
            self.buf.drain(..used);
            if part.payload.len() > MAX_MESSAGE {
                return Err(Error::TooLong(part.payload.len()));
            }
            if h.flags.has(Flags::LAST_PDU) {
                let message = Message::decode(&part.first, &part.payload)?;
                return Ok(Some(Received {
                    message,
                    pdus: part.pdus,
                    seals: part.seals,
                }));
            }
            self.partial = Some(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qry() -> Message {
        Message::request(
            FunctionId::DEV_ATTR_QRY,
            7,
            Attr::string(Tag::ISCSI_NAME, "iqn.2026-11.org.reservoir:rsv"),
            vec![Attr::u32(Tag::ISCSI_NODE_TYPE, 1)],
            vec![Attr::empty(Tag::ISCSI_NAME), Attr::empty(Tag::PG_PORTAL_IP)],
        )
    }

    #[test]
    fn one_pdu_has_first_and_last() {
        let m = qry();
        let wire = m.encode(MAX_PAYLOAD);
        let h = Header::decode(wire.first_chunk().unwrap()).unwrap();
        assert_eq!(
            h.flags.0,
            Flags::CLIENT | Flags::FIRST_PDU | Flags::LAST_PDU
        );
        assert_eq!(usize::from(h.length), wire.len() - HEADER_LEN);
        let mut r = Reassembler::new();
        r.push(&wire);
        assert_eq!(r.next_message().unwrap(), Some(m.clone()));
        assert_eq!(r.next_message().unwrap(), None);
        assert_eq!(
            m.source().unwrap().as_str(),
            Some("iqn.2026-11.org.reservoir:rsv")
        );
        assert_eq!(m.keys(), &[Attr::u32(Tag::ISCSI_NODE_TYPE, 1)]);
        assert_eq!(m.operating().len(), 2);
    }

    #[test]
    fn split_between_attributes_and_joined_byte_by_byte() {
        let mut m = qry();
        m.function = FunctionId::DEV_ATTR_QRY.response();
        m.flags = Flags(Flags::SERVER);
        m.status = Some(Status::SUCCESS);
        for i in 0..50 {
            m.attrs.push(Attr::string(
                Tag::ISCSI_NAME,
                &format!("iqn.2026-11.x:t{i}"),
            ));
        }
        let wire = m.encode(64);
        let mut r = Reassembler::new();
        let mut got = None;
        let mut pdus = 0;
        let mut rest = &wire[..];
        while let Some((h, p, _, used)) = split_pdu(rest).unwrap() {
            assert!(p.len() <= 64);
            assert_eq!(h.seq, pdus);
            assert_eq!(h.flags.has(Flags::FIRST_PDU), pdus == 0);
            // Every PDU after the status code starts on an attribute.
            if pdus > 0 {
                Attr::decode(p).unwrap();
            }
            pdus += 1;
            rest = &rest[used..];
        }
        assert!(pdus > 10);
        for b in &wire {
            r.push(std::slice::from_ref(b));
            if let Some(msg) = r.next_message().unwrap() {
                assert!(got.is_none());
                got = Some(msg);
            }
        }
        assert_eq!(got, Some(m));
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn out_of_sequence_is_refused() {
        let mut m = qry();
        for _ in 0..10 {
            m.attrs
                .push(Attr::string(Tag::ISCSI_ALIAS, "0123456789abcdef"));
        }
        let wire = m.encode(32);
        let (_, _, _, first) = split_pdu(&wire).unwrap().unwrap();
        let (_, _, _, second) = split_pdu(&wire[first..]).unwrap().unwrap();
        // Drop the second PDU: the third arrives with sequence 2 where 1 was due.
        let mut r = Reassembler::new();
        r.push(&wire[..first]);
        r.push(&wire[first + second..]);
        assert!(matches!(
            r.next_message(),
            Err(Error::Sequence {
                seq: 2,
                want_seq: 1,
                ..
            })
        ));
    }

    #[test]
    fn response_needs_a_status() {
        let h = Header {
            version: 1,
            function: FunctionId(0x8002),
            length: 2,
            flags: Flags(Flags::SERVER | Flags::FIRST_PDU | Flags::LAST_PDU),
            xid: 1,
            seq: 0,
        };
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(&[0, 0]);
        let mut r = Reassembler::new();
        r.push(&wire);
        assert_eq!(r.next_message(), Err(Error::NoStatus));
    }

    #[test]
    fn status_only_response() {
        let req = qry();
        let rsp = Message::response_to(&req, Status::SOURCE_UNKNOWN, Vec::new());
        let mut r = Reassembler::new();
        r.push(&rsp.encode(MAX_PAYLOAD));
        let got = r.next_message().unwrap().unwrap();
        assert_eq!(got.status, Some(Status::SOURCE_UNKNOWN));
        assert_eq!(got.flags.0, Flags::SERVER);
        assert_eq!(got.xid, 7);
        assert_eq!(Status(6).to_string(), "Source Unknown (6)");
    }
}
