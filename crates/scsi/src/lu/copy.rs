//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS, within this logical unit or to another.

use std::sync::Arc;

use crate::cdb::{be32, truncate};
use crate::opcodes::{service_action, service_action_of};
use crate::pr::Access;
use crate::sense::{self, Sense};
use crate::xcopy::{self, CopyList, CopyState, CopyStatus, Designator, Reach, Segment};
use crate::{Command, Nexus};

use super::{lcm, LogicalUnit, Outcome, COPY_CHUNK};

/// A copy source or destination: this logical unit or another one, found by the
/// designator it is named by.
enum CopyTarget<'a> {
    This(&'a LogicalUnit),
    Other(Arc<LogicalUnit>, &'a Designator),
}

impl CopyTarget<'_> {
    /// Whether the nexus still reaches it: a reload may have masked it since the copy
    /// began. The logical unit the command was sent to is reached for as long as it runs.
    fn reachable(&self, reach: &dyn Reach) -> bool {
        match self {
            CopyTarget::This(_) => true,
            CopyTarget::Other(lu, d) => reach.find(d).is_some_and(|now| Arc::ptr_eq(&now, lu)),
        }
    }
}

impl std::ops::Deref for CopyTarget<'_> {
    type Target = LogicalUnit;

    fn deref(&self) -> &LogicalUnit {
        match self {
            CopyTarget::This(lu) => lu,
            CopyTarget::Other(lu, _) => lu,
        }
    }
}

impl LogicalUnit {
    /// EXTENDED COPY (LID1, SPC-4 6.4): the segments run in order, each read from its
    /// source logical unit and written to its destination as READ and WRITE would be.
    /// Copy targets other than this logical unit are those `reach` finds: the ones the
    /// command's I_T nexus may reach.
    pub(super) fn extended_copy(&self, cmd: &Command, reach: &dyn Reach) -> Outcome {
        let len = xcopy::parameter_list_length(cmd.cdb);
        let p = self.data(cmd.data_out, len as u64)?;
        let Some(list) = xcopy::parse(p)? else {
            return Ok(Vec::new());
        };
        let key = (cmd.nexus, list.list_id);
        let tracked = list.list_id_usage != xcopy::LIST_ID_NONE;
        let mut status = CopyStatus {
            state: CopyState::InProgress,
            segments_processed: 0,
            bytes: 0,
        };
        if tracked {
            let mut copies = self.copies();
            if copies
                .get(&key)
                .is_some_and(|s| s.state == CopyState::InProgress)
            {
                return Err(sense::OPERATION_IN_PROGRESS);
            }
            copies.insert(key, status);
        }
        let result = self.run_segments(cmd.nexus, reach, &list, &mut status);
        status.state = if result.is_ok() {
            CopyState::Done
        } else {
            CopyState::Failed
        };
        if tracked {
            let mut copies = self.copies();
            if list.list_id_usage == xcopy::LIST_ID_HOLD {
                copies.insert(key, status);
            } else {
                copies.remove(&key);
            }
        }
        result.map(|()| Vec::new())
    }

    fn run_segments(
        &self,
        nexus: Nexus,
        reach: &dyn Reach,
        list: &CopyList,
        status: &mut CopyStatus,
    ) -> Result<(), Sense> {
        for seg in &list.segments {
            let at = |s: Sense| s.at_parameter(seg.offset as u16);
            let src = self.copy_target(reach, list, seg.source).map_err(at)?;
            let dst = self.copy_target(reach, list, seg.destination).map_err(at)?;
            let reachable = || src.reachable(reach) && dst.reachable(reach);
            status.bytes += self
                .copy_segment(nexus, &src, &dst, seg, &reachable)
                .map_err(at)?;
            status.segments_processed += 1;
        }
        Ok(())
    }

