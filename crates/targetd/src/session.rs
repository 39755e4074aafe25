//! A session: its identity, negotiated parameters, the CmdSN window shared by all of its
//! connections, and the registry of its tasks (for task management across connections).

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use iscsi::ffp::CmdOrder;
use iscsi::negotiate::{ConnectionParams, SessionParams};
use iscsi::pdu::Pdu;
use scsi::{Designator, LogicalUnit, Nexus, Reach};
use tokio::sync::mpsc;

use crate::node::TargetNode;
use crate::tags::TagMap;
use crate::task::{TaskCtl, TaskRec};

mod recovery;
pub(crate) use recovery::Reassigned;
pub use recovery::{exp_statsn, status_of};

/// Something a connection must do that another connection (or the server) decided.
#[derive(Debug)]
pub enum ConnEvent {
    /// A command of this connection has become next in CmdSN order.
    Deliver(Ordered),
    /// Stop this task (TMF from elsewhere).
    Abort(u32),
    /// Close the connection (reinstatement, session logout, cold reset, shutdown).
    Close(&'static str),
    /// Ask the initiator to log out within this many seconds (target shutdown, an
    /// administrator's drop): Async Message event 1.
    RequestLogout(u16),
    /// Close the connection but keep its tasks for reassignment (ERL 2: logout for
    /// recovery, or its CID logging in again).
    Recover,
    /// Send these PDUs: the answer of a task reassigned to this connection.
    Send(Vec<Pdu>),
}

/// A non-immediate PDU waiting for its turn in CmdSN order.
#[derive(Debug, PartialEq)]
pub enum Ordered {
    /// A SCSI command whose task state lives in the owning connection, keyed by ITT.
    Scsi(u32),
    /// Any other command (NOP-Out, Text, Task Management, Logout).
    Pdu(Box<Pdu>),
}

#[derive(Clone, Debug)]
pub struct ConnHandle {
    pub events: mpsc::UnboundedSender<ConnEvent>,
    pub info: Arc<ConnInfo>,
}

/// Bytes a connection (or a session, over all its connections, ended ones included) took
/// off its transport and put on it: PDUs whole, headers and digests included; over TLS,
/// the plaintext. Counted once per socket read and per batch written.
#[derive(Debug, Default)]
pub struct ByteCounts {
    pub received: AtomicU64,
    pub sent: AtomicU64,
}

impl ByteCounts {
    /// (received, sent).
    pub fn get(&self) -> (u64, u64) {
        (
            self.received.load(Ordering::Relaxed),
            self.sent.load(Ordering::Relaxed),
        )
    }
}

/// A connection as a status snapshot shows it: what its login settled, and its bytes.
#[derive(Debug)]
pub struct ConnInfo {
    pub cid: u16,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The TLS summary (version, cipher suite); `None`: plain TCP.
    pub tls: Option<String>,
    pub params: ConnectionParams,
    pub since: Instant,
    pub bytes: ByteCounts,
    /// The session's counts, which every byte of the connection adds to as well.
    session_bytes: Arc<ByteCounts>,
    /// A duplicate of the connection's TCP socket, from which a status snapshot reads
    /// TCP_INFO on its own thread (getsockopt beside the connection's reads and writes is
    /// safe), without a message to the connection and a wait behind its I/O. Held, the
    /// descriptor cannot be closed and its number given to another socket; taken out and
    /// closed as the connection ends ([`ConnInfo::release_socket`]), so that it keeps no
    /// ended connection's socket open. `None`: no TCP socket (an in-memory carrier), or
    /// released.
    socket: Mutex<Option<OwnedFd>>,
}

impl ConnInfo {
    pub fn new(
        session: &Session,
        cid: u16,
        (local, remote): (SocketAddr, SocketAddr),
        tls: Option<String>,
        params: ConnectionParams,
    ) -> ConnInfo {
        ConnInfo {
            cid,
            local,
            remote,
            tls,
            params,
            since: Instant::now(),
            bytes: ByteCounts::default(),
            session_bytes: session.bytes.clone(),
            socket: Mutex::new(None),
        }
    }

