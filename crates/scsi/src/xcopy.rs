//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (SPC-4 6.4, 6.18): the parameter list's
//! syntax, the copy manager's limits and the data RECEIVE COPY RESULTS returns. Running
//! the segments is the logical unit's business (`lu/copy.rs`), because it reads and writes
//! logical units.

use std::sync::Arc;

use crate::cdb::{be16, be24, be32, be64};
use crate::sense::{self, Sense};
use crate::LogicalUnit;

/// Most CSCD descriptors in one EXTENDED COPY.
pub(crate) const MAX_CSCD_DESCRIPTORS: u16 = 8;
/// Most segment descriptors in one EXTENDED COPY.
pub(crate) const MAX_SEGMENT_DESCRIPTORS: u16 = 64;
/// Longest CSCD and segment descriptor lists together: the most of each.
pub(crate) const MAX_DESCRIPTOR_LIST_LENGTH: u32 = MAX_CSCD_DESCRIPTORS as u32 * CSCD_LEN as u32
    + MAX_SEGMENT_DESCRIPTORS as u32 * SEGMENT_LEN as u32;

const HEADER_LEN: usize = 16;
const CSCD_LEN: usize = 32;
const SEGMENT_LEN: usize = 28;

/// Segment descriptor type 02h: block device to block device.
pub(crate) const SEGMENT_BLOCK_TO_BLOCK: u8 = 0x02;
/// CSCD descriptor type E4h: identification descriptor (a VPD page 83h designator).
pub(crate) const CSCD_IDENTIFICATION: u8 = 0xe4;

/// LIST ID USAGE (SPC-4 table 107): 00b keeps the copy's status for RECEIVE COPY
/// RESULTS, 10b keeps the list identifier only while the copy runs, 11b has none.
pub(crate) const LIST_ID_HOLD: u8 = 0b00;
pub(crate) const LIST_ID_NONE: u8 = 0b11;

/// A designator of a logical unit (VPD page 83h, association: logical unit).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Designator {
    /// 1: binary, 2: ASCII, 3: UTF-8.
    pub code_set: u8,
    /// DESIGNATOR TYPE: 1 T10 vendor ID, 2 EUI-64, 3 NAA, ...
    pub kind: u8,
    pub value: Vec<u8>,
}

/// What a command may reach beyond the logical unit it was sent to, as the transport's
/// access rules have it at the moment of the call (the sending session's view of the
/// target, LUN masking applied). Commands that name other logical units (EXTENDED COPY)
/// or other initiators (REGISTER AND MOVE's TransportID) ask it where the data is
/// reached, not only where the command came in.
pub trait Reach: Send + Sync {
    /// The logical unit with `designator` among those the sending I_T nexus may reach.
    /// A copy asks again before each piece it moves, so one masked while the copy runs
    /// stops it. A logical unit outside the view is indistinguishable from one that does
    /// not exist.
    fn find(&self, designator: &Designator) -> Option<Arc<LogicalUnit>>;

    /// Whether the initiator named `initiator` (its iSCSI name, no ISID) may reach `lu`,
    /// which the sending nexus reaches.
    fn admits(&self, initiator: &str, lu: &LogicalUnit) -> bool;
}

/// No logical unit but the one the command was sent to, and no access rules on
/// initiators: what a command reaches when the transport gives no view.
#[derive(Debug, Clone, Copy, Default)]
pub struct OnlyItself;

impl Reach for OnlyItself {
    fn find(&self, _: &Designator) -> Option<Arc<LogicalUnit>> {
        None
    }

    fn admits(&self, _: &str, _: &LogicalUnit) -> bool {
        true
    }
}

/// One CSCD descriptor as the parameter list gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cscd {
    /// Offset of the descriptor in the parameter list.
    pub offset: usize,
    pub peripheral_type: u8,
    /// Association 00b is a logical unit; anything else names no copy target here.
    pub association: u8,
    pub designator: Designator,
    /// DISK BLOCK LENGTH of the block device type specific parameters.
    pub block_size: u32,
}

/// A block device to block device segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub offset: usize,
    pub source: u16,
    pub destination: u16,
    /// DC: the block count is in destination blocks, not source blocks.
    pub destination_count: bool,
    pub blocks: u16,
    pub source_lba: u64,
    pub destination_lba: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CopyList {
    pub list_id: u8,
    pub list_id_usage: u8,
    pub cscds: Vec<Cscd>,
    pub segments: Vec<Segment>,
}

