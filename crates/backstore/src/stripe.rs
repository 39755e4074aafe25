//! RAID-0 over member stores: the volume's bytes go round the members one stripe unit at a
//! time. Members are any stores the registry opens, stripes included, which gives the two
//! levels of a Data Reservoir site: across disk servers, and across the disks inside each.
//!
//! A request that touches several members runs on all of them at once (the members beyond
//! the first on helper threads kept for it, never queued behind other requests' I/O), so a
//! slow member delays only the requests that touch it, and a failing one fails only those,
//! with its error. A read within one stripe unit goes to
//! its member whole, lending included.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use units::Size;

use crate::registry::{OpenContext, OpenError, Param, StoreFactory};
use crate::spec::StoreSpec;
use crate::{check_range, push_extent, Backstore, Lent};

/// The smallest stripe unit: one page, a whole number of blocks of either block size.
const MIN_UNIT: u64 = 4096;
/// The unit when the spec names none: a 1 MiB command stays on one member.
const DEFAULT_UNIT: u64 = 1 << 20;

#[derive(Debug)]
pub struct StripeBackstore {
    members: Vec<Arc<dyn Backstore>>,
    unit: u64,
    /// What each member holds of the volume: whole units of the smallest member.
    per_member: u64,
}

/// One piece of a request: `len` bytes at `offset` of member `member`, which are the
/// bytes at `at` of the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    member: usize,
    offset: u64,
    len: u64,
    at: u64,
}

impl StripeBackstore {
    /// Stripes `members` in units of `unit` bytes (a multiple of 4096). The volume is as
    /// many whole units as the smallest member holds, times the members.
    pub fn new(members: Vec<Arc<dyn Backstore>>, unit: u64) -> Result<Self, String> {
        if members.is_empty() {
            return Err("a stripe needs at least one member".into());
        }
        if unit < MIN_UNIT || !unit.is_multiple_of(MIN_UNIT) {
            return Err(format!(
                "stripe unit {unit} is not a multiple of {MIN_UNIT} bytes"
            ));
        }
        let smallest = members.iter().map(|m| m.size()).min().unwrap_or(0);
        let per_member = smallest / unit * unit;
        if per_member == 0 {
            return Err(format!(
                "the smallest member holds {} bytes, less than one stripe unit of {}",
                smallest,
                Size(unit)
            ));
        }
        Ok(StripeBackstore {
            members,
            unit,
            per_member,
        })
    }

    pub fn unit(&self) -> u64 {
        self.unit
    }

    pub fn members(&self) -> &[Arc<dyn Backstore>] {
        &self.members
    }

