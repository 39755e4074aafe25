//! A sans-IO reader of capture files: classic pcap (either byte order, micro- or
//! nanosecond timestamps) and pcapng (section header, interface description, enhanced and
//! simple packet blocks; other blocks are skipped). It works on the file's bytes in memory.

use std::fmt;

/// One captured frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Capture time, nanoseconds since the Unix epoch (0 where the format gives none).
    pub ts_ns: u64,
    /// The link type (LINKTYPE_* of tcpdump.org) of the interface it was captured on.
    pub linktype: u32,
    /// The bytes captured (at most the snapshot length).
    pub data: &'a [u8],
    /// The frame's length on the wire.
    pub orig_len: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapError(pub String);

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PcapError {}

fn err<T>(s: impl Into<String>) -> Result<T, PcapError> {
    Err(PcapError(s.into()))
}

#[derive(Clone, Copy)]
struct Endian(bool); // true: big

impl Endian {
    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let x: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
        Some(if self.0 {
            u16::from_be_bytes(x)
        } else {
            u16::from_le_bytes(x)
        })
    }
    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let x: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        Some(if self.0 {
            u32::from_be_bytes(x)
        } else {
            u32::from_le_bytes(x)
        })
    }
}

/// Every frame of a capture file (classic pcap or pcapng), in file order. A file cut short
/// mid-record (a capture still being written, or killed) yields the frames before the cut.
pub fn frames(buf: &[u8]) -> Result<Vec<Frame<'_>>, PcapError> {
    let Some(magic) = buf.get(0..4) else {
        return err("not a capture file: shorter than 4 bytes");
    };
    match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] => classic(buf, Endian(false), 1_000),
        [0xa1, 0xb2, 0xc3, 0xd4] => classic(buf, Endian(true), 1_000),
        [0x4d, 0x3c, 0xb2, 0xa1] => classic(buf, Endian(false), 1),
        [0xa1, 0xb2, 0x3c, 0x4d] => classic(buf, Endian(true), 1),
        [0x0a, 0x0d, 0x0d, 0x0a] => pcapng(buf),
        _ => err(format!(
            "not a pcap or pcapng file (starts {:02x}{:02x}{:02x}{:02x})",
            magic[0], magic[1], magic[2], magic[3]
        )),
    }
}

fn classic(buf: &[u8], e: Endian, ns_per_unit: u64) -> Result<Vec<Frame<'_>>, PcapError> {
    if buf.len() < 24 {
        return err("pcap: file header cut short");
    }
    let linktype = e.u32(buf, 20).unwrap_or(0) & 0x0fff_ffff;
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= buf.len() {
        let sec = u64::from(e.u32(buf, at).unwrap_or(0));
        let frac = u64::from(e.u32(buf, at + 4).unwrap_or(0));
        let incl = e.u32(buf, at + 8).unwrap_or(0) as usize;
        let orig = e.u32(buf, at + 12).unwrap_or(0);
        let Some(data) = buf.get(at + 16..at + 16 + incl) else {
            break;
        };
        out.push(Frame {
            ts_ns: sec * 1_000_000_000 + frac * ns_per_unit,
            linktype,
            data,
            orig_len: orig,
        });
        at += 16 + incl;
    }
    Ok(out)
}

struct Iface {
    linktype: u32,
    /// Nanoseconds per timestamp unit, as a numerator/denominator pair.
    tick_num: u64,
    tick_den: u64,
    snaplen: u32,
}

fn pcapng(buf: &[u8]) -> Result<Vec<Frame<'_>>, PcapError> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut e = Endian(false);
    let mut ifaces: Vec<Iface> = Vec::new();
    while at + 12 <= buf.len() {
        let raw_type = &buf[at..at + 4];
        if raw_type == [0x0a, 0x0d, 0x0d, 0x0a] {
            // Section header: the byte-order magic says how to read the rest.
            e = match buf.get(at + 8..at + 12) {
                Some([0x1a, 0x2b, 0x3c, 0x4d]) => Endian(true),
                Some([0x4d, 0x3c, 0x2b, 0x1a]) => Endian(false),
                _ => return err("pcapng: bad byte-order magic"),
            };
            ifaces.clear();
        }
        let btype = e.u32(buf, at).unwrap_or(0);
        let len = e.u32(buf, at + 4).unwrap_or(0) as usize;
        if len < 12 || !len.is_multiple_of(4) {
            return err(format!("pcapng: bad block length {len} at byte {at}"));
        }
        let Some(block) = buf.get(at..at + len) else {
            break; // cut short
        };
        let body = &block[8..len - 4];
        match btype {
            1 => {
                // Interface description: linktype, reserved, snaplen, options.
                let linktype = u32::from(e.u16(body, 0).unwrap_or(0));
                let snaplen = e.u32(body, 4).unwrap_or(0);
                let (mut num, mut den) = (1_000u64, 1u64); // default: microseconds
                let mut o = 8;
                while o + 4 <= body.len() {
                    let code = e.u16(body, o).unwrap_or(0);
                    let olen = e.u16(body, o + 2).unwrap_or(0) as usize;
                    if code == 0 {
                        break;
                    }
                    if code == 9 && olen >= 1 {
                        let r = body[o + 4];
                        let (n, d) = if r & 0x80 != 0 {
                            (
                                1_000_000_000u64,
                                1u64.checked_shl(u32::from(r & 0x7f)).unwrap_or(0),
                            )
                        } else {
                            let p = 10u64.checked_pow(u32::from(r)).unwrap_or(0);
                            if p <= 1_000_000_000 && p > 0 {
                                (1_000_000_000 / p, 1)
                            } else {
                                (1, p / 1_000_000_000)
                            }
                        };
                        if d == 0 {
                            return err("pcapng: timestamp resolution out of range");
                        }
                        (num, den) = (n, d);
                    }
                    o += 4 + olen.div_ceil(4) * 4;
                }
                ifaces.push(Iface {
                    linktype,
                    tick_num: num,
                    tick_den: den,
                    snaplen,
                });
            }
            6 => {
                // Enhanced packet: interface, timestamp (high, low), captured, original.
                let id = e.u32(body, 0).unwrap_or(u32::MAX) as usize;
                let Some(ifc) = ifaces.get(id) else {
                    return err(format!("pcapng: packet on undescribed interface {id}"));
                };
                let ts = (u64::from(e.u32(body, 4).unwrap_or(0)) << 32)
                    | u64::from(e.u32(body, 8).unwrap_or(0));
                let cap = e.u32(body, 12).unwrap_or(0) as usize;
                let orig = e.u32(body, 16).unwrap_or(0);
                let Some(data) = body.get(20..20 + cap) else {
                    return err(format!("pcapng: packet longer than its block at byte {at}"));
                };
                out.push(Frame {
                    ts_ns: (u128::from(ts) * u128::from(ifc.tick_num) / u128::from(ifc.tick_den))
                        as u64,
                    linktype: ifc.linktype,
                    data,
                    orig_len: orig,
                });
            }
            3 => {
                // Simple packet: interface 0, no timestamp.
                let Some(ifc) = ifaces.first() else {
                    return err("pcapng: simple packet before any interface");
                };
                let orig = e.u32(body, 0).unwrap_or(0);
                let cap =
                    (orig as usize)
                        .min(body.len().saturating_sub(4))
                        .min(if ifc.snaplen == 0 {
                            usize::MAX
                        } else {
                            ifc.snaplen as usize
                        });
                out.push(Frame {
                    ts_ns: 0,
                    linktype: ifc.linktype,
                    data: &body[4..4 + cap],
                    orig_len: orig,
                });
            }
            _ => {}
        }
        at += len;
    }
    Ok(out)
}

