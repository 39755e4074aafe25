//! Read-ahead on a LUN, sans-IO: how far ahead to read, and which units to ask for.
//!
//! A file system reader asks for a few blocks at a time; over a WAN each miss costs a
//! round trip. The device is cut into fixed units; a read needs the units it covers, and
//! once reads go forward (a unit at or right after the last one read) the planner also
//! asks for the units that follow, as many as the read-ahead window holds. The window is
//! the path's bandwidth-delay product [`WINDOW_BDPS`] times over and a unit per connection
//! ([`window_bytes`]): with that much asked for the stream is fed at the path's rate, well
//! above a video's bitrate, a unit consumed is replaced a round trip before it is needed,
//! and a loss on the connection (the reader held up on the unit with the hole for a
//! round trip or two) does not leave the sender without work.

use std::ops::Range;
use std::time::Duration;

/// The unit a LUN is read in: a miss costs one command of this size.
pub const UNIT: u64 = 128 << 10;
/// Bounds of the window: at least four units, at most 32 MiB (memory per stream).
pub const MIN_WINDOW: u64 = 4 * UNIT;
pub const MAX_WINDOW: u64 = 32 << 20;

/// Round trips of the path's rate a stream asks for ahead ([`window_bytes`]).
///
/// The reader takes units in order, so a segment lost on the connection holds it (and with
/// it every new request) up until the retransmission comes, a round trip after the loss
/// was seen and later still behind a full bottleneck queue. Meanwhile the sender can only
/// send what was asked for before the hole: the window less what is in flight, the RTT's
/// worth and up to as much again queued at the bottleneck when the loss comes. With twice
/// the BDP that left nearly nothing: at 24 ms each way, 100 Mbit/s, one connection on
/// CUBIC (the lab's R4), each loss event emptied the link for tens of milliseconds (a second
/// with a loss at 88.7–98.5 % of the link, the others at 100), 94.8 % of the link over
/// the 512 MiB file against `smbclient get`'s 95.6, whose reads keep the sender busy. Four
/// round trips cover the pipe and the queue at the loss, and as much again sent while it
/// is repaired.
pub const WINDOW_BDPS: u64 = 4;

/// [`WINDOW_BDPS`] times the bandwidth-delay product of `rtt` at `rate_bytes_per_s`, plus
/// a unit for each of the session's `connections`, within bounds. The units of a stream
/// go out spread over the connections, each paced at its share of the rate, and the reader
/// takes them in order: a unit asked for must cross one RTT and then its connection at
/// 1/`connections` of the rate before it is needed, so a full link needs RTT × rate +
/// `connections` units in flight (twice the BDP alone held 1.2 MB at 24 ms each way and
/// 100 Mbit/s over eight paced connections, which need 1.6 MB: 72 % of the link in the
/// lab), and more for the losses ([`WINDOW_BDPS`]).
pub fn window_bytes(rtt: Duration, rate_bytes_per_s: u64, connections: u16) -> u64 {
    let bdp = (rtt.as_secs_f64() * rate_bytes_per_s as f64) as u64;
    bdp.saturating_mul(WINDOW_BDPS)
        .saturating_add(u64::from(connections.max(1)) * UNIT)
        .clamp(MIN_WINDOW, MAX_WINDOW)
}

/// Read-ahead a new stream starts with (once it has left its first unit), in units: small, so that a stream that stops at
/// once (a player probing the file's head, a seek) leaves little on the link in front of
/// the next demand read. It grows by a unit for each unit the stream consumes (doubling
/// each round trip, as TCP's slow start) up to the window.
pub const INITIAL_UNITS: u64 = 2;
/// Streams followed at once: a file system's metadata reads (extent blocks, inodes) are
/// streams of their own and do not reset the read-ahead of the data they interleave with.
pub const STREAMS: usize = 4;
/// How far forward a read may land past the last unit of the latest stream reading ahead
/// and still carry that stream on, read-ahead and all. A large file's data
/// jumps forward on the device where ext4 left room between its extents for a block
/// group's metadata: in the lab's R4 image the 512 MiB file jumps 324 KiB three times
/// (backup superblocks; inside what was read ahead, so the same stream) and 16 MiB once
/// (a flex group's bitmaps and inode tables), at 245 MiB. As a new stream there it
/// started over (a small read, its first unit alone, then the ramp): three round trips of
/// an empty link and the ramp, 0.1–0.2 s of a 45 s read at 24 ms each way. A stream that
/// has not left its first unit (a player probing a file's head) carries nothing over,
/// nor does a read behind the stream (a seek back) or further ahead (a seek forward).
pub const JUMP: u64 = 32 << 20;

