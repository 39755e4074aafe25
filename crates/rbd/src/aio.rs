//! Reads, writes and flushes through librbd's asynchronous API, completed by librbd's
//! callback: the store's [`Backstore::read_async`](backstore::Backstore::read_async),
//! [`write_async`](backstore::Backstore::write_async) and
//! [`flush_async`](backstore::Backstore::flush_async).
//!
//! The synchronous path parks a thread per command on a condition variable until librbd's
//! `io_context_pool` thread wakes it; at 4 KiB those wake-ups were most of the target's
//! time. Here the caller (the connection's task) submits with `rbd_aio_read2`,
//! `rbd_aio_write2` or `rbd_aio_flush` and returns; librbd calls [`op_done`] on its own
//! thread when the OSD has answered, and that runs the caller's `done`, which queues the
//! answer for the connection's writer. A write that must be durable before its answer (FUA,
//! or the write cache off) is followed, from its callback, by an `rbd_aio_flush` on the
//! same image (librbd's flush completes once every write queued before it is durable: with
//! its cache on, write-back after the first flush, a write's completion alone does not say
//! so); the answer waits for the flush's callback.
//!
//! Ownership across the FFI: everything an operation needs until librbd is done with it
//! (the buffer librbd reads into or writes from, the caller's `done`, a reference to the
//! [`Conn`] whose image handle it uses) is one heap [`Op`], turned into a raw pointer for
//! the completion's argument. From a successful submission on, it belongs to librbd:
//! nothing else refers to it, so whatever happens meanwhile to the command (aborted) or
//! its connection (gone), the buffer stays valid until librbd has used it. librbd calls
//! the callback exactly once per completion; it takes the `Op` back (`Box::from_raw`),
//! releases the completion, and either hands the `Op` to librbd again with a new
//! completion (the flush after a durable write: the same rules from its submission on) or
//! hands the buffer and the outcome to `done`, whose own references keep what it answers
//! to alive (an answer for a connection that is gone is dropped by the closed channel).
//! If a submission fails, librbd never calls back and the submitter takes the `Op` back
//! itself. The `Conn` reference keeps the image open while operations are in flight; the
//! last reference to a connection replaced meanwhile is not dropped on librbd's thread
//! (`rbd_close` waits for librbd's threads: it would wait for itself) but on a thread of
//! its own.

use std::io;
use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex};

use backstore::buffers::Buf;
use backstore::{FlushDone, Lent, LentDone, ReadDone, WriteDone};

use crate::{errno, ffi, Conn};

/// What an [`Op`] does, with the caller's `done`.
enum Kind {
    Read {
        buf: Buf,
        offset: u64,
        done: ReadDone,
    },
    /// A read into a bufferlist of librbd's (the C++ shim), lent to `done` as it is.
    ReadLent {
        bl: BufferList,
        len: usize,
        offset: u64,
        done: LentDone,
    },
    Write {
        buf: Buf,
        offset: u64,
        /// Flush once written, before `done`.
        durable: bool,
        done: WriteDone,
    },
    /// A flush asked for by itself (SYNCHRONIZE CACHE).
    Flush { done: FlushDone },
    /// The flush after a durable write: `buf` goes back to the write's `done`.
    WriteFlush { buf: Buf, done: WriteDone },
}

/// Which of librbd's calls queues an [`Op`].
#[derive(Clone, Copy)]
enum Call {
    Read,
    ReadLent,
    Write,
    Flush,
}

/// An operation librbd owns while it runs (see the module's note).
struct Op {
    kind: Kind,
    conn: Arc<Conn>,
    /// The store's connection slot and its name, for a failure that means the connection
    /// is lost: the slot is emptied so that the next command connects again.
    slot: Arc<Mutex<Option<Arc<Conn>>>>,
    shown: Arc<str>,
}

/// What every operation needs besides its kind: the connection, its slot, the store's name.
pub(crate) struct On {
    pub conn: Arc<Conn>,
    pub slot: Arc<Mutex<Option<Arc<Conn>>>>,
    pub shown: Arc<str>,
}

