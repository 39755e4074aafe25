//! SCSI command intake and write data (RFC 7143 11.3, 11.7, 11.8): a command's checks
//! and registration, its place in CmdSN order, the R2Ts that solicit its data, the
//! Data-Out PDUs that bring it, and after a TASK REASSIGN the R2Ts again for what the old
//! connection had not received. A command runs (`exec`) once its turn has come and its
//! data is complete.

use std::sync::Arc;

use backstore::buffers::Buf;
use bytes::{Buf as _, Bytes, BytesMut};
use iscsi::ffp::{self, DataRules, DataSequence, SequenceFault, WritePlan};
use iscsi::framing::PeekedHeader;
use iscsi::pdu::{
    self, lun_from_wire, reject_reason, DataOut, Opcode, Pdu, R2t, ScsiCommand, ScsiResponse,
    RESERVED_TAG,
};
use scsi::Sense;
use tracing::debug;

use crate::loglimit::peer_log;

use super::{header_of, Close, Conn};
use crate::session::{ConnEvent, Ordered, Reassigned};
use crate::task::{Task, TaskCtl, TaskRec};
use crate::wire::Out;

/// Smallest Data-Out segment read straight into its command's buffer (see
/// `Conn::placeable`): below it the copy from the receive buffer costs less than the
/// reads of its own that placing takes.
pub(super) const PLACE_MIN: usize = 32 * 1024;

/// A Data-Out's segment on its way from the socket into its command's buffer, which it
/// holds meanwhile (see `Conn::place_start`).
pub(super) struct Placing {
    /// The Data-Out, its data left empty.
    pdu: DataOut,
    buf: Buf,
    /// Next byte to fill, and the end of the segment, in `buf`.
    at: usize,
    end: usize,
}

impl Placing {
    /// Where the next bytes of the segment go.
    pub(super) fn rest(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.end]
    }

    pub(super) fn filled(&mut self, n: usize) {
        self.at += n;
    }

    pub(super) fn is_full(&self) -> bool {
        self.at == self.end
    }
}

/// Whether Data-Out `d` with `len` bytes continues one of `task`'s open data sequences.
fn check_data_out(task: &Task, d: &DataOut, len: u32) -> Result<(), SequenceFault> {
    let seq = if d.ttt == RESERVED_TAG {
        task.unsolicited.as_ref()
    } else {
        task.r2ts.iter().find(|s| s.ttt == d.ttt)
    };
    match seq {
        None => Err(SequenceFault::unknown_ttt(d.ttt)),
        Some(seq) => seq.check(d.datasn, d.buffer_offset, len, d.final_),
    }
}

/// Largest write a single command may ask us to buffer. Bigger transfers are refused with
/// CHECK CONDITION before any memory is committed; the Block Limits VPD page advertises
/// less than this.
const MAX_TASK_BYTES: u32 = 64 << 20;

