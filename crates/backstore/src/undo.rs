//! The far copy kept whole: [`Undo`] wraps a replica's store, and while a *cycle* is open
//! (a sync writing the next image into it) the first change of each unit saves the unit's
//! old content into an undo log beside the store, durably, before the change reaches the
//! medium. A cycle ends in one of two ways:
//! - [`Undo::commit`]: the medium is flushed, then the log's header says the cycle is
//!   committed (one durable write), then its records go. The store holds the new image.
//! - [`Undo::roll_back`]: every saved unit is written back, the medium flushed, then the
//!   header says no cycle is open. The store holds the image it held when the cycle opened.
//!
//! - [`Undo::prepare`], before a commit across several members: the medium is flushed,
//!   then the header says the cycle is *prepared* (whole here). It stays open until it is
//!   committed or rolled back, and a restart keeps it: another member may have committed it
//!   (see `replicate::cycle`).
//!
//! An open cycle found when the store is opened ([`Undo::open`]: the target restarting
//! after a crash with a sync cut off) is rolled back before the store serves anything,
//! unless it is prepared. Every roll back marks the units it restores in the LUN's change
//! map first, when it is given one ([`Undo::open_with`]).
//! One found open by the next cycle's open (the link lost, the source site lost, the
//! coordinator killed, the far target still up) goes on instead: the source counted the
//! units it wrote as sent, and sends the rest, so the cycle ends with the new image; its
//! saved units are still the image before it. A roll back is remembered until the next
//! commit ([`CycleState::rolled_back`]): the source's count of what it sent is then wrong,
//! and the next cycle sends every unit.
//!
//! # The invariant that keeps the far copy whole
//! **A unit's old content is durable in the log before any byte of its new content can
//! become durable in the store.** "Can become", not "is made": the store's writes go to
//! the page cache (or a device's volatile cache), and the kernel writes dirty pages back
//! whenever it likes, long before any flush is asked for. So the ordering point is the
//! moment the change is *issued* to the store, not the store's flush: the record's
//! fdatasync must have returned before the write below this layer even starts. From it:
//! - A crash of the far site (power lost: the page cache gone, the store holding any
//!   mixture of the writes issued so far) finds in the log every unit any issued change
//!   touched, followed perhaps by a torn tail of records whose changes were never issued.
//!   Roll back restores them all: the image before the cycle.
//! - FUA and SYNCHRONIZE CACHE only make the store's writes durable sooner; they come
//!   after the save, so they change nothing here (the log never needs them).
//! - Commit flushes the store before its header says committed: a committed image is
//!   durable whole. Roll back writes the saved units back and flushes the store before
//!   its header says closed: until then a crash rolls back again (the same bytes).
//! - A unit is saved once per cycle, by the first change that touches it; every later
//!   change of it in the cycle, concurrent ones too, goes on only once that first save is
//!   durable (a unit whose record is written but not synced is *pending*, and its writers
//!   wait for it as its saver does).
//! - What a cycle writes whole still needs its old content saved: a cycle cut off is
//!   rolled back (at the far target's start always, and at the next open when its log
//!   failed), and nothing else holds the image before it (the source dropped it at the
//!   last commit). Only a roll forward (the next open continuing the cycle, the source
//!   sending the rest) would not need it, and whether one comes is not known when the
//!   unit is written.
//!
//! # What a save costs, and the group commit
//! The fdatasync is the cost (a journal commit and a cache flush each: milliseconds),
//! not the read and the log write (page cache). So the saves of concurrent writers share
//! their syncs ([`rules::Group`]): each writer, under the log's lock, reads the units it
//! must save (a piece of consecutive units per read) and appends their records (a piece per
//! write); then, without the lock, one writer (the leader) syncs everything appended by
//! then while the others append behind it and wait; when it ends, the writers it covered
//! go on, and one of the rest leads the next sync. A failed sync fails every writer it did
//! not cover, for good (after a failed fdatasync the kernel may drop the dirty pages: a
//! later one succeeding proves nothing), until a roll back. At queue depth 1 there is
//! nothing to group: each first change of a unit still waits one sync.
//!
//! # The rules, and why they are crash-safe
//! The decisions are in [`rules`] (sans-IO: what to save, the log's format, what a log
//! found at start means) and every effect goes through [`UndoFile`], so that the property
//! tests run the real code against a model with a crash injected at every step.
//! - A unit is saved once per cycle, on its first change, whole (the undo unit), and its
//!   record (checksummed, with the cycle's id) is made durable (`fdatasync`) before the
//!   change is passed on. A unit the store holds nothing for (unallocated, as
//!   `is_allocated` says: a fresh far LUN is all holes) is saved as a *hole* record and
//!   one that reads as zeros as a *zeros* record, with no data: the first is rolled back
//!   by unmapping (the unit unallocated again where the store frees space), the second
//!   by writing zeros. A record's magic says its kind, and a data record is as the first
//!   format wrote it, so a log written before these kinds rolls back as it did. A crash
//!   before that sync leaves at most a torn tail, whose changes never reached the
//!   medium: the checksum drops it, and the log ends there. Records are written in the
//!   log's order and a sync covers every record written before it began, so no record a
//!   change went on for lies past a torn one.
//! - Roll back writes the saved units back in the reverse order of the log (each unit is
//!   there once, but reverse order would keep the oldest content if it were not), then
//!   flushes the medium, and only then marks the header closed. A crash during roll back
//!   leaves the cycle open: the next roll back writes the same bytes again (idempotent).
//! - The header is written in one of two slots, alternately, with a sequence number and a
//!   checksum: a torn header write leaves the other slot, the state before it.
//! - Commit flushes the medium before it marks the header: a committed cycle's data is
//!   durable. A crash before the mark rolls the cycle back, which the coordinator sees
//!   (its commit request did not succeed) and does not count as committed.
//!
//! Writes with no cycle open cost one atomic add and one atomic load (as through
//! [`crate::Imaged`]); with a cycle open, a mutex, and the save of each first change.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::{buffers, Backstore, ChangeMap};

/// The undo unit when none is given: a 4 KiB write saves 64 KiB at most, and the map of a
/// 1 TiB store is 2 MiB.
pub const DEFAULT_UNIT: u64 = 64 << 10;

