//! Running a command on the logical unit: on the connection's task when the page cache
//! answers at once; started there and answered from the store's own thread when the store
//! completes reads, writes and flushes by itself (librbd); on a blocking worker otherwise. Then turning its
//! outcome into Data-In PDUs and a SCSI Response (RFC 7143 11.4, 11.7) that go back on
//! the command's own connection (allegiance), or wherever the session says after a
//! reassignment.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use backstore::buffers::Buf;
use bytes::Bytes;
use iscsi::ffp;
use iscsi::pdu::{DataIn, Pdu, ScsiCommand, ScsiResponse};
use scsi::opcodes::REPORT_LUNS;
use scsi::LogicalUnit;
use tokio::sync::mpsc;

use super::Conn;
use crate::node::TargetNode;
use crate::session::Session;
use crate::stats::LunStats;
use crate::task::Task;
use crate::wire::{self, Out};

impl Conn {
    /// Runs the command on a blocking worker; its data and status go back on this
    /// connection (allegiance).
    pub(super) fn execute(&mut self, itt: u32) {
        let Some(task) = self.tasks.remove(&itt) else {
            return;
        };
        if task.ctl.is_aborted() {
            self.session.unregister_task(itt);
            return;
        }
        let target = self.session.target().expect("normal session");
        // An abort from another thread (PREEMPT AND ABORT) may have come since the check
        // above; from here on it waits for this task instead.
        if !task.ctl.start() {
            self.session.unregister_task(itt);
            return;
        }
        self.shared.task_started();
        self.executing.count.fetch_add(1, Ordering::AcqRel);
        // The LUN's counters, when metrics are on: held by the job, counted at its answer.
        let stats = task
            .lun
            .and_then(|l| target.stores.get(&l))
            .and_then(|s| s.stats.clone())
            .map(|s| {
                s.started();
                (s, Instant::now())
            });
        let job = Job {
            task,
            target,
            session: self.session.clone(),
            nexus: self.session.nexus,
            out: self.out.clone(),
            max_seg: self.params.max_send_data_segment_length,
            max_burst: self.session.params.max_burst_length,
            // A data digest reads the bytes in user space, and so does TLS, which
            // encrypts them there: a file's mapping is then not lent (a file cut short
            // would be SIGBUS, not the EFAULT of the kernel's read); memory is. At ERL 2
            // an answer kept for reassignment keeps its blocks for a second at most (the
            // writer).
            lend_mapping: !self.params.data_digest && !self.tls,
            stats,
        };
        // A write's answer waits while its LUN holds write answers (a consistency group's
        // cut); its data lands meanwhile.
        let hold = job
            .task
            .cmd
            .write
            .then(|| job.task.lun.and_then(|l| job.target.stores.get(&l)))
            .flatten()
            .map(|s| s.hold.clone());
        let session = self.session.clone();
        let shared = self.shared.clone();
        let executing = self.executing.clone();
        let cid = self.cid;
        // `finish` may run on a store's own thread (an asynchronous read's completion),
        // outside the runtime: it spawns through the handle.
        let rt = session.erl2().then(tokio::runtime::Handle::current);
        let answer = move |job: Job, pdus: Vec<Pdu>| {
            let ctl = &job.task.ctl;
            if ctl.claim_answer() {
                if let Some(pdus) = session.answer_here(cid, itt, pdus) {
                    for p in pdus {
                        let _ = job.out.send(Out::Pdu(p));
                    }
                }
            }
            // ERL 2 first (`rt` is set only then): may_lend() looks the LU up, and this
            // runs for every command.
            if let Some(rt) = rt.as_ref().filter(|_| job.may_lend()) {
                // At ERL 2 the session keeps the answer until its status is acknowledged,
                // and with it the blocks of a lent read: an initiator that goes quiet
                // after the read would hold writes to them up. After LENT_HOLD a kept
                // answer is copied and the blocks go (the writer does the same for what
                // the socket has not taken).
                let session = session.clone();
                rt.spawn(async move {
                    tokio::time::sleep(wire::LENT_HOLD).await;
                    session.unlend_retained(&[itt]);
                });
            }
            session.unregister_task(itt);
            ctl.finished.store(true, Ordering::Release);
            ctl.done.notify_waiters();
            if executing.count.fetch_sub(1, Ordering::AcqRel) == 1 {
                executing.idle.notify_waiters();
            }
            shared.task_finished();
        };
        let finish = move |job: Job, pdus: Vec<Pdu>| match &hold {
            Some(hold) => {
                let hold = hold.clone();
                let answer = answer.clone();
                hold.defer(Box::new(move || answer(job, pdus)))
            }
            None => answer(job, pdus),
        };
        // A read the page cache can answer costs less than the hand-over to a worker.
        if let Some(pdus) = job.run_now() {
            finish(job, pdus);
            return;
        }
        // A store that completes reads on threads of its own (librbd) answers from there:
        // no worker is parked on the read, and the answer goes straight to the writer.
        if let Some(read) = job.start_async() {
            let finish = finish.clone();
            // A store that lends its own buffers (librbd's, through the rbd store's C++
            // shim) saves the copy into ours: its bytes become the Data-In as they are.
            if job.task.cmd.edtl >= LEND_MIN && read.lends() {
                read.start_lent(move |r| {
                    let pdus = match r {
                        Ok(lent) => job.answer(
                            Answer {
                                status: scsi::status::GOOD,
                                sense: None,
                                data: Bytes::from_owner(lent),
                            },
                            None,
                        ),
                        Err(resp) => job.respond(resp, None),
                    };
                    finish(job, pdus);
                });
                return;
            }
            read.start(move |resp| {
                let pdus = job.respond(resp, None);
                finish(job, pdus);
            });
            return;
        }
        // So do its writes and flushes (SYNCHRONIZE CACHE): the data goes to the store,
        // which owns it until its callback.
        if let Some(write) = job.start_write_async() {
            let mut job = job;
            let data = std::mem::take(&mut job.task.buf);
            let finish = finish.clone();
            write.start(data, move |resp| {
                let pdus = job.respond(resp, None);
                finish(job, pdus);
            });
            return;
        }
        if let Some(flush) = job.start_flush_async() {
            let finish = finish.clone();
            flush.start(move |resp| {
                let pdus = job.respond(resp, None);
                finish(job, pdus);
            });
            return;
        }
        let queued = Instant::now();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let pdus = job.run();
            let ran = started.elapsed();
            if job.task.cmd.write && queued.elapsed() >= SLOW_WRITE {
                tracing::debug!(
                    target: "targetd::slow",
                    "a write took {:.2} ms: {:.2} waiting for a worker, {:.2} running",
                    queued.elapsed().as_secs_f64() * 1e3,
                    (started - queued).as_secs_f64() * 1e3,
                    ran.as_secs_f64() * 1e3
                );
            }
            finish(job, pdus);
        });
    }
}