impl Conn {
    pub(super) fn on_scsi(&mut self, cmd: ScsiCommand) -> Result<(), Close> {
        // Only a refusal needs the header back; building it is not free on the hot path.
        let reject = |conn: &Self, cmd: ScsiCommand, reason: u8| {
            conn.reject(reason, &header_of(&Pdu::ScsiCommand(cmd)));
        };
        if self.session.is_discovery() {
            // Discovery sessions carry no SCSI (RFC 7143 4.3).
            reject(self, cmd, reject_reason::PROTOCOL_ERROR);
            return Ok(());
        }
        let imm = cmd.data.len() as u32;
        let rules = DataRules::from(&self.session.params);
        let plan = match WritePlan::target(cmd.write, cmd.edtl, imm, cmd.final_, &rules) {
            Ok(plan) => plan,
            Err(e) => {
                peer_log!(warn, "connection {}: ITT {:#x}: {e}", self.cid, cmd.itt);
                reject(self, cmd, reject_reason::PROTOCOL_ERROR);
                return Ok(());
            }
        };
        if !cmd.immediate {
            let (exp, max) = self.session.window();
            if !iscsi::serial::sn_in_window(cmd.cmdsn, exp, max) {
                debug!(
                    "connection {}: CmdSN {} outside [{exp}, {max}]: ignored",
                    self.cid, cmd.cmdsn
                );
                return Ok(());
            }
        }
        let lun = lun_from_wire(cmd.lun);
        let ctl = Arc::new(TaskCtl::default());
        if !self.session.register_task(
            cmd.itt,
            TaskRec {
                cid: self.cid,
                lun: lun.unwrap_or(u16::MAX),
                ctl: ctl.clone(),
            },
        ) {
            peer_log!(
                warn,
                "connection {}: ITT {:#x} already in use",
                self.cid,
                cmd.itt
            );
            reject(self, cmd, reject_reason::INVALID_PDU_FIELD);
            return Ok(());
        }
        let sink = (cmd.write && cmd.edtl > MAX_TASK_BYTES)
            .then(|| scsi::Response::check_condition(&Sense::invalid_field_in_cdb(0, None)));
        let keep = if sink.is_some() || !cmd.write {
            0
        } else {
            cmd.edtl as usize
        };
        let mut buf = Buf::take(keep);
        if keep > 0 {
            buf[..imm as usize].copy_from_slice(&cmd.data);
        }
        let unsolicited_end = plan.unsolicited_end;
        let unsolicited =
            (unsolicited_end > imm).then(|| DataSequence::new(RESERVED_TAG, imm..unsolicited_end));
        let itt = cmd.itt;
        let immediate = cmd.immediate;
        let cmdsn = cmd.cmdsn;
        let write = cmd.write;
        let mut task = Task {
            cmd: ScsiCommand {
                data: Bytes::new(),
                ..cmd
            },
            lun,
            ctl,
            buf,
            received: imm,
            unsolicited,
            r2ts: Vec::new(),
            next_solicit: unsolicited_end,
            next_r2tsn: 0,
            delivered: false,
            sink,
        };
        if write {
            self.solicit(&mut task);
        }
        self.tasks.insert(itt, task);
        if immediate {
            self.deliver_now(itt);
            return Ok(());
        }
        match self.session.order(self.cid, cmdsn, Ordered::Scsi(itt)) {
            Ok(ready) => {
                // SCSI commands never need an await to deliver, but other PDUs in the
                // queue behind this one might; hand those to the event path.
                for (cid, item) in ready {
                    match item {
                        Ordered::Scsi(i) if cid == self.cid => self.deliver_now(i),
                        other => {
                            if !self.session.send_to(cid, ConnEvent::Deliver(other)) {
                                debug!("connection {cid} is gone; its command is dropped");
                            }
                        }
                    }
                }
            }
            Err(e) => {
                debug!(
                    "connection {}: command ITT {itt:#x} ignored: {e:?}",
                    self.cid
                );
                self.drop_task(itt);
            }
        }
        Ok(())
    }

    pub(super) fn deliver_now(&mut self, itt: u32) {
        match self.tasks.get_mut(&itt) {
            Some(t) => {
                t.delivered = true;
                if t.data_complete() {
                    self.execute(itt);
                }
            }
            // A command of an earlier connection with this CID, waiting for reassignment.
            None => self.session.deliver_orphan(itt),
        }
    }

    /// Sends R2Ts until MaxOutstandingR2T are out or everything is asked for.
    fn solicit(&mut self, task: &mut Task) {
        let rules = DataRules::from(&self.session.params);
        let max_out = rules.max_outstanding_r2t.max(1) as usize;
        while task.r2ts.len() < max_out {
            let Some(range) = ffp::next_r2t(task.next_solicit, task.cmd.edtl, &rules) else {
                break;
            };
            let ttt = self.new_ttt();
            let r2tsn = task.next_r2tsn;
            task.next_r2tsn += 1;
            task.next_solicit = range.end;
            let _ = self.out.send(Out::Pdu(Pdu::R2t(R2t {
                lun: task.cmd.lun,
                itt: task.cmd.itt,
                ttt,
                r2tsn,
                buffer_offset: range.start,
                desired_data_transfer_length: range.end - range.start,
                ..Default::default()
            })));
            task.r2ts.push(DataSequence::new(ttt, range));
        }
    }