    /// The logical unit a CSCD descriptor names. One the nexus may not reach is
    /// answered as one that does not exist.
    fn copy_target<'a>(
        &'a self,
        reach: &dyn Reach,
        list: &'a CopyList,
        index: u16,
    ) -> Result<CopyTarget<'a>, Sense> {
        let cscd = list
            .cscds
            .get(index as usize)
            .ok_or(sense::COPY_TARGET_DEVICE_NOT_REACHABLE)?;
        if cscd.peripheral_type != 0 {
            return Err(sense::INCORRECT_COPY_TARGET_DEVICE_TYPE);
        }
        // Only designators of logical units (association 00b) name copy targets.
        if cscd.association != 0 {
            return Err(sense::UNREACHABLE_COPY_TARGET);
        }
        let lu = if self.has_designator(&cscd.designator) {
            CopyTarget::This(self)
        } else {
            let lu = reach
                .find(&cscd.designator)
                .ok_or(sense::UNREACHABLE_COPY_TARGET)?;
            CopyTarget::Other(lu, &cscd.designator)
        };
        // A block device CSCD states the block length it expects.
        if cscd.block_size as u64 != lu.block_size {
            return Err(sense::INCORRECT_COPY_TARGET_DEVICE_TYPE);
        }
        if lu.medium_present().is_err() || lu.sanitizer.running() {
            return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
        }
        Ok(lu)
    }

    /// Copies one block to block segment; returns the bytes copied. Whatever a copy
    /// target refuses (range, write protection, reservations, I/O) aborts the copy, and
    /// so does a copy target the nexus no longer reaches (`reachable`, asked before each
    /// piece).
    fn copy_segment(
        &self,
        nexus: Nexus,
        src: &LogicalUnit,
        dst: &LogicalUnit,
        seg: &Segment,
        reachable: &dyn Fn() -> bool,
    ) -> Result<u64, Sense> {
        let unit = if seg.destination_count {
            dst.block_size
        } else {
            src.block_size
        };
        let bytes = seg.blocks as u64 * unit;
        if !bytes.is_multiple_of(src.block_size) || !bytes.is_multiple_of(dst.block_size) {
            return Err(sense::COPY_ABORTED);
        }
        let aborted = |_| sense::COPY_ABORTED;
        src.check_range(seg.source_lba, bytes / src.block_size)
            .map_err(aborted)?;
        dst.check_range(seg.destination_lba, bytes / dst.block_size)
            .map_err(aborted)?;
        dst.check_writable().map_err(aborted)?;
        // Held until the copy's writes are made.
        let _pass = dst.check_fence(nexus).map_err(aborted)?;
        // This logical unit checked the EXTENDED COPY itself against its reservations;
        // other ones are asked as for a READ or WRITE from the same nexus.
        for (lu, access) in [(src, Access::Read), (dst, Access::Write)] {
            if !std::ptr::eq(lu, self) && lu.pr().check(nexus, access).is_err() {
                return Err(sense::COPY_ABORTED);
            }
        }
        let step = lcm(src.block_size, dst.block_size);
        let chunk = (COPY_CHUNK / step).max(1) * step;
        let mut starts: Vec<u64> = (0..bytes).step_by(chunk as usize).collect();
        // Within one logical unit, a destination above an overlapping source is copied
        // from the end so that no source block is overwritten before it is read.
        if std::ptr::eq(src, dst) && seg.destination_lba > seg.source_lba {
            starts.reverse();
        }
        for start in starts {
            if !reachable() {
                return Err(sense::COPY_TARGET_DEVICE_NOT_REACHABLE);
            }
            let n = chunk.min(bytes - start);
            let (s_lba, s_blocks) = (seg.source_lba + start / src.block_size, n / src.block_size);
            let (d_lba, d_blocks) = (
                seg.destination_lba + start / dst.block_size,
                n / dst.block_size,
            );
            let data = {
                let _guards = src.lock_range_shared(s_lba, s_blocks);
                src.read_blocks(s_lba, s_blocks).map_err(aborted)?
            };
            let _guards = dst.lock_range(d_lba, d_blocks);
            dst.write_blocks(d_lba, &data).map_err(aborted)?;
        }
        dst.write_through(false).map_err(aborted)?;
        Ok(bytes)
    }

    /// RECEIVE COPY RESULTS (LID1): COPY STATUS of a held list identifier (reported once
    /// the copy has ended, then forgotten) and OPERATING PARAMETERS.
    pub(super) fn receive_copy_results(&self, cdb: &[u8], nexus: Nexus) -> Outcome {
        let sa = service_action_of(cdb);
        let alloc = be32(&cdb[10..14]) as usize;
        let data = if sa == service_action::receive_copy_results::COPY_STATUS {
            let key = (nexus, cdb[2]);
            let mut copies = self.copies();
            let status = *copies
                .get(&key)
                .ok_or(Sense::invalid_field_in_cdb(2, None))?;
            if status.state != CopyState::InProgress {
                copies.remove(&key);
            }
            status.data()
        } else {
            xcopy::operating_parameters(self.block_size as u32)
        };
        Ok(truncate(data, alloc))
    }
}
