//! Sense data (SPC-5 4.4): keys, additional sense codes and the two formats.

/// Sense keys.
pub mod key {
    pub const NO_SENSE: u8 = 0x00;
    pub const RECOVERED_ERROR: u8 = 0x01;
    pub const NOT_READY: u8 = 0x02;
    pub const MEDIUM_ERROR: u8 = 0x03;
    pub const HARDWARE_ERROR: u8 = 0x04;
    pub const ILLEGAL_REQUEST: u8 = 0x05;
    pub const UNIT_ATTENTION: u8 = 0x06;
    pub const DATA_PROTECT: u8 = 0x07;
    pub const COPY_ABORTED: u8 = 0x0a;
    pub const ABORTED_COMMAND: u8 = 0x0b;
    pub const MISCOMPARE: u8 = 0x0e;
}

/// One sense condition. Encoded on demand in fixed (70h) or descriptor (72h) format, and
/// read back from either by [`Sense::parse`] (the initiator's side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// INFORMATION field (e.g. the offset of a miscompare).
    pub information: Option<u64>,
    /// SENSE KEY SPECIFIC bytes, SKSV included.
    pub sks: Option<[u8; 3]>,
}

pub const NO_SENSE: Sense = Sense::new(key::NO_SENSE, 0x00, 0x00);
pub const INVALID_COMMAND_OPERATION_CODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
pub const INVALID_FIELD_IN_PARAMETER_LIST: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
pub const PARAMETER_LIST_LENGTH_ERROR: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1a, 0x00);
pub const INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT: Sense =
    Sense::new(key::ILLEGAL_REQUEST, 0x0e, 0x03);
pub const LOGICAL_UNIT_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
pub const SAVING_PARAMETERS_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
pub const MEDIUM_REMOVAL_PREVENTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x53, 0x02);
pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
pub const NOT_READY_INITIALIZING_COMMAND_REQUIRED: Sense = Sense::new(key::NOT_READY, 0x04, 0x02);
pub const SANITIZE_IN_PROGRESS: Sense = Sense::new(key::NOT_READY, 0x04, 0x1b);
pub const MEDIUM_NOT_PRESENT: Sense = Sense::new(key::NOT_READY, 0x3a, 0x00);
pub const POWER_ON_RESET: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
pub const MODE_PARAMETERS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x01);
pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x03);
pub const RESERVATIONS_RELEASED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x04);
pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x05);
pub const CAPACITY_DATA_HAS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x09);
/// SAM-5 5.6: commands of this I_T nexus were aborted by another one (PREEMPT AND ABORT)
/// and, the Control mode page's TAS being zero, got no answer.
pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: Sense =
    Sense::new(key::UNIT_ATTENTION, 0x2f, 0x00);
/// SPC-4 5.16.2.6: a target port group's asymmetric access state changed.
pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x2a, 0x06);
/// SPC-4 5.16.2.4: what a target port in the transitioning, standby and unavailable
/// asymmetric access states answers to the commands those states do not allow.
pub const ASYMMETRIC_ACCESS_STATE_TRANSITION: Sense = Sense::new(key::NOT_READY, 0x04, 0x0a);
pub const TARGET_PORT_IN_STANDBY_STATE: Sense = Sense::new(key::NOT_READY, 0x04, 0x0b);
pub const TARGET_PORT_IN_UNAVAILABLE_STATE: Sense = Sense::new(key::NOT_READY, 0x04, 0x0c);
/// SPC-4 6.43: a SET TARGET PORT GROUPS the device server could not carry out.
pub const SET_TARGET_PORT_GROUPS_COMMAND_FAILED: Sense =
    Sense::new(key::HARDWARE_ERROR, 0x67, 0x0a);
pub const REPORTED_LUNS_DATA_HAS_CHANGED: Sense = Sense::new(key::UNIT_ATTENTION, 0x3f, 0x0e);
pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: Sense =
    Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04);
pub const MISCOMPARE_DURING_VERIFY: Sense = Sense::new(key::MISCOMPARE, 0x1d, 0x00);
pub const UNRECOVERED_READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0c, 0x00);
pub const LOGICAL_UNIT_FAILED_SELF_TEST: Sense = Sense::new(key::HARDWARE_ERROR, 0x3e, 0x03);
pub const OPERATION_IN_PROGRESS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x00, 0x16);
pub const TOO_MANY_TARGET_DESCRIPTORS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x06);
pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE: Sense =
    Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x07);
pub const TOO_MANY_SEGMENT_DESCRIPTORS: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x08);
pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE: Sense =
    Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x09);
