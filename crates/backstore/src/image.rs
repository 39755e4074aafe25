//! A point-in-time image of a store while writes go on: [`Imaged`] wraps a store, and
//! while an [`Image`] is held (taken with [`Imaged::take`]) the first write to each unit
//! copies the unit's old content into a side store before it lands (copy on write). Reads
//! of the image ([`Image::read_at`]) return the store's content at the moment it was
//! taken; reads of the store itself return the new content.
//!
//! With no image held, a write through [`Imaged`] costs one registration on an atomic
//! counter (so that [`Imaged::take`] can wait for the writes that started before it) and
//! an atomic check of the epoch; nothing else.
//!
//! # The cut
//! The epoch is even while no image is held and odd while one is. A write registers under
//! the epoch it starts in (`inflight`, by parity) and re-reads the epoch, so that every
//! write is counted in the epoch it acts in. [`Imaged::take`] makes the epoch odd, then
//! waits until every write of the even epoch before it has returned: the image is the
//! store's content at that moment, with each write whole (in it or not). Writes of the new
//! epoch wait for that moment before they copy anything. [`Image`]'s release (dropping it,
//! or [`Imaged::release`]) makes the epoch even again, after marking the image released
//! under its lock, and waits for the writes of the odd epoch; then the side store is freed.
//!
//! # The side store, bounded
//! A sparse file (unlinked as soon as it is made, so a crash leaves nothing behind; the
//! space goes when the image does), or memory for a store without a place for files (RAM).
//! Each image has a limit in bytes; a write that would copy past it (or a copy that fails)
//! does not fail: the write goes ahead and the image is *overrun*: its reads fail from then
//! on with a message that says why, and the sync reading it fails cleanly. The
//! host's writes are never refused for the image's sake.
//!
//! # Consistency
//! A unit's first write after the cut claims it under the image's lock, copies it
//! without the lock, sets its bit, then writes the store; a second write to the unit
//! meanwhile waits for that copy (and no other) before it lands. A read of the image reads
//! an unset unit from the store and checks its bit again after the read: set, the unit is
//! read again from the side store (a write may have landed during the read, but only
//! after the copy); unset, no write of the image's epoch reached it during the read,
//! since it would have set the bit first. Neither a copy nor a read holds the lock while it
//! waits for the disk, so the writes to other units go on meanwhile.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::{buffers, check_range, Backstore};

/// The copy-on-write unit when none is given: small enough that a 4 KiB random write
/// copies little, large enough that the bitmap of a 1 TiB store is 4 MiB.
pub const DEFAULT_UNIT: u64 = 64 << 10;

/// Where an image keeps the units it copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SidePlace {
    /// A sparse file at this path (made when the image is taken, unlinked at once).
    File(PathBuf),
    /// Memory.
    Memory,
}

/// How images of a store are taken.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    pub side: SidePlace,
    /// Copy-on-write unit, bytes (a power of two, at least 512).
    pub unit: u64,
    /// Most bytes an image copies before it is overrun.
    pub limit: u64,
}

/// Why an image cannot be taken or read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("an image of this store is already held (image {0})")]
    Busy(u64),
    #[error("image {0} was released")]
    Released(u64),
    #[error("image {id} is overrun: {why}")]
    Overrun { id: u64, why: String },
}

impl From<ImageError> for io::Error {
    fn from(e: ImageError) -> io::Error {
        let kind = match e {
            ImageError::Busy(_) => io::ErrorKind::AlreadyExists,
            ImageError::Released(_) => io::ErrorKind::NotFound,
            ImageError::Overrun { .. } => io::ErrorKind::StorageFull,
        };
        io::Error::new(kind, e)
    }
}

/// A store through which images can be taken. See the module documentation.
#[derive(Debug)]
pub struct Imaged {
    inner: Arc<dyn Backstore>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    options: ImageOptions,
    /// Even: no image; odd: one is held (`current`).
    epoch: AtomicU64,
    /// Writes in progress, by the parity of the epoch they started in.
    inflight: [AtomicU64; 2],
    current: RwLock<Option<Arc<ImageState>>>,
    /// Take and release one at a time.
    control: Mutex<u64>,
}

/// A held image: reads of the store's content at the cut. Dropping the last handle
/// releases it ([`Imaged::release`] does so at once, whoever else holds a handle).
#[derive(Debug, Clone)]
pub struct Image {
    state: Arc<ImageState>,
    owner: Arc<Owner>,
}

/// Releases the image when the last handle goes.
#[derive(Debug)]
struct Owner {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Owner {
    fn drop(&mut self) {
        release(&self.shared, self.id);
    }
}

#[derive(Debug)]
struct ImageState {
    id: u64,
    unit: u64,
    size: u64,
    inner: Arc<dyn Backstore>,
    taken_at: Instant,
    /// Set once every write before the cut has returned; writes of the image's epoch wait
    /// for it before they copy.
    ready: Mutex<bool>,
    ready_cv: Condvar,
    /// Units copied to the side store (their old content is there).
    copied: Box<[AtomicU64]>,
    /// The side store's books. Held only for moments, never across a read or write of
    /// the store or of the side file: a copy or a read of the image in progress does not
    /// hold up the writes to other units (see [`ImageState::preserve`]).
    cow: Mutex<Side>,
    /// Woken when a copy ends (done or failed), for the writes to its units that wait.
    copy_done: Condvar,
}

#[derive(Debug)]
struct Side {
    store: SideStore,
    used: u64,
    limit: u64,
    released: bool,
    overrun: Option<String>,
    /// Units a write is copying now: another write to one of them waits for that copy
    /// (and for no other) before it lands.
    copying: HashSet<u64>,
}

#[derive(Debug)]
enum SideStore {
    /// Shared, so that copies and reads go on without the books' lock.
    File(Arc<File>),
    Memory(HashMap<u64, Box<[u8]>>),
}

/// How an image is doing, for a status answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageStatus {
    pub id: u64,
    pub unit: u64,
    /// Bytes copied to the side store so far.
    pub copied_bytes: u64,
    pub limit: u64,
    pub overrun: Option<String>,
    pub age: Duration,
}

