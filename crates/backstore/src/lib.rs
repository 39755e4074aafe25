//! Block storage behind a logical unit: the [`Backstore`] trait, its kinds, and opening
//! them from a [`StoreSpec`] through a [`Registry`] of [`StoreFactory`]s; [`track`] keeps
//! a crash-safe map of the units a store's writes changed.
//!
//! Every method takes `&self`: a store is shared by all connections of a target and must
//! allow reads and writes from many threads at once.

use std::io;
use std::path::PathBuf;

// First: its macros are used by the modules below it.
#[macro_use]
mod methods;

pub mod buffers;
mod file;
pub mod groups;
mod helpers;
pub mod image;
mod lend;
mod null;
mod ram;
mod registry;
pub mod role;
mod sized;
mod spec;
mod stripe;
pub mod track;
pub mod undo;

pub use file::FileBackstore;
pub use image::{Hold, Image, ImageOptions, Imaged, SidePlace};
pub use lend::{copy_checked, Lent};
pub use null::NullBackstore;
pub use ram::RamBackstore;
pub use registry::{OpenContext, OpenError, Param, Registry, StoreFactory};
pub use spec::{SpecError, StoreSpec};
pub use stripe::StripeBackstore;
pub use track::{ChangeMap, Frozen, NewMap, Tracked};
pub use undo::{CycleState, Undo};