/// A write that takes this long or more on a worker is logged at debug level (target
/// `targetd::slow`).
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(5);

/// Largest read copied on the connection's task when the page cache holds it.
const INLINE_READ_MAX: u32 = 128 * 1024;
/// Smallest read whose data the store lends rather than copies: below it the copy costs
/// less than the lock held until the bytes are sent.
const LEND_MIN: u32 = 32 * 1024;

/// A command ready to run, with what it needs to answer.
struct Job {
    task: Task,
    target: Arc<TargetNode>,
    /// Whose command it is: what else it may reach (EXTENDED COPY) is the session's
    /// view of the target at the time, not `target` as it was when the command came.
    session: Arc<Session>,
    nexus: scsi::Nexus,
    out: mpsc::UnboundedSender<Out>,
    max_seg: u32,
    max_burst: u32,
    /// Large reads may send a file's mapped bytes without a copy (see
    /// `LogicalUnit::try_read_lent`); a memory store's bytes may be lent whatever this says.
    lend_mapping: bool,
    /// The LUN's counters and when the command started at it (`[metrics]`).
    stats: Option<(Arc<LunStats>, Instant)>,
}

impl Job {
    /// Whether the answer may send the store's lent bytes.
    fn may_lend(&self) -> bool {
        let t = &self.task;
        !t.cmd.write
            && t.sink.is_none()
            && t.cmd.edtl >= LEND_MIN
            && t.lun
                .and_then(|l| self.target.luns.get(&l))
                .is_some_and(|lu| lu.can_lend() && (self.lend_mapping || lu.lends_memory()))
    }

