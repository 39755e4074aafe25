//! iSNS attributes (RFC 4171 5.6, 6): a 4-byte tag, a 4-byte length, a value padded to a
//! multiple of 4 bytes. Values are kept as their bytes so that any attribute, known or
//! not, decodes and encodes back the same; typed constructors and readers sit on top.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::Error;

/// Attribute tags (RFC 4171 6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u32);

impl Tag {
    pub const DELIMITER: Tag = Tag(0);
    pub const ENTITY_ID: Tag = Tag(1);
    pub const ENTITY_PROTOCOL: Tag = Tag(2);
    pub const MGMT_IP: Tag = Tag(3);
    pub const TIMESTAMP: Tag = Tag(4);
    pub const PROTOCOL_VERSION_RANGE: Tag = Tag(5);
    pub const REGISTRATION_PERIOD: Tag = Tag(6);
    pub const ENTITY_INDEX: Tag = Tag(7);
    pub const ENTITY_NEXT_INDEX: Tag = Tag(8);
    pub const PORTAL_IP: Tag = Tag(16);
    pub const PORTAL_PORT: Tag = Tag(17);
    pub const PORTAL_SYMBOLIC_NAME: Tag = Tag(18);
    pub const ESI_INTERVAL: Tag = Tag(19);
    pub const ESI_PORT: Tag = Tag(20);
    pub const PORTAL_INDEX: Tag = Tag(22);
    pub const SCN_PORT: Tag = Tag(23);
    pub const PORTAL_NEXT_INDEX: Tag = Tag(24);
    pub const PORTAL_SECURITY_BITMAP: Tag = Tag(27);
    pub const ISCSI_NAME: Tag = Tag(32);
    pub const ISCSI_NODE_TYPE: Tag = Tag(33);
    pub const ISCSI_ALIAS: Tag = Tag(34);
    pub const ISCSI_SCN_BITMAP: Tag = Tag(35);
    pub const ISCSI_NODE_INDEX: Tag = Tag(36);
    pub const WWNN_TOKEN: Tag = Tag(37);
    pub const ISCSI_NODE_NEXT_INDEX: Tag = Tag(38);
    pub const ISCSI_AUTH_METHOD: Tag = Tag(42);
    pub const PG_ISCSI_NAME: Tag = Tag(48);
    pub const PG_PORTAL_IP: Tag = Tag(49);
    pub const PG_PORTAL_PORT: Tag = Tag(50);
    pub const PG_TAG: Tag = Tag(51);
    pub const PG_INDEX: Tag = Tag(52);
    pub const PG_NEXT_INDEX: Tag = Tag(53);

    /// How many value bytes the tag takes when not empty (a query names attributes with
    /// empty values); `None` for variable-length values.
    pub fn fixed_len(self) -> Option<usize> {
        match self.0 {
            2 | 5..=8 | 17 | 19 | 20 | 22..=24 | 27 | 33 | 35 | 36 | 38 | 50..=53 => Some(4),
            4 | 37 => Some(8),
            3 | 16 | 49 => Some(16),
            _ => None,
        }
    }
}

/// Entity Protocol values (RFC 4171 6.2.2).
pub mod protocol {
    pub const NONE: u32 = 1;
    pub const ISCSI: u32 = 2;
    pub const IFCP: u32 = 3;
}

/// iSCSI Node Type bits (RFC 4171 6.4.2).
pub mod node_type {
    pub const TARGET: u32 = 1;
    pub const INITIATOR: u32 = 2;
    pub const CONTROL: u32 = 4;
}

/// iSCSI SCN Bitmap bits (RFC 4171 6.4.4).
pub mod scn {
    pub const DD_MEMBER_ADDED: u32 = 0x01;
    pub const DD_MEMBER_REMOVED: u32 = 0x02;
    pub const OBJECT_UPDATED: u32 = 0x04;
    pub const OBJECT_ADDED: u32 = 0x08;
    pub const OBJECT_REMOVED: u32 = 0x10;
    pub const MANAGEMENT: u32 = 0x20;
    pub const TARGET_AND_SELF_ONLY: u32 = 0x40;
    pub const INITIATOR_AND_SELF_ONLY: u32 = 0x80;
}

