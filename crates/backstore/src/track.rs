//! Change tracking for a store, kept crash-safe: which fixed-size units were written since
//! the last transfer to another site, so that an incremental sync sends only those.
//!
//! A [`ChangeMap`] is a bitmap of units (a power of two, at least 4 KiB; 1 MiB by
//! default) over a store of a given size, kept in a file beside the store's data.
//! [`Tracked`] wraps a store so that every call that changes data marks its units first.
//!
//! # The rule
//! Every write that returns success has its units marked *durably* (in the map file,
//! fsynced: in the current set, or already in the frozen set on disk) before it returns. Marking comes before the store's own write: a crash after
//! the data landed but before the mark could otherwise lose a change, while a mark whose
//! write never happened only costs a unit sent for nothing. So the map may say too much,
//! never too little. Wherever the map cannot be trusted (no file, a bad header, another
//! store size or unit, a page whose checksum fails) it says "dirty" for what it cannot
//! vouch for, and logs a warning.
//!
//! Only the first write to a clean unit pays for an fsync of the map; a unit in the frozen
//! set (being sent) is marked in memory only, and its bit reaches the disk with the next
//! group commit or the release, before the frozen bit can go. A unit already
//! marked costs an atomic bit test (plus two atomic counter updates that let a freeze know
//! when the writes of its epoch are over); no lock. First writes to clean units that
//! arrive together share one write and fsync of the map (group commit: one thread writes
//! the pages all waiting writers have set, the others wait for it).
//!
//! # Epochs: freeze and release
//! A sync calls [`ChangeMap::freeze`]: the units dirty so far (the *current* set) join the
//! *frozen* set, which the sync sends, and the current set starts empty for the writes
//! that follow. After a successful transfer the sync calls [`ChangeMap::release`] with the
//! frozen set's id, and the map forgets it. A failed sync just does not release: its
//! frozen set stays, and the next freeze returns the union of it and everything written
//! since, so nothing is ever lost. `freeze` returns only when every write that may have
//! marked its units in the old current set has finished, so reading the frozen units after
//! `freeze` returns sees those writes. A write that starts after the freeze marks the new
//! current set, so a unit the sync reads while it is being written is sent again next time.
//!
//! Ids are epochs: they only grow, and a map that starts over (new, or not to be trusted)
//! starts past any id it could have handed out before.
//!
//! # A new map
//! A map that does not exist yet knows nothing of the store's history: [`NewMap::AllDirty`]
//! (what the target uses) starts with every unit dirty, so the first sync sends the whole
//! store. [`NewMap::Clean`] starts empty, for a store created together with its map (and
//! with a peer known to hold the same bytes, zeros for a fresh sparse store).
//!
//! # On disk
//! All integers little-endian; the file is made of 4 KiB pages:
//! ```text
//! page 0, header: magic "RSVCHMAP", version u32 (1), page size u32 (4096), unit u64,
//!                 store size u64, epoch u64, frozen id u64 (0: none), units u64,
//!                 CRC32C u32 of the 56 bytes before it; zeros to the end of the page
//! pages 1..=P:    the frozen set                P = ceil(units / 32704)
//! pages P+1..=2P: the current set
//! bitmap page:    CRC32C u32 of (epoch u64, page number u64, the bits), u32 zero,
//!                 4088 bytes of bits (unit i of the page is bit i % 8 of byte i / 8)
//! ```
//! Marking rewrites the current set's pages in place and fsyncs (`fdatasync`) the file.
//! In-place writes only ever set bits, so a page torn by a crash holds a mix of the old
//! and new content, both of which are supersets of what was durable before; its checksum
//! fails, and on open every unit of the page counts as dirty. Freeze, release and open
//! write a whole new file instead: `PATH.tmp`, fsync, rename over `PATH`, fsync the
//! directory. A crash leaves either the old file or the new one, each consistent; a
//! leftover `PATH.tmp` is removed on open. Open always rewrites the file so, with what it
//! recovered, and keeps it open for marking.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::{check_range, Backstore};
use units::Size;

/// The unit when none is given: a 1 MiB command marks one unit, and a map of a 1 TiB
/// store is two bitmaps of 128 KiB.
pub const DEFAULT_UNIT: u64 = 1 << 20;
/// The smallest unit: one page.
pub const MIN_UNIT: u64 = 4096;

const MAGIC: &[u8; 8] = b"RSVCHMAP";
const VERSION: u32 = 1;
const PAGE: usize = 4096;
/// Bytes of bits in a bitmap page, after its checksum and a reserved word.
const PAGE_BITS_BYTES: usize = PAGE - 8;
const WORDS_PER_PAGE: usize = PAGE_BITS_BYTES / 8;
const UNITS_PER_PAGE: u64 = (PAGE_BITS_BYTES * 8) as u64;
/// A write's step that takes this long or more is logged at debug level (target
/// `backstore::slow`): where a slow write's time went.
pub(crate) const SLOW: Duration = Duration::from_millis(5);

/// What a map that does not exist yet starts as (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewMap {
    /// The store's history is unknown: every unit dirty.
    AllDirty,
    /// The store is as new as its map: no unit dirty.
    Clean,
}

/// Units written and not yet sent, kept crash-safe in a file. See the module documentation.
pub struct ChangeMap {
    path: PathBuf,
    unit_shift: u32,
    size: u64,
    units: u64,
    /// The current set's bits that are on disk: a unit set here needs no marking. Cleared
    /// when a freeze starts a new current set.
    durable: Box<[AtomicU64]>,
    /// The epoch of the current set; writes register under it (`inflight`).
    epoch: AtomicU64,
    /// Writes in progress, by the parity of the epoch they started in: a freeze waits for
    /// those of the epoch it ends.
    inflight: [AtomicU64; 2],
    state: Mutex<State>,
    /// Woken when a group commit ends or a freeze or release rewrites the file.
    committed: Condvar,
    /// Freeze and release one at a time, waits for writes included.
    epochs: Mutex<()>,
    /// Why the map was not taken as it was found on open, if it was not.
    recovery: Option<String>,
}