    /// The answer to a read that needs no wait for a device, or `None`: use [`Job::run`]
    /// on a thread that may block.
    fn run_now(&self) -> Option<Vec<Pdu>> {
        let t = &self.task;
        if t.cmd.write || t.sink.is_some() {
            return None;
        }
        let lu = self.target.luns.get(&t.lun?)?;
        let cmd = scsi::Command {
            cdb: &t.cmd.cdb,
            data_out: &[],
            nexus: self.nexus,
        };
        if self.may_lend() {
            if let Some(lent) = lu.try_read_lent(&cmd, u64::MAX, false) {
                return Some(self.respond_lent(lent));
            }
        }
        // A large read copied inline would hold up this connection's other commands; on a
        // worker the copy overlaps with the sending of the previous ones.
        if t.cmd.edtl > INLINE_READ_MAX {
            return None;
        }
        let resp = lu.try_read_now(&cmd, INLINE_READ_MAX.into())?;
        Some(self.respond(resp, None))
    }

    /// A plain READ the logical unit can start on a store that completes it by itself
    /// (see `LogicalUnit::try_read_async`), or `None`: use [`Job::run`].
    fn start_async(&self) -> Option<scsi::AsyncRead> {
        let t = &self.task;
        if t.cmd.write || t.sink.is_some() {
            return None;
        }
        let lu = self.target.luns.get(&t.lun?)?;
        lu.try_read_async(
            &scsi::Command {
                cdb: &t.cmd.cdb,
                data_out: &[],
                nexus: self.nexus,
            },
            u64::MAX,
        )
    }

    /// A plain WRITE, with all its data here and as long as its CDB says, that the logical
    /// unit can start on a store that completes it by itself (see
    /// `LogicalUnit::try_write_async`), or `None`: use [`Job::run`]. The data stays in the
    /// task until [`scsi::AsyncWrite::start`] takes it.
    fn start_write_async(&self) -> Option<scsi::AsyncWrite> {
        let t = &self.task;
        if !t.cmd.write || t.cmd.read || t.sink.is_some() {
            return None;
        }
        let lu = self.target.luns.get(&t.lun?)?;
        let cdb = &t.cmd.cdb[..];
        let expected = LogicalUnit::data_out_len(cdb, lu.config().block_size)?;
        if expected != t.cmd.edtl || t.buf.len() != expected as usize {
            return None;
        }
        lu.try_write_async(
            &scsi::Command {
                cdb,
                data_out: &t.buf,
                nexus: self.nexus,
            },
            u64::MAX,
        )
    }

    /// A SYNCHRONIZE CACHE the logical unit can start on a store that completes flushes by
    /// itself, or `None`: use [`Job::run`].
    fn start_flush_async(&self) -> Option<scsi::AsyncFlush> {
        let t = &self.task;
        if t.cmd.write || t.sink.is_some() {
            return None;
        }
        let lu = self.target.luns.get(&t.lun?)?;
        lu.try_flush_async(&scsi::Command {
            cdb: &t.cmd.cdb,
            data_out: &[],
            nexus: self.nexus,
        })
    }