/// Starts reading `buf.len()` bytes at `offset` of the image; `done` runs once, on
/// librbd's thread, or on this one if the submission fails.
pub(crate) fn read(on: On, buf: Buf, offset: u64, done: ReadDone) {
    submit(on.op(Kind::Read { buf, offset, done }));
}

/// Starts reading `len` bytes at `offset` of the image into a bufferlist of librbd's, whose
/// buffers (the messenger's, no copy) `done` gets lent; `done` as [`read`]'s.
pub(crate) fn read_lent(on: On, len: usize, offset: u64, done: LentDone) {
    let Some(bl) = BufferList::new() else {
        return done(Err(io::Error::from(io::ErrorKind::OutOfMemory)));
    };
    submit(on.op(Kind::ReadLent {
        bl,
        len,
        offset,
        done,
    }));
}

/// Starts writing `buf` at `offset`, flushed afterwards if `durable`; `done` as [`read`]'s.
pub(crate) fn write(on: On, buf: Buf, offset: u64, durable: bool, done: WriteDone) {
    submit(on.op(Kind::Write {
        buf,
        offset,
        durable,
        done,
    }));
}

/// Starts a flush of every write queued so far; `done` as [`read`]'s.
pub(crate) fn flush(on: On, done: FlushDone) {
    submit(on.op(Kind::Flush { done }));
}

impl On {
    fn op(self, kind: Kind) -> Box<Op> {
        Box::new(Op {
            kind,
            conn: self.conn,
            slot: self.slot,
            shown: self.shown,
        })
    }
}

/// Hands `op` to librbd with a completion whose callback is [`op_done`]; if librbd does not
/// take it, finishes it here with the error.
fn submit(mut op: Box<Op>) {
    let image = op.conn.image;
    // The buffer's heap block does not move when the box does.
    let (call, data, len, offset) = match &mut op.kind {
        Kind::Read { buf, offset, .. } => (Call::Read, buf.as_mut_ptr(), buf.len(), *offset),
        Kind::ReadLent {
            bl, len, offset, ..
        } => (Call::ReadLent, bl.0.cast(), *len, *offset),
        Kind::Write { buf, offset, .. } => (Call::Write, buf.as_mut_ptr(), buf.len(), *offset),
        Kind::Flush { .. } | Kind::WriteFlush { .. } => (Call::Flush, ptr::null_mut(), 0, 0),
    };
    let arg = Box::into_raw(op);
    let mut comp: ffi::rbd_completion_t = ptr::null_mut();
    // SAFETY: out-pointer; `arg` is ours until an operation is queued with the completion.
    let r = unsafe { ffi::rbd_aio_create_completion(arg.cast(), op_done, &mut comp) };
    if r < 0 {
        // SAFETY: `arg` came from Box::into_raw above and librbd has not seen it.
        let op = unsafe { Box::from_raw(arg) };
        return finish(*op, Err(errno(r.into(), "creating a completion")));
    }
    // SAFETY: an open image (`conn`, in the Op, keeps it open until the callback); `data`
    // is valid for `len` bytes until the callback, which owns the Op and frees it or
    // submits it again. After a successful call the Op is librbd's: it may already be
    // gone, so `arg` is not used.
    let r = unsafe {
        match call {
            Call::Read => ffi::rbd_aio_read2(image, offset, len, data.cast(), comp, 0),
            // `data` is the bufferlist, librbd's from here until the callback.
            Call::ReadLent => ffi::rsv_rbd_aio_read_bl(image, offset, len, data.cast(), comp, 0),
            Call::Write => {
                ffi::rbd_aio_write2(image, offset, len, data.cast_const().cast(), comp, 0)
            }
            Call::Flush => ffi::rbd_aio_flush(image, comp),
        }
    };
    if r < 0 {
        // SAFETY: not queued, so librbd will not call back: the completion and the Op are
        // still ours.
        unsafe { ffi::rbd_aio_release(comp) };
        let op = unsafe { Box::from_raw(arg) };
        let what = op.what();
        finish(*op, Err(errno(r.into(), format!("submitting a {what}"))));
    }
}

