//! The connection set: the session's connections of the current generation, what their
//! login settled, and the lost ones being recovered.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use iscsi::negotiate::SessionParams;
use tokio::sync::watch;

use super::recovery::Loss;
use super::SessionInfo;
use crate::conn::Conn;

/// Lives in the session's state, under its lock: a command picks its connection in the
/// same critical section as its CmdSN, and a failed connection's recovery entry is made
/// together with the sorting out of its tasks.
pub(super) struct ConnSet {
    /// Bumped by each (re)instatement of the session; a connection belongs to one.
    pub(super) gen: u64,
    pub(super) all: Vec<Arc<Conn>>,
    /// Connections being recovered, by [`Conn::serial`].
    pub(super) losses: HashMap<u64, watch::Receiver<Loss>>,
    pub(super) tsih: u16,
    pub(super) params: SessionParams,
    pub(super) info: Option<SessionInfo>,
    pub(super) closed: bool,
    /// The last reinstatement that gave up: the generation it tried to replace, when it
    /// gave up, its attempts and why. Commands issued before it gave up fail with it
    /// instead of each trying again for as long (with a queue of 32, a link cut for good
    /// would otherwise hold a copy for 32 recovery timeouts); a command issued later
    /// tries afresh.
    pub(super) failed: Option<(u64, std::time::Instant, u32, String)>,
}

impl ConnSet {
    pub(super) fn new() -> ConnSet {
        ConnSet {
            gen: 0,
            all: Vec::new(),
            losses: HashMap::new(),
            tsih: 0,
            params: SessionParams::default(),
            info: None,
            closed: false,
            failed: None,
        }
    }

    /// The live connection with the fewest bytes outstanding.
    pub(super) fn pick(&self) -> Option<Arc<Conn>> {
        self.all
            .iter()
            .filter(|c| c.is_alive())
            .min_by_key(|c| c.outstanding.load(Ordering::Relaxed))
            .cloned()
    }

    /// A lost connection is being brought back (ERL 2): commands wait for it rather than
    /// have the session reinstated.
    pub(super) fn recovering(&self) -> bool {
        self.params.error_recovery_level >= 2
            && self.losses.values().any(|l| *l.borrow() == Loss::Pending)
    }
}
