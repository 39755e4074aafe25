//! Reads through librbd's asynchronous API, completed by librbd's callback: the store's
//! [`Backstore::read_async`](backstore::Backstore::read_async).
//!
//! The synchronous path parks a thread per command on a condition variable until librbd's
//! `io_context_pool` thread wakes it; at 4 KiB those wake-ups were most of the target's
//! time. Here the caller (the connection's task) submits with `rbd_aio_read2` and returns;
//! librbd calls [`read_done`] on its own thread when the OSD has answered, and that runs
//! the caller's `done`, which queues the answer for the connection's writer.
//!
//! Ownership across the FFI: everything a read needs until librbd is done with it (the
//! buffer librbd writes into, the caller's `done`, a reference to the [`Conn`] whose image
//! handle the read uses) is one heap [`Op`], turned into a raw pointer for the
//! completion's argument. From a successful `rbd_aio_read2` on, it belongs to librbd:
//! nothing else refers to it, so whatever happens meanwhile to the command (aborted) or
//! its connection (gone), the buffer stays valid until librbd has written it. librbd calls
//! the callback exactly once; it takes the `Op` back (`Box::from_raw`), releases the
//! completion, and hands the buffer to `done`, whose own references keep what it answers
//! to alive (an answer for a connection that is gone is dropped by the closed channel).
//! If the submission fails, librbd never calls back and the submitter takes the `Op` back
//! itself. The `Conn` reference keeps the image open while reads are in flight; the last
//! reference to a connection replaced meanwhile is not dropped on librbd's thread
//! (`rbd_close` waits for librbd's threads: it would wait for itself) but on a thread of
//! its own.

use std::io;
use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex};

use backstore::buffers::Buf;
use backstore::ReadDone;

use crate::{errno, ffi, Conn};

/// A read librbd owns while it runs (see the module's note).
struct Op {
    buf: Buf,
    offset: u64,
    done: ReadDone,
    conn: Arc<Conn>,
    /// The store's connection slot and its name, for a failure that means the connection
    /// is lost: the slot is emptied so that the next command connects again.
    slot: Arc<Mutex<Option<Arc<Conn>>>>,
    shown: Arc<str>,
}

/// Starts reading `buf.len()` bytes at `offset` of `conn`'s image; `done` runs once, on
/// librbd's thread, or on this one if the submission fails.
pub(crate) fn read(
    conn: Arc<Conn>,
    slot: Arc<Mutex<Option<Arc<Conn>>>>,
    shown: Arc<str>,
    buf: Buf,
    offset: u64,
    done: ReadDone,
) {
    let image = conn.image;
    let len = buf.len();
    let mut op = Box::new(Op {
        buf,
        offset,
        done,
        conn,
        slot,
        shown,
    });
    // The vector's heap block does not move when the box does.
    let data = op.buf.as_mut_ptr();
    let arg = Box::into_raw(op);
    let mut comp: ffi::rbd_completion_t = ptr::null_mut();
    // SAFETY: out-pointer; `arg` is ours until a read is queued with the completion.
    let r = unsafe { ffi::rbd_aio_create_completion(arg.cast(), read_done, &mut comp) };
    if r < 0 {
        // SAFETY: `arg` came from Box::into_raw above and librbd has not seen it.
        let op = unsafe { Box::from_raw(arg) };
        return finish(*op, Err(errno(r.into(), "creating a completion")));
    }
    // SAFETY: an open image (`conn`, in the Op, keeps it open until the callback); `data`
    // is valid for `len` bytes until the callback, which owns the Op, frees it. After a
    // successful call the Op is librbd's: it may already be gone, so `arg` is not used.
    let r = unsafe { ffi::rbd_aio_read2(image, offset, len, data.cast(), comp, 0) };
    if r < 0 {
        // SAFETY: not queued, so librbd will not call back: the completion and the Op are
        // still ours.
        unsafe { ffi::rbd_aio_release(comp) };
        let op = unsafe { Box::from_raw(arg) };
        finish(*op, Err(errno(r.into(), "submitting a read")));
    }
}

/// librbd's completion callback of [`read`].
extern "C" fn read_done(comp: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Op that `read` leaked for this completion; librbd calls back
    // once per completion, so it is taken back once.
    let op = unsafe { Box::from_raw(arg.cast::<Op>()) };
    // SAFETY: the completion is valid in its callback, released once, and not used after.
    let r = unsafe {
        let r = ffi::rbd_aio_get_return_value(comp);
        ffi::rbd_aio_release(comp);
        r
    };
    let len = op.buf.len();
    let result = if r < 0 {
        Err(errno(r as i64, format!("read of {len} at {}", op.offset)))
    } else if r as usize != len {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read of {len} at {}: only {r} bytes", op.offset),
        ))
    } else {
        Ok(())
    };
    finish(*op, result);
}

/// Hands the read's outcome to its `done`, then lets go of the connection.
fn finish(op: Op, result: io::Result<()>) {
    let Op {
        buf,
        done,
        conn,
        slot,
        shown,
        ..
    } = op;
    let result = result.map_err(|e| crate::failed(&slot, &conn, &shown, e));
    // No unwinding into librbd's C++ frames: a panic in `done` is logged and goes no
    // further (the command is then never answered, as a panicking worker's was not).
    if catch_unwind(AssertUnwindSafe(|| done(buf, result))).is_err() {
        tracing::error!("{shown}: a read's completion panicked");
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