/// The log's format and the decisions about it, with no I/O.
pub mod rules {
    /// Bytes of one header slot; two slots, then the records.
    pub const SLOT: u64 = 4096;
    /// Where the records start.
    pub const RECORDS_AT: u64 = 2 * SLOT;
    /// The header before the prepared state; still read (its `prepared` is 0), never
    /// written.
    const MAGIC_V1: &[u8; 8] = b"RSVUNDO1";
    const MAGIC: &[u8; 8] = b"RSVUNDO2";
    /// A record's first four bytes say what it holds (so a log written before hole and
    /// zero records existed, all data records, still reads and rolls back as it did).
    const RECORD_MAGIC: u32 = 0x5253_5655;
    const HOLE_MAGIC: u32 = 0x5253_5648;
    const ZEROS_MAGIC: u32 = 0x5253_565A;
    /// Bytes of a record's head, before its data.
    pub const RECORD_HEAD: usize = 28;
    const HEADER_V1_LEN: usize = 8 + 8 * 8 + 4;
    const HEADER_LEN: usize = 8 + 9 * 8 + 4;

    /// What the log says of the store.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub struct Header {
        /// Larger in each header written; the valid slot with the larger one is the state.
        pub seq: u64,
        /// The cycle open now (0: none).
        pub open: u64,
        /// When the open cycle's image was cut at its source, ms since the Unix epoch.
        pub open_cut_ms: u64,
        /// The last cycle committed (0: none yet).
        pub committed: u64,
        /// When the committed image was cut at its source, ms since the Unix epoch.
        pub committed_cut_ms: u64,
        pub unit: u64,
        pub size: u64,
        /// A cycle rolled back since the last commit (0: none): the source may have
        /// counted some of its units as sent, so the next cycle sends every unit again.
        pub rolled_back: u64,
        /// The open cycle is *prepared* (0: not): every unit of it was received and made
        /// durable, and its streams are shut out. The first phase of a commit across
        /// several members: a prepared cycle is kept at a restart (not rolled back), since
        /// another member may have committed it, and only the coordinator, or a promote
        /// asking every member, decides whether it commits or rolls back.
        pub prepared: u64,
    }

    impl Header {
        pub fn encode(&self) -> Vec<u8> {
            let mut b = Vec::with_capacity(HEADER_LEN);
            b.extend_from_slice(MAGIC);
            for v in [
                self.seq,
                self.open,
                self.open_cut_ms,
                self.committed,
                self.committed_cut_ms,
                self.unit,
                self.size,
                self.rolled_back,
                self.prepared,
            ] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            let crc = crc32c::crc32c(&b);
            b.extend_from_slice(&crc.to_le_bytes());
            b
        }

        /// A slot's header, if it is whole (either version).
        pub fn decode(b: &[u8]) -> Option<Header> {
            let len = match b.get(..8)? {
                m if m == MAGIC => HEADER_LEN,
                m if m == MAGIC_V1 => HEADER_V1_LEN,
                _ => return None,
            };
            let b = b.get(..len)?;
            let crc = u32::from_le_bytes(b[len - 4..].try_into().ok()?);
            if crc32c::crc32c(&b[..len - 4]) != crc {
                return None;
            }
            let v = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap());
            Some(Header {
                seq: v(0),
                open: v(1),
                open_cut_ms: v(2),
                committed: v(3),
                committed_cut_ms: v(4),
                unit: v(5),
                size: v(6),
                rolled_back: v(7),
                prepared: if len == HEADER_LEN { v(8) } else { 0 },
            })
        }

        /// The slot the next header goes to (the one not holding this header).
        pub fn next_slot(&self) -> u64 {
            ((self.seq + 1) % 2) * SLOT
        }
    }

    /// The state from the two slots: the whole one written last. `None`: neither is whole
    /// (a log never written, or damaged).
    pub fn pick(a: Option<Header>, b: Option<Header>) -> Option<Header> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.seq >= b.seq { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// What to do with a log found when the store opens.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum AtStart {
        /// No cycle open: serve.
        Serve,
        /// Cycle `cycle` was open (cut off): roll it back before serving.
        RollBack { cycle: u64 },
        /// Cycle `cycle` was prepared: whole here, and perhaps committed on another
        /// member. Kept open for the coordinator (or a promote) to commit or roll back.
        Keep { cycle: u64 },
    }

    pub fn at_start(h: &Header) -> AtStart {
        if h.open == 0 {
            AtStart::Serve
        } else if h.prepared == h.open {
            AtStart::Keep { cycle: h.open }
        } else {
            AtStart::RollBack { cycle: h.open }
        }
    }

    /// What a record keeps of its unit's old content.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        /// The unit's bytes follow the head; roll back writes them.
        Data,
        /// The store held nothing there (unallocated, reads as zeros): no bytes follow;
        /// roll back unmaps the unit (or writes zeros where the store cannot unmap).
        Hole,
        /// The unit was allocated but all zeros: no bytes follow; roll back writes zeros.
        Zeros,
    }

    impl Kind {
        fn magic(self) -> u32 {
            match self {
                Kind::Data => RECORD_MAGIC,
                Kind::Hole => HOLE_MAGIC,
                Kind::Zeros => ZEROS_MAGIC,
            }
        }

        fn of_magic(m: u32) -> Option<Kind> {
            match m {
                RECORD_MAGIC => Some(Kind::Data),
                HOLE_MAGIC => Some(Kind::Hole),
                ZEROS_MAGIC => Some(Kind::Zeros),
                _ => None,
            }
        }
    }

    /// A record's head: which unit of which cycle, what it keeps, the unit's length and
    /// the checksum (of the data for a data record; of the head's fields and its kind
    /// for the others, so that a torn head cannot pass for another kind).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct RecordHead {
        pub kind: Kind,
        pub cycle: u64,
        pub unit: u64,
        /// The unit's length (the bytes that follow for a data record, none otherwise).
        pub len: u32,
        pub crc: u32,
    }

    impl RecordHead {
        pub fn new(cycle: u64, unit: u64, data: &[u8]) -> RecordHead {
            let len = data.len() as u32;
            RecordHead {
                kind: Kind::Data,
                cycle,
                unit,
                len,
                crc: Self::sum(Kind::Data, cycle, unit, len, data),
            }
        }

        /// A record that keeps no bytes (`kind` is [`Kind::Hole`] or [`Kind::Zeros`]) of
        /// a unit of `len` bytes.
        pub fn empty(kind: Kind, cycle: u64, unit: u64, len: u32) -> RecordHead {
            debug_assert!(kind != Kind::Data);
            RecordHead {
                kind,
                cycle,
                unit,
                len,
                crc: Self::sum(kind, cycle, unit, len, &[]),
            }
        }

        fn sum(kind: Kind, cycle: u64, unit: u64, len: u32, data: &[u8]) -> u32 {
            let c = crc32c::crc32c(&cycle.to_le_bytes());
            let c = crc32c::crc32c_append(c, &unit.to_le_bytes());
            let c = crc32c::crc32c_append(c, &len.to_le_bytes());
            match kind {
                // As the first format summed it: old logs still check.
                Kind::Data => crc32c::crc32c_append(c, data),
                _ => crc32c::crc32c_append(c, &kind.magic().to_le_bytes()),
            }
        }

        /// Bytes of data that follow the head in the log.
        pub fn data_len(&self) -> usize {
            match self.kind {
                Kind::Data => self.len as usize,
                Kind::Hole | Kind::Zeros => 0,
            }
        }

        pub fn encode(&self) -> [u8; RECORD_HEAD] {
            let mut b = [0u8; RECORD_HEAD];
            b[..4].copy_from_slice(&self.kind.magic().to_le_bytes());
            b[4..12].copy_from_slice(&self.cycle.to_le_bytes());
            b[12..20].copy_from_slice(&self.unit.to_le_bytes());
            b[20..24].copy_from_slice(&self.len.to_le_bytes());
            b[24..28].copy_from_slice(&self.crc.to_le_bytes());
            b
        }

        /// A head as read; `None` if it is no record's (the log's end, or a torn one).
        pub fn decode(b: &[u8]) -> Option<RecordHead> {
            let b = b.get(..RECORD_HEAD)?;
            let kind = Kind::of_magic(u32::from_le_bytes(b[..4].try_into().ok()?))?;
            Some(RecordHead {
                kind,
                cycle: u64::from_le_bytes(b[4..12].try_into().ok()?),
                unit: u64::from_le_bytes(b[12..20].try_into().ok()?),
                len: u32::from_le_bytes(b[20..24].try_into().ok()?),
                crc: u32::from_le_bytes(b[24..28].try_into().ok()?),
            })
        }

        /// Whether the record belongs to `h`'s open cycle and fits its store: a record of
        /// another cycle, or one beyond the store, ends the log.
        pub fn fits(&self, h: &Header) -> bool {
            let start = self.unit.saturating_mul(h.unit);
            self.cycle == h.open
                && h.open != 0
                && start < h.size
                && self.len as u64 == h.unit.min(h.size - start)
        }

        /// Whether `data` is the record's whole content (empty for a record that keeps
        /// no bytes).
        pub fn holds(&self, data: &[u8]) -> bool {
            data.len() == self.data_len()
                && Self::sum(self.kind, self.cycle, self.unit, self.len, data) == self.crc
        }
    }

    /// Whether the store's extents `map` (as [`crate::Backstore::is_allocated`] answers)
    /// say that `[start, end)` is wholly unallocated: a unit to log as a hole, with no
    /// need to read it. A range the map does not cover, or covers in part with
    /// allocated extents, is not.
    pub fn is_hole(map: &[(u64, u64, bool)], start: u64, end: u64) -> bool {
        let mut at = start;
        for &(off, len, alloc) in map {
            let e = off.saturating_add(len);
            if e <= at || off >= end {
                continue;
            }
            if off > at || alloc {
                return false;
            }
            at = e;
            if at >= end {
                return true;
            }
        }
        at >= end
    }

    /// Which record saves a unit whose old content, read, is `data`.
    pub fn kind_of(data: &[u8]) -> Kind {
        // Sixteen bytes at a time: a 64 KiB unit is checked in microseconds.
        let words = data.chunks_exact(16);
        let tail = words.remainder();
        let zero = tail.iter().all(|&b| b == 0)
            && words
                .map(|w| u128::from_ne_bytes(w.try_into().expect("16 bytes")))
                .all(|w| w == 0);
        if zero {
            Kind::Zeros
        } else {
            Kind::Data
        }
    }

    /// The units of an open cycle already saved.
    #[derive(Clone, Debug)]
    pub struct Saved {
        unit: u64,
        size: u64,
        bits: Vec<u64>,
    }

    impl Saved {
        pub fn new(unit: u64, size: u64) -> Saved {
            Saved {
                unit,
                size,
                bits: vec![0; size.div_ceil(unit).div_ceil(64) as usize],
            }
        }

        pub fn is_saved(&self, u: u64) -> bool {
            self.bits
                .get((u / 64) as usize)
                .is_some_and(|w| w & (1 << (u % 64)) != 0)
        }

        pub fn mark(&mut self, u: u64) {
            if let Some(w) = self.bits.get_mut((u / 64) as usize) {
                *w |= 1 << (u % 64);
            }
        }

        /// The first and last units a change of `[offset, offset + len)` touches (any
        /// part of); `None` when it touches none.
        pub fn touched(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
            if len == 0 || offset >= self.size {
                return None;
            }
            let first = offset / self.unit;
            let last = (offset.saturating_add(len) - 1).min(self.size - 1) / self.unit;
            Some((first, last))
        }

        /// The units a change of `[offset, offset + len)` must save first: those it
        /// touches (any part of) not saved yet, in order.
        pub fn to_save(&self, offset: u64, len: u64) -> Vec<u64> {
            match self.touched(offset, len) {
                Some((first, last)) => (first..=last).filter(|&u| !self.is_saved(u)).collect(),
                None => Vec::new(),
            }
        }

        /// The byte range of unit `u`.
        pub fn range(&self, u: u64) -> (u64, u64) {
            let s = u * self.unit;
            (s, (s + self.unit).min(self.size))
        }

        pub fn count(&self) -> u64 {
            self.bits.iter().map(|w| w.count_ones() as u64).sum()
        }
    }

    /// Units in ascending order cut into the pieces one read of the store and one write
    /// of the log take: `(first, count)`, each piece consecutive units, at most `most` of
    /// them (a write that saves a thousand units reads and logs them a piece at a time,
    /// never a thousand units' memory at once).
    pub fn pieces(units: &[u64], most: u64) -> Vec<(u64, u64)> {
        let most = most.max(1);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &u in units {
            match out.last_mut() {
                Some((first, n)) if *first + *n == u && *n < most => *n += 1,
                _ => out.push((u, 1)),
            }
        }
        out
    }

    /// Group commit of the log's records: the writers of a cycle append their saves one
    /// after another (under the log's lock), then each needs the log durable up to the end
    /// of its own records before its change may go on. One writer at a time syncs (the
    /// leader), for every record appended until it starts; the others wait, and find
    /// their records durable when it ends, or lead the next sync for what was appended
    /// meanwhile. So N writers arriving together cost two fdatasyncs at most, not N.
    ///
    /// Positions are byte offsets in the log; a record counts as appended once it is
    /// written whole (to the page cache), and as durable once a sync that began after it
    /// was written has returned.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Group {
        /// The end of the records written whole.
        appended: u64,
        /// The end of the records a finished sync covers.
        durable: u64,
        /// The end a sync running now covers (its leader's `upto`).
        syncing: Option<u64>,
        /// A sync failed: what it did not cover may never be durable (after a failed
        /// fdatasync the kernel may drop the dirty pages), so no writer still waiting
        /// may go on, and none may sync again until a roll back.
        failed: bool,
        /// Syncs begun in this cycle.
        syncs: u64,
    }

    /// What a writer whose records end at `need` does next ([`Group::turn`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Turn {
        /// Its records are durable: its change may go on.
        Go,
        /// It leads: sync the log (without its lock), then [`Group::synced`]`(upto)`, or
        /// [`Group::sync_failed`].
        Sync { upto: u64 },
        /// Another writer's sync runs: wait for it to end, then ask again.
        Wait,
        /// A sync failed before its records were durable: its change must not go on.
        Fail,
    }

    impl Group {
        /// A group whose log holds nothing to sync past `at` (the records' start).
        pub fn new(at: u64) -> Group {
            Group {
                appended: at,
                durable: at,
                syncing: None,
                failed: false,
                syncs: 0,
            }
        }

        /// Records were written whole up to `end`.
        pub fn appended(&mut self, end: u64) {
            self.appended = self.appended.max(end);
        }

        /// What a writer whose records (and those of the units it waits for) end at `need`
        /// does now.
        pub fn turn(&mut self, need: u64) -> Turn {
            if need <= self.durable {
                Turn::Go
            } else if self.failed || need > self.appended {
                // (The second cannot be: a writer waits only for records written whole.
                // Were it so, no sync could cover them, and failing beats waiting forever.)
                Turn::Fail
            } else if self.syncing.is_some() {
                Turn::Wait
            } else {
                // Everything written whole by now, this writer's records among them
                // (need <= appended: it appended, or waits for a unit appended before).
                self.syncing = Some(self.appended);
                self.syncs += 1;
                Turn::Sync {
                    upto: self.appended,
                }
            }
        }

        /// The leader's sync of everything up to `upto` returned.
        pub fn synced(&mut self, upto: u64) {
            self.durable = self.durable.max(upto);
            self.syncing = None;
        }

        /// The leader's sync failed.
        pub fn sync_failed(&mut self) {
            self.syncing = None;
            self.failed = true;
        }

        /// Where the durable records end.
        pub fn durable(&self) -> u64 {
            self.durable
        }

        /// Syncs begun since the group was made.
        pub fn syncs(&self) -> u64 {
            self.syncs
        }
    }
}

