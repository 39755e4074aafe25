//! The logical unit: state shared by all nexuses and the SBC/SPC command set.
//!
//! This module holds the unit's state, `execute` (checks, reservations, unit attentions,
//! then the handler its row in `commands` names) and the small commands; the rest by
//! kind: `commands` (the table of the commands offered), `media` (the commands that read
//! or change the medium), `copy` (EXTENDED COPY), `fast` (the paths beside `execute` for
//! plain READs, WRITEs and flushes: lent, at once or asynchronous).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use backstore::groups::{AccessState, PortGroups};
use backstore::Backstore;

use crate::alua;
use crate::cdb::{self, be16, be32, block_range, truncate};
use crate::inquiry::{self, Limits};
use crate::mode::{self, ModeState};
use crate::opcodes::*;
use crate::pr::{Fail, Notices, Reservations};
use crate::range_lock::{RangeGuard, RangeLocks};
use crate::sanitize::Sanitizer;
use crate::sense::{self, Sense};
use crate::xcopy::{CopyStatus, Designator, OnlyItself, Reach};
use crate::{status, Command, LuConfig, Nexus, Response};

mod cluster_pr;
mod commands;
mod copy;
mod fast;
mod media;

pub use commands::{class_of, Class};
use commands::{Call, Gate, Offer};
pub use fast::{AsyncFlush, AsyncRead, AsyncWrite, LentRead};

type Outcome = Result<Vec<u8>, Sense>;

/// Largest buffer a WRITE SAME fills at once.
const WRITE_SAME_CHUNK: u64 = 1 << 20;
/// Bytes an EXTENDED COPY segment moves per read and write.
const COPY_CHUNK: u64 = 1 << 20;

/// Per-nexus state: unit attentions not yet reported.
type Pending = Mutex<VecDeque<Sense>>;

/// How the transport aborts tasks for the logical unit (PREEMPT AND ABORT): every task of
/// the given I_T nexuses on this logical unit is aborted as ABORT TASK SET would (those
/// not started are dropped, those running finish with no answer); the call returns once
/// none of them can change the medium any more, with the nexuses that had a task aborted.
/// It may block, and is never called with the reservations' lock held.
pub type AbortTasks = Arc<dyn Fn(&LogicalUnit, &[Nexus]) -> Vec<Nexus> + Send + Sync>;

/// A direct-access logical unit over a [`Backstore`].
#[derive(Debug)]
pub struct LogicalUnit {
    config: LuConfig,
    store: Arc<dyn Backstore>,
    block_size: u64,
    /// Logical blocks, as the store's size last gave them (see
    /// [`LogicalUnit::refresh_capacity`]).
    capacity: AtomicU64,
    limits: Limits,
    mode: RwLock<ModeState>,
    nexuses: RwLock<HashMap<Nexus, Pending>>,
    /// Removable medium ejected by START STOP UNIT.
    no_medium: AtomicBool,
    /// A SANITIZE operation, running or not: the medium answers nothing while it runs
    /// (SBC-4 4.11).
    sanitizer: Arc<Sanitizer>,
    /// Nexuses holding a PREVENT MEDIUM REMOVAL.
    prevent: Mutex<HashSet<Nexus>>,
    /// Writes hold their blocks exclusively, reads shared: a write (WRITE ATOMIC above
    /// all) is never seen half done, not even by a read whose bytes are still being sent.
    locks: Arc<RangeLocks>,
    reservations: Mutex<Reservations>,
    /// Where the persistent reservations live when other targets export this LU too and
    /// its store keeps them in the cluster (`cluster_pr`).
    cluster: Option<Arc<dyn backstore::ClusterReservations>>,
    /// The cluster's sequence number that `reservations` holds (`cluster_pr::UNSYNCED`
    /// when none); changed under the `reservations` lock.
    pr_seq: AtomicU64,
    /// VPD page 83h designators of this logical unit (association: logical unit).
    designators: Vec<Designator>,
    /// EXTENDED COPY status kept for RECEIVE COPY RESULTS, by nexus and list identifier.
    copies: Mutex<HashMap<(Nexus, u8), CopyStatus>>,
    /// The target port groups' states, where the store keeps them for a gateway group
    /// (see [`LogicalUnit::follow_port_groups`]); unset, every group is active/optimized.
    port_groups: OnceLock<Arc<dyn PortGroups>>,
    /// Who may change the medium (a replica's: only its replication streams).
    fence: crate::Fence,
    /// The transport's way to abort tasks (see [`LogicalUnit::on_abort_tasks`]).
    aborter: OnceLock<Aborter>,
}

