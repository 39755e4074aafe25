//! Operation codes (SPC-5, SBC-4) and the service actions of the opcodes that carry one in
//! CDB byte 1, bits 4-0 ([`service_action`]).

pub const TEST_UNIT_READY: u8 = 0x00;
pub const REQUEST_SENSE: u8 = 0x03;
pub const READ_6: u8 = 0x08;
pub const WRITE_6: u8 = 0x0a;
pub const INQUIRY: u8 = 0x12;
pub const MODE_SELECT_6: u8 = 0x15;
pub const RESERVE_6: u8 = 0x16;
pub const RELEASE_6: u8 = 0x17;
pub const MODE_SENSE_6: u8 = 0x1a;
pub const START_STOP_UNIT: u8 = 0x1b;
pub const SEND_DIAGNOSTIC: u8 = 0x1d;
pub const PREVENT_ALLOW: u8 = 0x1e;
pub const READ_CAPACITY_10: u8 = 0x25;
pub const READ_10: u8 = 0x28;
pub const WRITE_10: u8 = 0x2a;
pub const WRITE_VERIFY_10: u8 = 0x2e;
pub const VERIFY_10: u8 = 0x2f;
pub const PRE_FETCH_10: u8 = 0x34;
pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
pub const READ_DEFECT_DATA_10: u8 = 0x37;
pub const WRITE_SAME_10: u8 = 0x41;
pub const UNMAP: u8 = 0x42;
pub const SANITIZE: u8 = 0x48;
pub const MODE_SELECT_10: u8 = 0x55;
pub const RESERVE_10: u8 = 0x56;
pub const RELEASE_10: u8 = 0x57;
pub const MODE_SENSE_10: u8 = 0x5a;
pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
pub const EXTENDED_COPY: u8 = 0x83;
pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
pub const READ_16: u8 = 0x88;
pub const COMPARE_AND_WRITE: u8 = 0x89;
pub const WRITE_16: u8 = 0x8a;
pub const ORWRITE_16: u8 = 0x8b;
pub const WRITE_VERIFY_16: u8 = 0x8e;
pub const VERIFY_16: u8 = 0x8f;
pub const PRE_FETCH_16: u8 = 0x90;
pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
pub const WRITE_SAME_16: u8 = 0x93;
pub const WRITE_ATOMIC_16: u8 = 0x9c;
pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
pub const REPORT_LUNS: u8 = 0xa0;
pub const MAINTENANCE_IN: u8 = 0xa3;
pub const MAINTENANCE_OUT: u8 = 0xa4;
pub const READ_12: u8 = 0xa8;
pub const WRITE_12: u8 = 0xaa;
pub const SERVICE_ACTION_IN_12: u8 = 0xab;
pub const WRITE_VERIFY_12: u8 = 0xae;
pub const VERIFY_12: u8 = 0xaf;
pub const READ_DEFECT_DATA_12: u8 = 0xb7;
/// Reservoir's own WRITE COMPRESSED (16), in the vendor-specific range: WRITE (16)'s CDB,
/// its Data-Out one zstd frame of the blocks (`rsv sync` on data that compresses).
pub const WRITE_COMPRESSED_16: u8 = 0xc1;

/// Service actions, by the opcode whose CDB carries them.
pub mod service_action {
    /// MAINTENANCE IN (A3h).
    pub mod maintenance_in {
        pub const REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
        pub const REPORT_SUPPORTED_OPERATION_CODES: u8 = 0x0c;
    }

    /// MAINTENANCE OUT (A4h).
    pub mod maintenance_out {
        pub const SET_TARGET_PORT_GROUPS: u8 = 0x0a;
    }

    /// SERVICE ACTION IN (12) (ABh).
    pub mod service_action_in_12 {
        pub const READ_MEDIA_SERIAL_NUMBER: u8 = 0x01;
    }

    /// SERVICE ACTION IN (16) (9Eh).
    pub mod service_action_in_16 {
        pub const READ_CAPACITY_16: u8 = 0x10;
        pub const GET_LBA_STATUS: u8 = 0x12;
    }

    /// SANITIZE (48h).
    pub mod sanitize {
        pub const OVERWRITE: u8 = 0x01;
        pub const BLOCK_ERASE: u8 = 0x02;
        pub const CRYPTOGRAPHIC_ERASE: u8 = 0x03;
        pub const EXIT_FAILURE_MODE: u8 = 0x1f;
    }

    /// PERSISTENT RESERVE IN (5Eh).
    pub mod persistent_reserve_in {
        pub const READ_KEYS: u8 = 0x00;
        pub const READ_RESERVATION: u8 = 0x01;
        pub const REPORT_CAPABILITIES: u8 = 0x02;
        pub const READ_FULL_STATUS: u8 = 0x03;
    }

    /// PERSISTENT RESERVE OUT (5Fh).
    pub mod persistent_reserve_out {
        pub const REGISTER: u8 = 0x00;
        pub const RESERVE: u8 = 0x01;
        pub const RELEASE: u8 = 0x02;
        pub const CLEAR: u8 = 0x03;
        pub const PREEMPT: u8 = 0x04;
        pub const PREEMPT_AND_ABORT: u8 = 0x05;
        pub const REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
        pub const REGISTER_AND_MOVE: u8 = 0x07;
    }

    /// EXTENDED COPY (83h).
    pub mod extended_copy {
        /// The list identifier format of SPC-4's EXTENDED COPY (LID1).
        pub const LID1: u8 = 0x00;
    }

    /// RECEIVE COPY RESULTS (84h).
    pub mod receive_copy_results {
        pub const COPY_STATUS: u8 = 0x00;
        pub const OPERATING_PARAMETERS: u8 = 0x03;
    }
}

/// The service action of a CDB whose opcode carries one (byte 1, bits 4-0); 0 for a CDB
/// too short to hold it.
pub fn service_action_of(cdb: &[u8]) -> u8 {
    cdb.get(1).map_or(0, |b| b & 0x1f)
}
