//! A target node: its name, who may log in to it, and its logical units.

use std::collections::BTreeMap;
use std::sync::Arc;

use backstore::{Backstore, ChangeMap, Hold, Imaged, Undo};
use scsi::{Designator, LogicalUnit, Reach};

use std::net::SocketAddr;

use crate::config::{Chap, InitiatorAccess};
use crate::stats::LunStats;

/// One iSCSI target node: a name, its access rules and its logical units.
pub struct TargetNode {
    pub iqn: String,
    pub alias: Option<String>,
    pub allowed_initiators: Vec<String>,
    pub chap: Option<Chap>,
    /// Logins only over TLS.
    pub require_tls: bool,
    /// Portals it is reachable through, as configured; empty: all.
    pub portals: Vec<SocketAddr>,
    pub require_chap: bool,
    pub initiators: Vec<InitiatorAccess>,
    pub luns: BTreeMap<u16, Arc<LogicalUnit>>,
    /// Each LUN's store as opened and its change map, by LUN id, for code in the target's
    /// process beside the SCSI path (an incremental sync).
    pub stores: BTreeMap<u16, LunStore>,
}

/// A LUN's store as its kind opened it, not wrapped in change tracking, and the map of
/// the units written through the LUN (`track = true`), which `freeze` and `release` serve
/// a sync with. Data written to `store` directly is not tracked.
#[derive(Clone, Debug)]
pub struct LunStore {
    pub store: Arc<dyn Backstore>,
    pub changes: Option<Arc<ChangeMap>>,
    /// The spec it was opened from, as shown to people (`StoreSpec::shown`: no secrets).
    pub spec: String,
    /// Its counters for `/metrics` (with `[metrics]` only); they live as long as the LU.
    pub stats: Option<Arc<LunStats>>,
    /// The layer every write to the LUN passes through, where a point-in-time image is
    /// taken (`backstore::image`): one atomic check per write while none is held.
    pub imaged: Arc<Imaged>,
    /// The LUN's write answers, held during a consistency group's cut (`conn/exec.rs`).
    pub hold: Arc<Hold>,
    /// Where its replication role is kept (`backstore::role`: the store's `.role`
    /// sidecar, or a file named after the LUN in the data directory).
    pub role_file: Option<std::path::PathBuf>,
    /// The layer that keeps the LUN whole as a replica (`backstore::undo`; `undo = true`):
    /// `cycle_open()` says whether a sync is writing its next image now.
    pub undo: Option<Arc<Undo>>,
}

impl TargetNode {
    pub fn allows(&self, initiator: &str) -> bool {
        (self.allowed_initiators.is_empty() && self.initiators.is_empty())
            || self
                .allowed_initiators
                .iter()
                .any(|a| a.eq_ignore_ascii_case(initiator))
            || self.access(initiator).is_some()
    }

    fn access(&self, initiator: &str) -> Option<&InitiatorAccess> {
        self.initiators
            .iter()
            .find(|i| i.name.eq_ignore_ascii_case(initiator))
    }

    /// The CHAP secret `initiator` must prove: its own, else the target's.
    pub fn chap_for(&self, initiator: &str) -> Option<&Chap> {
        self.access(initiator)
            .and_then(|a| a.chap.as_ref())
            .or(self.chap.as_ref())
    }

    /// Whether a connection through the configured portal `portal` (none: not through a
    /// portal) may reach the target.
    pub fn reachable_through(&self, portal: Option<SocketAddr>) -> bool {
        self.portals.is_empty() || portal.is_some_and(|p| self.portals.contains(&p))
    }

    /// The target as `initiator` sees it: only its LUNs when it has a list (LUN masking);
    /// `None` when it sees them all.
    pub fn view_for(&self, initiator: &str) -> Option<TargetNode> {
        let luns = self.access(initiator)?.luns.as_ref()?;
        let keep = |id: &u16| luns.contains(id);
        Some(TargetNode {
            iqn: self.iqn.clone(),
            alias: self.alias.clone(),
            allowed_initiators: self.allowed_initiators.clone(),
            chap: self.chap.clone(),
            require_tls: self.require_tls,
            portals: self.portals.clone(),
            require_chap: self.require_chap,
            initiators: self.initiators.clone(),
            luns: self
                .luns
                .iter()
                .filter(|(id, _)| keep(id))
                .map(|(id, lu)| (*id, lu.clone()))
                .collect(),
            stores: self
                .stores
                .iter()
                .filter(|(id, _)| keep(id))
                .map(|(id, s)| (*id, s.clone()))
                .collect(),
        })
    }

    /// The target as `initiator` sees it, LUN masking applied: the node itself when the
    /// initiator sees every LUN. Whether it may log in at all is `allows`.
    pub fn view_of(self: &Arc<Self>, initiator: &str) -> Arc<TargetNode> {
        match self.view_for(initiator) {
            Some(v) => Arc::new(v),
            None => self.clone(),
        }
    }

    /// LUN `id`'s store and change map.
    pub fn lun_store(&self, id: u16) -> Option<&LunStore> {
        self.stores.get(&id)
    }

    pub fn lun_ids(&self) -> Vec<u16> {
        self.luns.keys().copied().collect()
    }
}

/// The LUs of a node, and who may reach them. A session's node is its view of the target
/// (LUN masking applied), so an EXTENDED COPY it sends reaches what it may see and no
/// more (see `Session`'s `Reach`).
impl Reach for TargetNode {
    fn find(&self, designator: &Designator) -> Option<Arc<LogicalUnit>> {
        self.luns
            .values()
            .find(|lu| lu.has_designator(designator))
            .cloned()
    }

    /// Admitted to the target, and `lu` among its LUNs: a view keeps the whole node's
    /// access rules, so masking `initiator`'s view of it keeps `lu` only where both see it.
    fn admits(&self, initiator: &str, lu: &LogicalUnit) -> bool {
        if !self.allows(initiator) {
            return false;
        }
        let seen =
            |luns: &BTreeMap<u16, Arc<LogicalUnit>>| luns.values().any(|l| std::ptr::eq(&**l, lu));
        match self.view_for(initiator) {
            Some(view) => seen(&view.luns),
            None => seen(&self.luns),
        }
    }
}

impl std::fmt::Debug for TargetNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetNode")
            .field("iqn", &self.iqn)
            .finish()
    }
}