impl Imaged {
    pub fn new(inner: Arc<dyn Backstore>, options: ImageOptions) -> io::Result<Imaged> {
        if !options.unit.is_power_of_two() || options.unit < 512 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "image unit {} is not a power of two of 512 or more",
                    options.unit
                ),
            ));
        }
        Ok(Imaged {
            inner,
            shared: Arc::new(Shared {
                options,
                epoch: AtomicU64::new(0),
                inflight: [AtomicU64::new(0), AtomicU64::new(0)],
                current: RwLock::new(None),
                control: Mutex::new(0),
            }),
        })
    }

    pub fn inner(&self) -> &Arc<dyn Backstore> {
        &self.inner
    }

    pub fn options(&self) -> &ImageOptions {
        &self.shared.options
    }

    /// Takes an image: the store's content now. Returns when every write that started
    /// before has returned; writes after it copy what they overwrite. Refused while
    /// another image is held.
    pub fn take(&self) -> io::Result<Image> {
        self.take_with(|| Ok(())).map(|(image, ())| image)
    }

    /// Takes an image as [`Imaged::take`] does, and runs `at_cut` at the cut itself: once
    /// every write before it has returned and before any write after it goes on (those
    /// wait). A change map frozen there holds exactly the writes in the image. If
    /// `at_cut` fails, the image is released and its error returned.
    pub fn take_with<T>(&self, at_cut: impl FnOnce() -> io::Result<T>) -> io::Result<(Image, T)> {
        let mut last_id = self.shared.control.lock().unwrap();
        let epoch = self.shared.epoch.load(Ordering::SeqCst);
        if epoch & 1 == 1 {
            let id = self
                .shared
                .current
                .read()
                .unwrap()
                .as_ref()
                .map_or(0, |s| s.id);
            return Err(ImageError::Busy(id).into());
        }
        let o = &self.shared.options;
        let size = self.inner.size();
        let store = match &o.side {
            SidePlace::Memory => SideStore::Memory(HashMap::new()),
            SidePlace::File(path) => SideStore::File(Arc::new(side_file(path, size)?)),
        };
        *last_id += 1;
        let units = size.div_ceil(o.unit);
        let state = Arc::new(ImageState {
            id: *last_id,
            unit: o.unit,
            size,
            inner: self.inner.clone(),
            taken_at: Instant::now(),
            ready: Mutex::new(false),
            ready_cv: Condvar::new(),
            copied: (0..units.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            cow: Mutex::new(Side {
                store,
                used: 0,
                limit: o.limit,
                released: false,
                overrun: None,
                copying: HashSet::new(),
            }),
            copy_done: Condvar::new(),
        });
        *self.shared.current.write().unwrap() = Some(state.clone());
        self.shared.epoch.store(epoch + 1, Ordering::SeqCst);
        let t0 = Instant::now();
        wait_drained(&self.shared.inflight[(epoch & 1) as usize]);
        let t1 = Instant::now();
        let hooked = at_cut();
        let t2 = Instant::now();
        if t2 - t0 >= crate::track::SLOW {
            tracing::debug!(
                target: "backstore::slow",
                "image {}: taking it held writes {:.2} ms: waiting for earlier writes {:.2}, at the cut {:.2}",
                state.id,
                (t2 - t0).as_secs_f64() * 1e3,
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3,
            );
        }
        *state.ready.lock().unwrap() = true;
        state.ready_cv.notify_all();
        drop(last_id);
        let image = Image {
            owner: Arc::new(Owner {
                shared: self.shared.clone(),
                id: state.id,
            }),
            state,
        };
        // On failure the image goes with `image`, released.
        Ok((image, hooked?))
    }

    /// Releases image `id` now, if it is the one held (handles still out then fail to
    /// read). Nothing if it is not.
    pub fn release(&self, id: u64) {
        release(&self.shared, id)
    }

    /// The image held now, if any.
    pub fn held(&self) -> Option<ImageStatus> {
        self.shared
            .current
            .read()
            .unwrap()
            .as_ref()
            .map(|s| s.status())
    }

    /// Registers a write for its epoch; the image to copy into when one is held.
    fn enter(&self) -> Entered {
        loop {
            let e = self.shared.epoch.load(Ordering::SeqCst);
            let parity = (e & 1) as usize;
            self.shared.inflight[parity].fetch_add(1, Ordering::SeqCst);
            if self.shared.epoch.load(Ordering::SeqCst) == e {
                let image = if parity == 1 {
                    self.shared.current.read().unwrap().clone()
                } else {
                    None
                };
                return Entered {
                    shared: self.shared.clone(),
                    parity,
                    image,
                };
            }
            self.shared.inflight[parity].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Runs a change of `[offset, offset + len)`, copying first what an image needs.
    fn change(&self, offset: u64, len: u64, op: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let entered = self.enter();
        if let Some(image) = &entered.image {
            image.preserve(offset, len);
        }
        let t0 = Instant::now();
        let r = op();
        let took = t0.elapsed();
        if took >= crate::track::SLOW {
            tracing::debug!(
                target: "backstore::slow",
                "a change of {len} bytes at {offset} took {:.2} ms in the store under the image layer (image held: {})",
                took.as_secs_f64() * 1e3,
                entered.image.is_some()
            );
        }
        r
    }
}

/// A write's registration (see [`Imaged::enter`]); dropped when the write has returned.
struct Entered {
    shared: Arc<Shared>,
    parity: usize,
    image: Option<Arc<ImageState>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.shared.inflight[self.parity].fetch_sub(1, Ordering::SeqCst);
    }
}

fn wait_drained(counter: &AtomicU64) {
    let mut spins = 0u32;
    while counter.load(Ordering::SeqCst) != 0 {
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn release(shared: &Shared, id: u64) {
    let _control = shared.control.lock().unwrap();
    let epoch = shared.epoch.load(Ordering::SeqCst);
    let Some(state) = shared.current.read().unwrap().clone() else {
        return;
    };
    if epoch & 1 == 0 || state.id != id {
        return;
    }
    // Marked released first: a read of the image in progress checks it once it has read
    // (`ImageState::read_at`), and fails, since writes of the next epoch may reach the
    // store uncopied from here on. Writes waiting for a copy stop waiting.
    state.cow.lock().unwrap().released = true;
    state.copy_done.notify_all();
    shared.epoch.store(epoch + 1, Ordering::SeqCst);
    wait_drained(&shared.inflight[1]);
    *shared.current.write().unwrap() = None;
    // The side store goes now: a handle still out reads nothing from it.
    let mut side = state.cow.lock().unwrap();
    side.store = SideStore::Memory(HashMap::new());
    side.used = 0;
}

/// A sparse file of `size` bytes at `path`, unlinked at once.
fn side_file(path: &Path, size: u64) -> io::Result<File> {
    let _ = std::fs::remove_file(path);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            io::Error::new(e.kind(), format!("image side file {}: {e}", path.display()))
        })?;
    std::fs::remove_file(path)?;
    f.set_len(size)?;
    Ok(f)
}

impl ImageState {
    fn status(&self) -> ImageStatus {
        let side = self.cow.lock().unwrap();
        ImageStatus {
            id: self.id,
            unit: self.unit,
            copied_bytes: side.used,
            limit: side.limit,
            overrun: side.overrun.clone(),
            age: self.taken_at.elapsed(),
        }
    }

    fn is_copied(&self, u: u64) -> bool {
        self.copied[(u / 64) as usize].load(Ordering::Acquire) & (1 << (u % 64)) != 0
    }

    fn unit_range(&self, u: u64) -> (u64, u64) {
        let start = u * self.unit;
        (start, (start + self.unit).min(self.size))
    }

    /// Copies the units of `[offset, offset + len)` not yet copied into the side store;
    /// returns once each of them is copied (or the image is overrun or released: then
    /// the write goes ahead and the image's reads fail).
    ///
    /// The units this write is first to are claimed under the books' lock and copied
    /// without it; a unit another write is copying is waited for, and only that one. So
    /// a copy (a read of the store and a write of the side file, or a wait for the disk)
    /// holds up only the writes to its own units, not every write of the LUN.
    fn preserve(&self, offset: u64, len: u64) {
        if len == 0 || offset >= self.size {
            return;
        }
        let first = offset / self.unit;
        let last = (offset + len - 1).min(self.size - 1) / self.unit;
        if (first..=last).all(|u| self.is_copied(u)) {
            return;
        }
        let t0 = Instant::now();
        {
            let mut ready = self.ready.lock().unwrap();
            while !*ready {
                ready = self.ready_cv.wait(ready).unwrap();
            }
        }
        let t1 = Instant::now();
        let (mine, theirs, file) = {
            let mut side = self.cow.lock().unwrap();
            if side.released || side.overrun.is_some() {
                return;
            }
            let mut mine = Vec::new();
            let mut theirs = Vec::new();
            for u in first..=last {
                if self.is_copied(u) {
                    continue;
                }
                if side.copying.contains(&u) {
                    theirs.push(u);
                    continue;
                }
                let (s, e) = self.unit_range(u);
                if side.used + (e - s) > side.limit {
                    side.overrun = Some(format!(
                        "its side store holds {} bytes at most, and the writes since the cut \
                         needed more",
                        side.limit
                    ));
                    tracing::warn!("image {}: overrun: the side store is full", self.id);
                    // The units claimed so far are copied by nobody now.
                    for u in &mine {
                        side.copying.remove(u);
                    }
                    self.copy_done.notify_all();
                    return;
                }
                // Counted now, so that concurrent copies cannot pass the limit together.
                side.used += e - s;
                side.copying.insert(u);
                mine.push(u);
            }
            let file = match &side.store {
                SideStore::File(f) => Some(f.clone()),
                SideStore::Memory(_) => None,
            };
            (mine, theirs, file)
        };
        let t2 = Instant::now();
        // Our copies, without the lock: no write to these units lands before their bits
        // are set (a write to one of them waits below), so what is read is the cut's.
        let mut copies: Vec<(u64, io::Result<Vec<u8>>)> = Vec::with_capacity(mine.len());
        for &u in &mine {
            let (s, e) = self.unit_range(u);
            let mut buf = vec![0u8; (e - s) as usize];
            let r = self.inner.read_at(&mut buf, s).and_then(|()| match &file {
                Some(f) => f.write_all_at(&buf, s).map(|()| Vec::new()),
                None => Ok(buf),
            });
            copies.push((u, r));
        }
        let t3 = Instant::now();
        let mut side = self.cow.lock().unwrap();
        for (u, r) in copies {
            side.copying.remove(&u);
            match r {
                Ok(buf) => {
                    // Once released the store is freed: nothing reads it any more.
                    let released = side.released;
                    if let SideStore::Memory(m) = &mut side.store {
                        if !released {
                            m.insert(u, buf.into_boxed_slice());
                        }
                    }
                    self.copied[(u / 64) as usize].fetch_or(1 << (u % 64), Ordering::Release);
                }
                Err(e) => {
                    if side.overrun.is_none() {
                        side.overrun = Some(format!("copying unit {u} aside: {e}"));
                        tracing::warn!("image {}: overrun: copying unit {u} aside: {e}", self.id);
                    }
                }
            }
        }
        if !mine.is_empty() {
            self.copy_done.notify_all();
        }
        // The units another write is copying: land only once each is aside.
        while !side.released
            && side.overrun.is_none()
            && theirs
                .iter()
                .any(|&u| !self.is_copied(u) && side.copying.contains(&u))
        {
            side = self.copy_done.wait(side).unwrap();
        }
        drop(side);
        let t4 = Instant::now();
        if t4 - t0 >= crate::track::SLOW {
            tracing::debug!(
                target: "backstore::slow",
                "image {}: copying units {first}..={last} aside took {:.2} ms: waiting for the cut {:.2}, for the lock {:.2}, copying {} units {:.2}, for {} units others copy {:.2}",
                self.id,
                (t4 - t0).as_secs_f64() * 1e3,
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3,
                mine.len(),
                (t3 - t2).as_secs_f64() * 1e3,
                theirs.len(),
                (t4 - t3).as_secs_f64() * 1e3,
            );
        }
    }

    /// Reads the image without holding the books' lock across the store's read: a unit
    /// not copied is read from the store, then checked again. Its bit is set before any
    /// write of the image's epoch lands on it, so a unit still not copied after the read
    /// was not written during it; one copied meanwhile is read again from the side store,
    /// which holds the cut's content. A release or an overrun during the read (after
    /// which writes land uncopied) fails it.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        if buf.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let file = {
            let side = self.cow.lock().unwrap();
            self.usable(&side)?;
            match &side.store {
                SideStore::File(f) => Some(f.clone()),
                SideStore::Memory(_) => None,
            }
        };
        let end = offset + buf.len() as u64;
        // Pieces read from the store, to check again once read.
        let mut from_store = Vec::new();
        let mut at = offset;
        while at < end {
            let u = at / self.unit;
            let piece_end = self.unit_range(u).1.min(end);
            let out = &mut buf[(at - offset) as usize..(piece_end - offset) as usize];
            match &file {
                Some(f) if self.is_copied(u) => f.read_exact_at(out, at)?,
                // Memory: read from the map below, under the lock.
                _ => {
                    if !self.is_copied(u) {
                        self.inner.read_at(out, at)?;
                    }
                    from_store.push((u, at, piece_end));
                }
            }
            at = piece_end;
        }
        let t1 = Instant::now();
        let side = self.cow.lock().unwrap();
        self.usable(&side)?;
        for (u, at, piece_end) in from_store {
            if !self.is_copied(u) {
                continue;
            }
            let out = &mut buf[(at - offset) as usize..(piece_end - offset) as usize];
            match &side.store {
                SideStore::File(f) => f.read_exact_at(out, at)?,
                SideStore::Memory(m) => {
                    let (us, _) = self.unit_range(u);
                    let saved = m.get(&u).ok_or_else(|| {
                        io::Error::other(format!("image {}: unit {u} lost", self.id))
                    })?;
                    out.copy_from_slice(&saved[(at - us) as usize..(piece_end - us) as usize]);
                }
            }
        }
        drop(side);
        let t2 = Instant::now();
        if t2 - t0 >= crate::track::SLOW {
            tracing::debug!(
                target: "backstore::slow",
                "image {}: a read of {} bytes at {offset} took {:.2} ms: reading {:.2}, checking {:.2}",
                self.id,
                buf.len(),
                (t2 - t0).as_secs_f64() * 1e3,
                (t1 - t0).as_secs_f64() * 1e3,
                (t2 - t1).as_secs_f64() * 1e3,
            );
        }
        Ok(())
    }

    /// Whether the image can be read: not released, not overrun.
    fn usable(&self, side: &Side) -> io::Result<()> {
        if side.released {
            return Err(ImageError::Released(self.id).into());
        }
        if let Some(why) = &side.overrun {
            return Err(ImageError::Overrun {
                id: self.id,
                why: why.clone(),
            }
            .into());
        }
        Ok(())
    }
}

