//! The commands this logical unit runs: one descriptor per opcode and service action, and
//! everything that reads them. REPORT SUPPORTED OPERATION CODES lists the rows, `execute`
//! refuses what has none and dispatches to the row's handler, the transport asks the row
//! how many bytes the initiator sends, and reservations ask it how the command meets them.
//! A command is added by one row in [`COMMANDS`] and its handler.

use scsi_proto::cdb::{be16, be32, block_range};
use scsi_proto::opcodes::service_action as sa;
use scsi_proto::opcodes::*;

use super::{read_defect_data, read_media_serial_number, report_luns, LogicalUnit};
use crate::cdb::truncate;
use crate::pr::{Access, Fail};
use crate::sense::{self, Sense};
use crate::xcopy::{self, Reach};
use crate::Command;

/// A coarse class of commands, for counting them and for the paths beside `execute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// READ (6, 10, 12, 16).
    Read,
    /// The commands that write data they carry to the medium: WRITE, WRITE AND VERIFY,
    /// ORWRITE, WRITE ATOMIC, COMPARE AND WRITE, WRITE SAME.
    Write,
    /// SYNCHRONIZE CACHE.
    Flush,
    /// Everything else, and commands this logical unit does not know.
    Other,
}

/// How many bytes the initiator sends with a command (its Data-Out).
#[derive(Clone, Copy)]
pub(crate) enum DataOut {
    None,
    /// The CDB's transfer length, in logical blocks.
    Blocks,
    /// The big-endian PARAMETER LIST LENGTH field of `len` bytes at byte `at` of the CDB.
    List {
        at: usize,
        len: usize,
    },
    /// Data of another length than the CDB implies is refused (SBC-4 4.28.2 lets the device
    /// server do so), so the transport hands over what came and the handler judges it.
    AsSent,
    /// A rule of the command's own, given the CDB and the block size.
    Rule(fn(&[u8], u32) -> Option<u32>),
}

/// What must hold before a command runs, beyond reservations.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Nothing: it answers with a unit attention pending (neither reported nor cleared)
    /// and while a SANITIZE runs (SAM-5 5.14, SBC-4 4.11: INQUIRY, REPORT LUNS, REQUEST
    /// SENSE).
    None,
    /// A pending unit attention is reported first; a running SANITIZE refuses it.
    Ready,
    /// As `Ready`, and a removable logical unit must hold its medium.
    Medium,
}

/// Whether a logical unit offers a command.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    Always,
    /// Only on thin-provisioned logical units (LBPME).
    Thin,
    /// SPC-2 reservations: not where other targets export the logical unit too, since a
    /// reservation of an I_T nexus cannot be kept consistent with those targets'
    /// (`LuConfig::peer_port_groups`).
    Reservations,
    /// Persistent reservations: wherever SPC-2's are, and where other targets export the
    /// logical unit too if its store keeps them in its cluster
    /// (`Backstore::cluster_reservations`).
    Persistent,
    /// Explicit ALUA: only where the store keeps the target port groups' states.
    PortGroups,
}

/// What a handler is given: the command, the other logical units its I_T nexus may reach
/// (EXTENDED COPY's copy targets), and whether the transport has aborted it.
pub(crate) struct Call<'a> {
    pub cmd: &'a Command<'a>,
    pub reach: &'a dyn Reach,
    pub aborted: &'a dyn Fn() -> bool,
}

type Handler = fn(&LogicalUnit, &Call<'_>) -> Result<Vec<u8>, Fail>;

/// One supported command.
pub(crate) struct Op {
    pub opcode: u8,
    /// The service action (CDB byte 1, bits 4-0) of the opcodes that carry one.
    pub sa: Option<u8>,
    /// Bits the device server looks at, byte by byte (SPC-5 6.35's CDB USAGE DATA); its
    /// length is the CDB length.
    pub usage: &'static [u8],
    pub data_out: DataOut,
    /// How it meets reservations another I_T nexus holds.
    pub access: Access,
    pub gate: Gate,
    pub offered: Offered,
    pub class: Class,
    pub run: Handler,
}

/// What a logical unit offers beyond the commands every one has.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offer {
    pub thin: bool,
    pub reservations: bool,
    pub persistent: bool,
    pub port_groups: bool,
}