impl Op {
    /// The operation, for messages.
    fn what(&self) -> String {
        match &self.kind {
            Kind::Read { buf, offset, .. } => format!("read of {} at {offset}", buf.len()),
            Kind::ReadLent { len, offset, .. } => format!("read of {len} at {offset}"),
            Kind::Write { buf, offset, .. } => format!("write of {} at {offset}", buf.len()),
            Kind::Flush { .. } => "flush".into(),
            Kind::WriteFlush { buf, .. } => format!("flush after a write of {}", buf.len()),
        }
    }
}

/// librbd's completion callback of every operation [`submit`] queued.
extern "C" fn op_done(comp: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Op that `submit` leaked for this completion; librbd calls back
    // once per completion, so it is taken back once.
    let op = unsafe { Box::from_raw(arg.cast::<Op>()) };
    // SAFETY: the completion is valid in its callback, released once, and not used after.
    let r = unsafe {
        let r = ffi::rbd_aio_get_return_value(comp);
        ffi::rbd_aio_release(comp);
        r
    };
    if r < 0 {
        let what = op.what();
        return finish(*op, Err(errno(r as i64, what)));
    }
    let Op {
        kind,
        conn,
        slot,
        shown,
    } = *op;
    let kind = match kind {
        // rbd_aio_get_return_value is the byte count for reads, 0 for the others.
        Kind::Read { buf, offset, done } if r as usize != buf.len() => {
            let e = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of {} at {offset}: only {r} bytes", buf.len()),
            );
            let op = Op {
                kind: Kind::Read { buf, offset, done },
                conn,
                slot,
                shown,
            };
            return finish(op, Err(e));
        }
        Kind::ReadLent {
            bl,
            len,
            offset,
            done,
        } if r as usize != len => {
            let e = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of {len} at {offset}: only {r} bytes"),
            );
            let op = Op {
                kind: Kind::ReadLent {
                    bl,
                    len,
                    offset,
                    done,
                },
                conn,
                slot,
                shown,
            };
            return finish(op, Err(e));
        }
        Kind::Write {
            buf,
            durable: true,
            done,
            ..
        } => {
            // Queued from librbd's thread: rbd_aio_flush only queues (librbd's own
            // dispatch, `rbd_non_blocking_aio`), it does not wait here.
            return submit(Box::new(Op {
                kind: Kind::WriteFlush { buf, done },
                conn,
                slot,
                shown,
            }));
        }
        k => k,
    };
    finish(
        Op {
            kind,
            conn,
            slot,
            shown,
        },
        Ok(()),
    );
}

/// Hands the operation's outcome to its `done`, then lets go of the connection.
fn finish(op: Op, result: io::Result<()>) {
    let Op {
        kind,
        conn,
        slot,
        shown,
    } = op;
    let result = result.map_err(|e| crate::failed(&slot, &conn, &shown, e));
    // No unwinding into librbd's C++ frames: a panic in `done` is logged and goes no
    // further (the command is then never answered, as a panicking worker's was not).
    let ran = catch_unwind(AssertUnwindSafe(move || match kind {
        Kind::Read { buf, done, .. } => done(buf, result),
        Kind::ReadLent { bl, len, done, .. } => done(result.and_then(|()| bl.lend(len))),
        Kind::Write { buf, done, .. } | Kind::WriteFlush { buf, done } => done(buf, result),
        Kind::Flush { done } => done(result),
    }));
    if ran.is_err() {
        tracing::error!("{shown}: an operation's completion panicked");
    }
    drop(slot);
    if let Some(last) = Arc::into_inner(conn) {
        close_elsewhere(last);
    }
}

