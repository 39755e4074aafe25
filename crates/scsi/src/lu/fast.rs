//! The fast paths beside `execute`: plain READs and WRITEs answered without it (lent,
//! at once, or through the store's asynchronous calls), and SYNCHRONIZE CACHE likewise.

use std::sync::Arc;

use backstore::buffers::Buf;
use backstore::{Backstore, Lent};

use crate::cdb::{self, block_range, BlockRange};
use crate::opcodes::*;
use crate::pr::Access;
use crate::range_lock::RangeGuard;
use crate::sense::{self};
use crate::{Command, Nexus, Response};

use super::{class_of, Class, LogicalUnit};

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
                    Err(e) => read_failed(lba, &e),
                })
            }),
        );
    }
}

impl AsyncRead {
    /// Whether the store lends its own memory for this read
    /// ([`Backstore::reads_lent_async`]): then [`AsyncRead::start_lent`] saves a copy.
    pub fn lends(&self) -> bool {
        self.store.reads_lent_async(self.len)
    }

    /// [`AsyncRead::start`], with the data in the store's own memory, lent (its blocks are
    /// let go before `done` runs: the lent bytes are the reader's, not the store's
    /// blocks'): `Ok` with the data for GOOD, `Err` with the CHECK CONDITION otherwise.
    pub fn start_lent(self, done: impl FnOnce(Result<Lent, Response>) + Send + 'static) {
        let AsyncRead {
            store,
            guard,
            lba,
            offset,
            len,
        } = self;
        store.read_lent_async(
            offset,
            len,
            Box::new(move |result| {
                drop(guard);
                done(result.map_err(|e| read_failed(lba, &e)))
            }),
        );
    }
}

/// The answer to a read the store failed, as [`LogicalUnit::execute`] gives it.
fn read_failed(lba: u64, e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "backstore I/O error");
    Response::check_condition(&sense::UNRECOVERED_READ_ERROR.with_information(lba))
}

/// A plain WRITE ready to start on a store that completes writes on a thread of its own
/// (see [`LogicalUnit::try_write_async`]); it holds its blocks against other commands.
#[derive(Debug)]
pub struct AsyncWrite {
    store: Arc<dyn Backstore>,
    guard: RangeGuard,
    /// The fence's admission, held until the store has written.
    pass: crate::FencePass,
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
            pass,
            lba,
            offset,
            len,
            durable,
        } = self;
        if data.len() != len {
            drop((guard, pass));
            return done(Response::check_condition(
                &sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
            ));
        }
        store.write_async(
            data,
            offset,
            durable,
            Box::new(move |_buf, result| {
                drop((guard, pass));
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

impl LogicalUnit {
    /// The blocks of a plain READ that [`LogicalUnit::execute`] would answer with GOOD and
    /// the data, changing nothing else; `None` for any other command or outcome (a pending
    /// unit attention, a reservation conflict, a bad field, more than `max_bytes` as the
    /// CDB asks, whatever the transport expects).
    pub(super) fn plain_read(&self, cmd: &Command, max_bytes: u64) -> Option<BlockRange> {
        if class_of(cmd.cdb) != Class::Read {
            return None;
        }
        self.plain_block(cmd, max_bytes, Access::Read)
    }

    /// The blocks of a plain WRITE that [`LogicalUnit::execute`] would write (and answer
    /// with GOOD unless the store fails), changing nothing else; `None` as for
    /// [`LogicalUnit::plain_read`], and for a LU that refuses writes or data of another
    /// length than the CDB's.
    /// The fence's pass comes with it, to hold until the write is made.
    pub(super) fn plain_write(
        &self,
        cmd: &Command,
        max_bytes: u64,
    ) -> Option<(BlockRange, crate::FencePass)> {
        if !matches!(
            cmd.cdb.first(),
            Some(&(WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16))
        ) || self.check_writable().is_err()
        {
            return None;
        }
        let pass = self.check_fence(cmd.nexus).ok()?;
        let r = self.plain_block(cmd, max_bytes, Access::Write)?;
        (cmd.data_out.len() as u64 == r.blocks * self.block_size).then_some((r, pass))
    }

    /// What [`LogicalUnit::plain_read`] and [`LogicalUnit::plain_write`] share: the checks
    /// of `run` and of the command's own function, for a READ or WRITE of any size.
    /// Whether the nexus is known and has no unit attention waiting: otherwise its next
    /// command is `execute()`'s, which reports it.
    pub(super) fn nothing_pending(&self, nexus: Nexus) -> bool {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        nexuses
            .get(&nexus)
            .is_some_and(|pending| pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty())
    }

    pub(super) fn plain_block(
        &self,
        cmd: &Command,
        max_bytes: u64,
        access: Access,
    ) -> Option<BlockRange> {
        let cdb = cmd.cdb;
        if cdb::check_len(cdb).is_err()
            || self.sanitizer.running()
            || self.medium_present().is_err()
            || !self.access_state().is_active()
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
            && self.check_reservations(cmd.nexus, access).is_ok();
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
        let (r, pass) = self.plain_write(cmd, max_bytes)?;
        let guard = self.locks.try_lock(r.lba, r.lba + r.blocks, true)?;
        let wce = self.mode.read().unwrap_or_else(|e| e.into_inner()).wce;
        Some(AsyncWrite {
            store: self.store.clone(),
            guard,
            pass,
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
            || class_of(cdb) != Class::Flush
            || cdb::check_len(cdb).is_err()
            || self.sanitizer.running()
            || self.medium_present().is_err()
            || !self.access_state().is_active()
            || self.refresh_capacity()
        {
            return None;
        }
        if !self.nothing_pending(cmd.nexus) {
            return None;
        }
        let r = block_range(cdb);
        if self.check_range(r.lba, r.blocks).is_err()
            || self.check_reservations(cmd.nexus, Access::Write).is_err()
        {
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
        // The lock first: what the store lends may depend on the blocks' state (a file on
        // tmpfs looks for holes), which an UNMAP between its look and the lock would change.
        let (start, end) = (r.lba, r.lba + r.blocks);
        let guard = if wait {
            self.locks.lock(start, end, false)
        } else {
            self.locks.try_lock(start, end, false)?
        };
        let data = self
            .store
            .lend(r.lba * self.block_size, r.blocks * self.block_size, wait)
            .ok()??;
        Some(LentRead {
            data,
            _guard: guard,
        })
    }
}