/// Which units to read for each access.
#[derive(Clone, Debug)]
pub struct Planner {
    unit: u64,
    /// Units the window holds: a stream's read-ahead at most.
    depth: u64,
    /// Units on the device (the last may be short).
    units: u64,
    /// Sequential streams seen, most recent last.
    streams: Vec<Stream>,
    /// Runs of units that hold no file data (a file system's metadata and journal, see
    /// [`Planner::set_holes`]), sorted, apart: read-ahead steps over them.
    holes: Vec<Range<u64>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stream {
    /// The unit it started in: nothing is read ahead until it leaves it (a file system
    /// reading its superblock and group descriptors, or an inode table block, stays in
    /// one unit and is no stream).
    first: u64,
    /// The last unit read.
    last: u64,
    /// Units asked for ahead end here (exclusive).
    ahead_to: u64,
    /// Units of read-ahead it has earned (at most the window).
    credit: u64,
    /// It reads ahead: it left the unit it started in, or carried on a stream that had
    /// ([`JUMP`]).
    going: bool,
}

/// The units an access needs now, and those to ask for ahead of it (not overlapping).
/// The device asks for `need` first: a demand read never queues behind read-ahead it
/// starts itself. `ahead` may span holes ([`Planner::is_hole`]): their units are not
/// read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub need: Range<u64>,
    pub ahead: Range<u64>,
    /// The access starts a stream of its own (nothing read ahead for it yet): the device
    /// may read just the bytes asked ([`small_read`]) instead of whole units.
    pub new_stream: bool,
}

/// A read that starts a stream (a file system's metadata, the first bytes of a seek) is
/// answered from a read of at least this many bytes: small enough to come in one
/// round trip on a connection whose congestion window is back at its initial ten
/// segments (a TCP connection idle for a while), large enough for the first chunk of an
/// answer.
pub const SMALL_READ: u64 = 12 << 10;
/// Alignment of small reads: the file systems' block.
pub const SMALL_ALIGN: u64 = 4 << 10;

/// Sans-IO: the bytes to read for an access of `[offset, offset + len)` that starts a
/// stream: from the aligned start, at least [`SMALL_READ`], within the device.
pub fn small_read(offset: u64, len: u64, device_size: u64) -> (u64, u64) {
    let start = offset - offset % SMALL_ALIGN;
    let end = offset
        .saturating_add(len)
        .div_ceil(SMALL_ALIGN)
        .saturating_mul(SMALL_ALIGN)
        .max(start + SMALL_READ)
        .min(device_size);
    (start, end.saturating_sub(start))
}

impl Planner {
    pub fn new(unit: u64, window: u64, device_size: u64) -> Planner {
        let unit = unit.max(512);
        Planner {
            unit,
            depth: window.div_ceil(unit).max(1),
            units: device_size.div_ceil(unit),
            streams: Vec::new(),
            holes: Vec::new(),
        }
    }

    /// Byte ranges of the device that hold no file data (`ext4layout`): a stream's
    /// read-ahead steps over every unit wholly inside one, as the file's extents do,
    /// instead of sending what nobody will read over the link in front of the file's next
    /// extent. Units a read needs are read wherever they are.
    pub fn set_holes(&mut self, ranges: &[Range<u64>]) {
        let mut v: Vec<Range<u64>> = ranges
            .iter()
            .map(|r| {
                r.start.div_ceil(self.unit).min(self.units)..(r.end / self.unit).min(self.units)
            })
            .filter(|r| r.start < r.end)
            .collect();
        v.sort_by_key(|r| r.start);
        self.holes.clear();
        for r in v {
            match self.holes.last_mut() {
                Some(l) if r.start <= l.end => l.end = l.end.max(r.end),
                _ => self.holes.push(r),
            }
        }
    }

