//! The sanitize operation (SBC-4 4.11) as a job of its own: once started it runs on a
//! thread of the logical unit's, not on the SANITIZE command's, so that it outlives the
//! command as the standard asks. A SANITIZE with IMMED set answers at once; one without it
//! waits, but an abort of that command (ABORT TASK, a task set or LU reset, the loss of the
//! nexus) ends the wait and leaves the operation running. Until it ends, every command but
//! INQUIRY, REPORT LUNS and REQUEST SENSE is answered NOT READY, SANITIZE IN PROGRESS, with
//! the progress in the sense-key specific bytes.
//!
//! OVERWRITE writes at most `rate` bytes a second (`LuConfig::sanitize_rate`), as md paces
//! a RAID resync: it writes every block of the logical unit, and left unpaced it would take
//! the disk away from every other logical unit on it for as long. The erases only
//! deallocate and go as fast as the store does.
//!
//! Not kept across a restart of the target (a power cycle would resume it, SBC-4 4.11.2):
//! the operation is lost with the process, the blocks it reached stay sanitized.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use backstore::Backstore;

use crate::range_lock::RangeLocks;
use crate::sense::{self, Sense};

/// Bytes one step of the operation covers: the unit of progress and of pacing.
const STEP: u64 = 4 << 20;
/// How often a waiting SANITIZE looks whether it was aborted.
const POLL: Duration = Duration::from_millis(50);

/// What the operation leaves in every block.
pub(crate) enum Method {
    /// This block, written over every block.
    Overwrite(Vec<u8>),
    /// Deallocated (a thin logical unit whose store discards) or zeroed.
    Erase { discard: bool },
}

/// The medium the operation works on.
pub(crate) struct Medium {
    pub(crate) store: Arc<dyn Backstore>,
    pub(crate) locks: Arc<RangeLocks>,
    pub(crate) block_size: u64,
    pub(crate) capacity: u64,
    /// Bytes per second for OVERWRITE; `None`: unpaced.
    pub(crate) rate: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    /// Operations started so far; a waiter waits for the one it started.
    started: u64,
    finished: u64,
    /// Blocks done of the running operation.
    done: u64,
    total: u64,
    /// The outcome of the last finished operation.
    last: Option<Result<(), Sense>>,
}

/// The logical unit's sanitize operation, running or not.
#[derive(Debug, Default)]
pub(crate) struct Sanitizer {
    /// Read by every command: an atomic, not the lock.
    running: AtomicBool,
    state: Mutex<State>,
    cv: Condvar,
}

impl Sanitizer {
    pub(crate) fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// SANITIZE IN PROGRESS with the progress indication (SPC-5 4.4.1.2.3: 65536ths done).
    pub(crate) fn in_progress(&self) -> Sense {
        let s = self.state();
        let progress = if s.total == 0 {
            0
        } else {
            ((s.done as u128 * 65536) / s.total as u128).min(65535) as u16
        };
        sense::SANITIZE_IN_PROGRESS.with_progress(progress)
    }

