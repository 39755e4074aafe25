//! Full-feature-phase data transfer rules, sans-IO, shared by target and initiator
//! (RFC 7143 4.2.4.x, 11.3–11.8): how a write's data is split between immediate data,
//! unsolicited Data-Out and R2Ts; how data is cut into PDUs; what a data sequence must look
//! like to be accepted; and the task management and logout codes. No clock, no socket:
//! the async code on each side asks these and does what they say.

use std::ops::Range;

use crate::serial::{sn_gt, sn_le, sn_lt};

/// The negotiated session values that govern how a command's data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataRules {
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    pub max_outstanding_r2t: u16,
}

impl From<&crate::negotiate::SessionParams> for DataRules {
    fn from(p: &crate::negotiate::SessionParams) -> DataRules {
        DataRules {
            immediate_data: p.immediate_data,
            initial_r2t: p.initial_r2t,
            first_burst_length: p.first_burst_length,
            max_burst_length: p.max_burst_length,
            max_outstanding_r2t: p.max_outstanding_r2t,
        }
    }
}

/// How a write's first bytes travel before the target asks for any: `[0, immediate)` in
/// the SCSI Command PDU, `[immediate, unsolicited_end)` as unsolicited Data-Out
/// (TTT 0xffffffff), and the rest by R2T.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePlan {
    pub immediate: u32,
    pub unsolicited_end: u32,
}

/// A SCSI Command that breaks the negotiated data rules: the target rejects it
/// (Reject, protocol error).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("SCSI command breaks the negotiated data rules: {0}")]
pub struct CommandViolation(pub &'static str);

impl WritePlan {
    /// What an initiator sends of a write of `edtl` bytes unasked: immediate data as far
    /// as ImmediateData, FirstBurstLength and the target's MaxRecvDataSegmentLength
    /// (`max_send_segment`) allow, then unsolicited Data-Out up to FirstBurstLength unless
    /// InitialR2T.
    pub fn initiator(edtl: u32, rules: &DataRules, max_send_segment: u32) -> WritePlan {
        let first_burst = rules
            .first_burst_length
            .min(rules.max_burst_length)
            .min(edtl);
        let immediate = if rules.immediate_data {
            first_burst.min(max_send_segment)
        } else {
            0
        };
        let unsolicited_end = if rules.initial_r2t {
            immediate
        } else {
            first_burst
        };
        WritePlan {
            immediate,
            unsolicited_end,
        }
    }

    /// The SCSI Command's F bit: set when no unsolicited Data-Out follows it.
    pub fn final_bit(&self) -> bool {
        self.unsolicited_end == self.immediate
    }

    /// What a target must expect of a command that arrived with `immediate` bytes of data
    /// and the F bit `final_`, or why the command is refused.
    pub fn target(
        write: bool,
        edtl: u32,
        immediate: u32,
        final_: bool,
        rules: &DataRules,
    ) -> Result<WritePlan, CommandViolation> {
        if immediate > 0 && !write {
            return Err(CommandViolation("data with a command that writes nothing"));
        }
        if immediate > 0 && !rules.immediate_data {
            return Err(CommandViolation("immediate data where ImmediateData=No"));
        }
        if immediate > edtl {
            return Err(CommandViolation(
                "more immediate data than the transfer length",
            ));
        }
        if immediate > rules.first_burst_length {
            return Err(CommandViolation(
                "more immediate data than FirstBurstLength",
            ));
        }
        if !final_ && !write {
            return Err(CommandViolation(
                "F bit clear on a command without write data",
            ));
        }
        if !final_ && rules.initial_r2t {
            return Err(CommandViolation(
                "unsolicited Data-Out announced where InitialR2T=Yes",
            ));
        }
        let unsolicited_end = if write && !final_ {
            rules.first_burst_length.min(edtl)
        } else {
            immediate
        };
        Ok(WritePlan {
            immediate,
            unsolicited_end,
        })
    }
}

/// One data PDU of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub datasn: u32,
    pub offset: u32,
    pub len: u32,
    /// The F bit: the last PDU of its sequence.
    pub final_: bool,
}

