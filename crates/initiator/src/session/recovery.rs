//! Recovery after a lost connection: task reassignment at ERL 2, logout and reissue at
//! ERL 0, reinstatement of the whole session, and what they count.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iscsi::ffp::{logout, tmf};
use iscsi::pdu::{LogoutRequest, Pdu};
use iscsi::serial::sn_le;
use tokio::sync::watch;

use super::tasks::recv_pdu;
use super::Shared;
use crate::conn::{Conn, RawConn};
use crate::{Error, Result};

/// Recovery events over the session's life, for `rsv` to report.
#[derive(Default)]
pub(super) struct Counters {
    /// Commands issued again after a connection failure or a timeout.
    pub(super) retries: AtomicU64,
    pub(super) reinstatements: AtomicU64,
    /// Tasks moved by TASK REASSIGN.
    pub(super) reassigned: AtomicU64,
    /// Connections logged in again while the session went on.
    pub(super) reconnections: AtomicU64,
}

/// Progress of the recovery of one lost connection, as the commands it carried see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// The Logout of the lost CID is under way on another connection.
    Pending,
    /// The target dropped the connection and everything queued on it; its ExpCmdSN then
    /// tells which of the lost commands it had received.
    LoggedOut { expcmdsn: u32 },
    /// No other connection could log it out: only session recovery is left.
    Failed,
}