/// What the lock guards: the bitmaps as the file will have them.
struct State {
    file: Arc<File>,
    epoch: u64,
    /// The frozen set's id (the epoch its freeze started), 0 when there is none.
    frozen_id: u64,
    frozen: Vec<u64>,
    /// The current set, with bits not yet on disk.
    current: Vec<u64>,
    /// Pages of `current` with bits not yet on disk.
    dirty_pages: BTreeSet<usize>,
    /// Group commit: marks join batch `next_batch`; batches up to `written_batch` are
    /// on disk; `committing` while one thread writes a batch.
    next_batch: u64,
    written_batch: u64,
    committing: bool,
}

impl State {
    /// The units frozen or written since, a bit a unit: what the next freeze returns.
    fn dirty(&self) -> Vec<u64> {
        self.frozen
            .iter()
            .zip(&self.current)
            .map(|(f, c)| f | c)
            .collect()
    }
}

/// The units a sync sends: those dirty when [`ChangeMap::freeze`] was called, with any
/// frozen set not released before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frozen {
    id: u64,
    unit: u64,
    size: u64,
    units: Vec<Range<u64>>,
}

impl Frozen {
    /// What [`ChangeMap::release`] takes once the units are sent.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes per unit.
    pub fn unit(&self) -> u64 {
        self.unit
    }

    /// The dirty units, as ranges of unit indices in order.
    pub fn units(&self) -> &[Range<u64>] {
        &self.units
    }

    /// The dirty bytes of the store, as ranges in order (the last unit cut at the store's
    /// end).
    pub fn byte_ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.units
            .iter()
            .map(|r| r.start * self.unit..(r.end * self.unit).min(self.size))
    }

    /// Bytes to send.
    pub fn dirty_bytes(&self) -> u64 {
        self.byte_ranges().map(|r| r.end - r.start).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

/// A write's registration with its map ([`ChangeMap::begin_write`]): its units are marked,
/// and a freeze waits until the guard is dropped.
#[must_use = "the write must happen while the guard lives"]
pub struct WriteGuard<'a> {
    map: &'a ChangeMap,
    parity: usize,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.map.inflight[self.parity].fetch_sub(1, Ordering::SeqCst);
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn pages_for(units: u64) -> usize {
    units.div_ceil(UNITS_PER_PAGE) as usize
}

/// The bitmap of `units` units with every one set.
fn all_set(units: u64) -> Vec<u64> {
    let mut v = vec![0u64; pages_for(units) * WORDS_PER_PAGE];
    set_range(&mut v, 0, units);
    v
}

fn set_range(words: &mut [u64], first: u64, end: u64) {
    for_words(first, end, |w, mask| words[w] |= mask);
}

/// Calls `f(word, mask)` for every word the unit range `first..end` touches.
fn for_words(first: u64, end: u64, mut f: impl FnMut(usize, u64)) {
    let mut u = first;
    while u < end {
        let w = (u / 64) as usize;
        let lo = u % 64;
        let hi = (end - w as u64 * 64).min(64);
        let mask = if hi - lo == 64 {
            u64::MAX
        } else {
            ((1u64 << (hi - lo)) - 1) << lo
        };
        f(w, mask);
        u = w as u64 * 64 + hi;
    }
}

/// The set units of `words` as ranges.
fn ranges(words: &[u64], units: u64) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for (w, &bits) in words.iter().enumerate() {
        let mut bits = bits;
        while bits != 0 {
            let lo = bits.trailing_zeros() as u64;
            let run = (bits >> lo).trailing_ones() as u64;
            let start = w as u64 * 64 + lo;
            let end = (start + run).min(units);
            match out.last_mut() {
                Some(last) if last.end == start => last.end = end,
                _ => out.push(start..end),
            }
            bits = if lo + run >= 64 {
                0
            } else {
                bits & !(((1u64 << run) - 1) << lo)
            };
        }
    }
    out.retain(|r| r.start < r.end);
    out
}

fn count(words: &[u64]) -> u64 {
    words.iter().map(|w| w.count_ones() as u64).sum()
}

/// A bitmap page as it goes to disk: page `number` of the file.
fn encode_page(epoch: u64, number: u64, words: &[u64]) -> [u8; PAGE] {
    let mut page = [0u8; PAGE];
    for (i, w) in words.iter().enumerate() {
        page[8 + i * 8..16 + i * 8].copy_from_slice(&w.to_le_bytes());
    }
    let crc = page_crc(epoch, number, &page[8..]);
    page[..4].copy_from_slice(&crc.to_le_bytes());
    page
}

fn page_crc(epoch: u64, number: u64, bits: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&epoch.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &number.to_le_bytes());
    crc32c::crc32c_append(crc, bits)
}

/// The words of a page read from disk, or `None` when its checksum fails.
fn decode_page(epoch: u64, number: u64, page: &[u8]) -> Option<Vec<u64>> {
    let stored = u32::from_le_bytes(page[..4].try_into().ok()?);
    if stored != page_crc(epoch, number, &page[8..]) || page[4..8] != [0; 4] {
        return None;
    }
    Some(
        page[8..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect(),
    )
}

/// The header's fields.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    unit: u64,
    size: u64,
    epoch: u64,
    frozen_id: u64,
    units: u64,
}

impl Header {
    fn encode(&self) -> [u8; PAGE] {
        let mut p = [0u8; PAGE];
        p[..8].copy_from_slice(MAGIC);
        p[8..12].copy_from_slice(&VERSION.to_le_bytes());
        p[12..16].copy_from_slice(&(PAGE as u32).to_le_bytes());
        p[16..24].copy_from_slice(&self.unit.to_le_bytes());
        p[24..32].copy_from_slice(&self.size.to_le_bytes());
        p[32..40].copy_from_slice(&self.epoch.to_le_bytes());
        p[40..48].copy_from_slice(&self.frozen_id.to_le_bytes());
        p[48..56].copy_from_slice(&self.units.to_le_bytes());
        let crc = crc32c::crc32c(&p[..56]);
        p[56..60].copy_from_slice(&crc.to_le_bytes());
        p
    }