    /// With `socket`, a duplicate of the connection's TCP socket's descriptor, for
    /// [`ConnInfo::tcp_info`].
    pub fn with_socket(self, socket: Option<OwnedFd>) -> ConnInfo {
        ConnInfo {
            socket: Mutex::new(socket),
            ..self
        }
    }

    /// The path as the connection's TCP socket sees it now; `None` without a socket (an
    /// in-memory carrier, or the connection has ended) or when the kernel refuses.
    pub fn tcp_info(&self) -> Option<net::TcpInfo> {
        // Held while the kernel answers: a release waits for it, so that no read of the
        // descriptor comes after the connection has let it go.
        let socket = self.socket.lock().unwrap_or_else(|e| e.into_inner());
        net::tcp_info(socket.as_ref()?).ok()
    }

    /// Closes the duplicate of the connection's socket, once the connection has ended:
    /// the socket's last descriptor is then the connection's own, and its close sends
    /// FIN at once. Later [`ConnInfo::tcp_info`] calls answer `None`.
    pub fn release_socket(&self) {
        let socket = self.socket.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(socket);
    }

    /// Counts `n` bytes read off the transport.
    pub fn received(&self, n: usize) {
        self.bytes.received.fetch_add(n as u64, Ordering::Relaxed);
        self.session_bytes
            .received
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes written to the transport.
    pub fn sent(&self, n: usize) {
        self.bytes.sent.fetch_add(n as u64, Ordering::Relaxed);
        self.session_bytes
            .sent
            .fetch_add(n as u64, Ordering::Relaxed);
    }
}

pub use iscsi::ffp::OrderError;

pub struct Session {
    pub tsih: u16,
    pub isid: [u8; 6],
    pub initiator: String,
    /// The target as this session's initiator sees it (LUN masking applied); a
    /// configuration reload replaces it when the target's LUNs change. `None`: discovery.
    target: Option<RwLock<Arc<TargetNode>>>,
    /// Whether a LUN of `target` lends memory (`LogicalUnit::lends_memory`), kept with it.
    lends: AtomicBool,
    pub params: SessionParams,
    pub nexus: Nexus,
    queue_depth: u32,
    /// Mirrors of the window for stamping outgoing PDUs without taking the lock.
    exp_cmdsn: AtomicU32,
    /// The connection thread (`crate::cores`) of its leading connection, where the others
    /// go too; `usize::MAX`: none (the runtime's shared scheduler).
    home: AtomicUsize,
    /// When the session's leading login made it, on the monotonic clock and the wall's.
    pub since: (Instant, SystemTime),
    /// Bytes over all of its connections, those gone included.
    pub bytes: Arc<ByteCounts>,
    /// Whether it ended by a Logout (of the session, or of its last connection), not by
    /// its connections closing or being closed.
    logged_out: AtomicBool,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The session's CmdSN order; what waits there carries its connection's CID.
    order: CmdOrder<(u16, Ordered)>,
    conns: TagMap<u16, ConnHandle>,
    tasks: TagMap<u32, TaskRec>,
    closed: bool,
    retained: recovery::Retained,
}

/// What a command of this session may reach beyond its own LU (EXTENDED COPY's copy
/// targets): the LUs of the session's view of its target as it is at each call, so a
/// reload that masks a LUN stops a copy that was running to or from it.
impl Reach for Session {
    fn find(&self, designator: &Designator) -> Option<Arc<LogicalUnit>> {
        self.target()?.find(designator)
    }