use rules::{Group, Header, Kind, RecordHead, Saved, Turn, RECORDS_AT, RECORD_HEAD};

/// The most consecutive units one read of the store and one write of the log carry
/// (1 MiB of the default unit).
const PIECE_UNITS: u64 = 16;

/// A sync of the log that runs without its lock ([`UndoFile::syncer`]).
pub type Syncer = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// Where the undo log lives: the effects its rules need. A file for stores that keep
/// their data; memory for those that do not (a RAM store: a restart loses the data, and
/// its log with it).
pub trait UndoFile: Send + std::fmt::Debug {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes what was written durable (fdatasync).
    fn sync(&mut self) -> io::Result<()>;
    /// A sync to run later without the log's lock, while other writers append to it (the
    /// group commit's leader): when it returns `Ok`, every write made before it was
    /// called is durable (fdatasync of the same file).
    fn syncer(&mut self) -> io::Result<Syncer>;
    fn truncate(&mut self, len: u64) -> io::Result<()>;
}

/// The log in a file, made at the first cycle's open (a store that is never a replica
/// gets no file).
#[derive(Debug)]
pub struct DiskLog {
    path: PathBuf,
    /// Shared with the syncs running without the log's lock ([`UndoFile::syncer`]).
    file: Option<Arc<File>>,
}