impl Image {
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// The store's size at the cut.
    pub fn size(&self) -> u64 {
        self.state.size
    }

    /// Reads the store's content at the cut. Fails once the image is released or overrun.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.state.read_at(buf, offset)
    }

    pub fn status(&self) -> ImageStatus {
        self.state.status()
    }

    /// What the store held at the cut, as [`Backstore::is_allocated`] says it, and never
    /// less: the live store's allocation, with every unit changed since the cut counted as
    /// held (its old content is aside and may be data). The live store is asked first: a
    /// unit discarded after that answer was copied aside before the discard, so its bit is
    /// seen below.
    pub fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        let live = self.state.inner.is_allocated(offset, len)?;
        let mut out: Vec<(u64, u64, bool)> = Vec::with_capacity(live.len());
        let mut push = |s: u64, l: u64, held: bool| match out.last_mut() {
            Some(last) if last.2 == held && last.0 + last.1 == s => last.1 += l,
            _ => out.push((s, l, held)),
        };
        for (s, l, held) in live {
            if held {
                push(s, l, true);
                continue;
            }
            let end = s + l;
            let mut at = s;
            while at < end {
                let u = at / self.state.unit;
                let (_, ue) = self.state.unit_range(u);
                let piece_end = ue.min(end).max(at + 1);
                push(at, piece_end - at, self.state.is_copied(u));
                at = piece_end;
            }
        }
        Ok(out)
    }

    /// Releases the image now, whoever else holds a handle.
    pub fn release(&self) {
        release(&self.owner.shared, self.owner.id)
    }
}

