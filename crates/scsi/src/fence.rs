//! Who may change a logical unit's medium: everyone (the default), or only the initiators
//! named — a replica of `rsv sync`, whose data comes only from its replication streams
//! and which applications may read but not write. A command from any other initiator that
//! would change the medium gets DATA PROTECT, WRITE PROTECTED, checked where the data is
//! reached (`LogicalUnit::execute`, the paths beside it, and EXTENDED COPY's copy
//! targets), whatever the login admitted.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

use crate::Nexus;

/// The logical unit's writers, changed while it runs (a promote or demote); see the
/// module documentation.
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

    /// Named writers' sessions that have written and are still logged in.
    pub fn writing(&self) -> usize {
        self.writing.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether the nexus of initiator port `port` (`NAME,i,0xISID`, or `None` when the
    /// logical unit does not know it) may change the medium.
    pub(crate) fn admits(&self, nexus: Nexus, port: Option<&str>) -> bool {
        if !self.on.load(Ordering::SeqCst) {
            return true;
        }
        let w = self.writers.read().unwrap_or_else(|e| e.into_inner());
        let Some(writers) = w.as_ref() else {
            return true;
        };
        let Some(name) = port.map(|p| p.split(",i,").next().unwrap_or(p)) else {
            return false;
        };
        let ok = writers.iter().any(|n| n.eq_ignore_ascii_case(name));
        if ok {
            self.writing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(nexus);
        }
        ok
    }

    pub(crate) fn lost(&self, nexus: Nexus) {
        self.writing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_write_once_fenced() {
        let f = Fence::default();
        assert!(f.admits(Nexus(1), Some("iqn.app,i,0x01")));
        assert!(f.admits(Nexus(1), None), "open: even an unknown nexus");
        f.set(Some(vec!["iqn.2026-01.org.reservoir:sync.ab".into()]));
        assert!(!f.admits(Nexus(1), Some("iqn.app,i,0x01")));
        assert!(
            !f.admits(Nexus(1), None),
            "fenced: an unknown nexus is refused"
        );
        assert!(
            !f.admits(Nexus(1), Some("iqn.2026-01.org.reservoir:sync,i,0x01")),
            "a prefix of the name is another name"
        );
        assert_eq!(f.writing(), 0);
        assert!(f.admits(Nexus(2), Some("IQN.2026-01.org.reservoir:SYNC.ab,i,0x02")));
        assert_eq!(f.writing(), 1);
        f.lost(Nexus(2));
        assert_eq!(f.writing(), 0);
        f.set(None);
        assert!(f.admits(Nexus(1), Some("iqn.app,i,0x01")));
    }
}