impl DiskLog {
    /// The log at `path`, opened if it is there.
    pub fn open(path: &Path) -> io::Result<DiskLog> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => Some(Arc::new(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("undo log {}: {e}", path.display()),
                ))
            }
        };
        Ok(DiskLog {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file, made (and its directory entry made durable) on first use.
    fn made(&mut self) -> io::Result<&File> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("undo log {}: {e}", self.path.display()))
                })?;
            f.sync_all()?;
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
            self.file = Some(Arc::new(f));
        }
        Ok(self.file.as_deref().expect("made"))
    }
}

impl UndoFile for DiskLog {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Some(file) = &self.file else {
            return Ok(0);
        };
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        Ok(got)
    }

    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.made()?.write_all_at(buf, offset)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.made()?.sync_data()
    }

    fn syncer(&mut self) -> io::Result<Syncer> {
        self.made()?;
        let file = self.file.clone().expect("made");
        Ok(Box::new(move || file.sync_data()))
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        match &self.file {
            Some(f) => f.set_len(len),
            None => Ok(()),
        }
    }
}

/// The log in memory.
#[derive(Debug, Default)]
pub struct MemLog {
    bytes: Vec<u8>,
}

impl UndoFile for MemLog {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = (offset as usize).min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - s);
        buf[..n].copy_from_slice(&self.bytes[s..s + n]);
        Ok(n)
    }

    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset as usize + buf.len();
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.bytes[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn syncer(&mut self) -> io::Result<Syncer> {
        Ok(Box::new(|| Ok(())))
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.bytes.resize(len as usize, 0);
        Ok(())
    }
}

/// Why a cycle request is refused.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    #[error("cycle {open} is open here, not cycle {asked}")]
    OtherCycle { open: u64, asked: u64 },
    #[error("no cycle is open here (asked to commit cycle {0})")]
    NotOpen(u64),
    #[error("a cycle's id is not 0")]
    ZeroId,
    #[error("the undo log is unusable: {0}")]
    Broken(String),
}

