//! Sessions: the public [`Session`] and the parts it is made of, each with one job.
//!
//! - `window`: CmdSN, ExpCmdSN, MaxCmdSN; `tasks`: the ITTs in flight; `conns`: the
//!   connections and their recoveries under way. These three sit under one lock
//!   ([`State`]).
//! - `slots`: the queue depth; `tuner`: live tuning; `recovery`: ERL 2 reassignment, ERL 0
//!   reissue and reinstatement, and their counters.
//! - `login`: logging the connections in; `command`: one try at a command and task
//!   management; `reader`: each connection's reader task; `placed`: reads straight into
//!   their buffers; `keepalive`: NOP-Out pings; `scsi_ops`: the SCSI commands callers use.

mod command;
mod conns;
mod keepalive;
pub(crate) mod login;
mod multipath;
mod placed;
mod reader;
mod recovery;
mod scsi_ops;
mod slots;
mod tasks;
mod tuner;
mod window;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi::ffp::{logout, tmf};
use iscsi::pdu::{LogoutRequest, Pdu, RESERVED_TAG};
use serde::Serialize;
use tokio::sync::Notify;

use command::Attempt;
use conns::ConnSet;
use keepalive::keepalive;
use login::new_isid;
use placed::BufPool;
use recovery::Counters;
use slots::Slots;
use tasks::{recv_pdu, TaskTable};
use tuner::Tuner;
use window::Window;

use scsi_proto::{cdb, sense, status};

use crate::scsi::{Capacity, Sense};
use crate::{Error, IscsiUrl, Result, SessionOptions};

/// Direction and size of a command's data.
#[derive(Clone, Debug)]
pub enum DataDir {
    None,
    /// Expected length of the data to read.
    Read(u32),
    Write(Bytes),
}

/// What a SCSI command returned.
#[derive(Clone, Debug)]
pub struct ScsiResult {
    pub status: u8,
    pub sense: Option<Sense>,
    pub data: Bytes,
    /// Bytes the target transferred less than expected (underflow).
    pub residual: u32,
}

impl ScsiResult {
    pub fn is_good(&self) -> bool {
        self.status == status::GOOD
    }
}

/// Negotiated values and identity of a session, for people and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct SessionInfo {
    pub target: String,
    pub portal: String,
    pub isid: String,
    pub tsih: u16,
    pub connections: usize,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_recv_data_segment_length: u32,
    pub max_send_data_segment_length: u32,
    pub header_digest: bool,
    pub data_digest: bool,
    pub error_recovery_level: u8,
    pub queue_depth: usize,
    pub congestion: Option<String>,
    /// The congestion control each live connection runs (by CID order), as the kernel
    /// read it back.
    pub congestion_by_connection: Vec<String>,
    /// Bytes per second `rsv`'s probed start found on each live connection (by CID
    /// order) from its first round's ACKs; 0 where it found none (no probe: a rate given
    /// or remembered, another congestion control, not sampled yet).
    pub start_found_by_connection: Vec<u64>,
    /// Whether this process loaded Reservoir's own congestion control `rsv`, and if not
    /// why (`docs/congestion.md`).
    pub rsv: net::cc::Status,
    /// Which congestion control the session's connections were given, by whom
    /// (`option`: `congestion=`; `default`: the process's default) and why.
    pub congestion_choice: Option<CongestionChoice>,
    pub send_buffer: usize,
    pub recv_buffer: usize,
    /// What auto-tuning measured and chose (absent when it was off).
    pub tuning: Option<crate::tune::Plan>,
    /// The path as the connections measured it last (TCP_INFO).
    pub path: Option<PathReport>,
    /// Whether the target paces its sends to us, as each connection last answered
    /// (at login, or to a hint of the rate control since).
    pub target_pacing: crate::tune::TargetPacingReport,
    /// The bottleneck found and the pacing chosen without a given rate (absent unless the
    /// rate control runs: `rate_control=yes`, auto-tuning on, no rate or pacing given).
    pub rate_control: Option<crate::tune::RateControlReport>,
    /// TLS protocol and cipher suite of the connections (`TLSv1_3 TLS13_AES_256_GCM_SHA384`);
    /// absent in plain TCP.
    pub tls: Option<String>,
    /// The gateway group, when the session was given several portals (`portal=`).
    pub multipath: Option<crate::multipath::GroupReport>,
}