    /// Whether unit `u` lies in a hole: read-ahead does not read it.
    pub fn is_hole(&self, u: u64) -> bool {
        let i = self.holes.partition_point(|h| h.end <= u);
        self.holes.get(i).is_some_and(|h| h.start <= u)
    }

    /// Where `n` units of data from unit `from` end (exclusive), the holes stepped over
    /// (one it ends at too, so that the file's next read past it is inside what was read
    /// ahead); at most the device's end.
    fn advance(&self, from: u64, n: u64) -> u64 {
        let mut pos = from.min(self.units);
        let mut left = n;
        let mut i = self.holes.partition_point(|h| h.end <= pos);
        while left > 0 && pos < self.units {
            match self.holes.get(i) {
                Some(h) if h.start <= pos => {
                    pos = h.end;
                    i += 1;
                }
                next => {
                    let stop = next.map_or(self.units, |h| h.start);
                    let take = left.min(stop - pos);
                    pos += take;
                    left -= take;
                }
            }
        }
        if let Some(h) = self.holes.get(i).filter(|h| h.start == pos) {
            pos = h.end;
        }
        pos
    }

    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// Units kept in memory at most: the window, what is being read, and room for the
    /// file system's metadata and the other streams.
    pub fn cache_units(&self) -> usize {
        (self.depth * 2 + 32 + STREAMS as u64 * INITIAL_UNITS) as usize
    }

    /// Bytes `[offset, offset + len)` are being read.
    pub fn access(&mut self, offset: u64, len: u64) -> Plan {
        let first = (offset / self.unit).min(self.units);
        let end = (offset.saturating_add(len.max(1)).div_ceil(self.unit)).min(self.units);
        let last = end.saturating_sub(1).max(first);
        // A stream this access continues: at or right after its last unit, or inside
        // what was read ahead for it (a reader skipping a little).
        let hit = self.streams.iter().rposition(|s| {
            first >= s.last && (first <= s.last.saturating_add(1) || first < s.ahead_to)
        });
        let Some(i) = hit else {
            // The latest stream reading ahead jumped a little forward (its file's next
            // extent; the file system may have read the extent tree's block on the way):
            // it goes on from here with the read-ahead it earned.
            let jump = (JUMP / self.unit).max(1);
            let carried = self
                .streams
                .iter()
                .rev()
                .find(|p| p.going)
                .filter(|p| first > p.last && first - p.last <= jump)
                .map(|p| p.credit);
            if self.streams.len() >= STREAMS {
                self.streams.remove(0);
            }
            if let Some(credit) = carried {
                let to = self.advance(end, credit).max(end);
                self.streams.push(Stream {
                    first,
                    last,
                    ahead_to: to,
                    credit,
                    going: true,
                });
                return Plan {
                    need: first..end,
                    ahead: end..to,
                    new_stream: false,
                };
            }
            // A new stream: nothing ahead until it goes on.
            self.streams.push(Stream {
                first,
                last,
                ahead_to: end,
                credit: INITIAL_UNITS.min(self.depth),
                going: false,
            });
            return Plan {
                need: first..end,
                ahead: end..end,
                new_stream: true,
            };
        };
        let mut s = self.streams.remove(i);
        let consumed = last.saturating_sub(s.last);
        s.credit = s.credit.saturating_add(consumed).min(self.depth);
        s.last = last;
        s.going |= s.last > s.first;
        let from = s.ahead_to.max(end);
        let to = if s.going {
            self.advance(end, s.credit).max(from)
        } else {
            from
        };
        s.ahead_to = to;
        self.streams.push(s);
        Plan {
            need: first..end,
            ahead: from..to,
            new_stream: false,
        }
    }