    fn decode(p: &[u8]) -> Result<Header, String> {
        if p.len() < PAGE {
            return Err(format!("{} bytes, shorter than a header", p.len()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(p[at..at + 4].try_into().unwrap_or_default());
        let u64_at = |at: usize| u64::from_le_bytes(p[at..at + 8].try_into().unwrap_or_default());
        if &p[..8] != MAGIC {
            return Err("not a change map (bad magic)".into());
        }
        if u32_at(8) != VERSION {
            return Err(format!(
                "version {}, this program reads {VERSION}",
                u32_at(8)
            ));
        }
        if u32_at(56) != crc32c::crc32c(&p[..56]) {
            return Err("the header's checksum fails".into());
        }
        if u32_at(12) != PAGE as u32 {
            return Err(format!("page size {}", u32_at(12)));
        }
        let h = Header {
            unit: u64_at(16),
            size: u64_at(24),
            epoch: u64_at(32),
            frozen_id: u64_at(40),
            units: u64_at(48),
        };
        if !valid_unit(h.unit) || h.units != h.size.div_ceil(h.unit) || h.frozen_id > h.epoch {
            return Err(format!("inconsistent header {h:?}"));
        }
        Ok(h)
    }
}

/// The first epoch of a map that starts over: past `after`, and past any id a map of
/// this file handed out before, found or not (the microseconds since 1970; a map takes
/// one epoch per freeze), so that a sync holding an old frozen set's id cannot release a
/// new one.
fn fresh_epoch(after: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    now.max(after) + 1
}

fn valid_unit(unit: u64) -> bool {
    unit >= MIN_UNIT && unit.is_power_of_two()
}

/// What open found in the file: the sets, and why it did not take them as they were.
struct Found {
    epoch: u64,
    frozen_id: u64,
    frozen: Vec<u64>,
    current: Vec<u64>,
    recovery: Option<String>,
}

impl ChangeMap {
    /// Opens the map at `path` of a store of `size` bytes in units of `unit` bytes (a power
    /// of two, at least 4 KiB), or makes it as `if_new` says. A map that cannot be trusted
    /// as found (bad header or pages, another size or unit) is opened with the units it
    /// cannot vouch for dirty, and a warning ([`ChangeMap::recovery`] says why). The file
    /// is rewritten either way (see the module documentation).
    pub fn open(
        path: impl AsRef<Path>,
        size: u64,
        unit: u64,
        if_new: NewMap,
    ) -> io::Result<ChangeMap> {
        let path = path.as_ref();
        if !valid_unit(unit) {
            return Err(invalid(format!(
                "change map unit {unit} is not a power of two of at least {MIN_UNIT} bytes"
            )));
        }
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let units = size.div_ceil(unit);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(named)?;
        }
        match std::fs::remove_file(tmp_path(path)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(named(e)),
            _ => {}
        }
        let found = match std::fs::read(path) {
            Ok(bytes) => Self::parse(&bytes, size, unit, units),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Found {
                epoch: fresh_epoch(0),
                frozen_id: 0,
                frozen: vec![0; pages_for(units) * WORDS_PER_PAGE],
                current: match if_new {
                    NewMap::AllDirty => all_set(units),
                    NewMap::Clean => vec![0; pages_for(units) * WORDS_PER_PAGE],
                },
                recovery: None,
            },
            Err(e) => return Err(named(e)),
        };
        if let Some(why) = &found.recovery {
            tracing::warn!("{}: {why}", path.display());
        }
        let header = Header {
            unit,
            size,
            epoch: found.epoch,
            frozen_id: found.frozen_id,
            units,
        };
        let (file, done) = write_whole(path, &header, &found.frozen, &found.current);
        done.map_err(named)?;
        let file = file.ok_or_else(|| named(io::Error::other("the map was not written")))?;
        let durable = found.current.iter().map(|&w| AtomicU64::new(w)).collect();
        Ok(ChangeMap {
            path: path.to_path_buf(),
            unit_shift: unit.trailing_zeros(),
            size,
            units,
            durable,
            epoch: AtomicU64::new(found.epoch),
            inflight: [AtomicU64::new(0), AtomicU64::new(0)],
            state: Mutex::new(State {
                file: Arc::new(file),
                epoch: found.epoch,
                frozen_id: found.frozen_id,
                frozen: found.frozen,
                current: found.current,
                dirty_pages: BTreeSet::new(),
                next_batch: 1,
                written_batch: 0,
                committing: false,
            }),
            committed: Condvar::new(),
            epochs: Mutex::new(()),
            recovery: found.recovery,
        })
    }

    /// Reads a map file; whatever cannot be trusted comes back dirty.
    fn parse(bytes: &[u8], size: u64, unit: u64, units: u64) -> Found {
        let pages = pages_for(units);
        let everything = |why: String, after: u64| Found {
            epoch: fresh_epoch(after),
            frozen_id: 0,
            frozen: vec![0; pages * WORDS_PER_PAGE],
            current: all_set(units),
            recovery: Some(format!("{why}: every unit counts as changed")),
        };
        let h = match Header::decode(bytes) {
            Ok(h) => h,
            Err(why) => return everything(why, 0),
        };
        if h.size != size || h.unit != unit {
            return everything(
                format!(
                    "the map is of {} in units of {}, the store {} in units of {}",
                    Size(h.size),
                    Size(h.unit),
                    Size(size),
                    Size(unit)
                ),
                h.epoch,
            );
        }
        if bytes.len() < (1 + 2 * pages) * PAGE {
            return everything(format!("cut short at {} bytes", bytes.len()), h.epoch);
        }
        let mut bad = Vec::new();
        let mut read_set = |first_page: usize, words: &mut Vec<u64>| {
            for p in 0..pages {
                let number = first_page + p;
                let page = &bytes[number * PAGE..(number + 1) * PAGE];
                match decode_page(h.epoch, number as u64, page) {
                    Some(w) => {
                        words[p * WORDS_PER_PAGE..(p + 1) * WORDS_PER_PAGE].copy_from_slice(&w)
                    }
                    None => bad.push(p),
                }
            }
        };
        let mut frozen = vec![0; pages * WORDS_PER_PAGE];
        let mut current = vec![0; pages * WORDS_PER_PAGE];
        read_set(1, &mut frozen);
        read_set(1 + pages, &mut current);
        // Bits past the last unit mean nothing; a set one would be counted.
        for words in [&mut frozen, &mut current] {
            for_words(units, pages as u64 * UNITS_PER_PAGE, |w, mask| {
                words[w] &= !mask
            });
        }
        let recovery = (!bad.is_empty()).then(|| {
            for &p in &bad {
                let first = p as u64 * UNITS_PER_PAGE;
                set_range(&mut current, first, (first + UNITS_PER_PAGE).min(units));
            }
            format!(
                "{} bitmap page(s) fail their checksum: their units count as changed",
                bad.len()
            )
        });
        Found {
            epoch: h.epoch,
            frozen_id: h.frozen_id,
            frozen,
            current,
            recovery,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes per unit.
    pub fn unit(&self) -> u64 {
        1 << self.unit_shift
    }

    /// Units in the map: the store's size in units, the last one maybe partial.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The size of the store the map is of.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Why the map was not taken as found on open (and which units were counted dirty
    /// for it), or `None` when it was.
    pub fn recovery(&self) -> Option<&str> {
        self.recovery.as_deref()
    }

    /// The id of the frozen set not released yet, if there is one.
    pub fn frozen_id(&self) -> Option<u64> {
        Some(self.lock().frozen_id).filter(|&id| id != 0)
    }

    /// Bytes the next sync would send: units frozen or written since (the last unit cut
    /// at the store's end).
    pub fn dirty_bytes(&self) -> u64 {
        self.bytes_of(&self.lock().dirty())
    }

    fn bytes_of(&self, words: &[u64]) -> u64 {
        let mut n = count(words) << self.unit_shift;
        let last = self.units.saturating_sub(1);
        if self.units > 0 && words[(last / 64) as usize] & (1 << (last % 64)) != 0 {
            n -= (self.units << self.unit_shift) - self.size;
        }
        n
    }

    /// The units the next freeze would return (frozen or written since), as ranges of
    /// unit indices, without starting an epoch: what a failback reads of the old
    /// primary's changes since the last image both sites hold.
    pub fn dirty_units(&self) -> Vec<Range<u64>> {
        ranges(&self.lock().dirty(), self.units)
    }

    /// Whether unit `unit` is dirty, frozen or current (for tests and status).
    pub fn is_dirty(&self, unit: u64) -> bool {
        let st = self.lock();
        let (w, bit) = ((unit / 64) as usize, 1u64 << (unit % 64));
        unit < self.units && (st.frozen[w] | st.current[w]) & bit != 0
    }

    /// Marks the units of `[offset, offset + len)` durably, as [`ChangeMap::begin_write`]
    /// does, for a change that is already over.
    pub fn mark(&self, offset: u64, len: u64) -> io::Result<()> {
        self.begin_write(offset, len).map(drop)
    }

    /// Marks the units of `[offset, offset + len)` durably and registers a write to them:
    /// make the change while the guard lives. A [`ChangeMap::freeze`] that starts
    /// meanwhile waits for the guard, so that the sync reading the frozen units sees the
    /// change.
    pub fn begin_write(&self, offset: u64, len: u64) -> io::Result<WriteGuard<'_>> {
        check_range(offset, len, self.size)?;
        let guard = self.register();
        if len > 0 {
            let first = offset >> self.unit_shift;
            let end = ((offset + len - 1) >> self.unit_shift) + 1;
            if !self.all_durable(first, end) {
                self.mark_slow(first, end)?;
            }
        }
        Ok(guard)
    }

    /// Counts a write in under the current epoch.
    fn register(&self) -> WriteGuard<'_> {
        loop {
            let epoch = self.epoch.load(Ordering::SeqCst);
            let parity = (epoch & 1) as usize;
            self.inflight[parity].fetch_add(1, Ordering::SeqCst);
            // A freeze that moved on before our count went in may already have found the
            // old epoch's writes over: count in under the new one.
            if self.epoch.load(Ordering::SeqCst) == epoch {
                return WriteGuard { map: self, parity };
            }
            self.inflight[parity].fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn all_durable(&self, first: u64, end: u64) -> bool {
        let mut all = true;
        for_words(first, end, |w, mask| {
            all = all && self.durable[w].load(Ordering::Acquire) & mask == mask
        });
        all
    }

    /// Sets the bits and waits until they are on disk, writing them itself when no other
    /// thread is (group commit).
    fn mark_slow(&self, first: u64, end: u64) -> io::Result<()> {
        let t0 = std::time::Instant::now();
        let r = self.mark_slow_inner(first, end);
        let took = t0.elapsed();
        if took >= SLOW {
            tracing::debug!(
                target: "backstore::slow",
                "change map {}: marking units {first}..{end} took {:.2} ms",
                self.path.display(),
                took.as_secs_f64() * 1e3
            );
        }
        r
    }

    fn mark_slow_inner(&self, first: u64, end: u64) -> io::Result<()> {
        let mut st = self.lock();
        let State {
            current,
            dirty_pages,
            frozen,
            frozen_id,
            ..
        } = &mut *st;
        let mut covered = *frozen_id != 0;
        for_words(first, end, |w, mask| {
            covered = covered && frozen[w] & mask == mask;
            if current[w] & mask != mask {
                current[w] |= mask;
                dirty_pages.insert(w / WORDS_PER_PAGE);
            }
        });
        if covered {
            // Every unit is in the frozen set, which is on disk: a crash now still finds
            // them dirty, and nothing takes them out of it while this bit is only in
            // memory (`sent` leaves them; `release` and `freeze` write the current set
            // whole first). The bits go to disk with the next group commit, or with the
            // release. So the first write after a cut to a unit the sync is sending pays
            // no fsync: those are most of the writes while a sync runs.
            return Ok(());
        }
        let mine = st.next_batch;
        loop {
            if st.written_batch >= mine {
                return Ok(());
            }
            if st.committing {
                st = self.committed.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            st.committing = true;
            let batch = st.next_batch;
            st.next_batch += 1;
            let pages: Vec<usize> = std::mem::take(&mut st.dirty_pages).into_iter().collect();
            let words: Vec<Vec<u64>> = pages
                .iter()
                .map(|&p| st.current[p * WORDS_PER_PAGE..(p + 1) * WORDS_PER_PAGE].to_vec())
                .collect();
            let (file, epoch) = (st.file.clone(), st.epoch);
            drop(st);
            let first_page = 1 + pages_for(self.units);
            let written = (|| {
                if pages.is_empty() {
                    return Ok(());
                }
                for (&p, w) in pages.iter().zip(&words) {
                    let number = (first_page + p) as u64;
                    file.write_all_at(&encode_page(epoch, number, w), number * PAGE as u64)?;
                }
                file.sync_data()
            })();
            st = self.lock();
            st.committing = false;
            match written {
                Ok(()) => {
                    st.written_batch = batch;
                    for (&p, w) in pages.iter().zip(&words) {
                        for (i, &bits) in w.iter().enumerate() {
                            self.durable[p * WORDS_PER_PAGE + i].fetch_or(bits, Ordering::Release);
                        }
                    }
                    self.committed.notify_all();
                }
                Err(e) => {
                    // The bits stay set in memory and their pages to be written: the next
                    // mark writes them, and its caller waits for that.
                    st.dirty_pages.extend(pages);
                    self.committed.notify_all();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{}: marking changed units: {e}", self.path.display()),
                    ));
                }
            }
        }
    }

    /// Starts a new epoch, crash-safely: the units dirty so far, with a frozen set not yet
    /// released, become the frozen set that a sync sends; later writes mark a new current
    /// set. Returns when every write that started before is over. Blocks (fsyncs, and
    /// waits for those writes): call it where blocking is allowed (`spawn_blocking`).
    pub fn freeze(&self) -> io::Result<Frozen> {
        let _one = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.idle()?;
        let old = st.epoch;
        let epoch = old + 1;
        let frozen = st.dirty();
        let current = vec![0u64; frozen.len()];
        let header = self.header(epoch, epoch);
        let (file, done) = write_whole(&self.path, &header, &frozen, &current);
        let Some(file) = file else {
            return Err(self.failed("freezing", done.err()));
        };
        for w in self.durable.iter() {
            w.store(0, Ordering::SeqCst);
        }
        let units = ranges(&frozen, self.units);
        *st = State {
            file: Arc::new(file),
            epoch,
            frozen_id: epoch,
            frozen,
            current,
            dirty_pages: BTreeSet::new(),
            // Bits set but not yet written went into the frozen set, now on disk.
            written_batch: st.next_batch,
            next_batch: st.next_batch + 1,
            committing: false,
        };
        self.epoch.store(epoch, Ordering::SeqCst);
        drop(st);
        self.committed.notify_all();
        // Writes that started in the old epoch may have found their units marked in the
        // old current set and skipped marking: the sync must not read before they land.
        // (And a later freeze, which waits only for its own epoch's, relies on it.)
        let parity = (old & 1) as usize;
        let mut nap = Duration::from_micros(50);
        while self.inflight[parity].load(Ordering::SeqCst) != 0 {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
        // The new map is in place; only its directory entry may not be on disk. The sync
        // must not go on, and the frozen set stays until a later freeze takes it along.
        done.map_err(|e| self.failed("freezing", Some(e)))?;
        Ok(Frozen {
            id: epoch,
            unit: self.unit(),
            size: self.size,
            units,
        })
    }

    /// Takes units out of the frozen set `id` once a sync has them on the other side,
    /// durably: an interrupted sync, resumed by a later freeze, does not send them again.
    /// Their pages are rewritten in place without an fsync: a clear that a crash loses
    /// only sends a unit again, and a page torn by one fails its checksum and counts as
    /// dirty. Units written again since are in the current set and stay dirty. A stale
    /// `id` (released, or merged into a later freeze) clears nothing.
    pub fn sent(&self, id: u64, units: &[u64]) -> io::Result<()> {
        let _one = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.lock();
        if id == 0 || st.frozen_id != id {
            return Ok(());
        }
        let mut pages = BTreeSet::new();
        for &u in units.iter().filter(|&&u| u < self.units) {
            let (w, bit) = ((u / 64) as usize, 1u64 << (u % 64));
            // A unit written again since the freeze stays frozen: its current bit may be
            // in memory only (`mark_slow` leans on the frozen one), and the next freeze
            // takes it along anyway.
            if st.current[w] & bit != 0 {
                continue;
            }
            st.frozen[w] &= !bit;
            pages.insert(w / WORDS_PER_PAGE);
        }
        let writes: Vec<(u64, [u8; PAGE])> = pages
            .iter()
            .map(|&p| {
                let number = (1 + p) as u64;
                let w = &st.frozen[p * WORDS_PER_PAGE..(p + 1) * WORDS_PER_PAGE];
                (number, encode_page(st.epoch, number, w))
            })
            .collect();
        let file = st.file.clone();
        // Freeze and release are held off by `epochs`; marking writes other pages.
        drop(st);
        for (number, page) in writes {
            file.write_all_at(&page, number * PAGE as u64)
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("{}: clearing sent units: {e}", self.path.display()),
                    )
                })?;
        }
        Ok(())
    }

    /// Forgets the frozen set `id` after a sync sent it, crash-safely. An id that is not
    /// the map's frozen set (released already, or merged into a later freeze) is refused.
    /// Blocks on fsyncs, as [`ChangeMap::freeze`] does.
    pub fn release(&self, id: u64) -> io::Result<()> {
        let _one = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        let mut st = self.idle()?;
        if id == 0 || st.frozen_id != id {
            return Err(invalid(format!(
                "{}: {id} is not the frozen set of the change map ({})",
                self.path.display(),
                match st.frozen_id {
                    0 => "none is frozen".to_string(),
                    f => format!("that is {f}"),
                }
            )));
        }
        let frozen = vec![0u64; st.frozen.len()];
        let header = self.header(st.epoch, 0);
        let (file, done) = write_whole(&self.path, &header, &frozen, &st.current);
        let Some(file) = file else {
            return Err(self.failed("releasing a frozen set", done.err()));
        };
        // The current set went to disk whole, bits not yet written included.
        for (d, &w) in self.durable.iter().zip(&st.current) {
            d.fetch_or(w, Ordering::Release);
        }
        st.file = Arc::new(file);
        st.frozen = frozen;
        st.frozen_id = 0;
        st.dirty_pages.clear();
        st.written_batch = st.next_batch;
        st.next_batch += 1;
        drop(st);
        self.committed.notify_all();
        done.map_err(|e| self.failed("releasing a frozen set", Some(e)))
    }

    /// The state once no group commit is writing (freeze and release replace the file).
    fn idle(&self) -> io::Result<MutexGuard<'_, State>> {
        let mut st = self.lock();
        while st.committing {
            st = self.committed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Ok(st)
    }

    fn header(&self, epoch: u64, frozen_id: u64) -> Header {
        Header {
            unit: self.unit(),
            size: self.size,
            epoch,
            frozen_id,
            units: self.units,
        }
    }

    fn failed(&self, what: &str, e: Option<io::Error>) -> io::Error {
        let e = e.unwrap_or_else(|| io::Error::other("no map was written"));
        io::Error::new(e.kind(), format!("{}: {what}: {e}", self.path.display()))
    }

    /// The state; a panic elsewhere while it was held left it whole (every update of it
    /// is a plain assignment), so a poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for ChangeMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeMap")
            .field("path", &self.path)
            .field("unit", &self.unit())
            .field("units", &self.units)
            .finish()
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Writes the whole map to `PATH.tmp`, fsyncs it, renames it over `path` and fsyncs the
/// directory. The file comes back, open for marking, once the rename is done, even if
/// the directory's fsync then fails: from then on `path` is the new map, and marks must
/// go to it.
fn write_whole(
    path: &Path,
    h: &Header,
    frozen: &[u64],
    current: &[u64],
) -> (Option<File>, io::Result<()>) {
    let tmp = tmp_path(path);
    let written = (|| {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let pages = pages_for(h.units);
        let mut out = Vec::with_capacity((1 + 2 * pages) * PAGE);
        out.extend_from_slice(&h.encode());
        for (set, words) in [frozen, current].into_iter().enumerate() {
            for p in 0..pages {
                let number = (1 + set * pages + p) as u64;
                let w = &words[p * WORDS_PER_PAGE..(p + 1) * WORDS_PER_PAGE];
                out.extend_from_slice(&encode_page(h.epoch, number, w));
            }
        }
        file.write_all(&out)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(file)
    })();
    let file = match written {
        Ok(file) => file,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return (None, Err(e));
        }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let synced = File::open(dir).and_then(|d| d.sync_all());
    (Some(file), synced)
}

/// A store whose changes are tracked: every call that changes data marks its units in the
/// [`ChangeMap`] durably before it reaches the store. Everything else passes through.
#[derive(Debug)]
pub struct Tracked {
    inner: Arc<dyn Backstore>,
    map: Arc<ChangeMap>,
}

impl Tracked {
    /// Tracks `inner`'s changes in `map`, which must be of a store of `inner`'s size.
    pub fn new(inner: Arc<dyn Backstore>, map: Arc<ChangeMap>) -> io::Result<Tracked> {
        if map.size() != inner.size() {
            return Err(invalid(format!(
                "{}: the change map is of {} bytes, the store {} ({}) bytes",
                map.path().display(),
                map.size(),
                inner.size(),
                inner.description()
            )));
        }
        Ok(Tracked { inner, map })
    }

    pub fn inner(&self) -> &Arc<dyn Backstore> {
        &self.inner
    }

    pub fn map(&self) -> &Arc<ChangeMap> {
        &self.map
    }

    /// Runs a change of `[offset, offset + len)` with its units marked first; a store that
    /// refuses writes is left to refuse it, with nothing marked.
    fn change(&self, offset: u64, len: u64, op: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        if self.inner.read_only() {
            return op();
        }
        let _registered = self.map.begin_write(offset, len)?;
        op()
    }
}

impl Backstore for Tracked {
    // What is left out keeps the trait's default: the asynchronous writes, so that every
    // write passes through `change` (the defaults call `write_at` and `flush`), and the
    // lent asynchronous reads.
    crate::forward! { inner =>
        announce_reset, on_peer_reset, supports_discard, read_only, sidecar,
        read_at, try_read_at, reads_async, read_async, is_allocated,
        lend, can_lend, lends_memory,
        changes, flush,
        cluster_reservations, port_groups, atomic_compare_and_write_unit, changes_compare_and_write,
    }

    /// The store's size, but no more than the map covers: a store grown since the map was
    /// made (an RBD image resized) shows its old size until the map is made again.
    fn size(&self) -> u64 {
        self.inner.size().min(self.map.size())
    }

    fn description(&self) -> String {
        format!(
            "{}, changes tracked in {} (units of {})",
            self.inner.description(),
            self.map.path().display(),
            Size(self.map.unit())
        )
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // sets of one range of units
mod tests {
    use super::*;
    use crate::RamBackstore;

    #[test]
    fn sent_units_leave_the_frozen_set_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.changes");
        let map = ChangeMap::open(&path, 64 << 20, DEFAULT_UNIT, NewMap::Clean).unwrap();
        map.mark(0, 8 << 20).unwrap();
        let f = map.freeze().unwrap();
        assert_eq!(f.units(), &[0..8]);
        map.sent(f.id(), &[0, 1, 2, 5]).unwrap();
        // Unit 2 is written again after the freeze: it stays dirty.
        map.mark(2 << 20, 1).unwrap();
        map.sent(f.id() + 7, &[3]).unwrap(); // stale id: nothing
        drop(map);
        let map = ChangeMap::open(&path, 64 << 20, DEFAULT_UNIT, NewMap::Clean).unwrap();
        let g = map.freeze().unwrap();
        assert_eq!(g.units(), &[2..5, 6..8]);
    }

    const KIB: u64 = 1024;
    const MIB: u64 = 1 << 20;

    fn dirty_units(map: &ChangeMap) -> Vec<u64> {
        (0..map.units()).filter(|&u| map.is_dirty(u)).collect()
    }

    fn clean(dir: &tempfile::TempDir, size: u64, unit: u64) -> ChangeMap {
        ChangeMap::open(dir.path().join("m.changes"), size, unit, NewMap::Clean).unwrap()
    }

    /// A compare-and-write through the tracked store is the inner store's (it still
    /// compares), and marks its unit before it writes: a sync would otherwise miss it.
    #[test]
    fn compare_and_write_is_forwarded_and_marks_its_unit() {
        let dir = tempfile::tempdir().unwrap();
        let map = Arc::new(clean(&dir, 8 * MIB, MIB));
        let store = Tracked::new(Arc::new(RamBackstore::new(8 * MIB)), map.clone()).unwrap();
        assert_eq!(store.atomic_compare_and_write_unit(), Some(MIB));
        let at = 3 * MIB + 512;
        assert_eq!(
            store.compare_and_write(at, &[1; 512], &[2; 512]).unwrap(),
            crate::Compared::Mismatch(0),
            "the RAM store reads zeros there"
        );
        assert_eq!(
            store.compare_and_write(at, &[0; 512], &[2; 512]).unwrap(),
            crate::Compared::Written
        );
        let mut b = [0u8; 512];
        store.read_at(&mut b, at).unwrap();
        assert_eq!(b, [2; 512]);
        assert_eq!(dirty_units(&map), [3]);
        assert_eq!(
            store
                .compare_and_write(MIB - 256, &[0; 512], &[2; 512])
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput,
            "a range across the store's unit is refused, not split"
        );
    }

    #[test]
    fn writes_mark_their_units_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let map = clean(&dir, 10 * MIB + 512, MIB);
        assert_eq!((map.unit(), map.units()), (MIB, 11));
        assert_eq!(map.dirty_bytes(), 0);
        map.mark(MIB - 1, 2).unwrap(); // straddles units 0 and 1
        map.mark(3 * MIB, MIB).unwrap(); // exactly unit 3
        map.mark(10 * MIB, 1).unwrap(); // the partial last unit
        map.mark(5 * MIB, 0).unwrap(); // nothing
        assert_eq!(dirty_units(&map), [0, 1, 3, 10]);
        assert_eq!(map.dirty_bytes(), 3 * MIB + 512);
        assert!(map.mark(10 * MIB, 513).is_err(), "past the end");
        assert!(map.mark(u64::MAX, 2).is_err(), "overflow");
        assert_eq!(dirty_units(&map), [0, 1, 3, 10]);
    }

    #[test]
    fn freeze_release_and_a_failed_sync() {
        let dir = tempfile::tempdir().unwrap();
        let map = clean(&dir, 64 * MIB, MIB);
        map.mark(0, 2 * MIB).unwrap();
        let f1 = map.freeze().unwrap();
        assert_eq!(f1.units(), [0..2]);
        assert_eq!(f1.unit(), MIB);
        assert_eq!(f1.byte_ranges().collect::<Vec<_>>(), [0..2 * MIB]);
        assert_eq!(map.frozen_id(), Some(f1.id()));
        // Written after the freeze: the current set, not the frozen one.
        map.mark(MIB, 1).unwrap();
        map.mark(9 * MIB, 1).unwrap();
        assert_eq!(dirty_units(&map), [0, 1, 9]);
        // The sync failed: no release; the next freeze takes both along.
        let f2 = map.freeze().unwrap();
        assert_ne!(f2.id(), f1.id());
        assert_eq!(f2.units(), [0..2, 9..10]);
        assert!(map.release(f1.id()).is_err(), "merged into f2");
        map.mark(20 * MIB, 1).unwrap();
        map.release(f2.id()).unwrap();
        assert_eq!(map.frozen_id(), None);
        assert_eq!(dirty_units(&map), [20]);
        assert!(map.release(f2.id()).is_err(), "released already");
        let f3 = map.freeze().unwrap();
        assert_eq!(f3.units(), [20..21]);
        map.release(f3.id()).unwrap();
        assert!(map.freeze().unwrap().is_empty());
        assert_eq!(map.dirty_bytes(), 0);
    }

    /// A write to a unit of the frozen set (the sync is sending it) marks it in memory
    /// only, with no group commit (no fsync) on its way; the mark is never lost: a crash
    /// (the map reopened as the disk holds it) finds the unit dirty before and after the
    /// sync says it sent it, and after the release the unit is still in the current set
    /// on disk. A write to a unit outside the frozen set still commits before it returns.
    #[test]
    fn a_write_to_a_frozen_unit_needs_no_fsync_and_is_never_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.changes");
        let map = ChangeMap::open(&path, 8 * MIB, MIB, NewMap::Clean).unwrap();
        map.mark(0, 2 * MIB).unwrap();
        let f = map.freeze().unwrap();
        assert_eq!(f.units(), [0..2]);
        let batches = map.lock().next_batch;
        map.mark(5 * MIB, 1).unwrap();
        assert_eq!(map.lock().next_batch, batches + 1, "unit 5 is not frozen");
        map.mark(MIB, 1).unwrap();
        assert_eq!(
            map.lock().next_batch,
            batches + 1,
            "a write to a frozen unit committed the map"
        );
        assert_eq!(dirty_units(&map), [0, 1, 5]);
        // The sync sent both frozen units: unit 1, written since, stays frozen.
        map.sent(f.id(), &[0, 1]).unwrap();
        let reopened = |map_path: &Path| {
            let copy = dir.path().join("crash.changes");
            std::fs::copy(map_path, &copy).unwrap();
            let m = ChangeMap::open(&copy, 8 * MIB, MIB, NewMap::Clean).unwrap();
            let d = dirty_units(&m);
            drop(m);
            std::fs::remove_file(&copy).unwrap();
            d
        };
        assert_eq!(reopened(&path), [1, 5], "a crash before the release");
        map.release(f.id()).unwrap();
        assert_eq!(reopened(&path), [1, 5], "a crash after the release");
        assert_eq!(dirty_units(&map), [1, 5]);
    }

    #[test]
    fn state_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.changes");
        let id = {
            let map = ChangeMap::open(&path, 8 * MIB, 64 * KIB, NewMap::Clean).unwrap();
            map.mark(0, 1).unwrap();
            let f = map.freeze().unwrap();
            map.mark(MIB, 1).unwrap();
            f.id()
        };
        let map = ChangeMap::open(&path, 8 * MIB, 64 * KIB, NewMap::AllDirty).unwrap();
        assert_eq!(map.recovery(), None);
        assert_eq!(map.frozen_id(), Some(id));
        assert_eq!(dirty_units(&map), [0, 16]);
        map.release(id).unwrap();
        drop(map);
        let map = ChangeMap::open(&path, 8 * MIB, 64 * KIB, NewMap::AllDirty).unwrap();
        assert_eq!(dirty_units(&map), [16]);
        let f = map.freeze().unwrap();
        assert_eq!(f.units(), [16..17]);
        assert!(f.id() > id);
    }