/// The congestion control a session asked its sockets for, and why.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CongestionChoice {
    /// The name (or list, first taken wins) given to each socket; `None`: the kernel's.
    pub name: Option<String>,
    /// `option` (`congestion=` given) or `default` (the process's default).
    pub by: &'static str,
    pub why: String,
    /// Why the default is not `rsv` (absent when it is, or when an option decided).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rsv_missing: Option<net::congestion::Missing>,
}

/// The session's connections' latest TCP_INFO, summed up.
#[derive(Clone, Debug, Serialize, Default)]
pub struct PathReport {
    pub min_rtt_ms: f64,
    pub srtt_ms: f64,
    /// Bytes per second over all connections in the last sample.
    pub rate_bytes_per_s: u64,
    /// Bytes per second that crossed the path over the last span (segments delivered,
    /// SACKed ones included, and received), over all connections that have run a span:
    /// unlike `rate_bytes_per_s` (cumulative acknowledgments), not held back by a hole.
    pub wire_bytes_per_s: u64,
    pub retransmits: u64,
    pub connections_sampled: usize,
}

/// What a command's issue reads and changes in one critical section, under one lock: it
/// picks a live connection, takes a CmdSN inside the window, registers its task under a
/// fresh ITT and queues its PDU, so that each connection carries CmdSNs in order and no
/// opening of the window is missed; a failed connection's tasks are sorted out together
/// with its recovery entry and the generation. Parted by job, not by lock.
struct State {
    window: Window,
    tasks: TaskTable,
    conns: ConnSet,
}

/// The session, composed of its parts (see the module's documentation).
struct Shared {
    url: IscsiUrl,
    target: String,
    opts: SessionOptions,
    isid: [u8; 6],
    epoch: Instant,
    state: Mutex<State>,
    /// Wakes commands waiting for the window to open or a connection to come back.
    window_waiters: Notify,
    slots: Slots,
    tuner: Tuner,
    counters: Counters,
    /// Held while the session is reinstated, so that only one task does it.
    recovery: tokio::sync::Mutex<()>,
    /// READ CAPACITY per LUN, for [`Session::read`] and [`Session::write`].
    capacity: Mutex<tasks::OwnKeyMap<u16, Capacity>>,
    bufs: Arc<BufPool>,
    /// The portals of the gateway group and the one in use (just the URL's without
    /// `portal=` options).
    group: Mutex<crate::multipath::Group>,
    /// The LUN whose ALUA states choose the path (the URL's, or 0).
    alua_lun: u16,
    /// The persistent-reservation registration this session made, to make again on
    /// another gateway's I_T nexus before any command is reissued there.
    registration: Mutex<Option<crate::multipath::Registration>>,
    /// Bumped at each change of the portal in use: a command's ALUA sense is news only
    /// of the portal it went to (an atomic, not the group's lock, on every command).
    moves: std::sync::atomic::AtomicU64,
}

/// An iSCSI session with one or more connections. Cheap to clone; all clones share the
/// session. Commands may be issued concurrently from many tasks.
///
/// When the target grants ErrorRecoveryLevel 2, a failed connection is recovered by
/// task reassignment (RFC 7143 6.2.2): a surviving connection logs the lost CID out with
/// reason "remove the connection for recovery" (with none left, the CID logs in again
/// with the session's TSIH, which does the same implicitly), then each command the lost
/// connection carried is moved with TASK REASSIGN to a live connection, where the target
/// carries it on: R2Ts for the data it still lacks, Data-In from the first one we lack
/// (ExpDataSN), the status. The commands wait meanwhile; they are not issued again. One
/// the target does not know (it never arrived) is sent again as below.
///
/// At ErrorRecoveryLevel 0 or 1 (the target recovers nothing itself; SNACK is not used
/// here) the recovery is by reissue. When one of several connections fails, a surviving
/// one logs the lost CID out (the target then drops what it still held of it, and its
/// ExpCmdSN tells which of the lost commands it had received). Those it never received
/// are sent again with their own CmdSN, which plugs the hole that would otherwise stall
/// the session's command order; those it had are issued as new commands (new ITT and
/// CmdSN, RFC 7143 allows that on any connection). Meanwhile the CID logs in again with
/// the session's TSIH. Only when no connection is left is the session reinstated (same
/// ISID, TSIH 0, so the target closes the old one) and every command without status
/// issued anew. Reads and writes are idempotent, so a copy ends the same as without the
/// failure.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