struct Aborter(AbortTasks);

impl std::fmt::Debug for Aborter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortTasks")
    }
}

impl LogicalUnit {
    pub fn new(config: LuConfig, store: Arc<dyn Backstore>) -> Self {
        let block_size = config.block_size.max(1) as u64;
        let capacity = store.size() / block_size;
        let mut limits = Limits::new(&config);
        if !config.peer_port_groups.is_empty() {
            // Other targets write this data too: COMPARE AND WRITE is offered only as far
            // as the store makes it atomic against them (see `compare_and_write`).
            // A store without it (or whose unit is below a block) gets 0: COMPARE AND
            // WRITE not supported (SBC-4, Block Limits VPD page).
            let unit = store.atomic_compare_and_write_unit().unwrap_or(0);
            let most = (unit / block_size).min(u8::MAX as u64) as u8;
            limits.max_compare_and_write = limits.max_compare_and_write.min(most);
        }
        let designators = inquiry::lu_designators(&config);
        let cluster = store.cluster_reservations();
        let mut reservations = config
            .pr_file
            .as_ref()
            .filter(|_| cluster.is_none())
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|text| Reservations::load(&text))
            .unwrap_or_default();
        reservations.set_ports(config.relative_port, &config.peer_port_groups);
        Self {
            config,
            store,
            block_size,
            capacity: AtomicU64::new(capacity),
            limits,
            mode: RwLock::new(ModeState::default()),
            nexuses: RwLock::new(HashMap::new()),
            no_medium: AtomicBool::new(false),
            sanitizer: Arc::default(),
            prevent: Mutex::new(HashSet::new()),
            locks: Arc::default(),
            reservations: Mutex::new(reservations),
            cluster,
            pr_seq: AtomicU64::new(cluster_pr::UNSYNCED),
            designators,
            copies: Mutex::new(HashMap::new()),
            port_groups: OnceLock::new(),
            fence: crate::Fence::default(),
            aborter: OnceLock::new(),
        }
    }

    /// Gives the logical unit the transport's way to abort the tasks of I_T nexuses,
    /// which PREEMPT AND ABORT uses (here, and when another target of a gateway group
    /// tells of one). The first one given stays. Without one, no task is aborted.
    pub fn on_abort_tasks(&self, f: AbortTasks) {
        let _ = self.aborter.set(Aborter(f));
    }

    /// Queues a reservation change's unit attentions and, for PREEMPT AND ABORT, aborts
    /// the tasks of every nexus of the preempted initiator ports; as the Control mode
    /// page's TAS is zero, each nexus that had a task aborted then gets COMMANDS CLEARED
    /// BY ANOTHER INITIATOR (SAM-5 5.6). Returns once none of those tasks can change the
    /// medium any more. Call it without the reservations' lock: a running task may be
    /// waiting for it.
    ///
    /// The preempted ports' unit attentions are queued only after the abort: a task
    /// aborted while it ran would take a pending one with it (its answer suppressed), and
    /// the initiator would never see REGISTRATIONS PREEMPTED.
    fn apply_event(&self, event: crate::pr::Event) {
        let (later, now): (Notices, Notices) = event
            .notices
            .into_iter()
            .partition(|(p, _)| event.abort.iter().any(|a| a.eq_ignore_ascii_case(p)));
        self.notify(&self.pr(), now);
        if event.abort.is_empty() {
            return;
        }
        let hit = self.abort_tasks(&event.abort);
        self.notify(&self.pr(), later);
        let pending = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for n in hit {
            if let Some(q) = pending.get(&n) {
                let mut q = q.lock().unwrap_or_else(|e| e.into_inner());
                if !q.contains(&sense::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR) {
                    q.push_back(sense::COMMANDS_CLEARED_BY_ANOTHER_INITIATOR);
                }
            }
        }
    }

    /// Aborts the tasks of every nexus of `ports` on this logical unit through the
    /// transport (see [`AbortTasks`]); the nexuses that had one.
    fn abort_tasks(&self, ports: &[String]) -> Vec<Nexus> {
        let nexuses: Vec<Nexus> = {
            let pr = self.pr();
            let mut v: Vec<Nexus> = ports.iter().flat_map(|p| pr.nexuses_of(p)).collect();
            v.sort();
            v.dedup();
            v
        };
        let Some(abort) = self.aborter.get() else {
            tracing::warn!("PREEMPT AND ABORT: no transport to abort tasks with");
            return Vec::new();
        };
        let hit = (abort.0)(self, &nexuses);
        if !hit.is_empty() {
            tracing::info!(
                nexuses = ?hit,
                "PREEMPT AND ABORT: the preempted nexuses' tasks aborted"
            );
        }
        hit
    }

    /// Who may change the medium; see [`crate::Fence`].
    pub fn fence(&self) -> &crate::Fence {
        &self.fence
    }

    /// DATA PROTECT, WRITE PROTECTED unless `nexus` may change the medium (the fence);
    /// the pass is held until the change is made (see [`crate::Fence::set_cycle`]).
    fn check_fence(&self, nexus: Nexus) -> Result<crate::FencePass, Sense> {
        let pr = self.pr();
        self.fence
            .admits(nexus, pr.named(nexus))
            .ok_or(sense::WRITE_PROTECTED)
    }

    /// Whether `d` is one of this logical unit's designators (VPD page 83h).
    pub fn has_designator(&self, d: &Designator) -> bool {
        self.designators.contains(d)
    }

    fn copies(&self) -> MutexGuard<'_, HashMap<(Nexus, u8), CopyStatus>> {
        self.copies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the initiator port (`iqn...,i,0x<isid>`) behind a nexus; persistent
    /// reservations are kept by this name.
    pub fn name_nexus(&self, nexus: Nexus, initiator_port: &str) {
        self.pr().name(nexus, initiator_port);
    }

    fn pr(&self) -> MutexGuard<'_, Reservations> {
        self.reservations.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &LuConfig {
        &self.config
    }

    /// Whether other targets export this logical unit's data too (a gateway group).
    fn shared(&self) -> bool {
        !self.config.peer_port_groups.is_empty()
    }

    fn offer(&self) -> Offer {
        Offer {
            thin: self.config.thin,
            reservations: self.config.peer_port_groups.is_empty(),
            persistent: self.config.peer_port_groups.is_empty() || self.cluster.is_some(),
            port_groups: self.port_groups.get().is_some(),
        }
    }

    /// Number of logical blocks.
    pub fn capacity_blocks(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }

    /// Takes the store's size again (a store whose size changes by itself: an RBD image
    /// resized by another client); when it has changed, every nexus gets CAPACITY DATA HAS
    /// CHANGED (SBC-4 4.10) and READ CAPACITY answers the new size from then on. Called
    /// before every command; a store's `size` is a field or an atomic, so this costs a
    /// load and a compare. Returns whether the capacity changed.
    pub fn refresh_capacity(&self) -> bool {
        let blocks = self.store.size() / self.block_size;
        if self.capacity.load(Ordering::Acquire) == blocks {
            return false;
        }
        let old = self.capacity.swap(blocks, Ordering::AcqRel);
        if old == blocks {
            return false;
        }
        tracing::info!(
            store = %self.store.description(),
            "capacity changed from {old} to {blocks} blocks of {}",
            self.block_size
        );
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for pending in nexuses.values() {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            if !q.contains(&sense::CAPACITY_DATA_HAS_CHANGED) {
                q.push_back(sense::CAPACITY_DATA_HAS_CHANGED);
            }
        }
        true
    }

    pub fn flush(&self) -> io::Result<()> {
        self.store.flush()
    }

    /// REPORT LUNS told `nexus` the inventory: a pending REPORTED LUNS DATA HAS CHANGED
    /// has said what it had to and is cleared (SPC-5 6.37). A REPORT LUNS to this LU does
    /// it; the transport calls it for the target's other LUs.
    pub fn luns_reported(&self, nexus: Nexus) {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        if let Some(pending) = nexuses.get(&nexus) {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            q.retain(|s| *s != sense::REPORTED_LUNS_DATA_HAS_CHANGED);
        }
    }

    /// The target's inventory of LUs as `nexus` sees it has changed (a LUN added or
    /// removed): a REPORTED LUNS DATA HAS CHANGED unit attention for it (SPC-5 6.37),
    /// unless one is pending already. A nexus that has not used this LU yet gets its
    /// power-on unit attention first anyway.
    pub fn luns_changed(&self, nexus: Nexus) {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        if let Some(pending) = nexuses.get(&nexus) {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            if !q.contains(&sense::REPORTED_LUNS_DATA_HAS_CHANGED) {
                q.push_back(sense::REPORTED_LUNS_DATA_HAS_CHANGED);
            }
        }
    }

    /// LOGICAL UNIT RESET: mode parameters and medium removal prevention return to their
    /// defaults and every nexus gets a unit attention; a store that other targets export
    /// too tells them, so that their nexuses get it as well (this blocks until they have,
    /// or the store gave up: call it where blocking is allowed).
    pub fn reset(&self) {
        self.reset_here();
        if let Err(e) = self.store.announce_reset() {
            tracing::warn!(
                store = %self.store.description(),
                "the other targets exporting this LU may not have seen its reset: {e}"
            );
        }
    }

    /// Takes resets that other targets exporting the same store announce (see
    /// [`Backstore::on_peer_reset`]) as this LU's own, without announcing them again.
    pub fn listen_to_peers(self: &Arc<Self>) {
        self.listen_to_cluster();
        let lu = Arc::downgrade(self);
        self.store.on_peer_reset(Arc::new(move || {
            if let Some(lu) = lu.upgrade() {
                tracing::info!("logical unit reset announced by another target");
                lu.reset_here();
            }
        }));
    }

    /// For a logical unit that other targets export too (`LuConfig::peer_port_groups`):
    /// asks the store to keep the target port groups' states (`Backstore::port_groups`);
    /// from then on REPORT TARGET PORT GROUPS reports them, SET TARGET PORT GROUPS sets
    /// them, this target refuses what its own group's state does not serve, and every
    /// change raises ASYMMETRIC ACCESS STATE CHANGED on every nexus. A store that cannot
    /// keep them leaves the fixed answer (every group active/optimized).
    pub fn follow_port_groups(self: &Arc<Self>) -> io::Result<()> {
        if self.config.peer_port_groups.is_empty() || self.port_groups.get().is_some() {
            return Ok(());
        }
        let Some(groups) = self
            .store
            .port_groups(self.config.target_port_group, &self.config.peer_port_groups)?
        else {
            return Ok(());
        };
        let lu = Arc::downgrade(self);
        groups.on_change(Arc::new(move || {
            if let Some(lu) = lu.upgrade() {
                lu.queue_everywhere(sense::ASYMMETRIC_ACCESS_STATE_CHANGED);
            }
        }));
        let _ = self.port_groups.set(groups);
        Ok(())
    }

    /// Queues `ua` on every nexus that has not one pending already.
    fn queue_everywhere(&self, ua: Sense) {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for pending in nexuses.values() {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            if !q.contains(&ua) {
                q.push_back(ua);
            }
        }
    }

    /// This target's own group's asymmetric access state now.
    pub fn access_state(&self) -> AccessState {
        self.port_groups
            .get()
            .map_or(AccessState::ActiveOptimized, |g| g.own())
    }

    /// INQUIRY; its TPGS field says implicit and explicit ALUA (11b) where the store keeps
    /// the groups' states, implicit alone (01b) otherwise.
    fn inquiry(&self, cdb: &[u8]) -> Outcome {
        let mut d = inquiry::inquiry(cdb, &self.config, &self.limits)?;
        if cdb[1] & 0x01 == 0 && d.len() > 5 && self.port_groups.get().is_some() {
            d[5] |= 0x20;
        }
        Ok(d)
    }

    /// REPORT TARGET PORT GROUPS: this target's group, holding the one target port every
    /// nexus uses, and those of the other targets exporting the logical unit, in the order
    /// of their ids: the same answer from every target (the store's states, or all
    /// active/optimized).
    fn report_target_port_groups(&self, cdb: &[u8]) -> Outcome {
        let c = &self.config;
        let (groups, supported, transition_time) = match self.port_groups.get() {
            Some(g) => (g.states(), alua::GATEWAY_SUPPORTED, g.transition_time()),
            None => (
                alua::fixed_states(c.target_port_group, &c.peer_port_groups),
                alua::FIXED_SUPPORTED,
                0,
            ),
        };
        alua::report_target_port_groups(
            cdb,
            &alua::Report {
                groups: &groups,
                own_group: c.target_port_group,
                own_port: c.relative_port,
                supported,
                transition_time,
            },
        )
    }

    /// SET TARGET PORT GROUPS (SPC-4 6.43): the states, kept by the store for every target;
    /// every nexus but the one that asked gets ASYMMETRIC ACCESS STATE CHANGED.
    fn set_target_port_groups(&self, cmd: &Command) -> Outcome {
        let Some(groups) = self.port_groups.get() else {
            return Err(sense::INVALID_COMMAND_OPERATION_CODE);
        };
        let c = &self.config;
        let known: Vec<u16> = c
            .peer_port_groups
            .iter()
            .copied()
            .chain([c.target_port_group])
            .collect();
        let list_len = be32(&cmd.cdb[6..10]) as usize;
        let data = &cmd.data_out[..list_len.min(cmd.data_out.len())];
        if data.len() < list_len {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let changes = alua::parse_set_target_port_groups(data, &known)?;
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        if let Err(e) = groups.set(&changes) {
            tracing::warn!(
                store = %self.store.description(),
                "SET TARGET PORT GROUPS failed: {e}"
            );
            return Err(sense::SET_TARGET_PORT_GROUPS_COMMAND_FAILED);
        }
        // The change's own unit attention is not for the nexus that made it (SPC-4 5.16.2.6).
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        if let Some(pending) = nexuses.get(&cmd.nexus) {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            q.retain(|s| *s != sense::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
        Ok(Vec::new())
    }

    fn reset_here(&self) {
        *self.mode.write().unwrap_or_else(|e| e.into_inner()) = ModeState::default();
        self.prevent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for pending in nexuses.values() {
            let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
            q.clear();
            q.push_back(sense::POWER_ON_RESET);
        }
        drop(nexuses);
        self.pr().reset();
    }

    /// I_T nexus loss: forget the nexus; if it returns it starts afresh.
    pub fn nexus_lost(&self, nexus: Nexus) {
        self.nexuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
        self.fence.lost(nexus);
        self.pr().nexus_lost(nexus);
        self.prevent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&nexus);
        self.copies().retain(|(n, _), _| *n != nexus);
    }

    /// Bytes the initiator is to send for this CDB, or `None` if the CDB is not one this
    /// logical unit understands well enough to say.
    pub fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u32> {
        commands::data_out_len(cdb, block_size)
    }

    /// Runs one command that reaches no other logical unit (an EXTENDED COPY copies only
    /// within this one). Safe to call from many threads at once.
    pub fn execute(&self, cmd: &Command) -> Response {
        self.execute_abortable(cmd, &OnlyItself, &|| false)
    }

    /// Runs one command as the transport received it: `reach` finds the other logical
    /// units the command's I_T nexus may reach (EXTENDED COPY's copy targets), and
    /// `aborted` says when the transport has aborted it. Only a SANITIZE waiting for its
    /// operation looks at `aborted` (and stops waiting); every other command finishes as
    /// it would.
    pub fn execute_abortable(
        &self,
        cmd: &Command,
        reach: &dyn Reach,
        aborted: &dyn Fn() -> bool,
    ) -> Response {
        match self.run(&Call {
            cmd,
            reach,
            aborted,
        }) {
            Ok(data) => Response::good(data),
            Err(Fail::Check(s)) => Response::check_condition(&s),
            Err(Fail::Conflict) => Response {
                status: status::RESERVATION_CONFLICT,
                sense: None,
                data_in: Vec::new(),
            },
        }
    }

    /// The checks every command passes, in SAM-5's order, then its handler.
    fn run(&self, call: &Call<'_>) -> Result<Vec<u8>, Fail> {
        let cdb = call.cmd.cdb;
        if cdb.is_empty() {
            return Err(sense::INVALID_COMMAND_OPERATION_CODE.into());
        }
        cdb::check_len(cdb)?;
        let op = commands::offered(cdb, self.offer())?;
        self.register(call.cmd.nexus);
        self.refresh_capacity();
        if op.gate != Gate::None {
            if let Some(ua) = self.take_unit_attention(call.cmd.nexus) {
                return Err(ua.into());
            }
            if self.sanitizer.running() {
                return Err(self.sanitizer.in_progress().into());
            }
        }
        if let Some(groups) = self.port_groups.get() {
            alua::serves(groups.own(), cdb)?;
        }
        self.check_reservations(call.cmd.nexus, op.access)?;
        // Held until the handler has changed the medium.
        let _pass = if op.class == Class::Write || matches!(cdb[0], UNMAP | SANITIZE) {
            Some(self.check_fence(call.cmd.nexus)?)
        } else {
            None
        };
        if op.gate == Gate::Medium {
            self.medium_present()?;
        }
        (op.run)(self, call)
    }

    fn persistent_out(&self, cmd: &Command, reach: &dyn Reach) -> Result<Vec<u8>, Fail> {
        if self.cluster.is_some() {
            return self.persistent_out_cluster(cmd, reach);
        }
        let ptpl = self.config.pr_file.is_some();
        let mut pr = self.pr();
        let admits = |initiator: &str| reach.admits(initiator, self);
        let event = pr.persistent_out(cmd.nexus, cmd.cdb, cmd.data_out, ptpl, &admits)?;
        if let Some(path) = &self.config.pr_file {
            let result = if pr.aptpl() {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, pr.save()).and_then(|_| std::fs::rename(&tmp, path))
            } else {
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, path = %path.display(), "keeping reservations");
            }
        }
        // Not under the lock: a task being aborted may be about to take it.
        drop(pr);
        self.apply_event(event);
        Ok(Vec::new())
    }

    /// Queues reservation unit attentions for every nexus of the named initiator ports.
    fn notify(&self, pr: &Reservations, notices: Notices) {
        if notices.is_empty() {
            return;
        }
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        for (port, s) in notices {
            for n in pr.nexuses_of(&port) {
                if let Some(q) = nexuses.get(&n) {
                    q.lock().unwrap_or_else(|e| e.into_inner()).push_back(s);
                }
            }
        }
    }

    fn register(&self, nexus: Nexus) {
        if self
            .nexuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&nexus)
        {
            return;
        }
        self.nexuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(nexus)
            .or_insert_with(|| Mutex::new(VecDeque::from([sense::POWER_ON_RESET])));
    }

    fn take_unit_attention(&self, nexus: Nexus) -> Option<Sense> {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        let pending = nexuses.get(&nexus)?;
        let mut q = pending.lock().unwrap_or_else(|e| e.into_inner());
        q.pop_front()
    }

    fn medium_present(&self) -> Result<(), Sense> {
        if self.no_medium.load(Ordering::Acquire) {
            Err(sense::MEDIUM_NOT_PRESENT)
        } else {
            Ok(())
        }
    }

    fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.capacity_blocks() => Ok(()),
            _ => Err(sense::LBA_OUT_OF_RANGE),
        }
    }

    /// Where the transfer length lives in a block command's CDB, for field pointers.
    fn length_field(cdb: &[u8]) -> u16 {
        match cdb.len() {
            6 => 4,
            10 => 7,
            12 => 6,
            _ => 10,
        }
    }

    fn check_transfer(&self, cdb: &[u8], blocks: u64) -> Result<(), Sense> {
        if blocks > self.limits.max_transfer as u64 {
            Err(Sense::invalid_field_in_cdb(Self::length_field(cdb), None))
        } else {
            Ok(())
        }
    }

    fn check_writable(&self) -> Result<(), Sense> {
        if self.config.read_only || self.mode.read().unwrap_or_else(|e| e.into_inner()).swp {
            Err(sense::WRITE_PROTECTED)
        } else {
            Ok(())
        }
    }

    fn write_through(&self, fua: bool) -> Result<(), Sense> {
        let wce = self.mode.read().unwrap_or_else(|e| e.into_inner()).wce;
        if fua || !wce {
            self.store
                .flush()
                .map_err(|e| self.io_error(e, sense::WRITE_ERROR))?;
        }
        Ok(())
    }

    fn io_error(&self, e: io::Error, s: Sense) -> Sense {
        tracing::warn!(error = %e, "backstore I/O error");
        s
    }

    fn data<'d>(&self, data_out: &'d [u8], len: u64) -> Result<&'d [u8], Sense> {
        data_out
            .get(..len as usize)
            .ok_or(sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT)
    }

    /// Locks blocks `[lba, lba + blocks)` for a write, once no other command uses them.
    fn lock_range(&self, lba: u64, blocks: u64) -> RangeGuard {
        self.locks
            .lock(lba, lba.saturating_add(blocks.max(1)), true)
    }

    /// The same blocks, shared, for a read.
    fn lock_range_shared(&self, lba: u64, blocks: u64) -> RangeGuard {
        self.locks
            .lock(lba, lba.saturating_add(blocks.max(1)), false)
    }

    fn read_capacity_10(&self, cdb: &[u8]) -> Outcome {
        if cdb[8] & 0x01 == 0 && be32(&cdb[2..6]) != 0 {
            return Err(Sense::invalid_field_in_cdb(2, None));
        }
        let last = self.capacity_blocks().saturating_sub(1).min(0xffff_ffff) as u32;
        let mut d = last.to_be_bytes().to_vec();
        d.extend_from_slice(&(self.block_size as u32).to_be_bytes());
        Ok(d)
    }

    fn read_capacity_16(&self, cdb: &[u8]) -> Outcome {
        let alloc = be32(&cdb[10..14]) as usize;
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&self.capacity_blocks().saturating_sub(1).to_be_bytes());
        d[8..12].copy_from_slice(&(self.block_size as u32).to_be_bytes());
        d[13] = self.config.physical_block_exponent & 0x0f;
        if self.config.thin {
            d[14] = 0x80 | 0x40; // LBPME, LBPRZ
        }
        Ok(truncate(d, alloc))
    }

    fn request_sense(&self, cdb: &[u8], nexus: Nexus) -> Outcome {
        let desc = cdb[1] & 0x01 != 0;
        let alloc = cdb[4] as usize;
        let s = self
            .take_unit_attention(nexus)
            .or_else(|| {
                self.sanitizer
                    .running()
                    .then(|| self.sanitizer.in_progress())
            })
            .or_else(|| self.medium_present().err())
            .unwrap_or(sense::NO_SENSE);
        let data = if desc { s.descriptor() } else { s.fixed() };
        Ok(truncate(data, alloc))
    }

    fn mode_select(&self, cmd: &Command) -> Outcome {
        let mut state = self.mode.write().unwrap_or_else(|e| e.into_inner());
        let new = mode::mode_select(cmd.cdb, cmd.data_out, &state, self.block_size as u32)?;
        if new != *state {
            *state = new;
            drop(state);
            let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
            for (n, pending) in nexuses.iter() {
                if *n != cmd.nexus {
                    pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(sense::MODE_PARAMETERS_CHANGED);
                }
            }
        }
        Ok(Vec::new())
    }

    fn mode_sense(&self, cdb: &[u8]) -> Outcome {
        let state = *self.mode.read().unwrap_or_else(|e| e.into_inner());
        let dev = mode::Device {
            write_protected: self.config.read_only || state.swp,
            capacity: self.capacity_blocks(),
            block_size: self.block_size as u32,
        };
        mode::mode_sense(cdb, &state, &dev)
    }

    fn start_stop(&self, cdb: &[u8]) -> Outcome {
        let power_condition = cdb[4] >> 4;
        let no_flush = cdb[4] & 0x04 != 0;
        let loej = cdb[4] & 0x02 != 0;
        let start = cdb[4] & 0x01 != 0;
        // A power condition change leaves START and LOEJ unused (SBC-4 5.25); there are no
        // power conditions to enter here.
        if power_condition != 0 {
            return Ok(Vec::new());
        }
        if !start && !no_flush {
            self.store
                .flush()
                .map_err(|e| self.io_error(e, sense::WRITE_ERROR))?;
        }
        if loej && self.config.removable {
            if !self
                .prevent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
            {
                return Err(sense::MEDIUM_REMOVAL_PREVENTED);
            }
            self.no_medium.store(!start, Ordering::Release);
        }
        Ok(Vec::new())
    }

    /// SEND DIAGNOSTIC (SPC-5 6.42). The default self-test (SELFTEST one), which every
    /// device server that has the command must offer, reads the first and the last block
    /// back from the store: the path every command takes. The other self-tests report
    /// through the Self-Test Results log page, which this logical unit does not keep, and
    /// it has no diagnostic page to take: refused as the fields that ask for them.
    fn send_diagnostic(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let selftest = cdb[1] & 0x04 != 0;
        let len = be16(&cdb[3..5]);
        if cdb[1] >> 5 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        if selftest && len != 0 {
            return Err(Sense::invalid_field_in_cdb(3, None));
        }
        if !self.data(data_out, len.into())?.is_empty() {
            // The page code of a diagnostic page this logical unit does not support.
            return Err(Sense::invalid_field_in_parameter_list(0, None));
        }
        if !selftest {
            // No self-test and no page asked for: nothing to do, and no error (SPC-5).
            return Ok(Vec::new());
        }
        if let Some(last) = self.capacity_blocks().checked_sub(1) {
            for lba in [0, last] {
                let _guard = self.lock_range_shared(lba, 1);
                self.read_blocks(lba, 1)
                    .map_err(|_| sense::LOGICAL_UNIT_FAILED_SELF_TEST)?;
            }
        }
        Ok(Vec::new())
    }

    /// PRE-FETCH (10, 16): the blocks must exist; there is no cache of ours to fill.
    fn pre_fetch(&self, cdb: &[u8]) -> Outcome {
        let r = block_range(cdb);
        self.check_range(r.lba, r.blocks)?;
        Ok(Vec::new())
    }

    fn prevent_allow(&self, cdb: &[u8], nexus: Nexus) -> Outcome {
        let prevent = cdb[4] & 0x03;
        if prevent > 1 {
            return Err(Sense::invalid_field_in_cdb(4, Some(1)));
        }
        if !self.config.removable {
            // Nothing can be removed; prevention is trivially honoured.
            return Ok(Vec::new());
        }
        let mut set = self.prevent.lock().unwrap_or_else(|e| e.into_inner());
        if prevent == 1 {
            set.insert(nexus);
        } else {
            set.remove(&nexus);
        }
        Ok(Vec::new())
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a.max(1), b.max(1));
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a.max(1) / x * b.max(1)
}