    /// Where unit `u` starts and how long it is.
    pub fn extent(&self, u: u64, device_size: u64) -> (u64, usize) {
        let start = u * self.unit;
        (
            start,
            self.unit.min(device_size.saturating_sub(start)) as usize,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_from_the_path() {
        // 24 ms at 100 Mbit/s, one connection: BDP 300 kB, four times that and a unit.
        assert_eq!(
            window_bytes(Duration::from_millis(24), 12_500_000, 1),
            1_200_000 + UNIT
        );
        // 48 ms over eight paced connections: a unit in each on top.
        assert_eq!(
            window_bytes(Duration::from_millis(48), 12_500_000, 8),
            2_400_000 + 8 * UNIT
        );
        // A LAN: the floor, four units.
        assert_eq!(
            window_bytes(Duration::from_micros(200), 12_500_000, 1),
            MIN_WINDOW
        );
        // 10 ms at 100 Mbit/s: four round trips' worth (500 kB) and a unit, above the floor.
        assert_eq!(
            window_bytes(Duration::from_millis(10), 12_500_000, 1),
            500_000 + UNIT
        );
        assert_eq!(
            window_bytes(Duration::from_micros(50), 12_500_000, 1),
            MIN_WINDOW
        );
        assert_eq!(window_bytes(Duration::from_secs(1), 1 << 30, 8), MAX_WINDOW);
    }

    #[test]
    fn reads_ahead_only_going_forward_and_ramps() {
        let unit = 1000;
        let mut p = Planner::new(unit, 6000, 20_500);
        assert_eq!(p.units, 21);
        // First read: just what it covers, a new stream.
        let a = p.access(100, 50);
        assert_eq!(
            a,
            Plan {
                need: 0..1,
                ahead: 1..1,
                new_stream: true,
            }
        );
        // Within the same unit: the same stream, but nothing ahead until it leaves it.
        let a = p.access(500, 10);
        assert_eq!(a.ahead, 1..1);
        assert!(!a.new_stream);
        // The next unit: one consumed, credit 3.
        let a = p.access(1000, 1000);
        assert_eq!(a.need, 1..2);
        assert_eq!(a.ahead, 2..5);
        // Credit grows with what is consumed, up to the window (6 units).
        let a = p.access(2000, 3000);
        assert_eq!(a.need, 2..5);
        assert_eq!(a.ahead, 5..11);
        let a = p.access(5000, 1000);
        assert_eq!(a.ahead, 11..12);
        // A skip inside what was read ahead still counts as the same stream.
        let a = p.access(8000, 10);
        assert!(!a.new_stream);
        assert_eq!(a.ahead, 12..15);
        // A jump back: a new stream, nothing ahead.
        let a = p.access(100, 10);
        assert_eq!(a.ahead, 1..1);
        assert!(a.new_stream);
        // Past the end: nothing.
        let a = p.access(30_000, 10);
        assert_eq!(a.need, 21..21);
        assert_eq!(p.extent(20, 20_500), (20_000, 500));
    }

    #[test]
    fn metadata_reads_do_not_reset_a_stream() {
        let unit = 1000;
        let mut p = Planner::new(unit, 8000, 1_000_000);
        p.access(100_000, 1000);
        for i in 1..10u64 {
            p.access(100_000 + i * 1000, 1000);
        }
        // The stream has earned its whole window.
        let a = p.access(110_000, 1000);
        assert_eq!(a.ahead.end, 119);
        // An extent block elsewhere: a stream of its own, no read-ahead for it ...
        let m = p.access(5_000, 100);
        assert!(m.new_stream);
        assert!(m.ahead.is_empty());
        // ... and the data stream goes on with its window.
        let a = p.access(111_000, 1000);
        assert!(!a.new_stream);
        assert_eq!(a.ahead, 119..120);
    }

    #[test]
    fn a_short_jump_forward_carries_the_stream_on() {
        let unit = 1 << 20;
        let mut p = Planner::new(unit, 8 << 20, 1 << 40);
        for i in 0..12u64 {
            p.access(i << 20, 1 << 20);
        }
        // The stream has earned its window (8 units) ...
        assert_eq!(p.access(12 << 20, 1 << 20).ahead.end, 21);
        // ... and its file jumps 16 MiB forward (past a block group's metadata): the
        // stream goes on there with its window at once, no small read.
        let a = p.access(29 << 20, 1 << 20);
        assert_eq!(
            a,
            Plan {
                need: 29..30,
                ahead: 30..38,
                new_stream: false,
            }
        );
        let a = p.access(30 << 20, 1 << 20);
        assert_eq!(a.ahead, 38..39);
        // An extent block read on the way (a stream of its own, far away) does not stop it.
        assert!(p.access(3 << 20, 4096).new_stream);
        let a = p.access(40 << 20, 1 << 20);
        assert!(!a.new_stream);
        assert_eq!(a.ahead, 41..49);
        // Further than JUMP: a seek, a new stream.
        let far = 40 + JUMP / unit + 1;
        let a = p.access(far << 20, 4096);
        assert!(a.new_stream);
        assert!(a.ahead.is_empty());
        // A stream still in its first unit (a probe of the head) carries nothing over.
        let a = p.access((far << 20) + (4 << 20), 4096);
        assert!(a.new_stream);
        // Nor does a read behind the stream (a seek back).
        let mut p = Planner::new(unit, 8 << 20, 1 << 40);
        for i in 100..112u64 {
            p.access(i << 20, 1 << 20);
        }
        let a = p.access(90 << 20, 1 << 20);
        assert!(a.new_stream);
        assert!(a.ahead.is_empty());
    }

    #[test]
    fn read_ahead_steps_over_holes() {
        let unit = 1000;
        let mut p = Planner::new(unit, 4000, 100_000);
        // Units 10..14 and 20 hold no file data; a hole's partial units are not holes.
        p.set_holes(&[
            10_000..14_000,
            20_000..21_500,
            50_500..50_900,
            99_000..200_000,
        ]);
        assert_eq!(p.holes, vec![10..14, 20..21, 99..100]);
        assert!(p.is_hole(10) && p.is_hole(13) && p.is_hole(20) && p.is_hole(99));
        assert!(!p.is_hole(9) && !p.is_hole(14) && !p.is_hole(50));
        p.access(5000, 1000);
        // Three units of data ahead of unit 6: 7, 8, 9; then the hole 10..14 it ends at.
        let a = p.access(6000, 1000);
        assert_eq!(a.ahead, 7..14);
        // Four: 8, 9, then 14, 15 past the hole.
        let a = p.access(7000, 1000);
        assert_eq!(a.ahead, 14..16);
        // The file goes on past the hole: inside what was read ahead, the same stream.
        let a = p.access(14_000, 1000);
        assert!(!a.new_stream);
        assert_eq!(a.ahead, 16..19);
        let a = p.access(15_000, 1000);
        assert_eq!(a.ahead, 19..21);
        let a = p.access(16_000, 1000);
        assert!(!a.new_stream);
        assert_eq!(a.ahead, 21..22);
        // A demand read inside a hole is read all the same.
        let a = p.access(10_500, 10);
        assert_eq!(a.need, 10..11);
        // At the device's end.
        assert_eq!(p.advance(97, 5), 100);
        assert_eq!(p.advance(0, 0), 0);
    }

    #[test]
    fn small_reads() {
        assert_eq!(small_read(0, 1024, 1 << 30), (0, SMALL_READ));
        assert_eq!(small_read(5000, 10, 1 << 30), (4096, SMALL_READ));
        // A 32 KiB group of blocks: all of it.
        assert_eq!(small_read(8192, 32 << 10, 1 << 30), (8192, 32 << 10));
        // Unaligned end rounds out to a block.
        assert_eq!(small_read(4096, 13 << 10, 1 << 30), (4096, 16 << 10));
        // Near the end of the device.
        assert_eq!(small_read(10_000, 100, 12_000), (8192, 12_000 - 8192));
    }
}