impl Backstore for Imaged {
    crate::forward! { inner =>
        size, announce_reset, on_peer_reset, supports_discard, read_only, description, sidecar,
        read_at, try_read_at, reads_async, read_async, is_allocated,
        reads_lent_async, read_lent_async,
        lend, can_lend, lends_memory,
        changes, flush, writes_async, flush_async,
        cluster_reservations, port_groups, atomic_compare_and_write_unit,
    }

    fn write_async(&self, buf: buffers::Buf, offset: u64, durable: bool, done: crate::WriteDone) {
        let entered = self.enter();
        if let Some(image) = &entered.image {
            image.preserve(offset, buf.len() as u64);
        }
        // Registered until the store has written it.
        self.inner.write_async(
            buf,
            offset,
            durable,
            Box::new(move |buf, r| {
                drop(entered);
                done(buf, r)
            }),
        )
    }

    /// The unit is copied aside before the compare, whatever it finds: a copy of data that
    /// then stays unchanged costs a copy, but one missing under a write that another
    /// target's compare-and-write raced to first would lose the image's bytes.
    fn compare_and_write(
        &self,
        offset: u64,
        verify: &[u8],
        write: &[u8],
    ) -> io::Result<crate::Compared> {
        let entered = self.enter();
        if let Some(image) = &entered.image {
            image.preserve(offset, verify.len() as u64);
        }
        self.inner.compare_and_write(offset, verify, write)
    }
}