impl From<UndoError> for io::Error {
    fn from(e: UndoError) -> io::Error {
        let kind = match e {
            UndoError::OtherCycle { .. } | UndoError::NotOpen(_) => io::ErrorKind::InvalidInput,
            UndoError::ZeroId => io::ErrorKind::InvalidInput,
            UndoError::Broken(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// What a replica's undo layer says of itself (for the agent, and for promote: a LUN
/// whose cycle is open holds no whole image until it is committed or rolled back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CycleState {
    /// The cycle open now, if any.
    pub open: Option<u64>,
    /// When the open cycle's image was cut at its source, ms since the Unix epoch.
    pub open_cut_ms: u64,
    /// The last committed cycle, and when its image was cut (ms since the Unix epoch).
    pub committed: Option<(u64, u64)>,
    /// Bytes of old content saved by the open cycle.
    pub saved_bytes: u64,
    /// A cycle rolled back since the last commit: what the source counted as sent in it
    /// is gone, so the next cycle must send every unit.
    pub rolled_back: Option<u64>,
    /// The open cycle, when it is prepared ([`Undo::prepare`]): whole here, waiting to be
    /// committed or rolled back.
    pub prepared: Option<u64>,
    /// Units the open cycle saved, and the syncs (fdatasync) of the log that made their
    /// records durable: fewer syncs than units when concurrent saves were grouped.
    pub saved_units: u64,
    pub log_syncs: u64,
}

/// What [`Undo::open_cycle`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// A new cycle opened.
    New,
    /// Cycle `0` was open already (cut off, its streams gone) and goes on: what it saved
    /// stays, and it now ends with the new image (the source sends what it had not).
    Continued(u64),
}

impl Opened {
    /// The id of the cycle open now, `asked` being the one asked for.
    pub fn id(self, asked: u64) -> u64 {
        match self {
            Opened::New => asked,
            Opened::Continued(c) => c,
        }
    }
}

/// A store whose changes during a cycle can be undone. See the module documentation.
#[derive(Debug)]
pub struct Undo {
    inner: Arc<dyn Backstore>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Writes in progress on the fast path (no cycle open when they started).
    fast: AtomicU64,
    /// A cycle is open, or an exclusive step runs: writes take the slow path.
    active: AtomicBool,
    gate: Mutex<Gate>,
    gate_cv: Condvar,
    log: Mutex<Log>,
    /// A sync of the log's records ended (with the log's lock): its followers look again.
    synced: Condvar,
}

#[derive(Debug, Default)]
struct Gate {
    /// Writes in progress on the slow path.
    writers: u64,
    /// Open, commit or roll back runs: no write may start.
    exclusive: bool,
}

#[derive(Debug)]
struct Log {
    file: Box<dyn UndoFile>,
    header: Header,
    /// The open cycle's saved units.
    saved: Option<Saved>,
    /// Where the next record goes.
    end: u64,
    /// Set when an effect on the log failed halfway: nothing more is done until a roll
    /// back (at the next open, or the next start) succeeds.
    broken: Option<String>,
    /// The LUN's change map: a roll back marks the units it restores there, durably,
    /// before it writes them back (see [`Undo::open_with`]).
    changes: Option<Arc<ChangeMap>>,
    /// The open cycle's group commit: which records are durable, who syncs.
    group: Group,
    /// Units whose records were written but may not be durable yet, and where each
    /// record ends: a write to one waits until its record is durable, as its saver does.
    pending: BTreeMap<u64, u64>,
}

/// A write's pass through the gate; dropped when the write has returned.
struct Pass {
    shared: Arc<Shared>,
    slow: bool,
}

impl Drop for Pass {
    fn drop(&mut self) {
        if self.slow {
            let mut g = self.shared.gate.lock().unwrap();
            g.writers -= 1;
            if g.writers == 0 {
                self.shared.gate_cv.notify_all();
            }
        } else {
            self.shared.fast.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Open, commit or roll back, alone: no write runs meanwhile.
struct Exclusive<'a> {
    shared: &'a Shared,
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        let open = self.shared.log.lock().unwrap().saved.is_some();
        let mut g = self.shared.gate.lock().unwrap();
        g.exclusive = false;
        self.shared.active.store(open, Ordering::SeqCst);
        self.shared.gate_cv.notify_all();
    }
}

impl Shared {
    fn exclusive(&self) -> Exclusive<'_> {
        let mut g = self.gate.lock().unwrap();
        while g.exclusive {
            g = self.gate_cv.wait(g).unwrap();
        }
        g.exclusive = true;
        self.active.store(true, Ordering::SeqCst);
        drop(g);
        let mut spins = 0u32;
        while self.fast.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let mut g = self.gate.lock().unwrap();
        while g.writers != 0 {
            g = self.gate_cv.wait(g).unwrap();
        }
        Exclusive { shared: self }
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap()
    }
}

impl Log {
    /// Whether cycle `cycle` is the one open here, its log whole: what a prepare and a
    /// commit ask first.
    fn holds_open(&self, cycle: u64) -> io::Result<()> {
        if self.header.open == 0 {
            return Err(UndoError::NotOpen(cycle).into());
        }
        if self.header.open != cycle {
            return Err(UndoError::OtherCycle {
                open: self.header.open,
                asked: cycle,
            }
            .into());
        }
        if let Some(why) = &self.broken {
            return Err(UndoError::Broken(why.clone()).into());
        }
        Ok(())
    }

    /// No record written yet: at a cycle's open, commit and roll back (no writer runs).
    fn restart_group(&mut self) {
        self.group = Group::new(RECORDS_AT);
        self.pending.clear();
    }

    fn write_header(&mut self, mut h: Header) -> io::Result<()> {
        h.seq = self.header.seq + 1;
        let slot = self.header.next_slot();
        self.file.write_all_at(&h.encode(), slot)?;
        self.file.sync()?;
        self.header = h;
        Ok(())
    }

    /// Reads the open cycle's records (up to the first that is not whole).
    fn records(&self) -> io::Result<Vec<(RecordHead, u64)>> {
        let mut out = Vec::new();
        let mut at = RECORDS_AT;
        let mut head = [0u8; RECORD_HEAD];
        let mut data = Vec::new();
        loop {
            if self.file.read_at(&mut head, at)? < RECORD_HEAD {
                break;
            }
            let Some(h) = RecordHead::decode(&head).filter(|h| h.fits(&self.header)) else {
                break;
            };
            data.resize(h.data_len(), 0);
            if self.file.read_at(&mut data, at + RECORD_HEAD as u64)? < data.len()
                || !h.holds(&data)
            {
                tracing::warn!(
                    "undo log: a torn record of unit {} at its end ignored (its change never \
                     reached the store)",
                    h.unit
                );
                break;
            }
            out.push((h, at + RECORD_HEAD as u64));
            at += RECORD_HEAD as u64 + h.data_len() as u64;
        }
        Ok(out)
    }
}

impl Undo {
    /// Wraps `inner` with its undo log in `file` (`unit`: the undo unit, a power of two of
    /// 512 or more). A log whose cycle is open is rolled back here, before the store
    /// serves anything. A log of another unit or size is refused (say why: the store was
    /// resized with a cycle open, or the file is another's).
    pub fn open(inner: Arc<dyn Backstore>, file: Box<dyn UndoFile>, unit: u64) -> io::Result<Undo> {
        Undo::open_with(inner, file, unit, None)
    }

    /// [`Undo::open`], and every roll back (this one's at start included) marks the units
    /// it restores in `changes`, the LUN's change map, before writing them back. Those
    /// units hold again what the last committed image held, but the source of the cycle
    /// rolled back counted them as sent (`ChangeMap::sent`) and no longer has them in its
    /// own map: marked here, they count as changed since the last image both sides hold,
    /// so that a resync from this side (after a promote), or onto it, sends them. The
    /// layers under the undo layer may mark them too (a change-tracking layer sees the
    /// writes back); this does not depend on it.
    pub fn open_with(
        inner: Arc<dyn Backstore>,
        file: Box<dyn UndoFile>,
        unit: u64,
        changes: Option<Arc<ChangeMap>>,
    ) -> io::Result<Undo> {
        if !unit.is_power_of_two() || unit < 512 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("undo unit {unit} is not a power of two of 512 or more"),
            ));
        }
        let size = inner.size();
        let mut a = vec![0u8; rules::SLOT as usize];
        let mut b = vec![0u8; rules::SLOT as usize];
        file.read_at(&mut a, 0)?;
        file.read_at(&mut b, rules::SLOT)?;
        let found = rules::pick(Header::decode(&a), Header::decode(&b));
        let mut log = Log {
            file,
            header: Header::default(),
            saved: None,
            end: RECORDS_AT,
            broken: None,
            changes,
            group: Group::new(RECORDS_AT),
            pending: BTreeMap::new(),
        };
        match found {
            None => {
                // A new log (or one never written whole: no cycle was ever opened in it,
                // since opening a cycle writes a header first and syncs it). Nothing is
                // written until a cycle opens.
                log.header = Header {
                    unit,
                    size,
                    ..Header::default()
                };
            }
            Some(h) => {
                log.header = h;
                let at_start = rules::at_start(&h);
                if let rules::AtStart::Keep { cycle } = at_start {
                    if h.size != size || h.unit != unit {
                        return Err(io::Error::other(format!(
                            "the undo log of prepared cycle {cycle} is of a store of {} bytes \
                             in units of {}, this one holds {size} in units of {unit}: it \
                             cannot be committed or rolled back here",
                            h.size, h.unit
                        )));
                    }
                    // Its records are the image before it: found again, so that a roll
                    // back (or a continuing cycle's next first changes) has them.
                    let records = log.records()?;
                    let mut saved = Saved::new(h.unit, h.size);
                    let mut end = RECORDS_AT;
                    for (head, at) in &records {
                        saved.mark(head.unit);
                        end = at + head.len as u64;
                    }
                    log.saved = Some(saved);
                    log.end = end;
                    // Read back from the file: durable already.
                    log.group = Group::new(end);
                    tracing::warn!(
                        "{}: cycle {cycle} is prepared (whole here, perhaps committed on \
                         another member): kept for the coordinator or a promote to commit or \
                         roll back ({} unit(s) saved)",
                        inner.description(),
                        records.len()
                    );
                }
                if let rules::AtStart::RollBack { cycle } = at_start {
                    if h.size != size {
                        return Err(io::Error::other(format!(
                            "the undo log of cycle {cycle} is of a store of {} bytes, this one \
                             holds {size}: it cannot be rolled back here",
                            h.size
                        )));
                    }
                    tracing::warn!(
                        "{}: cycle {cycle} was cut off; rolling it back to the image of cycle {}",
                        inner.description(),
                        h.committed
                    );
                    roll_back(&mut log, &inner)?;
                }
                if log.header.unit != unit || log.header.size != size {
                    let h = Header {
                        unit,
                        size,
                        ..log.header
                    };
                    log.write_header(h)?;
                }
            }
        }
        // A prepared cycle kept open: its first changes are still saved.
        let active = log.saved.is_some();
        Ok(Undo {
            inner,
            shared: Arc::new(Shared {
                fast: AtomicU64::new(0),
                active: AtomicBool::new(active),
                gate: Mutex::new(Gate::default()),
                gate_cv: Condvar::new(),
                log: Mutex::new(log),
                synced: Condvar::new(),
            }),
        })
    }

    /// [`Undo::open`] with the log in the file at `path` (made if missing).
    pub fn open_file(inner: Arc<dyn Backstore>, path: &Path, unit: u64) -> io::Result<Undo> {
        Undo::open_file_with(inner, path, unit, None)
    }

    /// [`Undo::open_with`] with the log in the file at `path` (made if missing).
    pub fn open_file_with(
        inner: Arc<dyn Backstore>,
        path: &Path,
        unit: u64,
        changes: Option<Arc<ChangeMap>>,
    ) -> io::Result<Undo> {
        let file = DiskLog::open(path)?;
        Undo::open_with(inner, Box::new(file), unit, changes)
    }

    pub fn inner(&self) -> &Arc<dyn Backstore> {
        &self.inner
    }

    /// The cycle open now, if any: while it is, the store holds no whole image (a sync is
    /// writing the next one) until [`Undo::commit`] or [`Undo::roll_back`].
    pub fn cycle_open(&self) -> Option<u64> {
        let log = self.shared.log();
        (log.header.open != 0).then_some(log.header.open)
    }

    pub fn state(&self) -> CycleState {
        let log = self.shared.log();
        let h = &log.header;
        CycleState {
            open: (h.open != 0).then_some(h.open),
            open_cut_ms: h.open_cut_ms,
            committed: (h.committed != 0).then_some((h.committed, h.committed_cut_ms)),
            saved_bytes: log.end - RECORDS_AT,
            rolled_back: (h.rolled_back != 0).then_some(h.rolled_back),
            prepared: (h.open != 0 && h.prepared == h.open).then_some(h.open),
            saved_units: log.saved.as_ref().map_or(0, Saved::count),
            log_syncs: log.group.syncs(),
        }
    }

    /// Opens cycle `cycle` (its image cut at its source at `cut_ms`, ms since the Unix
    /// epoch): from now on the first change of each unit is saved first. A cycle open
    /// already (cut off: its coordinator or its source gone) goes on instead, to end with
    /// the new image: what it saved is the image before it, and the units its streams
    /// wrote are counted as sent at the source. Its cut moment becomes `cut_ms`. A cycle
    /// whose log failed is rolled back first, and a new one opens.
    pub fn open_cycle(&self, cycle: u64, cut_ms: u64) -> io::Result<Opened> {
        if cycle == 0 {
            return Err(UndoError::ZeroId.into());
        }
        let _alone = self.shared.exclusive();
        let mut log = self.shared.log();
        let open = log.header.open;
        if open != 0 && log.broken.is_none() && log.saved.is_some() {
            // Going on, the cycle takes new writes: prepared no more (until prepared again).
            if log.header.open_cut_ms != cut_ms || log.header.prepared != 0 {
                let h = Header {
                    open_cut_ms: cut_ms,
                    prepared: 0,
                    ..log.header
                };
                log.write_header(h)?;
            }
            return Ok(if open == cycle {
                Opened::New
            } else {
                Opened::Continued(open)
            });
        }
        if open != 0 {
            tracing::warn!(
                "{}: cycle {open} cannot go on (its undo log failed); rolled back before cycle {cycle} opens",
                self.inner.description(),
            );
            roll_back(&mut log, &self.inner)?;
        }
        // Records of an older cycle would not fit this one's header; cleared anyway so
        // that the log holds only what the cycle saves.
        log.file.truncate(RECORDS_AT)?;
        let h = Header {
            open: cycle,
            open_cut_ms: cut_ms,
            prepared: 0,
            ..log.header
        };
        log.write_header(h)?;
        log.end = RECORDS_AT;
        log.saved = Some(Saved::new(h.unit, h.size));
        log.broken = None;
        log.restart_group();
        Ok(Opened::New)
    }

    /// Prepares cycle `cycle`, the first phase of a commit across members: the store's
    /// writes are made durable, then the log says the cycle is prepared (one durable
    /// write). A prepared cycle is whole here and stays open until [`Undo::commit`] or
    /// [`Undo::roll_back`]; a restart keeps it (see [`rules::AtStart::Keep`]). The caller
    /// shuts the cycle's writers out first (the fence), so that what is prepared is all
    /// they write. Asked again: no change.
    pub fn prepare(&self, cycle: u64) -> io::Result<()> {
        let _alone = self.shared.exclusive();
        let mut log = self.shared.log();
        log.holds_open(cycle)?;
        if log.header.prepared == cycle {
            return Ok(());
        }
        self.inner.flush()?;
        let h = Header {
            prepared: cycle,
            ..log.header
        };
        log.write_header(h)
    }

    /// Commits cycle `cycle`: the store's writes are made durable, then the log says the
    /// cycle is committed, then its records go. A commit of the cycle committed last is no
    /// change (a coordinator asking again).
    pub fn commit(&self, cycle: u64) -> io::Result<()> {
        let _alone = self.shared.exclusive();
        let mut log = self.shared.log();
        if log.header.open == 0 && log.header.committed == cycle && cycle != 0 {
            return Ok(());
        }
        log.holds_open(cycle)?;
        self.inner.flush()?;
        let h = Header {
            open: 0,
            open_cut_ms: 0,
            committed: cycle,
            committed_cut_ms: log.header.open_cut_ms,
            rolled_back: 0,
            prepared: 0,
            ..log.header
        };
        log.write_header(h)?;
        log.saved = None;
        log.end = RECORDS_AT;
        log.restart_group();
        // The decision is durable; freeing the records' space may fail without harm.
        if let Err(e) = log.file.truncate(RECORDS_AT) {
            tracing::warn!("undo log: freeing the records of cycle {cycle}: {e}");
        }
        Ok(())
    }

    /// Rolls the open cycle back (none open: nothing). Returns the cycle rolled back.
    pub fn roll_back(&self) -> io::Result<Option<u64>> {
        let _alone = self.shared.exclusive();
        let mut log = self.shared.log();
        let open = log.header.open;
        if open == 0 {
            return Ok(None);
        }
        roll_back(&mut log, &self.inner)?;
        Ok(Some(open))
    }

    fn enter(&self) -> Pass {
        let s = &self.shared;
        s.fast.fetch_add(1, Ordering::SeqCst);
        if !s.active.load(Ordering::SeqCst) {
            return Pass {
                shared: s.clone(),
                slow: false,
            };
        }
        s.fast.fetch_sub(1, Ordering::SeqCst);
        let mut g = s.gate.lock().unwrap();
        while g.exclusive {
            g = s.gate_cv.wait(g).unwrap();
        }
        g.writers += 1;
        Pass {
            shared: s.clone(),
            slow: true,
        }
    }

    /// Saves what a change of `[offset, offset + len)` overwrites, when a cycle is open,
    /// and returns once that is durable; fails (and the change must not go on) when it
    /// cannot be made durable. The units it saves are read and logged under the log's
    /// lock (so a unit is saved once, before anyone changes it); the sync that makes them
    /// durable runs without it, shared with every writer whose records are in the log by
    /// then ([`rules::Group`]). A unit another writer saved, whose record is not durable
    /// yet, is waited for as if saved here.
    fn save(&self, pass: &Pass, offset: u64, len: u64) -> io::Result<()> {
        if !pass.slow {
            return Ok(());
        }
        let mut log = self.shared.log();
        let Some(saved) = &log.saved else {
            return Ok(());
        };
        let Some((first, last)) = saved.touched(offset, len) else {
            return Ok(());
        };
        let units = saved.to_save(offset, len);
        // The records of the units another writer is saving, not durable yet.
        let mut need = log
            .pending
            .range(first..=last)
            .map(|(_, &end)| end)
            .max()
            .unwrap_or(0);
        if !units.is_empty() {
            need = need.max(self.append(&mut log, &units)?);
        }
        self.durable(log, need)
    }

    /// Reads `units` (not saved, ascending) from the store and writes their records at
    /// the log's end, a piece of consecutive units per read and per write; marks them
    /// saved, their records pending. Returns where the records end. Under the log's lock.
    fn append(&self, log: &mut Log, units: &[u64]) -> io::Result<u64> {
        if let Some(why) = &log.broken {
            return Err(UndoError::Broken(why.clone()).into());
        }
        let cycle = log.header.open;
        let saved = log.saved.as_ref().expect("a cycle is open");
        let mut old = Vec::new();
        let mut out = Vec::new();
        let mut end = log.end;
        let r = (|| -> io::Result<()> {
            // One question to the store for the whole save: a unit it holds nothing for
            // is logged as a hole without being read (a fresh far LUN is all holes).
            let map = allocation(&*self.inner, saved, units);
            for (first, n) in rules::pieces(units, PIECE_UNITS) {
                let (s, _) = saved.range(first);
                let (_, e) = saved.range(first + n - 1);
                let holes: Vec<bool> = (first..first + n)
                    .map(|u| {
                        let (us, ue) = saved.range(u);
                        rules::is_hole(&map, us, ue)
                    })
                    .collect();
                if holes.iter().any(|&h| !h) {
                    old.resize((e - s) as usize, 0);
                    self.inner.read_at(&mut old, s)?;
                }
                out.clear();
                for (u, &hole) in (first..first + n).zip(&holes) {
                    let (us, ue) = saved.range(u);
                    let len = (ue - us) as u32;
                    if hole {
                        out.extend_from_slice(
                            &RecordHead::empty(Kind::Hole, cycle, u, len).encode(),
                        );
                        continue;
                    }
                    let data = &old[(us - s) as usize..(ue - s) as usize];
                    if rules::kind_of(data) == Kind::Zeros {
                        out.extend_from_slice(
                            &RecordHead::empty(Kind::Zeros, cycle, u, len).encode(),
                        );
                    } else {
                        out.extend_from_slice(&RecordHead::new(cycle, u, data).encode());
                        out.extend_from_slice(data);
                    }
                }
                log.file.write_all_at(&out, end)?;
                end += out.len() as u64;
            }
            Ok(())
        })();
        if let Err(e) = r {
            // Records past `log.end` may be half there: the next save would append after
            // them and leave a hole in the log. Nothing more until a roll back; the
            // records before `log.end` stay whole, and their writers may still sync them.
            let why = format!("saving units of cycle {cycle}: {e}");
            tracing::error!("undo log: {why}");
            log.broken = Some(why);
            return Err(e);
        }
        log.end = end;
        log.group.appended(end);
        let saved = log.saved.as_mut().expect("checked");
        for &u in units {
            saved.mark(u);
            log.pending.insert(u, end);
        }
        Ok(end)
    }

    /// Returns once the log is durable up to `need`: as the group's leader, syncing
    /// without the lock, or as a follower, waiting for the leader.
    fn durable<'a>(&'a self, mut log: MutexGuard<'a, Log>, need: u64) -> io::Result<()> {
        loop {
            match log.group.turn(need) {
                Turn::Go => return Ok(()),
                Turn::Fail => {
                    let why = log.broken.clone().unwrap_or_else(|| "a sync failed".into());
                    return Err(UndoError::Broken(why).into());
                }
                Turn::Wait => log = self.shared.synced.wait(log).unwrap(),
                Turn::Sync { upto } => {
                    let r = match log.file.syncer() {
                        Ok(sync) => {
                            drop(log);
                            let r = sync();
                            log = self.shared.log();
                            r
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = r {
                        // Whatever the failed sync did not cover may be lost even if a
                        // later one succeeds (the kernel may have dropped the dirty
                        // pages): no writer waiting on it goes on.
                        let why = format!("syncing the records of cycle {}: {e}", log.header.open);
                        tracing::error!("undo log: {why}");
                        log.group.sync_failed();
                        log.broken = Some(why);
                        self.shared.synced.notify_all();
                        return Err(e);
                    }
                    log.group.synced(upto);
                    log.pending.retain(|_, &mut end| end > upto);
                    self.shared.synced.notify_all();
                }
            }
        }
    }

    fn change(&self, offset: u64, len: u64, op: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let pass = self.enter();
        self.save(&pass, offset, len)?;
        op()
    }
}