/// The UDP bit of a Portal TCP/UDP Port value (RFC 4171 6.3.2): set for UDP, clear for
/// TCP; the port is the low 16 bits.
pub const PORT_UDP: u32 = 0x1_0000;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attr {
    pub tag: Tag,
    /// The value as on the wire, padding included (always a multiple of 4 bytes).
    pub value: Vec<u8>,
}

impl Attr {
    /// An attribute without a value: the delimiter, or a name in a query's operating
    /// attributes.
    pub fn empty(tag: Tag) -> Attr {
        Attr {
            tag,
            value: Vec::new(),
        }
    }

    pub fn u32(tag: Tag, v: u32) -> Attr {
        Attr {
            tag,
            value: v.to_be_bytes().to_vec(),
        }
    }

    pub fn u64(tag: Tag, v: u64) -> Attr {
        Attr {
            tag,
            value: v.to_be_bytes().to_vec(),
        }
    }

    /// A UTF-8 string: NUL-terminated, then padded to 4 bytes with NULs.
    pub fn string(tag: Tag, s: &str) -> Attr {
        let mut value = s.as_bytes().to_vec();
        value.push(0);
        value.resize(value.len().next_multiple_of(4), 0);
        Attr { tag, value }
    }

    /// 16 bytes: IPv6, or IPv4 mapped into IPv6 (`::ffff:a.b.c.d`).
    pub fn ip(tag: Tag, ip: IpAddr) -> Attr {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Attr {
            tag,
            value: v6.octets().to_vec(),
        }
    }

    /// A TCP port in a Portal TCP/UDP Port value.
    pub fn tcp_port(tag: Tag, port: u16) -> Attr {
        Attr::u32(tag, u32::from(port))
    }

    pub fn is_delimiter(&self) -> bool {
        self.tag == Tag::DELIMITER
    }

