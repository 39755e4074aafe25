//! The target's logical unit: SBC/SPC command emulation against the `backstore::Backstore`
//! trait (INQUIRY/VPD, mode pages, reservations, EXTENDED COPY, SANITIZE...), sans-IO but
//! for the store it is handed. The commands it runs are the rows of one table
//! (`lu/commands.rs`); SCSI's words (opcodes, status, sense, CDB fields) are
//! `scsi_proto`'s, re-exported here as `opcodes`, `status`, `sense` and `cdb`.
//!
//! The transport hands a [`LogicalUnit`] one [`Command`] at a time (from any number of
//! threads) and gets back a [`Response`]; residuals against the expected data transfer
//! length are the transport's business.

pub mod alua;
pub mod cdb;
pub mod compressed;
pub mod fence;
mod inquiry;
mod lu;
mod mode;
pub mod opcodes;
mod pr;
mod range_lock;
mod sanitize;
mod xcopy;

pub use lu::{
    class_of, AbortTasks, AsyncFlush, AsyncRead, AsyncWrite, Class, LentRead, LogicalUnit,
};
// What one target of a gateway group tells the others with a reservation change, as text
// through the cluster (public for the fuzz target that reads it as another target wrote it).
pub use pr::{decode_notices, encode_notices, Event as ReservationEvent};
// The vocabulary, where the logical unit and its users have always found it.
pub use fence::{Fence, FencePass};
pub use scsi_proto::{sense, status, Sense};
pub use xcopy::{Designator, OnlyItself, Reach};

/// Static identity and limits of a logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuConfig {
    /// 512 or 4096.
    pub block_size: u32,
    /// Logical blocks per physical block, as a power of two (READ CAPACITY(16) LOGICAL
    /// BLOCKS PER PHYSICAL BLOCK EXPONENT): 3 with 512-byte blocks is a 4 KiB-sector disk.
    pub physical_block_exponent: u8,
    pub read_only: bool,
    pub removable: bool,
    /// Thin provisioning: UNMAP, WRITE SAME with UNMAP, GET LBA STATUS, LBPME.
    pub thin: bool,
    /// T10 vendor identification of the standard INQUIRY data (8 characters).
    pub vendor: String,
    /// 16 characters.
    pub product: String,
    /// 4 characters.
    pub revision: String,
    pub serial: String,
    /// NAA designator; unique per logical unit. Its top nibble selects NAA 5 or 6.
    pub naa_id: u64,
    pub t10_vendor_id: String,
    /// Vendor-specific part of the T10 vendor ID designator.
    pub device_id: String,
    pub optimal_transfer_blocks: u32,
    pub max_transfer_blocks: u32,
    /// Where persistent reservations made with APTPL are kept; `None`: they cannot be.
    pub pr_file: Option<std::path::PathBuf>,
    /// The target port every nexus arrives through (iSCSI: target name + portal group).
    pub target_name: String,
    pub target_port_group: u16,
    pub relative_port: u16,
    /// The target port groups of other targets that export this same logical unit
    /// (multipath across targets: another process on the same image), each with one target
    /// port whose relative identifier is the group's. REPORT TARGET PORT GROUPS lists them
    /// beside this one, all active/optimized, so every target answers alike; and since
    /// reservations could not be kept consistent with theirs, a logical unit with peers
    /// offers none (RESERVE/RELEASE and PERSISTENT RESERVE IN/OUT: ILLEGAL REQUEST,
    /// INVALID COMMAND OPERATION CODE).
    pub peer_port_groups: Vec<u16>,
    /// Bytes per second a SANITIZE OVERWRITE writes at most (`None`: unpaced); see the
    /// `sanitize` module.
    pub sanitize_rate: Option<u64>,
}

impl Default for LuConfig {
    fn default() -> Self {
        Self {
            block_size: 512,
            physical_block_exponent: 0,
            read_only: false,
            removable: false,
            thin: true,
            vendor: "RESERVOI".into(),
            product: "Reservoir LUN".into(),
            revision: "0001".into(),
            serial: "0000000000000001".into(),
            naa_id: 0x6000_0000_0000_0001,
            t10_vendor_id: "RESERVOI".into(),
            device_id: "reservoir-lun-1".into(),
            optimal_transfer_blocks: 2048,
            max_transfer_blocks: 16384,
            pr_file: None,
            target_name: "iqn.2026-11.org.reservoir:target0".into(),
            target_port_group: 1,
            relative_port: 1,
            peer_port_groups: Vec::new(),
            sanitize_rate: Some(DEFAULT_SANITIZE_RATE),
        }
    }
}

/// SANITIZE OVERWRITE's pace unless configured: 128 MiB/s, below md's default ceiling for
/// a RAID resync (200,000 KiB/s); the embedded default's 1 GiB takes 8 s.
pub const DEFAULT_SANITIZE_RATE: u64 = 128 << 20;

/// An I_T nexus (initiator port + target port), numbered by the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nexus(pub u64);

/// One SCSI command as the transport received it.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    pub cdb: &'a [u8],
    /// Everything the initiator sent for this command (at most the expected data transfer
    /// length).
    pub data_out: &'a [u8],
    pub nexus: Nexus,
}

/// The outcome of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u8,
    /// Sense data (fixed format unless the initiator asked otherwise) with CHECK CONDITION.
    pub sense: Option<Vec<u8>>,
    /// Data for the initiator, already cut to the CDB's allocation length.
    pub data_in: Vec<u8>,
}

impl Response {
    pub fn good(data_in: Vec<u8>) -> Self {
        Self {
            status: status::GOOD,
            sense: None,
            data_in,
        }
    }

    pub fn check_condition(sense: &Sense) -> Self {
        Self {
            status: status::CHECK_CONDITION,
            sense: Some(sense.fixed()),
            data_in: Vec::new(),
        }
    }
}

/// REPORT LUNS (SPC-5 6.33) answered by the target for the LUNs it exposes to this nexus.
pub fn report_luns(luns: &[u16], cdb: &[u8]) -> Response {
    match lu::report_luns(luns, cdb) {
        Ok(data) => Response::good(data),
        Err(s) => Response::check_condition(&s),
    }
}

/// The answer for a LUN that does not exist (SPC-5 4.6.4): INQUIRY reports "no logical
/// unit", REQUEST SENSE and REPORT LUNS work, everything else is LOGICAL UNIT NOT SUPPORTED.
pub fn lun_not_supported(cdb: &[u8]) -> Response {
    match lu::lun_not_supported(cdb) {
        Ok(data) => Response::good(data),
        Err(s) => Response::check_condition(&s),
    }
}