/// What the store says of the allocation of the span of `units` (one question for the
/// whole save). A store that cannot answer, or fails to, gets an empty map: every unit
/// is then read, as if allocated.
fn allocation(inner: &dyn Backstore, saved: &Saved, units: &[u64]) -> Vec<(u64, u64, bool)> {
    let (Some(&first), Some(&last)) = (units.first(), units.last()) else {
        return Vec::new();
    };
    let (start, _) = saved.range(first);
    let (_, end) = saved.range(last);
    match inner.is_allocated(start, end - start) {
        Ok(map) => map,
        Err(e) => {
            tracing::debug!(
                "undo log: allocation of {start}+{}: {e}; read instead",
                end - start
            );
            Vec::new()
        }
    }
}

/// Puts back the old content of the unit `head` saved (its data at `at` of the log): the
/// bytes; for a hole, the unit unmapped (which reads as zeros, and is unallocated again
/// where the store frees space), or zeros written where the store cannot unmap; for
/// zeros, zeros written.
fn restore(
    log: &Log,
    inner: &Arc<dyn Backstore>,
    head: &RecordHead,
    at: u64,
    data: &mut Vec<u8>,
) -> io::Result<()> {
    let start = head.unit * log.header.unit;
    let len = head.len as u64;
    match head.kind {
        Kind::Data => {
            data.resize(head.data_len(), 0);
            log.file.read_at(data, at)?;
            inner.write_at(data, start)
        }
        Kind::Hole if inner.supports_discard() => inner.discard(start, len),
        Kind::Hole | Kind::Zeros => inner.write_zeroes(start, len),
    }
}