/// Held write completions of a LUN (a consistency group's first phase): while held,
/// whoever answers a write hands the answer to [`Hold::defer`] instead of sending it, and
/// [`Hold::release`] sends them all. The data of a held write has landed; only its
/// acknowledgment waits. The hold does not end by itself: its owner bounds it (the sync
/// agent releases it when its deadline passes).
#[derive(Default)]
pub struct Hold {
    state: Mutex<HoldState>,
    /// A cheap check on every write's answer: whether a hold may be on.
    on: AtomicBool,
}

#[derive(Default)]
struct HoldState {
    /// The hold's id and when it began, while held.
    held: Option<(u64, Instant)>,
    waiting: Vec<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock().unwrap();
        f.debug_struct("Hold")
            .field("held", &s.held)
            .field("waiting", &s.waiting.len())
            .finish()
    }
}

/// A hold's end: how long it held and how many answers waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub held_for: Duration,
    pub answers: usize,
}

impl Hold {
    /// Starts holding write answers under `id`. `false` if another hold is on.
    pub fn start(&self, id: u64) -> bool {
        let mut s = self.lock();
        match s.held {
            Some((h, _)) => h == id,
            None => {
                s.held = Some((id, Instant::now()));
                self.on.store(true, Ordering::SeqCst);
                true
            }
        }
    }

    /// The id of the hold on now.
    pub fn holding(&self) -> Option<u64> {
        self.lock().held.map(|(id, _)| id)
    }

    /// Runs `answer` (sends a write's answer) now, unless a hold is on: then it waits for
    /// [`Hold::release`].
    pub fn defer(&self, answer: Box<dyn FnOnce() + Send>) {
        if !self.on.load(Ordering::SeqCst) {
            return answer();
        }
        let mut s = self.lock();
        if s.held.is_some() {
            s.waiting.push(answer);
            return;
        }
        drop(s);
        answer()
    }

    /// Ends hold `id` and sends what waited; `None` if `id` is not the hold on.
    pub fn release(&self, id: u64) -> Option<Held> {
        let mut s = self.lock();
        match s.held {
            Some((h, since)) if h == id => {
                s.held = None;
                self.on.store(false, Ordering::SeqCst);
                let waiting = std::mem::take(&mut s.waiting);
                drop(s);
                let answers = waiting.len();
                for a in waiting {
                    a();
                }
                Some(Held {
                    held_for: since.elapsed(),
                    answers,
                })
            }
            _ => None,
        }
    }

