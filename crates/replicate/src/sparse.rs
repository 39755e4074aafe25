//! What a send must carry for each unit of its plan: data, or nothing but "zeros here".
//! Sans-IO: the store's allocation map ([`backstore::Backstore::is_allocated`]) and the
//! unit's bytes are handed in; the agent does the reading and the writing.
//!
//! A unit the source does not hold (no allocated byte in it) is not read at all: the
//! destination is told to make it zeros, in runs of many units at once (UNMAP where the
//! far logical unit unmaps to zeros, WRITE SAME of zeros elsewhere), since the far LUN may
//! hold old data there. A unit that is allocated but all zeros when read goes the same way,
//! one unit at a time. So a first sync of a sparse volume moves what the volume holds,
//! not its size.

use std::ops::Range;

/// One step of a send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Plan positions `positions`, consecutive units none of whose bytes the source
    /// holds: zeros on the destination, no data sent.
    Clear { positions: Range<usize> },
    /// The unit at this plan position: read it, and send it (or clear it, if all zero).
    Data(usize),
}

/// Whether every byte of `buf` is zero. Whole 64-byte blocks are OR-folded (which the
/// compiler turns into vector instructions) and the answer is known at the first block that
/// is not zero, so data costs a few cache lines and a hole the memory's speed.
pub fn is_zero(buf: &[u8]) -> bool {
    let mut blocks = buf.chunks_exact(64);
    for b in &mut blocks {
        if b.iter().fold(0u8, |a, &x| a | x) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&x| x == 0)
}

/// Whether any byte of `[start, end)` is allocated in `extents` (`(offset, len,
/// allocated)`, sorted, as the store describes its ranges; what they do not cover counts as
/// allocated, so a store that describes nothing has everything sent).
pub fn holds_data(extents: &[(u64, u64, bool)], start: u64, end: u64) -> bool {
    let first = extents.partition_point(|&(o, l, _)| o + l <= start);
    let mut at = start;
    for &(o, l, alloc) in &extents[first..] {
        if at >= end {
            return false;
        }
        if o > at || alloc {
            // A gap the map leaves, or allocated bytes in the range.
            return true;
        }
        at = o + l;
    }
    at < end
}

/// The steps of a send of `plan` (unit indices, ascending) in units of `unit` bytes of a
/// store of `size` bytes whose allocation is `extents`: every run of units with no data
/// first, as [`Op::Clear`]s of at most `max_clear` units, then each unit with data.
pub fn ops(
    plan: &[u64],
    unit: u64,
    size: u64,
    extents: &[(u64, u64, bool)],
    max_clear: usize,
) -> Vec<Op> {
    let mut clears = Vec::new();
    let mut data = Vec::new();
    let mut run: Option<Range<usize>> = None;
    for (pos, &i) in plan.iter().enumerate() {
        let (s, e) = crate::api::unit_range(i, unit, size);
        if holds_data(extents, s, e) {
            data.push(Op::Data(pos));
            continue;
        }
        run = match run.take() {
            Some(r) if r.end == pos && plan[pos - 1] + 1 == i && r.len() < max_clear.max(1) => {
                Some(r.start..pos + 1)
            }
            Some(r) => {
                clears.push(Op::Clear { positions: r });
                Some(pos..pos + 1)
            }
            None => Some(pos..pos + 1),
        };
    }
    if let Some(r) = run {
        clears.push(Op::Clear { positions: r });
    }
    clears.extend(data);
    clears
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_check() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 1 << 20]));
        for len in [1usize, 63, 64, 65, 4096, 4097] {
            for at in [0, len / 2, len - 1] {
                let mut b = vec![0u8; len];
                b[at] = 1;
                assert!(!is_zero(&b), "len {len}, byte {at}");
                assert!(is_zero(&b[..at]));
            }
        }
    }

    #[test]
    fn units_with_data() {
        const M: u64 = 1 << 20;
        // Data at [1M+4K, 1M+8K) and [3M, 5M); the map covers 0..6M.
        let map = [
            (0, M + 4096, false),
            (M + 4096, 4096, true),
            (M + 8192, 2 * M - 8192, false),
            (3 * M, 2 * M, true),
            (5 * M, M, false),
        ];
        let held: Vec<bool> = (0..6)
            .map(|i| holds_data(&map, i * M, (i + 1) * M))
            .collect();
        assert_eq!(held, [false, true, false, true, true, false]);
        // What the map does not describe is sent.
        assert!(holds_data(&map, 6 * M, 7 * M));
        assert!(holds_data(&[], 0, M));
        assert!(holds_data(&[(0, M / 2, false)], 0, M));
        // A store that says "all allocated" has every unit sent.
        assert!(holds_data(&[(0, 6 * M, true)], 2 * M, 3 * M));
    }

    #[test]
    fn holes_go_first_in_runs() {
        const M: u64 = 1 << 20;
        // Units 0..10 of 10 MiB; data in units 2 and 6.
        let map = [
            (0, 2 * M, false),
            (2 * M, M, true),
            (3 * M, 3 * M, false),
            (6 * M, M, true),
            (7 * M, 3 * M, false),
        ];
        let plan: Vec<u64> = (0..10).collect();
        assert_eq!(
            ops(&plan, M, 10 * M, &map, 1024),
            [
                Op::Clear { positions: 0..2 },
                Op::Clear { positions: 3..6 },
                Op::Clear { positions: 7..10 },
                Op::Data(2),
                Op::Data(6),
            ]
        );
        // Runs are cut at `max_clear` units, and where the plan skips units.
        assert_eq!(
            ops(&plan, M, 10 * M, &map, 2)[..3],
            [
                Op::Clear { positions: 0..2 },
                Op::Clear { positions: 3..5 },
                Op::Clear { positions: 5..6 },
            ]
        );
        let plan = [0, 1, 4, 5];
        assert_eq!(
            ops(&plan, M, 10 * M, &map, 1024),
            [Op::Clear { positions: 0..2 }, Op::Clear { positions: 2..4 }]
        );
        // All allocated: nothing but data, in plan order.
        assert_eq!(
            ops(&[3, 4], M, 10 * M, &[(0, 10 * M, true)], 1024),
            [Op::Data(0), Op::Data(1)]
        );
    }
}
