//! A SCSI task as both its connection and its session hold it: the command and its data
//! while they arrive (`Task`), the control task management shares (`TaskCtl`, and
//! `TaskRec` in the session's registry), and `unlend`, which frees a kept or queued
//! answer of the store's lent pages. Below the session, so that the connection hands its
//! tasks to the session for reassignment without either importing the other.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use backstore::buffers::Buf;
use bytes::Bytes;
use iscsi::ffp::DataSequence;
use iscsi::pdu::{Pdu, ScsiCommand};
use tokio::sync::Notify;

/// A SCSI command whose data is still arriving or whose turn has not come.
pub(crate) struct Task {
    pub(crate) cmd: ScsiCommand,
    pub(crate) lun: Option<u16>,
    pub(crate) ctl: Arc<TaskCtl>,
    /// The write's data as it arrives, at its buffer offsets. From the pool, so it holds
    /// stale bytes until the data sequences have covered all of it, which they must before
    /// the command runs.
    pub(crate) buf: Buf,
    pub(crate) received: u32,
    /// The data sequences still open: the unsolicited one (TTT 0xffffffff) and one per
    /// R2T out.
    pub(crate) unsolicited: Option<DataSequence>,
    pub(crate) r2ts: Vec<DataSequence>,
    pub(crate) next_solicit: u32,
    pub(crate) next_r2tsn: u32,
    pub(crate) delivered: bool,
    /// Data is taken off the wire but not kept (the command is refused anyway).
    pub(crate) sink: Option<scsi::Response>,
}

impl Task {
    pub(crate) fn mark_delivered(&mut self) {
        self.delivered = true;
    }

    pub(crate) fn data_complete(&self) -> bool {
        !self.cmd.write || self.received >= self.cmd.edtl
    }
}

/// Shared between a task's owner and whoever manages it.
///
/// Whether a task answers or is aborted is decided once, by a compare-and-swap, so a
/// task's status and a TMF's "function complete" for it can never both go out.
#[derive(Debug, Default)]
pub(crate) struct TaskCtl {
    outcome: AtomicU8,
    pub(crate) executing: AtomicBool,
    pub(crate) done: Notify,
    pub(crate) finished: AtomicBool,
}

const UNDECIDED: u8 = 0;
const ANSWERED: u8 = 1;
const ABORTED: u8 = 2;

impl TaskCtl {
    /// Claims the right to send the task's status; false if it was aborted first.
    pub(crate) fn claim_answer(&self) -> bool {
        self.outcome
            .compare_exchange(UNDECIDED, ANSWERED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Aborts the task; false if its status was already claimed (it completed).
    /// Sequentially consistent, with [`TaskCtl::start`] and [`TaskCtl::running`]: an abort
    /// from another thread and the task's start cannot both miss each other.
    pub(crate) fn abort(&self) -> bool {
        match self
            .outcome
            .compare_exchange(UNDECIDED, ABORTED, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => true,
            Err(prev) => prev == ABORTED,
        }
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.outcome.load(Ordering::SeqCst) == ABORTED
    }

    /// Marks the task running; false when it was aborted first, and then it must not
    /// run (it is marked finished for whoever waits). An abort that comes after this
    /// sees [`TaskCtl::running`] and waits for [`TaskCtl::finished`].
    pub(crate) fn start(&self) -> bool {
        self.executing.store(true, Ordering::SeqCst);
        if self.is_aborted() {
            self.finished.store(true, Ordering::Release);
            self.done.notify_waiters();
            return false;
        }
        true
    }

    /// Whether the task has started running (see [`TaskCtl::start`]).
    pub(crate) fn running(&self) -> bool {
        self.executing.load(Ordering::SeqCst)
    }

    /// Blocks the calling thread until the task has finished (its answer sent or
    /// suppressed). For threads outside the runtime (a blocking worker, the cluster's
    /// notification thread): the runtime's own tasks await `done` instead.
    pub(crate) fn wait_finished(&self) {
        let done = self.done.notified();
        let mut done = std::pin::pin!(done);
        done.as_mut().enable();
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        block_on(done);
    }
}

/// Runs a future to completion on this thread, parking it between polls: the few waits
/// of blocking threads on the runtime's `Notify`s, which need no reactor.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[derive(Debug)]
pub(crate) struct TaskRec {
    pub(crate) cid: u16,
    pub(crate) lun: u16,
    pub(crate) ctl: Arc<TaskCtl>,
}

/// Gives a Data-In payload its own copy, letting go of bytes the store lent (and so of
/// the blocks they hold). The copy goes through the kernel, which reports a page of a
/// shrunken file as an error where reading it here would take SIGBUS.
pub(crate) fn unlend(p: &mut Pdu) -> std::io::Result<()> {
    if let Pdu::DataIn(d) = p {
        if !d.data.is_empty() {
            d.data = Bytes::from(backstore::copy_checked(&d.data)?);
        }
    }
    Ok(())
}