    pub fn as_u32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.value.as_slice().try_into().ok()?))
    }

    pub fn as_u64(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.value.as_slice().try_into().ok()?))
    }

    /// The string up to its first NUL; `None` if that is not UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        let end = self
            .value
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.value.len());
        std::str::from_utf8(&self.value[..end]).ok()
    }

    /// An IPv4-mapped address comes back as IPv4, and so does an IPv4-compatible one
    /// (`::a.b.c.d`, which open-isns's isnsadm sends) other than `::` and `::1`.
    pub fn as_ip(&self) -> Option<IpAddr> {
        let b: [u8; 16] = self.value.as_slice().try_into().ok()?;
        let v6 = Ipv6Addr::from(b);
        Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None if b[..12] == [0; 12] && u32::from_be_bytes([b[12], b[13], b[14], b[15]]) > 1 => {
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
            }
            None => IpAddr::V6(v6),
        })
    }

    /// `(port, udp)` of a Portal TCP/UDP Port value.
    pub fn as_port(&self) -> Option<(u16, bool)> {
        let v = self.as_u32()?;
        Some((v as u16, v & PORT_UDP != 0))
    }

    pub fn encoded_len(&self) -> usize {
        8 + self.value.len()
    }

    /// Appends tag, length and value. A value of unaligned length (only by building
    /// `Attr` by hand) is padded with zeros.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let len = self.value.len().next_multiple_of(4);
        out.extend_from_slice(&self.tag.0.to_be_bytes());
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend_from_slice(&self.value);
        out.resize(out.len() + len - self.value.len(), 0);
    }

    /// One attribute off the front of `b`, and the bytes after it.
    pub fn decode(b: &[u8]) -> Result<(Attr, &[u8]), Error> {
        let (Some(t), Some(l)) = (b.first_chunk::<4>(), b.get(4..8)) else {
            return Err(Error::Truncated {
                tag: b.first_chunk::<4>().map_or(0, |t| u32::from_be_bytes(*t)),
                len: 0,
            });
        };
        let tag = u32::from_be_bytes(*t);
        let len = u32::from_be_bytes(l.try_into().expect("4 bytes"));
        if len % 4 != 0 {
            return Err(Error::Unaligned { tag, len });
        }
        let rest = &b[8..];
        if len as usize > rest.len() {
            return Err(Error::Truncated { tag, len });
        }
        let (value, rest) = rest.split_at(len as usize);
        let tag = Tag(tag);
        if let Some(want) = tag.fixed_len() {
            if !value.is_empty() && value.len() != want {
                return Err(Error::BadLength {
                    tag: tag.0,
                    len,
                    want: match want {
                        4 => "4",
                        8 => "8",
                        _ => "16",
                    },
                });
            }
        }
        if tag == Tag::DELIMITER && !value.is_empty() {
            return Err(Error::BadLength {
                tag: 0,
                len,
                want: "0",
            });
        }
        Ok((
            Attr {
                tag,
                value: value.to_vec(),
            },
            rest,
        ))
    }

    /// Every attribute of a payload, in order.
    pub fn decode_all(mut b: &[u8]) -> Result<Vec<Attr>, Error> {
        let mut out = Vec::new();
        while !b.is_empty() {
            let (a, rest) = Attr::decode(b)?;
            out.push(a);
            b = rest;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(a: &Attr) -> Vec<u8> {
        let mut v = Vec::new();
        a.encode(&mut v);
        v
    }

    #[test]
    fn string_is_nul_terminated_and_padded() {
        let a = Attr::string(Tag::ISCSI_NAME, "iqn.x");
        assert_eq!(
            wire(&a),
            [0, 0, 0, 32, 0, 0, 0, 8, b'i', b'q', b'n', b'.', b'x', 0, 0, 0]
        );
        // Four characters still need their NUL: eight bytes.
        assert_eq!(Attr::string(Tag::ISCSI_ALIAS, "abcd").value.len(), 8);
        assert_eq!(Attr::string(Tag::ISCSI_ALIAS, "").value, vec![0; 4]);
        assert_eq!(a.as_str(), Some("iqn.x"));
    }

    #[test]
    fn ipv4_is_mapped_into_16_bytes() {
        let a = Attr::ip(Tag::PORTAL_IP, "10.1.2.3".parse().unwrap());
        assert_eq!(
            a.value,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3]
        );
        assert_eq!(a.as_ip(), Some("10.1.2.3".parse().unwrap()));
        let v6 = Attr::ip(Tag::PORTAL_IP, "fd00::1".parse().unwrap());
        assert_eq!(v6.as_ip(), Some("fd00::1".parse().unwrap()));
        let lo6 = Attr::ip(Tag::PORTAL_IP, "::1".parse().unwrap());
        assert_eq!(lo6.as_ip(), Some("::1".parse().unwrap()));
        let compat = Attr::ip(Tag::PORTAL_IP, "::127.0.0.1".parse().unwrap());
        assert_eq!(compat.as_ip(), Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn port_and_udp_bit() {
        let a = Attr::tcp_port(Tag::PORTAL_PORT, 3260);
        assert_eq!(a.value, [0, 0, 0x0c, 0xbc]);
        assert_eq!(a.as_port(), Some((3260, false)));
        assert_eq!(
            Attr::u32(Tag::PORTAL_PORT, PORT_UDP | 3205).as_port(),
            Some((3205, true))
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            Attr::decode(&[0, 0, 0, 32, 0, 0, 0, 5, 1, 2, 3, 4, 5, 0, 0, 0]),
            Err(Error::Unaligned { tag: 32, len: 5 })
        ));
        assert!(matches!(
            Attr::decode(&[0, 0, 0, 32, 0, 0, 0, 8, 1, 2, 3, 4]),
            Err(Error::Truncated { tag: 32, len: 8 })
        ));
        assert!(matches!(
            Attr::decode(&[0, 0, 0, 33, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(Error::BadLength { tag: 33, .. })
        ));
        assert!(Attr::decode(&[0, 0, 0]).is_err());
        assert!(Attr::decode(&[0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0]).is_err());
        // A huge length must not be trusted.
        assert!(Attr::decode(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfc]).is_err());
    }

    #[test]
    fn empty_values_are_allowed_for_fixed_tags() {
        let (a, rest) = Attr::decode(&[0, 0, 0, 33, 0, 0, 0, 0, 9]).unwrap();
        assert_eq!(a, Attr::empty(Tag::ISCSI_NODE_TYPE));
        assert_eq!(rest, [9]);
        assert_eq!(a.as_u32(), None);
    }
}