/// The Data-Out PDUs of one sequence covering `range`, each at most `max_segment` bytes
/// (the receiver's MaxRecvDataSegmentLength); DataSN starts at 0 for every sequence.
pub fn data_out(range: Range<u32>, max_segment: u32) -> impl Iterator<Item = Segment> {
    let seg = max_segment.max(512);
    let mut offset = range.start;
    let mut datasn = 0;
    std::iter::from_fn(move || {
        if offset >= range.end {
            return None;
        }
        let len = seg.min(range.end - offset);
        let s = Segment {
            datasn,
            offset,
            len,
            final_: offset + len == range.end,
        };
        offset += len;
        datasn += 1;
        Some(s)
    })
}

/// The Data-In PDUs of a read that returns `total` bytes: each at most `max_segment`
/// bytes, a sequence ending (F bit) at every MaxBurstLength and at the end; DataSN counts
/// across the whole command. The last one is the one that may carry the status.
pub fn data_in(total: u32, max_segment: u32, max_burst: u32) -> impl Iterator<Item = Segment> {
    let seg = max_segment.max(1);
    let burst = max_burst.max(1);
    let mut offset = 0;
    let mut datasn = 0;
    let mut burst_used = 0;
    std::iter::from_fn(move || {
        if offset >= total {
            return None;
        }
        let len = seg.min(total - offset).min(burst - burst_used);
        burst_used += len;
        let end_of_burst = offset + len == total || burst_used == burst;
        if end_of_burst {
            burst_used = 0;
        }
        let s = Segment {
            datasn,
            offset,
            len,
            final_: end_of_burst,
        };
        offset += len;
        datasn += 1;
        Some(s)
    })
}

/// The next R2T a target sends for a write: at most MaxBurstLength from `next_solicit`,
/// `None` when all of `edtl` has been asked for.
pub fn next_r2t(next_solicit: u32, edtl: u32, rules: &DataRules) -> Option<Range<u32>> {
    (next_solicit < edtl).then(|| {
        let len = rules.max_burst_length.max(512).min(edtl - next_solicit);
        next_solicit..next_solicit + len
    })
}

/// A target's view of one data sequence it expects: the unsolicited one (TTT 0xffffffff)
/// or one R2T's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSequence {
    pub ttt: u32,
    pub start: u32,
    pub len: u32,
    received: u32,
    next_datasn: u32,
}

/// A Data-Out that breaks its sequence. At ERL 0 the command ends with CHECK CONDITION,
/// ABORTED COMMAND and ASC 0x4B with `ascq` (SPC's DATA PHASE ERROR family).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct SequenceFault {
    pub ascq: u8,
    pub why: String,
}

impl SequenceFault {
    /// A Data-Out whose TTT belongs to no sequence the target has open.
    pub fn unknown_ttt(ttt: u32) -> SequenceFault {
        SequenceFault {
            ascq: 0x01,
            why: format!("TTT {ttt:#x} that no R2T of ours carries"),
        }
    }
}

impl DataSequence {
    pub fn new(ttt: u32, range: Range<u32>) -> DataSequence {
        DataSequence {
            ttt,
            start: range.start,
            len: range.end - range.start,
            received: 0,
            next_datasn: 0,
        }
    }

    /// Checks a Data-Out against the sequence: in DataSN order, at the next offset,
    /// within the sequence, and F set exactly on the last. Nothing changes on a fault.
    pub fn check(
        &self,
        datasn: u32,
        offset: u32,
        len: u32,
        final_: bool,
    ) -> Result<(), SequenceFault> {
        let fault = |ascq, why| Err(SequenceFault { ascq, why });
        let due = self.start + self.received;
        if datasn != self.next_datasn {
            return fault(
                0x00,
                format!("DataSN {datasn} where {} was due", self.next_datasn),
            );
        }
        if offset != due {
            return fault(0x05, format!("offset {offset} where {due} was due"));
        }
        if self.received + len > self.len {
            let over = self.received + len - self.len;
            return fault(
                0x02,
                format!("{over} bytes beyond the sequence's {}", self.len),
            );
        }
        if final_ && self.received + len != self.len {
            let at = self.received + len;
            return fault(0x00, format!("F bit after {at} of {} bytes", self.len));
        }
        Ok(())
    }

