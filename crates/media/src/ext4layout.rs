//! Where an ext2/3/4 file system keeps what is not file data, sans-IO: the superblock and
//! its backups, the group descriptor tables and their reserved growth, each group's
//! bitmaps and inode table, and the journal. A file's data never lies there, so a
//! device reading ahead of a file's stream may step over these ranges: a large file's
//! extents jump over them (in the lab's R4 image the 512 MiB file jumps the 16 MiB
//! journal at 245 MiB and three groups' backup superblocks and descriptors), and reading
//! ahead straight through them sent up to a read-ahead window (2.5 MB at 24 ms each way)
//! of bytes nobody wanted over the link in front of the file's next extent.
//!
//! The caller reads the bytes (the superblock, the descriptors, the journal's inode) and
//! hands them in; nothing here does I/O. What cannot be parsed yields fewer ranges, never
//! an error: the ranges are a hint.

use std::ops::Range;

/// Where the primary superblock starts on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// Its length.
pub const SUPERBLOCK_LEN: usize = 1024;

const MAGIC: u16 = 0xEF53;
const COMPAT_HAS_JOURNAL: u32 = 0x4;
const INCOMPAT_META_BG: u32 = 0x10;
const INCOMPAT_64BIT: u32 = 0x80;
const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
const INODE_FLAG_EXTENTS: u32 = 0x80000;
const EXTENT_MAGIC: u16 = 0xF30A;
/// Groups whose descriptors are read at most (a 1 TiB file system of 4 KiB blocks has
/// 8192): more is a file system too large or a corrupt superblock, and gets no hint.
const MAX_GROUPS: u64 = 1 << 16;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// What of the superblock the layout needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub block_size: u64,
    pub blocks: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u64,
    pub inodes_per_group: u64,
    pub inode_size: u64,
    pub desc_size: u64,
    pub reserved_gdt_blocks: u64,
    pub sparse_super: bool,
    pub meta_bg: bool,
    /// The journal's inode, when the file system has one inside it.
    pub journal_inode: Option<u32>,
}

impl Superblock {
    /// Parses the 1024 bytes at [`SUPERBLOCK_OFFSET`]; `None` if they are no ext2/3/4
    /// superblock or hold sizes no file system has.
    pub fn parse(b: &[u8]) -> Option<Superblock> {
        if u16_at(b, 0x38)? != MAGIC {
            return None;
        }
        let log = u32_at(b, 0x18)?;
        if log > 6 {
            return None;
        }
        let block_size = 1024u64 << log;
        let compat = u32_at(b, 0x5C)?;
        let incompat = u32_at(b, 0x60)?;
        let ro_compat = u32_at(b, 0x64)?;
        let is64 = incompat & INCOMPAT_64BIT != 0;
        let mut blocks = u64::from(u32_at(b, 0x04)?);
        if is64 {
            blocks |= u64::from(u32_at(b, 0x150)?) << 32;
        }
        let desc_size = if is64 {
            u64::from(u16_at(b, 0xFE)?).max(32)
        } else {
            32
        };
        let inode_size = match u32_at(b, 0x4C)? {
            0 => 128,
            _ => u64::from(u16_at(b, 0x58)?),
        };
        let journal = u32_at(b, 0xE0)?;
        let sb = Superblock {
            block_size,
            blocks,
            first_data_block: u64::from(u32_at(b, 0x14)?),
            blocks_per_group: u64::from(u32_at(b, 0x20)?),
            inodes_per_group: u64::from(u32_at(b, 0x28)?),
            inode_size,
            desc_size,
            reserved_gdt_blocks: u64::from(u16_at(b, 0xCE)?),
            sparse_super: ro_compat & RO_COMPAT_SPARSE_SUPER != 0,
            meta_bg: incompat & INCOMPAT_META_BG != 0,
            journal_inode: (compat & COMPAT_HAS_JOURNAL != 0 && journal != 0).then_some(journal),
        };
        let sane = sb.blocks_per_group > 0
            && sb.inodes_per_group > 0
            && (128..=block_size).contains(&sb.inode_size)
            && sb.desc_size <= 1024
            && sb.first_data_block < sb.blocks
            && sb.blocks.checked_mul(block_size).is_some()
            && sb.groups() <= MAX_GROUPS;
        sane.then_some(sb)
    }

