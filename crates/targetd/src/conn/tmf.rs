//! Task management (RFC 7143 11.5, 11.6) and logout (11.14, 11.15): aborting tasks on any
//! connection of the session and waiting for running ones, LU and target resets, TASK
//! REASSIGN at ERL 2, and the logout of a session, a connection, or a connection for
//! recovery.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::loglimit::peer_log;
use crate::node::TargetNode;
use iscsi::ffp::{logout, tmf};
use iscsi::pdu::{lun_from_wire, LogoutRequest, LogoutResponse, TaskMgmtRequest, TaskMgmtResponse};
use scsi::LogicalUnit;

use super::{Close, Conn};
use crate::session::ConnEvent;
use crate::task::TaskCtl;

impl Conn {
    pub(super) async fn on_logout(&mut self, l: LogoutRequest) -> Result<(), Close> {
        let p = &self.session.params;
        let (t2w, t2r) = (p.default_time2wait, p.default_time2retain);
        let response = match l.reason {
            logout::CLOSE_SESSION => {
                self.session.note_logout();
                self.keep_tasks = false;
                self.executing.wait().await;
                self.session.close();
                for (_, _, ctl) in self.session.tasks_on(None) {
                    ctl.abort();
                }
                self.session
                    .broadcast(|| ConnEvent::Close("session logged out"));
                self.shared.remove_session(self.session.tsih);
                self.closing = true;
                logout::CLOSED
            }
            logout::CLOSE_CONNECTION if l.cid == self.cid => {
                // If it is the last, the session ends with it, by the initiator's logout.
                self.session.note_logout();
                self.keep_tasks = false;
                self.executing.wait().await;
                self.closing = true;
                logout::CLOSED
            }
            logout::CLOSE_CONNECTION => {
                if self
                    .session
                    .send_to(l.cid, ConnEvent::Close("logged out by another connection"))
                {
                    logout::CLOSED
                } else {
                    logout::CID_NOT_FOUND
                }
            }
            logout::REMOVE_FOR_RECOVERY => self.logout_for_recovery(l.cid).await,
            _ => logout::RECOVERY_NOT_SUPPORTED,
        };
        self.send(LogoutResponse {
            response,
            itt: l.itt,
            time2wait: t2w,
            time2retain: t2r,
            ..Default::default()
        });
        Ok(())
    }

    /// Logout reason 2, "remove the connection for recovery" (RFC 7143 11.14.1): the
    /// connection closes and its tasks wait for TASK REASSIGN elsewhere. Below ERL 2 the
    /// answer is 2, "connection recovery is not supported".
    async fn logout_for_recovery(&mut self, cid: u16) -> u8 {
        if !self.session.erl2() {
            return logout::RECOVERY_NOT_SUPPORTED;
        }
        if cid == self.cid {
            self.closing = true;
            return logout::CLOSED;
        }
        if self.session.close_for_recovery(cid).await {
            logout::CLOSED
        } else {
            // It failed and was handed over already.
            logout::CID_NOT_FOUND
        }
    }

    /// Stops the listed tasks: those not yet running are dropped, running ones finish
    /// with their responses suppressed before this returns. True when every task was
    /// stopped before it answered.
    async fn abort_tasks(&mut self, tasks: Vec<(u32, u16, Arc<TaskCtl>)>) -> bool {
        let mut all = true;
        for (itt, cid, ctl) in &tasks {
            all &= ctl.abort();
            if !ctl.running() {
                if *cid == self.cid {
                    self.drop_task(*itt);
                } else {
                    self.session.send_to(*cid, ConnEvent::Abort(*itt));
                }
            }
        }
        for (_, _, ctl) in tasks {
            if ctl.running() {
                let done = ctl.done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if !ctl.finished.load(Ordering::Acquire) {
                    done.await;
                }
            }
        }
        all
    }