/// Drops a connection (`rbd_close`, `rados_shutdown`) off librbd's threads.
fn close_elsewhere(conn: Conn) {
    // Not dropped with the closure if the thread cannot be made.
    let conn = std::mem::ManuallyDrop::new(conn);
    let spawned = std::thread::Builder::new()
        .name("rbd-close".into())
        .spawn(move || drop(std::mem::ManuallyDrop::into_inner(conn)));
    if let Err(e) = spawned {
        // The connection is leaked rather than closed where it would wait for itself.
        tracing::warn!("no thread to close an RBD connection on ({e}); it stays open");
    }
}

/// A `ceph::bufferlist` the shim made, freed when dropped (on whichever thread drops the
/// last of it: the buffers' counts are atomic).
pub(crate) struct BufferList(*mut c_void);

// SAFETY: the list is used by one thread at a time: the submitter until librbd has it,
// librbd until the callback, then whoever holds the `BufferList` (read-only once lent).
unsafe impl Send for BufferList {}
unsafe impl Sync for BufferList {}

impl std::fmt::Debug for BufferList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferList({:p})", self.0)
    }
}

/// Segments of a bufferlist read at once; a list with more is copied.
const SEGMENTS_MAX: usize = 16;

impl BufferList {
    fn new() -> Option<BufferList> {
        // SAFETY: no arguments; null when out of memory.
        let bl = unsafe { ffi::rsv_bl_new() };
        (!bl.is_null()).then_some(BufferList(bl))
    }

    /// The list's `len` bytes, lent: its one segment as it is, or several copied into one
    /// buffer (a read over two objects, say).
    fn lend(self, len: usize) -> io::Result<Lent> {
        let mut ptrs = [ptr::null::<std::os::raw::c_char>(); SEGMENTS_MAX];
        let mut lens = [0usize; SEGMENTS_MAX];
        // SAFETY: the list is ours (librbd is done with it); room for SEGMENTS_MAX of each.
        let (total, n) = unsafe {
            (
                ffi::rsv_bl_length(self.0),
                ffi::rsv_bl_segments(self.0, ptrs.as_mut_ptr(), lens.as_mut_ptr(), SEGMENTS_MAX),
            )
        };
        if total != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of {len}: {total} bytes in librbd's buffers"),
            ));
        }
        if n == 1 {
            return Ok(Lent::owned(Segment {
                ptr: ptrs[0].cast(),
                len,
                _bl: self,
            }));
        }
        let mut buf = Buf::take(len);
        let mut at = 0;
        if n <= SEGMENTS_MAX {
            for (&p, &l) in ptrs.iter().zip(&lens).take(n) {
                // SAFETY: a segment of the list, `l` bytes at `p`, alive with `self`.
                let seg = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), l) };
                buf[at..at + l].copy_from_slice(seg);
                at += l;
            }
        } else {
            let mut ptrs = vec![ptr::null::<std::os::raw::c_char>(); n];
            let mut lens = vec![0usize; n];
            // SAFETY: as above, with room for all `n`.
            unsafe { ffi::rsv_bl_segments(self.0, ptrs.as_mut_ptr(), lens.as_mut_ptr(), n) };
            for (&p, &l) in ptrs.iter().zip(&lens) {
                // SAFETY: as above.
                let seg = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), l) };
                buf[at..at + l].copy_from_slice(seg);
                at += l;
            }
        }
        Ok(Lent::owned(buf))
    }
}

impl Drop for BufferList {
    fn drop(&mut self) {
        // SAFETY: made by rsv_bl_new, freed once, librbd done with it (see `BufferList`).
        unsafe { ffi::rsv_bl_free(self.0) }
    }
}

/// The one segment of a bufferlist: `len` bytes at `ptr`, which the list keeps.
#[derive(Debug)]
struct Segment {
    ptr: *const u8,
    len: usize,
    _bl: BufferList,
}

// SAFETY: read-only bytes kept alive by the list it owns (see `BufferList`).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl AsRef<[u8]> for Segment {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the segment's bytes, alive and unchanged while the list is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