    /// How long the hold on now has held.
    pub fn held_for(&self) -> Option<Duration> {
        self.lock().held.map(|(_, since)| since.elapsed())
    }

    fn lock(&self) -> MutexGuard<'_, HoldState> {
        self.state.lock().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RamBackstore;
    use proptest::prelude::*;

    fn imaged(size: u64, side: SidePlace, limit: u64) -> Imaged {
        Imaged::new(
            Arc::new(RamBackstore::new(size)),
            ImageOptions {
                side,
                unit: 4096,
                limit,
            },
        )
        .unwrap()
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write { at: u64, len: u64, byte: u8 },
        Zero { at: u64, len: u64 },
        ReadImage { at: u64, len: u64 },
    }

    fn op(size: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..size, 1..20_000u64, any::<u8>())
                .prop_map(move |(at, len, byte)| Op::Write { at, len: len.min(size - at), byte }),
            1 => (0..size, 1..20_000u64).prop_map(move |(at, len)| Op::Zero { at, len: len.min(size - at) }),
            2 => (0..size, 1..20_000u64).prop_map(move |(at, len)| Op::ReadImage { at, len: len.min(size - at) }),
        ]
    }

    fn apply(store: &Imaged, model: &mut [u8], op: &Op, image: &Image, cut: &[u8]) {
        match *op {
            Op::Write { at, len, byte } => {
                let data = vec![byte; len as usize];
                store.write_at(&data, at).unwrap();
                model[at as usize..(at + len) as usize].fill(byte);
            }
            Op::Zero { at, len } => {
                store.write_zeroes(at, len).unwrap();
                model[at as usize..(at + len) as usize].fill(0);
            }
            Op::ReadImage { at, len } => {
                let mut got = vec![0; len as usize];
                image.read_at(&mut got, at).unwrap();
                assert_eq!(got, cut[at as usize..(at + len) as usize]);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random writes before and during an image, against a model: the image reads the
        /// content at the cut, the store the new content, and release frees the side store.
        #[test]
        fn image_reads_the_cut_and_the_store_the_writes(
            before in proptest::collection::vec(op(64 << 10), 0..20),
            during in proptest::collection::vec(op(64 << 10), 1..60),
            file in any::<bool>(),
        ) {
            let size = 64u64 << 10;
            let dir = tempfile::tempdir().unwrap();
            let side = if file { SidePlace::File(dir.path().join("x.image")) } else { SidePlace::Memory };
            let store = imaged(size, side, u64::MAX);
            let mut model = vec![0u8; size as usize];
            let none = store.take().unwrap();
            let cut0 = model.clone();
            for o in &before {
                apply(&store, &mut model, o, &none, &cut0);
            }
            none.release();
            let image = store.take().unwrap();
            let cut = model.clone();
            for o in &during {
                apply(&store, &mut model, o, &image, &cut);
            }
            let mut all = vec![0; size as usize];
            image.read_at(&mut all, 0).unwrap();
            prop_assert_eq!(&all, &cut);
            store.read_at(&mut all, 0).unwrap();
            prop_assert_eq!(&all, &model);
            let copied = image.status().copied_bytes;
            prop_assert!(copied <= size);
            store.release(image.id());
            prop_assert!(store.held().is_none());
            prop_assert!(image.read_at(&mut all[..1], 0).is_err());
            prop_assert_eq!(image.status().copied_bytes, 0);
            prop_assert!(!dir.path().join("x.image").exists());
        }
    }

    #[test]
    fn concurrent_writers_never_tear_the_image() {
        // Writers stamp whole 8 KiB blocks with one byte while images come and go: every
        // block of every image is one byte throughout (no write half in an image).
        let store = Arc::new(imaged(1 << 20, SidePlace::Memory, u64::MAX));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3u8)
            .map(|w| {
                let (store, stop) = (store.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let block = (n * 7 + w as u64 * 13) % 128;
                        let byte = (n % 250) as u8 + 1;
                        store.write_at(&[byte; 8192], block * 8192).unwrap();
                        n += 1;
                    }
                })
            })
            .collect();
        for _ in 0..50 {
            let image = store.take().unwrap();
            let mut buf = vec![0u8; 1 << 20];
            image.read_at(&mut buf, 0).unwrap();
            for block in buf.chunks(8192) {
                assert!(
                    block.iter().all(|&b| b == block[0]),
                    "a torn block in the image"
                );
            }
            let mut again = vec![0u8; 1 << 20];
            image.read_at(&mut again, 0).unwrap();
            assert_eq!(buf, again, "the image changed while held");
            drop(image);
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
    }

    #[test]
    fn file_ram_and_stripe_stores_keep_their_cut() {
        let dir = tempfile::tempdir().unwrap();
        let file: Arc<dyn Backstore> = Arc::new(
            crate::FileBackstore::open(dir.path().join("f.img"), Some(1 << 20), true, false)
                .unwrap(),
        );
        let stripe: Arc<dyn Backstore> = Arc::new(
            crate::StripeBackstore::new(
                vec![
                    Arc::new(RamBackstore::new(512 << 10)),
                    Arc::new(RamBackstore::new(512 << 10)),
                ],
                64 << 10,
            )
            .unwrap(),
        );
        let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20));
        for (store, side) in [
            (file, SidePlace::File(dir.path().join("f.img.image"))),
            (ram, SidePlace::Memory),
            (stripe, SidePlace::File(dir.path().join("s.image"))),
        ] {
            let what = store.description();
            let imaged = Imaged::new(
                store,
                ImageOptions {
                    side,
                    unit: DEFAULT_UNIT,
                    limit: 1 << 20,
                },
            )
            .unwrap();
            imaged.write_at(&[1; 200_000], 30_000).unwrap();
            let image = imaged.take().unwrap();
            // Across units and (for the stripe) both members.
            imaged.write_at(&[2; 150_000], 100_000).unwrap();
            imaged.write_zeroes(0, 40_960).unwrap();
            let mut at_cut = vec![0u8; 300_000];
            image.read_at(&mut at_cut, 0).unwrap();
            let mut want = vec![0u8; 300_000];
            want[30_000..230_000].fill(1);
            assert!(at_cut == want, "{what}: the image changed");
            let mut live = vec![0u8; 300_000];
            imaged.read_at(&mut live, 0).unwrap();
            want[..40_960].fill(0);
            want[100_000..250_000].fill(2);
            assert!(live == want, "{what}: the store lost a write");
            assert_eq!(image.status().copied_bytes, 4 * DEFAULT_UNIT, "{what}");
        }
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file store's own file: {left:?}");
    }

    /// A RAM store whose reads of one offset wait at a gate: a copy aside of that unit
    /// (which reads it) stays in progress until the test opens the gate.
    #[derive(Debug)]
    struct Gated {
        inner: RamBackstore,
        at: u64,
        open: Mutex<bool>,
        opened: Condvar,
        /// Reads waiting at the gate now.
        waiting: AtomicU64,
    }

    impl Gated {
        fn open_gate(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    impl Backstore for Gated {
        crate::forward! { inner =>
            size, supports_discard, is_allocated, write_at, flush, discard, write_zeroes,
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            if offset == self.at {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let mut open = self.open.lock().unwrap();
                while !*open {
                    open = self.opened.wait(open).unwrap();
                }
                self.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            self.inner.read_at(buf, offset)
        }
    }

    /// Waits (up to a minute, far beyond what any step takes) for `done`; a step that
    /// never ends fails the test instead of hanging it (the gate opened first, so that
    /// what waits behind it ends and the image can be released).
    fn within_a_minute(gated: &Gated, what: &str, done: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(60);
        while !done() {
            if Instant::now() > until {
                gated.open_gate();
                panic!("{what}: not done after a minute");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The rule of the copy on first write: a write to a unit being copied aside waits for
    /// exactly that copy, and no other write or read of the image does. Unit 0's copy is
    /// held at a gate; meanwhile a write to unit 2, a write to unit 3 and a read of the image
    /// all end, and a second write to unit 0 waits; once the gate opens it lands, and the
    /// image still reads unit 0 as it was at the cut.
    #[test]
    fn a_write_to_a_unit_being_copied_waits_for_that_copy_only() {
        const UNIT: u64 = 4096;
        for side in [SidePlace::Memory, SidePlace::File(PathBuf::new())] {
            let dir = tempfile::tempdir().unwrap();
            let side = match side {
                SidePlace::File(_) => SidePlace::File(dir.path().join("g.image")),
                m => m,
            };
            let gated = Arc::new(Gated {
                inner: RamBackstore::new(16 * UNIT),
                at: 0,
                open: Mutex::new(false),
                opened: Condvar::new(),
                waiting: AtomicU64::new(0),
            });
            gated.inner.write_at(&[1; 16 * UNIT as usize], 0).unwrap();
            let store = Arc::new(
                Imaged::new(
                    gated.clone(),
                    ImageOptions {
                        side,
                        unit: UNIT,
                        limit: u64::MAX,
                    },
                )
                .unwrap(),
            );
            let image = store.take().unwrap();
            let write = |at: u64, byte: u8| {
                let store = store.clone();
                let done = Arc::new(AtomicBool::new(false));
                let d = done.clone();
                let t = std::thread::spawn(move || {
                    store.write_at(&[byte; UNIT as usize], at).unwrap();
                    d.store(true, Ordering::SeqCst);
                });
                (t, done)
            };
            // The first write to unit 0 copies it, and its copy waits at the gate.
            let (first, first_done) = write(0, 2);
            within_a_minute(&gated, "the copy of unit 0 reaching the gate", || {
                gated.waiting.load(Ordering::SeqCst) == 1
            });
            // Writes to other units, and a read of the image, go on meanwhile.
            let (other, other_done) = write(2 * UNIT, 3);
            within_a_minute(&gated, "a write to unit 2 while unit 0 is copied", || {
                other_done.load(Ordering::SeqCst)
            });
            other.join().unwrap();
            let (third, third_done) = write(3 * UNIT, 4);
            within_a_minute(&gated, "a write to unit 3 while unit 0 is copied", || {
                third_done.load(Ordering::SeqCst)
            });
            third.join().unwrap();
            let mut held = vec![0u8; 2 * UNIT as usize];
            image.read_at(&mut held, 2 * UNIT).unwrap();
            assert!(held.iter().all(|&b| b == 1), "the image lost units 2-3");
            // A second write to unit 0 waits for the copy in progress.
            let (second, second_done) = write(0, 5);
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                !first_done.load(Ordering::SeqCst) && !second_done.load(Ordering::SeqCst),
                "a write to unit 0 landed before its copy aside was made"
            );
            gated.open_gate();
            first.join().unwrap();
            second.join().unwrap();
            let mut unit0 = vec![0u8; UNIT as usize];
            image.read_at(&mut unit0, 0).unwrap();
            assert!(unit0.iter().all(|&b| b == 1), "the image lost unit 0's cut");
            store.read_at(&mut unit0, 0).unwrap();
            assert!(
                unit0.iter().all(|&b| b == 2) || unit0.iter().all(|&b| b == 5),
                "a torn unit 0"
            );
            assert_eq!(image.status().copied_bytes, 3 * UNIT);
        }
    }

    #[test]
    fn a_full_side_store_overruns_the_image_not_the_writes() {
        let store = imaged(64 << 10, SidePlace::Memory, 8192);
        let image = store.take().unwrap();
        store.write_at(&[1; 8192], 0).unwrap();
        let mut b = [0u8; 4096];
        image.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [0; 4096]);
        // A third unit does not fit: the write lands, the image says why it cannot serve.
        store.write_at(&[2; 4096], 32768).unwrap();
        store.read_at(&mut b, 32768).unwrap();
        assert_eq!(b, [2; 4096]);
        let e = image.read_at(&mut b, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        assert!(image.status().overrun.is_some());
    }

    #[test]
    fn an_image_holds_what_was_discarded_after_its_cut() {
        // RAM frees a whole MiB discarded; the image still holds its old content there,
        // so a sync reading the image must not take it for a hole.
        const MIB: u64 = 1 << 20;
        let store = imaged(4 * MIB, SidePlace::Memory, u64::MAX);
        store.write_at(&vec![7u8; MIB as usize], 0).unwrap();
        let image = store.take().unwrap();
        store.discard(0, MIB).unwrap();
        store.write_at(&[9u8; 4096], 2 * MIB).unwrap();
        assert_eq!(
            store.is_allocated(0, MIB).unwrap(),
            vec![(0, MIB, false)],
            "the live store no longer holds the first MiB"
        );
        let held = image.is_allocated(0, 4 * MIB).unwrap();
        assert_eq!(held[0], (0, MIB, true), "{held:?}");
        // Never written before or after the cut: a hole in both.
        assert!(held.contains(&(MIB, MIB, false)), "{held:?}");
        let mut old = vec![0u8; 4096];
        image.read_at(&mut old, 8192).unwrap();
        assert!(old.iter().all(|&b| b == 7));
    }

    /// A compare-and-write that writes copies its unit aside first: the image keeps the
    /// cut's bytes; one that miscompares writes nothing, and the image reads the same.
    #[test]
    fn compare_and_write_keeps_the_cut_in_the_image() {
        let store = imaged(64 << 10, SidePlace::Memory, u64::MAX);
        assert_eq!(store.atomic_compare_and_write_unit(), Some(1 << 20));
        store.write_at(&[5u8; 4096], 8192).unwrap();
        let image = store.take().unwrap();
        assert_eq!(
            store.compare_and_write(8192, &[6; 512], &[7; 512]).unwrap(),
            crate::Compared::Mismatch(0)
        );
        assert_eq!(
            store
                .compare_and_write(8192 + 512, &[5; 512], &[7; 512])
                .unwrap(),
            crate::Compared::Written
        );
        let mut live = vec![0u8; 4096];
        store.read_at(&mut live, 8192).unwrap();
        assert!(live[..512].iter().all(|&b| b == 5));
        assert!(live[512..1024].iter().all(|&b| b == 7));
        let mut held = vec![0u8; 4096];
        image.read_at(&mut held, 8192).unwrap();
        assert!(
            held.iter().all(|&b| b == 5),
            "the image lost the cut's bytes"
        );
    }

    #[test]
    fn one_image_at_a_time_and_dropping_it_releases() {
        let store = imaged(64 << 10, SidePlace::Memory, u64::MAX);
        let image = store.take().unwrap();
        let e = store.take().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let id = image.id();
        let again = image.clone();
        drop(image);
        assert_eq!(
            store.held().map(|s| s.id),
            Some(id),
            "a handle is still out"
        );
        drop(again);
        assert!(store.held().is_none());
        // With no image, writes copy nothing.
        store.write_at(&[3; 4096], 0).unwrap();
        let next = store.take().unwrap();
        assert_eq!(next.status().copied_bytes, 0);
        assert!(next.id() > id);
    }

    #[test]
    fn a_hold_keeps_answers_until_released() {
        let hold = Hold::default();
        let sent = Arc::new(AtomicU64::new(0));
        let send = |sent: &Arc<AtomicU64>| {
            let sent = sent.clone();
            Box::new(move || {
                sent.fetch_add(1, Ordering::SeqCst);
            }) as Box<dyn FnOnce() + Send>
        };
        hold.defer(send(&sent));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        assert!(hold.start(7));
        assert!(hold.start(7), "the same hold again is no change");
        assert!(!hold.start(8), "another hold while one is on");
        hold.defer(send(&sent));
        hold.defer(send(&sent));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        assert_eq!(hold.release(8), None, "not the hold on");
        let held = hold.release(7).unwrap();
        assert_eq!(held.answers, 2);
        assert_eq!(sent.load(Ordering::SeqCst), 3);
        assert_eq!(hold.release(7), None, "a late release");
        hold.defer(send(&sent));
        assert_eq!(sent.load(Ordering::SeqCst), 4);
    }
}