    /// Block groups.
    pub fn groups(&self) -> u64 {
        self.blocks
            .saturating_sub(self.first_data_block)
            .div_ceil(self.blocks_per_group.max(1))
    }

    /// Blocks the group descriptor table takes.
    fn gdt_blocks(&self) -> u64 {
        (self.groups() * self.desc_size).div_ceil(self.block_size)
    }

    /// Where the primary group descriptor table lies on the device (bytes): the block
    /// after the superblock's.
    pub fn gdt(&self) -> Range<u64> {
        let start = (self.first_data_block + 1) * self.block_size;
        start..start + self.gdt_blocks() * self.block_size
    }

    /// Whether group `g` holds a copy of the superblock (and, without meta_bg, of the
    /// descriptors): every group, or with sparse_super groups 0, 1 and the powers of 3, 5
    /// and 7.
    fn has_super(&self, g: u64) -> bool {
        if !self.sparse_super || g <= 1 {
            return true;
        }
        [3u64, 5, 7].iter().any(|&p| {
            let mut x = p;
            while x < g {
                x = x.saturating_mul(p);
            }
            x == g
        })
    }

    /// The groups' bitmaps and inode tables from the descriptor table's bytes.
    pub fn groups_from(&self, gdt: &[u8]) -> Vec<Group> {
        let d = self.desc_size as usize;
        let wide = d >= 64;
        (0..self.groups() as usize)
            .map_while(|g| {
                let e = gdt.get(g * d..(g + 1) * d)?;
                let hi = |lo: usize, hi: usize| -> Option<u64> {
                    let l = u64::from(u32_at(e, lo)?);
                    Some(if wide {
                        l | u64::from(u32_at(e, hi)?) << 32
                    } else {
                        l
                    })
                };
                Some(Group {
                    block_bitmap: hi(0x0, 0x20)?,
                    inode_bitmap: hi(0x4, 0x24)?,
                    inode_table: hi(0x8, 0x28)?,
                })
            })
            .collect()
    }

    /// Where inode `n`'s bytes are (its group's inode table from `groups`), or `None`.
    pub fn inode_at(&self, n: u32, groups: &[Group]) -> Option<Range<u64>> {
        let i = u64::from(n.checked_sub(1)?);
        let g = groups.get((i / self.inodes_per_group) as usize)?;
        let start = g
            .inode_table
            .checked_mul(self.block_size)?
            .checked_add((i % self.inodes_per_group) * self.inode_size)?;
        Some(start..start + self.inode_size)
    }

    /// The ranges (bytes, sorted, merged) that hold no file data: superblocks and
    /// descriptor tables with their reserved blocks, bitmaps, inode tables, and the
    /// journal's `journal` extents (from [`journal_extents`]).
    pub fn metadata(&self, groups: &[Group], journal: &[Range<u64>]) -> Vec<Range<u64>> {
        let bs = self.block_size;
        let end = self.blocks * bs;
        let mut v: Vec<Range<u64>> = Vec::new();
        let table_blocks = self
            .inodes_per_group
            .saturating_mul(self.inode_size)
            .div_ceil(bs);
        for g in 0..self.groups() {
            let start = self.first_data_block + g * self.blocks_per_group;
            if self.has_super(g) {
                // The superblock's block; without meta_bg the descriptors and their
                // reserve follow it (group 0's superblock sits in block 0 with 1 KiB
                // blocks' boot block before it, in block 0 of 4 KiB blocks otherwise).
                let mut n = 1;
                if !self.meta_bg {
                    n += self.gdt_blocks() + self.reserved_gdt_blocks;
                }
                let from = if g == 0 { 0 } else { start.saturating_mul(bs) };
                v.push(from..start.saturating_add(n).saturating_mul(bs));
            }
        }
        // Descriptors are read from the device: a corrupt one may say anything.
        let blocks = |b: u64, n: u64| b.saturating_mul(bs)..b.saturating_add(n).saturating_mul(bs);
        for gr in groups {
            v.push(blocks(gr.block_bitmap, 1));
            v.push(blocks(gr.inode_bitmap, 1));
            v.push(blocks(gr.inode_table, table_blocks));
        }
        v.extend(journal.iter().cloned());
        merge(v.into_iter().map(|r| r.start.min(end)..r.end.min(end)))
    }
}