/// A copy target failed the copy (its own error is not passed on in this form).
pub const COPY_ABORTED: Sense = Sense::new(key::COPY_ABORTED, 0x00, 0x00);
pub const UNREACHABLE_COPY_TARGET: Sense = Sense::new(key::COPY_ABORTED, 0x08, 0x04);
pub const COPY_TARGET_DEVICE_NOT_REACHABLE: Sense = Sense::new(key::COPY_ABORTED, 0x0d, 0x02);
pub const INCORRECT_COPY_TARGET_DEVICE_TYPE: Sense = Sense::new(key::COPY_ABORTED, 0x0d, 0x03);

/// Length of fixed-format sense data as built here.
pub const FIXED_LEN: usize = 18;

impl Sense {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            information: None,
            sks: None,
        }
    }

    pub const fn with_information(mut self, information: u64) -> Self {
        self.information = Some(information);
        self
    }

    /// The progress indication of an operation under way (SPC-5 4.4.1.2.3): `done` in
    /// 65536ths, in the sense-key specific bytes.
    pub const fn with_progress(mut self, done: u16) -> Self {
        let [hi, lo] = done.to_be_bytes();
        self.sks = Some([0x80, hi, lo]);
        self
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`, when the field is narrower than a
    /// byte) of the CDB.
    pub fn invalid_field_in_cdb(byte: u16, bit: Option<u8>) -> Self {
        Self {
            sks: Some(field_pointer(true, byte, bit)),
            ..INVALID_FIELD_IN_CDB
        }
    }

    /// ABORTED COMMAND in the DATA PHASE ERROR family (ASC 4Bh): the transport's data
    /// sequence broke in the way `ascq` names (e.g. 01h an unknown target port transfer
    /// tag, 02h too much write data, 05h a data offset error).
    pub const fn data_phase_error(ascq: u8) -> Self {
        Self::new(key::ABORTED_COMMAND, 0x4b, ascq)
    }

    /// INVALID FIELD IN PARAMETER LIST pointing into the data-out buffer.
    pub fn invalid_field_in_parameter_list(byte: u16, bit: Option<u8>) -> Self {
        Self {
            sks: Some(field_pointer(false, byte, bit)),
            ..INVALID_FIELD_IN_PARAMETER_LIST
        }
    }

    /// The same condition, its sense-key specific bytes pointing at `byte` of the
    /// parameter list. For COPY ABORTED that is a segment pointer (SPC-4 4.5.2.4.6) with
    /// SD clear: the offset of the segment descriptor in the parameter list, laid out as a
    /// field pointer is.
    pub fn at_parameter(self, byte: u16) -> Self {
        Self {
            sks: Some(field_pointer(false, byte, None)),
            ..self
        }
    }

    /// Sense data as a target sent it, fixed or descriptor format; `None` for a response
    /// code that is neither or data too short for its format. The INFORMATION field is
    /// read when valid; the sense-key specific bytes are not (no reader needs them).
    pub fn parse(b: &[u8]) -> Option<Sense> {
        match b.first()? & 0x7f {
            0x70 | 0x71 if b.len() >= 14 => Some(Sense {
                information: (b[0] & 0x80 != 0)
                    .then(|| u64::from(u32::from_be_bytes(b[3..7].try_into().unwrap()))),
                ..Sense::new(b[2] & 0x0f, b[12], b[13])
            }),
            0x72 | 0x73 if b.len() >= 4 => {
                let mut sense = Sense::new(b[1] & 0x0f, b[2], b[3]);
                let end = b.get(7).map_or(0, |&n| (8 + usize::from(n)).min(b.len()));
                let mut at = 8;
                while at + 2 <= end {
                    let d = &b[at..(at + 2 + usize::from(b[at + 1])).min(end)];
                    if d[0] == 0x00 && d.len() >= 12 && d[2] & 0x80 != 0 {
                        sense.information = Some(u64::from_be_bytes(d[4..12].try_into().unwrap()));
                    }
                    at += d.len();
                }
                Some(sense)
            }
            _ => None,
        }
    }

    pub fn key_name(&self) -> &'static str {
        match self.key {
            0x0 => "NO SENSE",
            0x1 => "RECOVERED ERROR",
            0x2 => "NOT READY",
            0x3 => "MEDIUM ERROR",
            0x4 => "HARDWARE ERROR",
            0x5 => "ILLEGAL REQUEST",
            0x6 => "UNIT ATTENTION",
            0x7 => "DATA PROTECT",
            0x8 => "BLANK CHECK",
            0xb => "ABORTED COMMAND",
            0xd => "VOLUME OVERFLOW",
            0xe => "MISCOMPARE",
            _ => "sense key",
        }
    }

    /// ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED.
    pub fn is_lun_not_supported(&self) -> bool {
        self.key == key::ILLEGAL_REQUEST && self.asc == 0x25
    }

    /// Fixed format (70h), 18 bytes.
    pub fn fixed(&self) -> Vec<u8> {
        let mut s = vec![0u8; FIXED_LEN];
        s[0] = 0x70;
        s[2] = self.key & 0x0f;
        if let Some(info) = self.information {
            // The fixed format's field has four bytes; larger values cannot be reported
            // there, so VALID stays clear for them.
            if let Ok(info) = u32::try_from(info) {
                s[0] |= 0x80;
                s[3..7].copy_from_slice(&info.to_be_bytes());
            }
        }
        s[7] = (FIXED_LEN - 8) as u8;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some(sks) = self.sks {
            s[15..18].copy_from_slice(&sks);
        }
        s
    }

    /// Descriptor format (72h) with information and sense-key-specific descriptors.
    pub fn descriptor(&self) -> Vec<u8> {
        let mut s = vec![0x72, self.key & 0x0f, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(info) = self.information {
            s.extend_from_slice(&[0x00, 0x0a, 0x80, 0x00]);
            s.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(sks) = self.sks {
            s.extend_from_slice(&[0x02, 0x06, 0x00]);
            s.extend_from_slice(&sks);
            s.extend_from_slice(&[0x00, 0x00]);
        }
        s[7] = (s.len() - 8) as u8;
        s
    }
}

/// How the initiator's errors name a condition: the key's name and the three codes.
impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (key 0x{:x}, ASC 0x{:02x}, ASCQ 0x{:02x})",
            self.key_name(),
            self.key,
            self.asc,
            self.ascq
        )
    }
}

fn field_pointer(in_cdb: bool, byte: u16, bit: Option<u8>) -> [u8; 3] {
    let mut b0 = 0x80;
    if in_cdb {
        b0 |= 0x40;
    }
    if let Some(bit) = bit {
        b0 |= 0x08 | (bit & 0x07);
    }
    let [hi, lo] = byte.to_be_bytes();
    [b0, hi, lo]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_phase_error_is_aborted_command_4bh() {
        let f = Sense::data_phase_error(0x05).fixed();
        assert_eq!((f[2] & 0x0f, f[12], f[13]), (0x0b, 0x4b, 0x05));
    }

    #[test]
    fn fixed_layout() {
        let s = Sense::invalid_field_in_cdb(2, Some(5)).fixed();
        assert_eq!(s.len(), 18);
        assert_eq!(s[0], 0x70);
        assert_eq!(s[2], key::ILLEGAL_REQUEST);
        assert_eq!(s[7], 10);
        assert_eq!((s[12], s[13]), (0x24, 0x00));
        assert_eq!(s[15], 0x80 | 0x40 | 0x08 | 5);
        assert_eq!(u16::from_be_bytes([s[16], s[17]]), 2);
    }

    #[test]
    fn information_field() {
        let s = MISCOMPARE_DURING_VERIFY.with_information(513).fixed();
        assert_eq!(s[0], 0xf0);
        assert_eq!(u32::from_be_bytes([s[3], s[4], s[5], s[6]]), 513);
        let big = MISCOMPARE_DURING_VERIFY.with_information(1 << 40).fixed();
        assert_eq!(big[0], 0x70);
        let d = MISCOMPARE_DURING_VERIFY
            .with_information(1 << 40)
            .descriptor();
        assert_eq!(d[0], 0x72);
        assert_eq!(d[7] as usize, d.len() - 8);
        assert_eq!(u64::from_be_bytes(d[12..20].try_into().unwrap()), 1 << 40);
    }

    #[test]
    fn parse_reads_both_formats_back() {
        for s in [
            MISCOMPARE_DURING_VERIFY.with_information(513),
            POWER_ON_RESET,
        ] {
            assert_eq!(Sense::parse(&s.fixed()), Some(s));
            assert_eq!(Sense::parse(&s.descriptor()), Some(s));
        }
        let field = Sense::invalid_field_in_cdb(2, Some(5));
        assert_eq!(Sense::parse(&field.fixed()), Some(INVALID_FIELD_IN_CDB));
        assert_eq!(
            Sense::parse(&field.descriptor()),
            Some(INVALID_FIELD_IN_CDB)
        );
        // Too large for the fixed format's field: read back without it, as sent.
        let big = MISCOMPARE_DURING_VERIFY.with_information(1 << 40);
        assert_eq!(Sense::parse(&big.fixed()), Some(MISCOMPARE_DURING_VERIFY));
        assert_eq!(Sense::parse(&big.descriptor()), Some(big));
        assert_eq!(Sense::parse(&[0x70, 0, 6]), None);
        assert_eq!(Sense::parse(&[0x00]), None);
        assert_eq!(
            POWER_ON_RESET.to_string(),
            "UNIT ATTENTION (key 0x6, ASC 0x29, ASCQ 0x00)"
        );
    }
}