/// A classic pcap file (little-endian, nanosecond timestamps) of `frames`: for tests and
/// for tools that write what they captured.
pub fn write_classic(linktype: u32, frames: &[(u64, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0x4d, 0x3c, 0xb2, 0xa1]);
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&0i32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&262_144u32.to_le_bytes());
    b.extend_from_slice(&linktype.to_le_bytes());
    for (ts, data) in frames {
        b.extend_from_slice(&((ts / 1_000_000_000) as u32).to_le_bytes());
        b.extend_from_slice(&((ts % 1_000_000_000) as u32).to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(data);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_round_trip_and_cut_short() {
        let f = write_classic(101, &[(1_500_000_123, b"abcd"), (2_000_000_000, b"xy")]);
        let got = frames(&f).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].ts_ns, 1_500_000_123);
        assert_eq!(got[0].data, b"abcd");
        assert_eq!(got[1].linktype, 101);
        // Cut in the middle of the second record: the first survives.
        assert_eq!(frames(&f[..f.len() - 1]).unwrap().len(), 1);
    }

    #[test]
    fn microsecond_big_endian() {
        let mut b = vec![0xa1, 0xb2, 0xc3, 0xd4, 0, 2, 0, 4];
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&65535u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&3u32.to_be_bytes());
        b.extend_from_slice(&250u32.to_be_bytes());
        b.extend_from_slice(&2u32.to_be_bytes());
        b.extend_from_slice(&60u32.to_be_bytes());
        b.extend_from_slice(b"hi");
        let got = frames(&b).unwrap();
        assert_eq!(got[0].ts_ns, 3_000_250_000);
        assert_eq!(got[0].orig_len, 60);
        assert_eq!(got[0].linktype, 1);
    }

    fn block(t: u32, body: &[u8]) -> Vec<u8> {
        let len = 12 + body.len().div_ceil(4) * 4;
        let mut b = t.to_le_bytes().to_vec();
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(body);
        b.resize(len - 4, 0);
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b
    }

    #[test]
    fn pcapng_with_nanosecond_interface() {
        let mut shb = vec![0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0];
        shb.extend_from_slice(&u64::MAX.to_le_bytes());
        let mut f = block(0x0a0d_0d0a, &shb);
        let mut idb = vec![];
        idb.extend_from_slice(&113u16.to_le_bytes());
        idb.extend_from_slice(&[0, 0]);
        idb.extend_from_slice(&0u32.to_le_bytes());
        idb.extend_from_slice(&9u16.to_le_bytes());
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&[9, 0, 0, 0]);
        idb.extend_from_slice(&[0, 0, 0, 0]);
        f.extend(block(1, &idb));
        f.extend(block(5, b"statistics, skipped"));
        let ts: u64 = 1_234_567_890_123;
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(ts as u32).to_le_bytes());
        epb.extend_from_slice(&3u32.to_le_bytes());
        epb.extend_from_slice(&3u32.to_le_bytes());
        epb.extend_from_slice(b"abc");
        f.extend(block(6, &epb));
        let got = frames(&f).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].ts_ns, ts);
        assert_eq!(got[0].linktype, 113);
        assert_eq!(got[0].data, b"abc");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(frames(b"").is_err());
        assert!(frames(b"hello world, not pcap").is_err());
        let mut f = vec![0x0a, 0x0d, 0x0d, 0x0a, 5, 0, 0, 0];
        f.extend_from_slice(&[0x4d, 0x3c, 0x2b, 0x1a]);
        assert!(frames(&f).is_err());
    }
}
