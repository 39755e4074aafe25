//! The logical unit: state shared by all nexuses and the SBC/SPC command set.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};

use backstore::buffers::Buf;
use backstore::{Backstore, Lent};

use crate::cdb::{self, be16, be32, be64, block_range, truncate, BlockRange};
use crate::inquiry::{self, Limits};
use crate::mode::{self, ModeState};
use crate::opcodes::*;
use crate::pr::{Fail, Notices, Reservations};
use crate::range_lock::{RangeGuard, RangeLocks};
use crate::sanitize::{self, Sanitizer};
use crate::sense::{self, Sense};
use crate::xcopy::{self, CopyList, CopyState, CopyStatus, CopyTargets, Designator, Segment};
use crate::{status, Command, LuConfig, Nexus, Response};

type Outcome = Result<Vec<u8>, Sense>;

/// Largest buffer a WRITE SAME fills at once.
const WRITE_SAME_CHUNK: u64 = 1 << 20;
/// Bytes an EXTENDED COPY segment moves per read and write.
const COPY_CHUNK: u64 = 1 << 20;

/// Per-nexus state: unit attentions not yet reported.
type Pending = Mutex<VecDeque<Sense>>;

/// A direct-access logical unit over a [`Backstore`].
#[derive(Debug)]
pub struct LogicalUnit {
    config: LuConfig,
    store: Arc<dyn Backstore>,
    block_size: u64,
    /// Logical blocks, as the store's size last gave them (see
    /// [`LogicalUnit::refresh_capacity`]).
    capacity: AtomicU64,
    limits: Limits,
    mode: RwLock<ModeState>,
    nexuses: RwLock<HashMap<Nexus, Pending>>,
    /// Removable medium ejected by START STOP UNIT.
    no_medium: AtomicBool,
    /// A SANITIZE operation, running or not: the medium answers nothing while it runs
    /// (SBC-4 4.11).
    sanitizer: Arc<Sanitizer>,
    /// Nexuses holding a PREVENT MEDIUM REMOVAL.
    prevent: Mutex<HashSet<Nexus>>,
    /// Writes hold their blocks exclusively, reads shared: a write (WRITE ATOMIC above
    /// all) is never seen half done, not even by a read whose bytes are still being sent.
    locks: Arc<RangeLocks>,
    reservations: Mutex<Reservations>,
    /// VPD page 83h designators of this logical unit (association: logical unit).
    designators: Vec<Designator>,
    /// The other logical units EXTENDED COPY may reach, when the transport tells.
    copy_targets: OnceLock<Weak<dyn CopyTargets>>,
    /// EXTENDED COPY status kept for RECEIVE COPY RESULTS, by nexus and list identifier.
    copies: Mutex<HashMap<(Nexus, u8), CopyStatus>>,
}

/// The data of a READ lent by the store (see [`LogicalUnit::try_read_lent`]): writes to its
/// blocks wait until it is dropped.
#[derive(Debug)]
pub struct LentRead {
    data: Lent,
    _guard: RangeGuard,
}

impl AsRef<[u8]> for LentRead {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}

/// A plain READ ready to start on a store that completes it on a thread of its own (see
/// [`LogicalUnit::try_read_async`]); it holds its blocks against writes.
#[derive(Debug)]
pub struct AsyncRead {
    store: Arc<dyn Backstore>,
    guard: RangeGuard,
    lba: u64,
    offset: u64,
    len: usize,
}

impl AsyncRead {
    /// Starts the read and returns; `done` gets the command's response once the store has
    /// read the blocks (GOOD with the data, or CHECK CONDITION with UNRECOVERED READ
    /// ERROR as [`LogicalUnit::execute`] answers a store's error), exactly once, on the
    /// store's thread or on this one. The blocks are let go before `done` runs.
    pub fn start(self, done: impl FnOnce(Response) + Send + 'static) {
        let AsyncRead {
            store,
            guard,
            lba,
            offset,
            len,
        } = self;
        let buf = Buf::take(len);
        store.read_async(
            buf,
            offset,
            Box::new(move |buf, result| {
                drop(guard);
                done(match result {
                    Ok(()) => Response::good(buf.into_vec()),
                    Err(e) => {
                        tracing::warn!(error = %e, "backstore I/O error");
                        Response::check_condition(
                            &sense::UNRECOVERED_READ_ERROR.with_information(lba),
                        )
                    }
                })
            }),
        );
    }
}

/// A plain WRITE ready to start on a store that completes writes on a thread of its own
/// (see [`LogicalUnit::try_write_async`]); it holds its blocks against other commands.
#[derive(Debug)]
pub struct AsyncWrite {
    store: Arc<dyn Backstore>,
    guard: RangeGuard,
    lba: u64,
    offset: u64,
    len: usize,
    /// FUA, or the write cache is off: durable before the answer.
    durable: bool,
}

impl AsyncWrite {
    /// Bytes the write takes: the buffer given to [`AsyncWrite::start`] holds exactly so
    /// many.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the write has no bytes (never: such a WRITE is not started this way).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts the write of `data` (exactly [`AsyncWrite::len`] bytes) and returns; `done`
    /// gets the command's response once the store has written them, and made them durable
    /// for a FUA write or while the write cache is off (GOOD, or CHECK CONDITION with WRITE
    /// ERROR as [`LogicalUnit::execute`] answers a store's error), exactly once, on the
    /// store's thread or on this one. The blocks are let go before `done` runs.
    pub fn start(self, data: Buf, done: impl FnOnce(Response) + Send + 'static) {
        let AsyncWrite {
            store,
            guard,
            lba,
            offset,
            len,
            durable,
        } = self;
        if data.len() != len {
            drop(guard);
            return done(Response::check_condition(
                &sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
            ));
        }
        store.write_async(
            data,
            offset,
            durable,
            Box::new(move |_buf, result| {
                drop(guard);
                done(match result {
                    Ok(()) => Response::good(Vec::new()),
                    Err(e) => {
                        tracing::warn!(error = %e, "backstore I/O error");
                        Response::check_condition(&sense::WRITE_ERROR.with_information(lba))
                    }
                })
            }),
        );
    }
}

/// A SYNCHRONIZE CACHE ready to start on a store that completes flushes on a thread of
/// its own (see [`LogicalUnit::try_flush_async`]).
#[derive(Debug)]
pub struct AsyncFlush {
    store: Arc<dyn Backstore>,
}

impl AsyncFlush {
    /// Starts the flush; `done` gets GOOD once every write completed before it is durable,
    /// or CHECK CONDITION with WRITE ERROR, exactly once, on the store's thread or this one.
    pub fn start(self, done: impl FnOnce(Response) + Send + 'static) {
        self.store.flush_async(Box::new(move |result| {
            done(match result {
                Ok(()) => Response::good(Vec::new()),
                Err(e) => {
                    tracing::warn!(error = %e, "backstore I/O error");
                    Response::check_condition(&sense::WRITE_ERROR)
                }
            })
        }));
    }
}

/// A copy source or destination: this logical unit or another one.
enum CopyTarget<'a> {
    This(&'a LogicalUnit),
    Other(Arc<LogicalUnit>),
}

impl std::ops::Deref for CopyTarget<'_> {
    type Target = LogicalUnit;

    fn deref(&self) -> &LogicalUnit {
        match self {
            CopyTarget::This(lu) => lu,
            CopyTarget::Other(lu) => lu,
        }
    }
}

