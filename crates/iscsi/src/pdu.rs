//! iSCSI PDU codec (RFC 7143 section 11): the 48-byte Basic Header Segment, Additional
//! Header Segments, and the data segment, for all eighteen PDU types.
//!
//! Decoding is strict about lengths and about flag combinations the RFC declares a protocol
//! error, and otherwise ignores reserved fields as section 11 requires of receivers.
//! Encoding zeroes every reserved field.

use bytes::Bytes;

use crate::digest::{self, DIGEST_LEN};

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;

/// Largest total AHS length TotalAHSLength can express (255 four-byte words).
pub const MAX_AHS_LEN: usize = 255 * 4;

/// Largest data segment DataSegmentLength can express.
pub const MAX_DATA_SEGMENT_LEN: usize = 0x00ff_ffff;

/// The reserved tag value 0xffffffff: "no task" for ITT, "no reply wanted" for TTT.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Reject reason codes (RFC 7143 section 11.17.1).
pub mod reject_reason {
    pub const DATA_DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const LONG_OPERATION_REJECT: u8 = 0x0a;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

const AHS_EXTENDED_CDB: u8 = 1;
const AHS_BIDI_READ_LENGTH: u8 = 2;
/// AHS codes 60..=63 are for non-iSCSI extensions; a receiver that does not know them skips
/// them. Every other code except 1 and 2 is reserved.
const AHS_EXTENSION_CODES: std::ops::RangeInclusive<u8> = 60..=63;

/// Whether header and data digests (CRC32C) are in use on a connection.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// The opcode in the low six bits of BHS byte 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    NopOut = 0x00,
    ScsiCommand = 0x01,
    TaskMgmtRequest = 0x02,
    LoginRequest = 0x03,
    TextRequest = 0x04,
    DataOut = 0x05,
    LogoutRequest = 0x06,
    SnackRequest = 0x10,
    NopIn = 0x20,
    ScsiResponse = 0x21,
    TaskMgmtResponse = 0x22,
    LoginResponse = 0x23,
    TextResponse = 0x24,
    DataIn = 0x25,
    LogoutResponse = 0x26,
    R2t = 0x31,
    AsyncMessage = 0x32,
    Reject = 0x3f,
}

impl Opcode {
    /// The opcode for a six-bit opcode value, if it is one iSCSI defines.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match v {
            0x00 => NopOut,
            0x01 => ScsiCommand,
            0x02 => TaskMgmtRequest,
            0x03 => LoginRequest,
            0x04 => TextRequest,
            0x05 => DataOut,
            0x06 => LogoutRequest,
            0x10 => SnackRequest,
            0x20 => NopIn,
            0x21 => ScsiResponse,
            0x22 => TaskMgmtResponse,
            0x23 => LoginResponse,
            0x24 => TextResponse,
            0x25 => DataIn,
            0x26 => LogoutResponse,
            0x31 => R2t,
            0x32 => AsyncMessage,
            0x3f => Reject,
            _ => return None,
        })
    }

    /// Whether initiators send this opcode (target opcodes have bit 0x20 set).
    pub fn is_initiator(self) -> bool {
        (self as u8) & 0x20 == 0
    }

    /// Whether this PDU type may carry a data segment at all.
    pub fn has_data_segment(self) -> bool {
        !matches!(
            self,
            Opcode::TaskMgmtRequest
                | Opcode::LogoutRequest
                | Opcode::SnackRequest
                | Opcode::TaskMgmtResponse
                | Opcode::LogoutResponse
                | Opcode::R2t
        )
    }
}

impl TryFrom<u8> for Opcode {
    type Error = PduError;
    fn try_from(v: u8) -> Result<Self, PduError> {
        Opcode::from_u8(v).ok_or(PduError::UnknownOpcode(v))
    }
}

/// Why a PDU could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    #[error("TotalAHSLength announces {expected} bytes of AHS but {actual} were given")]
    AhsLength { expected: usize, actual: usize },
    #[error("DataSegmentLength announces {expected} bytes but {actual} were given")]
    DataLength { expected: usize, actual: usize },
    #[error("malformed AHS: {0}")]
    BadAhs(&'static str),
    #[error("{0:?} must not carry this AHS")]
    UnexpectedAhs(Opcode),
    #[error("{0:?} must not carry a data segment")]
    UnexpectedData(Opcode),
    #[error("{opcode:?}: {what}")]
    InvalidFlags { opcode: Opcode, what: &'static str },
}

impl PduError {
    /// The reason code of the Reject PDU that answers this error.
    pub fn reject_reason(&self) -> u8 {
        match self {
            PduError::UnknownOpcode(_) => reject_reason::COMMAND_NOT_SUPPORTED,
            PduError::InvalidFlags { .. } => reject_reason::INVALID_PDU_FIELD,
            _ => reject_reason::PROTOCOL_ERROR,
        }
    }
}

/// NOP-Out (0x00): ping from the initiator, or the answer to a target's NOP-In.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmdsn: u32,
    pub expstatsn: u32,
    pub data: Bytes,
}

impl Default for NopOut {
    fn default() -> Self {
        NopOut {
            immediate: false,
            lun: 0,
            itt: 0,
            ttt: RESERVED_TAG,
            cmdsn: 0,
            expstatsn: 0,
            data: Bytes::new(),
        }
    }
}