/// Writes the open cycle's saved units back (last saved first), flushes the store, then
/// marks the log closed. Safe to repeat after a crash at any step.
fn roll_back(log: &mut Log, inner: &Arc<dyn Backstore>) -> io::Result<()> {
    let records = log.records()?;
    if let Some(map) = &log.changes {
        // Durably in the map before any unit goes back: a crash between leaves a unit
        // marked for nothing, never one restored and not marked.
        let mut units: Vec<u64> = records.iter().map(|(h, _)| h.unit).collect();
        units.sort_unstable();
        units.dedup();
        let unit = log.header.unit;
        let size = log.header.size;
        let mut i = 0;
        while i < units.len() {
            let mut j = i + 1;
            while j < units.len() && units[j] == units[j - 1] + 1 {
                j += 1;
            }
            let start = units[i] * unit;
            let end = ((units[j - 1] + 1) * unit).min(size).min(map.size());
            if start < end {
                map.mark(start, end - start)?;
            }
            i = j;
        }
    }
    let mut data = Vec::new();
    for (head, at) in records.iter().rev() {
        restore(log, inner, head, *at, &mut data)?;
    }
    inner.flush()?;
    let cycle = log.header.open;
    let h = Header {
        open: 0,
        open_cut_ms: 0,
        rolled_back: cycle,
        prepared: 0,
        ..log.header
    };
    log.write_header(h)?;
    log.saved = None;
    log.end = RECORDS_AT;
    log.broken = None;
    log.restart_group();
    if let Err(e) = log.file.truncate(RECORDS_AT) {
        tracing::warn!("undo log: freeing the records of cycle {cycle}: {e}");
    }
    tracing::info!(
        "{}: cycle {cycle} rolled back ({} unit(s) restored)",
        inner.description(),
        records.len()
    );
    Ok(())
}

