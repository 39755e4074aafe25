//! CDB fields (SPC-5 4.2): the lengths opcodes imply, the block range of the commands that
//! address blocks, and the CDBs an initiator builds.

use crate::opcodes::service_action::service_action_in_16::{GET_LBA_STATUS, READ_CAPACITY_16};
use crate::opcodes::*;
use crate::sense::{self, Sense};

/// A big-endian 16-bit field; `b` holds at least 2 bytes.
pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// A big-endian 24-bit field; `b` holds at least 3 bytes.
pub fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

/// A big-endian 32-bit field; `b` holds at least 4 bytes.
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A big-endian 64-bit field; `b` holds at least 8 bytes.
pub fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Expected CDB length of an opcode, from its group code (SPC-5 4.2.5.1).
pub fn cdb_len(opcode: u8) -> Option<usize> {
    if opcode == WRITE_COMPRESSED_16 {
        // Vendor-specific group 6, whose length is the vendor's to say.
        return Some(16);
    }
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Fails unless the CDB holds at least the bytes its opcode's group defines: after it,
/// every field of the group's layout may be indexed.
pub fn check_len(cdb: &[u8]) -> Result<(), Sense> {
    match cdb.first().and_then(|&op| cdb_len(op)) {
        Some(n) if cdb.len() >= n => Ok(()),
        Some(_) => Err(Sense::invalid_field_in_cdb(0, None)),
        None => Err(sense::INVALID_COMMAND_OPERATION_CODE),
    }
}

/// A block-addressed command's LBA, length and flag byte, decoded by CDB size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    pub lba: u64,
    pub blocks: u64,
    /// CDB byte 1 (protect fields, DPO, FUA, BYTCHK...).
    pub flags: u8,
}

fn rw6(cdb: &[u8]) -> BlockRange {
    let lba = be24(&cdb[1..4]) as u64 & 0x1f_ffff;
    let blocks = if cdb[4] == 0 { 256 } else { cdb[4] as u64 };
    BlockRange {
        lba,
        blocks,
        flags: 0,
    }
}

fn rw10(cdb: &[u8]) -> BlockRange {
    BlockRange {
        lba: be32(&cdb[2..6]) as u64,
        blocks: be16(&cdb[7..9]) as u64,
        flags: cdb[1],
    }
}

fn rw12(cdb: &[u8]) -> BlockRange {
    BlockRange {
        lba: be32(&cdb[2..6]) as u64,
        blocks: be32(&cdb[6..10]) as u64,
        flags: cdb[1],
    }
}

fn rw16(cdb: &[u8]) -> BlockRange {
    BlockRange {
        lba: be64(&cdb[2..10]),
        blocks: be32(&cdb[10..14]) as u64,
        flags: cdb[1],
    }
}

/// Decodes the range of any READ/WRITE/VERIFY/WRITE AND VERIFY/PRE-FETCH/SYNCHRONIZE
/// CACHE/WRITE SAME/ORWRITE CDB by its size; the CDB has passed [`check_len`].
pub fn block_range(cdb: &[u8]) -> BlockRange {
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

fn rw16_cdb(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// READ (16) of `blocks` blocks from `lba`, no flags.
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16_cdb(READ_16, lba, blocks)
}

/// WRITE (16) of `blocks` blocks at `lba`, no flags.
pub fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16_cdb(WRITE_16, lba, blocks)
}

/// WRITE (16) with FUA: the target acknowledges only once the data is on stable storage.
pub fn write16_fua(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = write16(lba, blocks);
    c[1] = 0x08;
    c
}

/// WRITE COMPRESSED (16) (Reservoir's, vendor-specific): WRITE (16)'s fields, FUA
/// included; the Data-Out is one zstd frame that decompresses to exactly the blocks.
pub fn write_compressed16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = rw16_cdb(WRITE_COMPRESSED_16, lba, blocks);
    if fua {
        c[1] = 0x08;
    }
    c
}

/// WRITE SAME (16) of the one block sent as data, without UNMAP.
pub fn write_same16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16_cdb(WRITE_SAME_16, lba, blocks)
}

/// INQUIRY: standard data, or the VPD page given.
pub fn inquiry(evpd_page: Option<u8>, alloc: u16) -> [u8; 6] {
    let [hi, lo] = alloc.to_be_bytes();
    match evpd_page {
        Some(p) => [INQUIRY, 1, p, hi, lo, 0],
        None => [INQUIRY, 0, 0, hi, lo, 0],
    }
}

/// READ CAPACITY (16), for its 32 bytes.
pub fn read_capacity16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = SERVICE_ACTION_IN_16;
    c[1] = READ_CAPACITY_16;
    c[13] = 32;
    c
}

pub fn read_capacity10() -> [u8; 10] {
    [READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// REPORT LUNS of every logical unit (SELECT REPORT 00h).
pub fn report_luns(alloc: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = REPORT_LUNS;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// SYNCHRONIZE CACHE (10) of the whole medium.
pub fn sync_cache10() -> [u8; 10] {
    [SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

pub fn test_unit_ready() -> [u8; 6] {
    [TEST_UNIT_READY, 0, 0, 0, 0, 0]
}

/// UNMAP of the `(lba, blocks)` ranges: the CDB and its parameter list.
pub fn unmap(ranges: &[(u64, u32)]) -> ([u8; 10], Vec<u8>) {
    let len = 8 + 16 * ranges.len();
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&((len - 2) as u16).to_be_bytes());
    p.extend_from_slice(&((len - 8) as u16).to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    for &(lba, blocks) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&blocks.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    let mut c = [0u8; 10];
    c[0] = UNMAP;
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    (c, p)
}

/// GET LBA STATUS (16) from `lba`.
pub fn get_lba_status16(lba: u64, alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = SERVICE_ACTION_IN_16;
    c[1] = GET_LBA_STATUS;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
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

    #[test]
    fn built_cdbs_have_their_opcodes_and_fields() {
        assert_eq!(write16_fua(1, 2)[..2], [0x8a, 0x08]);
        assert_eq!(write_same16(0, 1)[0], 0x93);
        assert_eq!(inquiry(Some(0x83), 4096), [0x12, 1, 0x83, 0x10, 0, 0]);
        assert_eq!(inquiry(None, 96), [0x12, 0, 0, 0, 96, 0]);
        assert_eq!(read_capacity16()[..2], [0x9e, 0x10]);
        assert_eq!(get_lba_status16(7, 24)[..2], [0x9e, 0x12]);
        assert_eq!(report_luns(16384)[6..10], [0, 0, 0x40, 0]);
        assert_eq!(sync_cache10()[0], 0x35);
        assert_eq!(read_capacity10()[0], 0x25);
        assert_eq!(test_unit_ready(), [0; 6]);
        for c in [
            &read16(0, 1)[..],
            &write16(0, 1),
            &read_capacity16(),
            &unmap(&[]).0,
        ] {
            assert!(check_len(c).is_ok(), "{c:02x?}");
        }
    }
}
