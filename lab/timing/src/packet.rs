//! Sans-IO decoding of a captured frame down to its TCP segment: Ethernet (with VLAN
//! tags), Linux cooked captures (SLL and SLL2, what `tcpdump -i any` writes), raw IP (what
//! a TUN device gives), BSD loopback; IPv4 and IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const SYN: u8 = 0x02;
pub const FIN: u8 = 0x01;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// A TCP segment as captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tcp<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// The MSS option of a SYN.
    pub mss: Option<u16>,
    /// The payload bytes captured (fewer than `payload_len` when the snapshot cut them).
    pub payload: &'a [u8],
    /// The payload's length by the IP header.
    pub payload_len: u32,
    /// The IP packet's length by its header: what it takes on a link, without framing.
    pub ip_len: u32,
}

/// The IP packet inside a frame of `linktype`, if it carries one.
fn ip_of(linktype: u32, d: &[u8]) -> Option<&[u8]> {
    match linktype {
        // Ethernet, with any 802.1Q/802.1ad tags.
        1 => {
            let mut at = 12;
            loop {
                let et = u16::from_be_bytes(d.get(at..at + 2)?.try_into().ok()?);
                match et {
                    0x8100 | 0x88a8 => at += 4,
                    0x0800 | 0x86dd => return d.get(at + 2..),
                    _ => return None,
                }
            }
        }
        // Linux cooked v1: protocol at 14, header 16.
        113 => d.get(16..),
        // Linux cooked v2: protocol at 0, header 20.
        276 => d.get(20..),
        // Raw IP (101, and the older 12/14), IPv4 (228), IPv6 (229).
        12 | 14 | 101 | 228 | 229 => Some(d),
        // BSD loopback / null: a 4-byte address family.
        0 | 108 => d.get(4..),
        _ => None,
    }
}

/// The TCP segment in a frame, or `None` for anything else (ARP, UDP, fragments, frames
/// cut before the TCP header).
pub fn tcp(linktype: u32, frame: &[u8]) -> Option<Tcp<'_>> {
    let ip = ip_of(linktype, frame)?;
    let version = ip.first()? >> 4;
    let (src, dst, l4, l4_len) = match version {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < 20 || ip.get(9)? != &6 {
                return None;
            }
            let total = usize::from(u16::from_be_bytes(ip.get(2..4)?.try_into().ok()?));
            let frag = u16::from_be_bytes(ip.get(6..8)?.try_into().ok()?);
            if frag & 0x1fff != 0 {
                return None;
            }
            let src = Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(12..16)?).ok()?);
            let dst = Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(16..20)?).ok()?);
            // A zero total length (TSO/GRO blobs on some captures): what was captured.
            let total = if total == 0 { ip.len() } else { total };
            (
                IpAddr::V4(src),
                IpAddr::V4(dst),
                ip.get(ihl..)?,
                total.checked_sub(ihl)?,
            )
        }
        6 => {
            if ip.get(6)? != &6 {
                return None;
            }
            let plen = usize::from(u16::from_be_bytes(ip.get(4..6)?.try_into().ok()?));
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(8..24)?).ok()?);
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(ip.get(24..40)?).ok()?);
            let plen = if plen == 0 {
                ip.len().saturating_sub(40)
            } else {
                plen
            };
            (IpAddr::V6(src), IpAddr::V6(dst), ip.get(40..)?, plen)
        }
        _ => return None,
    };
    let h = l4.get(..20)?;
    let off = usize::from(h[12] >> 4) * 4;
    if off < 20 || off > l4_len {
        return None;
    }
    let flags = h[13];
    let mut mss = None;
    if flags & SYN != 0 {
        let opts = l4.get(20..off).unwrap_or(&[]);
        let mut i = 0;
        while i < opts.len() {
            match opts[i] {
                0 => break,
                1 => i += 1,
                kind => {
                    let Some(&len) = opts.get(i + 1) else { break };
                    if kind == 2 && len == 4 && i + 4 <= opts.len() {
                        mss = Some(u16::from_be_bytes([opts[i + 2], opts[i + 3]]));
                    }
                    i += usize::from(len.max(2));
                }
            }
        }
    }
    let payload_len = (l4_len - off) as u32;
    let captured = l4.get(off..).unwrap_or(&[]);
    let payload = &captured[..captured.len().min(payload_len as usize)];
    let ip_hdr = match version {
        4 => usize::from(ip[0] & 0x0f) * 4,
        _ => 40,
    };
    Some(Tcp {
        src,
        dst,
        sport: u16::from_be_bytes([h[0], h[1]]),
        dport: u16::from_be_bytes([h[2], h[3]]),
        seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        ack: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
        flags,
        window: u16::from_be_bytes([h[14], h[15]]),
        mss,
        payload,
        payload_len,
        ip_len: (ip_hdr + l4_len) as u32,
    })
}

/// A raw IPv4 packet carrying a TCP segment, for tests and synthetic captures.
#[allow(clippy::too_many_arguments)]
pub fn build_ipv4_tcp(
    src: ([u8; 4], u16),
    dst: ([u8; 4], u16),
    seq: u32,
    ack: u32,
    flags: u8,
    mss: Option<u16>,
    payload: &[u8],
) -> Vec<u8> {
    let opt_len = if mss.is_some() { 4 } else { 0 };
    let tcp_len = 20 + opt_len;
    let total = 20 + tcp_len + payload.len();
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    p.extend_from_slice(&src.0);
    p.extend_from_slice(&dst.0);
    p.extend_from_slice(&src.1.to_be_bytes());
    p.extend_from_slice(&dst.1.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&ack.to_be_bytes());
    p.push(((tcp_len / 4) as u8) << 4);
    p.push(flags);
    p.extend_from_slice(&65535u16.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0]);
    if let Some(m) = mss {
        p.extend_from_slice(&[2, 4]);
        p.extend_from_slice(&m.to_be_bytes());
    }
    p.extend_from_slice(payload);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_ethernet_and_cooked_frames() {
        let ip = build_ipv4_tcp(
            ([10, 0, 0, 1], 5000),
            ([10, 0, 0, 2], 3260),
            7,
            9,
            SYN,
            Some(1460),
            b"",
        );
        let t = tcp(101, &ip).unwrap();
        assert_eq!(
            (t.sport, t.dport, t.seq, t.mss),
            (5000, 3260, 7, Some(1460))
        );
        let mut eth = vec![0u8; 12];
        eth.extend_from_slice(&[0x81, 0x00, 0, 1, 0x08, 0x00]);
        eth.extend_from_slice(&ip);
        assert_eq!(tcp(1, &eth).unwrap().seq, 7);
        let mut sll2 = vec![0x08, 0x00];
        sll2.resize(20, 0);
        sll2.extend_from_slice(&ip);
        assert_eq!(tcp(276, &sll2).unwrap().dport, 3260);
    }

    #[test]
    fn snapshot_cut_payload_keeps_its_length() {
        let ip = build_ipv4_tcp(([1; 4], 1), ([2; 4], 2), 0, 0, ACK, None, &[7u8; 1000]);
        let t = tcp(101, &ip[..100]).unwrap();
        assert_eq!(t.payload_len, 1000);
        assert_eq!(t.payload.len(), 60);
        assert_eq!(t.ip_len, 1040);
    }

    #[test]
    fn junk_is_none() {
        assert!(tcp(101, &[]).is_none());
        assert!(tcp(101, &[0x45; 30]).is_none());
        assert!(tcp(1, &[0; 14]).is_none());
        assert!(tcp(9999, &[0x45; 60]).is_none());
    }
}