/// SCSI Command (0x01).
///
/// `cdb` holds the 16 BHS CDB bytes followed by the Extended CDB AHS bytes, if any. CDBs
/// shorter than 16 bytes are zero-padded on the wire and decode as 16 bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    /// Task attribute (SIMPLE 1, ORDERED 2, HEAD OF QUEUE 3, ACA 4; 0 untagged).
    pub attr: u8,
    pub lun: u64,
    pub itt: u32,
    pub edtl: u32,
    pub cmdsn: u32,
    pub expstatsn: u32,
    pub cdb: Vec<u8>,
    /// Expected read length of a bidirectional command, from its AHS.
    pub bidi_read_length: Option<u32>,
    /// Immediate data.
    pub data: Bytes,
}

impl Default for ScsiCommand {
    fn default() -> Self {
        ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: false,
            attr: 1,
            lun: 0,
            itt: 0,
            edtl: 0,
            cmdsn: 0,
            expstatsn: 0,
            cdb: vec![0; 16],
            bidi_read_length: None,
            data: Bytes::new(),
        }
    }
}

/// Task Management Function Request (0x02).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: u8,
    pub lun: u64,
    pub itt: u32,
    pub referenced_task_tag: u32,
    pub cmdsn: u32,
    pub expstatsn: u32,
    pub refcmdsn: u32,
    pub expdatasn: u32,
}

impl Default for TaskMgmtRequest {
    fn default() -> Self {
        TaskMgmtRequest {
            immediate: true,
            function: 0,
            lun: 0,
            itt: 0,
            referenced_task_tag: RESERVED_TAG,
            cmdsn: 0,
            expstatsn: 0,
            refcmdsn: 0,
            expdatasn: 0,
        }
    }
}

/// Login Request (0x03). The I bit is always set on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoginRequest {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmdsn: u32,
    pub expstatsn: u32,
    pub data: Bytes,
}

/// Text Request (0x04).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmdsn: u32,
    pub expstatsn: u32,
    pub data: Bytes,
}

impl Default for TextRequest {
    fn default() -> Self {
        TextRequest {
            immediate: false,
            final_: true,
            cont: false,
            lun: 0,
            itt: 0,
            ttt: RESERVED_TAG,
            cmdsn: 0,
            expstatsn: 0,
            data: Bytes::new(),
        }
    }
}

/// SCSI Data-Out (0x05).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataOut {
    pub final_: bool,
    pub lun: u64,
    pub itt: u32,
    /// The R2T's TTT, or 0xffffffff for unsolicited data.
    pub ttt: u32,
    pub expstatsn: u32,
    pub datasn: u32,
    pub buffer_offset: u32,
    pub data: Bytes,
}

impl Default for DataOut {
    fn default() -> Self {
        DataOut {
            final_: false,
            lun: 0,
            itt: 0,
            ttt: RESERVED_TAG,
            expstatsn: 0,
            datasn: 0,
            buffer_offset: 0,
            data: Bytes::new(),
        }
    }
}

/// Logout Request (0x06).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmdsn: u32,
    pub expstatsn: u32,
}

/// SNACK Request (0x10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnackRequest {
    pub snack_type: u8,
    pub lun: u64,
    pub itt: u32,
    /// TTT for DataACK, SNACK Tag for R-Data, otherwise 0xffffffff.
    pub ttt: u32,
    pub expstatsn: u32,
    pub begrun: u32,
    pub runlength: u32,
}

impl Default for SnackRequest {
    fn default() -> Self {
        SnackRequest {
            snack_type: 0,
            lun: 0,
            itt: RESERVED_TAG,
            ttt: RESERVED_TAG,
            expstatsn: 0,
            begrun: 0,
            runlength: 0,
        }
    }
}

/// NOP-In (0x20): answer to a NOP-Out, or a target's ping (then ITT is 0xffffffff).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NopIn {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub data: Bytes,
}

impl Default for NopIn {
    fn default() -> Self {
        NopIn {
            lun: 0,
            itt: RESERVED_TAG,
            ttt: RESERVED_TAG,
            statsn: 0,
            expcmdsn: 0,
            maxcmdsn: 0,
            data: Bytes::new(),
        }
    }
}

/// SCSI Response (0x21). The data segment is SenseLength (2 bytes), sense data, and
/// response data; see [`ScsiResponse::with_sense`] and [`ScsiResponse::sense`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScsiResponse {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub response: u8,
    /// The SCSI status, one of `scsi_proto::status`.
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub expdatasn: u32,
    pub bidi_read_residual_count: u32,
    pub residual_count: u32,
    pub data: Bytes,
}

impl ScsiResponse {
    /// A "command completed at target" response with status CHECK CONDITION carrying
    /// `sense`; fill in the rest with `..ScsiResponse::with_sense(&sense)`.
    pub fn with_sense(sense: &[u8]) -> ScsiResponse {
        ScsiResponse {
            status: scsi_proto::status::CHECK_CONDITION,
            data: sense_segment(sense),
            ..Default::default()
        }
    }

    /// The sense data, if the data segment carries any.
    pub fn sense(&self) -> Option<&[u8]> {
        segment_sense(&self.data)
    }
}

/// A data segment carrying `sense` behind its SenseLength, as SCSI Response and Asynchronous
/// Message PDUs use. Sense data longer than 65535 bytes is cut to that.
pub fn sense_segment(sense: &[u8]) -> Bytes {
    let sense = &sense[..sense.len().min(u16::MAX as usize)];
    let mut v = Vec::with_capacity(2 + sense.len());
    v.extend_from_slice(&(sense.len() as u16).to_be_bytes());
    v.extend_from_slice(sense);
    Bytes::from(v)
}