    /// The Data-In PDUs and status that carry `resp` back on this connection.
    fn respond(&self, resp: scsi::Response, spdtl_out: Option<u32>) -> Vec<Pdu> {
        self.answer(Answer::from(resp), spdtl_out)
    }

    /// A GOOD read whose Data-In PDUs send the store's lent bytes: its blocks stay locked
    /// against writes until the writer has handed the last of them to the socket.
    fn respond_lent(&self, lent: scsi::LentRead) -> Vec<Pdu> {
        let answer = Answer {
            status: scsi::status::GOOD,
            sense: None,
            data: Bytes::from_owner(lent),
        };
        self.answer(answer, None)
    }

    fn answer(&self, answer: Answer, spdtl_out: Option<u32>) -> Vec<Pdu> {
        if let Some((stats, started)) = &self.stats {
            let cmd = &self.task.cmd;
            let data_in = if cmd.read {
                answer.data.len().min(cmd.edtl as usize) as u64
            } else {
                0
            };
            // A command runs once all its Data-Out has arrived: EDTL bytes.
            let data_out = if cmd.write { u64::from(cmd.edtl) } else { 0 };
            stats.answered(
                &cmd.cdb,
                data_in + data_out,
                started.elapsed(),
                answer.status,
                answer.sense.as_deref(),
            );
        }
        build_response(
            &self.task.cmd,
            answer,
            spdtl_out,
            self.task.next_r2tsn,
            self.max_seg.max(512),
            self.max_burst.max(512),
        )
    }

    fn run(&self) -> Vec<Pdu> {
        let t = &self.task;
        let cdb = &t.cmd.cdb[..];
        let edtl = t.cmd.edtl;
        let lu = t.lun.and_then(|l| self.target.luns.get(&l));
        if let Some(lu) = lu.filter(|_| self.may_lend()) {
            let cmd = scsi::Command {
                cdb,
                data_out: &[],
                nexus: self.nexus,
            };
            if let Some(lent) = lu.try_read_lent(&cmd, u64::MAX, true) {
                return self.respond_lent(lent);
            }
        }
        // Residuals for data the initiator sends are judged against what the CDB asks for.
        let spdtl_out = match lu {
            Some(lu) if t.cmd.write => LogicalUnit::data_out_len(cdb, lu.config().block_size),
            _ => None,
        };
        let resp = if let Some(r) = &t.sink {
            r.clone()
        } else if let Some(lu) = lu {
            let run = |data_out: &[u8]| {
                lu.execute_abortable(
                    &scsi::Command {
                        cdb,
                        data_out,
                        nexus: self.nexus,
                    },
                    &*self.session,
                    &|| t.ctl.is_aborted(),
                )
            };
            // FCP-4 / SAM: when EDTL and the CDB disagree, the command is processed
            // normally except that no data beyond EDTL is transferred.
            match spdtl_out {
                Some(n) if n < edtl => run(&t.buf[..n as usize]),
                Some(n) if n > edtl => match self.fill_from_medium(lu, cdb, n) {
                    Some(mut full) => {
                        full[..t.buf.len()].copy_from_slice(&t.buf);
                        run(&full)
                    }
                    None => scsi::Response::check_condition(
                        &scsi::sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
                    ),
                },
                _ => run(&t.buf),
            }
        } else if cdb.first() == Some(&REPORT_LUNS) {
            scsi::report_luns(&self.target.lun_ids(), cdb)
        } else {
            scsi::lun_not_supported(cdb)
        };
        let resp = match (lu, cdb.first()) {
            // REPORT LUNS is answered for the target whatever LUN it is addressed to.
            (Some(_), Some(&REPORT_LUNS))
                if resp.status == scsi::status::GOOD || resp.sense.is_some() =>
            {
                scsi::report_luns(&self.target.lun_ids(), cdb)
            }
            _ => resp,
        };
        if cdb.first() == Some(&REPORT_LUNS) && resp.status == scsi::status::GOOD {
            // The inventory is the target's: reported, it has changed for none of its LUs.
            for lu in self.target.luns.values() {
                lu.luns_reported(self.nexus);
            }
        }
        self.respond(resp, spdtl_out)
    }