impl LogicalUnit {
    pub fn new(config: LuConfig, store: Arc<dyn Backstore>) -> Self {
        let block_size = config.block_size.max(1) as u64;
        let capacity = store.size() / block_size;
        let limits = Limits::new(&config);
        let designators = inquiry::lu_designators(&config);
        let reservations = config
            .pr_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| Reservations::load(&text))
            .unwrap_or_default();
        Self {
            config,
            store,
            block_size,
            capacity: AtomicU64::new(capacity),
            limits,
            mode: RwLock::new(ModeState::default()),
            nexuses: RwLock::new(HashMap::new()),
            no_medium: AtomicBool::new(false),
            sanitizer: Arc::default(),
            prevent: Mutex::new(HashSet::new()),
            locks: Arc::default(),
            reservations: Mutex::new(reservations),
            designators,
            copy_targets: OnceLock::new(),
            copies: Mutex::new(HashMap::new()),
        }
    }

    /// Lets EXTENDED COPY reach the logical units `targets` finds (the target's other
    /// logical units). Set once; later calls change nothing.
    pub fn set_copy_targets(&self, targets: Weak<dyn CopyTargets>) {
        let _ = self.copy_targets.set(targets);
    }

    /// Whether `d` is one of this logical unit's designators (VPD page 83h).
    pub fn has_designator(&self, d: &Designator) -> bool {
        self.designators.contains(d)
    }

    fn copies(&self) -> MutexGuard<'_, HashMap<(Nexus, u8), CopyStatus>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the initiator port (`iqn...,i,0x<isid>`) behind a nexus; persistent
    /// reservations are kept by this name.
    pub fn name_nexus(&self, nexus: Nexus, initiator_port: &str) {
        self.pr().name(nexus, initiator_port);
    }

    fn pr(&self) -> MutexGuard<'_, Reservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &LuConfig {
        &self.config
    }

    fn offer(&self) -> Offer {
        Offer {
            thin: self.config.thin,
            reservations: self.config.peer_port_groups.is_empty(),
        }
    }

    /// Number of logical blocks.
    pub fn capacity_blocks(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }

    /// Takes the store's size again (a store whose size changes by itself: an RBD image
    /// resized by another client); when it has changed, every nexus gets CAPACITY DATA HAS
    /// CHANGED (SBC-4 4.10) and READ CAPACITY answers the new size from then on. Called
    /// before every command; a store's `size` is a field or an atomic, so this costs a
    /// load and a compare. Returns whether the capacity changed.
    pub fn refresh_capacity(&self) -> bool {
        let blocks = self.store.size() / self.block_size;
        if self.capacity.load(Ordering::Acquire) == blocks {
            return false;
        }
        let old = self.capacity.swap(blocks, Ordering::AcqRel);
        if old == blocks {
            return false;
        }
        tracing::info!(
            store = %self.store.description(),
            "capacity changed from {old} to {blocks} blocks of {}",
            self.block_size
        );
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for pending in nexuses.values() {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            if !q.contains(&sense::CAPACITY_DATA_HAS_CHANGED) {
                q.push_back(sense::CAPACITY_DATA_HAS_CHANGED);
            }
        }
        true
    }

    pub fn flush(&self) -> io::Result<()> {
        self.store.flush()
    }

    /// LOGICAL UNIT RESET: mode parameters and medium removal prevention return to their
    /// defaults and every nexus gets a unit attention; a store that other targets export
    /// too tells them, so that their nexuses get it as well (this blocks until they have,
    /// or the store gave up: call it where blocking is allowed).
    pub fn reset(&self) {
        self.reset_here();
        if let Err(e) = self.store.announce_reset() {
            tracing::warn!(
                store = %self.store.description(),
                "the other targets exporting this LU may not have seen its reset: {e}"
            );
        }
    }

    /// Takes resets that other targets exporting the same store announce (see
    /// [`Backstore::on_peer_reset`]) as this LU's own, without announcing them again.
    pub fn listen_to_peers(self: &Arc<Self>) {
        let lu = Arc::downgrade(self);
        self.store.on_peer_reset(Arc::new(move || {
            if let Some(lu) = lu.upgrade() {
                tracing::info!("logical unit reset announced by another target");
                lu.reset_here();
            }
        }));
    }

    fn reset_here(&self) {
        *self.mode.write().unwrap_or_else(|e| e.into_inner()) = ModeState::default();
        self.prevent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for pending in nexuses.values() {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            q.clear();
            q.push_back(sense::POWER_ON_RESET);
        }
        drop(nexuses);
        self.pr().reset();
    }

    /// I_T nexus loss: forget the nexus; if it returns it starts afresh.
    pub fn nexus_lost(&self, nexus: Nexus) {
        self.nexuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
        self.pr().nexus_lost(nexus);
        self.prevent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
        self.copies().retain(|(n, _), _| *n != nexus);
    }

    /// Bytes the initiator is to send for this CDB, or `None` if the CDB is not one this
    /// logical unit understands well enough to say.
    pub fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u32> {
        cdb::check_len(cdb).ok()?;
        let bs = block_size as u64;
        let blocks = |r: BlockRange| r.blocks.checked_mul(bs).and_then(|n| u32::try_from(n).ok());
        match cdb[0] {
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 | WRITE_VERIFY_10 | WRITE_VERIFY_12
            | WRITE_VERIFY_16 | ORWRITE_16 => blocks(block_range(cdb)),
            VERIFY_10 | VERIFY_12 | VERIFY_16 => match (cdb[1] >> 1) & 0x03 {
                0 => Some(0),
                1 => blocks(block_range(cdb)),
                3 => Some(block_size),
                _ => None,
            },
            // Data of another length than the CDB implies is refused (SBC-4 4.28.2 lets
            // the device server do so), so the transport hands over what came.
            WRITE_SAME_10 | WRITE_SAME_16 | COMPARE_AND_WRITE => None,
            UNMAP | MODE_SELECT_10 => Some(be16(&cdb[7..9]) as u32),
            MODE_SELECT_6 => Some(cdb[4] as u32),
            SANITIZE => Some(be16(&cdb[7..9]) as u32),
            WRITE_ATOMIC_16 => u32::try_from(be16(&cdb[12..14]) as u64 * bs).ok(),
            PERSISTENT_RESERVE_OUT => Some(be32(&cdb[5..9])),
            EXTENDED_COPY => Some(xcopy::parameter_list_length(cdb)),
            RECEIVE_COPY_RESULTS => Some(0),
            RESERVE_6 | RELEASE_6 | RESERVE_10 | RELEASE_10 | PERSISTENT_RESERVE_IN => Some(0),
            TEST_UNIT_READY | REQUEST_SENSE | READ_6 | INQUIRY | MODE_SENSE_6 | START_STOP_UNIT
            | PREVENT_ALLOW | READ_CAPACITY_10 | READ_10 | PRE_FETCH_10 | SYNCHRONIZE_CACHE_10
            | READ_DEFECT_DATA_10 | MODE_SENSE_10 | READ_16 | PRE_FETCH_16
            | SYNCHRONIZE_CACHE_16 | SERVICE_ACTION_IN_16 | REPORT_LUNS | MAINTENANCE_IN
            | READ_12 | READ_DEFECT_DATA_12 => Some(0),
            _ => None,
        }
    }

    /// Runs one command. Safe to call from many threads at once.
    pub fn execute(&self, cmd: &Command) -> Response {
        self.execute_abortable(cmd, &|| false)
    }

    /// Runs one command that the transport may abort while it runs: `aborted` says when.
    /// Only a SANITIZE waiting for its operation looks (and stops waiting); every other
    /// command finishes as it would.
    pub fn execute_abortable(&self, cmd: &Command, aborted: &dyn Fn() -> bool) -> Response {
        match self.run(cmd, aborted) {
            Ok(data) => Response::good(data),
            Err(Fail::Check(s)) => Response::check_condition(&s),
            Err(Fail::Conflict) => Response {
                status: status::RESERVATION_CONFLICT,
                sense: None,
                data_in: Vec::new(),
            },
        }
    }

    /// The blocks of a plain READ that [`LogicalUnit::execute`] would answer with GOOD and
    /// the data, changing nothing else; `None` for any other command or outcome (a pending
    /// unit attention, a reservation conflict, a bad field, more than `max_bytes` as the
    /// CDB asks, whatever the transport expects).
    fn plain_read(&self, cmd: &Command, max_bytes: u64) -> Option<BlockRange> {
        if !matches!(
            cmd.cdb.first(),
            Some(&(READ_6 | READ_10 | READ_12 | READ_16))
        ) {
            return None;
        }
        self.plain_block(cmd, max_bytes)
    }

    /// The blocks of a plain WRITE that [`LogicalUnit::execute`] would write (and answer
    /// with GOOD unless the store fails), changing nothing else; `None` as for
    /// [`LogicalUnit::plain_read`], and for a LU that refuses writes or data of another
    /// length than the CDB's.
    fn plain_write(&self, cmd: &Command, max_bytes: u64) -> Option<BlockRange> {
        if !matches!(
            cmd.cdb.first(),
            Some(&(WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16))
        ) || self.check_writable().is_err()
        {
            return None;
        }
        let r = self.plain_block(cmd, max_bytes)?;
        (cmd.data_out.len() as u64 == r.blocks * self.block_size).then_some(r)
    }

    /// What [`LogicalUnit::plain_read`] and [`LogicalUnit::plain_write`] share: the checks
    /// of `run` and of the command's own function, for a READ or WRITE of any size.
    /// Whether the nexus is known and has no unit attention waiting: otherwise its next
    /// command is `execute()`'s, which reports it.
    fn nothing_pending(&self, nexus: Nexus) -> bool {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        nexuses
            .get(&nexus)
            .is_some_and(|pending| pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty())
    }

    fn plain_block(&self, cmd: &Command, max_bytes: u64) -> Option<BlockRange> {
        let cdb = cmd.cdb;
        if cdb::check_len(cdb).is_err()
            || self.sanitizer.running()
            || self.medium_present().is_err()
        {
            return None;
        }
        // An unknown nexus gets its power-on unit attention on its first command, and a
        // pending one goes with the next: both are execute()'s to report.
        if self.refresh_capacity() {
            return None;
        }
        if !self.nothing_pending(cmd.nexus) {
            return None;
        }
        let r = block_range(cdb);
        let ok = r.flags & 0xe0 == 0
            && r.blocks > 0
            && r.blocks.saturating_mul(self.block_size) <= max_bytes
            && self.check_range(r.lba, r.blocks).is_ok()
            && self.check_transfer(cdb, r.blocks).is_ok()
            && self.pr().check(cmd.nexus, cdb).is_ok();
        ok.then_some(r)
    }

    /// Answers a plain READ now if the store can serve it without waiting for a device (see
    /// [`Backstore::try_read_at`]) and no write holds its blocks; `None` otherwise — for
    /// another command, for a read that would wait, or for one that
    /// [`LogicalUnit::execute`] would refuse — and then nothing has changed: no unit
    /// attention taken, no state touched. Lets a transport answer cached reads on its event
    /// loop and keep a thread that may block for the rest. Reads of more than `max_bytes`
    /// (as the CDB asks, whatever the transport expects) are declined too.
    pub fn try_read_now(&self, cmd: &Command, max_bytes: u64) -> Option<Response> {
        let r = self.plain_read(cmd, max_bytes)?;
        let _guard = self.locks.try_lock(r.lba, r.lba + r.blocks, false)?;
        let mut buf = Buf::take((r.blocks * self.block_size) as usize);
        match self.store.try_read_at(&mut buf, r.lba * self.block_size) {
            Ok(true) => Some(Response::good(buf.into_vec())),
            // Errors too are execute()'s to report, with its sense data and log line.
            Ok(false) | Err(_) => None,
        }
    }

    /// Prepares a plain READ to be started on a store that completes reads on threads of
    /// its own (see [`Backstore::reads_async`]), under the same rules as
    /// [`LogicalUnit::try_read_now`]: `None` and nothing changed for another command, one
    /// that [`LogicalUnit::execute`] would answer otherwise, a store that reads by
    /// blocking, or blocks a write holds now. Its blocks are held against writes from here
    /// until the store has read them. Start it with [`AsyncRead::start`].
    pub fn try_read_async(&self, cmd: &Command, max_bytes: u64) -> Option<AsyncRead> {
        if !self.store.reads_async() {
            return None;
        }
        let r = self.plain_read(cmd, max_bytes)?;
        let guard = self.locks.try_lock(r.lba, r.lba + r.blocks, false)?;
        Some(AsyncRead {
            store: self.store.clone(),
            guard,
            lba: r.lba,
            offset: r.lba * self.block_size,
            len: (r.blocks * self.block_size) as usize,
        })
    }

    /// Prepares a plain WRITE (6, 10, 12, 16; FUA or not) to be started on a store that
    /// completes writes on threads of its own (see [`Backstore::writes_async`]), under the
    /// rules of [`LogicalUnit::try_read_async`]; `cmd.data_out` is only measured (it must
    /// hold exactly the CDB's blocks): the bytes go to [`AsyncWrite::start`]. Its blocks
    /// are held exclusively from here until the store has written them.
    pub fn try_write_async(&self, cmd: &Command, max_bytes: u64) -> Option<AsyncWrite> {
        if !self.store.writes_async() {
            return None;
        }
        let r = self.plain_write(cmd, max_bytes)?;
        let guard = self.locks.try_lock(r.lba, r.lba + r.blocks, true)?;
        let wce = self.mode.read().unwrap_or_else(|e| e.into_inner()).wce;
        Some(AsyncWrite {
            store: self.store.clone(),
            guard,
            lba: r.lba,
            offset: r.lba * self.block_size,
            len: (r.blocks * self.block_size) as usize,
            durable: r.flags & 0x08 != 0 || !wce,
        })
    }

    /// Prepares a SYNCHRONIZE CACHE (10 or 16) to be started on a store that completes
    /// flushes on threads of its own, under the rules of [`LogicalUnit::try_read_async`].
    pub fn try_flush_async(&self, cmd: &Command) -> Option<AsyncFlush> {
        let cdb = cmd.cdb;
        if !self.store.writes_async()
            || !matches!(
                cdb.first(),
                Some(&(SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16))
            )
            || cdb::check_len(cdb).is_err()
            || self.sanitizer.running()
            || self.medium_present().is_err()
            || self.refresh_capacity()
        {
            return None;
        }
        if !self.nothing_pending(cmd.nexus) {
            return None;
        }
        let r = block_range(cdb);
        if self.check_range(r.lba, r.blocks).is_err() || self.pr().check(cmd.nexus, cdb).is_err() {
            return None;
        }
        Some(AsyncFlush {
            store: self.store.clone(),
        })
    }

    /// Whether reads may be answered with the store's bytes lent (see
    /// [`LogicalUnit::try_read_lent`]).
    pub fn can_lend(&self) -> bool {
        self.store.can_lend()
    }

    /// Whether the bytes lent are plain memory that user space may read (see
    /// [`Backstore::lends_memory`]): then a carrier that encrypts, or a data digest, may
    /// take them too.
    pub fn lends_memory(&self) -> bool {
        self.store.lends_memory()
    }

    /// Answers a plain READ with the store's bytes lent rather than copied (see
    /// [`Backstore::lend`]), under the same rules as [`LogicalUnit::try_read_now`]: `None`
    /// and nothing changed when it cannot. The answer is GOOD with [`LentRead`]'s bytes,
    /// which hold the read's blocks against writes until dropped: drop it once they are
    /// sent. With `wait` the call may block — for a write in the way, for the device —
    /// where without it declines.
    pub fn try_read_lent(&self, cmd: &Command, max_bytes: u64, wait: bool) -> Option<LentRead> {
        // A store that copies (the ram store) is not asked to check the command again.
        if !self.store.can_lend() {
            return None;
        }
        let r = self.plain_read(cmd, max_bytes)?;
        // The window is only a view: taking it before the lock reads nothing yet, and a store
        // that cannot lend now leaves the lock table alone.
        let data = self
            .store
            .lend(r.lba * self.block_size, r.blocks * self.block_size, wait)
            .ok()??;
        let (start, end) = (r.lba, r.lba + r.blocks);
        let guard = if wait {
            self.locks.lock(start, end, false)
        } else {
            self.locks.try_lock(start, end, false)?
        };
        Some(LentRead {
            data,
            _guard: guard,
        })
    }

    fn run(&self, cmd: &Command, aborted: &dyn Fn() -> bool) -> Result<Vec<u8>, Fail> {
        let Some(&opcode) = cmd.cdb.first() else {
            return Err(sense::INVALID_COMMAND_OPERATION_CODE.into());
        };
        cdb::check_len(cmd.cdb)?;
        let cdb = cmd.cdb;
        let sa = (cdb[1] & 0x1f) as u16;
        let offer = self.offer();
        // Reservations a LU does not offer are refused as a whole, whatever the service
        // action (see `LuConfig::peer_port_groups`).
        if !offer.reservations && is_reservation(opcode) {
            return Err(sense::INVALID_COMMAND_OPERATION_CODE.into());
        }
        if !is_supported(opcode, sa, offer) {
            // A known opcode with an unknown service action is a bad field, not a bad
            // opcode.
            if has_service_action(opcode) {
                return Err(Sense::invalid_field_in_cdb(1, Some(4)).into());
            }
            return Err(sense::INVALID_COMMAND_OPERATION_CODE.into());
        }

        self.register(cmd.nexus);
        self.refresh_capacity();
        if !matches!(opcode, INQUIRY | REPORT_LUNS | REQUEST_SENSE) {
            if let Some(ua) = self.take_unit_attention(cmd.nexus) {
                return Err(ua.into());
            }
        }
        if self.sanitizer.running() && !matches!(opcode, INQUIRY | REPORT_LUNS | REQUEST_SENSE) {
            return Err(self.sanitizer.in_progress().into());
        }
        self.pr().check(cmd.nexus, cdb)?;

        let ptpl = self.config.pr_file.is_some();
        match opcode {
            RESERVE_6 | RESERVE_10 => self.pr().reserve(cmd.nexus, cdb).map(|_| Vec::new()),
            RELEASE_6 | RELEASE_10 => self.pr().release(cmd.nexus, cdb).map(|_| Vec::new()),
            PERSISTENT_RESERVE_IN => self.pr().persistent_in(cdb, ptpl),
            PERSISTENT_RESERVE_OUT => self.persistent_out(cmd),
            MAINTENANCE_IN if sa == SA_REPORT_TARGET_PORT_GROUPS => {
                Ok(inquiry::report_target_port_groups(cdb, &self.config)?)
            }
            _ => Ok(self.run_unreserved(cmd, aborted)?),
        }
    }

    fn run_unreserved(&self, cmd: &Command, aborted: &dyn Fn() -> bool) -> Outcome {
        let cdb = cmd.cdb;
        match cdb[0] {
            INQUIRY => inquiry::inquiry(cdb, &self.config, &self.limits),
            REPORT_LUNS => report_luns(&[0], cdb),
            REQUEST_SENSE => self.request_sense(cdb, cmd.nexus),
            MAINTENANCE_IN => report_supported_opcodes(cdb, self.offer()),
            MODE_SENSE_6 | MODE_SENSE_10 => {
                let state = *self.mode.read().unwrap_or_else(|e| e.into_inner());
                let dev = mode::Device {
                    write_protected: self.config.read_only || state.swp,
                    capacity: self.capacity_blocks(),
                    block_size: self.block_size as u32,
                };
                mode::mode_sense(cdb, &state, &dev)
            }
            MODE_SELECT_6 | MODE_SELECT_10 => self.mode_select(cmd),
            START_STOP_UNIT => self.start_stop(cdb, cmd.nexus),
            PREVENT_ALLOW => self.prevent_allow(cdb, cmd.nexus),
            // Each copy target's medium is checked when a segment reaches it.
            EXTENDED_COPY => self.extended_copy(cmd),
            RECEIVE_COPY_RESULTS => self.receive_copy_results(cdb, cmd.nexus),
            _ => {
                self.medium_present()?;
                self.media_command(cmd, aborted)
            }
        }
    }

    fn persistent_out(&self, cmd: &Command) -> Result<Vec<u8>, Fail> {
        let ptpl = self.config.pr_file.is_some();
        let mut pr = self.pr();
        let notices = pr.persistent_out(cmd.nexus, cmd.cdb, cmd.data_out, ptpl)?;
        if let Some(path) = &self.config.pr_file {
            let result = if pr.aptpl() {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, pr.save()).and_then(|_| std::fs::rename(&tmp, path))
            } else {
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, path = %path.display(), "keeping reservations");
            }
        }
        self.notify(&pr, notices);
        Ok(Vec::new())
    }

    /// Queues reservation unit attentions for every nexus of the named initiator ports.
    fn notify(&self, pr: &Reservations, notices: Notices) {
        if notices.is_empty() {
            return;
        }
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for (port, s) in notices {
            for n in pr.nexuses_of(&port) {
                if let Some(q) = nexuses.get(&n) {
                    q.lock().unwrap_or_else(|e| e.into_inner()).push_back(s);
                }
            }
        }
    }

    /// Commands that touch the medium.
    fn media_command(&self, cmd: &Command, aborted: &dyn Fn() -> bool) -> Outcome {
        let cdb = cmd.cdb;
        match cdb[0] {
            TEST_UNIT_READY => Ok(Vec::new()),
            READ_CAPACITY_10 => self.read_capacity_10(cdb),
            SERVICE_ACTION_IN_16 => match (cdb[1] & 0x1f) as u16 {
                SA_READ_CAPACITY_16 => self.read_capacity_16(cdb),
                _ => self.get_lba_status(cdb),
            },
            READ_6 | READ_10 | READ_12 | READ_16 => self.read(cdb),
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => self.write(cdb, cmd.data_out),
            WRITE_VERIFY_10 | WRITE_VERIFY_12 | WRITE_VERIFY_16 => {
                self.write_verify(cdb, cmd.data_out)
            }
            VERIFY_10 | VERIFY_12 | VERIFY_16 => self.verify(cdb, cmd.data_out),
            ORWRITE_16 => self.orwrite(cdb, cmd.data_out),
            WRITE_ATOMIC_16 => self.write_atomic(cdb, cmd.data_out),
            COMPARE_AND_WRITE => self.compare_and_write(cdb, cmd.data_out),
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => self.synchronize_cache(cdb),
            PRE_FETCH_10 | PRE_FETCH_16 => {
                let r = block_range(cdb);
                self.check_range(r.lba, r.blocks)?;
                Ok(Vec::new())
            }
            WRITE_SAME_10 | WRITE_SAME_16 => self.write_same(cdb, cmd.data_out),
            UNMAP => self.unmap(cdb, cmd.data_out),
            SANITIZE => self.sanitize(cdb, cmd.data_out, aborted),
            READ_DEFECT_DATA_10 | READ_DEFECT_DATA_12 => read_defect_data(cdb),
            _ => Err(sense::INVALID_COMMAND_OPERATION_CODE),
        }
    }

    fn register(&self, nexus: Nexus) {
        if self
            .nexuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&nexus)
        {
            return;
        }
        self.nexuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(nexus)
            .or_insert_with(|| Mutex::new(VecDeque::from([sense::POWER_ON_RESET])));
    }

    fn take_unit_attention(&self, nexus: Nexus) -> Option<Sense> {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        let pending = nexuses.get(&nexus)?;
        let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
        q.pop_front()
    }

    fn medium_present(&self) -> Result<(), Sense> {
        if self.no_medium.load(Ordering::Acquire) {
            Err(sense::MEDIUM_NOT_PRESENT)
        } else {
            Ok(())
        }
    }

    fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.capacity_blocks() => Ok(()),
            _ => Err(sense::LBA_OUT_OF_RANGE),
        }
    }

    /// Where the transfer length lives in a block command's CDB, for field pointers.
    fn length_field(cdb: &[u8]) -> u16 {
        match cdb.len() {
            6 => 4,
            10 => 7,
            12 => 6,
            _ => 10,
        }
    }

    fn check_transfer(&self, cdb: &[u8], blocks: u64) -> Result<(), Sense> {
        if blocks > self.limits.max_transfer as u64 {
            Err(Sense::invalid_field_in_cdb(Self::length_field(cdb), None))
        } else {
            Ok(())
        }
    }

    fn check_writable(&self) -> Result<(), Sense> {
        if self.config.read_only || self.mode.read().unwrap_or_else(|e| e.into_inner()).swp {
            Err(sense::WRITE_PROTECTED)
        } else {
            Ok(())
        }
    }

    fn write_through(&self, fua: bool) -> Result<(), Sense> {
        let wce = self.mode.read().unwrap_or_else(|e| e.into_inner()).wce;
        if fua || !wce {
            self.store
                .flush()
                .map_err(|e| self.io_error(e, sense::WRITE_ERROR))?;
        }
        Ok(())
    }

    fn io_error(&self, e: io::Error, s: Sense) -> Sense {
        tracing::warn!(error = %e, "backstore I/O error");
        s
    }

    fn data<'d>(&self, data_out: &'d [u8], len: u64) -> Result<&'d [u8], Sense> {
        data_out
            .get(..len as usize)
            .ok_or(sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT)
    }

    /// Locks blocks `[lba, lba + blocks)` for a write, once no other command uses them.
    fn lock_range(&self, lba: u64, blocks: u64) -> RangeGuard {
        self.locks
            .lock(lba, lba.saturating_add(blocks.max(1)), true)
    }

    /// The same blocks, shared, for a read.
    fn lock_range_shared(&self, lba: u64, blocks: u64) -> RangeGuard {
        self.locks
            .lock(lba, lba.saturating_add(blocks.max(1)), false)
    }

    fn read_blocks(&self, lba: u64, blocks: u64) -> Outcome {
        let mut buf = Buf::take((blocks * self.block_size) as usize);
        self.store
            .read_at(&mut buf, lba * self.block_size)
            .map_err(|e| self.io_error(e, sense::UNRECOVERED_READ_ERROR.with_information(lba)))?;
        Ok(buf.into_vec())
    }

    fn write_blocks(&self, lba: u64, data: &[u8]) -> Result<(), Sense> {
        self.store
            .write_at(data, lba * self.block_size)
            .map_err(|e| self.io_error(e, sense::WRITE_ERROR.with_information(lba)))
    }

    fn read(&self, cdb: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        let _guards = self.lock_range_shared(r.lba, r.blocks);
        self.read_blocks(r.lba, r.blocks)
    }

    /// WRITE ATOMIC(16) (SBC-4 5.49): every write here is atomic under its stripe locks;
    /// atomic boundaries are not offered.
    fn write_atomic(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let flags = cdb[1];
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        let lba = be64(&cdb[2..10]);
        if be16(&cdb[10..12]) != 0 {
            return Err(Sense::invalid_field_in_cdb(10, None));
        }
        let blocks = be16(&cdb[12..14]) as u64;
        if blocks > self.limits.max_transfer as u64 {
            return Err(Sense::invalid_field_in_cdb(12, None));
        }
        self.check_range(lba, blocks)?;
        self.check_writable()?;
        let data = self.data(data_out, blocks * self.block_size)?;
        if blocks == 0 {
            return Ok(Vec::new());
        }
        {
            let _guards = self.lock_range(lba, blocks);
            self.write_blocks(lba, data)?;
        }
        self.write_through(flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    fn write(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        self.check_writable()?;
        let data = self.data(data_out, r.blocks * self.block_size)?;
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        {
            let _guards = self.lock_range(r.lba, r.blocks);
            self.write_blocks(r.lba, data)?;
        }
        self.write_through(r.flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    fn write_verify(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        if (r.flags >> 1) & 0x03 > 1 {
            return Err(Sense::invalid_field_in_cdb(1, Some(2)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        self.check_writable()?;
        let data = self.data(data_out, r.blocks * self.block_size)?;
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        {
            let _guards = self.lock_range(r.lba, r.blocks);
            self.write_blocks(r.lba, data)?;
        }
        // Verification means the data is on the medium, not in a cache.
        self.write_through(true)?;
        Ok(Vec::new())
    }

    fn verify(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        let bytchk = (r.flags >> 1) & 0x03;
        if bytchk == 2 {
            return Err(Sense::invalid_field_in_cdb(1, Some(2)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        let expected = match bytchk {
            0 => None,
            1 => Some(self.data(data_out, r.blocks * self.block_size)?),
            _ => Some(self.data(data_out, self.block_size)?),
        };
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        let media = self.read_blocks(r.lba, r.blocks)?;
        if let Some(expected) = expected {
            let bs = self.block_size as usize;
            let mismatch = media.iter().enumerate().position(|(i, b)| {
                *b != if bytchk == 1 {
                    expected[i]
                } else {
                    expected[i % bs]
                }
            });
            if let Some(offset) = mismatch {
                return Err(sense::MISCOMPARE_DURING_VERIFY.with_information(offset as u64));
            }
        }
        Ok(Vec::new())
    }

    fn orwrite(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        self.check_writable()?;
        let data = self.data(data_out, r.blocks * self.block_size)?;
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        {
            let _guards = self.lock_range(r.lba, r.blocks);
            let mut media = self.read_blocks(r.lba, r.blocks)?;
            media.iter_mut().zip(data).for_each(|(m, d)| *m |= d);
            self.write_blocks(r.lba, &media)?;
        }
        self.write_through(r.flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    fn compare_and_write(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let flags = cdb[1];
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        let lba = be64(&cdb[2..10]);
        let blocks = cdb[13] as u64;
        if blocks > self.limits.max_compare_and_write as u64 {
            return Err(Sense::invalid_field_in_cdb(13, None));
        }
        self.check_range(lba, blocks)?;
        self.check_writable()?;
        let len = blocks * self.block_size;
        // An initiator that sends another amount of data than the CDB implies has its
        // CDB wrong.
        if data_out.len() as u64 > 2 * len {
            return Err(Sense::invalid_field_in_cdb(13, None));
        }
        let data = self.data(data_out, 2 * len)?;
        if blocks == 0 {
            return Ok(Vec::new());
        }
        let (verify, write) = data.split_at(len as usize);
        {
            let _guards = self.lock_range(lba, blocks);
            let media = self.read_blocks(lba, blocks)?;
            if let Some(offset) = media.iter().zip(verify).position(|(m, v)| m != v) {
                return Err(sense::MISCOMPARE_DURING_VERIFY.with_information(offset as u64));
            }
            self.write_blocks(lba, write)?;
        }
        self.write_through(flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    fn synchronize_cache(&self, cdb: &[u8]) -> Outcome {
        let r = block_range(cdb);
        self.check_range(r.lba, r.blocks)?;
        self.store
            .flush()
            .map_err(|e| self.io_error(e, sense::WRITE_ERROR))?;
        Ok(Vec::new())
    }

    fn write_same(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        let sixteen = cdb[0] == WRITE_SAME_16;
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        if r.flags & 0x10 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)));
        }
        // PBDATA and LBDATA (obsolete) are not supported.
        if r.flags & 0x06 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(2)));
        }
        if !sixteen && r.flags & 0x01 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(0)));
        }
        let unmap = r.flags & 0x08 != 0;
        // UNMAP on a fully provisioned LU (LBPME and LBPWS clear): SBC-4 5.48.
        if unmap && !self.config.thin {
            return Err(Sense::invalid_field_in_cdb(1, Some(3)));
        }
        let ndob = sixteen && r.flags & 0x01 != 0;
        // WSNZ is clear: no blocks means up to the end of the medium.
        let mut r = r;
        if r.blocks == 0 {
            let capacity = self.capacity_blocks();
            if r.lba >= capacity {
                return Err(sense::LBA_OUT_OF_RANGE);
            }
            r.blocks = capacity - r.lba;
        }
        if r.blocks > self.limits.max_write_same {
            return Err(Sense::invalid_field_in_cdb(Self::length_field(cdb), None));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_writable()?;
        let zeros;
        let block = if ndob {
            zeros = vec![0u8; self.block_size as usize];
            &zeros[..]
        } else {
            if data_out.len() as u64 > self.block_size {
                return Err(Sense::invalid_field_in_cdb(Self::length_field(cdb), None));
            }
            self.data(data_out, self.block_size)?
        };
        let offset = r.lba * self.block_size;
        let len = r.blocks * self.block_size;
        let _guards = self.lock_range(r.lba, r.blocks);
        let deallocate = unmap && self.config.thin && self.store.supports_discard();
        if deallocate || block.iter().all(|&b| b == 0) {
            // With UNMAP the blocks are deallocated whatever the data says (SBC-4 5.48:
            // the device server may unmap instead of writing); LBPRZ makes them read zero.
            let result = if deallocate {
                self.store.discard(offset, len)
            } else {
                self.store.write_zeroes(offset, len)
            };
            result.map_err(|e| self.io_error(e, sense::WRITE_ERROR.with_information(r.lba)))?;
        } else {
            let per = (WRITE_SAME_CHUNK / self.block_size).max(1);
            let buf = block.repeat(per.min(r.blocks) as usize);
            let mut done = 0;
            while done < r.blocks {
                let n = per.min(r.blocks - done);
                self.write_blocks(r.lba + done, &buf[..(n * self.block_size) as usize])?;
                done += n;
            }
        }
        drop(_guards);
        self.write_through(false)?;
        Ok(Vec::new())
    }

    /// SANITIZE (SBC-4 5.30): BLOCK ERASE and CRYPTOGRAPHIC ERASE both deallocate (or
    /// zero) every block, OVERWRITE writes its pattern to every block; the operation runs
    /// on in the background (`sanitize`), the command waits for it unless IMMED is set.
    /// There is no failure mode to leave: a failed operation is reported to the command
    /// that waits for it and logged.
    fn sanitize(&self, cdb: &[u8], data_out: &[u8], aborted: &dyn Fn() -> bool) -> Outcome {
        let sa = cdb[1] & 0x1f;
        let immed = cdb[1] & 0x80 != 0;
        if cdb[1] & 0x40 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(6)));
        }
        if let Some(i) = cdb[2..7].iter().position(|&b| b != 0) {
            return Err(Sense::invalid_field_in_cdb(2 + i as u16, None));
        }
        if !matches!(
            sa,
            SA_SANITIZE_OVERWRITE
                | SA_SANITIZE_BLOCK_ERASE
                | SA_SANITIZE_CRYPTO_ERASE
                | SA_SANITIZE_EXIT_FAILURE_MODE
        ) {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)));
        }
        // BLOCK and CRYPTOGRAPHIC ERASE deallocate: only where the LU is thin (LBPME), as
        // REPORT SUPPORTED OPERATION CODES says; a fully provisioned LU offers OVERWRITE.
        if matches!(sa, SA_SANITIZE_BLOCK_ERASE | SA_SANITIZE_CRYPTO_ERASE) && !self.config.thin {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)));
        }
        let len = be16(&cdb[7..9]) as u64;
        if sa == SA_SANITIZE_OVERWRITE {
            // The parameter list holds four bytes and a pattern of at most one block.
            if len < 5 || len > self.block_size + 4 {
                return Err(Sense::invalid_field_in_cdb(7, None));
            }
        } else if len != 0 {
            return Err(Sense::invalid_field_in_cdb(7, None));
        }
        if sa == SA_SANITIZE_EXIT_FAILURE_MODE {
            return Ok(Vec::new());
        }
        self.check_writable()?;
        let method = if sa == SA_SANITIZE_OVERWRITE {
            sanitize::Method::Overwrite(self.overwrite_pattern(self.data(data_out, len)?)?)
        } else {
            sanitize::Method::Erase {
                discard: self.config.thin && self.store.supports_discard(),
            }
        };
        let medium = sanitize::Medium {
            store: self.store.clone(),
            locks: self.locks.clone(),
            block_size: self.block_size,
            capacity: self.capacity_blocks(),
            rate: self.config.sanitize_rate,
        };
        // Only one operation runs; a SANITIZE that comes meanwhile is turned away.
        let Some(id) = self.sanitizer.start(medium, method) else {
            return Err(self.sanitizer.in_progress());
        };
        if immed {
            return Ok(Vec::new());
        }
        match self.sanitizer.wait(id, aborted) {
            Some(result) => result.map(|()| Vec::new()),
            // Aborted: nobody reads this answer, and the operation goes on.
            None => Err(sense::SANITIZE_IN_PROGRESS),
        }
    }

    /// The block SANITIZE OVERWRITE leaves everywhere: the initialization pattern repeated,
    /// inverted when the last of an even number of passes with INVERT is. The passes
    /// themselves are not repeated: on a file or in memory the last one is all that stays.
    fn overwrite_pattern(&self, p: &[u8]) -> Result<Vec<u8>, Sense> {
        let invert = p[0] & 0x80 != 0;
        if p[0] & 0x60 != 0 {
            return Err(Sense::invalid_field_in_parameter_list(0, Some(6)));
        }
        let passes = p[0] & 0x1f;
        if passes == 0 {
            return Err(Sense::invalid_field_in_parameter_list(0, Some(4)));
        }
        let len = be16(&p[2..4]) as usize;
        if len == 0 || len > self.block_size as usize || len > p.len() - 4 {
            return Err(Sense::invalid_field_in_parameter_list(2, None));
        }
        let pattern = &p[4..4 + len];
        let flip = if invert && passes.is_multiple_of(2) {
            0xff
        } else {
            0x00
        };
        Ok(pattern
            .iter()
            .cycle()
            .take(self.block_size as usize)
            .map(|b| b ^ flip)
            .collect())
    }

    /// EXTENDED COPY (LID1, SPC-4 6.4): the segments run in order, each read from its
    /// source logical unit and written to its destination as READ and WRITE would be.
    fn extended_copy(&self, cmd: &Command) -> Outcome {
        let len = xcopy::parameter_list_length(cmd.cdb);
        let p = self.data(cmd.data_out, len as u64)?;
        let Some(list) = xcopy::parse(p)? else {
            return Ok(Vec::new());
        };
        let key = (cmd.nexus, list.list_id);
        let tracked = list.list_id_usage != xcopy::LIST_ID_NONE;
        let mut status = CopyStatus {
            state: CopyState::InProgress,
            segments_processed: 0,
            bytes: 0,
        };
        if tracked {
            let mut copies = self.copies();
            if copies
                .get(&key)
                .is_some_and(|s| s.state == CopyState::InProgress)
            {
                return Err(sense::OPERATION_IN_PROGRESS);
            }
            copies.insert(key, status);
        }
        let result = self.run_segments(cmd.nexus, &list, &mut status);
        status.state = if result.is_ok() {
            CopyState::Done
        } else {
            CopyState::Failed
        };
        if tracked {
            let mut copies = self.copies();
            if list.list_id_usage == xcopy::LIST_ID_HOLD {
                copies.insert(key, status);
            } else {
                copies.remove(&key);
            }
        }
        result.map(|()| Vec::new())
    }

    fn run_segments(
        &self,
        nexus: Nexus,
        list: &CopyList,
        status: &mut CopyStatus,
    ) -> Result<(), Sense> {
        for seg in &list.segments {
            let at = |s: Sense| s.at_parameter(seg.offset as u16);
            let src = self.copy_target(list, seg.source).map_err(at)?;
            let dst = self.copy_target(list, seg.destination).map_err(at)?;
            status.bytes += self.copy_segment(nexus, &src, &dst, seg).map_err(at)?;
            status.segments_processed += 1;
        }
        Ok(())
    }

    /// The logical unit a CSCD descriptor names.
    fn copy_target(&self, list: &CopyList, index: u16) -> Result<CopyTarget<'_>, Sense> {
        let cscd = list
            .cscds
            .get(index as usize)
            .ok_or(sense::COPY_TARGET_DEVICE_NOT_REACHABLE)?;
        if cscd.peripheral_type != 0 {
            return Err(sense::INCORRECT_COPY_TARGET_DEVICE_TYPE);
        }
        // Only designators of logical units (association 00b) name copy targets.
        if cscd.association != 0 {
            return Err(sense::UNREACHABLE_COPY_TARGET);
        }
        let lu = if self.has_designator(&cscd.designator) {
            CopyTarget::This(self)
        } else {
            self.copy_targets
                .get()
                .and_then(Weak::upgrade)
                .and_then(|t| t.find(&cscd.designator))
                .map(CopyTarget::Other)
                .ok_or(sense::UNREACHABLE_COPY_TARGET)?
        };
        // A block device CSCD states the block length it expects.
        if cscd.block_size as u64 != lu.block_size {
            return Err(sense::INCORRECT_COPY_TARGET_DEVICE_TYPE);
        }
        if lu.medium_present().is_err() || lu.sanitizer.running() {
            return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        }
        Ok(lu)
    }

    /// Copies one block to block segment; returns the bytes copied. Whatever a copy
    /// target refuses (range, write protection, reservations, I/O) aborts the copy.
    fn copy_segment(
        &self,
        nexus: Nexus,
        src: &LogicalUnit,
        dst: &LogicalUnit,
        seg: &Segment,
    ) -> Result<u64, Sense> {
        let unit = if seg.destination_count {
            dst.block_size
        } else {
            src.block_size
        };
        let bytes = seg.blocks as u64 * unit;
        if !bytes.is_multiple_of(src.block_size) || !bytes.is_multiple_of(dst.block_size) {
            return Err(sense::COPY_ABORTED);
        }
        let aborted = |_| sense::COPY_ABORTED;
        src.check_range(seg.source_lba, bytes / src.block_size)
            .map_err(aborted)?;
        dst.check_range(seg.destination_lba, bytes / dst.block_size)
            .map_err(aborted)?;
        dst.check_writable().map_err(aborted)?;
        // This logical unit checked the EXTENDED COPY itself against its reservations;
        // other ones are asked as for a READ or WRITE from the same nexus.
        for (lu, opcode) in [(src, READ_16), (dst, WRITE_16)] {
            if !std::ptr::eq(lu, self) {
                let mut cdb = [0u8; 16];
                cdb[0] = opcode;
                if lu.pr().check(nexus, &cdb).is_err() {
                    return Err(sense::COPY_ABORTED);
                }
            }
        }
        let step = lcm(src.block_size, dst.block_size);
        let chunk = (COPY_CHUNK / step).max(1) * step;
        let mut starts: Vec<u64> = (0..bytes).step_by(chunk as usize).collect();
        // Within one logical unit, a destination above an overlapping source is copied
        // from the end so that no source block is overwritten before it is read.
        if std::ptr::eq(src, dst) && seg.destination_lba > seg.source_lba {
            starts.reverse();
        }
        for start in starts {
            let n = chunk.min(bytes - start);
            let (s_lba, s_blocks) = (seg.source_lba + start / src.block_size, n / src.block_size);
            let (d_lba, d_blocks) = (
                seg.destination_lba + start / dst.block_size,
                n / dst.block_size,
            );
            let data = {
                let _guards = src.lock_range_shared(s_lba, s_blocks);
                src.read_blocks(s_lba, s_blocks).map_err(aborted)?
            };
            let _guards = dst.lock_range(d_lba, d_blocks);
            dst.write_blocks(d_lba, &data).map_err(aborted)?;
        }
        dst.write_through(false).map_err(aborted)?;
        Ok(bytes)
    }

    /// RECEIVE COPY RESULTS (LID1): COPY STATUS of a held list identifier (reported once
    /// the copy has ended, then forgotten) and OPERATING PARAMETERS.
    fn receive_copy_results(&self, cdb: &[u8], nexus: Nexus) -> Outcome {
        let sa = (cdb[1] & 0x1f) as u16;
        let alloc = be32(&cdb[10..14]) as usize;
        let data = if sa == SA_COPY_STATUS {
            let key = (nexus, cdb[2]);
            let mut copies = self.copies();
            let status = *copies
                .get(&key)
                .ok_or(Sense::invalid_field_in_cdb(2, None))?;
            if status.state != CopyState::InProgress {
                copies.remove(&key);
            }
            status.data()
        } else {
            xcopy::operating_parameters(self.block_size as u32)
        };
        Ok(truncate(data, alloc))
    }

    fn unmap(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        if cdb[1] & 0x01 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(0)));
        }
        let len = be16(&cdb[7..9]) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        if len < 8 {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let p = self.data(data_out, len as u64)?;
        let bddl = be16(&p[2..4]) as usize;
        let count = bddl.min(len - 8) / 16;
        if count > self.limits.max_unmap_descriptors as usize {
            return Err(Sense::invalid_field_in_parameter_list(2, None));
        }
        self.check_writable()?;
        let mut ranges = Vec::with_capacity(count);
        for i in 0..count {
            let d = &p[8 + 16 * i..8 + 16 * (i + 1)];
            let lba = be64(&d[0..8]);
            let blocks = be32(&d[8..12]) as u64;
            if blocks > self.limits.max_unmap_lba as u64 {
                return Err(Sense::invalid_field_in_parameter_list(
                    (8 + 16 * i + 8) as u16,
                    None,
                ));
            }
            self.check_range(lba, blocks)?;
            if blocks > 0 {
                ranges.push((lba, blocks));
            }
        }
        for (lba, blocks) in ranges {
            let _guards = self.lock_range(lba, blocks);
            self.store
                .discard(lba * self.block_size, blocks * self.block_size)
                .map_err(|e| self.io_error(e, sense::WRITE_ERROR.with_information(lba)))?;
        }
        Ok(Vec::new())
    }

    fn read_capacity_10(&self, cdb: &[u8]) -> Outcome {
        if cdb[8] & 0x01 == 0 && be32(&cdb[2..6]) != 0 {
            return Err(Sense::invalid_field_in_cdb(2, None));
        }
        let last = self.capacity_blocks().saturating_sub(1).min(0xffff_ffff) as u32;
        let mut d = last.to_be_bytes().to_vec();
        d.extend_from_slice(&(self.block_size as u32).to_be_bytes());
        Ok(d)
    }

    fn read_capacity_16(&self, cdb: &[u8]) -> Outcome {
        let alloc = be32(&cdb[10..14]) as usize;
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&self.capacity_blocks().saturating_sub(1).to_be_bytes());
        d[8..12].copy_from_slice(&(self.block_size as u32).to_be_bytes());
        d[13] = self.config.physical_block_exponent & 0x0f;
        if self.config.thin {
            d[14] = 0x80 | 0x40; // LBPME, LBPRZ
        }
        Ok(truncate(d, alloc))
    }

    fn get_lba_status(&self, cdb: &[u8]) -> Outcome {
        let lba = be64(&cdb[2..10]);
        let alloc = be32(&cdb[10..14]) as usize;
        let capacity = self.capacity_blocks();
        if lba >= capacity {
            return Err(sense::LBA_OUT_OF_RANGE);
        }
        // Enough descriptors to fill the allocation length (one at least), each as long as
        // its kind of blocks runs: the store is asked for ever larger windows, their
        // extents joined, until a descriptor is known to end before the allocation
        // length is full or the device ends. Doubling keeps a LUN of any size to a few
        // dozen asks, and a run longer than one descriptor holds continues in the next.
        let want = (alloc.saturating_sub(8) / 16).max(1);
        let bs = self.block_size;
        let mut runs: Vec<(u64, u64, bool)> = Vec::new(); // (lba, blocks, mapped)
        let mut scanned = lba;
        let mut window = (self.limits.max_transfer as u64 * 64).max(1);
        while scanned < capacity {
            let span = window.min(capacity - scanned);
            let extents = self
                .store
                .is_allocated(scanned * bs, span * bs)
                .map_err(|e| {
                    self.io_error(e, sense::UNRECOVERED_READ_ERROR.with_information(scanned))
                })?;
            let end = scanned + span;
            for (offset, len, allocated) in extents {
                let start = (offset / bs).max(scanned);
                let stop = (offset + len).div_ceil(bs).min(end);
                if stop <= start {
                    continue;
                }
                match runs.last_mut() {
                    Some(r) if r.2 == allocated && r.0 + r.1 >= start => r.1 = stop - r.0,
                    _ => runs.push((start, stop - start, allocated)),
                }
            }
            scanned = end;
            window = window.saturating_mul(2);
            // Every run but the last is complete.
            if runs.len() > want {
                break;
            }
        }
        let mut descriptors = Vec::new();
        'runs: for (mut start, mut blocks, allocated) in runs {
            while blocks > 0 {
                if descriptors.len() == want {
                    break 'runs;
                }
                let n = blocks.min(u32::MAX as u64);
                let mut d = start.to_be_bytes().to_vec();
                d.extend_from_slice(&(n as u32).to_be_bytes());
                d.push(if allocated { 0 } else { 1 });
                d.extend_from_slice(&[0; 3]);
                descriptors.push(d);
                start += n;
                blocks -= n;
            }
        }
        let mut data = ((4 + 16 * descriptors.len()) as u32).to_be_bytes().to_vec();
        data.extend_from_slice(&[0; 4]);
        descriptors.into_iter().for_each(|d| data.extend(d));
        Ok(truncate(data, alloc))
    }

    fn request_sense(&self, cdb: &[u8], nexus: Nexus) -> Outcome {
        let desc = cdb[1] & 0x01 != 0;
        let alloc = cdb[4] as usize;
        let s = self
            .take_unit_attention(nexus)
            .or_else(|| {
                self.sanitizer
                    .running()
                    .then(|| self.sanitizer.in_progress())
            })
            .or_else(|| self.medium_present().err())
            .unwrap_or(sense::NO_SENSE);
        let data = if desc { s.descriptor() } else { s.fixed() };
        Ok(truncate(data, alloc))
    }

    fn mode_select(&self, cmd: &Command) -> Outcome {
        let mut state = self.mode.write().unwrap_or_else(|e| e.into_inner());
        let new = mode::mode_select(cmd.cdb, cmd.data_out, &state, self.block_size as u32)?;
        if new != *state {
            *state = new;
            drop(state);
            let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
            for (n, pending) in nexuses.iter() {
                if *n != cmd.nexus {
                    pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(sense::MODE_PARAMETERS_CHANGED);
                }
            }
        }
        Ok(Vec::new())
    }

    fn start_stop(&self, cdb: &[u8], _nexus: Nexus) -> Outcome {
        let power_condition = cdb[4] >> 4;
        let no_flush = cdb[4] & 0x04 != 0;
        let loej = cdb[4] & 0x02 != 0;
        let start = cdb[4] & 0x01 != 0;
        // A power condition change leaves START and LOEJ unused (SBC-4 5.25); there are no
        // power conditions to enter here.
        if power_condition != 0 {
            return Ok(Vec::new());
        }
        if !start && !no_flush {
            self.store
                .flush()
                .map_err(|e| self.io_error(e, sense::WRITE_ERROR))?;
        }
        if loej && self.config.removable {
            if !self
                .prevent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
            {
                return Err(sense::MEDIUM_REMOVAL_PREVENTED);
            }
            self.no_medium.store(!start, Ordering::Release);
        }
        Ok(Vec::new())
    }

    fn prevent_allow(&self, cdb: &[u8], nexus: Nexus) -> Outcome {
        let prevent = cdb[4] & 0x03;
        if prevent > 1 {
            return Err(Sense::invalid_field_in_cdb(4, Some(1)));
        }
        if !self.config.removable {
            // Nothing can be removed; prevention is trivially honoured.
            return Ok(Vec::new());
        }
        let mut set = self.prevent.lock().unwrap_or_else(|e| e.into_inner());
        if prevent == 1 {
            set.insert(nexus);
        } else {
            set.remove(&nexus);
        }
        Ok(Vec::new())
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a.max(1), b.max(1));
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a.max(1) / x * b.max(1)
}