fn segment_sense(data: &[u8]) -> Option<&[u8]> {
    let len = usize::from(u16::from_be_bytes([*data.first()?, *data.get(1)?]));
    match data.get(2..2 + len) {
        Some(s) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// Task Management Function Response (0x22).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    pub response: u8,
    pub itt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
}

/// Login Response (0x23).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoginResponse {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub status_class: u8,
    pub status_detail: u8,
    pub data: Bytes,
}

/// Text Response (0x24).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextResponse {
    pub final_: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub data: Bytes,
}

impl Default for TextResponse {
    fn default() -> Self {
        TextResponse {
            final_: true,
            cont: false,
            lun: 0,
            itt: 0,
            ttt: RESERVED_TAG,
            statsn: 0,
            expcmdsn: 0,
            maxcmdsn: 0,
            data: Bytes::new(),
        }
    }
}

/// SCSI Data-In (0x25). `status`, `statsn` and the residual fields are meaningful only
/// with `status_present` (S bit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataIn {
    pub final_: bool,
    pub ack: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub status_present: bool,
    /// The SCSI status (`scsi_proto::status`), with `status_present`.
    pub status: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub datasn: u32,
    pub buffer_offset: u32,
    pub residual_count: u32,
    pub data: Bytes,
}

impl Default for DataIn {
    fn default() -> Self {
        DataIn {
            final_: false,
            ack: false,
            overflow: false,
            underflow: false,
            status_present: false,
            status: 0,
            lun: 0,
            itt: 0,
            ttt: RESERVED_TAG,
            statsn: 0,
            expcmdsn: 0,
            maxcmdsn: 0,
            datasn: 0,
            buffer_offset: 0,
            residual_count: 0,
            data: Bytes::new(),
        }
    }
}

/// Logout Response (0x26).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogoutResponse {
    pub response: u8,
    pub itt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// Ready To Transfer (0x31).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct R2t {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub r2tsn: u32,
    pub buffer_offset: u32,
    pub desired_data_transfer_length: u32,
}

/// AsyncEvent codes of an Asynchronous Message (RFC 7143 11.9.1).
pub mod async_event {
    pub const SCSI_ASYNC_EVENT: u8 = 0;
    /// The target asks for a logout within Parameter3 seconds.
    pub const LOGOUT_REQUESTED: u8 = 1;
    pub const CONNECTION_DROPPED: u8 = 2;
    pub const SESSION_DROPPED: u8 = 3;
    pub const NEGOTIATION_REQUESTED: u8 = 4;
    pub const TASK_TERMINATION: u8 = 5;
    pub const VENDOR_SPECIFIC: u8 = 255;
}

/// Asynchronous Message (0x32). Its ITT is always 0xffffffff. The data segment is
/// SenseLength, sense data and iSCSI event data, as for SCSI Response.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AsyncMessage {
    pub lun: u64,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    pub async_event: u8,
    pub async_vcode: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
    pub data: Bytes,
}

impl AsyncMessage {
    /// The sense data, if the data segment carries any.
    pub fn sense(&self) -> Option<&[u8]> {
        segment_sense(&self.data)
    }
}

/// Reject (0x3f). Its ITT is always 0xffffffff; `data` is the complete header of the
/// rejected PDU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reject {
    pub reason: u8,
    pub statsn: u32,
    pub expcmdsn: u32,
    pub maxcmdsn: u32,
    /// DataSN or R2TSN of the rejected SNACK, otherwise 0.
    pub datasn: u32,
    pub data: Bytes,
}

impl Reject {
    /// A Reject for the PDU whose BHS is `bhs`; set the sequence numbers with
    /// `..Reject::for_header(reason, &bhs)`.
    pub fn for_header(reason: u8, bhs: &[u8; BHS_LEN]) -> Reject {
        Reject {
            reason,
            data: Bytes::copy_from_slice(bhs),
            ..Default::default()
        }
    }
}

/// One decoded PDU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pdu {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

macro_rules! pdu_from {
    ($($t:ident),*) => {
        $(impl From<$t> for Pdu {
            fn from(p: $t) -> Pdu {
                Pdu::$t(p)
            }
        })*
    };
}

pdu_from!(
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    SnackRequest,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject
);

static EMPTY: Bytes = Bytes::new();

/// Number of zero bytes that pad a segment of `len` bytes to a multiple of four.
pub fn pad_len(len: usize) -> usize {
    len.wrapping_neg() & 3
}

/// TotalAHSLength of a BHS, in bytes.
pub fn total_ahs_len(bhs: &[u8; BHS_LEN]) -> usize {
    usize::from(bhs[4]) * 4
}

/// DataSegmentLength of a BHS, in bytes (without padding).
pub fn data_segment_len(bhs: &[u8; BHS_LEN]) -> usize {
    (usize::from(bhs[5]) << 16) | (usize::from(bhs[6]) << 8) | usize::from(bhs[7])
}

/// The padding and data digest to send after `data`: the first `n` bytes of the array.
/// Lets a sender write header, payload and trailer with one vectored write.
pub fn data_trailer(data: &[u8], digests: Digests) -> ([u8; 7], usize) {
    let mut trailer = [0u8; 7];
    let pad = pad_len(data.len());
    let mut n = pad;
    if digests.data && !data.is_empty() {
        let crc = digest::crc32c_append(digest::crc32c(data), &trailer[..pad]);
        trailer[pad..pad + DIGEST_LEN].copy_from_slice(&digest::to_wire(crc));
        n += DIGEST_LEN;
    }
    (trailer, n)
}

/// The 8-byte LUN field's encodings (SAM-5 4.7) are SCSI's words, as the target's REPORT
/// LUNS writes them too.
pub use scsi_proto::lun::{from_wire as lun_from_wire, to_wire as lun_to_wire};

