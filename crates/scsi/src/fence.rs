//! Who may change a logical unit's medium: everyone (the default), or only the initiators
//! named — a replica of `rsv sync`, whose data comes only from its replication streams
//! and which applications may read but not write. A command from any other initiator that
//! would change the medium gets DATA PROTECT, WRITE PROTECTED, checked where the data is
//! reached (`LogicalUnit::execute`, the paths beside it, and EXTENDED COPY's copy
//! targets), whatever the login admitted.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::Nexus;

/// The logical unit's writers, changed while it runs (a promote or demote); see the
/// module documentation.
///
/// # Cycles
/// A replica that keeps its copy whole (an undo log) is written in *cycles*: a sync opens
/// one, its streams write, and it is committed or rolled back. A stream names its cycle
/// in its initiator name (`backstore::role::cycle_writer`); such a LUN admits it only
/// while that cycle is open here ([`Fence::set_cycle`]). So a stream left running after
/// its cycle ended (its coordinator killed, the far site rolled the cycle back) changes
/// nothing, whether its writes were in flight or it logs in again. A stream that names no
/// cycle (a sync of a volume where some member keeps no undo log opens none) is admitted
/// only while no cycle is open.
#[derive(Debug, Default)]
pub struct Fence {
    /// Whether `writers` names anyone: the one atomic load a write pays when it does not.
    on: AtomicBool,
    /// `None`: every initiator may write. `Some`: only these (iSCSI names, compared
    /// without regard to case, as RFC 3722 folds them).
    writers: RwLock<Option<Vec<String>>>,
    /// Nexuses of named writers that wrote since their login: a replication stream is
    /// writing while one is logged in.
    writing: Mutex<HashSet<Nexus>>,
    /// The cycle writers may write for, and the commands admitted and not yet done.
    cycles: Arc<Cycles>,
}

#[derive(Debug, Default)]
struct Cycles {
    state: Mutex<CycleState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct CycleState {
    /// The LUN keeps cycles (an undo log): writers are admitted by cycle.
    kept: bool,
    /// The cycle open now, if any.
    open: Option<u64>,
    /// Grows at every change of `open`: a pass taken before it is of an older state.
    generation: u64,
    /// Writers' commands admitted under the current generation, and under older ones,
    /// still running.
    current: u64,
    older: u64,
}

/// A named writer's command, admitted by the fence: held until the command has changed
/// the medium, so that [`Fence::set_cycle`] can wait for every write admitted under the
/// cycle before it. Empty when the medium is not fenced.
#[derive(Debug)]
#[must_use]
pub struct FencePass {
    held: Option<(Arc<Cycles>, u64)>,
}

impl Drop for FencePass {
    fn drop(&mut self) {
        let Some((cycles, generation)) = self.held.take() else {
            return;
        };
        let mut s = cycles.state.lock().unwrap_or_else(|e| e.into_inner());
        if generation == s.generation {
            s.current -= 1;
        } else {
            s.older -= 1;
            if s.older == 0 {
                cycles.done.notify_all();
            }
        }
    }
}

/// Whether a named writer whose stream names cycle `stream` (`None`: no cycle) may write
/// now, `open` being the cycle open here, on a LUN that keeps cycles or not (`kept`).
pub fn admits_cycle(kept: bool, open: Option<u64>, stream: Option<u64>) -> bool {
    match (kept, stream) {
        // No cycles here: only the plain writer (a tagged stream's cycle is not here).
        (false, s) => s.is_none(),
        (true, Some(c)) => open == Some(c),
        (true, None) => open.is_none(),
    }
}

impl Fence {
    /// Only `writers` may change the medium from now (`None`: everyone). Commands already
    /// past their check finish.
    pub fn set(&self, writers: Option<Vec<String>>) {
        let mut w = self.writers.write().unwrap_or_else(|e| e.into_inner());
        self.on.store(writers.is_some(), Ordering::SeqCst);
        *w = writers;
        if w.is_none() {
            self.writing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
    }

    /// The writers named, if the medium is fenced.
    pub fn writers(&self) -> Option<Vec<String>> {
        self.writers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the LUN keeps cycles (it has an undo log): set once, when it opens.
    pub fn keep_cycles(&self, kept: bool) {
        self.cycles.state().kept = kept;
    }

    /// The cycle the writers may write for from now (`None`: none open). Returns once
    /// every writer's command admitted before has changed the medium, so that what
    /// follows (a roll back, a commit) sees all it will ever see of the cycle before;
    /// fails if one is still running after `wait` (the change is made all the same).
    pub fn set_cycle(&self, open: Option<u64>, wait: Duration) -> Result<(), String> {
        let c = &self.cycles;
        let mut s = c.state();
        s.open = open;
        s.generation += 1;
        s.older += s.current;
        s.current = 0;
        let until = Instant::now() + wait;
        while s.older > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{} replication write(s) admitted before are still running after {wait:?}",
                    s.older
                ));
            }
            s = c
                .done
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// The cycle writers may write for now.
    pub fn cycle(&self) -> Option<u64> {
        self.cycles.state().open
    }