    /// Starts an operation on its own thread; `None` if one is running already. Returns
    /// the operation's number for [`Sanitizer::wait`].
    pub(crate) fn start(self: &Arc<Self>, medium: Medium, method: Method) -> Option<u64> {
        if self.running.swap(true, Ordering::AcqRel) {
            return None;
        }
        let id = {
            let mut s = self.state();
            s.started += 1;
            s.done = 0;
            s.total = medium.capacity;
            s.started
        };
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("sanitize".into()).spawn({
            let me = me.clone();
            move || {
                let result = me.run(&medium, &method);
                if let Err(s) = &result {
                    tracing::warn!("sanitize operation failed: {s}");
                }
                me.finish(id, result);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("sanitize: no thread: {e}");
            me.finish(id, Err(sense::WRITE_ERROR));
        }
        Some(id)
    }

    fn finish(&self, id: u64, result: Result<(), Sense>) {
        let mut s = self.state();
        s.finished = id;
        s.last = Some(result);
        self.running.store(false, Ordering::Release);
        drop(s);
        self.cv.notify_all();
    }

    /// Waits for operation `id` to end and returns its outcome, or `None` as soon as
    /// `aborted` says the command waiting for it was aborted.
    pub(crate) fn wait(&self, id: u64, aborted: &dyn Fn() -> bool) -> Option<Result<(), Sense>> {
        let mut s = self.state();
        while s.finished < id {
            if aborted() {
                return None;
            }
            s = self
                .cv
                .wait_timeout(s, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Some(if s.finished == id {
            s.last.unwrap_or(Ok(()))
        } else {
            // A later operation finished too: this one had ended before it started.
            Ok(())
        })
    }

    /// Every block, one step at a time, holding the whole medium against other writers.
    fn run(&self, m: &Medium, method: &Method) -> Result<(), Sense> {
        let _all = m.locks.lock(0, m.capacity.max(1), true);
        let per = (STEP / m.block_size).max(1);
        let fill = match method {
            Method::Overwrite(block) if block.iter().any(|&b| b != 0) => {
                Some(block.repeat(per.min(m.capacity) as usize))
            }
            _ => None,
        };
        let started = Instant::now();
        let mut lba = 0;
        while lba < m.capacity {
            let n = per.min(m.capacity - lba);
            let (off, len) = (lba * m.block_size, n * m.block_size);
            let io = match (method, &fill) {
                (_, Some(buf)) => m.store.write_at(&buf[..len as usize], off),
                (Method::Erase { discard: true }, None) => m.store.discard(off, len),
                _ => m.store.write_zeroes(off, len),
            };
            io.map_err(|e| {
                tracing::warn!(error = %e, "sanitize: backstore I/O error at LBA {lba}");
                sense::WRITE_ERROR.with_information(lba)
            })?;
            lba += n;
            self.state().done = lba;
            if let (Method::Overwrite(_), Some(rate)) = (method, m.rate.filter(|&r| r > 0)) {
                let due = Duration::from_secs_f64((lba * m.block_size) as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        m.store.flush().map_err(|e| {
            tracing::warn!(error = %e, "sanitize: backstore flush failed");
            sense::WRITE_ERROR
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backstore::RamBackstore;

    fn medium(size: u64, rate: Option<u64>) -> (Arc<RamBackstore>, Medium) {
        let store = Arc::new(RamBackstore::new(size));
        let m = Medium {
            store: store.clone(),
            locks: Arc::default(),
            block_size: 512,
            capacity: size / 512,
            rate,
        };
        (store, m)
    }

    #[test]
    fn overwrite_is_paced_and_outlives_an_abandoned_wait() {
        // 8 MiB at 16 MiB/s: half a second, in two steps.
        let (store, m) = medium(8 << 20, Some(16 << 20));
        let s = Arc::new(Sanitizer::default());
        let started = Instant::now();
        let id = s.start(m, Method::Overwrite(vec![0xa5; 512])).unwrap();
        assert!(s.running());
        let (_, again) = medium(1 << 20, None);
        assert!(s.start(again, Method::Erase { discard: true }).is_none());
        // An aborted waiter leaves at once, the operation goes on.
        assert_eq!(s.wait(id, &|| true), None);
        assert!(s.running());
        let sense = s.in_progress().fixed();
        assert_eq!((sense[2], sense[12], sense[13]), (0x02, 0x04, 0x1b));
        assert_eq!(sense[15] & 0x80, 0x80, "SKSV with the progress");
        assert_eq!(s.wait(id, &|| false), Some(Ok(())));
        assert!(started.elapsed() >= Duration::from_millis(450));
        assert!(!s.running());
        let mut b = vec![0u8; 8 << 20];
        store.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0xa5));
    }

    #[test]
    fn erase_deallocates_every_block_unpaced() {
        let (store, m) = medium(16 << 20, Some(1));
        store.write_at(&[1u8; 4096], 5 << 20).unwrap();
        let s = Arc::new(Sanitizer::default());
        let id = s.start(m, Method::Erase { discard: true }).unwrap();
        assert_eq!(s.wait(id, &|| false), Some(Ok(())));
        assert_eq!(
            store.is_allocated(0, 16 << 20).unwrap(),
            vec![(0, 16 << 20, false)]
        );
    }
}