const MAX_ATTEMPTS: u32 = 20;

/// The process's default congestion control once its blocking decision has run; a
/// decision thread that failed (it cannot, short of a panic) leaves the kernel's choice.
fn resolved(
    r: std::result::Result<&'static net::congestion::Choice, tokio::task::JoinError>,
) -> net::congestion::Choice {
    match r {
        Ok(c) => c.clone(),
        Err(e) => net::congestion::Choice {
            name: net::preferred_congestion(),
            rsv_missing: None,
            why: format!("the kernel's preferred: the default could not be decided ({e})"),
        },
    }
}

impl Session {
    /// Logs in to the target of `url` with `opts` (query-string options of the URL already
    /// applied by the caller, see [`IscsiUrl::options`]) and opens all connections.
    pub async fn connect(url: &IscsiUrl, opts: &SessionOptions) -> Result<Session> {
        let target = url.target_required()?.to_owned();
        if opts.pr_type.is_some() && opts.pr_key.is_none() {
            return Err(Error::Option("pr_type needs pr_key".into()));
        }
        // Without a congestion option the process's default decides (rsv where it loads,
        // else BBR, else CUBIC): decided once per process, its load (libbpf and the
        // verifier) on a blocking thread while the RTT probe's handshakes run.
        let default_cc = opts
            .congestion
            .is_none()
            .then(|| tokio::task::spawn_blocking(net::default_congestion));
        let (opts, plan, probed) = if opts.auto_tune {
            let (mut probe, probed) = crate::tune::probe_keep(
                &url.portal(),
                opts.dialer.as_ref(),
                crate::conn::first_window(opts),
            )
            .await?;
            if opts.path_cache && opts.rate.is_none() {
                probe.remembered = recall_path(&url.portal());
            }
            if let Some(d) = default_cc {
                probe.congestion_default = Some(resolved(d.await));
            }
            let (o, p) = crate::tune::plan(opts, &probe, &net::KernelLimits::read());
            for r in &p.reasons {
                tracing::info!("auto-tuning: {r}");
            }
            (o, Some(p), probed)
        } else {
            let mut o = opts.clone();
            if let Some(d) = default_cc {
                let c = resolved(d.await);
                o.congestion = c.name.clone();
                o.congestion_default = Some(c);
            }
            (o, None, Vec::new())
        };
        let mut opts = opts;
        if opts.rsv_group == 0 {
            opts.rsv_group = net::cc::new_group();
        }
        let mut portals = vec![url.portal()];
        for p in &opts.portals {
            if !portals.contains(p) {
                portals.push(p.clone());
            }
        }
        let shared = Arc::new(Shared {
            group: Mutex::new(crate::multipath::Group::new(portals)),
            alua_lun: url.lun.unwrap_or(0),
            registration: Mutex::new(None),
            moves: Default::default(),
            url: url.clone(),
            target,
            isid: new_isid(),
            epoch: Instant::now(),
            state: Mutex::new(State {
                window: Window::new(1, 1, 1),
                tasks: TaskTable::new(),
                conns: ConnSet::new(),
            }),
            window_waiters: Notify::new(),
            slots: Slots::new(opts.queue_depth.max(1)),
            tuner: Tuner::new(plan),
            counters: Counters::default(),
            recovery: tokio::sync::Mutex::new(()),
            capacity: Mutex::new(Default::default()),
            bufs: Arc::default(),
            opts,
        });
        Shared::establish_over(&shared, probed).await?;
        if shared.multipath() {
            shared.choose_path().await;
        }
        tokio::spawn(keepalive(Arc::downgrade(&shared)));
        let session = Session { shared };
        if let Some(key) = session.shared.opts.pr_key {
            if let Err(e) = session
                .hold_reservation(key, session.shared.opts.pr_type)
                .await
            {
                let _ = session.logout().await;
                return Err(e);
            }
        }
        Ok(session)
    }