/// A BHS under construction or being read; offsets are those of RFC 7143 section 11.
struct Bhs([u8; BHS_LEN]);

impl Bhs {
    fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }
    fn u64(&self, at: usize) -> u64 {
        (u64::from(self.u32(at)) << 32) | u64::from(self.u32(at + 4))
    }
    fn bit(&self, byte: usize, mask: u8) -> bool {
        self.0[byte] & mask != 0
    }
    fn set_u16(&mut self, at: usize, v: u16) {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    fn set_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    fn set_u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
    fn set_bit(&mut self, byte: usize, mask: u8, on: bool) {
        if on {
            self.0[byte] |= mask;
        }
    }
}

// BHS byte 0.
const I_BIT: u8 = 0x40;
const OPCODE_MASK: u8 = 0x3f;
// BHS byte 1.
const F_BIT: u8 = 0x80;
const C_BIT_TEXT: u8 = 0x40;
const T_BIT: u8 = 0x80;
const C_BIT_LOGIN: u8 = 0x40;
const R_BIT: u8 = 0x40;
const W_BIT: u8 = 0x20;
const ATTR_MASK: u8 = 0x07;
const A_BIT: u8 = 0x40;
const BIDI_O_BIT: u8 = 0x10;
const BIDI_U_BIT: u8 = 0x08;
const O_BIT: u8 = 0x04;
const U_BIT: u8 = 0x02;
const S_BIT: u8 = 0x01;

/// The AHS entries of a PDU: (AHS code, AHS-specific bytes including the reserved byte).
struct AhsIter<'a>(&'a [u8]);

impl<'a> Iterator for AhsIter<'a> {
    type Item = Result<(u8, &'a [u8]), PduError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let Some((&[l0, l1, ty], rest)) = self.0.split_first_chunk::<3>() else {
            self.0 = &[];
            return Some(Err(PduError::BadAhs("truncated AHS header")));
        };
        let len = usize::from(u16::from_be_bytes([l0, l1]));
        let padded = len + pad_len(3 + len);
        if padded > rest.len() {
            self.0 = &[];
            return Some(Err(PduError::BadAhs("AHSLength runs past TotalAHSLength")));
        }
        let specific = &rest[..len];
        self.0 = &rest[padded..];
        // The top two bits of AHSType are reserved.
        Some(Ok((ty & 0x3f, specific)))
    }
}

impl Pdu {
    pub fn opcode(&self) -> Opcode {
        match self {
            Pdu::NopOut(_) => Opcode::NopOut,
            Pdu::ScsiCommand(_) => Opcode::ScsiCommand,
            Pdu::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Pdu::LoginRequest(_) => Opcode::LoginRequest,
            Pdu::TextRequest(_) => Opcode::TextRequest,
            Pdu::DataOut(_) => Opcode::DataOut,
            Pdu::LogoutRequest(_) => Opcode::LogoutRequest,
            Pdu::SnackRequest(_) => Opcode::SnackRequest,
            Pdu::NopIn(_) => Opcode::NopIn,
            Pdu::ScsiResponse(_) => Opcode::ScsiResponse,
            Pdu::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Pdu::LoginResponse(_) => Opcode::LoginResponse,
            Pdu::TextResponse(_) => Opcode::TextResponse,
            Pdu::DataIn(_) => Opcode::DataIn,
            Pdu::LogoutResponse(_) => Opcode::LogoutResponse,
            Pdu::R2t(_) => Opcode::R2t,
            Pdu::AsyncMessage(_) => Opcode::AsyncMessage,
            Pdu::Reject(_) => Opcode::Reject,
        }
    }

    /// Initiator Task Tag; 0xffffffff for Asynchronous Message and Reject.
    pub fn itt(&self) -> u32 {
        match self {
            Pdu::NopOut(p) => p.itt,
            Pdu::ScsiCommand(p) => p.itt,
            Pdu::TaskMgmtRequest(p) => p.itt,
            Pdu::LoginRequest(p) => p.itt,
            Pdu::TextRequest(p) => p.itt,
            Pdu::DataOut(p) => p.itt,
            Pdu::LogoutRequest(p) => p.itt,
            Pdu::SnackRequest(p) => p.itt,
            Pdu::NopIn(p) => p.itt,
            Pdu::ScsiResponse(p) => p.itt,
            Pdu::TaskMgmtResponse(p) => p.itt,
            Pdu::LoginResponse(p) => p.itt,
            Pdu::TextResponse(p) => p.itt,
            Pdu::DataIn(p) => p.itt,
            Pdu::LogoutResponse(p) => p.itt,
            Pdu::R2t(p) => p.itt,
            Pdu::AsyncMessage(_) | Pdu::Reject(_) => RESERVED_TAG,
        }
    }

    /// The I bit: always set for Login Request, never for target PDUs.
    pub fn immediate(&self) -> bool {
        match self {
            Pdu::NopOut(p) => p.immediate,
            Pdu::ScsiCommand(p) => p.immediate,
            Pdu::TaskMgmtRequest(p) => p.immediate,
            Pdu::LoginRequest(_) => true,
            Pdu::TextRequest(p) => p.immediate,
            Pdu::LogoutRequest(p) => p.immediate,
            _ => false,
        }
    }