impl Op {
    fn is_offered(&self, offer: Offer) -> bool {
        match self.offered {
            Offered::Always => true,
            Offered::Thin => offer.thin,
            Offered::Reservations => offer.reservations,
            Offered::Persistent => offer.persistent,
            Offered::PortGroups => offer.port_groups,
        }
    }

    /// Bytes the initiator sends for `cdb`, one of this row's.
    fn data_out_len(&self, cdb: &[u8], block_size: u32) -> Option<u32> {
        match self.data_out {
            DataOut::None => Some(0),
            DataOut::Blocks => blocks_len(cdb, block_size),
            DataOut::List { at, len } => Some(
                cdb[at..at + len]
                    .iter()
                    .fold(0u32, |n, &b| (n << 8) | u32::from(b)),
            ),
            DataOut::AsSent => None,
            DataOut::Rule(rule) => rule(cdb, block_size),
        }
    }
}

/// The CDB's blocks, in bytes.
fn blocks_len(cdb: &[u8], block_size: u32) -> Option<u32> {
    let r = block_range(cdb);
    r.blocks
        .checked_mul(u64::from(block_size))
        .and_then(|n| u32::try_from(n).ok())
}

/// VERIFY sends, by BYTCHK, nothing, the blocks to compare, or one block to compare each
/// with (SBC-4 5.33); BYTCHK 10b is reserved.
fn verify_data_out(cdb: &[u8], block_size: u32) -> Option<u32> {
    match (cdb[1] >> 1) & 0x03 {
        0 => Some(0),
        1 => blocks_len(cdb, block_size),
        3 => Some(block_size),
        _ => None,
    }
}

/// WRITE ATOMIC (16) has its transfer length in bytes 12-13.
fn write_atomic_data_out(cdb: &[u8], block_size: u32) -> Option<u32> {
    u32::try_from(u64::from(be16(&cdb[12..14])) * u64::from(block_size)).ok()
}

fn extended_copy_data_out(cdb: &[u8], _: u32) -> Option<u32> {
    Some(xcopy::parameter_list_length(cdb))
}

const FF: u8 = 0xff;
const NO_DATA: DataOut = DataOut::None;
const PR_IN_USAGE: &[u8] = &[PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0];
const PR_OUT_USAGE: &[u8] = &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0];
const PR_OUT_DATA: DataOut = DataOut::List { at: 5, len: 4 };
const SANITIZE_USAGE: &[u8] = &[SANITIZE, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0];
const SANITIZE_DATA: DataOut = DataOut::List { at: 7, len: 2 };