    /// Records a Data-Out that [`DataSequence::check`] accepted.
    pub fn advance(&mut self, len: u32) {
        self.received += len;
        self.next_datasn += 1;
    }

    pub fn is_done(&self) -> bool {
        self.received == self.len
    }

    /// What has not arrived yet.
    pub fn missing(&self) -> Range<u32> {
        self.start + self.received..self.start + self.len
    }
}

/// The initiator's view of the command window (RFC 7143 4.2.2.1): the CmdSN its next
/// command takes, and the target's ExpCmdSN and MaxCmdSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdWindow {
    /// The CmdSN the next command gets.
    pub cmdsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
}

impl CmdWindow {
    pub fn new(cmdsn: u32, expcmdsn: u32, maxcmdsn: u32) -> CmdWindow {
        CmdWindow {
            cmdsn,
            expcmdsn,
            maxcmdsn,
        }
    }

    /// The target takes another command now.
    pub fn is_open(&self) -> bool {
        sn_le(self.cmdsn, self.maxcmdsn)
    }

    /// The CmdSN for a new command, which advances the window's next one.
    pub fn take(&mut self) -> u32 {
        let cmdsn = self.cmdsn;
        self.cmdsn = cmdsn.wrapping_add(1);
        cmdsn
    }

    /// Takes the target's ExpCmdSN and MaxCmdSN where they move forward; true when the
    /// window opened further. MaxCmdSN < ExpCmdSN - 1 is invalid and ignored.
    pub fn advance(&mut self, expcmdsn: u32, maxcmdsn: u32) -> bool {
        if sn_lt(maxcmdsn, expcmdsn.wrapping_sub(1)) {
            return false;
        }
        if sn_gt(expcmdsn, self.expcmdsn) {
            self.expcmdsn = expcmdsn;
        }
        if sn_gt(maxcmdsn, self.maxcmdsn) {
            self.maxcmdsn = maxcmdsn;
            return true;
        }
        false
    }
}

/// Why a target does not take a command into its CmdSN order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderError {
    /// Outside [ExpCmdSN, MaxCmdSN]: silently ignored (RFC 7143 3.2.2.1).
    OutOfWindow { exp: u32, max: u32 },
    /// A CmdSN already waiting.
    Duplicate,
}

/// The target's view of the command window: commands of a session, from all its
/// connections, delivered in CmdSN order. Those that arrive early wait in a ring indexed
/// by their distance from ExpCmdSN, which the window (`depth` commands) bounds.
#[derive(Debug)]
pub struct CmdOrder<T> {
    exp: u32,
    depth: u32,
    early: std::collections::VecDeque<Option<T>>,
}

impl<T> CmdOrder<T> {
    /// A window of `depth` commands (at least 1) from `first_cmdsn`.
    pub fn new(first_cmdsn: u32, depth: u32) -> CmdOrder<T> {
        CmdOrder {
            exp: first_cmdsn,
            depth: depth.max(1),
            early: std::collections::VecDeque::new(),
        }
    }

    pub fn exp_cmdsn(&self) -> u32 {
        self.exp
    }

    /// (ExpCmdSN, MaxCmdSN) to advertise.
    pub fn window(&self) -> (u32, u32) {
        (self.exp, self.exp.wrapping_add(self.depth - 1))
    }

