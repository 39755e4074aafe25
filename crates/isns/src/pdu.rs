//! The iSNSP header (RFC 4171 5.1): six 16-bit fields, big-endian, before each PDU's
//! payload.

use crate::Error;

pub const HEADER_LEN: usize = 12;
pub const VERSION: u16 = 1;
/// The largest payload one PDU's 16-bit length field can announce, rounded down to the
/// 4-byte alignment every attribute keeps.
pub const MAX_PAYLOAD: usize = 65532;

/// An iSNSP function (RFC 4171 6.1): requests below 0x8000, their responses the same
/// number with the top bit set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FunctionId(pub u16);

impl FunctionId {
    pub const DEV_ATTR_REG: FunctionId = FunctionId(0x0001);
    pub const DEV_ATTR_QRY: FunctionId = FunctionId(0x0002);
    pub const DEV_GET_NEXT: FunctionId = FunctionId(0x0003);
    pub const DEV_DEREG: FunctionId = FunctionId(0x0004);
    pub const SCN_REG: FunctionId = FunctionId(0x0005);
    pub const SCN_DEREG: FunctionId = FunctionId(0x0006);
    pub const SCN_EVENT: FunctionId = FunctionId(0x0007);
    pub const SCN: FunctionId = FunctionId(0x0008);
    pub const DD_REG: FunctionId = FunctionId(0x0009);
    pub const DD_DEREG: FunctionId = FunctionId(0x000a);
    pub const DDS_REG: FunctionId = FunctionId(0x000b);
    pub const DDS_DEREG: FunctionId = FunctionId(0x000c);
    pub const ESI: FunctionId = FunctionId(0x000d);
    pub const HEARTBEAT: FunctionId = FunctionId(0x000e);

    pub const fn is_response(self) -> bool {
        self.0 & 0x8000 != 0
    }

    /// The response to this request (DevAttrReg → DevAttrRegRsp, 0x8001).
    pub const fn response(self) -> FunctionId {
        FunctionId(self.0 | 0x8000)
    }

    /// The RFC's short name, for logs.
    pub fn name(self) -> String {
        let base = match self.0 & 0x7fff {
            0x0001 => "DevAttrReg",
            0x0002 => "DevAttrQry",
            0x0003 => "DevGetNext",
            0x0004 => "DevDereg",
            0x0005 => "SCNReg",
            0x0006 => "SCNDereg",
            0x0007 => "SCNEvent",
            0x0008 => "SCN",
            0x0009 => "DDReg",
            0x000a => "DDDereg",
            0x000b => "DDSReg",
            0x000c => "DDSDereg",
            0x000d => "ESI",
            0x000e => "Heartbeat",
            _ => return format!("function 0x{:04x}", self.0),
        };
        if self.is_response() {
            format!("{base}Rsp")
        } else {
            base.to_owned()
        }
    }
}

/// The header's flags (RFC 4171 5.1.4; the RFC numbers bits from the most significant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u16);

impl Flags {
    pub const CLIENT: u16 = 0x8000;
    pub const SERVER: u16 = 0x4000;
    pub const AUTH: u16 = 0x2000;
    pub const REPLACE: u16 = 0x1000;
    pub const LAST_PDU: u16 = 0x0800;
    pub const FIRST_PDU: u16 = 0x0400;

    pub const fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub function: FunctionId,
    /// Payload bytes after the header.
    pub length: u16,
    pub flags: Flags,
    pub xid: u16,
    pub seq: u16,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        for (i, v) in [
            self.version,
            self.function.0,
            self.length,
            self.flags.0,
            self.xid,
            self.seq,
        ]
        .into_iter()
        .enumerate()
        {
            b[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
        }
        b
    }

    /// Any 12 bytes are a header; only the version is refused here.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, Error> {
        let w = |i: usize| u16::from_be_bytes([b[2 * i], b[2 * i + 1]]);
        let h = Header {
            version: w(0),
            function: FunctionId(w(1)),
            length: w(2),
            flags: Flags(w(3)),
            xid: w(4),
            seq: w(5),
        };
        if h.version != VERSION {
            return Err(Error::Version(h.version));
        }
        Ok(h)
    }
}

/// A PDU's header, its payload, its authentication block (when the AUTH flag announces
/// one: the bytes after the payload, RFC 4171 5.5), and how many bytes of the stream it
/// took.
pub type Split<'a> = (Header, &'a [u8], Option<&'a [u8]>, usize);

/// One PDU taken off the front of a byte stream: `Ok(None)` until it is all there.
pub fn split_pdu(buf: &[u8]) -> Result<Option<Split<'_>>, Error> {
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let h = Header::decode(head)?;
    let end = HEADER_LEN + usize::from(h.length);
    if buf.len() < end {
        return Ok(None);
    }
    if !h.flags.has(Flags::AUTH) {
        return Ok(Some((h, &buf[HEADER_LEN..end], None, end)));
    }
    let Some(lead) = buf[end..].first_chunk::<8>() else {
        return Ok(None);
    };
    let total = end + crate::auth::AuthBlock::peek_len(lead)?;
    if buf.len() < total {
        return Ok(None);
    }
    Ok(Some((
        h,
        &buf[HEADER_LEN..end],
        Some(&buf[end..total]),
        total,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let h = Header {
            version: 1,
            function: FunctionId::DEV_ATTR_QRY,
            length: 0x0123,
            flags: Flags(Flags::CLIENT | Flags::FIRST_PDU | Flags::LAST_PDU),
            xid: 0xbeef,
            seq: 2,
        };
        let b = h.encode();
        assert_eq!(
            b,
            [0, 1, 0, 2, 0x01, 0x23, 0x8c, 0x00, 0xbe, 0xef, 0, 2],
            "fields in RFC order, big-endian"
        );
        assert_eq!(Header::decode(&b), Ok(h));
        let mut v2 = b;
        v2[1] = 2;
        assert_eq!(Header::decode(&v2), Err(Error::Version(2)));
    }

    #[test]
    fn names() {
        assert_eq!(FunctionId::DEV_ATTR_REG.response(), FunctionId(0x8001));
        assert_eq!(FunctionId(0x8001).name(), "DevAttrRegRsp");
        assert_eq!(FunctionId::ESI.name(), "ESI");
        assert_eq!(FunctionId(0x0042).name(), "function 0x0042");
    }

    #[test]
    fn split_waits_for_whole_pdu() {
        let h = Header {
            version: 1,
            function: FunctionId::SCN,
            length: 8,
            flags: Flags(0),
            xid: 1,
            seq: 0,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&[0; 7]);
        assert_eq!(split_pdu(&b), Ok(None));
        b.push(0);
        b.push(9);
        let (got, payload, auth, used) = split_pdu(&b).unwrap().unwrap();
        assert_eq!((got, payload.len(), auth, used), (h, 8, None, 20));
    }
}
