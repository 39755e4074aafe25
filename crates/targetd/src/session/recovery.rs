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

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use iscsi::serial::sn_lt;

use super::*;
use crate::task::Task;

/// State kept for reassignment, inside the session's lock.
#[derive(Default)]
pub(super) struct Retained {
    /// Data-In and status of finished tasks until their status is acknowledged, by ITT.
    answers: TagMap<u32, Answer>,
    /// Tasks of failed connections waiting for TASK REASSIGN, by ITT.
    orphans: TagMap<u32, Orphan>,
    /// Per connection: the answers it stamped, and the last ExpStatSN it brought.
    lines: TagMap<u16, Line>,
}

struct Answer {
    /// The connection that sends (or sent) it: StatSN is per connection.
    cid: u16,
    statsn: Option<u32>,
    pdus: Vec<Pdu>,
}

/// What one connection's ExpStatSN may acknowledge.
///
/// A connection's writer stamps StatSNs in increasing order, so the answers it stamped,
/// kept in stamping order, are in StatSN order too, and an ExpStatSN acknowledges a
/// prefix of them: acknowledging pops that prefix instead of looking at every kept answer.
/// (That holds while the unacknowledged StatSNs span less than 2^31, half the serial
/// number space; past that an answer is only kept longer than it needs to be.)
///
/// A line ends with its connection (`retire_connection`). An answer of that connection
/// that a later one with the same CID never took over by reassignment is then no longer
/// acknowledged by the StatSNs of the new connection, which number another stream; it
/// goes when its ITT is used again, or at a purge once no connection has its CID.
#[derive(Default)]
struct Line {
    /// The last ExpStatSN seen on the connection.
    acked: Option<u32>,
    /// (StatSN, ITT) of each answer the connection stamped, oldest first. An entry whose
    /// answer has gone, or has been stamped again (reassigned), no longer matches it and
    /// is skipped; `Retained::stamp` sweeps such entries out before they pile up.
    stamped: VecDeque<(u32, u32)>,
}

/// Stamped entries beyond this (and twice the answers kept) are swept for stale ones.
const LINE_SLACK: usize = 64;

impl Retained {
    /// Connection `cid` gave the status of `itt` StatSN `statsn`.
    fn stamp(&mut self, cid: u16, itt: u32, statsn: u32) {
        let Some(a) = self.answers.get_mut(&itt) else {
            return;
        };
        if a.cid != cid {
            return;
        }
        a.statsn = Some(statsn);
        let line = self.lines.entry(cid).or_default();
        line.stamped.push_back((statsn, itt));
        if line.stamped.len() > 2 * self.answers.len() + LINE_SLACK {
            // An initiator that never acknowledges, while answers go by ITT reuse: at most
            // one entry per kept answer is live, so this runs once per many stamps.
            let answers = &self.answers;
            line.stamped.retain(|&(sn, itt)| {
                answers
                    .get(&itt)
                    .is_some_and(|a| a.cid == cid && a.statsn == Some(sn))
            });
        }
    }

