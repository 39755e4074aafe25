//! Operation codes, and the commands this logical unit supports with their CDB usage data
//! (SPC-5 6.35), which REPORT SUPPORTED OPERATION CODES reports.

use crate::cdb::{be16, be32, truncate};
use crate::sense::Sense;

pub use scsi_proto::opcodes::*;

use scsi_proto::opcodes::service_action as sa;

pub(crate) const SA_SANITIZE_OVERWRITE: u8 = sa::sanitize::OVERWRITE;
pub(crate) const SA_SANITIZE_BLOCK_ERASE: u8 = sa::sanitize::BLOCK_ERASE;
pub(crate) const SA_SANITIZE_CRYPTO_ERASE: u8 = sa::sanitize::CRYPTOGRAPHIC_ERASE;
pub(crate) const SA_SANITIZE_EXIT_FAILURE_MODE: u8 = sa::sanitize::EXIT_FAILURE_MODE;

pub(crate) const SA_READ_CAPACITY_16: u16 = sa::service_action_in_16::READ_CAPACITY_16 as u16;
pub(crate) const SA_GET_LBA_STATUS: u16 = sa::service_action_in_16::GET_LBA_STATUS as u16;
pub(crate) const SA_REPORT_SUPPORTED_OPCODES: u16 =
    sa::maintenance_in::REPORT_SUPPORTED_OPERATION_CODES as u16;
pub(crate) const SA_REPORT_TARGET_PORT_GROUPS: u16 =
    sa::maintenance_in::REPORT_TARGET_PORT_GROUPS as u16;
pub(crate) const SA_EXTENDED_COPY_LID1: u16 = sa::extended_copy::LID1 as u16;
pub(crate) const SA_COPY_STATUS: u16 = sa::receive_copy_results::COPY_STATUS as u16;
pub(crate) const SA_OPERATING_PARAMETERS: u16 =
    sa::receive_copy_results::OPERATING_PARAMETERS as u16;

/// One supported command.
pub(crate) struct OpInfo {
    pub opcode: u8,
    pub service_action: Option<u16>,
    /// Bits the device server looks at, byte by byte; its length is the CDB length.
    pub usage: &'static [u8],
    /// Only offered on thin-provisioned logical units.
    pub thin_only: bool,
}

const fn op(opcode: u8, usage: &'static [u8]) -> OpInfo {
    OpInfo {
        opcode,
        service_action: None,
        usage,
        thin_only: false,
    }
}

const fn op_sa(opcode: u8, sa: u16, usage: &'static [u8]) -> OpInfo {
    OpInfo {
        opcode,
        service_action: Some(sa),
        usage,
        thin_only: false,
    }
}

const fn thin(mut info: OpInfo) -> OpInfo {
    info.thin_only = true;
    info
}

const FF: u8 = 0xff;