    /// For a write whose CDB covers more than the initiator sent: the blocks as they are on
    /// the medium, so that writing them back with the sent bytes in front changes only
    /// what was sent.
    fn fill_from_medium(&self, lu: &LogicalUnit, cdb: &[u8], len: u32) -> Option<Vec<u8>> {
        let lba = scsi::cdb::write_lba(cdb)?;
        let bs = lu.config().block_size;
        let blocks = len / bs;
        let r = lu.execute(&scsi::Command {
            cdb: &scsi::cdb::read16(lba, blocks),
            data_out: &[],
            nexus: self.nexus,
        });
        (r.status == scsi::status::GOOD && r.data_in.len() == len as usize).then_some(r.data_in)
    }
}

/// What a finished command sends back: its status, sense data, and Data-In bytes (copied
/// into a pooled buffer, or lent by the store).
struct Answer {
    status: u8,
    sense: Option<Vec<u8>>,
    data: Bytes,
}

impl From<scsi::Response> for Answer {
    fn from(r: scsi::Response) -> Self {
        Self {
            status: r.status,
            sense: r.sense,
            // Back to the pool when the writer has sent the last PDU that refers to it.
            data: if r.data_in.is_empty() {
                Bytes::new()
            } else {
                Bytes::from_owner(Buf::from_vec(r.data_in))
            },
        }
    }
}

/// The Data-In PDUs and the status for a finished command (RFC 7143 11.4, 11.7).
fn build_response(
    cmd: &ScsiCommand,
    resp: impl Into<Answer>,
    spdtl_out: Option<u32>,
    r2t_count: u32,
    max_seg: u32,
    max_burst: u32,
) -> Vec<Pdu> {
    let resp: Answer = resp.into();
    let edtl = cmd.edtl;
    let produced = resp.data.len() as u32;
    let sent = if cmd.read { produced.min(edtl) } else { 0 };
    let (overflow, underflow, residual) = if cmd.write && !cmd.read {
        match spdtl_out {
            Some(n) if n > edtl => (true, false, n - edtl),
            Some(n) if n < edtl => (false, true, edtl - n),
            _ => (false, false, 0),
        }
    } else if produced > edtl || (!cmd.read && produced > 0) {
        (true, false, produced - sent)
    } else if produced < edtl {
        (false, true, edtl - produced)
    } else {
        (false, false, 0)
    };
    let mut pdus = Vec::new();
    let good = resp.status == scsi::status::GOOD && resp.sense.is_none();
    if sent > 0 {
        let data = resp.data;
        for seg in ffp::data_in(sent, max_seg, max_burst) {
            let (off, n) = (seg.offset, seg.len);
            let with_status = off + n == sent && good;
            pdus.push(Pdu::DataIn(DataIn {
                final_: seg.final_,
                status_present: with_status,
                status: if with_status { resp.status } else { 0 },
                overflow: with_status && overflow,
                underflow: with_status && underflow,
                residual_count: if with_status { residual } else { 0 },
                lun: cmd.lun,
                itt: cmd.itt,
                datasn: seg.datasn,
                buffer_offset: off,
                data: data.slice(off as usize..(off + n) as usize),
                ..Default::default()
            }));
        }
        if good {
            return pdus;
        }
    }
    let data_in_count = pdus.len() as u32;
    let base = match &resp.sense {
        Some(s) => ScsiResponse::with_sense(s),
        None => ScsiResponse::default(),
    };
    pdus.push(Pdu::ScsiResponse(ScsiResponse {
        status: resp.status,
        overflow,
        underflow,
        residual_count: residual,
        itt: cmd.itt,
        expdatasn: if cmd.read { data_in_count } else { r2t_count },
        ..base
    }));
    pdus
}

