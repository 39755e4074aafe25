//! The session's queue depth: a slot per command in flight, grown and cut back while
//! commands hold theirs.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

use crate::{Error, Result};

/// The depth and its debt are atomics of their own beside the semaphore, as they were on
/// the session: the tuner changes the depth by compare-and-swap, and a finishing command
/// only reads the debt.
pub(super) struct Slots {
    free: Semaphore,
    /// Commands allowed in flight now: the slots' total, grown or cut back by auto-tuning.
    depth: AtomicUsize,
    /// Slots still to be taken away after a cut: commands in flight when the queue was cut
    /// keep theirs until they finish, and it is forgotten then ([`Slot`]).
    debt: AtomicUsize,
}

/// A command's place in the session's queue: given back when the command is done, or
/// forgotten if the queue was cut back meanwhile.
pub(super) struct Slot<'a> {
    slots: &'a Slots,
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            if self.slots.take_debt(1) == 1 {
                p.forget();
            }
        }
    }
}

impl Slots {
    pub(super) fn new(depth: usize) -> Slots {
        Slots {
            free: Semaphore::new(depth),
            depth: depth.into(),
            debt: 0.into(),
        }
    }

    pub(super) async fn acquire(&self) -> Result<Slot<'_>> {
        Ok(Slot {
            slots: self,
            permit: Some(self.free.acquire().await.map_err(|_| Error::Closed)?),
        })
    }

    pub(super) fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// More than three quarters of a queue of `depth` in use: a session short of work
    /// measures itself, not the path.
    pub(super) fn busy(&self, depth: usize) -> bool {
        self.free.available_permits() * 4 < depth
    }

    /// Grows the queue from `current` to `to` slots, unless it changed meanwhile.
    pub(super) fn grow(&self, current: usize, to: usize) -> bool {
        if self
            .depth
            .compare_exchange(current, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Slots owed from an earlier cut are simply not taken away.
        let more = to - current;
        let owed = self.take_debt(more);
        self.free.add_permits(more - owed);
        true
    }

    /// Cuts the queue from `current` to `to` slots, unless it changed meanwhile: free
    /// slots go now, those of commands in flight when they finish.
    pub(super) fn cut(&self, current: usize, to: usize) -> bool {
        if self
            .depth
            .compare_exchange(current, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let cut = current - to;
        let now = self.free.forget_permits(cut);
        self.debt.fetch_add(cut - now, Ordering::Relaxed);
        true
    }

    /// Takes up to `n` slots off the debt; returns how many. Every command's finish asks:
    /// with no debt (nearly always) it only reads.
    fn take_debt(&self, n: usize) -> usize {
        let mut took = 0;
        let _ = self
            .debt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                took = d.min(n);
                (took > 0).then(|| d - took)
            });
        took
    }
}