fn read_defect_data(cdb: &[u8]) -> Outcome {
    let (format_byte, alloc) = if cdb[0] == READ_DEFECT_DATA_10 {
        (cdb[2], be16(&cdb[7..9]) as usize)
    } else {
        (cdb[1], be32(&cdb[6..10]) as usize)
    };
    // Echo the requested lists and format, with no defects in them.
    let flags = format_byte & 0x1f;
    let data = if cdb[0] == READ_DEFECT_DATA_10 {
        vec![0, flags, 0, 0]
    } else {
        vec![0, flags, 0, 0, 0, 0, 0, 0]
    };
    Ok(truncate(data, alloc))
}

/// READ MEDIA SERIAL NUMBER (SPC-5): a store has no medium serial number, and a medium
/// without one answers a MEDIA SERIAL NUMBER LENGTH of zero and nothing after it. (A
/// missing medium is NOT READY, MEDIUM NOT PRESENT: the row's gate.)
pub(crate) fn read_media_serial_number(cdb: &[u8]) -> Outcome {
    let alloc = be32(&cdb[6..10]) as usize;
    Ok(truncate(vec![0; 4], alloc))
}

pub(crate) fn report_luns(luns: &[u16], cdb: &[u8]) -> Outcome {
    if cdb.len() < 12 {
        return Err(Sense::invalid_field_in_cdb(0, None));
    }
    let alloc = be32(&cdb[6..10]) as usize;
    let list: Vec<u16> = match cdb[2] {
        0x00 | 0x02 => luns.to_vec(),
        0x01 | 0x10 | 0x11 => Vec::new(),
        0x12 => luns.iter().copied().filter(|&l| l == 0).collect(),
        _ => return Err(Sense::invalid_field_in_cdb(2, None)),
    };
    let mut data = ((list.len() * 8) as u32).to_be_bytes().to_vec();
    data.extend_from_slice(&[0; 4]);
    for l in list {
        data.extend_from_slice(&scsi_proto::lun::to_wire(l).to_be_bytes());
    }
    Ok(truncate(data, alloc))
}

pub(crate) fn lun_not_supported(cdb: &[u8]) -> Outcome {
    cdb::check_len(cdb)?;
    match cdb[0] {
        INQUIRY => inquiry::not_supported(cdb),
        REQUEST_SENSE => {
            let s = sense::LOGICAL_UNIT_NOT_SUPPORTED;
            let data = if cdb[1] & 0x01 != 0 {
                s.descriptor()
            } else {
                s.fixed()
            };
            Ok(truncate(data, cdb[4] as usize))
        }
        REPORT_LUNS => report_luns(&[], cdb),
        _ => Err(sense::LOGICAL_UNIT_NOT_SUPPORTED),
    }
}