impl Shared {
    /// Reinstates the session unless another task already did since generation `gen`.
    /// A reinstatement that gave up after `began` (when the caller's command was issued)
    /// is the caller's answer too: a command under way while the session could not be
    /// recovered fails with it rather than start another `recovery_timeout` of attempts.
    pub(super) async fn recover(
        self: &Arc<Self>,
        gen: u64,
        why: &str,
        began: Instant,
    ) -> Result<()> {
        let _g = self.recovery.lock().await;
        {
            let mut st = self.state.lock().unwrap();
            if st.conns.closed {
                return Err(Error::Closed);
            }
            if st.conns.gen != gen {
                return Ok(());
            }
            // Another task's reinstatement gave up while this command was under way.
            if let Some((g, at, attempts, last)) = &st.conns.failed {
                if *g == gen && *at >= began {
                    return Err(Error::RecoveryFailed {
                        attempts: *attempts,
                        last: last.clone(),
                    });
                }
            }
            for c in &st.conns.all {
                c.kill();
            }
            st.tasks.by_itt.clear();
            // On a gateway group, commands wait for the new nexus to be made ready
            // (`after_move`) once the session is back.
            st.conns.held = self.multipath();
        }
        tracing::warn!("session to {} failed ({why}); reinstating", self.target);
        // The same portal first: a blip or a gateway restarted at once keeps it.
        let _ = self.group.lock().unwrap().connection_lost();
        let started_on = self.portal();
        let deadline = Instant::now() + self.opts.recovery_timeout;
        let mut delay = Duration::from_millis(100);
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.establish().await {
                Ok(()) => {
                    self.counters.reinstatements.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "session to {} reinstated through {}",
                        self.target,
                        self.portal()
                    );
                    let ready = if self.multipath() {
                        self.after_move().await
                    } else {
                        Ok(())
                    };
                    self.state.lock().unwrap().conns.held = false;
                    self.window_waiters.notify_waiters();
                    if self.portal() != started_on {
                        tracing::warn!(
                            "multipath: session to {} moved from {started_on} to {}",
                            self.target,
                            self.portal()
                        );
                    }
                    return ready;
                }
                Err(e @ (Error::Auth { .. } | Error::LoginRefused { class: 2, .. }))
                    if !self.multipath() =>
                {
                    self.state.lock().unwrap().conns.held = false;
                    return Err(e);
                }
                Err(e) if Instant::now() + delay > deadline => {
                    let last = e.to_string();
                    tracing::warn!(
                        "session to {} not reinstated after {attempts} attempts in {:.0} s \
                         (recovery_timeout): {last}",
                        self.target,
                        self.opts.recovery_timeout.as_secs_f64()
                    );
                    {
                        let mut st = self.state.lock().unwrap();
                        st.conns.failed = Some((gen, Instant::now(), attempts, last.clone()));
                        st.conns.held = false;
                    }
                    self.window_waiters.notify_waiters();
                    return Err(Error::RecoveryFailed { attempts, last });
                }
                Err(e) => {
                    tracing::debug!("reinstatement attempt {attempts}: {e}");
                    let action = self.group.lock().unwrap().login_failed();
                    match action {
                        crate::multipath::Action::MoveTo(to) => {
                            let from = self.portal();
                            let tried_before = {
                                let mut g = self.group.lock().unwrap();
                                g.move_to(to, true);
                                self.moves.fetch_add(1, Ordering::AcqRel);
                                g.paths()[to].failed_logins > 0
                            };
                            tracing::warn!(
                                "multipath: {from} failed ({e}); moving to {}",
                                self.portal()
                            );
                            // Straight to a portal not yet found down; a pause before
                            // going round again.
                            if tried_before {
                                tokio::time::sleep(delay).await;
                                delay = (delay * 2).min(Duration::from_secs(2));
                            }
                        }
                        _ => {
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(2));
                        }
                    }
                }
            }
        }
    }

    /// What to do with a command whose connection was lost: `Some(Some(cmdsn))` to send
    /// it again with its CmdSN (the target never received it, and until
    /// it does its CmdSN is a hole that stalls the session), `Some(None)` to issue it as
    /// a new command (the target had it and ended it with the connection), `None` when
    /// only session recovery is left.
    pub(super) async fn after_conn_loss(&self, sent: Option<(u64, u32)>) -> Option<Option<u32>> {
        let (serial, cmdsn) = sent?;
        let mut rx = self
            .state
            .lock()
            .unwrap()
            .conns
            .losses
            .get(&serial)?
            .clone();
        let loss = tokio::time::timeout(
            self.opts.recovery_timeout,
            rx.wait_for(|l| *l != Loss::Pending),
        )
        .await
        .ok()?
        .ok()
        .map(|l| *l)?;
        match loss {
            Loss::LoggedOut { expcmdsn } if sn_le(expcmdsn, cmdsn) => Some(Some(cmdsn)),
            Loss::LoggedOut { .. } => Some(None),
            Loss::Failed | Loss::Pending => None,
        }
    }

    /// Recovers one lost connection while the session goes on over the others: logs the
    /// CID out through a surviving connection (so the target drops what it still held of
    /// it and its ExpCmdSN says what it received), then logs the same CID in again with
    /// the session's TSIH, retrying until `recovery_timeout`.
    pub(super) async fn recover_connection(
        self: Arc<Self>,
        lost: Arc<Conn>,
        tx: watch::Sender<Loss>,
    ) {
        tracing::warn!(
            cid = lost.cid,
            "recovering connection {} of the session on the others",
            lost.cid
        );
        let logged_out = self
            .logout_connection(&lost, logout::CLOSE_CONNECTION)
            .await;
        let _ = tx.send(match logged_out {
            Some(expcmdsn) => Loss::LoggedOut { expcmdsn },
            None => Loss::Failed,
        });
        if logged_out.is_none() {
            return;
        }
        self.relogin(&lost).await;
    }

    /// Recovers one lost connection at ERL 2 (RFC 7143 6.2.2): logs it out "for recovery"
    /// through a surviving connection, or, when none is left, logs its CID in again
    /// (which logs the old one out implicitly); then moves each of its commands to a live
    /// connection with TASK REASSIGN. A command the target does not know (it never
    /// arrived) is sent again like at ERL 0; when no connection can be had at all, only
    /// session reinstatement is left.
    pub(super) async fn reassign_connection(
        self: Arc<Self>,
        lost: Arc<Conn>,
        tx: watch::Sender<Loss>,
    ) {
        tracing::warn!(
            cid = lost.cid,
            "recovering connection {} by task reassignment",
            lost.cid
        );
        let (carrier, expcmdsn) = match self
            .logout_connection(&lost, logout::REMOVE_FOR_RECOVERY)
            .await
        {
            Some(exp) => (None, Some(exp)),
            None => match self.relogin(&lost).await {
                Some((conn, exp)) => (Some(conn), Some(exp)),
                None => (None, None),
            },
        };
        let _ = tx.send(match expcmdsn {
            Some(expcmdsn) => Loss::LoggedOut { expcmdsn },
            None => Loss::Failed,
        });
        let orphans: Vec<(u32, u64, u16, u32, Arc<AtomicU32>)> = {
            let mut st = self.state.lock().unwrap();
            let list = st
                .tasks
                .by_itt
                .iter()
                .filter(|(_, t)| t.serial == lost.serial)
                .filter_map(|(itt, t)| {
                    let c = t.command.as_ref()?;
                    Some((*itt, t.id, c.lun, c.cmdsn, c.exp_datasn.clone()))
                })
                .collect();
            if expcmdsn.is_none() {
                // Their attempts see the connection lost and the session reinstated.
                st.tasks.by_itt.retain(|_, t| t.serial != lost.serial);
            }
            list
        };
        self.window_waiters.notify_waiters();
        if expcmdsn.is_none() {
            return;
        }
        let mut jobs = tokio::task::JoinSet::new();
        for (itt, id, lun, cmdsn, exp_datasn) in orphans {
            let (me, carrier) = (self.clone(), carrier.clone());
            jobs.spawn(async move {
                me.reassign_task(carrier, itt, id, lun, cmdsn, &exp_datasn)
                    .await
            });
        }
        while jobs.join_next().await.is_some() {}
        if carrier.is_none() {
            // Logged out through another connection: bring the CID back for later.
            self.relogin(&lost).await;
        }
    }

    /// TASK REASSIGN of one command to `carrier` (or any live connection). When the
    /// target refuses, the command is dropped here and its attempt sends it again.
    pub(super) async fn reassign_task(
        &self,
        carrier: Option<Arc<Conn>>,
        itt: u32,
        id: u64,
        lun: u16,
        cmdsn: u32,
        exp_datasn: &AtomicU32,
    ) {
        let mut still_allegiant = 0;
        let outcome = loop {
            let via = {
                let mut st = self.state.lock().unwrap();
                let via = carrier
                    .clone()
                    .filter(|c| c.is_alive())
                    .or_else(|| st.conns.pick());
                match (st.tasks.by_itt.get_mut(&itt), &via) {
                    (Some(t), Some(via)) if t.id == id => t.serial = via.serial,
                    (Some(t), None) if t.id == id => break Err("no connection left".to_owned()),
                    // The command ended meanwhile.
                    _ => return,
                }
                via.expect("checked above")
            };
            let exp = exp_datasn.load(Ordering::Acquire);
            match self
                .task_mgmt(&via, tmf::TASK_REASSIGN, lun, itt, cmdsn, exp)
                .await
            {
                Ok(0) => break Ok(()),
                // The old connection is not logged out yet: that takes a moment.
                Ok(3) if still_allegiant < 50 => {
                    still_allegiant += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(r) => break Err(format!("TASK REASSIGN answered {r}")),
                // Its new connection failed too: that connection's recovery has it now.
                Err(_) if !via.is_alive() => return,
                Err(e) => break Err(e.to_string()),
            }
        };
        match outcome {
            Ok(()) => {
                self.counters.reassigned.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(itt, "task reassigned");
            }
            Err(why) => {
                tracing::debug!(itt, "task not reassigned ({why}); it is sent again");
                self.state.lock().unwrap().tasks.end(itt, id);
            }
        }
    }

    /// Logs the CID of `lost` in again with the session's TSIH, retrying until
    /// `recovery_timeout`; returns the running connection and the target's ExpCmdSN.
    pub(super) async fn relogin(self: &Arc<Self>, lost: &Arc<Conn>) -> Option<(Arc<Conn>, u32)> {
        let deadline = Instant::now() + self.opts.recovery_timeout;
        let mut delay = Duration::from_millis(50);
        loop {
            let (gen, tsih, params, cmdsn, closed) = {
                let st = self.state.lock().unwrap();
                (
                    st.conns.gen,
                    st.conns.tsih,
                    st.conns.params.clone(),
                    st.window.cmdsn,
                    st.conns.closed,
                )
            };
            if closed || gen != lost.gen {
                return None;
            }
            let login = async {
                let mut raw = RawConn::connect(&lost.portal, &self.opts).await?;
                let done = raw
                    .login(
                        self.login_config(lost.cid, tsih, params),
                        u32::from(lost.cid),
                        cmdsn,
                    )
                    .await?;
                Ok::<_, Error>((raw, done))
            };
            match login.await {
                Ok((raw, done)) => {
                    let mut st = self.state.lock().unwrap();
                    if st.conns.closed || st.conns.gen != lost.gen {
                        return None;
                    }
                    let conn = self.start_conn(raw, &done, lost.cid, gen);
                    st.conns.all.retain(|c| c.serial != lost.serial);
                    st.conns.all.push(conn.clone());
                    drop(st);
                    self.counters.reconnections.fetch_add(1, Ordering::Relaxed);
                    self.update_window(done.expcmdsn, done.maxcmdsn);
                    self.window_waiters.notify_waiters();
                    tracing::info!(cid = lost.cid, "connection {} re-established", lost.cid);
                    return Some((conn, done.expcmdsn));
                }
                Err(e @ (Error::Auth { .. } | Error::LoginRefused { class: 2, .. })) => {
                    tracing::warn!(
                        cid = lost.cid,
                        "connection {} could not be re-established: {e}",
                        lost.cid
                    );
                    return None;
                }
                Err(e) if Instant::now() + delay > deadline || self.multipath() => {
                    tracing::warn!(
                        cid = lost.cid,
                        "connection {} could not be re-established: {e}; going on with fewer",
                        lost.cid
                    );
                    return None;
                }
                Err(e) => {
                    tracing::debug!(cid = lost.cid, "re-login: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Logout of `lost`'s CID on another connection, with `reason` 1 "close the
    /// connection" or 2 "remove the connection for recovery"; returns the target's
    /// ExpCmdSN once the target no longer knows the CID.
    pub(super) async fn logout_connection(&self, lost: &Conn, reason: u8) -> Option<u32> {
        let start = Instant::now();
        loop {
            let via = {
                let st = self.state.lock().unwrap();
                if st.conns.closed || st.conns.gen != lost.gen {
                    return None;
                }
                st.conns.pick()?
            };
            let (guard, mut rx) = self.register(&via);
            let cmdsn = self.state.lock().unwrap().window.cmdsn;
            via.send(Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason,
                itt: guard.itt,
                cid: lost.cid,
                cmdsn,
                expstatsn: 0,
            }));
            match tokio::time::timeout(Duration::from_secs(10), recv_pdu(&mut rx)).await {
                // 1: CID not found — the target has dropped the connection and the
                // commands it queued for it.
                Ok(Some(Pdu::LogoutResponse(r))) if r.response == 1 => return Some(r.expcmdsn),
                // Accepted: the target closes it now; ask again until it is gone (a
                // target that closes synchronously is believed after a while). For
                // recovery, success means the tasks are ready to be reassigned.
                Ok(Some(Pdu::LogoutResponse(r))) if r.response == 0 => {
                    if reason == logout::REMOVE_FOR_RECOVERY
                        || start.elapsed() > Duration::from_secs(2)
                    {
                        return Some(r.expcmdsn);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Some(other)) => {
                    tracing::warn!(
                        cid = lost.cid,
                        "logout of the lost connection answered with {:?}",
                        other.opcode()
                    );
                    return None;
                }
                // The connection carrying the logout failed too: try another.
                Ok(None) => {}
                Err(_) => return None,
            }
        }
    }

    /// The target asked for `conn` to log out within `within` seconds (Async Message
    /// event 1, RFC 7143 11.9.1): it logs itself out ("close the connection", which ends
    /// the session with its last connection), and then it is recovered as a lost
    /// connection is: logged in again beside the others, or the session reinstated. That
    /// is what open-iscsi and libiscsi do too: a target asks for a logout to move or end
    /// sessions, not to turn the initiator away (access rules do that).
    pub(super) async fn logout_requested(self: Arc<Self>, conn: Arc<Conn>, within: u16) {
        let (guard, mut rx) = self.register(&conn);
        let cmdsn = self.state.lock().unwrap().window.cmdsn;
        conn.send(Pdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: logout::CLOSE_CONNECTION,
            itt: guard.itt,
            cid: conn.cid,
            cmdsn,
            expstatsn: 0,
        }));
        let limit = Duration::from_secs(u64::from(within.clamp(1, 10)));
        let why = match tokio::time::timeout(limit, recv_pdu(&mut rx)).await {
            Ok(Some(Pdu::LogoutResponse(r))) if r.response == 0 => {
                tracing::info!(cid = conn.cid, "logged out as the target asked");
                "logged out at the target's request".to_owned()
            }
            Ok(Some(other)) => format!("logout the target asked for answered with {other:?}"),
            Ok(None) => "connection lost during the logout the target asked for".to_owned(),
            Err(_) => format!("no answer to the logout the target asked for within {limit:?}"),
        };
        drop(guard);
        self.conn_failed(&conn, &why);
    }

    pub(super) fn conn_failed(self: &Arc<Self>, conn: &Arc<Conn>, why: &str) {
        conn.kill();
        let mut st = self.state.lock().unwrap();
        if st.conns.closed {
            return;
        }
        tracing::warn!(
            cid = conn.cid,
            "connection to {} failed: {why}",
            conn.portal
        );
        let current = conn.gen == st.conns.gen && !st.conns.losses.contains_key(&conn.serial);
        if current && st.conns.params.error_recovery_level >= 2 {
            // ERL 2: its commands stay where they are until TASK REASSIGN moves them.
            st.tasks
                .by_itt
                .retain(|_, t| t.serial != conn.serial || t.command.is_some());
            let (tx, rx) = watch::channel(Loss::Pending);
            st.conns.losses.insert(conn.serial, rx);
            tokio::spawn(self.clone().reassign_connection(conn.clone(), tx));
            drop(st);
            self.window_waiters.notify_waiters();
            return;
        }
        st.tasks.by_itt.retain(|_, t| t.serial != conn.serial);
        // Another connection of this session is still up: recover this one alone.
        let others = st
            .conns
            .all
            .iter()
            .any(|c| c.is_alive() && c.serial != conn.serial);
        if current && others {
            let (tx, rx) = watch::channel(Loss::Pending);
            st.conns.losses.insert(conn.serial, rx);
            tokio::spawn(self.clone().recover_connection(conn.clone(), tx));
        }
        drop(st);
        self.window_waiters.notify_waiters();
    }
}