/// Bytes of parameter list an EXTENDED COPY CDB announces.
pub(crate) fn parameter_list_length(cdb: &[u8]) -> u32 {
    be32(&cdb[10..14])
}

/// Checks the parameter list of an EXTENDED COPY (LID1) before anything is copied; `None`
/// for an empty list, which copies nothing. `p` holds the whole parameter list.
pub(crate) fn parse(p: &[u8]) -> Result<Option<CopyList>, Sense> {
    if p.is_empty() {
        return Ok(None);
    }
    if p.len() < HEADER_LEN {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let list_id = p[0];
    let list_id_usage = (p[1] >> 3) & 0x03;
    if list_id_usage == 0b01 {
        return Err(Sense::invalid_field_in_parameter_list(1, Some(4)));
    }
    let cscd_len = be16(&p[2..4]) as usize;
    let segment_len = be32(&p[8..12]) as usize;
    let inline_len = be32(&p[12..16]) as usize;
    // No segment type offered here takes inline data.
    if inline_len != 0 {
        return Err(Sense::invalid_field_in_parameter_list(12, None));
    }
    if (cscd_len as u64 + segment_len as u64) > MAX_DESCRIPTOR_LIST_LENGTH as u64 {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let end = HEADER_LEN + cscd_len + segment_len;
    if end > p.len() {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }

    if cscd_len.div_ceil(CSCD_LEN) > MAX_CSCD_DESCRIPTORS as usize {
        return Err(sense::TOO_MANY_TARGET_DESCRIPTORS);
    }
    let mut cscds = Vec::new();
    let mut off = HEADER_LEN;
    while off < HEADER_LEN + cscd_len {
        if p[off] != CSCD_IDENTIFICATION {
            return Err(sense::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE.at_parameter(off as u16));
        }
        if off + CSCD_LEN > HEADER_LEN + cscd_len {
            return Err(Sense::invalid_field_in_parameter_list(2, None));
        }
        let d = &p[off..off + CSCD_LEN];
        let len = d[7] as usize;
        if len > 20 {
            return Err(Sense::invalid_field_in_parameter_list(
                (off + 7) as u16,
                None,
            ));
        }
        // LU ID TYPE and NUL are obsolete in SPC-4, RELATIVE INITIATOR PORT IDENTIFIER
        // zero or not: every target port reaches every logical unit here.
        cscds.push(Cscd {
            offset: off,
            peripheral_type: d[1] & 0x1f,
            association: (d[5] >> 4) & 0x03,
            designator: Designator {
                code_set: d[4] & 0x0f,
                kind: d[5] & 0x0f,
                value: d[8..8 + len].to_vec(),
            },
            block_size: be24(&d[29..32]),
        });
        off += CSCD_LEN;
    }

    let mut segments = Vec::new();
    let segments_end = end;
    while off < segments_end {
        if segments.len() == MAX_SEGMENT_DESCRIPTORS as usize {
            return Err(sense::TOO_MANY_SEGMENT_DESCRIPTORS);
        }
        if p[off] != SEGMENT_BLOCK_TO_BLOCK {
            return Err(sense::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE.at_parameter(off as u16));
        }
        if off + 4 > segments_end || be16(&p[off + 2..off + 4]) as usize != SEGMENT_LEN - 4 {
            return Err(Sense::invalid_field_in_parameter_list(
                (off + 2) as u16,
                None,
            ));
        }
        if off + SEGMENT_LEN > segments_end {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let d = &p[off..off + SEGMENT_LEN];
        segments.push(Segment {
            offset: off,
            destination_count: d[1] & 0x02 != 0,
            source: be16(&d[4..6]),
            destination: be16(&d[6..8]),
            blocks: be16(&d[10..12]),
            source_lba: be64(&d[12..20]),
            destination_lba: be64(&d[20..28]),
        });
        off += SEGMENT_LEN;
    }
    Ok(Some(CopyList {
        list_id,
        list_id_usage,
        cscds,
        segments,
    }))
}

/// COPY MANAGER STATUS values (SPC-4 table 364).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyState {
    InProgress,
    Done,
    Failed,
}

/// What RECEIVE COPY RESULTS / COPY STATUS reports of one EXTENDED COPY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CopyStatus {
    pub state: CopyState,
    pub segments_processed: u16,
    pub bytes: u64,
}

impl CopyStatus {
    pub fn data(&self) -> Vec<u8> {
        let mut d = vec![0u8; 12];
        d[0..4].copy_from_slice(&8u32.to_be_bytes());
        d[4] = match self.state {
            CopyState::InProgress => 0x00,
            CopyState::Done => 0x01,
            CopyState::Failed => 0x02,
        };
        d[5..7].copy_from_slice(&self.segments_processed.to_be_bytes());
        // TRANSFER COUNT UNITS: bytes, then kibibytes, mebibytes... as the count needs.
        let mut units = 0u8;
        let mut count = self.bytes;
        while count > u32::MAX as u64 {
            count >>= 10;
            units += 1;
        }
        d[7] = units;
        d[8..12].copy_from_slice(&(count as u32).to_be_bytes());
        d
    }
}

/// RECEIVE COPY RESULTS / OPERATING PARAMETERS (SPC-4 6.18.4).
pub(crate) fn operating_parameters(block_size: u32) -> Vec<u8> {
    let mut d = vec![0u8; 44];
    d[4] = 0x01; // SNLID: LIST ID USAGE 11b is supported
    d[8..10].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    d[10..12].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    d[12..16].copy_from_slice(&MAX_DESCRIPTOR_LIST_LENGTH.to_be_bytes());
    let max_segment = (u16::MAX as u64 * block_size as u64).min(u32::MAX as u64) as u32;
    d[16..20].copy_from_slice(&max_segment.to_be_bytes());
    // No inline data, no held data, no stream devices.
    d[34..36].copy_from_slice(&255u16.to_be_bytes()); // TOTAL CONCURRENT COPIES
    d[36] = 255; // MAXIMUM CONCURRENT COPIES
    d[37] = block_size.trailing_zeros() as u8; // DATA SEGMENT GRANULARITY
    let implemented = [SEGMENT_BLOCK_TO_BLOCK, CSCD_IDENTIFICATION];
    d[43] = implemented.len() as u8;
    d.extend_from_slice(&implemented);
    let available = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&available.to_be_bytes());
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(list_id: u8, usage: u8, cscd_len: u16, seg_len: u32) -> Vec<u8> {
        let mut h = vec![0u8; 16];
        h[0] = list_id;
        h[1] = usage << 3;
        h[2..4].copy_from_slice(&cscd_len.to_be_bytes());
        h[8..12].copy_from_slice(&seg_len.to_be_bytes());
        h
    }

    fn cscd(naa: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4] = 0x01;
        d[5] = 0x03;
        d[7] = naa.len() as u8;
        d[8..8 + naa.len()].copy_from_slice(naa);
        d[29..32].copy_from_slice(&[0, 2, 0]);
        d
    }

    fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
        let mut d = vec![0u8; 28];
        d[0] = 0x02;
        d[2..4].copy_from_slice(&24u16.to_be_bytes());
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        d
    }

    #[test]
    fn parses_one_segment() {
        let mut p = header(7, LIST_ID_HOLD, 32, 28);
        p.extend(cscd(&[0x60; 16]));
        p.extend(segment(0, 0, 8, 1, 100));
        let l = parse(&p).unwrap().unwrap();
        assert_eq!((l.list_id, l.list_id_usage), (7, LIST_ID_HOLD));
        assert_eq!(l.cscds[0].designator.value, vec![0x60; 16]);
        assert_eq!(l.cscds[0].block_size, 512);
        assert_eq!(l.segments[0].blocks, 8);
        assert_eq!(l.segments[0].destination_lba, 100);
        assert_eq!(l.segments[0].offset, 48);
    }

    #[test]
    fn empty_list_copies_nothing() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&[0; 10]), Err(sense::PARAMETER_LIST_LENGTH_ERROR));
    }

    #[test]
    fn truncated_lists_are_length_errors() {
        let mut p = header(1, 0, 32, 28);
        p.extend(cscd(&[0x60; 16]));
        p.extend(segment(0, 0, 8, 1, 100));
        for cut in [47, 75] {
            assert_eq!(parse(&p[..cut]), Err(sense::PARAMETER_LIST_LENGTH_ERROR));
        }
    }

    #[test]
    fn limits_and_unsupported_types() {
        let n = MAX_CSCD_DESCRIPTORS + 1;
        let mut p = header(1, 0, 32 * n, 28);
        (0..n).for_each(|_| p.extend(cscd(&[0x60; 16])));
        p.extend(segment(0, 0, 1, 0, 0));
        assert_eq!(parse(&p), Err(sense::TOO_MANY_TARGET_DESCRIPTORS));

        let n = MAX_SEGMENT_DESCRIPTORS as u32 + 1;
        let mut p = header(1, 0, 32, 28 * n);
        p.extend(cscd(&[0x60; 16]));
        (0..n).for_each(|_| p.extend(segment(0, 0, 1, 0, 0)));
        assert_eq!(parse(&p), Err(sense::TOO_MANY_SEGMENT_DESCRIPTORS));

        let mut p = header(1, 0, 32, 28);
        let mut fc = cscd(&[0x60; 16]);
        fc[0] = 0xe0;
        p.extend(fc);
        p.extend(segment(0, 0, 1, 0, 0));
        let e = parse(&p).unwrap_err();
        assert_eq!((e.asc, e.ascq), (0x26, 0x07));
        assert_eq!(e.sks, Some([0x80, 0, 16]));

        let mut p = header(1, 0, 32, 20);
        p.extend(cscd(&[0x60; 16]));
        let mut stream = segment(0, 0, 1, 0, 0);
        stream[0] = 0x03;
        p.extend(&stream[..20]);
        assert_eq!(
            parse(&p).unwrap_err().ascq,
            sense::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE.ascq
        );
    }

    #[test]
    fn overlong_lists_and_bad_fields() {
        let mut p = header(1, 0, 32, MAX_DESCRIPTOR_LIST_LENGTH);
        p.resize(16 + 32 + MAX_DESCRIPTOR_LIST_LENGTH as usize, 0);
        assert_eq!(parse(&p), Err(sense::PARAMETER_LIST_LENGTH_ERROR));

        let mut p = header(1, 0b01, 0, 0);
        assert_eq!(
            parse(&p).unwrap_err(),
            Sense::invalid_field_in_parameter_list(1, Some(4))
        );
        p[1] = 0;
        p[15] = 4;
        assert_eq!(parse(&p).unwrap_err().asc, 0x26);

        let mut p = header(1, 0, 32, 28);
        let mut long = cscd(&[0x60; 16]);
        long[7] = 21;
        p.extend(long);
        p.extend(segment(0, 0, 1, 0, 0));
        assert_eq!(
            parse(&p).unwrap_err(),
            Sense::invalid_field_in_parameter_list(23, None)
        );

        let mut p = header(1, 0, 32, 28);
        p.extend(cscd(&[0x60; 16]));
        let mut seg = segment(0, 0, 1, 0, 0);
        seg[3] = 0x10;
        p.extend(seg);
        assert_eq!(
            parse(&p).unwrap_err(),
            Sense::invalid_field_in_parameter_list(50, None)
        );
    }

    #[test]
    fn copy_status_units() {
        let s = CopyStatus {
            state: CopyState::Done,
            segments_processed: 2,
            bytes: 1 << 20,
        };
        let d = s.data();
        assert_eq!((d[3], d[4], d[6], d[7]), (8, 1, 2, 0));
        assert_eq!(be32(&d[8..12]), 1 << 20);
        let big = CopyStatus {
            bytes: 1 << 40,
            ..s
        }
        .data();
        assert_eq!((big[7], be32(&big[8..12])), (1, 1 << 30));
    }

    #[test]
    fn operating_parameters_layout() {
        let d = operating_parameters(512);
        assert_eq!(be32(&d[0..4]) as usize, d.len() - 4);
        assert_eq!(be16(&d[8..10]), MAX_CSCD_DESCRIPTORS);
        assert_eq!(be16(&d[10..12]), MAX_SEGMENT_DESCRIPTORS);
        assert_eq!(d[43], 2);
        assert_eq!(&d[44..], &[0x02, 0xe4]);
    }
}