    /// Takes a non-immediate command in; the commands now deliverable, in CmdSN order.
    pub fn admit(&mut self, cmdsn: u32, item: T) -> Result<Vec<T>, OrderError> {
        let (exp, max) = self.window();
        if !crate::serial::sn_in_window(cmdsn, exp, max) {
            return Err(OrderError::OutOfWindow { exp, max });
        }
        let at = cmdsn.wrapping_sub(exp) as usize;
        if at > 0 {
            if self.early.len() <= at {
                self.early.resize_with(at + 1, || None);
            }
            if self.early[at].is_some() {
                return Err(OrderError::Duplicate);
            }
            self.early[at] = Some(item);
            return Ok(Vec::new());
        }
        let mut ready = vec![item];
        self.early.pop_front();
        while let Some(Some(_)) = self.early.front() {
            ready.extend(self.early.pop_front().flatten());
        }
        self.exp = exp.wrapping_add(ready.len() as u32);
        Ok(ready)
    }

    /// The commands waiting for their turn.
    pub fn waiting_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.early.iter_mut().flatten()
    }

    /// Drops the waiting commands for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for slot in self.early.iter_mut() {
            if slot.as_ref().is_some_and(|t| !keep(t)) {
                *slot = None;
            }
        }
    }
}

/// Task management function codes and responses (RFC 7143 11.5.1, 11.6.1).
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;

    /// Responses.
    pub const COMPLETE: u8 = 0;
    pub const NO_TASK: u8 = 1;
    pub const NO_LUN: u8 = 2;
    pub const ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED: u8 = 3;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const AUTHORIZATION_FAILED: u8 = 6;
    pub const REJECTED: u8 = 255;
}

/// Logout reason codes and responses (RFC 7143 11.14.1, 11.15.1).
pub mod logout {
    pub const CLOSE_SESSION: u8 = 0;
    pub const CLOSE_CONNECTION: u8 = 1;
    pub const REMOVE_FOR_RECOVERY: u8 = 2;

    /// Responses.
    pub const CLOSED: u8 = 0;
    pub const CID_NOT_FOUND: u8 = 1;
    pub const RECOVERY_NOT_SUPPORTED: u8 = 2;
    pub const CLEANUP_FAILED: u8 = 3;
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: DataRules = DataRules {
        immediate_data: true,
        initial_r2t: false,
        first_burst_length: 64 << 10,
        max_burst_length: 256 << 10,
        max_outstanding_r2t: 1,
    };

    #[test]
    fn an_initiator_sends_immediate_then_unsolicited_up_to_the_first_burst() {
        let p = WritePlan::initiator(1 << 20, &RULES, 8 << 10);
        assert_eq!(
            p,
            WritePlan {
                immediate: 8 << 10,
                unsolicited_end: 64 << 10
            }
        );
        assert!(!p.final_bit());
        let small = WritePlan::initiator(4096, &RULES, 8 << 10);
        assert_eq!(
            small,
            WritePlan {
                immediate: 4096,
                unsolicited_end: 4096
            }
        );
        assert!(small.final_bit());
        let r2t_only = DataRules {
            immediate_data: false,
            initial_r2t: true,
            ..RULES
        };
        let p = WritePlan::initiator(1 << 20, &r2t_only, 8 << 10);
        assert_eq!(
            p,
            WritePlan {
                immediate: 0,
                unsolicited_end: 0
            }
        );
        assert!(p.final_bit());
        // FirstBurstLength above MaxBurstLength is held to it.
        let wide = DataRules {
            first_burst_length: 1 << 20,
            max_burst_length: 128 << 10,
            ..RULES
        };
        assert_eq!(
            WritePlan::initiator(1 << 20, &wide, 1 << 20).unsolicited_end,
            128 << 10
        );
    }