/// Byte-addressed storage of a fixed size.
pub trait Backstore: Send + Sync + std::fmt::Debug {
    /// Size in bytes, now. Most stores keep the size they were opened with; one whose size
    /// can change by itself (an RBD image resized by another client) returns the new one,
    /// and the logical unit, which asks before every command, tells its initiators
    /// (CAPACITY DATA HAS CHANGED). So it must cost no more than a load.
    fn size(&self) -> u64;
    /// Fills the whole of `buf` from `offset`, or fails.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads like [`Backstore::read_at`], but only if that needs no wait for a device (the
    /// data is in memory or in the page cache): `Ok(false)` when it would wait, and then
    /// `buf` holds nothing of use. Lets an event loop serve cached reads without handing
    /// them to a thread that may block.
    fn try_read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<bool> {
        Ok(false)
    }
    /// Whether [`Backstore::read_async`] returns before the read is done, the store
    /// completing it on a thread of its own (librbd's): then an event loop may start reads
    /// itself instead of parking a thread that may block on each. No (the default) for a
    /// store whose reads block; callers then keep its reads on such threads. May change
    /// over the store's life (an RBD store says no while it has no connection, so that the
    /// blocking path connects again): ask before each read.
    fn reads_async(&self) -> bool {
        false
    }
    /// Starts reading `buf.len()` bytes at `offset`; `done` gets `buf` back, filled, or the
    /// error, exactly once. A store that says yes to [`Backstore::reads_async`] returns at
    /// once and calls `done` later on a thread of its own (or before it returns, when it
    /// fails at once or its cache answers); `done` must not block, and the buffer is the
    /// store's until then, whatever happens to whoever started the read. The default is
    /// today's blocking path: [`Backstore::read_at`] on the calling thread, then `done`.
    fn read_async(&self, buf: buffers::Buf, offset: u64, done: ReadDone) {
        let mut buf = buf;
        let r = self.read_at(&mut buf, offset);
        done(buf, r)
    }
    /// Whether [`Backstore::read_lent_async`] hands over memory of the store's own (no
    /// copy into a buffer of the caller's) for a read of `len` bytes, completing it as
    /// [`Backstore::reads_async`] says: ask before each read. No by default.
    fn reads_lent_async(&self, _len: usize) -> bool {
        false
    }
    /// Starts reading `len` bytes at `offset` into memory the store lends to `done` (plain
    /// memory, which anyone may read: [`Lent::readable_in_user_space`]), under the rules of
    /// [`Backstore::read_async`]: `done` runs exactly once, with the bytes or the error.
    /// The lent bytes are the caller's to keep until it drops them; the store neither
    /// changes nor frees them meanwhile. The default reads into a buffer and lends that.
    fn read_lent_async(&self, offset: u64, len: usize, done: LentDone) {
        self.read_async(
            buffers::Buf::take(len),
            offset,
            Box::new(move |buf, r| done(r.map(|()| Lent::owned(buf)))),
        )
    }
    /// Whether [`Backstore::write_async`] and [`Backstore::flush_async`] return before the
    /// write or flush is done, the store completing them on a thread of its own (librbd's),
    /// as [`Backstore::reads_async`] says of reads. Asked before each command.
    fn writes_async(&self) -> bool {
        false
    }
    /// Starts writing the whole of `buf` at `offset`, made durable before `done` runs when
    /// `durable` is set (a FUA write, or any write while the write cache is off: as
    /// [`Backstore::write_at`] then [`Backstore::flush`]); `done` gets the buffer back and
    /// the outcome exactly once, under the rules of [`Backstore::read_async`] (the buffer
    /// is the store's until then). The default is the blocking path on the calling thread.
    fn write_async(&self, buf: buffers::Buf, offset: u64, durable: bool, done: WriteDone) {
        let r = self
            .write_at(&buf, offset)
            .and_then(|()| if durable { self.flush() } else { Ok(()) });
        done(buf, r)
    }
    /// Starts a [`Backstore::flush`]: every write completed before the call is durable when
    /// `done` runs (exactly once, as [`Backstore::write_async`]'s). The default blocks.
    fn flush_async(&self, done: FlushDone) {
        done(self.flush())
    }
    /// Lends `[offset, offset + len)` without copying it (see [`Lent`]), when the store
    /// can: `Ok(None)` when it cannot, or when `wait` is false and the bytes are not in
    /// memory yet. With `wait`, the call may block until they are. The caller keeps
    /// writers (UNMAP too) off the range from before the call until the window is dropped:
    /// what a store lends may depend on the range's state (a file on tmpfs lends no hole
    /// from its mapping).
    fn lend(&self, _offset: u64, _len: u64, _wait: bool) -> io::Result<Option<Lent>> {
        Ok(None)
    }
    /// Whether [`Backstore::lend`] can ever lend: a store that copies says no, and callers
    /// skip the lending path for it.
    fn can_lend(&self) -> bool {
        false
    }
    /// Whether what [`Backstore::lend`] lends is plain memory, which user space may read
    /// (a TLS carrier encrypting it, a data digest): a memory store says yes, a file's
    /// mapping no (see [`Lent::readable_in_user_space`]).
    fn lends_memory(&self) -> bool {
        false
    }
    /// Writes the whole of `buf` at `offset`, or fails.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Deallocates a range; later reads of it return zeros.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Sets a range to zeros, deallocating where the store can.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Describes `[offset, offset + len)` as consecutive extents `(offset, len, allocated)`
    /// that together cover the range exactly.
    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>>;
    /// Whether [`Backstore::discard`] really frees space.
    fn supports_discard(&self) -> bool;
    /// Whether writes are refused.
    fn read_only(&self) -> bool {
        false
    }
    /// What the store is and where its data lives, for people reading the logs.
    fn description(&self) -> String {
        format!("{self:?}")
    }
    /// Where a file of state that belongs with the store's data goes, named with `suffix`
    /// (persistent reservations kept with APTPL: `.pr`). A file store keeps it beside its
    /// image, so it moves and is backed up with the data; `None`: the store has no such
    /// place, and the state is not kept across restarts.
    fn sidecar(&self, _suffix: &str) -> Option<PathBuf> {
        None
    }
    /// The unit within which [`Backstore::compare_and_write`] is atomic against every
    /// writer of the data, this process's or another's (another target exporting the same
    /// RBD image): a range it takes lies inside one aligned unit of this many bytes. `None`
    /// (the default): the store has no such operation, and the logical unit compares and
    /// writes under its own range lock, which holds only within this process.
    fn atomic_compare_and_write_unit(&self) -> Option<u64> {
        None
    }
    /// Whether the store offers [`Backstore::compare_and_write`] at all.
    fn supports_atomic_compare_and_write(&self) -> bool {
        self.atomic_compare_and_write_unit().is_some()
    }
    /// Compares `[offset, offset + verify.len())` with `verify` and, only if every byte is
    /// equal, writes `write` (as long as `verify`) there, as one step that no other write
    /// to the data, through whatever client, can come between. A range outside one unit of
    /// [`Backstore::atomic_compare_and_write_unit`] is refused (`InvalidInput`), never
    /// split: half a compare-and-write done is a lost update. The default refuses all
    /// (`Unsupported`).
    fn compare_and_write(&self, offset: u64, verify: &[u8], write: &[u8]) -> io::Result<Compared> {
        let _ = (offset, verify, write);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the store has no atomic compare-and-write",
        ))
    }
    /// Tells the other targets that export this store's data (opened shared, see
    /// `OpenContext::shared`) that its logical unit was reset, and returns once they have
    /// taken it (or failed to within the store's deadline): a LOGICAL UNIT RESET reaches
    /// every nexus of the logical unit, through whichever target. Nothing for a store that
    /// is not shared.
    fn announce_reset(&self) -> io::Result<()> {
        Ok(())
    }
    /// What to do when another target announces a reset ([`Backstore::announce_reset`]):
    /// `f` runs on a thread of the store's. Set once by the logical unit; stores that are
    /// not shared never call it.
    fn on_peer_reset(&self, _f: std::sync::Arc<dyn Fn() + Send + Sync>) {}
    /// Where the logical unit's persistent reservations live when other targets export
    /// this store's data too and the store keeps them in its cluster (the `rbd` kind with
    /// `peer_portal_groups`). `None`: the logical unit keeps them itself.
    fn cluster_reservations(&self) -> Option<std::sync::Arc<dyn ClusterReservations>> {
        None
    }

    /// For a store that other targets export too: starts keeping the ALUA states of the
    /// target port groups `own` (this target's) and `peers` (theirs) where all of them
    /// read and write (see [`groups::PortGroups`]). `None`: a store that cannot, whose
    /// logical unit reports fixed states.
    fn port_groups(
        &self,
        _own: u16,
        _peers: &[u16],
    ) -> io::Result<Option<std::sync::Arc<dyn groups::PortGroups>>> {
        Ok(None)
    }
}

