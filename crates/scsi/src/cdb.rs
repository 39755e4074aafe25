//! Field extraction from CDBs and building blocks for parameter data; public are the
//! pieces a transport needs without emulating the command itself.

use crate::opcodes::{
    READ_16, WRITE_10, WRITE_12, WRITE_16, WRITE_6, WRITE_VERIFY_10, WRITE_VERIFY_12,
    WRITE_VERIFY_16,
};
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

/// The LBA of a plain write (WRITE and WRITE AND VERIFY 6/10/12/16); `None` for any other
/// command or a CDB too short to hold it.
pub fn write_lba(cdb: &[u8]) -> Option<u64> {
    let be = |r: std::ops::Range<usize>| {
        cdb.get(r)
            .map(|b| b.iter().fold(0u64, |a, &x| (a << 8) | x as u64))
    };
    match *cdb.first()? {
        WRITE_6 => be(1..4).map(|v| v & 0x1f_ffff),
        WRITE_10 | WRITE_VERIFY_10 | WRITE_12 | WRITE_VERIFY_12 => be(2..6),
        WRITE_16 | WRITE_VERIFY_16 => be(2..10),
        _ => None,
    }
}

/// READ(16) of `blocks` blocks from `lba`, no flags.
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = READ_16;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_lba_of_every_plain_write() {
        assert_eq!(write_lba(&[0x0a, 0xff, 0x12, 0x34, 1, 0]), Some(0x1f_1234));
        for op in [0x2a, 0x2e] {
            let cdb = [op, 0, 0x01, 0x02, 0x03, 0x04, 0, 0, 8, 0];
            assert_eq!(write_lba(&cdb), Some(0x0102_0304));
        }
        for op in [0xaa, 0xae] {
            let cdb = [op, 0, 0, 0, 0x10, 0x00, 0, 0, 0, 8, 0, 0];
            assert_eq!(write_lba(&cdb), Some(0x1000));
        }
        for op in [0x8a, 0x8e] {
            let mut cdb = [0u8; 16];
            cdb[0] = op;
            cdb[2..10].copy_from_slice(&0x0123_4567_89ab_cdefu64.to_be_bytes());
            assert_eq!(write_lba(&cdb), Some(0x0123_4567_89ab_cdef));
        }
    }

    #[test]
    fn write_lba_is_none_for_other_or_short_cdbs() {
        // READ(10), WRITE SAME(16), COMPARE AND WRITE: not plain writes.
        assert_eq!(write_lba(&[0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0]), None);
        assert_eq!(write_lba(&[0x93; 16]), None);
        assert_eq!(write_lba(&[0x89; 16]), None);
        assert_eq!(write_lba(&[]), None);
        assert_eq!(write_lba(&[0x8a, 0, 1, 2, 3]), None);
        assert_eq!(write_lba(&[0x0a, 0, 0]), None);
    }

    #[test]
    fn read16_round_trips_through_the_decoder() {
        let cdb = read16(0x0123_4567_89ab_cdef, 0x8000_0001);
        assert_eq!(cdb[0], 0x88);
        let r = block_range(&cdb);
        assert_eq!(
            (r.lba, r.blocks, r.flags),
            (0x0123_4567_89ab_cdef, 0x8000_0001, 0)
        );
        assert_eq!(&cdb[14..], &[0, 0]);
    }
}