    #[test]
    fn a_target_expects_what_the_initiator_sends_and_refuses_what_the_rules_forbid() {
        for (edtl, seg) in [
            (1u32 << 20, 8u32 << 10),
            (4096, 8 << 10),
            (100 << 10, 256 << 10),
        ] {
            let sent = WritePlan::initiator(edtl, &RULES, seg);
            let seen =
                WritePlan::target(true, edtl, sent.immediate, sent.final_bit(), &RULES).unwrap();
            assert_eq!(seen, sent, "edtl {edtl} segment {seg}");
        }
        let no_imm = DataRules {
            immediate_data: false,
            ..RULES
        };
        assert!(WritePlan::target(true, 8192, 512, true, &no_imm).is_err());
        assert!(WritePlan::target(false, 8192, 512, true, &RULES).is_err());
        assert!(WritePlan::target(true, 256, 512, true, &RULES).is_err());
        assert!(WritePlan::target(true, 1 << 20, (64 << 10) + 512, true, &RULES).is_err());
        assert!(WritePlan::target(false, 8192, 0, false, &RULES).is_err());
        let r2t = DataRules {
            initial_r2t: true,
            ..RULES
        };
        assert!(WritePlan::target(true, 1 << 20, 0, false, &r2t).is_err());
        assert_eq!(
            WritePlan::target(false, 8192, 0, true, &RULES).unwrap(),
            WritePlan {
                immediate: 0,
                unsolicited_end: 0
            }
        );
    }

    #[test]
    fn data_out_covers_its_range_in_segments_with_f_on_the_last() {
        let segs: Vec<Segment> = data_out(1000..5000, 1024).collect();
        assert_eq!(segs.len(), 4);
        assert_eq!(
            segs[0],
            Segment {
                datasn: 0,
                offset: 1000,
                len: 1024,
                final_: false
            }
        );
        assert_eq!(
            segs[3],
            Segment {
                datasn: 3,
                offset: 4072,
                len: 928,
                final_: true
            }
        );
        assert_eq!(data_out(7..7, 1024).count(), 0);
    }

    #[test]
    fn data_in_ends_a_sequence_at_every_burst() {
        let segs: Vec<Segment> = data_in(10 << 10, 3 << 10, 4 << 10).collect();
        let shape: Vec<(u32, u32, bool)> = segs
            .iter()
            .map(|s| (s.offset >> 10, s.len >> 10, s.final_))
            .collect();
        assert_eq!(
            shape,
            [
                (0, 3, false),
                (3, 1, true),
                (4, 3, false),
                (7, 1, true),
                (8, 2, true)
            ]
        );
        assert!(segs.iter().enumerate().all(|(i, s)| s.datasn == i as u32));
    }

    #[test]
    fn r2ts_ask_for_a_burst_at_a_time() {
        assert_eq!(next_r2t(0, 600 << 10, &RULES), Some(0..256 << 10));
        assert_eq!(
            next_r2t(512 << 10, 600 << 10, &RULES),
            Some(512 << 10..600 << 10)
        );
        assert_eq!(next_r2t(600 << 10, 600 << 10, &RULES), None);
    }

    #[test]
    fn a_sequence_accepts_data_in_order_and_says_what_is_wrong_otherwise() {
        let mut s = DataSequence::new(7, 4096..12288);
        assert_eq!(s.check(1, 4096, 4096, false).unwrap_err().ascq, 0x00);
        assert_eq!(s.check(0, 0, 4096, false).unwrap_err().ascq, 0x05);
        assert_eq!(s.check(0, 4096, 9000, false).unwrap_err().ascq, 0x02);
        assert_eq!(s.check(0, 4096, 4096, true).unwrap_err().ascq, 0x00);
        s.check(0, 4096, 4096, false).unwrap();
        s.advance(4096);
        assert_eq!(s.missing(), 8192..12288);
        s.check(1, 8192, 4096, true).unwrap();
        s.advance(4096);
        assert!(s.is_done());
        assert_eq!(SequenceFault::unknown_ttt(9).ascq, 0x01);
    }

