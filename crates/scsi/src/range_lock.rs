//! Locks on ranges of blocks: a write holds its blocks alone, reads share theirs, and only
//! commands whose blocks overlap ever wait for each other.
//!
//! A read that lends the store's bytes (see [`backstore::Lent`]) holds its lock until the
//! transport has sent them, which over a long path can be a while: the lock therefore
//! covers exactly the blocks asked for, not a stripe shared with unrelated ones. A waiting
//! write holds off new reads of its blocks, so a stream of reads cannot starve it. Every
//! command takes one range at a time, so no two can wait for each other.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(crate) struct RangeLocks {
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    held: Vec<Entry>,
    next_id: u64,
    /// Threads blocked in [`RangeLocks::lock`]: a release wakes them only if there are any.
    sleepers: usize,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    start: u64,
    end: u64,
    write: bool,
    /// False for a write still waiting for the readers and writers before it.
    granted: bool,
}

impl Entry {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

/// A held range; dropping it lets the commands that wait for it go.
#[derive(Debug)]
pub struct RangeGuard {
    locks: Arc<RangeLocks>,
    id: u64,
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        let mut st = self.locks.lock_state();
        if let Some(i) = st.held.iter().position(|e| e.id == self.id) {
            st.held.swap_remove(i);
        }
        if st.sleepers > 0 {
            self.locks.freed.notify_all();
        }
    }
}

impl RangeLocks {
    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks blocks `[start, end)`, waiting for the commands in the way.
    pub(crate) fn lock(self: &Arc<Self>, start: u64, end: u64, write: bool) -> RangeGuard {
        let mut st = self.lock_state();
        // A write is seen (and holds off new reads) from the moment it asks.
        let id = st.add(start, end, write, false);
        while blocked(&st, id, start, end, write) {
            st.sleepers += 1;
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
            st.sleepers -= 1;
        }
        grant(&mut st, id);
        RangeGuard {
            locks: self.clone(),
            id,
        }
    }

    /// Locks blocks `[start, end)` if nothing is in the way, else `None` and nothing changed.
    pub(crate) fn try_lock(
        self: &Arc<Self>,
        start: u64,
        end: u64,
        write: bool,
    ) -> Option<RangeGuard> {
        let mut st = self.lock_state();
        if blocked(&st, st.next_id, start, end, write) {
            return None;
        }
        let id = st.add(start, end, write, true);
        Some(RangeGuard {
            locks: self.clone(),
            id,
        })
    }
}

impl State {
    fn add(&mut self, start: u64, end: u64, write: bool, granted: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.held.push(Entry {
            id,
            start,
            end,
            write,
            granted,
        });
        id
    }
}

/// Whether the lock `id` on `[start, end)` must wait: a write for any granted lock on its
/// blocks, a read for any write on them, granted or waiting.
fn blocked(st: &State, id: u64, start: u64, end: u64, write: bool) -> bool {
    st.held
        .iter()
        .any(|e| e.id != id && e.overlaps(start, end) && if write { e.granted } else { e.write })
}

fn grant(st: &mut State, id: u64) {
    if let Some(e) = st.held.iter_mut().find(|e| e.id == id) {
        e.granted = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Runs `lock` on a thread; the receiver hears once it holds the range.
    fn in_thread(
        locks: &Arc<RangeLocks>,
        start: u64,
        end: u64,
        write: bool,
    ) -> mpsc::Receiver<RangeGuard> {
        let (tx, rx) = mpsc::channel();
        let locks = locks.clone();
        std::thread::spawn(move || {
            let _ = tx.send(locks.lock(start, end, write));
        });
        rx
    }

    /// Long enough for a thread that could take the lock to have done so.
    const SETTLE: Duration = Duration::from_millis(200);

    #[test]
    fn reads_share_and_writes_exclude_only_overlapping_blocks() {
        let locks = Arc::new(RangeLocks::default());
        let r1 = locks.lock(0, 10, false);
        let r2 = locks.try_lock(5, 15, false).expect("reads share");
        assert!(
            locks.try_lock(9, 12, true).is_none(),
            "a write waits for overlapping reads"
        );
        let w = locks
            .try_lock(15, 20, true)
            .expect("adjacent blocks do not overlap");
        assert!(
            locks.try_lock(19, 21, false).is_none(),
            "a read waits for an overlapping write"
        );
        assert!(locks.try_lock(0, 100, true).is_none());
        drop((r1, r2, w));
        assert!(locks.try_lock(0, 100, true).is_some());
        assert!(locks.state.lock().unwrap().held.is_empty());
    }

    #[test]
    fn a_waiting_write_gets_its_blocks_once_the_reads_go_and_holds_off_new_reads() {
        let locks = Arc::new(RangeLocks::default());
        let read = locks.lock(0, 8, false);
        let write = in_thread(&locks, 4, 12, true);
        assert!(
            write.recv_timeout(SETTLE).is_err(),
            "the write waited for the read"
        );
        // The waiting write keeps new reads of its blocks away, not of others.
        assert!(locks.try_lock(10, 11, false).is_none());
        assert!(locks.try_lock(12, 13, false).is_some());
        let later_read = in_thread(&locks, 0, 5, false);
        assert!(
            later_read.recv_timeout(SETTLE).is_err(),
            "a read behind the waiting write waits"
        );
        drop(read);
        let w = write
            .recv_timeout(Duration::from_secs(10))
            .expect("the write went");
        assert!(
            later_read.recv_timeout(SETTLE).is_err(),
            "the read waits for the write"
        );
        drop(w);
        later_read
            .recv_timeout(Duration::from_secs(10))
            .expect("the read went after the write");
    }

    #[test]
    fn guards_move_between_threads() {
        let locks = Arc::new(RangeLocks::default());
        let g = locks.lock(0, 1, false);
        std::thread::spawn(move || drop(g)).join().unwrap();
        assert!(locks.try_lock(0, 1, true).is_some());
    }
}