/// One group's descriptor: where its bitmaps and inode table are (blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
}

/// The journal's extents (bytes) from its inode's bytes, when they sit in the inode
/// itself (an extent tree of depth 0, as mkfs makes it); otherwise none.
pub fn journal_extents(sb: &Superblock, inode: &[u8]) -> Vec<Range<u64>> {
    let Some(flags) = u32_at(inode, 0x20) else {
        return Vec::new();
    };
    let i_block = 0x28;
    if flags & INODE_FLAG_EXTENTS == 0
        || u16_at(inode, i_block) != Some(EXTENT_MAGIC)
        || u16_at(inode, i_block + 6) != Some(0)
    {
        return Vec::new();
    }
    let entries = u16_at(inode, i_block + 2).unwrap_or(0).min(4) as usize;
    (0..entries)
        .filter_map(|k| {
            let e = i_block + 12 + 12 * k;
            let mut len = u64::from(u16_at(inode, e + 4)?);
            if len > 32768 {
                // An uninitialized extent: its length less 32768.
                len -= 32768;
            }
            let start = u64::from(u16_at(inode, e + 6)?) << 32 | u64::from(u32_at(inode, e + 8)?);
            let from = start.checked_mul(sb.block_size)?;
            Some(from..from.checked_add(len * sb.block_size)?)
        })
        .collect()
}