    /// The data segment (empty for PDU types that have none).
    pub fn data(&self) -> &Bytes {
        match self {
            Pdu::NopOut(p) => &p.data,
            Pdu::ScsiCommand(p) => &p.data,
            Pdu::LoginRequest(p) => &p.data,
            Pdu::TextRequest(p) => &p.data,
            Pdu::DataOut(p) => &p.data,
            Pdu::NopIn(p) => &p.data,
            Pdu::ScsiResponse(p) => &p.data,
            Pdu::LoginResponse(p) => &p.data,
            Pdu::TextResponse(p) => &p.data,
            Pdu::DataIn(p) => &p.data,
            Pdu::AsyncMessage(p) => &p.data,
            Pdu::Reject(p) => &p.data,
            Pdu::TaskMgmtRequest(_)
            | Pdu::LogoutRequest(_)
            | Pdu::SnackRequest(_)
            | Pdu::TaskMgmtResponse(_)
            | Pdu::LogoutResponse(_)
            | Pdu::R2t(_) => &EMPTY,
        }
    }

    /// Bytes `encode` writes for this PDU.
    pub fn encoded_len(&self, digests: Digests) -> usize {
        let data = self.data().len();
        let mut n = BHS_LEN + self.ahs().len() + data + pad_len(data);
        if digests.header {
            n += DIGEST_LEN;
        }
        if digests.data && data > 0 {
            n += DIGEST_LEN;
        }
        n
    }

    /// Appends the whole PDU: BHS, AHS, header digest, data segment, padding, data digest.
    ///
    /// # Panics
    /// If the data segment exceeds 2^24-1 bytes or the AHS 1020 bytes (a CDB longer than
    /// about 1000 bytes): such a PDU cannot be expressed on the wire.
    pub fn encode(&self, out: &mut Vec<u8>, digests: Digests) {
        self.encode_header(out, digests);
        let data = self.data();
        out.extend_from_slice(data);
        let (trailer, n) = data_trailer(data, digests);
        out.extend_from_slice(&trailer[..n]);
    }

    /// Appends BHS, AHS and header digest only; send `data()` and then [`data_trailer`]
    /// after it.
    ///
    /// # Panics
    /// As [`Pdu::encode`].
    pub fn encode_header(&self, out: &mut Vec<u8>, digests: Digests) {
        let ahs = self.ahs();
        assert!(
            ahs.len() <= MAX_AHS_LEN,
            "AHS too long: {} bytes",
            ahs.len()
        );
        let data_len = self.data().len();
        assert!(
            data_len <= MAX_DATA_SEGMENT_LEN,
            "data segment too long: {data_len} bytes"
        );
        let mut bhs = self.bhs();
        bhs.0[0] |= self.opcode() as u8;
        bhs.set_bit(0, I_BIT, self.immediate());
        bhs.0[4] = (ahs.len() / 4) as u8;
        bhs.0[5..8].copy_from_slice(&(data_len as u32).to_be_bytes()[1..]);

        let start = out.len();
        out.extend_from_slice(&bhs.0);
        out.extend_from_slice(&ahs);
        if digests.header {
            let crc = digest::crc32c(&out[start..]);
            out.extend_from_slice(&digest::to_wire(crc));
        }
    }

    /// See the free function [`data_trailer`].
    pub fn data_trailer(data: &[u8], digests: Digests) -> ([u8; 7], usize) {
        data_trailer(data, digests)
    }

    fn ahs(&self) -> Vec<u8> {
        let Pdu::ScsiCommand(c) = self else {
            return Vec::new();
        };
        let mut ahs = Vec::new();
        if c.cdb.len() > 16 {
            let ext = &c.cdb[16..];
            let len = u16::try_from(ext.len() + 1).unwrap_or(u16::MAX);
            ahs.extend_from_slice(&len.to_be_bytes());
            ahs.extend_from_slice(&[AHS_EXTENDED_CDB, 0]);
            ahs.extend_from_slice(ext);
            ahs.resize(ahs.len() + pad_len(ahs.len()), 0);
        }
        if let Some(len) = c.bidi_read_length {
            ahs.extend_from_slice(&[0, 5, AHS_BIDI_READ_LENGTH, 0]);
            ahs.extend_from_slice(&len.to_be_bytes());
        }
        ahs
    }