#[cfg(test)]
mod tests {
    use super::*;
    use scsi::Sense;

    /// The PDUs answering `cmd` with `resp`, segments of 8 KiB, bursts of 1 MiB.
    fn respond(
        cmd: &ScsiCommand,
        resp: scsi::Response,
        spdtl_out: Option<u32>,
        r2t_count: u32,
    ) -> Vec<Pdu> {
        build_response(cmd, resp, spdtl_out, r2t_count, 8192, 1 << 20)
    }

    fn read_cmd(edtl: u32) -> ScsiCommand {
        ScsiCommand {
            read: true,
            edtl,
            itt: 7,
            ..Default::default()
        }
    }

    #[test]
    fn read_is_split_by_segment_and_burst_with_status_in_last_pdu() {
        let pdus = build_response(
            &read_cmd(10_000),
            scsi::Response::good(vec![1; 10_000]),
            None,
            0,
            4096,
            8192,
        );
        let dis: Vec<&DataIn> = pdus
            .iter()
            .map(|p| match p {
                Pdu::DataIn(d) => d,
                _ => panic!("only Data-In expected"),
            })
            .collect();
        let lens: Vec<usize> = dis.iter().map(|d| d.data.len()).collect();
        assert_eq!(lens, vec![4096, 4096, 1808]);
        assert_eq!(
            dis.iter().map(|d| d.final_).collect::<Vec<_>>(),
            vec![false, true, true]
        );
        assert_eq!(
            dis.iter().map(|d| d.datasn).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(dis[2].buffer_offset, 8192);
        assert!(dis[2].status_present && !dis[1].status_present);
        assert!(!dis[2].overflow && !dis[2].underflow);
    }

    #[test]
    fn read_residuals() {
        // Less data than expected: underflow.
        let pdus = respond(
            &read_cmd(10_000),
            scsi::Response::good(vec![0; 512]),
            None,
            0,
        );
        let Pdu::DataIn(d) = &pdus[0] else { panic!() };
        assert!(d.underflow && d.residual_count == 10_000 - 512);
        // More than expected: only EDTL bytes go out, overflow.
        let pdus = respond(&read_cmd(200), scsi::Response::good(vec![0; 512]), None, 0);
        let Pdu::DataIn(d) = &pdus[0] else { panic!() };
        assert_eq!(d.data.len(), 200);
        assert!(d.overflow && d.residual_count == 312);
        // EDTL 0: no Data-In at all, a SCSI Response with overflow.
        let pdus = respond(&read_cmd(0), scsi::Response::good(vec![0; 512]), None, 0);
        assert_eq!(pdus.len(), 1);
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert!(r.overflow && r.residual_count == 512);
    }

    #[test]
    fn check_condition_goes_in_a_scsi_response_with_sense() {
        let sense = Sense::invalid_field_in_cdb(2, None);
        let pdus = respond(
            &read_cmd(512),
            scsi::Response::check_condition(&sense),
            None,
            0,
        );
        assert_eq!(pdus.len(), 1);
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert_eq!(r.status, 2);
        assert_eq!(r.sense().unwrap()[2] & 0x0f, 5);
        assert!(r.underflow && r.residual_count == 512);
    }

    #[test]
    fn write_residuals_follow_the_cdb() {
        let cmd = ScsiCommand {
            write: true,
            edtl: 1024,
            ..Default::default()
        };
        let pdus = respond(&cmd, scsi::Response::good(vec![]), Some(512), 1);
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert!(r.underflow && r.residual_count == 512 && r.expdatasn == 1);
        let pdus = respond(&cmd, scsi::Response::good(vec![]), Some(4096), 1);
        let Pdu::ScsiResponse(r) = &pdus[0] else {
            panic!()
        };
        assert!(r.overflow && r.residual_count == 3072);
    }
}