pub(crate) static OPS: &[OpInfo] = &[
    op(TEST_UNIT_READY, &[TEST_UNIT_READY, 0, 0, 0, 0, 0]),
    op(REQUEST_SENSE, &[REQUEST_SENSE, 0x01, 0, 0, FF, 0]),
    op(READ_6, &[READ_6, 0x1f, FF, FF, FF, 0]),
    op(WRITE_6, &[WRITE_6, 0x1f, FF, FF, FF, 0]),
    op(INQUIRY, &[INQUIRY, 0x01, FF, FF, FF, 0]),
    op(MODE_SELECT_6, &[MODE_SELECT_6, 0x11, 0, 0, FF, 0]),
    op(MODE_SENSE_6, &[MODE_SENSE_6, 0x08, FF, FF, FF, 0]),
    op(START_STOP_UNIT, &[START_STOP_UNIT, 0x01, 0, 0x0f, 0xf7, 0]),
    op(PREVENT_ALLOW, &[PREVENT_ALLOW, 0, 0, 0, 0x03, 0]),
    op(
        READ_CAPACITY_10,
        &[READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    ),
    op(READ_10, &[READ_10, 0x18, FF, FF, FF, FF, 0x1f, FF, FF, 0]),
    op(WRITE_10, &[WRITE_10, 0x18, FF, FF, FF, FF, 0x1f, FF, FF, 0]),
    op(
        WRITE_VERIFY_10,
        &[WRITE_VERIFY_10, 0x12, FF, FF, FF, FF, 0x1f, FF, FF, 0],
    ),
    op(
        VERIFY_10,
        &[VERIFY_10, 0x16, FF, FF, FF, FF, 0x1f, FF, FF, 0],
    ),
    op(
        PRE_FETCH_10,
        &[PRE_FETCH_10, 0x02, FF, FF, FF, FF, 0x1f, FF, FF, 0],
    ),
    op(
        SYNCHRONIZE_CACHE_10,
        &[SYNCHRONIZE_CACHE_10, 0x02, FF, FF, FF, FF, 0x1f, FF, FF, 0],
    ),
    op(
        READ_DEFECT_DATA_10,
        &[READ_DEFECT_DATA_10, 0, 0x1f, 0, 0, 0, 0, FF, FF, 0],
    ),
    op(
        WRITE_SAME_10,
        &[WRITE_SAME_10, 0x08, FF, FF, FF, FF, 0x1f, FF, FF, 0],
    ),
    thin(op(UNMAP, &[UNMAP, 0, 0, 0, 0, 0, 0x1f, FF, FF, 0])),
    op(
        MODE_SELECT_10,
        &[MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    op(
        MODE_SENSE_10,
        &[MODE_SENSE_10, 0x18, FF, FF, 0, 0, 0, FF, FF, 0],
    ),
    op(
        READ_16,
        &[
            READ_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0,
        ],
    ),
    op(
        COMPARE_AND_WRITE,
        &[
            COMPARE_AND_WRITE,
            0x18,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0,
            0,
            0,
            FF,
            0x1f,
            0,
        ],
    ),
    op(
        WRITE_16,
        &[
            WRITE_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0,
        ],
    ),
    op(
        ORWRITE_16,
        &[
            ORWRITE_16, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0,
        ],
    ),
    op(
        WRITE_VERIFY_16,
        &[
            WRITE_VERIFY_16,
            0x12,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0x1f,
            0,
        ],
    ),
    op(
        VERIFY_16,
        &[
            VERIFY_16, 0x16, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0,
        ],
    ),
    op(
        PRE_FETCH_16,
        &[
            PRE_FETCH_16,
            0x02,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0x1f,
            0,
        ],
    ),
    op(
        SYNCHRONIZE_CACHE_16,
        &[
            SYNCHRONIZE_CACHE_16,
            0x02,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0x1f,
            0,
        ],
    ),
    op(
        WRITE_SAME_16,
        &[
            WRITE_SAME_16,
            0x09,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0x1f,
            0,
        ],
    ),
    op_sa(
        SERVICE_ACTION_IN_16,
        SA_READ_CAPACITY_16,
        &[
            SERVICE_ACTION_IN_16,
            0x1f,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            FF,
            FF,
            FF,
            FF,
            0,
            0,
        ],
    ),
    thin(op_sa(
        SERVICE_ACTION_IN_16,
        SA_GET_LBA_STATUS,
        &[
            SERVICE_ACTION_IN_16,
            0x1f,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0,
            0,
        ],
    )),
    op(
        REPORT_LUNS,
        &[REPORT_LUNS, 0, FF, 0, 0, 0, FF, FF, FF, FF, 0, 0],
    ),
    op_sa(
        MAINTENANCE_IN,
        SA_REPORT_SUPPORTED_OPCODES,
        &[MAINTENANCE_IN, 0x1f, 0x87, FF, FF, FF, FF, FF, FF, FF, 0, 0],
    ),
    op(
        READ_12,
        &[READ_12, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
    ),
    op(
        WRITE_12,
        &[WRITE_12, 0x18, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
    ),
    op(
        WRITE_VERIFY_12,
        &[
            WRITE_VERIFY_12,
            0x12,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0x1f,
            0,
        ],
    ),
    op(
        VERIFY_12,
        &[VERIFY_12, 0x16, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, 0],
    ),
    op(
        READ_DEFECT_DATA_12,
        &[READ_DEFECT_DATA_12, 0x1f, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
    ),
    op(
        WRITE_ATOMIC_16,
        &[
            WRITE_ATOMIC_16,
            0x18,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            FF,
            0x3f,
            0,
        ],
    ),
    op(RESERVE_6, &[RESERVE_6, 0, 0, 0, 0, 0]),
    op(RELEASE_6, &[RELEASE_6, 0, 0, 0, 0, 0]),
    op(RESERVE_10, &[RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    op(RELEASE_10, &[RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    op_sa(
        PERSISTENT_RESERVE_IN,
        0,
        &[PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_IN,
        1,
        &[PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_IN,
        2,
        &[PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_IN,
        3,
        &[PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        0,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        1,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        2,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        3,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        4,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        5,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        6,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        PERSISTENT_RESERVE_OUT,
        7,
        &[PERSISTENT_RESERVE_OUT, 0x1f, FF, 0, 0, FF, FF, FF, FF, 0],
    ),
    op_sa(
        SANITIZE,
        SA_SANITIZE_OVERWRITE as u16,
        &[SANITIZE, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    thin(op_sa(
        SANITIZE,
        SA_SANITIZE_BLOCK_ERASE as u16,
        &[SANITIZE, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    )),
    thin(op_sa(
        SANITIZE,
        SA_SANITIZE_CRYPTO_ERASE as u16,
        &[SANITIZE, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    )),
    op_sa(
        SANITIZE,
        SA_SANITIZE_EXIT_FAILURE_MODE as u16,
        &[SANITIZE, 0x1f, 0, 0, 0, 0, 0, FF, FF, 0],
    ),
    op_sa(
        EXTENDED_COPY,
        SA_EXTENDED_COPY_LID1,
        &[
            EXTENDED_COPY,
            0x1f,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            FF,
            FF,
            FF,
            FF,
            0,
            0,
        ],
    ),
    op_sa(
        RECEIVE_COPY_RESULTS,
        SA_COPY_STATUS,
        &[
            RECEIVE_COPY_RESULTS,
            0x1f,
            FF,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            FF,
            FF,
            FF,
            FF,
            0,
            0,
        ],
    ),
    op_sa(
        RECEIVE_COPY_RESULTS,
        SA_OPERATING_PARAMETERS,
        &[
            RECEIVE_COPY_RESULTS,
            0x1f,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            FF,
            FF,
            FF,
            FF,
            0,
            0,
        ],
    ),
    op_sa(
        MAINTENANCE_IN,
        SA_REPORT_TARGET_PORT_GROUPS,
        &[MAINTENANCE_IN, 0x3f, 0, 0, 0, 0, FF, FF, FF, FF, 0, 0],
    ),
];

/// Whether the opcode is one whose service action lives in CDB byte 1.
pub(crate) fn has_service_action(opcode: u8) -> bool {
    OPS.iter()
        .any(|o| o.opcode == opcode && o.service_action.is_some())
}

/// What a logical unit offers beyond the commands every one has.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Offer {
    /// Thin provisioning (LBPME): UNMAP, the erasing SANITIZEs.
    pub thin: bool,
    /// Reservations, SPC-2 and persistent: not where other targets export the logical
    /// unit too, since they cannot be kept consistent with those targets'.
    pub reservations: bool,
}

/// The reservation commands, offered or not as a whole.
pub(crate) fn is_reservation(opcode: u8) -> bool {
    matches!(
        opcode,
        RESERVE_6
            | RELEASE_6
            | RESERVE_10
            | RELEASE_10
            | PERSISTENT_RESERVE_IN
            | PERSISTENT_RESERVE_OUT
    )
}

fn offered(offer: Offer) -> impl Iterator<Item = &'static OpInfo> {
    OPS.iter().filter(move |o| {
        (offer.thin || !o.thin_only) && (offer.reservations || !is_reservation(o.opcode))
    })
}

pub(crate) fn is_supported(opcode: u8, sa: u16, offer: Offer) -> bool {
    offered(offer).any(|o| o.opcode == opcode && o.service_action.is_none_or(|s| s == sa))
}

/// Command timeouts descriptor: none are reported as specific, so all are zero.
fn timeouts() -> [u8; 12] {
    let mut t = [0u8; 12];
    t[1] = 0x0a;
    t
}

/// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN / 0Ch).
pub(crate) fn report_supported_opcodes(cdb: &[u8], offer: Offer) -> Result<Vec<u8>, Sense> {
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = be16(&cdb[4..6]);
    let alloc = be32(&cdb[6..10]) as usize;
    let data = match options {
        0 => {
            let mut list = Vec::new();
            for o in offered(offer) {
                list.push(o.opcode);
                list.push(0);
                list.extend_from_slice(&o.service_action.unwrap_or(0).to_be_bytes());
                list.push(0);
                let mut flags = 0;
                if o.service_action.is_some() {
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
            let found = offered(offer).find(|o| {
                o.opcode == req_op && (!sa_cmd || options == 1 || o.service_action == Some(req_sa))
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
