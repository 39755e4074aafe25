//! What every connection of a running target sees: the configuration, the target nodes
//! and bound portals, the session table, and the count of commands in flight that a
//! shutdown waits for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use scsi::Nexus;
use tokio::sync::{watch, Notify};

use crate::config::Config;
use crate::cores::Cores;
use crate::node::{LunStore, TargetNode};
use crate::session::Session;

/// One of the connections `Shared::open_connection` counts, until dropped.
pub(crate) struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// State every connection sees.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) targets: Vec<Arc<TargetNode>>,
    /// Addresses actually bound (port 0 resolved).
    pub(crate) portals: Vec<SocketAddr>,
    sessions: Mutex<HashMap<u16, Arc<Session>>>,
    next_tsih: Mutex<u16>,
    nexus_ids: Mutex<HashMap<(String, [u8; 6]), u64>>,
    shutdown: watch::Receiver<bool>,
    /// Commands executing anywhere; shutdown waits for them.
    inflight: AtomicUsize,
    /// TCP connections held, logged in or not (`max_open_connections`).
    open_connections: AtomicUsize,
    idle: Notify,
    /// The threads connections run on; `None`: the runtime's shared scheduler.
    pub(crate) cores: Option<Cores>,
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        targets: Vec<Arc<TargetNode>>,
        portals: Vec<SocketAddr>,
        shutdown: watch::Receiver<bool>,
        cores: Option<Cores>,
    ) -> Shared {
        Shared {
            config,
            targets,
            portals,
            sessions: Mutex::new(HashMap::new()),
            next_tsih: Mutex::new(1),
            nexus_ids: Mutex::new(HashMap::new()),
            shutdown,
            inflight: AtomicUsize::new(0),
            open_connections: AtomicUsize::new(0),
            idle: Notify::new(),
            cores,
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

    pub(crate) fn find_target(&self, name: &str) -> Option<Arc<TargetNode>> {
        self.targets
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
                    && match (&s.target, target) {
                        (Some(t), Some(n)) => t.iqn.eq_ignore_ascii_case(n),
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

    /// Ends a session: for its logical units that is the loss of its I_T nexus.
    pub(crate) fn remove_session(&self, tsih: u16) {
        let gone = self.sessions.lock().unwrap().remove(&tsih);
        if let Some(target) = gone.as_ref().and_then(|s| s.target.as_ref()) {
            let nexus = gone.as_ref().expect("checked").nexus;
            for lu in target.luns.values() {
                lu.nexus_lost(nexus);
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

    pub(crate) fn all_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().unwrap().values().cloned().collect()
    }

    /// The same initiator port keeps its I_T nexus id across sessions, so unit attentions
    /// and (later) reservations follow the initiator port, not the TCP connection.
    pub(crate) fn nexus(&self, initiator: &str, isid: [u8; 6]) -> Nexus {
        let mut ids = self.nexus_ids.lock().unwrap();
        let n = ids.len() as u64 + 1;
        let nexus = Nexus(
            *ids.entry((initiator.to_ascii_lowercase(), isid))
                .or_insert(n),
        );
        if nexus.0 == n {
            // Persistent reservations know initiator ports by their iSCSI initiator port
            // name, "<name>,i,0x<ISID>" (SPC-5 7.6.4.6).
            let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
            let port = format!("{initiator},i,0x{isid_hex}");
            for t in &self.targets {
                for lu in t.luns.values() {
                    lu.name_nexus(nexus, &port);
                }
            }
        }
        nexus
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

    pub(crate) fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}