    /// The BHS without opcode, I bit and lengths, which `encode_header` adds.
    fn bhs(&self) -> Bhs {
        let mut h = Bhs([0; BHS_LEN]);
        match self {
            Pdu::NopOut(p) => {
                h.0[1] = F_BIT;
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.cmdsn);
                h.set_u32(28, p.expstatsn);
            }
            Pdu::ScsiCommand(p) => {
                h.set_bit(1, F_BIT, p.final_);
                h.set_bit(1, R_BIT, p.read);
                h.set_bit(1, W_BIT, p.write);
                h.0[1] |= p.attr & ATTR_MASK;
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.edtl);
                h.set_u32(24, p.cmdsn);
                h.set_u32(28, p.expstatsn);
                let n = p.cdb.len().min(16);
                h.0[32..32 + n].copy_from_slice(&p.cdb[..n]);
            }
            Pdu::TaskMgmtRequest(p) => {
                h.0[1] = F_BIT | (p.function & 0x7f);
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.referenced_task_tag);
                h.set_u32(24, p.cmdsn);
                h.set_u32(28, p.expstatsn);
                h.set_u32(32, p.refcmdsn);
                h.set_u32(36, p.expdatasn);
            }
            Pdu::LoginRequest(p) => {
                h.0[1] = login_stage_byte(p.transit, p.cont, p.csg, p.nsg);
                h.0[2] = p.version_max;
                h.0[3] = p.version_min;
                h.0[8..14].copy_from_slice(&p.isid);
                h.set_u16(14, p.tsih);
                h.set_u32(16, p.itt);
                h.set_u16(20, p.cid);
                h.set_u32(24, p.cmdsn);
                h.set_u32(28, p.expstatsn);
            }
            Pdu::TextRequest(p) => {
                h.set_bit(1, F_BIT, p.final_);
                h.set_bit(1, C_BIT_TEXT, p.cont);
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.cmdsn);
                h.set_u32(28, p.expstatsn);
            }
            Pdu::DataOut(p) => {
                h.set_bit(1, F_BIT, p.final_);
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(28, p.expstatsn);
                h.set_u32(36, p.datasn);
                h.set_u32(40, p.buffer_offset);
            }
            Pdu::LogoutRequest(p) => {
                h.0[1] = F_BIT | (p.reason & 0x7f);
                h.set_u32(16, p.itt);
                h.set_u16(20, p.cid);
                h.set_u32(24, p.cmdsn);
                h.set_u32(28, p.expstatsn);
            }
            Pdu::SnackRequest(p) => {
                h.0[1] = F_BIT | (p.snack_type & 0x0f);
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(28, p.expstatsn);
                h.set_u32(40, p.begrun);
                h.set_u32(44, p.runlength);
            }
            Pdu::NopIn(p) => {
                h.0[1] = F_BIT;
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
            }
            Pdu::ScsiResponse(p) => {
                h.0[1] = F_BIT;
                h.set_bit(1, BIDI_O_BIT, p.bidi_overflow);
                h.set_bit(1, BIDI_U_BIT, p.bidi_underflow);
                h.set_bit(1, O_BIT, p.overflow);
                h.set_bit(1, U_BIT, p.underflow);
                h.0[2] = p.response;
                h.0[3] = p.status;
                h.set_u32(16, p.itt);
                h.set_u32(20, p.snack_tag);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.set_u32(36, p.expdatasn);
                h.set_u32(40, p.bidi_read_residual_count);
                h.set_u32(44, p.residual_count);
            }
            Pdu::TaskMgmtResponse(p) => {
                h.0[1] = F_BIT;
                h.0[2] = p.response;
                h.set_u32(16, p.itt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
            }
            Pdu::LoginResponse(p) => {
                h.0[1] = login_stage_byte(p.transit, p.cont, p.csg, p.nsg);
                h.0[2] = p.version_max;
                h.0[3] = p.version_active;
                h.0[8..14].copy_from_slice(&p.isid);
                h.set_u16(14, p.tsih);
                h.set_u32(16, p.itt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.0[36] = p.status_class;
                h.0[37] = p.status_detail;
            }
            Pdu::TextResponse(p) => {
                h.set_bit(1, F_BIT, p.final_);
                h.set_bit(1, C_BIT_TEXT, p.cont);
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
            }
            Pdu::DataIn(p) => {
                h.set_bit(1, F_BIT, p.final_);
                h.set_bit(1, A_BIT, p.ack);
                h.set_bit(1, O_BIT, p.overflow);
                h.set_bit(1, U_BIT, p.underflow);
                h.set_bit(1, S_BIT, p.status_present);
                h.0[3] = p.status;
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.set_u32(36, p.datasn);
                h.set_u32(40, p.buffer_offset);
                h.set_u32(44, p.residual_count);
            }
            Pdu::LogoutResponse(p) => {
                h.0[1] = F_BIT;
                h.0[2] = p.response;
                h.set_u32(16, p.itt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.set_u16(40, p.time2wait);
                h.set_u16(42, p.time2retain);
            }
            Pdu::R2t(p) => {
                h.0[1] = F_BIT;
                h.set_u64(8, p.lun);
                h.set_u32(16, p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.set_u32(36, p.r2tsn);
                h.set_u32(40, p.buffer_offset);
                h.set_u32(44, p.desired_data_transfer_length);
            }
            Pdu::AsyncMessage(p) => {
                h.0[1] = F_BIT;
                h.set_u64(8, p.lun);
                h.set_u32(16, RESERVED_TAG);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.0[36] = p.async_event;
                h.0[37] = p.async_vcode;
                h.set_u16(38, p.parameter1);
                h.set_u16(40, p.parameter2);
                h.set_u16(42, p.parameter3);
            }
            Pdu::Reject(p) => {
                h.0[1] = F_BIT;
                h.0[2] = p.reason;
                h.set_u32(16, RESERVED_TAG);
                h.set_u32(24, p.statsn);
                h.set_u32(28, p.expcmdsn);
                h.set_u32(32, p.maxcmdsn);
                h.set_u32(36, p.datasn);
            }
        }
        h
    }

    /// Decodes one PDU from its BHS, its AHS (exactly TotalAHSLength bytes) and its data
    /// segment (exactly DataSegmentLength bytes, without padding or digest). Never panics.
    pub fn decode(bhs: &[u8; BHS_LEN], ahs: &[u8], data: Bytes) -> Result<Pdu, PduError> {
        let op = Opcode::try_from(bhs[0] & OPCODE_MASK)?;
        let expected = total_ahs_len(bhs);
        if ahs.len() != expected {
            return Err(PduError::AhsLength {
                expected,
                actual: ahs.len(),
            });
        }
        let expected = data_segment_len(bhs);
        if data.len() != expected {
            return Err(PduError::DataLength {
                expected,
                actual: data.len(),
            });
        }
        if !op.has_data_segment() && !data.is_empty() {
            return Err(PduError::UnexpectedData(op));
        }

        let mut ext_cdb: Option<&[u8]> = None;
        let mut bidi_read_length = None;
        for entry in AhsIter(ahs) {
            let (code, specific) = entry?;
            match code {
                AHS_EXTENDED_CDB if op == Opcode::ScsiCommand => {
                    if ext_cdb.is_some() {
                        return Err(PduError::BadAhs("two Extended CDB AHSs"));
                    }
                    let Some((_reserved, cdb)) = specific.split_first() else {
                        return Err(PduError::BadAhs("empty Extended CDB AHS"));
                    };
                    ext_cdb = Some(cdb);
                }
                AHS_BIDI_READ_LENGTH if op == Opcode::ScsiCommand => {
                    if bidi_read_length.is_some() {
                        return Err(PduError::BadAhs("two bidirectional read length AHSs"));
                    }
                    let &[_reserved, a, b, c, d] = specific else {
                        return Err(PduError::BadAhs("bidirectional read length AHSLength != 5"));
                    };
                    bidi_read_length = Some(u32::from_be_bytes([a, b, c, d]));
                }
                AHS_EXTENDED_CDB | AHS_BIDI_READ_LENGTH => return Err(PduError::UnexpectedAhs(op)),
                c if AHS_EXTENSION_CODES.contains(&c) => {}
                _ => return Err(PduError::BadAhs("reserved AHS type")),
            }
        }

        let h = Bhs(*bhs);
        let immediate = h.bit(0, I_BIT);
        let flag = |mask| h.bit(1, mask);
        let invalid = |what| PduError::InvalidFlags { opcode: op, what };
        Ok(match op {
            Opcode::NopOut => Pdu::NopOut(NopOut {
                immediate,
                lun: h.u64(8),
                itt: h.u32(16),
                ttt: h.u32(20),
                cmdsn: h.u32(24),
                expstatsn: h.u32(28),
                data,
            }),
            Opcode::ScsiCommand => {
                let mut cdb = Vec::with_capacity(16 + ext_cdb.map_or(0, <[u8]>::len));
                cdb.extend_from_slice(&bhs[32..48]);
                cdb.extend_from_slice(ext_cdb.unwrap_or_default());
                Pdu::ScsiCommand(ScsiCommand {
                    immediate,
                    final_: flag(F_BIT),
                    read: flag(R_BIT),
                    write: flag(W_BIT),
                    attr: bhs[1] & ATTR_MASK,
                    lun: h.u64(8),
                    itt: h.u32(16),
                    edtl: h.u32(20),
                    cmdsn: h.u32(24),
                    expstatsn: h.u32(28),
                    cdb,
                    bidi_read_length,
                    data,
                })
            }
            Opcode::TaskMgmtRequest => Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate,
                function: bhs[1] & 0x7f,
                lun: h.u64(8),
                itt: h.u32(16),
                referenced_task_tag: h.u32(20),
                cmdsn: h.u32(24),
                expstatsn: h.u32(28),
                refcmdsn: h.u32(32),
                expdatasn: h.u32(36),
            }),
            Opcode::LoginRequest => {
                let (transit, cont, csg, nsg) = login_stages(bhs[1]);
                if transit && cont {
                    return Err(invalid("T and C both set"));
                }
                Pdu::LoginRequest(LoginRequest {
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max: bhs[2],
                    version_min: bhs[3],
                    isid: isid(bhs),
                    tsih: h.u16(14),
                    itt: h.u32(16),
                    cid: h.u16(20),
                    cmdsn: h.u32(24),
                    expstatsn: h.u32(28),
                    data,
                })
            }
            Opcode::TextRequest => {
                if flag(F_BIT) && flag(C_BIT_TEXT) {
                    return Err(invalid("F and C both set"));
                }
                Pdu::TextRequest(TextRequest {
                    immediate,
                    final_: flag(F_BIT),
                    cont: flag(C_BIT_TEXT),
                    lun: h.u64(8),
                    itt: h.u32(16),
                    ttt: h.u32(20),
                    cmdsn: h.u32(24),
                    expstatsn: h.u32(28),
                    data,
                })
            }
            Opcode::DataOut => Pdu::DataOut(DataOut {
                final_: flag(F_BIT),
                lun: h.u64(8),
                itt: h.u32(16),
                ttt: h.u32(20),
                expstatsn: h.u32(28),
                datasn: h.u32(36),
                buffer_offset: h.u32(40),
                data,
            }),
            Opcode::LogoutRequest => Pdu::LogoutRequest(LogoutRequest {
                immediate,
                reason: bhs[1] & 0x7f,
                itt: h.u32(16),
                cid: h.u16(20),
                cmdsn: h.u32(24),
                expstatsn: h.u32(28),
            }),
            Opcode::SnackRequest => Pdu::SnackRequest(SnackRequest {
                snack_type: bhs[1] & 0x0f,
                lun: h.u64(8),
                itt: h.u32(16),
                ttt: h.u32(20),
                expstatsn: h.u32(28),
                begrun: h.u32(40),
                runlength: h.u32(44),
            }),
            Opcode::NopIn => Pdu::NopIn(NopIn {
                lun: h.u64(8),
                itt: h.u32(16),
                ttt: h.u32(20),
                statsn: h.u32(24),
                expcmdsn: h.u32(28),
                maxcmdsn: h.u32(32),
                data,
            }),
            Opcode::ScsiResponse => {
                if flag(O_BIT) && flag(U_BIT) {
                    return Err(invalid("O and U both set"));
                }
                if flag(BIDI_O_BIT) && flag(BIDI_U_BIT) {
                    return Err(invalid("o and u both set"));
                }
                Pdu::ScsiResponse(ScsiResponse {
                    bidi_overflow: flag(BIDI_O_BIT),
                    bidi_underflow: flag(BIDI_U_BIT),
                    overflow: flag(O_BIT),
                    underflow: flag(U_BIT),
                    response: bhs[2],
                    status: bhs[3],
                    itt: h.u32(16),
                    snack_tag: h.u32(20),
                    statsn: h.u32(24),
                    expcmdsn: h.u32(28),
                    maxcmdsn: h.u32(32),
                    expdatasn: h.u32(36),
                    bidi_read_residual_count: h.u32(40),
                    residual_count: h.u32(44),
                    data,
                })
            }
            Opcode::TaskMgmtResponse => Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: bhs[2],
                itt: h.u32(16),
                statsn: h.u32(24),
                expcmdsn: h.u32(28),
                maxcmdsn: h.u32(32),
            }),
            Opcode::LoginResponse => {
                let (transit, cont, csg, nsg) = login_stages(bhs[1]);
                if transit && cont {
                    return Err(invalid("T and C both set"));
                }
                Pdu::LoginResponse(LoginResponse {
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max: bhs[2],
                    version_active: bhs[3],
                    isid: isid(bhs),
                    tsih: h.u16(14),
                    itt: h.u32(16),
                    statsn: h.u32(24),
                    expcmdsn: h.u32(28),
                    maxcmdsn: h.u32(32),
                    status_class: bhs[36],
                    status_detail: bhs[37],
                    data,
                })
            }
            Opcode::TextResponse => {
                if flag(F_BIT) && flag(C_BIT_TEXT) {
                    return Err(invalid("F and C both set"));
                }
                Pdu::TextResponse(TextResponse {
                    final_: flag(F_BIT),
                    cont: flag(C_BIT_TEXT),
                    lun: h.u64(8),
                    itt: h.u32(16),
                    ttt: h.u32(20),
                    statsn: h.u32(24),
                    expcmdsn: h.u32(28),
                    maxcmdsn: h.u32(32),
                    data,
                })
            }
            Opcode::DataIn => {
                if flag(O_BIT) && flag(U_BIT) {
                    return Err(invalid("O and U both set"));
                }
                if flag(S_BIT) && !flag(F_BIT) {
                    return Err(invalid("S set without F"));
                }
                Pdu::DataIn(DataIn {
                    final_: flag(F_BIT),
                    ack: flag(A_BIT),
                    overflow: flag(O_BIT),
                    underflow: flag(U_BIT),
                    status_present: flag(S_BIT),
                    status: bhs[3],
                    lun: h.u64(8),
                    itt: h.u32(16),
                    ttt: h.u32(20),
                    statsn: h.u32(24),
                    expcmdsn: h.u32(28),
                    maxcmdsn: h.u32(32),
                    datasn: h.u32(36),
                    buffer_offset: h.u32(40),
                    residual_count: h.u32(44),
                    data,
                })
            }
            Opcode::LogoutResponse => Pdu::LogoutResponse(LogoutResponse {
                response: bhs[2],
                itt: h.u32(16),
                statsn: h.u32(24),
                expcmdsn: h.u32(28),
                maxcmdsn: h.u32(32),
                time2wait: h.u16(40),
                time2retain: h.u16(42),
            }),
            Opcode::R2t => Pdu::R2t(R2t {
                lun: h.u64(8),
                itt: h.u32(16),
                ttt: h.u32(20),
                statsn: h.u32(24),
                expcmdsn: h.u32(28),
                maxcmdsn: h.u32(32),
                r2tsn: h.u32(36),
                buffer_offset: h.u32(40),
                desired_data_transfer_length: h.u32(44),
            }),
            Opcode::AsyncMessage => Pdu::AsyncMessage(AsyncMessage {
                lun: h.u64(8),
                statsn: h.u32(24),
                expcmdsn: h.u32(28),
                maxcmdsn: h.u32(32),
                async_event: bhs[36],
                async_vcode: bhs[37],
                parameter1: h.u16(38),
                parameter2: h.u16(40),
                parameter3: h.u16(42),
                data,
            }),
            Opcode::Reject => Pdu::Reject(Reject {
                reason: bhs[2],
                statsn: h.u32(24),
                expcmdsn: h.u32(28),
                maxcmdsn: h.u32(32),
                datasn: h.u32(36),
                data,
            }),
        })
    }
}