/// Every command this logical unit runs, the rows of one opcode together. The reservation
/// rules (`access`) are SPC-5 table 70 and SBC-4 table 13; the gates SAM-5 5.14 and SBC-4
/// 4.11.
#[rustfmt::skip]
pub(crate) const COMMANDS: &[Op] = &[
    Op { opcode: TEST_UNIT_READY, sa: None, usage: &[TEST_UNIT_READY, 0, 0, 0, 0, 0],
        data_out: NO_DATA, access: Access::Unreserved, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |_, _| Ok(Vec::new()) },
    Op { opcode: REQUEST_SENSE, sa: None, usage: &[REQUEST_SENSE, 0x01, 0, 0, FF, 0],
        data_out: NO_DATA, access: Access::Always, gate: Gate::None, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.request_sense(c.cmd.cdb, c.cmd.nexus)?) },
    Op { opcode: READ_6, sa: None, usage: &[READ_6, 0x1f, FF, FF, FF, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Read,
        run: |lu, c| Ok(lu.read(c.cmd.cdb)?) },
    Op { opcode: WRITE_6, sa: None, usage: &[WRITE_6, 0x1f, FF, FF, FF, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: INQUIRY, sa: None, usage: &[INQUIRY, 0x01, FF, FF, FF, 0],
        data_out: NO_DATA, access: Access::Always, gate: Gate::None, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.inquiry(c.cmd.cdb)?) },
    Op { opcode: MODE_SELECT_6, sa: None, usage: &[MODE_SELECT_6, 0x11, 0, 0, FF, 0],
        data_out: DataOut::List { at: 4, len: 1 }, access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.mode_select(c.cmd)?) },
    Op { opcode: RESERVE_6, sa: None, usage: &[RESERVE_6, 0, 0, 0, 0, 0],
        data_out: NO_DATA, access: Access::Reserve, gate: Gate::Ready, offered: Offered::Reservations, class: Class::Other,
        run: |lu, c| lu.pr().reserve(c.cmd.nexus, c.cmd.cdb).map(|_| Vec::new()) },
    Op { opcode: RELEASE_6, sa: None, usage: &[RELEASE_6, 0, 0, 0, 0, 0],
        data_out: NO_DATA, access: Access::Release, gate: Gate::Ready, offered: Offered::Reservations, class: Class::Other,
        run: |lu, c| lu.pr().release(c.cmd.nexus, c.cmd.cdb).map(|_| Vec::new()) },
    Op { opcode: MODE_SENSE_6, sa: None, usage: &[MODE_SENSE_6, 0x08, FF, FF, FF, 0],
        data_out: NO_DATA, access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.mode_sense(c.cmd.cdb)?) },
    Op { opcode: START_STOP_UNIT, sa: None, usage: &[START_STOP_UNIT, 0x01, 0, 0x0f, 0xf7, 0],
        data_out: NO_DATA, access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.start_stop(c.cmd.cdb)?) },
    Op { opcode: SEND_DIAGNOSTIC, sa: None, usage: &[SEND_DIAGNOSTIC, 0xf7, 0, FF, FF, 0],
        data_out: DataOut::List { at: 3, len: 2 }, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.send_diagnostic(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: PREVENT_ALLOW, sa: None, usage: &[PREVENT_ALLOW, 0, 0, 0, 0x03, 0],
        data_out: NO_DATA, access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.prevent_allow(c.cmd.cdb, c.cmd.nexus)?) },
    Op { opcode: READ_CAPACITY_10, sa: None, usage: &[READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        data_out: NO_DATA, access: Access::Unreserved, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.read_capacity_10(c.cmd.cdb)?) },
    Op { opcode: READ_10, sa: None, usage: &[READ_10, 0x18, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Read,
        run: |lu, c| Ok(lu.read(c.cmd.cdb)?) },
    Op { opcode: WRITE_10, sa: None, usage: &[WRITE_10, 0x18, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: WRITE_VERIFY_10, sa: None, usage: &[WRITE_VERIFY_10, 0x12, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_verify(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: VERIFY_10, sa: None, usage: &[VERIFY_10, 0x16, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: DataOut::Rule(verify_data_out), access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.verify(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: PRE_FETCH_10, sa: None, usage: &[PRE_FETCH_10, 0x02, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.pre_fetch(c.cmd.cdb)?) },
    Op { opcode: SYNCHRONIZE_CACHE_10, sa: None, usage: &[SYNCHRONIZE_CACHE_10, 0x02, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: NO_DATA, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Flush,
        run: |lu, c| Ok(lu.synchronize_cache(c.cmd.cdb)?) },
    Op { opcode: READ_DEFECT_DATA_10, sa: None, usage: &[READ_DEFECT_DATA_10, 0, 0x1f, 0, 0, 0, 0, FF, FF, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |_, c| Ok(read_defect_data(c.cmd.cdb)?) },
    Op { opcode: WRITE_SAME_10, sa: None, usage: &[WRITE_SAME_10, 0x08, FF, FF, FF, FF, 0x1f, FF, FF, 0],
        data_out: DataOut::AsSent, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_same(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: UNMAP, sa: None, usage: &[UNMAP, 0, 0, 0, 0, 0, 0x1f, FF, FF, 0],
        data_out: DataOut::List { at: 7, len: 2 }, access: Access::Write, gate: Gate::Medium, offered: Offered::Thin, class: Class::Other,
        run: |lu, c| Ok(lu.unmap(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: SANITIZE, sa: Some(sa::sanitize::OVERWRITE), usage: SANITIZE_USAGE,
        data_out: SANITIZE_DATA, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.sanitize(c.cmd.cdb, c.cmd.data_out, c.aborted)?) },
    Op { opcode: SANITIZE, sa: Some(sa::sanitize::BLOCK_ERASE), usage: SANITIZE_USAGE,
        data_out: SANITIZE_DATA, access: Access::Write, gate: Gate::Medium, offered: Offered::Thin, class: Class::Other,
        run: |lu, c| Ok(lu.sanitize(c.cmd.cdb, c.cmd.data_out, c.aborted)?) },
    Op { opcode: SANITIZE, sa: Some(sa::sanitize::CRYPTOGRAPHIC_ERASE), usage: SANITIZE_USAGE,
        data_out: SANITIZE_DATA, access: Access::Write, gate: Gate::Medium, offered: Offered::Thin, class: Class::Other,
        run: |lu, c| Ok(lu.sanitize(c.cmd.cdb, c.cmd.data_out, c.aborted)?) },
    Op { opcode: SANITIZE, sa: Some(sa::sanitize::EXIT_FAILURE_MODE), usage: SANITIZE_USAGE,
        data_out: SANITIZE_DATA, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.sanitize(c.cmd.cdb, c.cmd.data_out, c.aborted)?) },
    Op { opcode: MODE_SELECT_10, sa: None, usage: &[MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, FF, FF, 0],
        data_out: DataOut::List { at: 7, len: 2 }, access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.mode_select(c.cmd)?) },
    Op { opcode: RESERVE_10, sa: None, usage: &[RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        data_out: NO_DATA, access: Access::Reserve, gate: Gate::Ready, offered: Offered::Reservations, class: Class::Other,
        run: |lu, c| lu.pr().reserve(c.cmd.nexus, c.cmd.cdb).map(|_| Vec::new()) },
    Op { opcode: RELEASE_10, sa: None, usage: &[RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        data_out: NO_DATA, access: Access::Release, gate: Gate::Ready, offered: Offered::Reservations, class: Class::Other,
        run: |lu, c| lu.pr().release(c.cmd.nexus, c.cmd.cdb).map(|_| Vec::new()) },
    Op { opcode: MODE_SENSE_10, sa: None, usage: &[MODE_SENSE_10, 0x18, FF, FF, 0, 0, 0, FF, FF, 0],
        data_out: NO_DATA, access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.mode_sense(c.cmd.cdb)?) },
    Op { opcode: PERSISTENT_RESERVE_IN, sa: Some(sa::persistent_reserve_in::READ_KEYS), usage: PR_IN_USAGE,
        data_out: NO_DATA, access: Access::Always, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_in(c.cmd.cdb) },
    Op { opcode: PERSISTENT_RESERVE_IN, sa: Some(sa::persistent_reserve_in::READ_RESERVATION), usage: PR_IN_USAGE,
        data_out: NO_DATA, access: Access::Always, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_in(c.cmd.cdb) },
    Op { opcode: PERSISTENT_RESERVE_IN, sa: Some(sa::persistent_reserve_in::REPORT_CAPABILITIES), usage: PR_IN_USAGE,
        data_out: NO_DATA, access: Access::Always, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_in(c.cmd.cdb) },
    Op { opcode: PERSISTENT_RESERVE_IN, sa: Some(sa::persistent_reserve_in::READ_FULL_STATUS), usage: PR_IN_USAGE,
        data_out: NO_DATA, access: Access::Always, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_in(c.cmd.cdb) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::REGISTER), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::RESERVE), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::RELEASE), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::CLEAR), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::PREEMPT), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::PREEMPT_AND_ABORT), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::REGISTER_AND_IGNORE_EXISTING_KEY), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: PERSISTENT_RESERVE_OUT, sa: Some(sa::persistent_reserve_out::REGISTER_AND_MOVE), usage: PR_OUT_USAGE,
        data_out: PR_OUT_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Persistent, class: Class::Other,
        run: |lu, c| lu.persistent_out(c.cmd, c.reach) },
    Op { opcode: EXTENDED_COPY, sa: Some(sa::extended_copy::LID1),
        usage: &[EXTENDED_COPY, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: DataOut::Rule(extended_copy_data_out), access: Access::Write, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        // Each copy target's medium is checked when a segment reaches it.
        run: |lu, c| Ok(lu.extended_copy(c.cmd, c.reach)?) },
    Op { opcode: RECEIVE_COPY_RESULTS, sa: Some(sa::receive_copy_results::COPY_STATUS),
        usage: &[RECEIVE_COPY_RESULTS, 0x1f, FF, 0, 0, 0, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.receive_copy_results(c.cmd.cdb, c.cmd.nexus)?) },
    Op { opcode: RECEIVE_COPY_RESULTS, sa: Some(sa::receive_copy_results::OPERATING_PARAMETERS),
        usage: &[RECEIVE_COPY_RESULTS, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Unreserved, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.receive_copy_results(c.cmd.cdb, c.cmd.nexus)?) },
    Op { opcode: READ_16, sa: None, usage: &[READ_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Read,
        run: |lu, c| Ok(lu.read(c.cmd.cdb)?) },
    Op { opcode: COMPARE_AND_WRITE, sa: None, usage: &[COMPARE_AND_WRITE, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, 0, 0, 0, FF, 0x1f, 0],
        data_out: DataOut::AsSent, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.compare_and_write(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: WRITE_16, sa: None, usage: &[WRITE_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: ORWRITE_16, sa: None, usage: &[ORWRITE_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.orwrite(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: WRITE_VERIFY_16, sa: None, usage: &[WRITE_VERIFY_16, 0x12, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_verify(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: VERIFY_16, sa: None, usage: &[VERIFY_16, 0x16, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Rule(verify_data_out), access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.verify(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: PRE_FETCH_16, sa: None, usage: &[PRE_FETCH_16, 0x02, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.pre_fetch(c.cmd.cdb)?) },
    Op { opcode: SYNCHRONIZE_CACHE_16, sa: None, usage: &[SYNCHRONIZE_CACHE_16, 0x02, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: NO_DATA, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Flush,
        run: |lu, c| Ok(lu.synchronize_cache(c.cmd.cdb)?) },
    Op { opcode: WRITE_SAME_16, sa: None, usage: &[WRITE_SAME_16, 0x09, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::AsSent, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_same(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: WRITE_ATOMIC_16, sa: None, usage: &[WRITE_ATOMIC_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x3f, 0],
        data_out: DataOut::Rule(write_atomic_data_out), access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_atomic(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: SERVICE_ACTION_IN_16, sa: Some(sa::service_action_in_16::READ_CAPACITY_16),
        usage: &[SERVICE_ACTION_IN_16, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Unreserved, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.read_capacity_16(c.cmd.cdb)?) },
    Op { opcode: SERVICE_ACTION_IN_16, sa: Some(sa::service_action_in_16::GET_LBA_STATUS),
        usage: &[SERVICE_ACTION_IN_16, 0x1f, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Thin, class: Class::Other,
        run: |lu, c| Ok(lu.get_lba_status(c.cmd.cdb)?) },
    Op { opcode: REPORT_LUNS, sa: None, usage: &[REPORT_LUNS, 0, FF, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Always, gate: Gate::None, offered: Offered::Always, class: Class::Other,
        // Told the inventory, the nexus has no REPORTED LUNS DATA HAS CHANGED to hear.
        run: |lu, c| { lu.luns_reported(c.cmd.nexus); Ok(report_luns(&[0], c.cmd.cdb)?) } },
    Op { opcode: MAINTENANCE_IN, sa: Some(sa::maintenance_in::REPORT_TARGET_PORT_GROUPS),
        usage: &[MAINTENANCE_IN, 0x3f, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Always, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.report_target_port_groups(c.cmd.cdb)?) },
    Op { opcode: MAINTENANCE_IN, sa: Some(sa::maintenance_in::REPORT_SUPPORTED_OPERATION_CODES),
        usage: &[MAINTENANCE_IN, 0x1f, 0x87, FF, FF, FF, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Always, gate: Gate::Ready, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(report_supported_opcodes(c.cmd.cdb, lu.offer())?) },
    // Explicit ALUA, only where the targets of a gateway group keep their states in the
    // store (`backstore::groups`). SPC-4 table 70: allowed under every reservation.
    Op { opcode: MAINTENANCE_OUT, sa: Some(sa::maintenance_out::SET_TARGET_PORT_GROUPS),
        usage: &[MAINTENANCE_OUT, 0x1f, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: DataOut::List { at: 6, len: 4 }, access: Access::Always, gate: Gate::Ready, offered: Offered::PortGroups, class: Class::Other,
        run: |lu, c| Ok(lu.set_target_port_groups(c.cmd)?) },
    Op { opcode: READ_12, sa: None, usage: &[READ_12, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Read,
        run: |lu, c| Ok(lu.read(c.cmd.cdb)?) },
    Op { opcode: WRITE_12, sa: None, usage: &[WRITE_12, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write(c.cmd.cdb, c.cmd.data_out)?) },
    // SPC-5 table 70 allows it under every reservation; no medium, no serial number to give.
    Op { opcode: SERVICE_ACTION_IN_12, sa: Some(sa::service_action_in_12::READ_MEDIA_SERIAL_NUMBER),
        usage: &[SERVICE_ACTION_IN_12, 0x1f, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Always, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |_, c| Ok(read_media_serial_number(c.cmd.cdb)?) },
    Op { opcode: WRITE_VERIFY_12, sa: None, usage: &[WRITE_VERIFY_12, 0x12, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Blocks, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_verify(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: VERIFY_12, sa: None, usage: &[VERIFY_12, 0x16, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
        data_out: DataOut::Rule(verify_data_out), access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |lu, c| Ok(lu.verify(c.cmd.cdb, c.cmd.data_out)?) },
    Op { opcode: READ_DEFECT_DATA_12, sa: None, usage: &[READ_DEFECT_DATA_12, 0x1f, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
        data_out: NO_DATA, access: Access::Read, gate: Gate::Medium, offered: Offered::Always, class: Class::Other,
        run: |_, c| Ok(read_defect_data(c.cmd.cdb)?) },
    // Reservoir's own (vendor-specific): WRITE (16) whose Data-Out is one zstd frame of the
    // blocks, for `rsv sync` on data that compresses (`docs/replicate.md`).
    Op { opcode: WRITE_COMPRESSED_16, sa: None, usage: &[WRITE_COMPRESSED_16, 0x08, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0, 0],
        data_out: DataOut::AsSent, access: Access::Write, gate: Gate::Medium, offered: Offered::Always, class: Class::Write,
        run: |lu, c| Ok(lu.write_compressed(c.cmd.cdb, c.cmd.data_out)?) },
];

/// Index of each opcode's first row in [`COMMANDS`] (`u8::MAX`: none), so that a command
/// finds its row in a few steps; building it fails the build if an opcode's rows are not
/// together.
static FIRST_ROW: [u8; 256] = first_rows();

const fn first_rows() -> [u8; 256] {
    assert!(COMMANDS.len() < u8::MAX as usize);
    let mut first = [u8::MAX; 256];
    let mut i = COMMANDS.len();
    while i > 0 {
        i -= 1;
        let op = COMMANDS[i].opcode as usize;
        assert!(
            first[op] == u8::MAX || first[op] as usize == i + 1,
            "the rows of one opcode must be together"
        );
        first[op] = i as u8;
    }
    first
}

/// The rows of `opcode`.
fn rows(opcode: u8) -> impl Iterator<Item = &'static Op> {
    let first = FIRST_ROW[opcode as usize] as usize;
    COMMANDS
        .get(first..)
        .unwrap_or_default()
        .iter()
        .take_while(move |o| o.opcode == opcode)
}

/// Whether the opcode is one whose service action lives in CDB byte 1.
fn has_service_action(opcode: u8) -> bool {
    rows(opcode).any(|o| o.sa.is_some())
}

/// The row of a CDB that has passed `check_len`, whether or not the logical unit offers it.
pub(crate) fn find(cdb: &[u8]) -> Option<&'static Op> {
    let sa = service_action_of(cdb);
    rows(cdb[0]).find(|o| o.sa.is_none_or(|s| s == sa))
}

/// The row of a CDB that has passed `check_len`, if the logical unit offers it; else the
/// refusal SPC prescribes.
pub(crate) fn offered(cdb: &[u8], offer: Offer) -> Result<&'static Op, Sense> {
    let opcode = cdb[0];
    // Reservations a LU does not offer are refused as a whole, whatever the service
    // action (see `LuConfig::peer_port_groups`).
    if (!offer.reservations && rows(opcode).any(|o| o.offered == Offered::Reservations))
        || (!offer.persistent && rows(opcode).any(|o| o.offered == Offered::Persistent))
    {
        return Err(sense::INVALID_COMMAND_OPERATION_CODE);
    }
    match find(cdb).filter(|o| o.is_offered(offer)) {
        Some(op) => Ok(op),
        // A known opcode with an unknown service action is a bad field, not a bad opcode.
        None if has_service_action(opcode) => Err(Sense::invalid_field_in_cdb(1, Some(4))),
        None => Err(sense::INVALID_COMMAND_OPERATION_CODE),
    }
}

/// Bytes the initiator is to send for this CDB, or `None` if the CDB is not one this
/// logical unit knows the length of (the transport then hands over what came).
pub(crate) fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u32> {
    scsi_proto::cdb::check_len(cdb).ok()?;
    find(cdb)?.data_out_len(cdb, block_size)
}

/// The class of a command; [`Class::Other`] for one this logical unit does not know.
pub fn class_of(cdb: &[u8]) -> Class {
    match scsi_proto::cdb::check_len(cdb) {
        Ok(()) => find(cdb).map_or(Class::Other, |o| o.class),
        Err(_) => Class::Other,
    }
}

fn offered_rows(offer: Offer) -> impl Iterator<Item = &'static Op> {
    COMMANDS.iter().filter(move |o| o.is_offered(offer))
}

/// Command timeouts descriptor: none are reported as specific, so all are zero.
fn timeouts() -> [u8; 12] {
    let mut t = [0u8; 12];
    t[1] = 0x0a;
    t
}

/// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN / 0Ch).
fn report_supported_opcodes(cdb: &[u8], offer: Offer) -> Result<Vec<u8>, Sense> {
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = be16(&cdb[4..6]);
    let alloc = be32(&cdb[6..10]) as usize;
    let data = match options {
        0 => {
            let mut list = Vec::new();
            for o in offered_rows(offer) {
                list.push(o.opcode);
                list.push(0);
                list.extend_from_slice(&u16::from(o.sa.unwrap_or(0)).to_be_bytes());
                list.push(0);
                let mut flags = 0;
                if o.sa.is_some() {
                    flags |= 0x01;
                }
                if rctd {
                    flags |= 0x02;
                }
                list.push(flags);
                list.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                if rctd {
                    list.extend_from_slice(&timeouts());
                }
            }
            let mut data = (list.len() as u32).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            data
        }
        1..=3 => {
            let sa_cmd = has_service_action(req_op);
            match options {
                1 if sa_cmd => return Err(Sense::invalid_field_in_cdb(2, Some(2))),
                2 if !sa_cmd => return Err(Sense::invalid_field_in_cdb(2, Some(2))),
                _ => {}
            }
            let found = offered_rows(offer).find(|o| {
                o.opcode == req_op
                    && (!sa_cmd || options == 1 || o.sa.map(u16::from) == Some(req_sa))
            });
            let mut data = vec![0u8; 4];
            match found {
                Some(o) => {
                    // SUPPORT 011b: supported as in the standard.
                    data[1] = if rctd { 0x83 } else { 0x03 };
                    data[2..4].copy_from_slice(&(o.usage.len() as u16).to_be_bytes());
                    data.extend_from_slice(o.usage);
                    if rctd {
                        data.extend_from_slice(&timeouts());
                    }
                }
                // SUPPORT 001b: not supported; no usage data.
                None => data[1] = 0x01,
            }
            data
        }
        _ => return Err(Sense::invalid_field_in_cdb(2, Some(2))),
    };
    Ok(truncate(data, alloc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_as_long_as_its_group_and_unique() {
        for (i, o) in COMMANDS.iter().enumerate() {
            assert_eq!(o.usage[0], o.opcode, "row {i}");
            assert_eq!(
                scsi_proto::cdb::cdb_len(o.opcode),
                Some(o.usage.len()),
                "row {i}"
            );
            if let Some(sa) = o.sa {
                assert_eq!(
                    o.usage[1] & 0x1f,
                    0x1f,
                    "row {i}: the service action field is used"
                );
                assert!(sa <= 0x1f, "row {i}");
            }
            let same = COMMANDS
                .iter()
                .filter(|p| p.opcode == o.opcode && p.sa == o.sa)
                .count();
            assert_eq!(same, 1, "row {i} is not the only one of its command");
        }
    }

    #[test]
    fn every_row_is_found_by_its_cdb() {
        for o in COMMANDS {
            let mut cdb = o.usage.to_vec();
            cdb[1] = o.sa.unwrap_or(0);
            let found = find(&cdb).expect("found");
            assert_eq!((found.opcode, found.sa), (o.opcode, o.sa));
        }
        assert!(find(&[0xff, 0, 0, 0, 0, 0]).is_none());
        assert!(find(&[MAINTENANCE_IN, 0x1e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_none());
    }
}