    /// The initiator's Data-Out for any plan and any R2T is accepted by the target's
    /// sequences, and together they deliver every byte exactly once.
    #[test]
    fn both_sides_agree_on_every_write() {
        for rules in [
            RULES,
            DataRules {
                immediate_data: false,
                initial_r2t: true,
                ..RULES
            },
            DataRules {
                initial_r2t: true,
                ..RULES
            },
            DataRules {
                immediate_data: false,
                ..RULES
            },
        ] {
            for edtl in [512u32, 4096, 65536, 65536 + 512, 1 << 20, 3 << 20] {
                for seg in [512u32, 8192, 262144] {
                    let plan = WritePlan::initiator(edtl, &rules, seg);
                    let seen =
                        WritePlan::target(true, edtl, plan.immediate, plan.final_bit(), &rules)
                            .unwrap();
                    let mut got = plan.immediate;
                    let mut check = |ttt, range: Range<u32>| {
                        let mut seq = DataSequence::new(ttt, range.clone());
                        for s in data_out(range, seg) {
                            seq.check(s.datasn, s.offset, s.len, s.final_).unwrap();
                            seq.advance(s.len);
                            got += s.len;
                        }
                        assert!(seq.is_done());
                    };
                    if seen.unsolicited_end > seen.immediate {
                        check(u32::MAX, seen.immediate..seen.unsolicited_end);
                    }
                    let mut next = seen.unsolicited_end;
                    let mut ttt = 1;
                    while let Some(r) = next_r2t(next, edtl, &rules) {
                        next = r.end;
                        check(ttt, r);
                        ttt += 1;
                    }
                    assert_eq!(got, edtl, "{rules:?} edtl {edtl} seg {seg}");
                }
            }
        }
    }
    #[test]
    fn the_initiator_window_opens_only_forward() {
        let mut w = CmdWindow::new(10, 10, 11);
        assert!(w.is_open());
        assert_eq!((w.take(), w.take()), (10, 11));
        assert!(!w.is_open());
        assert!(!w.advance(12, 10), "MaxCmdSN < ExpCmdSN - 1 is ignored");
        assert_eq!(w.expcmdsn, 10);
        assert!(w.advance(12, 20));
        assert!(w.is_open());
        assert!(!w.advance(11, 15), "an older window changes nothing");
        assert_eq!((w.expcmdsn, w.maxcmdsn), (12, 20));
    }

    #[test]
    fn the_target_delivers_in_cmdsn_order_across_connections() {
        let mut o = CmdOrder::new(u32::MAX - 1, 8);
        assert_eq!(o.window(), (u32::MAX - 1, 5));
        // Early arrivals wait; the one that fills the gap releases them all, in order.
        assert_eq!(o.admit(1, "c"), Ok(vec![]));
        assert_eq!(o.admit(u32::MAX, "b"), Ok(vec![]));
        assert_eq!(o.admit(1, "again"), Err(OrderError::Duplicate));
        assert_eq!(o.admit(u32::MAX - 1, "a"), Ok(vec!["a", "b"]));
        assert_eq!(o.exp_cmdsn(), 0);
        assert_eq!(o.admit(0, "z"), Ok(vec!["z", "c"]));
        assert_eq!(o.exp_cmdsn(), 2);
        assert_eq!(
            o.admit(10, "far"),
            Err(OrderError::OutOfWindow { exp: 2, max: 9 })
        );
        assert!(matches!(
            o.admit(1, "old"),
            Err(OrderError::OutOfWindow { .. })
        ));
        // A lost connection's waiting commands go.
        o.admit(4, "lost").unwrap();
        o.admit(5, "kept").unwrap();
        o.retain(|t| *t != "lost");
        assert_eq!(o.waiting_mut().count(), 1);
        assert_eq!(o.admit(2, "x"), Ok(vec!["x"]));
        assert_eq!(o.admit(3, "y"), Ok(vec!["y"]));
        // The slot of the dropped one stays a gap until its CmdSN comes again.
        assert_eq!(o.admit(4, "resent"), Ok(vec!["resent", "kept"]));
    }
}