    pub(super) fn on_data_out(&mut self, d: DataOut) -> Result<(), Close> {
        let len = d.data.len() as u32;
        let Some(task) = self.tasks.get_mut(&d.itt) else {
            // The task was aborted or refused; its remaining data is dropped.
            debug!(
                "connection {}: Data-Out for unknown ITT {:#x}",
                self.cid, d.itt
            );
            return Ok(());
        };
        // At ErrorRecoveryLevel 0 a broken data sequence cannot be repaired: the command
        // ends with CHECK CONDITION and the connection goes on (SPC-5 "DATA PHASE ERROR"
        // family), so one bad command does not cost the initiator its session.
        if let Err(fault) = check_data_out(task, &d, len) {
            let r2tsn = task.next_r2tsn;
            self.tasks.remove(&d.itt);
            peer_log!(
                warn,
                "connection {}: Data-Out ITT {:#x}: {fault}; command ended",
                self.cid,
                d.itt
            );
            self.session.unregister_task(d.itt);
            let sense = Sense::data_phase_error(fault.ascq);
            self.send(ScsiResponse {
                itt: d.itt,
                expdatasn: r2tsn,
                ..ScsiResponse::with_sense(&sense.fixed())
            });
            return Ok(());
        }
        if !task.buf.is_empty() {
            let off = d.buffer_offset as usize;
            task.buf[off..off + len as usize].copy_from_slice(&d.data);
        }
        self.data_out_arrived(d.itt, d.ttt, len);
        Ok(())
    }

    /// A Data-Out header (its data segment still on the stream) whose data may be read
    /// straight into its command's buffer rather than through the connection's receive
    /// buffer and a copy: a segment of [`PLACE_MIN`] bytes or more without padding, for a
    /// task that keeps its data, and that [`Conn::on_data_out`] would accept. Anything
    /// else (`None`) is decoded whole and handled as usual, refusals included.
    pub(super) fn placeable(&self, h: &PeekedHeader) -> Option<DataOut> {
        let len = h.data_len;
        if h.bhs[0] & 0x3f != Opcode::DataOut as u8
            || len < PLACE_MIN
            || !len.is_multiple_of(4)
            || pdu::total_ahs_len(&h.bhs) != 0
        {
            return None;
        }
        let mut bhs = h.bhs;
        bhs[5..8].fill(0);
        let Ok(Pdu::DataOut(d)) = Pdu::decode(&bhs, &[], Bytes::new()) else {
            return None;
        };
        let task = self.tasks.get(&d.itt)?;
        let end = (d.buffer_offset as usize).checked_add(len)?;
        let fits = task.sink.is_none() && !task.buf.is_empty() && end <= task.buf.len();
        (fits && check_data_out(task, &d, len as u32).is_ok()).then_some(d)
    }

    /// Starts reading the segment of `d` (a [`Conn::placeable`] header, taken off the
    /// decoder) into its task's buffer, beginning with whatever of it `buf` already holds.
    /// The buffer leaves the task until [`Conn::place_done`] or [`Conn::place_abandoned`]
    /// gives it back; the task cannot run meanwhile, its data being incomplete.
    pub(super) fn place_start(&mut self, d: DataOut, len: usize, buf: &mut BytesMut) -> Placing {
        let task = self
            .tasks
            .get_mut(&d.itt)
            .expect("placeable checked the task");
        let mut data = std::mem::take(&mut task.buf);
        let at = d.buffer_offset as usize;
        let have = buf.len().min(len);
        data[at..at + have].copy_from_slice(&buf[..have]);
        buf.advance(have);
        Placing {
            pdu: d,
            buf: data,
            at: at + have,
            end: at + len,
        }
    }

    /// A placed segment is whole: its buffer goes back to the task, and the Data-Out counts
    /// as [`Conn::on_data_out`] counts one (the command runs if that was its last data).
    pub(super) fn place_done(&mut self, p: Placing) {
        let Placing {
            pdu: d, buf, end, ..
        } = p;
        let len = (end - d.buffer_offset as usize) as u32;
        if self.place_abandoned_buf(d.itt, buf) {
            self.data_out_arrived(d.itt, d.ttt, len);
        }
    }

