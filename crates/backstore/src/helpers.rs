//! Threads kept for running the member I/O of a stripe request that spans members, so
//! that such a request does not pay for creating and joining a thread per extra member.
//!
//! A job goes to an idle helper, or to a new one when none is idle: it never waits behind
//! another job, so a member that is slow holds up the helpers running its I/O and nothing
//! else. A helper idle for [`IDLE`] exits; the pool is as large as the most jobs ever in
//! flight at once recently, and empty when nothing spans members.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::time::Duration;

/// How long a helper waits for work before it exits.
const IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;
/// What a job gave, or its panic.
pub(crate) type Outcome<T> = Result<T, Box<dyn Any + Send>>;

/// Idle helpers, each by its id and the sender of its job channel.
static IDLE_HELPERS: Mutex<Vec<(u64, Sender<Job>)>> = Mutex::new(Vec::new());
static NEXT_ID: Mutex<u64> = Mutex::new(0);

/// The idle list; nothing panics while holding it, but a poisoned lock is no reason to.
fn idle_helpers() -> std::sync::MutexGuard<'static, Vec<(u64, Sender<Job>)>> {
    IDLE_HELPERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `job` on an idle helper or a new one.
fn dispatch(mut job: Job) {
    loop {
        let idle = idle_helpers().pop();
        let Some((_, tx)) = idle else { break };
        // A helper whose sender was popped waits for this job (see `helper`); the send
        // fails only if it died.
        match tx.send(job) {
            Ok(()) => return,
            Err(mpsc::SendError(j)) => job = j,
        }
    }
    let (tx, rx) = mpsc::channel();
    let id = {
        let mut n = NEXT_ID.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        *n
    };
    tx.send(job).expect("the receiver is here");
    let spawned = std::thread::Builder::new()
        .name("rsv-stripe".into())
        .spawn(move || helper(id, tx, rx));
    if let Err(e) = spawned {
        // No thread to be had: the job is lost with the closure that held it, and its
        // result sender with it, which `run` reports as an error.
        tracing::error!("starting a stripe helper thread: {e}");
    }
}

fn helper(id: u64, tx: Sender<Job>, rx: Receiver<Job>) {
    loop {
        match rx.recv_timeout(IDLE) {
            Ok(job) => {
                job();
                idle_helpers().push((id, tx.clone()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut idle = idle_helpers();
                match idle.iter().position(|(i, _)| *i == id) {
                    Some(at) => {
                        idle.swap_remove(at);
                        return;
                    }
                    // Taken by a dispatcher that is sending a job right now: wait for it.
                    None => continue,
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs `first` on this thread and each of `rest` on a helper, all at once, and returns
/// every result in order (`first`'s first) once all have finished, also when one
/// panicked: the jobs may borrow from the caller's stack.
pub(crate) fn run<'a, T: Send + 'a>(
    first: impl FnOnce() -> T,
    rest: Vec<Box<dyn FnOnce() -> T + Send + 'a>>,
) -> Vec<Outcome<T>> {
    let n = rest.len();
    struct Wait<T> {
        rx: Receiver<(usize, Outcome<T>)>,
        results: Vec<Option<Outcome<T>>>,
        left: usize,
    }
    impl<T> Wait<T> {
        fn all(&mut self) {
            while self.left > 0 {
                match self.rx.recv() {
                    Ok((i, r)) => {
                        self.results[i] = Some(r);
                        self.left -= 1;
                    }
                    // Every sender is gone: the jobs not heard from were dropped unrun
                    // (or never handed out, when this thread unwinds).
                    Err(_) => break,
                }
            }
        }
    }
    impl<T> Drop for Wait<T> {
        fn drop(&mut self) {
            self.all();
        }
    }
    let (tx, rx) = mpsc::channel::<(usize, Outcome<T>)>();
    // Declared before the sender: should anything below unwind, the sender goes first
    // and `wait` then waits for exactly the jobs handed out.
    let mut wait = Wait {
        rx,
        results: (0..n).map(|_| None).collect(),
        left: n,
    };
    let done_tx = tx;
    for (i, f) in rest.into_iter().enumerate() {
        let done = done_tx.clone();
        let job: Box<dyn FnOnce() + Send + 'a> = Box::new(move || {
            let r = catch_unwind(AssertUnwindSafe(f));
            let _ = done.send((i, r));
        });
        // SAFETY: the job borrows for 'a from the caller, and `wait` does not let this
        // function return or unwind before every job handed out has run to its end and
        // dropped what it borrowed (its `done` send is its last act; a job that is dropped
        // unrun, with no helper to take it, drops its sender and is counted then).
        let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'a>, Job>(job) };
        dispatch(job);
    }
    drop(done_tx);
    let mine = catch_unwind(AssertUnwindSafe(first));
    wait.all();
    let mut out = Vec::with_capacity(n + 1);
    out.push(mine);
    for r in wait.results.drain(..) {
        out.push(r.unwrap_or_else(|| Err(Box::new("no thread to run a stripe member's I/O"))));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    #[test]
    fn jobs_borrow_run_at_once_and_report_panics() {
        let mut slots = vec![0u64; 4];
        let (a, rest) = slots.split_first_mut().unwrap();
        let jobs: Vec<Box<dyn FnOnce() -> u64 + Send + '_>> = rest
            .iter_mut()
            .enumerate()
            .map(|(i, s)| {
                Box::new(move || {
                    *s = i as u64 + 10;
                    *s
                }) as Box<dyn FnOnce() -> u64 + Send>
            })
            .collect();
        let r = run(
            || {
                *a = 1;
                1
            },
            jobs,
        );
        let r: Vec<u64> = r.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(r, [1, 10, 11, 12]);
        assert_eq!(slots, [1, 10, 11, 12]);

        // Three jobs that each sleep 200 ms take about that long together.
        let ran = AtomicUsize::new(0);
        let start = Instant::now();
        let jobs: Vec<Box<dyn FnOnce() + Send + '_>> = (0..3)
            .map(|_| {
                Box::new(|| {
                    std::thread::sleep(Duration::from_millis(200));
                    ran.fetch_add(1, Ordering::SeqCst);
                }) as Box<dyn FnOnce() + Send>
            })
            .collect();
        run(|| std::thread::sleep(Duration::from_millis(200)), jobs);
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        assert!(
            start.elapsed() < Duration::from_millis(550),
            "{:?}",
            start.elapsed()
        );

        let jobs: Vec<Box<dyn FnOnce() -> u8 + Send>> = vec![Box::new(|| panic!("member"))];
        let r = run(|| 1u8, jobs);
        assert!(r[0].is_ok() && r[1].is_err());
    }
}