fn read_defect_data(cdb: &[u8]) -> Outcome {
    let (format_byte, alloc) = if cdb[0] == READ_DEFECT_DATA_10 {
        (cdb[2], be16(&cdb[7..9]) as usize)
    } else {
        (cdb[1], be32(&cdb[6..10]) as usize)
    };
    // Echo the requested lists and format, with no defects in them.
    let flags = format_byte & 0x1f;
    let data = if cdb[0] == READ_DEFECT_DATA_10 {
        vec![0, flags, 0, 0]
    } else {
        vec![0, flags, 0, 0, 0, 0, 0, 0]
    };
    Ok(truncate(data, alloc))
}

/// Single-level LUN structure (SAM-5 4.7): peripheral addressing below 256, flat above.
fn encode_lun(lun: u16) -> [u8; 8] {
    let mut l = [0u8; 8];
    if lun < 256 {
        l[1] = lun as u8;
    } else {
        l[0] = 0x40 | ((lun >> 8) as u8 & 0x3f);
        l[1] = lun as u8;
    }
    l
}

pub(crate) fn report_luns(luns: &[u16], cdb: &[u8]) -> Outcome {
    if cdb.len() < 12 {
        return Err(Sense::invalid_field_in_cdb(0, None));
    }
    let alloc = be32(&cdb[6..10]) as usize;
    let list: Vec<u16> = match cdb[2] {
        0x00 | 0x02 => luns.to_vec(),
        0x01 | 0x10 | 0x11 => Vec::new(),
        0x12 => luns.iter().copied().filter(|&l| l == 0).collect(),
        _ => return Err(Sense::invalid_field_in_cdb(2, None)),
    };
    let mut data = ((list.len() * 8) as u32).to_be_bytes().to_vec();
    data.extend_from_slice(&[0; 4]);
    for l in list {
        data.extend_from_slice(&encode_lun(l));
    }
    Ok(truncate(data, alloc))
}

pub(crate) fn lun_not_supported(cdb: &[u8]) -> Outcome {
    cdb::check_len(cdb)?;
    match cdb[0] {
        INQUIRY => inquiry::not_supported(cdb),
        REQUEST_SENSE => {
            let s = sense::LOGICAL_UNIT_NOT_SUPPORTED;
            let data = if cdb[1] & 0x01 != 0 {
                s.descriptor()
            } else {
                s.fixed()
            };
            Ok(truncate(data, cdb[4] as usize))
        }
        REPORT_LUNS => report_luns(&[], cdb),
        _ => Err(sense::LOGICAL_UNIT_NOT_SUPPORTED),
    }
}