    pub fn info(&self) -> SessionInfo {
        let st = self.shared.state.lock().unwrap();
        let mut info = st.conns.info.clone().expect("established session has info");
        info.connections = st.conns.all.iter().filter(|c| c.is_alive()).count();
        info.queue_depth = self.queue_depth();
        info.tuning = self.shared.tuner.plan.clone();
        info.path = Shared::path(&st.conns.all);
        let mut by_cid: Vec<(u16, String, u64)> = st
            .conns
            .all
            .iter()
            .filter(|c| c.is_alive())
            .map(|c| {
                (
                    c.cid,
                    c.congestion.get().cloned().unwrap_or_default(),
                    c.start_found.load(Ordering::Relaxed),
                )
            })
            .collect();
        by_cid.sort();
        info.start_found_by_connection = by_cid.iter().map(|(_, _, f)| *f).collect();
        info.congestion_by_connection = by_cid.into_iter().map(|(_, c, _)| c).collect();
        info.rsv = net::cc::status();
        info.portal = self.shared.portal();
        info.multipath = self
            .shared
            .multipath()
            .then(|| self.shared.group.lock().unwrap().report());
        info.congestion_choice = Some(match &self.shared.opts.congestion_default {
            Some(c) => CongestionChoice {
                name: c.name.clone(),
                by: "default",
                why: c.why.clone(),
                rsv_missing: c.rsv_missing.clone(),
            },
            None => CongestionChoice {
                name: self.shared.opts.congestion.clone(),
                by: "option",
                why: match &self.shared.opts.congestion {
                    Some(c) => format!("{c}: set by the congestion option"),
                    None => "the kernel's default".into(),
                },
                rsv_missing: None,
            },
        });
        info.rsv.probe_rtt = net::cc::group_status(self.shared.opts.rsv_group);
        let live = st.conns.all.iter().filter(|c| c.is_alive()).count().max(1) as u64;
        let hinted = match self.shared.tuner.pace_total.load(Ordering::Relaxed) {
            0 => None,
            _ if !self.shared.opts.pacing_hint => None,
            total => Some(total / live),
        };
        info.target_pacing = crate::tune::TargetPacingReport::new(
            self.shared.opts.target_pacing_hint().or(hinted),
            st.conns
                .all
                .iter()
                .filter(|c| c.is_alive())
                .map(|c| (c.cid, c.target_pacing_now())),
        );
        info.rate_control = self
            .shared
            .tuner
            .rate
            .as_ref()
            .map(|r| r.lock().unwrap().report());
        info
    }

    /// Paces the session's sends to `rate` bytes per second in all (each live connection
    /// its share, with SO_MAX_PACING_RATE), or lifts the pacing with `None`. For a
    /// coordinator that divides a shared bottleneck between sessions; it wins over the
    /// session's own rate control. Each connection's reader applies it at once.
    pub fn set_pacing_rate(&self, rate: Option<u64>) {
        let v = rate.map_or(u64::MAX, |r| r.clamp(1, u64::MAX - 1));
        self.shared.tuner.pace_external.store(v, Ordering::Relaxed);
        for c in self.shared.state.lock().unwrap().conns.all.iter() {
            c.repace.notify_one();
        }
    }

    /// Commands the session lets in flight now (auto-tuning may grow it while it runs).
    pub fn queue_depth(&self) -> usize {
        self.shared.slots.depth()
    }

    /// Commands issued again after a connection failure or a timeout.
    pub fn retries(&self) -> u64 {
        self.shared.counters.retries.load(Ordering::Relaxed)
    }