fn login_stage_byte(transit: bool, cont: bool, csg: u8, nsg: u8) -> u8 {
    let mut b = ((csg & 3) << 2) | (nsg & 3);
    if transit {
        b |= T_BIT;
    }
    if cont {
        b |= C_BIT_LOGIN;
    }
    b
}

fn login_stages(b: u8) -> (bool, bool, u8, u8) {
    (b & T_BIT != 0, b & C_BIT_LOGIN != 0, (b >> 2) & 3, b & 3)
}

fn isid(bhs: &[u8; BHS_LEN]) -> [u8; 6] {
    [bhs[8], bhs[9], bhs[10], bhs[11], bhs[12], bhs[13]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding() {
        assert_eq!(
            (0..8).map(pad_len).collect::<Vec<_>>(),
            [0, 3, 2, 1, 0, 3, 2, 1]
        );
    }

    #[test]
    fn sense_helpers() {
        let r = ScsiResponse::with_sense(&[0x70, 0, 5]);
        assert_eq!(r.status, 2);
        assert_eq!(&r.data[..], &[0, 3, 0x70, 0, 5]);
        assert_eq!(r.sense(), Some(&[0x70, 0, 5][..]));
        assert_eq!(ScsiResponse::default().sense(), None);
        let truncated = ScsiResponse {
            data: Bytes::from_static(&[0, 9, 1]),
            ..Default::default()
        };
        assert_eq!(truncated.sense(), None);
    }
}
