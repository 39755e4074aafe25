//! Field extraction from CDBs and building blocks for parameter data.

use crate::sense::{self, Sense};

pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(crate) fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Expected CDB length of an opcode, from its group code (SPC-5 4.2.5.1).
pub(crate) fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Fails unless the CDB holds at least the bytes its opcode's group defines.
pub(crate) fn check_len(cdb: &[u8]) -> Result<(), Sense> {
    match cdb.first().and_then(|&op| cdb_len(op)) {
        Some(n) if cdb.len() >= n => Ok(()),
        Some(_) => Err(Sense::invalid_field_in_cdb(0, None)),
        None => Err(sense::INVALID_COMMAND_OPERATION_CODE),
    }
}

/// Cuts data to the allocation length.
pub(crate) fn truncate(mut data: Vec<u8>, alloc: usize) -> Vec<u8> {
    data.truncate(alloc);
    data
}

/// Pads or cuts an ASCII string to a fixed-width, space-filled field.
pub(crate) fn ascii_field(s: &str, width: usize) -> Vec<u8> {
    let mut out: Vec<u8> = s
        .bytes()
        .map(|b| if (0x20..=0x7e).contains(&b) { b } else { b' ' })
        .take(width)
        .collect();
    out.resize(width, b' ');
    out
}

/// A block-addressed command's LBA, length and flag byte, decoded by CDB size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockRange {
    pub lba: u64,
    pub blocks: u64,
    /// CDB byte 1 (protect fields, DPO, FUA, BYTCHK...).
    pub flags: u8,
}

pub(crate) fn rw6(cdb: &[u8]) -> BlockRange {
    let lba = be24(&cdb[1..4]) as u64 & 0x1f_ffff;
    let blocks = if cdb[4] == 0 { 256 } else { cdb[4] as u64 };
    BlockRange {
        lba,
        blocks,
        flags: 0,
    }
}

pub(crate) fn rw10(cdb: &[u8]) -> BlockRange {
    BlockRange {
        lba: be32(&cdb[2..6]) as u64,
        blocks: be16(&cdb[7..9]) as u64,
        flags: cdb[1],
    }
}

pub(crate) fn rw12(cdb: &[u8]) -> BlockRange {
    BlockRange {
        lba: be32(&cdb[2..6]) as u64,
        blocks: be32(&cdb[6..10]) as u64,
        flags: cdb[1],
    }
}

pub(crate) fn rw16(cdb: &[u8]) -> BlockRange {
    BlockRange {
        lba: be64(&cdb[2..10]),
        blocks: be32(&cdb[10..14]) as u64,
        flags: cdb[1],
    }
}

/// Decodes the range of any READ/WRITE/VERIFY/WRITE AND VERIFY/PRE-FETCH/SYNCHRONIZE
/// CACHE/WRITE SAME/ORWRITE CDB by its size.
pub(crate) fn block_range(cdb: &[u8]) -> BlockRange {
    match cdb_len(cdb[0]) {
        Some(6) => rw6(cdb),
        Some(10) => rw10(cdb),
        Some(12) => rw12(cdb),
        _ => rw16(cdb),
    }
}