    /// Times the session was reinstated after a failure.
    pub fn reinstatements(&self) -> u64 {
        self.shared.counters.reinstatements.load(Ordering::Relaxed)
    }

    /// Commands moved to another connection by TASK REASSIGN (ERL 2) and carried on there.
    pub fn reassigned_tasks(&self) -> u64 {
        self.shared.counters.reassigned.load(Ordering::Relaxed)
    }

    /// The gateway group: its portals, their ALUA states, the one in use and the
    /// failovers so far.
    pub fn group(&self) -> crate::multipath::GroupReport {
        self.shared.group.lock().unwrap().report()
    }

    /// Whether `other` is a handle on this same session.
    pub fn same(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Connections of the session logged in again after a failure (the session itself
    /// went on).
    pub fn reconnections(&self) -> u64 {
        self.shared.counters.reconnections.load(Ordering::Relaxed)
    }

    /// Issues one SCSI command and waits for its status. Retries transparently on
    /// connection loss (after recovery), on UNIT ATTENTION and on BUSY/TASK SET FULL.
    /// A status other than GOOD is returned as a result, not an error.
    pub async fn command(&self, lun: u16, cdb: &[u8], dir: DataDir) -> Result<ScsiResult> {
        self.command_retrying(lun, cdb, dir, true).await
    }

    /// TEST UNIT READY that takes a pending UNIT ATTENTION and is not repeated for it:
    /// issued first among commands that go out together, it spares them the attention
    /// (and the round trip of a repeat). Its status is of no interest.
    pub(crate) async fn absorb_unit_attention(&self, lun: u16) {
        let cdb = cdb::test_unit_ready();
        let _ = self.command_retrying(lun, &cdb, DataDir::None, false).await;
    }

    async fn command_retrying(
        &self,
        lun: u16,
        cdb: &[u8],
        dir: DataDir,
        again_on_attention: bool,
    ) -> Result<ScsiResult> {
        // Before the wait for a slot: a command queued behind a session that could not be
        // recovered fails with it (see `recover`).
        let began = Instant::now();
        let _slot = self.shared.slots.acquire().await?;
        let mut attempts = 0;
        let mut unit_attentions = 0;
        let mut plug = None;
        loop {
            let gen = self.shared.state.lock().unwrap().conns.gen;
            let moves = self.shared.moves.load(Ordering::Acquire);
            match self
                .shared
                .attempt(lun, cdb, &dir, plug.take(), false)
                .await
            {
                Ok(r) if r.is_good() && cdb.first() == Some(&0x5f) => {
                    if let DataDir::Write(p) = &dir {
                        if let Some(reg) = crate::multipath::registration_after(cdb, p) {
                            *self.shared.registration.lock().unwrap() = reg;
                        }
                    }
                    return Ok(r);
                }
                // Only a CHECK CONDITION can carry an ALUA sense, and the check is boxed:
                // its future holds a whole reinstatement (the logins, then READ FULL
                // STATUS on the new nexus), 5,112 bytes that every command built and
                // moved on completion when it was called for every status, and that made
                // every command's future 5.5 KiB instead of 1 (4 KiB random reads: 13.7 %
                // of `rsv bench`'s CPU in memmove; docs/bench-connections.md).
                Ok(r)
                    if r.status == status::CHECK_CONDITION
                        && Box::pin(self.shared.alua_moved(&r, gen, moves, began)).await? => {}
                Ok(r) => {
                    let ua = r.status == status::CHECK_CONDITION
                        && r.sense
                            .as_ref()
                            .is_some_and(|s| s.key == sense::key::UNIT_ATTENTION);
                    let busy = r.status == status::BUSY || r.status == status::TASK_SET_FULL;
                    if ((ua && again_on_attention) || busy) && unit_attentions < 10 {
                        unit_attentions += 1;
                        if busy {
                            tokio::time::sleep(Duration::from_millis(5 << unit_attentions.min(6)))
                                .await;
                        }
                        continue;
                    }
                    return Ok(r);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Aborted) => {}
                // Boxed, as the ALUA check above: recovery is rare and its future large.
                Err(Attempt::Lost { gen, why, sent }) => {
                    plug = Box::pin(self.after_lost(cdb, gen, &why, sent, began)).await?;
                }
            }
            attempts += 1;
            self.shared.counters.retries.fetch_add(1, Ordering::Relaxed);
            if attempts >= MAX_ATTEMPTS {
                return Err(Error::RecoveryFailed {
                    attempts,
                    last: "command kept failing".into(),
                });
            }
        }
    }

    /// A command's connection was lost (generation `gen`): recovers the connection or
    /// the session, and answers the CmdSN to send the command again with (a plug), if
    /// any. Apart from [`Session::command_retrying`] so that its future, which holds a
    /// reinstatement's, is not part of every command's.
    async fn after_lost(
        &self,
        cdb: &[u8],
        gen: u64,
        why: &str,
        sent: Option<(u64, u32)>,
        began: Instant,
    ) -> Result<Option<u32>> {
        let was_sent = sent.is_some();
        if let Some(plug) = self.shared.after_conn_loss(sent).await {
            return Ok(plug);
        }
        let before = self.shared.group.lock().unwrap().failovers();
        self.shared.recover(gen, why, began).await?;
        let moved = self.shared.group.lock().unwrap().failovers() != before;
        // COMPARE AND WRITE is not idempotent: if the lost gateway did it, the same
        // command again miscompares against its own write. Only the caller, re-reading,
        // can tell.
        if moved && was_sent && cdb.first() == Some(&0x89) {
            return Err(Error::Indeterminate {
                opcode: 0x89,
                why: "it may or may not have taken effect at the lost gateway; read the \
                      blocks again and decide",
            });
        }
        Ok(None)
    }

    /// LOGICAL UNIT RESET; returns the TMF response code (0 = function complete).
    pub async fn lun_reset(&self, lun: u16) -> Result<u8> {
        let conn = {
            let st = self.shared.state.lock().unwrap();
            st.conns.pick().ok_or(Error::Closed)?
        };
        self.shared
            .task_mgmt(&conn, tmf::LOGICAL_UNIT_RESET, lun, RESERVED_TAG, 0, 0)
            .await
    }

    /// Closes the session (Logout, reason "close the session") and all connections.
    pub async fn logout(&self) -> Result<()> {
        let conn = {
            let mut st = self.shared.state.lock().unwrap();
            st.conns.closed = true;
            st.conns.pick()
        };
        self.shared.window_waiters.notify_waiters();
        let result = match conn {
            Some(conn) => {
                let (guard, mut rx) = self.shared.register(&conn);
                let cmdsn = self.shared.state.lock().unwrap().window.cmdsn;
                conn.send(Pdu::LogoutRequest(LogoutRequest {
                    immediate: true,
                    reason: logout::CLOSE_SESSION,
                    itt: guard.itt,
                    cid: conn.cid,
                    cmdsn,
                    expstatsn: 0,
                }));
                match tokio::time::timeout(Duration::from_secs(5), recv_pdu(&mut rx)).await {
                    Ok(Some(Pdu::LogoutResponse(r))) if r.response == 0 => Ok(()),
                    Ok(Some(Pdu::LogoutResponse(r))) => Err(Error::Protocol(format!(
                        "logout refused (response {})",
                        r.response
                    ))),
                    Ok(_) => Ok(()),
                    Err(_) => Err(Error::Timeout("logout".into())),
                }
            }
            None => Ok(()),
        };
        let conns = std::mem::take(&mut self.shared.state.lock().unwrap().conns.all);
        for c in conns {
            c.kill();
        }
        self.shared.remember_path();
        result
    }
}

/// What the path cache knows of the path to `portal`'s host, if it is young enough.
fn recall_path(portal: &str) -> Option<crate::tune::Remembered> {
    let file = net::paths::default_file()?;
    let cache = net::paths::load(&file)
        .inspect_err(|e| tracing::debug!("path cache {}: {e}", file.display()))
        .ok()?;
    let now = net::paths::unix_now();
    let e = cache.recall(crate::conn::portal_host(portal), now)?;
    Some(crate::tune::Remembered {
        rate_bytes_per_s: e.rate,
        age_s: e.age(now).as_secs(),
    })
}

impl Shared {
    fn portal(&self) -> String {
        self.group.lock().unwrap().portal().to_owned()
    }

    /// Saves what the session learnt of a long path in the path cache (`net::paths`).
    fn remember_path(&self) {
        if !self.opts.auto_tune || !self.opts.path_cache {
            return;
        }
        let Some((rate, min_rtt_us)) = self.tuner.learnt.lock().unwrap().estimate() else {
            tracing::debug!("path cache: too few busy samples to remember the path");
            return;
        };
        let Some(file) = net::paths::default_file() else {
            return;
        };
        let portal = self.portal();
        let host = crate::conn::portal_host(&portal);
        let now = net::paths::unix_now();
        let e = net::paths::PathEntry {
            rate,
            min_rtt_us,
            saved: now,
        };
        match net::paths::save(&file, host, e, now) {
            Ok(true) => tracing::info!(
                "path cache: {:.1} Mbit/s at {:.1} ms remembered for {host} ({})",
                rate as f64 * 8e-6,
                f64::from(min_rtt_us) / 1e3,
                file.display()
            ),
            Ok(false) => {}
            Err(e) => tracing::debug!("path cache {}: {e}", file.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Lun;

    /// The size of the future that `f` returns, from its type alone: no session is made
    /// and nothing runs.
    fn future_size<A, F: std::future::Future>(_f: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A command's future is built, moved into its caller's and polled once per command,
    /// at every layer from `Lun` down to `Shared::attempt`: what it holds is copied that
    /// often. The recovery paths (reinstatement, a gateway group's checks after a move,
    /// an abort) are boxed so that their much larger futures are not part of it; when
    /// they were, 4 KiB random reads spent 13.7 % of `rsv bench`'s CPU in memmove
    /// (docs/bench-connections.md). Run with `--nocapture` to see the sizes.
    #[test]
    fn the_command_paths_futures_stay_small() {
        type S = &'static Shared;
        type A = &'static Arc<Shared>;
        let hot = [
            (
                "Shared::attempt",
                future_size(|(s, d): (S, &'static DataDir)| s.attempt(0, &[], d, None, false)),
            ),
            (
                "Session::command",
                future_size(|s: &'static Session| s.command(0, &[], DataDir::None)),
            ),
            (
                "Session::read",
                future_size(|s: &'static Session| s.read(0, 0, 1)),
            ),
            (
                "Session::write",
                future_size(|s: &'static Session| s.write(0, 0, Bytes::new())),
            ),
            (
                "Lun::read_at",
                future_size(|l: &'static Lun| l.read_at(0, 4096)),
            ),
            (
                "Lun::write_at",
                future_size(|l: &'static Lun| l.write_at(0, Bytes::new())),
            ),
        ];
        let cold = [
            (
                "Shared::recover",
                future_size(|s: A| s.recover(0, "", Instant::now())),
            ),
            (
                "Shared::alua_moved",
                future_size(|(s, r): (A, &'static ScsiResult)| {
                    s.alua_moved(r, 0, 0, Instant::now())
                }),
            ),
            ("Shared::after_move", future_size(|s: A| s.after_move())),
            ("Shared::establish", future_size(|s: A| s.establish())),
            (
                "Shared::after_conn_loss",
                future_size(|s: S| s.after_conn_loss(None)),
            ),
        ];
        for (name, size) in hot.iter().chain(&cold) {
            println!("{name}: {size} bytes");
        }
        for (name, size) in hot {
            assert!(
                size <= HOT_LIMIT,
                "{name}'s future is {size} bytes, more than {HOT_LIMIT}: a large await on \
                 the command path (box it if it is a rare one)"
            );
        }
    }

    /// Twice what the fix left (960 bytes for `Session::command`, 1,192 for
    /// `Lun::read_at` in the test profile); before it they were 5,544 and 6,000.
    const HOT_LIMIT: usize = 2048;
}
