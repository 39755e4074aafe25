//! ErrorRecoveryLevel 2: connection recovery with task reassignment (RFC 7143 6.2.2, 7.2,
//! 11.5.1 TASK REASSIGN, 11.14 Logout "remove the connection for recovery").
//!
//! When a connection of an ERL 2 session fails, or is logged out for recovery, its tasks
//! are not dropped: a task still receiving data keeps what it received, a running task
//! keeps running, and a finished task keeps its Data-In and status until the initiator
//! acknowledges the status by ExpStatSN. All of them wait (DefaultTime2Wait +
//! DefaultTime2Retain) for a TASK REASSIGN on another connection of the session, which
//! then carries them on: R2Ts for the data still missing, the answer when it comes, or
//! the kept Data-In from the initiator's ExpDataSN and the status again.
//!
//! Nothing here runs below ERL 2: every entry point returns at once.

use std::time::{Duration, Instant};

use iscsi::serial::sn_lt;

use super::*;
use crate::conn::Task;

/// State kept for reassignment, inside the session's lock.
#[derive(Default)]
pub(super) struct Retained {
    /// Data-In and status of finished tasks until their status is acknowledged, by ITT.
    answers: TagMap<u32, Answer>,
    /// Tasks of failed connections waiting for TASK REASSIGN, by ITT.
    orphans: TagMap<u32, Orphan>,
    /// Highest ExpStatSN seen on each connection.
    acked: TagMap<u16, u32>,
}

struct Answer {
    /// The connection that sends (or sent) it: StatSN is per connection.
    cid: u16,
    statsn: Option<u32>,
    pdus: Vec<Pdu>,
}

struct Orphan {
    /// A command still receiving data or waiting for its CmdSN turn; None once it runs.
    task: Option<Task>,
    since: Instant,
}

/// What the connection that reassigned a task must do with it.
pub(crate) enum Reassigned {
    /// Take the command over: ask for the data still missing, run it in its turn.
    Pending(Box<Task>),
    /// It is running; its answer will come to the new connection.
    Running,
    /// It had finished: these PDUs go out again (Data-In from ExpDataSN, the status).
    Answered(Vec<Pdu>),
}

/// TMF responses for a refused reassignment (RFC 7143 11.6.1).
pub mod refused {
    pub const NO_TASK: u8 = 1;
    pub const STILL_ALLEGIANT: u8 = 3;
    pub const NOT_SUPPORTED: u8 = 4;
}

/// The ITT and StatSN of a PDU carrying a SCSI status.
pub fn status_of(p: &Pdu) -> Option<(u32, u32)> {
    match p {
        Pdu::ScsiResponse(r) => Some((r.itt, r.statsn)),
        Pdu::DataIn(d) if d.status_present => Some((d.itt, d.statsn)),
        _ => None,
    }
}

/// The ExpStatSN an initiator PDU acknowledges with.
pub fn exp_statsn(p: &Pdu) -> Option<u32> {
    match p {
        Pdu::ScsiCommand(p) => Some(p.expstatsn),
        Pdu::DataOut(p) => Some(p.expstatsn),
        Pdu::NopOut(p) => Some(p.expstatsn),
        Pdu::TaskMgmtRequest(p) => Some(p.expstatsn),
        Pdu::TextRequest(p) => Some(p.expstatsn),
        Pdu::LogoutRequest(p) => Some(p.expstatsn),
        Pdu::SnackRequest(p) => Some(p.expstatsn),
        _ => None,
    }
}

impl Session {
    /// Connection recovery is in force (discovery sessions have nothing to recover).
    pub fn erl2(&self) -> bool {
        self.params.error_recovery_level >= 2 && !self.is_discovery()
    }