    /// Named writers' sessions that have written and are still logged in.
    pub fn writing(&self) -> usize {
        self.writing.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether the nexus of initiator port `port` (`NAME,i,0xISID`, or `None` when the
    /// logical unit does not know it) may change the medium: the pass to hold while it
    /// does, or `None`.
    pub(crate) fn admits(&self, nexus: Nexus, port: Option<&str>) -> Option<FencePass> {
        let name = port.map(|p| p.split(",i,").next().unwrap_or(p));
        if !self.on.load(Ordering::SeqCst) {
            // Everyone writes, but a replication stream only in its own cycle: one that
            // outlived it must not write a LUN promoted since (nor a first sync's
            // destination after its cycle ended).
            return match name.map(backstore::role::writer_and_cycle) {
                Some((_, Some(c))) => self.pass(true, Some(c)),
                _ => Some(FencePass { held: None }),
            };
        }
        let w = self.writers.read().unwrap_or_else(|e| e.into_inner());
        let Some(writers) = w.as_ref() else {
            return Some(FencePass { held: None });
        };
        let (writer, stream) = backstore::role::writer_and_cycle(name?);
        if !writers.iter().any(|n| n.eq_ignore_ascii_case(writer)) {
            return None;
        }
        let pass = self.pass(false, stream)?;
        self.writing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(nexus);
        Some(pass)
    }

    /// A named writer's pass for a stream of cycle `stream`, counted, if the cycle rule
    /// admits it (`open_only`: whatever the LUN keeps, only in the open cycle).
    fn pass(&self, open_only: bool, stream: Option<u64>) -> Option<FencePass> {
        let mut s = self.cycles.state();
        let ok = if open_only {
            s.kept && stream.is_some() && s.open == stream
        } else {
            admits_cycle(s.kept, s.open, stream)
        };
        if !ok {
            return None;
        }
        s.current += 1;
        Some(FencePass {
            held: Some((self.cycles.clone(), s.generation)),
        })
    }

    pub(crate) fn lost(&self, nexus: Nexus) {
        self.writing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
    }
}

impl Cycles {
    fn state(&self) -> std::sync::MutexGuard<'_, CycleState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(f: &Fence, n: u64, port: Option<&str>) -> bool {
        f.admits(Nexus(n), port).is_some()
    }

    #[test]
    fn only_the_named_write_once_fenced() {
        let f = Fence::default();
        assert!(ok(&f, 1, Some("iqn.app,i,0x01")));
        assert!(ok(&f, 1, None), "open: even an unknown nexus");
        f.set(Some(vec!["iqn.2026-01.org.reservoir:sync.ab".into()]));
        assert!(!ok(&f, 1, Some("iqn.app,i,0x01")));
        assert!(!ok(&f, 1, None), "fenced: an unknown nexus is refused");
        assert!(
            !ok(&f, 1, Some("iqn.2026-01.org.reservoir:sync,i,0x01")),
            "a prefix of the name is another name"
        );
        assert_eq!(f.writing(), 0);
        assert!(ok(&f, 2, Some("IQN.2026-01.org.reservoir:SYNC.ab,i,0x02")));
        assert_eq!(f.writing(), 1);
        f.lost(Nexus(2));
        assert_eq!(f.writing(), 0);
        f.set(None);
        assert!(ok(&f, 1, Some("iqn.app,i,0x01")));
    }

    const W: &str = "iqn.2026-01.org.reservoir:sync.ab";

    fn port(cycle: Option<u64>) -> String {
        match cycle {
            Some(c) => format!("{},i,0x01", backstore::role::cycle_writer(W, c)),
            None => format!("{W},i,0x01"),
        }
    }

    #[test]
    fn a_lun_that_keeps_cycles_admits_a_stream_only_in_its_cycle() {
        let f = Fence::default();
        f.set(Some(vec![W.into()]));
        f.keep_cycles(true);
        // No cycle open: only a stream that names none.
        assert!(ok(&f, 1, Some(&port(None))));
        assert!(!ok(&f, 1, Some(&port(Some(5)))));
        f.set_cycle(Some(5), Duration::ZERO).unwrap();
        assert!(ok(&f, 1, Some(&port(Some(5)))));
        assert!(!ok(&f, 1, Some(&port(Some(4)))), "an older cycle's stream");
        assert!(!ok(&f, 1, Some(&port(None))), "a stream of no cycle");
        assert!(
            !ok(&f, 1, Some("iqn.app.cycle-0000000000000005,i,0x01")),
            "the tag does not make another name a writer"
        );
        // Rolled back (or committed): the cycle's stream is refused from now.
        f.set_cycle(None, Duration::ZERO).unwrap();
        assert!(!ok(&f, 1, Some(&port(Some(5)))));
        // A LUN without cycles admits the plain writer only.
        f.keep_cycles(false);
        assert!(ok(&f, 1, Some(&port(None))));
        assert!(!ok(&f, 1, Some(&port(Some(5)))));
        // Not fenced (a primary, or a first sync's destination): everyone, but a stream
        // only in its own cycle.
        f.set(None);
        assert!(ok(&f, 1, Some("iqn.app,i,0x01")));
        assert!(ok(&f, 1, Some(&port(None))));
        assert!(ok(&f, 1, None));
        assert!(!ok(&f, 1, Some(&port(Some(9)))), "a LUN without cycles");
        f.keep_cycles(true);
        assert!(!ok(&f, 1, Some(&port(Some(9)))), "no cycle open");
        f.set_cycle(Some(9), Duration::ZERO).unwrap();
        assert!(ok(&f, 1, Some(&port(Some(9)))));
        assert!(!ok(&f, 1, Some(&port(Some(8)))));
        assert_eq!(f.writing(), 0, "writers are counted only when fenced");
    }

    #[test]
    fn closing_a_cycle_waits_for_the_writes_it_admitted() {
        let f = Arc::new(Fence::default());
        f.set(Some(vec![W.into()]));
        f.keep_cycles(true);
        f.set_cycle(Some(7), Duration::ZERO).unwrap();
        let pass = f.admits(Nexus(1), Some(&port(Some(7)))).unwrap();
        // Still running: the close says so after its wait.
        let e = f.set_cycle(None, Duration::from_millis(20)).unwrap_err();
        assert!(e.contains("1 replication write"), "{e}");
        assert!(!ok(&f, 2, Some(&port(Some(7)))), "closed all the same");
        // It ends while a close waits: the close returns then.
        f.set_cycle(Some(8), Duration::ZERO).unwrap_err();
        let f2 = f.clone();
        let closing = std::thread::spawn(move || f2.set_cycle(None, Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!closing.is_finished(), "the close waits for the write");
        drop(pass);
        closing.join().unwrap().unwrap();
        // A pass taken two changes back is still waited for, and only it.
        f.set_cycle(Some(9), Duration::ZERO).unwrap();
        let running = f.admits(Nexus(1), Some(&port(Some(9)))).unwrap();
        f.set_cycle(None, Duration::ZERO).unwrap_err();
        f.set_cycle(Some(10), Duration::ZERO).unwrap_err();
        drop(running);
        f.set_cycle(None, Duration::ZERO).unwrap();
    }
}
