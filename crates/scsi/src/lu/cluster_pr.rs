//! Persistent reservations of a logical unit that several targets export, kept in their
//! store's cluster (`Backstore::cluster_reservations`; docs/gateway.md).
//!
//! The rules stay `crate::pr`'s alone: a PERSISTENT RESERVE OUT reads the cluster's state,
//! applies the same `Reservations::persistent_out` to it, and writes the result back
//! guarded by the sequence number it read, again from the read on a conflict; then it
//! publishes the change (with the unit attentions it raises) to the other targets and
//! completes only once each has applied it or has certainly stopped trusting what it knew.
//! Every command that reservations may refuse is checked against the state as the store
//! last knew it, and refused outright while the store's lease does not hold.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use crate::pr::{self, Access, Fail, Reservations};
use crate::sense::{self, Sense};
use crate::xcopy::Reach;
use crate::{Command, Nexus};

use super::LogicalUnit;

/// NOT READY, LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION (SPC-5):
/// this target cannot tell what the reservations are right now (cut off from the
/// cluster). Initiators retry it, and multipath moves to another target.
pub(crate) const RESERVATIONS_UNKNOWN: Sense = Sense::new(sense::key::NOT_READY, 0x04, 0x0a);

/// How often a PERSISTENT RESERVE OUT reads and writes again when other targets keep
/// changing the state under it before it gives up (each round is one read and one
/// compare-and-set; losing this many in a row means the cluster is thrashing).
const CAS_ROUNDS: usize = 64;

/// `pr_seq` when the logical unit's copy is not known to be any sequence of the cluster's.
pub(super) const UNSYNCED: u64 = u64::MAX;

impl LogicalUnit {
    /// Whether APTPL can be honoured: a sidecar file, or the cluster (whose object is
    /// the persistence).
    pub(super) fn ptpl_capable(&self) -> bool {
        self.cluster.is_some() || self.config.pr_file.is_some()
    }

    /// The reservations, brought up to the cluster's state as the store knows it when it
    /// keeps them; an error while the store cannot vouch for that state.
    pub(super) fn pr_synced(&self) -> Result<MutexGuard<'_, Reservations>, Fail> {
        let mut pr = self.pr();
        if let Some(cluster) = &self.cluster {
            let (seq, state) = cluster.cached().map_err(|e| {
                tracing::debug!(error = %e, "reservations unknown: command refused");
                Fail::Check(RESERVATIONS_UNKNOWN)
            })?;
            if self.pr_seq.load(Ordering::Acquire) != seq {
                if !pr.adopt(&state) {
                    tracing::warn!(seq, "the cluster's reservation state does not read");
                    return Err(Fail::Check(RESERVATIONS_UNKNOWN));
                }
                self.pr_seq.store(seq, Ordering::Release);
            }
        }
        Ok(pr)
    }

    /// Whether a command from `nexus` that meets reservations as `access` says may run.
    pub(super) fn check_reservations(&self, nexus: Nexus, access: Access) -> Result<(), Fail> {
        match access {
            // Neither depends on persistent reservations (and SPC-2's are this target's
            // own), so a target cut off from the cluster still answers them.
            Access::Always | Access::Unreserved if self.cluster.is_some() => {
                self.pr().check(nexus, access)
            }
            _ => self.pr_synced()?.check(nexus, access),
        }
    }

    /// PERSISTENT RESERVE IN.
    pub(super) fn persistent_in(&self, cdb: &[u8]) -> Result<Vec<u8>, Fail> {
        let ptpl = self.ptpl_capable();
        self.pr_synced()?.persistent_in(cdb, ptpl)
    }

    /// PERSISTENT RESERVE OUT where the cluster keeps the state.
    pub(super) fn persistent_out_cluster(
        &self,
        cmd: &Command,
        reach: &dyn Reach,
    ) -> Result<Vec<u8>, Fail> {
        let Some(cluster) = &self.cluster else {
            return Err(Fail::Check(RESERVATIONS_UNKNOWN));
        };
        let admits = |initiator: &str| reach.admits(initiator, self);
        let unknown = |what: &str, e: std::io::Error| {
            tracing::warn!(error = %e, "reservations: {what}");
            Fail::Check(RESERVATIONS_UNKNOWN)
        };
        let mut pr = self.pr();
        let mut done = None;
        for _ in 0..CAS_ROUNDS {
            let (seq, state) = cluster
                .load()
                .map_err(|e| unknown("reading the cluster's state", e))?;
            if !pr.adopt(&state) {
                tracing::warn!(seq, "the cluster's reservation state does not read");
                return Err(Fail::Check(RESERVATIONS_UNKNOWN));
            }
            self.pr_seq.store(seq, Ordering::Release);
            // An answer other than GOOD changes nothing: it goes back as it is.
            let event = pr.persistent_out(cmd.nexus, cmd.cdb, cmd.data_out, true, &admits)?;
            let new = pr.save_shared();
            if new.as_bytes() == &state[..] {
                // Nothing changed (a RELEASE by a non-holder): nothing to write or tell.
                return Ok(Vec::new());
            }
            match cluster.store(seq, new.as_bytes()) {
                Ok(true) => {
                    self.pr_seq.store(seq + 1, Ordering::Release);
                    done = Some((seq + 1, new, event));
                    break;
                }
                Ok(false) => continue,
                Err(e) => {
                    // Whether the write happened is unknown: forget the local copy, so
                    // that the next command takes the cluster's.
                    pr.adopt(&state);
                    self.pr_seq.store(UNSYNCED, Ordering::Release);
                    return Err(unknown("writing the cluster's state", e));
                }
            }
        }
        let Some((seq, new, event)) = done else {
            tracing::warn!("reservations: other targets kept changing the state; gave up");
            return Err(Fail::Check(RESERVATIONS_UNKNOWN));
        };
        // Not under the lock: this target's own watch may be taking another target's
        // event, which needs it, and so may a task being aborted.
        drop(pr);
        // PREEMPT AND ABORT: this target's tasks of the preempted nexuses first; the
        // others abort theirs before they acknowledge the event, and the command completes
        // only once every member acknowledged (or was waited out, docs/gateway.md).
        let encoded = pr::encode_notices(&event);
        self.apply_event(event);
        cluster
            .publish(seq, new.as_bytes(), &encoded)
            .map_err(|e| unknown("telling the other targets", e))?;
        Ok(Vec::new())
    }

    /// Takes the changes other targets publish: the state is the store's already; here
    /// this target's nexuses get the unit attentions the change raised for them, and
    /// PREEMPT AND ABORT's preempted nexuses lose their tasks. The store acknowledges
    /// the event only once this returns, so the other target's command completes after.
    pub(super) fn listen_to_cluster(self: &Arc<Self>) {
        let Some(cluster) = &self.cluster else { return };
        let lu = Arc::downgrade(self);
        cluster.on_event(Arc::new(move |event: &[u8]| {
            let Some(lu) = lu.upgrade() else { return };
            let event = pr::decode_notices(event);
            // Brought up to the state the event came with (the store has it already);
            // without it, the names of the nexuses are still this target's.
            drop(lu.pr_synced());
            lu.apply_event(event);
        }));
    }
}