impl Backstore for Undo {
    crate::forward! { inner =>
        size, announce_reset, on_peer_reset, supports_discard, read_only, description, sidecar,
        read_at, try_read_at, reads_async, read_async, is_allocated,
        reads_lent_async, read_lent_async,
        lend, can_lend, lends_memory,
        changes, flush, flush_async,
        cluster_reservations, port_groups, atomic_compare_and_write_unit, changes_compare_and_write,
    }

    /// Not while a cycle is open: a write may then wait for its save's sync, or another
    /// writer's, which must not stall the event loop that started it (a store whose
    /// writes complete on its own threads, librbd's, is otherwise written from there); the
    /// logical unit then writes on a blocking worker. Asked before each command.
    fn writes_async(&self) -> bool {
        self.inner.writes_async() && !self.shared.active.load(Ordering::SeqCst)
    }

    fn write_async(&self, buf: buffers::Buf, offset: u64, durable: bool, done: crate::WriteDone) {
        let pass = self.enter();
        // The save is made (durably) on this thread before the write starts: a write
        // started here as the cycle opened (`writes_async` said yes just before).
        if let Err(e) = self.save(&pass, offset, buf.len() as u64) {
            return done(buf, Err(e));
        }
        self.inner.write_async(
            buf,
            offset,
            durable,
            Box::new(move |buf, r| {
                drop(pass);
                done(buf, r)
            }),
        )
    }
}

#[cfg(test)]
mod tests;