/// Sorts and merges overlapping or touching ranges, dropping empty ones.
pub fn merge(rs: impl IntoIterator<Item = Range<u64>>) -> Vec<Range<u64>> {
    let mut v: Vec<Range<u64>> = rs.into_iter().filter(|r| r.start < r.end).collect();
    v.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(l) if r.start <= l.end => l.end = l.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb_bytes(blocks: u32, log: u32, bpg: u32, ipg: u32, incompat: u32) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_LEN];
        let put32 =
            |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        let put16 =
            |b: &mut Vec<u8>, at: usize, v: u16| b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        put32(&mut b, 0x04, blocks);
        put32(&mut b, 0x14, u32::from(log == 0));
        put32(&mut b, 0x18, log);
        put32(&mut b, 0x20, bpg);
        put32(&mut b, 0x28, ipg);
        put16(&mut b, 0x38, MAGIC);
        put32(&mut b, 0x4C, 1);
        put16(&mut b, 0x58, 256);
        put32(&mut b, 0x5C, COMPAT_HAS_JOURNAL);
        put32(&mut b, 0x60, incompat);
        put32(&mut b, 0x64, RO_COMPAT_SPARSE_SUPER);
        put16(&mut b, 0xCE, 63);
        put32(&mut b, 0xE0, 8);
        put16(&mut b, 0xFE, 64);
        b
    }

    #[test]
    fn superblock_and_groups() {
        // 640 MiB of 4 KiB blocks: five groups of 32768 blocks, 8192 inodes each.
        let sb = Superblock::parse(&sb_bytes(163_840, 2, 32_768, 8192, INCOMPAT_64BIT)).unwrap();
        assert_eq!(sb.block_size, 4096);
        assert_eq!(sb.groups(), 5);
        assert_eq!(sb.desc_size, 64);
        assert_eq!(sb.gdt(), 4096..8192);
        assert_eq!(sb.journal_inode, Some(8));
        assert!((0..10)
            .map(|g| sb.has_super(g))
            .eq([true, true, false, true, false, true, false, true, false, true]));
        // Descriptors: flex_bg packs every group's bitmaps and tables into group 0.
        let mut gdt = vec![0u8; 5 * 64];
        for g in 0..5u32 {
            let e = &mut gdt[g as usize * 64..];
            e[0..4].copy_from_slice(&(100 + g).to_le_bytes());
            e[4..8].copy_from_slice(&(200 + g).to_le_bytes());
            e[8..12].copy_from_slice(&(300 + g * 512).to_le_bytes());
        }
        let groups = sb.groups_from(&gdt);
        assert_eq!(groups.len(), 5);
        assert_eq!(groups[4].inode_table, 300 + 4 * 512);
        // Inode 8 is the 8th of group 0's table.
        assert_eq!(
            sb.inode_at(8, &groups),
            Some(300 * 4096 + 7 * 256..300 * 4096 + 8 * 256)
        );
        assert_eq!(sb.inode_at(0, &groups), None);
        assert_eq!(sb.inode_at(5 * 8192 + 1, &groups), None);
        let journal = 81_920 * 4096..(81_920 + 4096) * 4096;
        let m = sb.metadata(&groups, std::slice::from_ref(&journal));
        // Group 0: superblock, one descriptor block and 63 reserved; the bitmaps; the
        // five inode tables back to back (512 blocks each).
        assert_eq!(m[0], 0..65 * 4096);
        assert_eq!(m[1], 100 * 4096..105 * 4096);
        assert_eq!(m[2], 200 * 4096..205 * 4096);
        assert_eq!(m[3], 300 * 4096..(300 + 5 * 512) * 4096);
        // Backups in groups 1 and 3 only; the journal.
        assert_eq!(m[4], 32_768 * 4096..(32_768 + 65) * 4096);
        assert_eq!(m[5], 81_920 * 4096..(81_920 + 4096) * 4096);
        assert_eq!(m[6], 98_304 * 4096..(98_304 + 65) * 4096);
        assert_eq!(m.len(), 7);
    }

    #[test]
    fn journal_from_its_inode() {
        let sb = Superblock::parse(&sb_bytes(163_840, 2, 32_768, 8192, 0)).unwrap();
        assert_eq!(sb.desc_size, 32);
        let mut ino = vec![0u8; 256];
        ino[0x20..0x24].copy_from_slice(&INODE_FLAG_EXTENTS.to_le_bytes());
        let ib = 0x28;
        ino[ib..ib + 2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
        ino[ib + 2..ib + 4].copy_from_slice(&2u16.to_le_bytes());
        for (k, (start, len)) in [(81_920u32, 4096u16), (90_000, 32768 + 10)]
            .iter()
            .enumerate()
        {
            let e = ib + 12 + 12 * k;
            ino[e + 4..e + 6].copy_from_slice(&len.to_le_bytes());
            ino[e + 8..e + 12].copy_from_slice(&start.to_le_bytes());
        }
        assert_eq!(
            journal_extents(&sb, &ino),
            vec![
                81_920 * 4096..(81_920 + 4096) * 4096,
                90_000 * 4096..90_010 * 4096
            ]
        );
        // An extent tree of depth 1, or no extents: no hint.
        ino[ib + 6] = 1;
        assert!(journal_extents(&sb, &ino).is_empty());
        assert!(journal_extents(&sb, &[0u8; 10]).is_empty());
    }

    #[test]
    fn what_is_no_superblock_gives_nothing() {
        assert_eq!(Superblock::parse(&[0u8; SUPERBLOCK_LEN]), None);
        assert_eq!(Superblock::parse(&[0u8; 10]), None);
        // A block size beyond 64 KiB, or no blocks per group.
        assert_eq!(Superblock::parse(&sb_bytes(1000, 7, 8192, 2048, 0)), None);
        assert_eq!(Superblock::parse(&sb_bytes(1000, 2, 0, 2048, 0)), None);
        // Random bytes never panic.
        let mut x = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut b = sb_bytes(163_840, 2, 32_768, 8192, INCOMPAT_64BIT);
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let at = (x as usize) % b.len();
                b[at] = (x >> 8) as u8;
            }
            if let Some(sb) = Superblock::parse(&b) {
                let g = sb.groups_from(&b);
                let _ = sb.metadata(&g, &journal_extents(&sb, &b));
                let _ = sb.inode_at(x, &g);
            }
        }
    }

    #[test]
    fn merging() {
        assert_eq!(merge([5..7, 0..2, 2..3, 6..9, 4..4]), vec![0..3, 5..9]);
    }
}
