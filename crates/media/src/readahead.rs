//! Read-ahead on a LUN, sans-IO: how far ahead to read, and which units to ask for.
//!
//! A file system reader asks for a few blocks at a time; over a WAN each miss costs a
//! round trip. The device is cut into fixed units; a read needs the units it covers, and
//! once reads go forward (a unit at or right after the last one read) the planner also
//! asks for the units that follow, as many as the read-ahead window holds. The window is
//! the path's bandwidth-delay product twice over ([`window_bytes`]): with that much in
//! flight the stream is fed at the path's rate, well above a video's bitrate, and a unit
//! consumed is replaced a round trip before it is needed.

use std::ops::Range;
use std::time::Duration;

/// The unit a LUN is read in: a miss costs one command of this size.
pub const UNIT: u64 = 128 << 10;
/// Bounds of the window: at least four units, at most 32 MiB (memory per stream).
pub const MIN_WINDOW: u64 = 4 * UNIT;
pub const MAX_WINDOW: u64 = 32 << 20;

/// Twice the bandwidth-delay product of `rtt` at `rate_bytes_per_s`, within bounds.
pub fn window_bytes(rtt: Duration, rate_bytes_per_s: u64) -> u64 {
    let bdp = (rtt.as_secs_f64() * rate_bytes_per_s as f64) as u64;
    bdp.saturating_mul(2).clamp(MIN_WINDOW, MAX_WINDOW)
}

/// Which units to read for each access.
#[derive(Clone, Debug)]
pub struct Planner {
    unit: u64,
    /// Units the window holds.
    depth: u64,
    /// Units on the device (the last may be short).
    units: u64,
    last: Option<u64>,
}

/// The units an access needs now, and those to ask for ahead of it (not overlapping).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub need: Range<u64>,
    pub ahead: Range<u64>,
}

impl Planner {
    pub fn new(unit: u64, window: u64, device_size: u64) -> Planner {
        let unit = unit.max(512);
        Planner {
            unit,
            depth: window.div_ceil(unit).max(1),
            units: device_size.div_ceil(unit),
            last: None,
        }
    }

    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// Units kept in memory at most: the window, what is being read, and room for the
    /// file system's metadata.
    pub fn cache_units(&self) -> usize {
        (self.depth * 2 + 32) as usize
    }

    /// Bytes `[offset, offset + len)` are being read.
    pub fn access(&mut self, offset: u64, len: u64) -> Plan {
        let first = (offset / self.unit).min(self.units);
        let end = (offset.saturating_add(len.max(1)).div_ceil(self.unit)).min(self.units);
        let forward = self
            .last
            .is_some_and(|l| first == l || first == l.saturating_add(1));
        self.last = Some(end.saturating_sub(1).max(first));
        let ahead = if forward {
            end..end.saturating_add(self.depth).min(self.units)
        } else {
            end..end
        };
        Plan {
            need: first..end,
            ahead,
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
        // 24 ms at 100 Mbit/s: BDP 300 kB, twice that, within bounds.
        assert_eq!(window_bytes(Duration::from_millis(24), 12_500_000), 600_000);
        assert_eq!(
            window_bytes(Duration::from_micros(50), 12_500_000),
            MIN_WINDOW
        );
        assert_eq!(window_bytes(Duration::from_secs(1), 1 << 30), MAX_WINDOW);
    }

    #[test]
    fn reads_ahead_only_going_forward() {
        let unit = 1000;
        let mut p = Planner::new(unit, 3000, 10_500);
        assert_eq!(p.units, 11);
        // First read: just what it covers.
        let a = p.access(100, 50);
        assert_eq!(
            a,
            Plan {
                need: 0..1,
                ahead: 1..1
            }
        );
        // The next unit: forward, three units ahead.
        let a = p.access(1000, 1000);
        assert_eq!(
            a,
            Plan {
                need: 1..2,
                ahead: 2..5
            }
        );
        // Within the same unit still counts as forward.
        let a = p.access(1500, 10);
        assert_eq!(a.ahead, 2..5);
        // A jump back: no read-ahead.
        let a = p.access(100, 10);
        assert_eq!(
            a,
            Plan {
                need: 0..1,
                ahead: 1..1
            }
        );
        // A jump forward, then going on from there.
        p.access(7000, 10);
        let a = p.access(8000, 2500);
        assert_eq!(
            a,
            Plan {
                need: 8..11,
                ahead: 11..11
            }
        );
        // Past the end: nothing.
        let a = p.access(20_000, 10);
        assert_eq!(a.need, 11..11);
        assert_eq!(p.extent(10, 10_500), (10_000, 500));
    }
}