    #[test]
    fn a_new_map_without_history_is_all_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let map = ChangeMap::open(dir.path().join("new"), 3 * MIB, MIB, NewMap::AllDirty).unwrap();
        assert_eq!(map.dirty_bytes(), 3 * MIB);
        assert_eq!(map.freeze().unwrap().units(), [0..3]);
    }

    #[test]
    fn a_bad_header_or_another_geometry_makes_everything_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.changes");
        let reopen = |size, unit| ChangeMap::open(&path, size, unit, NewMap::Clean).unwrap();
        let old_id = {
            let map = reopen(4 * MIB, MIB);
            map.mark(0, 1).unwrap();
            map.freeze().unwrap().id()
        };
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1; // the unit, under the header's checksum
        std::fs::write(&path, &bytes).unwrap();
        let map = reopen(4 * MIB, MIB);
        assert!(
            map.recovery().unwrap().contains("checksum"),
            "{:?}",
            map.recovery()
        );
        assert_eq!(map.dirty_bytes(), 4 * MIB);
        assert_eq!(map.frozen_id(), None);
        assert!(map.release(old_id).is_err());
        // Ids go on growing: a sync holding the old one cannot release a new set.
        let f = map.freeze().unwrap();
        assert!(f.id() > old_id);
        // The recovered state was written back: a clean map from now on.
        map.release(f.id()).unwrap();
        drop(map);
        assert_eq!(reopen(4 * MIB, MIB).recovery(), None);

        for (size, unit, what) in [(8 * MIB, MIB, "the store 8MiB"), (4 * MIB, 2 * MIB, "2MiB")] {
            let map = reopen(size, unit);
            let why = map.recovery().unwrap();
            assert!(
                why.contains("the map is of 4MiB") && why.contains(what),
                "{why}"
            );
            assert_eq!(map.dirty_bytes(), size);
            map.freeze().and_then(|f| map.release(f.id())).unwrap();
            drop(map);
            drop(reopen(4 * MIB, MIB));
        }

        for junk in [&b""[..], b"not a change map at all", &[0u8; 8192][..]] {
            std::fs::write(&path, junk).unwrap();
            let map = reopen(4 * MIB, MIB);
            assert!(map.recovery().is_some());
            assert_eq!(map.dirty_bytes(), 4 * MIB);
        }
        assert!(
            ChangeMap::open(&path, MIB, 3000, NewMap::Clean).is_err(),
            "a unit that is no power of two"
        );
    }

    #[test]
    fn a_torn_bitmap_page_makes_its_units_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.changes");
        // 40000 units: two pages per set.
        let size = 40_000 * 4 * KIB;
        {
            let map = ChangeMap::open(&path, size, 4 * KIB, NewMap::Clean).unwrap();
            map.mark(5 * 4 * KIB, 1).unwrap();
            map.mark(35_000 * 4 * KIB, 1).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 5 * PAGE);
        bytes[4 * PAGE + 100] ^= 0x40; // the current set's second page
        std::fs::write(&path, &bytes).unwrap();
        let map = ChangeMap::open(&path, size, 4 * KIB, NewMap::Clean).unwrap();
        assert!(map.recovery().unwrap().contains("1 bitmap page"));
        let dirty = dirty_units(&map);
        assert_eq!(dirty[0], 5);
        assert_eq!(dirty[1..], (UNITS_PER_PAGE..40_000).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn concurrent_first_writes_are_all_marked() {
        let dir = tempfile::tempdir().unwrap();
        let map = clean(&dir, 64 * MIB, 4 * KIB);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let map = &map;
                s.spawn(move || {
                    for i in 0..200 {
                        map.mark((t * 200 + i) * 8 * KIB, 4 * KIB).unwrap();
                        if t == 0 && i % 50 == 0 {
                            map.freeze().unwrap();
                        }
                    }
                });
            }
        });
        let dirty = dirty_units(&map);
        assert_eq!(dirty, (0..1600).map(|i| i * 2).collect::<Vec<_>>());
        drop(map);
        let map = clean(&dir, 64 * MIB, 4 * KIB);
        assert_eq!(dirty_units(&map), dirty);
    }

    #[test]
    fn tracked_marks_every_change_and_passes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let map = Arc::new(clean(&dir, 8 * MIB, MIB));
        let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(8 * MIB));
        let t = Tracked::new(ram.clone(), map.clone()).unwrap();
        t.write_at(&[7; 512], 0).unwrap();
        t.discard(2 * MIB, 4096).unwrap();
        t.write_zeroes(5 * MIB - 1, 2).unwrap();
        let mut buf = [0u8; 512];
        t.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7; 512]);
        t.read_at(&mut buf, 7 * MIB).unwrap();
        t.flush().unwrap();
        assert!(t.write_at(&[1], 8 * MIB).is_err());
        assert_eq!(dirty_units(&map), [0, 2, 4, 5]);
        assert_eq!(t.size(), 8 * MIB);
        assert!(t.description().contains("changes tracked in"));
        let other: Arc<dyn Backstore> = Arc::new(RamBackstore::new(4 * MIB));
        assert!(Tracked::new(other, map).is_err(), "another size");
    }

    #[test]
    fn ranges_of_bits() {
        let mut w = vec![0u64; 4];
        set_range(&mut w, 3, 70);
        set_range(&mut w, 128, 192);
        set_range(&mut w, 200, 201);
        assert_eq!(ranges(&w, 256), [3..70, 128..192, 200..201]);
        assert_eq!(count(&w), 67 + 64 + 1);
        assert_eq!(ranges(&all_set(130), 130), [0..130]);
    }
}