    /// The initiator acknowledged on `cid` every status before `exp`: their answers go,
    /// except those of orphans (waiting for reassignment).
    fn acknowledge(&mut self, cid: u16, exp: u32) {
        let line = self.lines.entry(cid).or_default();
        if line.acked.replace(exp) == Some(exp) {
            return;
        }
        while let Some(&(sn, itt)) = line.stamped.front() {
            if !sn_lt(sn, exp) {
                break;
            }
            line.stamped.pop_front();
            if self.orphans.contains_key(&itt) {
                continue;
            }
            if let Entry::Occupied(e) = self.answers.entry(itt) {
                if e.get().cid == cid && e.get().statsn == Some(sn) {
                    e.remove();
                }
            }
        }
    }
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
            g.retained.stamp(cid, itt, statsn);
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
                .map(crate::task::unlend)
                .any(|r| r.is_err())
            {
                g.retained.answers.remove(itt);
            }
        }
    }

    /// The initiator acknowledged on `cid` every status before `exp`: those answers are
    /// not kept any longer.
    pub fn acknowledge(&self, cid: u16, exp: u32) {
        self.lock().retained.acknowledge(cid, exp);
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
        retained.lines.remove(&cid);
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
        for (cid, item) in g.order.waiting_mut() {
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
    /// answers (and acknowledgement lines) kept for connections that are gone.
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
        retained.lines.retain(|cid, _| conns.contains_key(cid));
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

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi::pdu::ScsiResponse;

    fn session() -> Session {
        let params = SessionParams {
            error_recovery_level: 2,
            ..Default::default()
        };
        let target = Arc::new(TargetNode {
            iqn: "iqn.2026-11.test:t".into(),
            alias: None,
            allowed_initiators: Vec::new(),
            chap: None,
            require_tls: false,
            portals: Vec::new(),
            require_chap: false,
            initiators: Vec::new(),
            luns: Default::default(),
            stores: Default::default(),
        });
        Session::new(
            1,
            [0; 6],
            "iqn.2026-11.test:i".into(),
            Some(target),
            params,
            Nexus(1),
            32,
            0,
        )
    }

    fn connect(s: &Session, cid: u16) -> (ConnHandle, mpsc::UnboundedReceiver<ConnEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let info = super::ConnInfo::new(
            s,
            cid,
            (
                ([127, 0, 0, 1], 3260).into(),
                ([127, 0, 0, 1], 40000).into(),
            ),
            None,
            Default::default(),
        );
        let handle = ConnHandle {
            events: tx,
            info: Arc::new(info),
        };
        s.add_connection(cid, handle.clone());
        (handle, rx)
    }

    fn status(itt: u32) -> Vec<Pdu> {
        vec![Pdu::ScsiResponse(ScsiResponse {
            itt,
            ..Default::default()
        })]
    }

    fn start(s: &Session, cid: u16, itt: u32) {
        let rec = TaskRec {
            cid,
            lun: 0,
            ctl: Default::default(),
        };
        assert!(s.register_task(itt, rec));
    }

    /// As the finish of a task of `cid`: true when `cid` sends the answer itself.
    fn finish(s: &Session, cid: u16, itt: u32) -> bool {
        let here = s.answer_here(cid, itt, status(itt)).is_some();
        s.unregister_task(itt);
        here
    }

    fn answered(s: &Session, cid: u16, itt: u32) {
        start(s, cid, itt);
        assert!(finish(s, cid, itt));
    }

    fn kept(s: &Session) -> Vec<u32> {
        let mut v: Vec<u32> = s.lock().retained.answers.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn line_len(s: &Session, cid: u16) -> usize {
        s.lock()
            .retained
            .lines
            .get(&cid)
            .map_or(0, |l| l.stamped.len())
    }

    #[test]
    fn acknowledgement_follows_statsn_order_not_completion_order() {
        let s = session();
        let _c = connect(&s, 1);
        for itt in [3, 1, 2, 4] {
            answered(&s, 1, itt);
        }
        // Stamped in two batches, in an order unrelated to the ITTs; 4 is not stamped yet.
        s.stamped(1, &[(3, 10), (1, 11)]);
        s.stamped(1, &[(2, 12)]);
        s.acknowledge(1, 10);
        assert_eq!(kept(&s), vec![1, 2, 3, 4]);
        s.acknowledge(1, 12);
        assert_eq!(kept(&s), vec![2, 4]);
        s.acknowledge(1, 12);
        assert_eq!(kept(&s), vec![2, 4]);
        // An answer not stamped yet has no StatSN to acknowledge.
        s.acknowledge(1, 100);
        assert_eq!(kept(&s), vec![4]);
        s.stamped(1, &[(4, 13)]);
        // An ExpStatSN behind the last one still acknowledges what is before it.
        s.acknowledge(1, 14);
        assert_eq!(kept(&s), Vec::<u32>::new());
        assert_eq!(line_len(&s, 1), 0);
    }

    #[test]
    fn acknowledgement_wraps_around_statsn_zero() {
        let s = session();
        let _c = connect(&s, 1);
        for itt in 1..=4 {
            answered(&s, 1, itt);
        }
        s.stamped(1, &[(1, u32::MAX - 1), (2, u32::MAX), (3, 0), (4, 1)]);
        s.acknowledge(1, u32::MAX);
        assert_eq!(kept(&s), vec![2, 3, 4]);
        s.acknowledge(1, 0);
        assert_eq!(kept(&s), vec![3, 4]);
        s.acknowledge(1, 2);
        assert_eq!(kept(&s), Vec::<u32>::new());
    }

    #[test]
    fn each_connection_acknowledges_only_its_own_statsns() {
        let s = session();
        let _c1 = connect(&s, 1);
        let _c2 = connect(&s, 2);
        answered(&s, 1, 1);
        answered(&s, 2, 2);
        s.stamped(1, &[(1, 5)]);
        s.stamped(2, &[(2, 5)]);
        // The writer of 1 cannot stamp an answer that 2 sends.
        s.stamped(1, &[(2, 6)]);
        s.acknowledge(2, 1000);
        assert_eq!(kept(&s), vec![1]);
        s.acknowledge(1, 6);
        assert_eq!(kept(&s), Vec::<u32>::new());
    }

    #[test]
    fn a_reassigned_answer_is_acknowledged_on_its_new_connection() {
        let s = session();
        let (h1, mut rx1) = connect(&s, 1);
        let _c2 = connect(&s, 2);
        answered(&s, 1, 7);
        s.stamped(1, &[(7, 20)]);
        assert!(!s.retire_connection(1, &h1, TagMap::default(), &mut rx1));
        match s.reassign(7, 2, 0) {
            Ok(Reassigned::Answered(pdus)) => assert_eq!(pdus.len(), 1),
            _ => panic!("the kept answer is sent again"),
        }
        // Not acknowledged by its old StatSN, and not by StatSNs of connection 2 before
        // its new one.
        s.acknowledge(2, 21);
        assert_eq!(kept(&s), vec![7]);
        s.stamped(2, &[(7, 40)]);
        s.acknowledge(2, 40);
        assert_eq!(kept(&s), vec![7]);
        s.acknowledge(2, 41);
        assert_eq!(kept(&s), Vec::<u32>::new());
    }

    #[test]
    fn a_late_stamp_of_a_closed_connection_acknowledges_nothing_elsewhere() {
        let s = session();
        let (h1, mut rx1) = connect(&s, 1);
        let _c2 = connect(&s, 2);
        answered(&s, 1, 7);
        assert!(!s.retire_connection(1, &h1, TagMap::default(), &mut rx1));
        // CID 1 logs in again while the old writer still flushes its last batch.
        let _c1 = connect(&s, 1);
        s.stamped(1, &[(7, 20)]);
        assert!(matches!(s.reassign(7, 2, 0), Ok(Reassigned::Answered(_))));
        // Connection 2 happens to give it the same StatSN.
        s.stamped(2, &[(7, 20)]);
        s.acknowledge(1, 21);
        assert_eq!(kept(&s), vec![7]);
        s.acknowledge(2, 21);
        assert_eq!(kept(&s), Vec::<u32>::new());
    }

    #[test]
    fn a_running_task_reassigned_answers_on_its_new_connection() {
        let s = session();
        let (h1, mut rx1) = connect(&s, 1);
        let (_h2, mut rx2) = connect(&s, 2);
        start(&s, 1, 9);
        assert!(!s.retire_connection(1, &h1, TagMap::default(), &mut rx1));
        assert!(matches!(s.reassign(9, 2, 0), Ok(Reassigned::Running)));
        // The task's worker still belongs to connection 1.
        assert!(!finish(&s, 1, 9));
        match rx2.try_recv() {
            Ok(ConnEvent::Send(pdus)) => assert_eq!(pdus.len(), 1),
            other => panic!("expected the answer on connection 2, got {other:?}"),
        }
        s.stamped(1, &[(9, 3)]);
        s.acknowledge(1, 4);
        assert_eq!(kept(&s), vec![9]);
        s.stamped(2, &[(9, 3)]);
        s.acknowledge(2, 4);
        assert_eq!(kept(&s), Vec::<u32>::new());
    }

    #[test]
    fn orphans_survive_acknowledgement() {
        let s = session();
        let (h1, mut rx1) = connect(&s, 1);
        answered(&s, 1, 5);
        s.stamped(1, &[(5, 8)]);
        assert!(s.retire_connection(1, &h1, TagMap::default(), &mut rx1));
        // The same CID logs in again; its StatSNs acknowledge nothing of the old one's.
        let _c1 = connect(&s, 1);
        s.acknowledge(1, 9);
        s.acknowledge(1, 1000);
        assert_eq!(kept(&s), vec![5]);
        // A task that finishes while it waits for reassignment is kept, not sent.
        start(&s, 1, 6);
        s.lock().retained.orphans.insert(
            6,
            Orphan {
                task: None,
                since: Instant::now(),
            },
        );
        assert!(!finish(&s, 1, 6));
        s.stamped(1, &[(6, 1000)]);
        s.acknowledge(1, 1001);
        assert_eq!(kept(&s), vec![5, 6]);
        assert!(matches!(s.reassign(5, 1, 0), Ok(Reassigned::Answered(_))));
    }

    #[test]
    fn an_initiator_that_never_acknowledges_leaves_a_bounded_line() {
        let s = session();
        let _c = connect(&s, 1);
        let mut statsn = 0u32;
        for round in 0..1000u32 {
            // 32 ITTs in use, reused round after round: a new task forgets the old answer.
            for itt in 0..32 {
                answered(&s, 1, itt);
                s.stamped(1, &[(itt, statsn)]);
                statsn = statsn.wrapping_add(1);
            }
            assert!(line_len(&s, 1) <= 2 * 32 + LINE_SLACK + 1, "round {round}");
        }
        assert_eq!(kept(&s).len(), 32);
        // What is still kept is acknowledged when the initiator gets to it.
        s.acknowledge(1, statsn);
        assert_eq!(kept(&s), Vec::<u32>::new());
        assert_eq!(line_len(&s, 1), 0);
    }
}