    /// The connection ends while a segment is being placed: the buffer goes back to its
    /// task (which may be reassigned and asked for the segment again), unfilled.
    pub(super) fn place_abandoned(&mut self, p: Placing) {
        self.place_abandoned_buf(p.pdu.itt, p.buf);
    }

    /// Gives `buf` back to task `itt`; false if the task is gone (aborted meanwhile).
    fn place_abandoned_buf(&mut self, itt: u32, buf: Buf) -> bool {
        match self.tasks.get_mut(&itt) {
            Some(t) if t.buf.is_empty() => {
                t.buf = buf;
                true
            }
            _ => false,
        }
    }

    /// Counts `len` bytes of a Data-Out that was checked and whose data is in place:
    /// closes its sequence when whole (and sends the next R2Ts), runs the command once
    /// all its data is here.
    fn data_out_arrived(&mut self, itt: u32, ttt: u32, len: u32) {
        let Some(mut task) = self.tasks.remove(&itt) else {
            return;
        };
        let seq = if ttt == RESERVED_TAG {
            task.unsolicited.as_mut()
        } else {
            task.r2ts.iter_mut().find(|s| s.ttt == ttt)
        };
        // Checked before its data was taken off the stream; nothing closes a sequence
        // meanwhile, but a sequence gone is no reason to stop the connection.
        let Some(seq) = seq else {
            debug!(
                "connection {}: ITT {itt:#x}: data for a closed sequence",
                self.cid
            );
            self.tasks.insert(itt, task);
            return;
        };
        seq.advance(len);
        let seq_done = seq.is_done();
        task.received += len;
        if seq_done {
            if ttt == RESERVED_TAG {
                task.unsolicited = None;
            } else {
                task.r2ts.retain(|s| s.ttt != ttt);
                self.solicit(&mut task);
            }
        }
        let ready = task.delivered && task.data_complete();
        self.tasks.insert(itt, task);
        if ready {
            self.execute(itt);
        }
    }

    /// Carries on a task reassigned to this connection (RFC 7143 6.2.2).
    pub(super) fn adopt(&mut self, itt: u32, how: Reassigned) {
        match how {
            Reassigned::Running => {}
            Reassigned::Answered(pdus) => {
                for p in pdus {
                    self.send(p);
                }
            }
            Reassigned::Pending(mut task) => {
                self.resolicit(&mut task);
                let ready = task.delivered && task.data_complete();
                self.tasks.insert(itt, *task);
                if ready {
                    self.execute(itt);
                }
            }
        }
    }

    /// The R2Ts the old connection had out, and unsolicited data it was still receiving,
    /// are void after reassignment: asks again for what they had not brought, then goes
    /// on soliciting as usual. More gaps than MaxOutstandingR2T allows are asked for in
    /// one range from the first to the last; data received twice lands twice, harmlessly.
    fn resolicit(&mut self, task: &mut Task) {
        if !task.cmd.write {
            return;
        }
        let mut missing: Vec<(u32, u32)> = task
            .unsolicited
            .take()
            .into_iter()
            .chain(task.r2ts.drain(..))
            .filter(|s| !s.is_done())
            .map(|s| {
                let m = s.missing();
                (m.start, m.end)
            })
            .collect();
        missing.sort_unstable();
        let max_out = self.session.params.max_outstanding_r2t.max(1) as usize;
        if missing.len() > max_out {
            let (start, end) = (missing[0].0, missing[missing.len() - 1].1);
            missing = vec![(start, end)];
        }
        let asked: u32 = missing.iter().map(|(a, b)| b - a).sum();
        task.received = task.next_solicit.saturating_sub(asked);
        for (start, end) in missing {
            let ttt = self.new_ttt();
            let r2tsn = task.next_r2tsn;
            task.next_r2tsn += 1;
            task.r2ts.push(DataSequence::new(ttt, start..end));
            self.send(R2t {
                lun: task.cmd.lun,
                itt: task.cmd.itt,
                ttt,
                r2tsn,
                buffer_offset: start,
                desired_data_transfer_length: end - start,
                ..Default::default()
            });
        }
        self.solicit(task);
    }
}
