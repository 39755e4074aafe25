//! The answers the initiator decodes (the CDBs it builds are `scsi_proto::cdb`'s).

use serde::Serialize;

/// SCSI's sense data, as the vocabulary declares it: the initiator parses and prints the
/// target's through the same type the target builds it with.
pub use scsi_proto::Sense;

/// Provisioning status of a run of blocks (SBC-4 GET LBA STATUS descriptor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provisioning {
    Mapped,
    Deallocated,
    Anchored,
}

/// One descriptor of GET LBA STATUS data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LbaStatus {
    pub lba: u64,
    pub blocks: u32,
    pub status: Provisioning,
}

pub fn parse_lba_status(b: &[u8]) -> Vec<LbaStatus> {
    let Some(n) = b
        .get(..4)
        .map(|l| u32::from_be_bytes(l.try_into().unwrap()) as usize)
    else {
        return Vec::new();
    };
    let end = (4 + n).min(b.len());
    b.get(8..end)
        .unwrap_or_default()
        .chunks_exact(16)
        .map(|d| LbaStatus {
            lba: u64::from_be_bytes(d[..8].try_into().unwrap()),
            blocks: u32::from_be_bytes(d[8..12].try_into().unwrap()),
            status: match d[12] & 0x0f {
                1 => Provisioning::Deallocated,
                2 => Provisioning::Anchored,
                // Reserved codes: taken as holding data, the safe reading for a copy.
                _ => Provisioning::Mapped,
            },
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capacity {
    pub blocks: u64,
    pub block_size: u32,
}

impl Capacity {
    pub fn bytes(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }

    pub fn parse16(b: &[u8]) -> Option<Capacity> {
        if b.len() < 12 {
            return None;
        }
        let last = u64::from_be_bytes(b[0..8].try_into().ok()?);
        let bs = u32::from_be_bytes(b[8..12].try_into().ok()?);
        Some(Capacity {
            blocks: last.checked_add(1)?,
            block_size: bs,
        })
    }

    pub fn parse10(b: &[u8]) -> Option<Capacity> {
        if b.len() < 8 {
            return None;
        }
        let last = u32::from_be_bytes(b[0..4].try_into().ok()?);
        let bs = u32::from_be_bytes(b[4..8].try_into().ok()?);
        Some(Capacity {
            blocks: u64::from(last) + 1,
            block_size: bs,
        })
    }
}

/// Standard INQUIRY data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Inquiry {
    pub peripheral_qualifier: u8,
    pub device_type: u8,
    pub device_type_name: &'static str,
    pub removable: bool,
    pub version: u8,
    pub vendor: String,
    pub product: String,
    pub revision: String,
}

impl Inquiry {
    pub fn parse(b: &[u8]) -> Option<Inquiry> {
        if b.len() < 36 {
            return None;
        }
        let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&b[r]).trim().to_owned();
        Some(Inquiry {
            peripheral_qualifier: b[0] >> 5,
            device_type: b[0] & 0x1f,
            device_type_name: device_type_name(b[0] & 0x1f),
            removable: b[1] & 0x80 != 0,
            version: b[2],
            vendor: text(8..16),
            product: text(16..32),
            revision: text(32..36),
        })
    }
}

pub fn device_type_name(t: u8) -> &'static str {
    match t {
        0x00 => "disk",
        0x01 => "tape",
        0x05 => "cd/dvd",
        0x07 => "optical",
        0x0c => "storage array controller",
        0x0d => "enclosure",
        0x1f => "unknown/no device",
        _ => "other",
    }
}

/// LUNs of a REPORT LUNS answer, single-level ones only.
pub fn parse_report_luns(b: &[u8]) -> Vec<u16> {
    if b.len() < 8 {
        return Vec::new();
    }
    let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    b[8..]
        .chunks_exact(8)
        .take(len / 8)
        .filter_map(|c| scsi_proto::lun::from_wire(u64::from_be_bytes(c.try_into().ok()?)))
        .collect()
}

