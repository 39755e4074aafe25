//! What every connection of a running target sees: the configuration, the target nodes
//! (replaced whole by a configuration reload) and bound portals, the session table, and
//! the count of commands in flight that a shutdown waits for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use scsi::{LogicalUnit, Nexus};
use tokio::sync::{watch, Notify};
use tracing::info;

use crate::config::{Chap, Config};
use crate::cores::Cores;
use crate::node::{LunStore, TargetNode};
use crate::session::{ConnEvent, Session};
use crate::stats::Events;

/// Whether a target of `live` has `lu`.
fn holds(live: &Live, lu: &Arc<LogicalUnit>) -> bool {
    live.targets
        .iter()
        .any(|t| t.luns.values().any(|x| Arc::ptr_eq(x, lu)))
}

/// One of the connections `Shared::open_connection` counts, until dropped.
pub(crate) struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a configuration reload replaces while the target runs: the target nodes (with
/// their LUNs and access rules) and discovery's CHAP. Everything else in
/// [`Shared::config`] stays as the target started.
pub(crate) struct Live {
    pub(crate) targets: Vec<Arc<TargetNode>>,
    pub(crate) discovery_chap: Option<Chap>,
}

/// A logical unit that a reload took out of the configuration.
pub(crate) struct Dropped {
    pub(crate) target: String,
    pub(crate) lun: u16,
    pub(crate) lu: Arc<LogicalUnit>,
}

/// An initiator port: its name (lower case) and ISID. Each has a nexus id, and a port
/// name as reservations know it.
type InitiatorPort = (String, [u8; 6]);

/// State every connection sees.
pub(crate) struct Shared {
    /// The configuration the target started with; its targets and discovery CHAP are
    /// [`Shared::live`]'s.
    pub(crate) config: Config,
    live: RwLock<Arc<Live>>,
    /// Addresses actually bound (port 0 resolved).
    pub(crate) portals: Vec<SocketAddr>,
    sessions: Mutex<HashMap<u16, Arc<Session>>>,
    next_tsih: Mutex<u16>,
    nexus_ids: Mutex<HashMap<InitiatorPort, (Nexus, String)>>,
    shutdown: watch::Receiver<bool>,
    /// Commands executing anywhere; shutdown waits for them.
    inflight: AtomicUsize,
    /// TCP connections held, logged in or not (`max_open_connections`).
    open_connections: AtomicUsize,
    idle: Notify,
    /// The threads connections run on; `None`: the runtime's shared scheduler.
    pub(crate) cores: Option<Cores>,
    /// What `/metrics` counts for the whole target (counted with or without it).
    pub(crate) events: Events,
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        targets: Vec<Arc<TargetNode>>,
        portals: Vec<SocketAddr>,
        shutdown: watch::Receiver<bool>,
        cores: Option<Cores>,
    ) -> Shared {
        let live = Live {
            targets,
            discovery_chap: config.discovery.chap.clone(),
        };
        Shared {
            config,
            live: RwLock::new(Arc::new(live)),
            portals,
            sessions: Mutex::new(HashMap::new()),
            next_tsih: Mutex::new(1),
            nexus_ids: Mutex::new(HashMap::new()),
            shutdown,
            inflight: AtomicUsize::new(0),
            open_connections: AtomicUsize::new(0),
            idle: Notify::new(),
            cores,
            events: Events::new(),
        }
    }

    /// The configured address of the portal a connection came in at, by the local
    /// address it reached (the bound one: port 0 resolved, a wildcard address served).
    pub(crate) fn configured_portal(&self, local: SocketAddr) -> Option<SocketAddr> {
        self.portals
            .iter()
            .zip(&self.config.portals)
            .find(|(bound, _)| {
                **bound == local || (bound.ip().is_unspecified() && bound.port() == local.port())
            })
            .map(|(_, p)| p.listen)
    }

    /// The targets and discovery CHAP in force now.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn find_target(&self, name: &str) -> Option<Arc<TargetNode>> {
        self.live()
            .targets
            .iter()
            .find(|t| t.iqn.eq_ignore_ascii_case(name))
            .cloned()
    }

    pub(crate) fn lun_store(&self, target: &str, lun: u16) -> Option<LunStore> {
        self.find_target(target)?.lun_store(lun).cloned()
    }

    pub(crate) fn session(&self, tsih: u16) -> Option<Arc<Session>> {
        self.sessions.lock().unwrap().get(&tsih).cloned()
    }

    /// Sessions of the same initiator port (name + ISID) to the same target: candidates for
    /// reinstatement (RFC 7143 6.3.5).
    pub(crate) fn sessions_of(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
    ) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .unwrap()
            .values()
            .filter(|s| {
                s.isid == isid
                    && s.initiator.eq_ignore_ascii_case(initiator)
                    && match (s.target_name(), target) {
                        (Some(t), Some(n)) => t.eq_ignore_ascii_case(n),
                        (None, None) => true,
                        _ => false,
                    }
            })
            .cloned()
            .collect()
    }

    /// Allocates a TSIH (never 0) and registers the session built with it.
    pub(crate) fn add_session(&self, build: impl FnOnce(u16) -> Session) -> Arc<Session> {
        let mut sessions = self.sessions.lock().unwrap();
        let mut next = self.next_tsih.lock().unwrap();
        let tsih = loop {
            let t = *next;
            *next = next.wrapping_add(1).max(1);
            if t != 0 && !sessions.contains_key(&t) {
                break t;
            }
        };
        let s = Arc::new(build(tsih));
        sessions.insert(tsih, s.clone());
        s
    }

    /// Gives every logical unit of `live` this target's way to abort the tasks of I_T
    /// nexuses (`LogicalUnit::on_abort_tasks`), which PREEMPT AND ABORT uses; a unit
    /// that has one keeps it.
    pub(crate) fn lend_aborter(self: &Arc<Self>, live: &Live) {
        for lu in live.targets.iter().flat_map(|t| t.luns.values()) {
            let shared = Arc::downgrade(self);
            lu.on_abort_tasks(Arc::new(move |lu: &LogicalUnit, nexuses: &[Nexus]| {
                shared
                    .upgrade()
                    .map_or_else(Vec::new, |s| s.abort_tasks_of(lu, nexuses))
            }));
        }
    }

    /// PREEMPT AND ABORT's edge: aborts every task that sessions of `nexuses` have on
    /// `lu` as ABORT TASK SET does (`conn/tmf.rs`): one not yet running is dropped by its
    /// connection, one running finishes with its answer suppressed, and this returns only
    /// once those have finished, so that none of them changes the medium afterwards.
    /// Blocks: called from a blocking worker (the PERSISTENT RESERVE OUT) or the
    /// cluster's notification thread, never from a connection's task. Returns the nexuses
    /// that had a task aborted.
    pub(crate) fn abort_tasks_of(&self, lu: &LogicalUnit, nexuses: &[Nexus]) -> Vec<Nexus> {
        let mut hit = Vec::new();
        let mut running = Vec::new();
        for s in self.all_sessions() {
            if !nexuses.contains(&s.nexus) {
                continue;
            }
            let Some(view) = s.target() else { continue };
            for (lun, _) in view
                .luns
                .iter()
                .filter(|(_, l)| std::ptr::eq(Arc::as_ptr(l), lu))
            {
                for (itt, cid, ctl) in s.tasks_on(Some(*lun)) {
                    // False: it answered already, so its change (if any) is done.
                    if !ctl.abort() {
                        continue;
                    }
                    if !hit.contains(&s.nexus) {
                        hit.push(s.nexus);
                    }
                    // Paired with `TaskCtl::start`: either the task sees itself aborted
                    // before it runs, or it is seen running here and waited for.
                    if ctl.running() {
                        running.push(ctl);
                    } else {
                        s.send_to(cid, ConnEvent::Abort(itt));
                    }
                }
            }
        }
        for ctl in running {
            ctl.wait_finished();
        }
        hit
    }

    /// Ends a session: for its logical units that is the loss of its I_T nexus.
    pub(crate) fn remove_session(&self, tsih: u16) {
        let gone = self.sessions.lock().unwrap().remove(&tsih);
        if let Some(s) = gone {
            for lu in s.target().iter().flat_map(|t| t.luns.values()) {
                lu.nexus_lost(s.nexus);
            }
        }
    }

    pub(crate) fn session_count(&self) -> usize {
        self.sessions.lock().unwrap().len()
    }

    /// Counts a connection as open unless `max_open_connections` are; the guard counts it
    /// closed when dropped.
    pub(crate) fn open_connection(self: &Arc<Self>) -> Result<OpenConnection, usize> {
        let max = self.config.session.max_open_connections;
        let n = self.open_connections.fetch_add(1, Ordering::AcqRel);
        if n >= max {
            self.open_connections.fetch_sub(1, Ordering::AcqRel);
            return Err(n);
        }
        Ok(OpenConnection(self.clone()))
    }

    /// TCP connections open at the portals, logged in or not.
    pub(crate) fn open_connection_count(&self) -> usize {
        self.open_connections.load(Ordering::Acquire)
    }

    pub(crate) fn all_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().unwrap().values().cloned().collect()
    }

    /// The same initiator port keeps its I_T nexus id across sessions, so unit attentions
    /// and (later) reservations follow the initiator port, not the TCP connection.
    pub(crate) fn nexus(&self, initiator: &str, isid: [u8; 6]) -> Nexus {
        let mut ids = self.nexus_ids.lock().unwrap();
        let key = (initiator.to_ascii_lowercase(), isid);
        if let Some((nexus, _)) = ids.get(&key) {
            return *nexus;
        }
        let nexus = Nexus(ids.len() as u64 + 1);
        // Persistent reservations know initiator ports by their iSCSI initiator port
        // name, "<name>,i,0x<ISID>" (SPC-5 7.6.4.6).
        let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
        let port = format!("{initiator},i,0x{isid_hex}");
        // Under the lock: a reload names the known nexuses on the LUs it adds under it.
        for t in &self.live().targets {
            for lu in t.luns.values() {
                lu.name_nexus(nexus, &port);
            }
        }
        ids.insert(key, (nexus, port));
        nexus
    }

    /// Puts `live` in force (a configuration reload): new logins and discovery see it at
    /// once. Each session's view of its target follows, and where the LUNs it sees
    /// changed its LUs get a REPORTED LUNS DATA HAS CHANGED unit attention (SPC-5
    /// 6.37); the sessions of a target no longer configured are closed, as a target
    /// cold reset closes them. Returns the LUs no target holds any more, to flush.
    pub(crate) fn replace_live(&self, live: Live) -> Vec<Dropped> {
        let old = {
            let ids = self.nexus_ids.lock().unwrap();
            let was = self.live();
            for lu in live.targets.iter().flat_map(|t| t.luns.values()) {
                if !holds(&was, lu) {
                    for (nexus, port) in ids.values() {
                        lu.name_nexus(*nexus, port);
                    }
                }
            }
            std::mem::replace(
                &mut *self.live.write().unwrap_or_else(|e| e.into_inner()),
                Arc::new(live),
            )
        };
        let now = self.live();
        for s in self.all_sessions() {
            let Some(seen) = s.target() else { continue };
            let Some(node) = now
                .targets
                .iter()
                .find(|t| t.iqn.eq_ignore_ascii_case(&seen.iqn))
            else {
                info!(
                    "session {} of {}: target {} removed from the configuration; closing it",
                    s.tsih, s.initiator, seen.iqn
                );
                s.close();
                s.broadcast(|| ConnEvent::Close("target removed from the configuration"));
                self.remove_session(s.tsih);
                continue;
            };
            // An initiator the new rules do not admit would otherwise see the whole
            // target, as one without a LUN list does.
            if !node.allows(&s.initiator) {
                info!(
                    "session {} of {}: initiator no longer admitted to target {}; closing it",
                    s.tsih, s.initiator, node.iqn
                );
                s.close();
                s.broadcast(|| ConnEvent::Close("initiator no longer admitted to the target"));
                self.remove_session(s.tsih);
                continue;
            }
            let view = node.view_of(&s.initiator);
            let same = view.luns.len() == seen.luns.len()
                && view
                    .luns
                    .iter()
                    .zip(&seen.luns)
                    .all(|((a, x), (b, y))| a == b && Arc::ptr_eq(x, y));
            s.set_target(view.clone());
            if !same {
                info!(
                    "session {} of {}: target {} now has LUNs {:?}; unit attention \
                     REPORTED LUNS DATA HAS CHANGED",
                    s.tsih,
                    s.initiator,
                    view.iqn,
                    view.lun_ids()
                );
                for lu in view.luns.values() {
                    lu.luns_changed(s.nexus);
                }
            }
        }
        let mut dropped = Vec::new();
        for t in &old.targets {
            for (&lun, lu) in &t.luns {
                if !holds(&now, lu) {
                    dropped.push(Dropped {
                        target: t.iqn.clone(),
                        lun,
                        lu: lu.clone(),
                    });
                }
            }
        }
        dropped
    }

    pub(crate) fn task_started(&self) {
        self.inflight.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn task_finished(&self) {
        if self.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    pub(crate) async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.inflight.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// One line for the service manager's status: what is served.
    pub(crate) fn status(&self) -> String {
        let live = self.live();
        let luns: usize = live.targets.iter().map(|t| t.luns.len()).sum();
        format!(
            "serving {} target(s), {luns} LUN(s); {} session(s)",
            live.targets.len(),
            self.session_count()
        )
    }

    /// Whether the threads that serve connections each run a task within `within`
    /// (without connection threads of its own, the runtime that asks serves them).
    pub(crate) async fn serving(&self, within: std::time::Duration) -> bool {
        match &self.cores {
            Some(cores) => cores.alive(within).await,
            None => true,
        }
    }

    pub(crate) fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}