    /// Whether `view`, this session's view of its target, is the whole target as now
    /// configured.
    fn sees_whole(&self, view: &TargetNode) -> bool {
        self.shared
            .find_target(&view.iqn)
            .is_some_and(|t| t.luns.keys().eq(view.luns.keys()))
    }

    pub(super) async fn on_tmf(&mut self, t: TaskMgmtRequest) {
        let function = t.function;
        let lun = lun_from_wire(t.lun);
        let target = self.session.target();
        let lu: Option<Arc<LogicalUnit>> = match (&target, lun) {
            (Some(tg), Some(l)) => tg.luns.get(&l).cloned(),
            _ => None,
        };
        let mut reassigned = None;
        let response = match function {
            tmf::ABORT_TASK => match self.session.task(t.referenced_task_tag) {
                None => tmf::NO_TASK,
                Some((_, _, ctl)) if ctl.finished.load(Ordering::Acquire) => tmf::NO_TASK,
                Some((cid, _, ctl)) => {
                    // A task that answered while we got here "does not exist" any more.
                    if self
                        .abort_tasks(vec![(t.referenced_task_tag, cid, ctl)])
                        .await
                    {
                        tmf::COMPLETE
                    } else {
                        tmf::NO_TASK
                    }
                }
            },
            tmf::ABORT_TASK_SET | tmf::CLEAR_TASK_SET | tmf::LOGICAL_UNIT_RESET => match &lu {
                None => tmf::NO_LUN,
                Some(lu) => {
                    let tasks = self.session.tasks_on(lun);
                    self.abort_tasks(tasks).await;
                    if function == tmf::LOGICAL_UNIT_RESET {
                        // May wait for the other targets of a shared store.
                        let lu = lu.clone();
                        let _ = tokio::task::spawn_blocking(move || lu.reset()).await;
                    }
                    tmf::COMPLETE
                }
            },
            tmf::TARGET_WARM_RESET | tmf::TARGET_COLD_RESET => match &target {
                None => tmf::NOT_SUPPORTED,
                // A target reset reaches every LU and (cold) every session of the target:
                // not for an initiator that LUN masking keeps from some of them (LIO too
                // refuses target resets unless an initiator's ACL allows them).
                Some(tg) if !self.sees_whole(tg) => tmf::AUTHORIZATION_FAILED,
                Some(tg) => {
                    let tasks = self.session.tasks_on(None);
                    self.abort_tasks(tasks).await;
                    let luns: Vec<Arc<LogicalUnit>> = tg.luns.values().cloned().collect();
                    let _ =
                        tokio::task::spawn_blocking(move || luns.iter().for_each(|l| l.reset()))
                            .await;
                    tmf::COMPLETE
                }
            },
            tmf::CLEAR_ACA => tmf::NOT_SUPPORTED,
            tmf::TASK_REASSIGN => {
                match self
                    .session
                    .reassign(t.referenced_task_tag, self.cid, t.expdatasn)
                {
                    Ok(how) => {
                        reassigned = Some(how);
                        tmf::COMPLETE
                    }
                    Err(response) => response,
                }
            }
            _ => tmf::NOT_SUPPORTED,
        };
        self.shared.events.task_management(function, response);
        peer_log!(
            info,
            "connection {}: task management function {function} on LUN {:?}: response {response}",
            self.cid,
            lun
        );
        self.send(TaskMgmtResponse {
            response,
            itt: t.itt,
            ..Default::default()
        });
        if let Some(how) = reassigned {
            self.adopt(t.referenced_task_tag, how);
        }
        if function == tmf::TARGET_COLD_RESET && response == tmf::COMPLETE {
            // A cold reset ends every session of the target (RFC 7143 11.5.1), whatever
            // LUNs each sees.
            if let Some(tg) = target {
                for s in self.shared.all_sessions() {
                    if s.target_name()
                        .is_some_and(|n| n.eq_ignore_ascii_case(&tg.iqn))
                    {
                        s.broadcast(|| ConnEvent::Close("target cold reset"));
                    }
                }
            }
        }
    }
}