    /// How long a failed connection's tasks wait for reassignment.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(
            u64::from(self.params.default_time2wait) + u64::from(self.params.default_time2retain),
        )
    }

    /// A task of connection `cid` finished with `pdus`. Gives them back when `cid` sends
    /// them itself; otherwise they went to the connection the task was reassigned to, or
    /// wait for a reassignment. At ERL 2 the answer is kept until its status is
    /// acknowledged.
    pub fn answer_here(&self, cid: u16, itt: u32, pdus: Vec<Pdu>) -> Option<Vec<Pdu>> {
        if !self.erl2() {
            return Some(pdus);
        }
        // Copied outside the lock: nearly always both copies are needed.
        let kept = pdus.clone();
        let mut g = self.lock();
        let owner = g.tasks.get(&itt).map_or(cid, |r| r.cid);
        g.retained.answers.insert(
            itt,
            Answer {
                cid: owner,
                statsn: None,
                pdus: kept,
            },
        );
        if g.retained.orphans.contains_key(&itt) {
            return None;
        }
        if owner == cid {
            return Some(pdus);
        }
        if let Some(h) = g.conns.get(&owner) {
            let _ = h.events.send(ConnEvent::Send(pdus));
        }
        None
    }

    /// The writer of `cid` gave these tasks' statuses these StatSNs: (ITT, StatSN), in
    /// the order it stamped them.
    pub fn stamped(&self, cid: u16, stamps: &[(u32, u32)]) {
        let mut g = self.lock();
        for &(itt, statsn) in stamps {
            if let Some(a) = g.retained.answers.get_mut(&itt) {
                if a.cid == cid {
                    a.statsn = Some(statsn);
                }
            }
        }
    }

    /// The answers of `itts`, if still kept, now hold copies of their Data-In rather than
    /// the store's lent pages, whose blocks are then free for writes (see the writer's
    /// LENT_HOLD). A copy that fails (the file shrank under the mapping) leaves the answer
    /// without its data: a reassignment would then resend a short read, which the status
    /// already kept says nothing about, so the answer is dropped instead.
    pub fn unlend_retained(&self, itts: &[u32]) {
        let mut g = self.lock();
        for itt in itts {
            let Some(a) = g.retained.answers.get_mut(itt) else {
                continue;
            };
            if a.pdus
                .iter_mut()
                .map(crate::conn::unlend)
                .any(|r| r.is_err())
            {
                g.retained.answers.remove(itt);
            }
        }
    }

    /// The initiator acknowledged on `cid` every status before `exp`: those answers are
    /// not kept any longer.
    pub fn acknowledge(&self, cid: u16, exp: u32) {
        let mut g = self.lock();
        let r = &mut g.retained;
        if r.acked.insert(cid, exp) == Some(exp) {
            return;
        }
        let orphans = &r.orphans;
        r.answers.retain(|itt, a| {
            a.cid != cid || orphans.contains_key(itt) || !a.statsn.is_some_and(|s| sn_lt(s, exp))
        });
    }

    /// A new command takes `itt`: whatever an earlier task of that tag left is forgotten.
    pub(super) fn forget_retained(g: &mut Inner, itt: u32) {
        if !g.retained.answers.is_empty() {
            g.retained.answers.remove(&itt);
        }
        if !g.retained.orphans.is_empty() {
            g.retained.orphans.remove(&itt);
        }
    }

    /// Connection `cid` ended without a logout that ends its tasks: they wait for
    /// reassignment. `tasks` are its commands still receiving data or waiting for their
    /// turn; `events` is its queue, drained here under the session's lock so that no
    /// delivery falls between the connection and the orphans. True when that was the
    /// session's last connection.
    pub(crate) fn retire_connection(
        &self,
        cid: u16,
        handle: &ConnHandle,
        mut tasks: TagMap<u32, Task>,
        events: &mut mpsc::UnboundedReceiver<ConnEvent>,
    ) -> bool {
        let mut g = self.lock();
        if g.conns
            .get(&cid)
            .is_some_and(|h| h.events.same_channel(&handle.events))
        {
            g.conns.remove(&cid);
        }
        events.close();
        while let Ok(ev) = events.try_recv() {
            if let ConnEvent::Deliver(Ordered::Scsi(itt)) = ev {
                if let Some(t) = tasks.get_mut(&itt) {
                    t.mark_delivered();
                }
            }
        }
        let now = Instant::now();
        let Inner {
            tasks: registry,
            retained,
            ..
        } = &mut *g;
        for (itt, task) in tasks {
            retained.orphans.insert(
                itt,
                Orphan {
                    task: Some(task),
                    since: now,
                },
            );
        }
        let running = registry
            .iter()
            .filter(|(_, r)| r.cid == cid)
            .map(|(i, _)| *i);
        let answered = retained
            .answers
            .iter()
            .filter(|(_, a)| a.cid == cid)
            .map(|(i, _)| *i);
        let more: Vec<u32> = running.chain(answered).collect();
        for itt in more {
            retained.orphans.entry(itt).or_insert(Orphan {
                task: None,
                since: now,
            });
        }
        retained.acked.remove(&cid);
        g.conns.is_empty()
    }

    /// A delivery or abort for a connection that is gone, at ERL 2: it applies to the
    /// orphan. True when there was one.
    pub(super) fn orphan_event(g: &mut Inner, ev: &ConnEvent) -> bool {
        match ev {
            ConnEvent::Deliver(Ordered::Scsi(itt)) => {
                match g
                    .retained
                    .orphans
                    .get_mut(itt)
                    .and_then(|o| o.task.as_mut())
                {
                    Some(t) => {
                        t.mark_delivered();
                        true
                    }
                    None => false,
                }
            }
            ConnEvent::Abort(itt) => {
                let pending = g
                    .retained
                    .orphans
                    .get(itt)
                    .is_some_and(|o| o.task.is_some());
                if pending {
                    g.retained.orphans.remove(itt);
                    g.tasks.remove(itt);
                }
                pending
            }
            _ => false,
        }
    }

    /// A command's CmdSN turn came while it waits for reassignment (ERL 2; nothing below).
    pub fn deliver_orphan(&self, itt: u32) {
        if self.erl2() {
            Self::orphan_event(&mut self.lock(), &ConnEvent::Deliver(Ordered::Scsi(itt)));
        }
    }

    /// TASK REASSIGN of `itt` to connection `to` (RFC 7143 11.5.1). `exp_datasn` is the
    /// first Data-In the initiator still wants (0: all). Err is the TMF response.
    pub(crate) fn reassign(&self, itt: u32, to: u16, exp_datasn: u32) -> Result<Reassigned, u8> {
        if !self.erl2() {
            return Err(refused::NOT_SUPPORTED);
        }
        let retention = self.retention();
        let mut g = self.lock();
        Self::purge_locked(&mut g, retention);
        let Some(orphan) = g.retained.orphans.remove(&itt) else {
            // Its connection has not been logged out: reassignment must wait for that.
            let live = g.tasks.contains_key(&itt) || g.retained.answers.contains_key(&itt);
            return Err(if live {
                refused::STILL_ALLEGIANT
            } else {
                refused::NO_TASK
            });
        };
        if let Some(r) = g.tasks.get_mut(&itt) {
            r.cid = to;
        }
        for (cid, item) in g.pending.values_mut() {
            if *item == Ordered::Scsi(itt) {
                *cid = to;
            }
        }
        if let Some(a) = g.retained.answers.get_mut(&itt) {
            a.cid = to;
            a.statsn = None;
            let resend = a
                .pdus
                .iter()
                .filter(|p| match p {
                    Pdu::DataIn(d) => d.status_present || d.datasn >= exp_datasn,
                    _ => true,
                })
                .cloned()
                .collect();
            return Ok(Reassigned::Answered(resend));
        }
        Ok(match orphan.task {
            Some(t) => Reassigned::Pending(Box::new(t)),
            None => Reassigned::Running,
        })
    }

    /// Drops what waited for reassignment longer than DefaultTime2Wait + Time2Retain, and
    /// answers kept for connections that are gone.
    pub fn purge_retained(&self) {
        let retention = self.retention();
        Self::purge_locked(&mut self.lock(), retention);
    }

    fn purge_locked(g: &mut Inner, retention: Duration) {
        let Inner {
            tasks,
            retained,
            conns,
            ..
        } = g;
        retained.orphans.retain(|itt, o| {
            let keep = o.since.elapsed() < retention;
            if !keep && o.task.is_some() {
                tasks.remove(itt);
            }
            keep
        });
        let orphans = &retained.orphans;
        retained
            .answers
            .retain(|itt, a| conns.contains_key(&a.cid) || orphans.contains_key(itt));
    }

    /// Closes connection `cid` for recovery (logout reason 2, or the same CID logging in
    /// again) and waits until it has handed its tasks over. False when there was no such
    /// connection.
    pub async fn close_for_recovery(&self, cid: u16) -> bool {
        if !self.send_to(cid, ConnEvent::Recover) {
            return false;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.has_connection(cid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }
}