    /// The pieces of `[offset, offset + len)`, in order: one per stripe unit touched.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let n = self.members.len() as u64;
        let mut at = 0;
        std::iter::from_fn(move || {
            if at >= len {
                return None;
            }
            let pos = offset + at;
            let stripe = pos / self.unit;
            let within = pos % self.unit;
            let take = (self.unit - within).min(len - at);
            let piece = Piece {
                member: (stripe % n) as usize,
                offset: stripe / n * self.unit + within,
                len: take,
                at,
            };
            at += take;
            Some(piece)
        })
    }

    /// The pieces grouped by member, each member's in order, and merged where they are
    /// adjacent on the member (for commands with no buffer: discard, zeroes).
    fn member_ranges(&self, offset: u64, len: u64) -> Vec<Vec<(u64, u64)>> {
        let mut by_member = vec![Vec::<(u64, u64)>::new(); self.members.len()];
        for p in self.pieces(offset, len) {
            let ranges = &mut by_member[p.member];
            match ranges.last_mut() {
                Some(last) if last.0 + last.1 == p.offset => last.1 += p.len,
                _ => ranges.push((p.offset, p.len)),
            }
        }
        by_member
    }

    /// Runs `job` for every member with work, those beyond the first on helper threads
    /// (kept between requests: see [`crate::helpers`]), and returns the first error.
    fn on_members<W: Send>(
        &self,
        work: Vec<(usize, W)>,
        job: impl Fn(&dyn Backstore, W) -> io::Result<()> + Sync,
    ) -> io::Result<()> {
        let mut work = work.into_iter();
        let Some((first, first_work)) = work.next() else {
            return Ok(());
        };
        let rest: Vec<(usize, W)> = work.collect();
        if rest.is_empty() {
            return job(&*self.members[first], first_work);
        }
        let job = &job;
        let rest = rest
            .into_iter()
            .map(|(m, w)| {
                Box::new(move || job(&*self.members[m], w))
                    as Box<dyn FnOnce() -> io::Result<()> + Send + '_>
            })
            .collect();
        let mut result = Ok(());
        for r in crate::helpers::run(|| job(&*self.members[first], first_work), rest) {
            let r = r.unwrap_or_else(|_| Err(io::Error::other("a stripe member's I/O panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

impl StripeBackstore {
    /// Runs `op` on every piece of `buf` (the volume's bytes from `offset`: read into, or
    /// written) with the member that holds it and the piece's offset there.
    fn on_pieces<'b, B: SplitAt<'b>>(
        &self,
        offset: u64,
        buf: B,
        op: impl Fn(&dyn Backstore, B, u64) -> io::Result<()> + Sync,
    ) -> io::Result<()> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size())?;
        let work = split_by_member(self.members.len(), self.pieces(offset, len), buf);
        self.on_members(work, |m, pieces| {
            pieces
                .into_iter()
                .try_for_each(|(off, piece)| op(m, piece, off))
        })
    }

    /// Runs `op` on every member range of `[offset, offset + len)`, merged where adjacent.
    fn on_ranges(
        &self,
        offset: u64,
        len: u64,
        op: impl Fn(&dyn Backstore, u64, u64) -> io::Result<()> + Sync,
    ) -> io::Result<()> {
        check_range(offset, len, self.size())?;
        let work = self
            .member_ranges(offset, len)
            .into_iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .collect();
        self.on_members(work, |m, ranges: Vec<(u64, u64)>| {
            ranges.into_iter().try_for_each(|(off, n)| op(m, off, n))
        })
    }
}

/// Splits `buf` into the slices of `pieces` (which cover it in order) and groups them by
/// member.
fn split_by_member<'b, B: SplitAt<'b>>(
    members: usize,
    pieces: impl Iterator<Item = Piece>,
    mut buf: B,
) -> Vec<(usize, Vec<(u64, B)>)> {
    let mut by_member: Vec<Vec<(u64, B)>> = (0..members).map(|_| Vec::new()).collect();
    for p in pieces {
        let (head, tail) = buf.split(p.len as usize);
        by_member[p.member].push((p.offset, head));
        buf = tail;
    }
    by_member
        .into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// A buffer that can be cut in two: `&[u8]` for writes, `&mut [u8]` for reads.
trait SplitAt<'b>: Sized + Send {
    fn split(self, at: usize) -> (Self, Self);
    fn len(&self) -> usize;
}

impl<'b> SplitAt<'b> for &'b [u8] {
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at(at)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

impl<'b> SplitAt<'b> for &'b mut [u8] {
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at_mut(at)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

impl Backstore for StripeBackstore {
    fn size(&self) -> u64 {
        self.per_member * self.members.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.on_pieces(offset, buf, |m, slice, off| m.read_at(slice, off))
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        check_range(offset, buf.len() as u64, self.size())?;
        let pieces: Vec<Piece> = self.pieces(offset, buf.len() as u64).collect();
        let mut rest = &mut *buf;
        for p in pieces {
            let (head, tail) = rest.split_at_mut(p.len as usize);
            if !self.members[p.member].try_read_at(head, p.offset)? {
                return Ok(false);
            }
            rest = tail;
        }
        Ok(true)
    }

    fn lend(&self, offset: u64, len: u64, wait: bool) -> io::Result<Option<Lent>> {
        check_range(offset, len, self.size())?;
        let mut pieces = self.pieces(offset, len);
        match (pieces.next(), pieces.next()) {
            (Some(p), None) => self.members[p.member].lend(p.offset, p.len, wait),
            _ => Ok(None),
        }
    }

    fn can_lend(&self) -> bool {
        self.members.iter().any(|m| m.can_lend())
    }

    fn lends_memory(&self) -> bool {
        self.members.iter().all(|m| m.lends_memory())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.on_pieces(offset, buf, |m, slice, off| m.write_at(slice, off))
    }

    fn flush(&self) -> io::Result<()> {
        let all = (0..self.members.len()).map(|m| (m, ())).collect();
        self.on_members(all, |m, ()| m.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.on_ranges(offset, len, |m, off, n| m.discard(off, n))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.on_ranges(offset, len, |m, off, n| m.write_zeroes(off, n))
    }

    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        check_range(offset, len, self.size())?;
        let mut out = Vec::new();
        for p in self.pieces(offset, len) {
            for (off, n, alloc) in self.members[p.member].is_allocated(p.offset, p.len)? {
                push_extent(&mut out, offset + p.at + (off - p.offset), n, alloc);
            }
        }
        Ok(out)
    }

    fn supports_discard(&self) -> bool {
        self.members.iter().all(|m| m.supports_discard())
    }

    fn read_only(&self) -> bool {
        self.members.iter().any(|m| m.read_only())
    }

    fn description(&self) -> String {
        let members: Vec<String> = self.members.iter().map(|m| m.description()).collect();
        format!(
            "stripe, {} in units of {} over {} members [{}]",
            Size(self.size()),
            Size(self.unit),
            self.members.len(),
            members.join("; ")
        )
    }

    fn sidecar(&self, _suffix: &str) -> Option<PathBuf> {
        None
    }
}

/// `stripe:?unit=1M&members=[SPEC,SPEC,...]`.
pub(crate) struct StripeFactory;

impl StripeFactory {
    fn unit(spec: &StoreSpec) -> Result<u64, OpenError> {
        let unit = spec.size("unit")?.unwrap_or(DEFAULT_UNIT);
        if unit < MIN_UNIT || !unit.is_multiple_of(MIN_UNIT) {
            return Err(OpenError::invalid(
                spec,
                format!("unit {unit} is not a whole number of 4 KiB pages (64K, 1M, ...)"),
            ));
        }
        if spec.members().is_empty() {
            return Err(OpenError::invalid(
                spec,
                "no members: write them as members=[SPEC,SPEC,...]",
            ));
        }
        Ok(unit)
    }
}

impl StoreFactory for StripeFactory {
    fn kind(&self) -> &str {
        "stripe"
    }

    fn summary(&self) -> &str {
        "RAID-0 over member stores of any kind (stripes too, for two levels); a request \
         that spans members runs on them at once"
    }

    fn params(&self) -> &[Param] {
        &[
            Param {
                name: "unit",
                required: false,
                help: "bytes per member before the next: a multiple of 4 KiB; default 1M",
            },
            Param {
                name: "members",
                required: true,
                help: "the member stores, in order: [SPEC,SPEC,...]; the volume holds as \
                       many whole units as the smallest member, times the members",
            },
        ]
    }

    /// The layout: unit, capacity and each member with its size, one line each (members
    /// that are stripes indented under theirs).
    fn check(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let unit = Self::unit(spec)?;
        let n = spec.members().len() as u64;
        let mut lines = Vec::new();
        let mut sizes = Vec::new();
        for (i, m) in spec.members().iter().enumerate() {
            let description = ctx.check(m)?.replace('\n', "\n    ");
            let size = ctx.capacity(m);
            let shown = match &size {
                Ok(s) => Size(*s).to_string(),
                Err(why) => format!("size not known ({why})"),
            };
            lines.push(format!("  member {i}: {shown}, {description}"));
            sizes.push(size);
        }
        let capacity = match sizes.iter().cloned().collect::<Result<Vec<u64>, _>>() {
            Ok(sizes) => {
                let smallest = sizes.iter().copied().min().unwrap_or(0);
                let per_member = smallest / unit * unit;
                if per_member == 0 {
                    return Err(OpenError::invalid(
                        spec,
                        format!(
                            "the smallest member holds {}, less than one stripe unit of {}",
                            Size(smallest),
                            Size(unit)
                        ),
                    ));
                }
                let unused: u64 = sizes.iter().map(|s| s - per_member).sum();
                let unused = if unused > 0 {
                    format!(" ({} of the members unused)", Size(unused))
                } else {
                    String::new()
                };
                format!(
                    "{}, {} on each{unused}",
                    Size(per_member * n),
                    Size(per_member)
                )
            }
            Err(_) => "capacity known on start".into(),
        };
        let members = if n == 1 { "member" } else { "members" };
        Ok(format!(
            "stripe in units of {} over {n} {members}: {capacity}\n{}",
            Size(unit),
            lines.join("\n")
        ))
    }

    fn capacity(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<u64, String> {
        let unit = Self::unit(spec).map_err(|e| e.to_string())?;
        let mut smallest = u64::MAX;
        for m in spec.members() {
            smallest = smallest.min(ctx.capacity(m)?);
        }
        Ok(smallest / unit * unit * spec.members().len() as u64)
    }

    fn open(
        &self,
        spec: &StoreSpec,
        ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        let unit = Self::unit(spec)?;
        let members = spec
            .members()
            .iter()
            .map(|m| ctx.open(m))
            .collect::<Result<Vec<_>, _>>()?;
        let sizes: Vec<u64> = members.iter().map(|m| m.size()).collect();
        let stripe = StripeBackstore::new(members, unit)
            .map_err(|reason| OpenError::invalid(spec, reason))?;
        let unused: u64 = sizes.iter().map(|s| s - stripe.per_member).sum();
        if unused > 0 {
            tracing::warn!(
                "store `{}`: members of unequal size ({}); {} of them is left unused",
                spec.shown(),
                sizes
                    .iter()
                    .map(|s| Size(*s).to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Size(unused)
            );
        }
        Ok(Arc::new(stripe))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RamBackstore;

    fn ram(n: usize, size: u64) -> Vec<Arc<dyn Backstore>> {
        (0..n)
            .map(|_| Arc::new(RamBackstore::new(size)) as Arc<dyn Backstore>)
            .collect()
    }

    #[test]
    fn pieces_go_round_the_members_a_unit_at_a_time() {
        let s = StripeBackstore::new(ram(3, 1 << 20), 4096).unwrap();
        let p: Vec<Piece> = s.pieces(4096 * 2 + 100, 4096 * 2).collect();
        assert_eq!(
            p,
            [
                Piece {
                    member: 2,
                    offset: 100,
                    len: 3996,
                    at: 0
                },
                Piece {
                    member: 0,
                    offset: 4096,
                    len: 4096,
                    at: 3996
                },
                Piece {
                    member: 1,
                    offset: 4096,
                    len: 100,
                    at: 8092
                },
            ]
        );
        // Three units on three members, then the fourth back on the first, next row.
        let ranges = s.member_ranges(0, 4096 * 7);
        assert_eq!(ranges[0], [(0, 4096 * 3)]);
        assert_eq!(ranges[1], [(0, 4096 * 2)]);
        assert_eq!(ranges[2], [(0, 4096 * 2)]);
    }

    #[test]
    fn the_volume_is_whole_units_of_the_smallest_member() {
        let members = vec![
            Arc::new(RamBackstore::new(10_000)) as Arc<dyn Backstore>,
            Arc::new(RamBackstore::new(20_000)),
        ];
        let s = StripeBackstore::new(members, 4096).unwrap();
        assert_eq!(s.size(), 2 * 8192);
        assert!(StripeBackstore::new(ram(2, 4000), 4096)
            .unwrap_err()
            .contains("less than one stripe unit"));
        assert!(StripeBackstore::new(ram(2, 1 << 20), 1000)
            .unwrap_err()
            .contains("multiple of 4096"));
        assert!(StripeBackstore::new(Vec::new(), 4096).is_err());
    }

    #[test]
    fn bytes_land_on_the_member_and_offset_the_layout_says() {
        let members = ram(4, 64 << 10);
        let s = StripeBackstore::new(members.clone(), 4096).unwrap();
        let data: Vec<u8> = (0..s.size()).map(|i| (i / 7) as u8).collect();
        // Unaligned head and tail, spanning every member several times.
        s.write_at(&data[1234..200_000], 1234).unwrap();
        let mut back = vec![0u8; 200_000 - 1234];
        s.read_at(&mut back, 1234).unwrap();
        assert_eq!(back, data[1234..200_000]);
        // Logical unit 5 is member 1's second unit.
        let mut unit5 = vec![0u8; 4096];
        members[1].read_at(&mut unit5, 4096).unwrap();
        assert_eq!(unit5, data[5 * 4096..6 * 4096]);
        let mut cached = vec![0u8; 10_000];
        assert!(s.try_read_at(&mut cached, 50_000).unwrap());
        assert_eq!(cached, data[50_000..60_000]);
        assert!(s.read_at(&mut [0u8; 10], s.size() - 5).is_err());
    }

    #[test]
    fn zeroes_discard_and_allocation_map_back_to_volume_offsets() {
        let s = StripeBackstore::new(ram(2, 4 << 20), 1 << 20).unwrap();
        s.write_at(&vec![1u8; 3 << 20], 0).unwrap();
        s.discard(1 << 20, 1 << 20).unwrap();
        assert_eq!(
            s.is_allocated(0, 4 << 20).unwrap(),
            [
                (0, 1 << 20, true),
                (1 << 20, 1 << 20, false),
                (2 << 20, 1 << 20, true),
                (3 << 20, 1 << 20, false)
            ]
        );
        s.write_zeroes(100, 5000).unwrap();
        let mut b = vec![9u8; 6000];
        s.read_at(&mut b, 0).unwrap();
        assert!(b[..100].iter().all(|&x| x == 1));
        assert!(b[100..5100].iter().all(|&x| x == 0));
        assert!(b[5100..].iter().all(|&x| x == 1));
    }

    /// A member that hangs holds the requests that touch it, and only those: the others
    /// find helper threads of their own, however many requests wait on it.
    #[test]
    fn a_slow_member_holds_only_what_touches_it() {
        use std::sync::{Condvar, Mutex};
        use std::time::{Duration, Instant};
        #[derive(Debug)]
        struct Gate {
            inner: RamBackstore,
            open: Mutex<bool>,
            cv: Condvar,
        }
        impl Gate {
            fn wait(&self) {
                let mut open = self.open.lock().unwrap();
                while !*open {
                    open = self.cv.wait(open).unwrap();
                }
            }
        }
        impl Backstore for Gate {
            fn size(&self) -> u64 {
                self.inner.size()
            }
            fn read_at(&self, b: &mut [u8], o: u64) -> io::Result<()> {
                self.wait();
                self.inner.read_at(b, o)
            }
            fn write_at(&self, b: &[u8], o: u64) -> io::Result<()> {
                self.wait();
                self.inner.write_at(b, o)
            }
            fn flush(&self) -> io::Result<()> {
                Ok(())
            }
            fn discard(&self, o: u64, l: u64) -> io::Result<()> {
                self.inner.discard(o, l)
            }
            fn write_zeroes(&self, o: u64, l: u64) -> io::Result<()> {
                self.inner.write_zeroes(o, l)
            }
            fn is_allocated(&self, o: u64, l: u64) -> io::Result<Vec<(u64, u64, bool)>> {
                self.inner.is_allocated(o, l)
            }
            fn supports_discard(&self) -> bool {
                false
            }
        }
        let gate = Arc::new(Gate {
            inner: RamBackstore::new(1 << 20),
            open: Mutex::new(false),
            cv: Condvar::new(),
        });
        // Members 0..2 quick, member 3 held at the gate; units of 4 KiB.
        let mut members = ram(3, 1 << 20);
        members.push(gate.clone());
        let s = Arc::new(StripeBackstore::new(members, 4096).unwrap());
        // Eight requests that span every member, the slow one included, wait at the gate.
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || s.write_at(&[5u8; 4 * 4096], 0))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // Requests over members 0..2 only go through meanwhile, spanning ones included.
        let start = Instant::now();
        for _ in 0..50 {
            s.write_at(&[6u8; 3 * 4096], 4 * 4096).unwrap();
            let mut b = [0u8; 3 * 4096];
            s.read_at(&mut b, 4 * 4096).unwrap();
            assert_eq!(b, [6u8; 3 * 4096]);
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(waiting.iter().all(|w| !w.is_finished()));
        *gate.open.lock().unwrap() = true;
        gate.cv.notify_all();
        for w in waiting {
            w.join().unwrap().unwrap();
        }
        let mut b = [0u8; 4 * 4096];
        s.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [5u8; 4 * 4096]);
    }

    /// A member that fails fails the requests that touch it, and only those.
    #[test]
    fn a_failing_member_fails_only_what_touches_it() {
        #[derive(Debug)]
        struct Broken(u64);
        impl Backstore for Broken {
            fn size(&self) -> u64 {
                self.0
            }
            fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
                Err(io::Error::other("member gone"))
            }
            fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
                Err(io::Error::other("member gone"))
            }
            fn flush(&self) -> io::Result<()> {
                Err(io::Error::other("member gone"))
            }
            fn discard(&self, _: u64, _: u64) -> io::Result<()> {
                Err(io::Error::other("member gone"))
            }
            fn write_zeroes(&self, _: u64, _: u64) -> io::Result<()> {
                Err(io::Error::other("member gone"))
            }
            fn is_allocated(&self, o: u64, l: u64) -> io::Result<Vec<(u64, u64, bool)>> {
                Ok(vec![(o, l, true)])
            }
            fn supports_discard(&self) -> bool {
                false
            }
        }
        let members: Vec<Arc<dyn Backstore>> = vec![
            Arc::new(RamBackstore::new(1 << 20)),
            Arc::new(Broken(1 << 20)),
        ];
        let s = StripeBackstore::new(members, 4096).unwrap();
        s.write_at(&[7u8; 4096], 0).unwrap();
        let mut b = [0u8; 4096];
        s.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [7u8; 4096]);
        let e = s.read_at(&mut [0u8; 8192], 0).unwrap_err();
        assert_eq!(e.to_string(), "member gone");
        assert!(s.write_at(&[0u8; 100], 4096).is_err());
        assert!(s.flush().is_err());
    }
}

/// What a request costs the stripe itself, on RAM members (no I/O to wait for): 1 MiB
/// reads with a 1 MiB unit (one member each) and a 256 KiB unit (four members each, three
/// on helper threads). Not a test:
/// `cargo test -p backstore --lib cpu_per_request -- --ignored --nocapture`.
#[cfg(test)]
mod cost {
    use super::*;
    use crate::RamBackstore;
    use std::time::Instant;

    fn cpu_seconds() -> f64 {
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    }

    #[test]
    #[ignore]
    fn cpu_per_request() {
        let members: Vec<Arc<dyn Backstore>> = (0..4)
            .map(|_| Arc::new(RamBackstore::new(64 << 20)) as Arc<dyn Backstore>)
            .collect();
        for unit in [1 << 20, 256 << 10] {
            let s = StripeBackstore::new(members.clone(), unit).unwrap();
            let mut buf = vec![1u8; 1 << 20];
            for i in 0..256 {
                s.write_at(&buf, i << 20).unwrap();
            }
            let n = 4000u64;
            let (t, c) = (Instant::now(), cpu_seconds());
            for i in 0..n {
                s.read_at(&mut buf, (i % 256) << 20).unwrap();
            }
            let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
            eprintln!(
                "1 MiB reads, unit {}: {:.1} us wall, {:.1} us CPU per read",
                Size(unit),
                wall / n as f64 * 1e6,
                cpu / n as f64 * 1e6
            );
        }
    }
}