/// What [`Backstore::compare_and_write`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compared {
    /// The data equalled `verify` and now holds `write`.
    Written,
    /// The data differed from `verify`, first at this byte (counted from the range's
    /// start); nothing was written.
    Mismatch(u64),
}

/// Whether `[offset, offset + len)` lies inside one aligned `unit`: what a store whose
/// compare-and-write is atomic only within such a unit checks before it starts one.
pub fn within_unit(offset: u64, len: u64, unit: u64) -> bool {
    unit > 0 && len <= unit && offset % unit + len <= unit
}

/// Persistent reservation state kept in a cluster that every target exporting one store
/// reads and changes: opaque bytes (the logical unit's rules give them meaning), a
/// sequence number that every change moves on by one, compare-and-set on that number, and
/// events published to the other targets.
///
/// What a target may trust: [`ClusterReservations::cached`] answers the state only while
/// the store's lease holds (it has read the state, or taken a newer one from an event,
/// recently enough, and its watch for events works); otherwise it answers an error and
/// the logical unit lets no command that depends on reservations through.
pub trait ClusterReservations: Send + Sync + std::fmt::Debug {
    /// The state as this target knows it, with its sequence number; an error while the
    /// lease does not hold (cut off from the cluster, or the watch for events broken).
    fn cached(&self) -> io::Result<(u64, std::sync::Arc<[u8]>)>;
    /// Reads the state from the cluster now (blocks up to the store's deadline).
    fn load(&self) -> io::Result<(u64, Vec<u8>)>;
    /// Writes `state` as sequence `seq + 1` if the cluster still holds `seq`: `Ok(false)`
    /// when another target changed it first (load it again and retry). An error leaves
    /// it unknown whether the write happened.
    fn store(&self, seq: u64, state: &[u8]) -> io::Result<bool>;
    /// Tells every other target that the state is now `seq` (`state`) and hands them
    /// `event`; returns once each has acknowledged, having applied it, or once any that
    /// did not has certainly stopped trusting its older state (its lease ran out).
    fn publish(&self, seq: u64, state: &[u8], event: &[u8]) -> io::Result<()>;
    /// What runs when another target publishes: `f(event)`, after the cached state has
    /// become the published one and before the acknowledgement. Set once.
    fn on_event(&self, f: ClusterEventHandler);
}

/// What [`ClusterReservations::on_event`] runs for another target's event.
pub type ClusterEventHandler = std::sync::Arc<dyn Fn(&[u8]) + Send + Sync>;

/// What a store calls when a read started with [`Backstore::read_async`] is over: the
/// buffer, and whether it was filled.
pub type ReadDone = Box<dyn FnOnce(buffers::Buf, io::Result<()>) + Send>;

/// What a store calls when a read started with [`Backstore::read_lent_async`] is over:
/// the bytes it lends, or the error.
pub type LentDone = Box<dyn FnOnce(io::Result<Lent>) + Send>;

/// What a store calls when a write started with [`Backstore::write_async`] is over: the
/// buffer it wrote, and whether it was written (and made durable, when asked).
pub type WriteDone = Box<dyn FnOnce(buffers::Buf, io::Result<()>) + Send>;

/// What a store calls when a flush started with [`Backstore::flush_async`] is over.
pub type FlushDone = Box<dyn FnOnce(io::Result<()>) + Send>;

/// Why a store refused a request.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("range {offset}+{len} is beyond the end of the store ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("the store is read-only")]
    ReadOnly,
    #[error("requested size {requested} is smaller than the existing file ({existing} bytes); refusing to truncate")]
    WouldTruncate { requested: u64, existing: u64 },
    #[error("no size given for a file that does not exist yet")]
    NoSize,
}

impl From<StoreError> for io::Error {
    fn from(e: StoreError) -> Self {
        let kind = match e {
            StoreError::OutOfRange { .. } => io::ErrorKind::InvalidInput,
            StoreError::ReadOnly => io::ErrorKind::PermissionDenied,
            StoreError::WouldTruncate { .. } => io::ErrorKind::InvalidInput,
            StoreError::NoSize => io::ErrorKind::NotFound,
        };
        io::Error::new(kind, e)
    }
}

pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(StoreError::OutOfRange { offset, len, size }.into()),
    }
}

/// Merges neighbouring extents of the same kind so callers see the fewest descriptors.
pub(crate) fn push_extent(out: &mut Vec<(u64, u64, bool)>, offset: u64, len: u64, alloc: bool) {
    if len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.2 == alloc && last.0 + last.1 == offset {
            last.1 += len;
            return;
        }
    }
    out.push((offset, len, alloc));
}