    fn admits(&self, initiator: &str, lu: &LogicalUnit) -> bool {
        self.target().is_some_and(|t| t.admits(initiator, lu))
    }
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tsih: u16,
        isid: [u8; 6],
        initiator: String,
        target: Option<Arc<TargetNode>>,
        params: SessionParams,
        nexus: Nexus,
        queue_depth: u32,
        first_cmdsn: u32,
    ) -> Session {
        Session {
            tsih,
            isid,
            initiator,
            lends: AtomicBool::new(lends_memory(target.as_deref())),
            target: target.map(RwLock::new),
            params,
            nexus,
            queue_depth,
            exp_cmdsn: AtomicU32::new(first_cmdsn),
            // Made by its leading connection's login, on that connection's thread.
            home: AtomicUsize::new(crate::cores::current().unwrap_or(usize::MAX)),
            since: (Instant::now(), SystemTime::now()),
            bytes: Arc::default(),
            logged_out: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                order: CmdOrder::new(first_cmdsn, queue_depth),
                conns: TagMap::default(),
                tasks: TagMap::default(),
                closed: false,
                retained: Default::default(),
            }),
        }
    }

    /// The target as the session sees it now; `None` in a discovery session.
    pub fn target(&self) -> Option<Arc<TargetNode>> {
        let t = self.target.as_ref()?;
        Some(t.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// The target's IQN; `None` in a discovery session.
    pub fn target_name(&self) -> Option<String> {
        self.target().map(|t| t.iqn.clone())
    }

    /// Puts `view` in place of the session's target (a configuration reload); the old
    /// one. Commands already running keep the view they started with.
    pub fn set_target(&self, view: Arc<TargetNode>) -> Option<Arc<TargetNode>> {
        let t = self.target.as_ref()?;
        self.lends
            .store(lends_memory(Some(&view)), Ordering::Release);
        Some(std::mem::replace(
            &mut *t.write().unwrap_or_else(|e| e.into_inner()),
            view,
        ))
    }

    /// Whether a LUN of the session's target lends memory (see `LogicalUnit::lends_memory`):
    /// its Data-In may then hold lent bytes on any carrier.
    pub fn lends_memory(&self) -> bool {
        self.lends.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere must not wedge every connection of the session.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection thread the session's connections go to, if it has one.
    pub fn home(&self) -> Option<usize> {
        let h = self.home.load(Ordering::Acquire);
        (h != usize::MAX).then_some(h)
    }

    pub fn is_discovery(&self) -> bool {
        self.target.is_none()
    }

    /// (ExpCmdSN, MaxCmdSN) to advertise now.
    pub fn window(&self) -> (u32, u32) {
        let exp = self.exp_cmdsn.load(Ordering::Acquire);
        (exp, exp.wrapping_add(self.queue_depth - 1))
    }

    /// Takes a non-immediate command in; returns the commands that are now deliverable,
    /// in CmdSN order, each with the CID of its connection.
    pub fn order(
        &self,
        cid: u16,
        cmdsn: u32,
        item: Ordered,
    ) -> Result<Vec<(u16, Ordered)>, OrderError> {
        let mut g = self.lock();
        let ready = g.order.admit(cmdsn, (cid, item))?;
        if !ready.is_empty() {
            self.exp_cmdsn.store(g.order.exp_cmdsn(), Ordering::Release);
        }
        Ok(ready)
    }

    pub fn add_connection(&self, cid: u16, handle: ConnHandle) -> Option<ConnHandle> {
        self.lock().conns.insert(cid, handle)
    }

    /// Each connection's [`ConnInfo`] and event channel, in CID order.
    pub fn connections(&self) -> Vec<ConnHandle> {
        let g = self.lock();
        let mut v: Vec<ConnHandle> = g.conns.values().cloned().collect();
        v.sort_by_key(|h| h.info.cid);
        v
    }

    /// Notes that a Logout Request ended the session or one of its connections.
    pub fn note_logout(&self) {
        self.logged_out.store(true, Ordering::Release);
    }

    pub fn logged_out(&self) -> bool {
        self.logged_out.load(Ordering::Acquire)
    }

    pub fn connection_count(&self) -> usize {
        self.lock().conns.len()
    }

    pub fn has_connection(&self, cid: u16) -> bool {
        self.lock().conns.contains_key(&cid)
    }

    /// Returns true when that was the last connection.
    pub fn remove_connection(&self, cid: u16, handle: &ConnHandle) -> bool {
        let mut g = self.lock();
        if g.conns
            .get(&cid)
            .is_some_and(|h| h.events.same_channel(&handle.events))
        {
            g.conns.remove(&cid);
        }
        // Commands of a lost connection waiting for ordering can never run now.
        g.order.retain(|(c, _)| *c != cid);
        g.conns.is_empty()
    }

    pub fn send_to(&self, cid: u16, ev: ConnEvent) -> bool {
        let mut g = self.lock();
        match g.conns.get(&cid) {
            Some(h) => h.events.send(ev).is_ok(),
            None if self.erl2() => Self::orphan_event(&mut g, &ev),
            None => false,
        }
    }

    pub fn broadcast(&self, ev: impl Fn() -> ConnEvent) {
        let g = self.lock();
        for h in g.conns.values() {
            let _ = h.events.send(ev());
        }
    }

    /// Marks the session closed; returns false if it already was.
    pub fn close(&self) -> bool {
        let mut g = self.lock();
        !std::mem::replace(&mut g.closed, true)
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Registers a task; false if the ITT is already in use in this session.
    pub fn register_task(&self, itt: u32, rec: TaskRec) -> bool {
        let mut g = self.lock();
        if g.tasks.contains_key(&itt) {
            return false;
        }
        if self.erl2() {
            Self::forget_retained(&mut g, itt);
        }
        g.tasks.insert(itt, rec);
        true
    }

    pub fn unregister_task(&self, itt: u32) {
        self.lock().tasks.remove(&itt);
    }

    pub fn task(&self, itt: u32) -> Option<(u16, u16, Arc<TaskCtl>)> {
        self.lock()
            .tasks
            .get(&itt)
            .map(|r| (r.cid, r.lun, r.ctl.clone()))
    }

    /// Tasks on `lun` (all LUNs when None): (itt, cid, ctl).
    pub fn tasks_on(&self, lun: Option<u16>) -> Vec<(u32, u16, Arc<TaskCtl>)> {
        self.lock()
            .tasks
            .iter()
            .filter(|(_, r)| lun.is_none_or(|l| r.lun == l))
            .map(|(itt, r)| (*itt, r.cid, r.ctl.clone()))
            .collect()
    }
}

fn lends_memory(target: Option<&TargetNode>) -> bool {
    target.is_some_and(|t| t.luns.values().any(|lu| lu.lends_memory()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(first: u32, depth: u32) -> Session {
        Session::new(
            1,
            [0; 6],
            "iqn.2026-11.test:i".into(),
            None,
            SessionParams::default(),
            Nexus(1),
            depth,
            first,
        )
    }

    fn ids(v: Vec<(u16, Ordered)>) -> Vec<u16> {
        v.into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn commands_are_delivered_in_cmdsn_order_across_connections() {
        let s = session(10, 8);
        assert!(ids(s.order(2, 12, Ordered::Scsi(12)).unwrap()).is_empty());
        assert!(ids(s.order(3, 11, Ordered::Scsi(11)).unwrap()).is_empty());
        let ready = s.order(1, 10, Ordered::Scsi(10)).unwrap();
        let itts: Vec<u32> = ready
            .iter()
            .map(|(_, o)| match o {
                Ordered::Scsi(i) => *i,
                _ => 0,
            })
            .collect();
        assert_eq!(itts, vec![10, 11, 12]);
        assert_eq!(ids(ready), vec![1, 3, 2]);
        assert_eq!(s.window(), (13, 20));
    }

    #[test]
    fn out_of_window_and_duplicates_are_refused() {
        let s = session(u32::MAX - 1, 4);
        assert_eq!(
            s.order(1, u32::MAX - 2, Ordered::Scsi(0)),
            Err(OrderError::OutOfWindow {
                exp: u32::MAX - 1,
                max: 1
            })
        );
        assert_eq!(
            s.order(1, 2, Ordered::Scsi(0)).unwrap_err(),
            OrderError::OutOfWindow {
                exp: u32::MAX - 1,
                max: 1
            }
        );
        s.order(1, 1, Ordered::Scsi(0)).unwrap();
        assert_eq!(
            s.order(1, 1, Ordered::Scsi(0)).unwrap_err(),
            OrderError::Duplicate
        );
        // Wraps around zero.
        s.order(1, u32::MAX - 1, Ordered::Scsi(0)).unwrap();
        s.order(1, u32::MAX, Ordered::Scsi(0)).unwrap();
        assert_eq!(ids(s.order(1, 0, Ordered::Scsi(0)).unwrap()), vec![1, 1]);
        assert_eq!(s.window().0, 2);
    }
}