/// Unit serial number (VPD 0x80).
pub fn parse_vpd80(b: &[u8]) -> Option<String> {
    if b.len() < 4 || b[1] != 0x80 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([b[2], b[3]]));
    let s = b.get(4..4 + len).unwrap_or(&b[4..]);
    Some(String::from_utf8_lossy(s).trim().to_owned())
}

/// Designation descriptors (VPD 0x83) as `type:value` strings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Designator {
    pub kind: &'static str,
    pub association: &'static str,
    pub value: String,
}

pub fn parse_vpd83(b: &[u8]) -> Vec<Designator> {
    let mut out = Vec::new();
    if b.len() < 4 || b[1] != 0x83 {
        return out;
    }
    let end = (4 + usize::from(u16::from_be_bytes([b[2], b[3]]))).min(b.len());
    let mut i = 4;
    while i + 4 <= end {
        let code_set = b[i] & 0xf;
        let assoc = (b[i + 1] >> 4) & 3;
        let ty = b[i + 1] & 0xf;
        let len = usize::from(b[i + 3]);
        let Some(v) = b.get(i + 4..i + 4 + len) else {
            break;
        };
        let value = if code_set == 1 {
            v.iter().map(|x| format!("{x:02x}")).collect()
        } else {
            String::from_utf8_lossy(v)
                .trim_end_matches('\0')
                .trim()
                .to_owned()
        };
        out.push(Designator {
            kind: match ty {
                0 => "vendor",
                1 => "t10",
                2 => "eui64",
                3 => "naa",
                4 => "relative-port",
                5 => "target-port-group",
                6 => "lu-group",
                7 => "md5",
                8 => "scsi-name",
                _ => "other",
            },
            association: match assoc {
                0 => "lun",
                1 => "port",
                2 => "target",
                _ => "reserved",
            },
            value,
        });
        i += 4 + len;
    }
    out
}

/// Block limits (VPD 0xB0), in blocks; 0 means "no limit reported".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockLimits {
    pub max_transfer_blocks: u32,
    pub optimal_transfer_blocks: u32,
    pub optimal_granularity_blocks: u16,
    pub max_unmap_blocks: u32,
    /// Not in `rsv inq --json`, whose fields stay as they were.
    #[serde(skip)]
    pub max_unmap_descriptors: u32,
    #[serde(skip)]
    pub max_write_same_blocks: u64,
}

pub fn parse_vpd_b0(b: &[u8]) -> Option<BlockLimits> {
    if b.len() < 16 || b[1] != 0xb0 {
        return None;
    }
    let u32at = |o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_be_bytes(s.try_into().unwrap()))
            .unwrap_or(0)
    };
    Some(BlockLimits {
        optimal_granularity_blocks: u16::from_be_bytes([b[6], b[7]]),
        max_transfer_blocks: u32at(8),
        optimal_transfer_blocks: u32at(12),
        max_unmap_blocks: u32at(20),
        max_unmap_descriptors: u32at(24),
        max_write_same_blocks: b
            .get(36..44)
            .map_or(0, |s| u64::from_be_bytes(s.try_into().unwrap())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sense_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x06;
        fixed[12] = 0x29;
        let s = Sense::parse(&fixed).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (6, 0x29, 0));
        let desc = [0x72, 0x05, 0x25, 0x00, 0, 0, 0, 0];
        assert!(Sense::parse(&desc).unwrap().is_lun_not_supported());
        assert_eq!(Sense::parse(&[0x00]), None);
    }

    #[test]
    fn capacity_and_luns() {
        let mut b = [0u8; 32];
        b[7] = 0xff;
        b[10] = 0x02;
        let c = Capacity::parse16(&b).unwrap();
        assert_eq!(c.blocks, 256);
        assert_eq!(c.block_size, 512);
        let mut r = vec![0, 0, 0, 16, 0, 0, 0, 0];
        r.extend_from_slice(&scsi_proto::lun::to_wire(0).to_be_bytes());
        r.extend_from_slice(&scsi_proto::lun::to_wire(300).to_be_bytes());
        assert_eq!(parse_report_luns(&r), vec![0, 300]);
    }
}
