//! Incremental PDU framing on a byte stream, for target and initiator alike.
//!
//! [`PduDecoder::decode`] takes whole PDUs off the front of a `BytesMut` the caller reads
//! into. The data segment is split out of that buffer without copying. The negotiated
//! MaxRecvDataSegmentLength is a hard limit: a segment announcing more is skipped as it
//! arrives and never buffered, so a peer cannot make us allocate more than the limit.

use bytes::{Buf, BytesMut};

use crate::digest::{self, DIGEST_LEN};
use crate::pdu::{self, reject_reason, Digests, Pdu, PduError, BHS_LEN};

/// Limits a decoder enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest data segment accepted, in bytes: our MaxRecvDataSegmentLength.
    pub max_recv_data_segment: u32,
}

impl FrameLimits {
    /// MaxRecvDataSegmentLength in force during login (RFC 7143 section 13.12).
    pub const LOGIN_MAX_RECV_DATA_SEGMENT: u32 = 8192;
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_recv_data_segment: Self::LOGIN_MAX_RECV_DATA_SEGMENT,
        }
    }
}

/// Why the stream did not yield a PDU.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header digest did not match. PDU boundaries can no longer be trusted: drop the
    /// connection. Nothing was consumed.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest did not match. The PDU was consumed; answer with a Reject (reason
    /// "data digest error") carrying `bhs`.
    #[error("data digest mismatch")]
    DataDigest { bhs: [u8; BHS_LEN] },
    /// DataSegmentLength exceeds our limit. The header and whatever of the body is already
    /// buffered were consumed; the decoder skips the rest as it arrives without buffering
    /// it. Keep calling `decode` to go on with the next PDU after a Reject, or close the
    /// connection.
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataSegmentTooLarge {
        bhs: [u8; BHS_LEN],
        len: u32,
        max: u32,
    },
    /// The PDU was framed correctly but is malformed. The whole PDU was consumed; answer
    /// with a Reject carrying `bhs` (or a Login Response during login).
    #[error("malformed PDU: {err}")]
    Pdu { bhs: [u8; BHS_LEN], err: PduError },
}

impl FrameError {
    /// The header of the offending PDU, when the connection can go on after rejecting it.
    pub fn rejected_header(&self) -> Option<&[u8; BHS_LEN]> {
        match self {
            FrameError::HeaderDigest => None,
            FrameError::DataDigest { bhs }
            | FrameError::DataSegmentTooLarge { bhs, .. }
            | FrameError::Pdu { bhs, .. } => Some(bhs),
        }
    }

    /// The Reject reason code that answers this error, if a Reject is the answer.
    pub fn reject_reason(&self) -> Option<u8> {
        match self {
            FrameError::HeaderDigest => None,
            FrameError::DataDigest { .. } => Some(reject_reason::DATA_DIGEST_ERROR),
            FrameError::DataSegmentTooLarge { .. } => Some(reject_reason::PROTOCOL_ERROR),
            FrameError::Pdu { err, .. } => Some(err.reject_reason()),
        }
    }
}

#[derive(Debug)]
enum State {
    /// Waiting for a BHS (and AHS and header digest).
    Header,
    /// Header checked; waiting for the rest of the PDU.
    Body {
        bhs: [u8; BHS_LEN],
        /// BHS + AHS + header digest.
        header_len: usize,
        data_len: usize,
        data_digest: bool,
    },
    /// Skipping the body of a PDU whose data segment was too large.
    Skip { remaining: usize },
}

/// Incremental decoder of a PDU stream.
#[derive(Debug)]
pub struct PduDecoder {
    limits: FrameLimits,
    digests: Digests,
    state: State,
}

impl PduDecoder {
    /// A decoder without digests (as at the start of login).
    pub fn new(limits: FrameLimits) -> Self {
        PduDecoder {
            limits,
            digests: Digests::default(),
            state: State::Header,
        }
    }

    /// Digests to expect from the next PDU on (after login negotiated them).
    pub fn set_digests(&mut self, d: Digests) {
        self.digests = d;
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// The largest data segment accepted from the next PDU on.
    pub fn set_max_recv_data_segment(&mut self, n: u32) {
        self.limits.max_recv_data_segment = n;
    }

    pub fn limits(&self) -> FrameLimits {
        self.limits
    }

    /// Whether a PDU is partly consumed or partly in `buf`: at end of stream this means
    /// the peer closed mid-PDU.
    pub fn is_mid_pdu(&self, buf: &BytesMut) -> bool {
        !buf.is_empty() || !matches!(self.state, State::Header)
    }

    /// Takes one whole PDU off the front of `buf`, or returns `Ok(None)` when more bytes are
    /// needed (after reserving room for them in `buf`). See [`FrameError`] for what each
    /// error leaves consumed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Pdu>, FrameError> {
        loop {
            match self.state {
                State::Skip { remaining } => {
                    let n = remaining.min(buf.len());
                    buf.advance(n);
                    if n < remaining {
                        self.state = State::Skip {
                            remaining: remaining - n,
                        };
                        return Ok(None);
                    }
                    self.state = State::Header;
                }
                State::Header => {
                    let Some((bhs, header_len)) = self.header(buf)? else {
                        let want = buf
                            .first_chunk::<BHS_LEN>()
                            .map_or(BHS_LEN, |bhs| self.header_len(bhs));
                        buf.reserve(want - buf.len());
                        return Ok(None);
                    };
                    let data_len = pdu::data_segment_len(&bhs);
                    let data_digest = self.digests.data && data_len > 0;
                    let max = self.limits.max_recv_data_segment;
                    if data_len > max as usize {
                        buf.advance(header_len);
                        let remaining = body_len(data_len, data_digest);
                        let now = remaining.min(buf.len());
                        buf.advance(now);
                        self.state = if now == remaining {
                            State::Header
                        } else {
                            State::Skip {
                                remaining: remaining - now,
                            }
                        };
                        return Err(FrameError::DataSegmentTooLarge {
                            bhs,
                            len: data_len as u32,
                            max,
                        });
                    }
                    self.state = State::Body {
                        bhs,
                        header_len,
                        data_len,
                        data_digest,
                    };
                }
                State::Body {
                    bhs,
                    header_len,
                    data_len,
                    data_digest,
                } => {
                    let total = header_len + body_len(data_len, data_digest);
                    if buf.len() < total {
                        buf.reserve(total - buf.len());
                        return Ok(None);
                    }
                    self.state = State::Header;
                    let header = buf.split_to(header_len);
                    let data = buf.split_to(data_len).freeze();
                    let trailer = buf.split_to(total - header_len - data_len);
                    if data_digest {
                        let pad = pdu::pad_len(data_len);
                        let crc = digest::crc32c_append(digest::crc32c(&data), &trailer[..pad]);
                        if !digest::verify_digest_value(crc, &trailer[pad..]) {
                            return Err(FrameError::DataDigest { bhs });
                        }
                    }
                    let ahs = &header[BHS_LEN..BHS_LEN + pdu::total_ahs_len(&bhs)];
                    return Pdu::decode(&bhs, ahs, data)
                        .map(Some)
                        .map_err(|err| FrameError::Pdu { bhs, err });
                }
            }
        }
    }
}

/// The header of the next PDU, whole in the buffer and checked: see
/// [`PduDecoder::peek_header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeekedHeader {
    pub bhs: [u8; BHS_LEN],
    /// Bytes the header takes at the front of the buffer: BHS, AHS, header digest.
    pub header_len: usize,
    /// DataSegmentLength: bytes of data after the header, without padding.
    pub data_len: usize,
}

impl PduDecoder {
    /// Bytes of the header that starts with `bhs`: BHS, AHS and header digest.
    fn header_len(&self, bhs: &[u8; BHS_LEN]) -> usize {
        BHS_LEN + pdu::total_ahs_len(bhs) + if self.digests.header { DIGEST_LEN } else { 0 }
    }

    /// The BHS and header length of the PDU at the front of `buf` once its whole header is
    /// there, checked against the header digest; consumes nothing.
    fn header(&self, buf: &[u8]) -> Result<Option<([u8; BHS_LEN], usize)>, FrameError> {
        let Some(bhs) = buf.first_chunk::<BHS_LEN>().copied() else {
            return Ok(None);
        };
        let header_len = self.header_len(&bhs);
        if buf.len() < header_len {
            return Ok(None);
        }
        if self.digests.header {
            let covered = header_len - DIGEST_LEN;
            if !digest::verify_digest(&buf[..covered], &buf[covered..header_len]) {
                return Err(FrameError::HeaderDigest);
            }
        }
        Ok(Some((bhs, header_len)))
    }

    /// The header of the next PDU once it is whole in `buf` and checked, consuming nothing,
    /// so that a reader can take a large data segment off the stream itself, straight to
    /// where it belongs ([`PduDecoder::take_header`]). `None` when more bytes are needed,
    /// and for what [`PduDecoder::decode`] must handle: a segment being skipped, over the
    /// limit, or with a data digest. Either way `decode` may be called next as usual.
    pub fn peek_header(&mut self, buf: &BytesMut) -> Result<Option<PeekedHeader>, FrameError> {
        let (bhs, header_len, data_len) = match self.state {
            State::Skip { .. } => return Ok(None),
            State::Body {
                data_digest: true, ..
            } => return Ok(None),
            State::Body {
                bhs,
                header_len,
                data_len,
                ..
            } => (bhs, header_len, data_len),
            State::Header => {
                let Some((bhs, header_len)) = self.header(buf)? else {
                    return Ok(None);
                };
                let data_len = pdu::data_segment_len(&bhs);
                if data_len > self.limits.max_recv_data_segment as usize {
                    return Ok(None);
                }
                let data_digest = self.digests.data && data_len > 0;
                // As `decode` would: the header is checked, the body is awaited.
                self.state = State::Body {
                    bhs,
                    header_len,
                    data_len,
                    data_digest,
                };
                if data_digest {
                    return Ok(None);
                }
                (bhs, header_len, data_len)
            }
        };
        Ok(Some(PeekedHeader {
            bhs,
            header_len,
            data_len,
        }))
    }

    /// Takes the header that [`PduDecoder::peek_header`] returned off `buf` and decodes the
    /// PDU as if its data segment were empty. The `data_len` bytes of the segment and its
    /// padding are then the caller's to take off the stream (first whatever of them is
    /// already in `buf`); the decoder expects the next PDU after them. An error leaves the
    /// stream in the middle of the PDU: drop the connection.
    pub fn take_header(&mut self, buf: &mut BytesMut, h: &PeekedHeader) -> Result<Pdu, FrameError> {
        self.state = State::Header;
        let header = buf.split_to(h.header_len);
        let mut bhs = h.bhs;
        bhs[5..8].fill(0);
        let ahs = &header[BHS_LEN..BHS_LEN + pdu::total_ahs_len(&bhs)];
        Pdu::decode(&bhs, ahs, bytes::Bytes::new())
            .map_err(|err| FrameError::Pdu { bhs: h.bhs, err })
    }
}

/// Bytes after the header: data segment, padding, and data digest if any.
fn body_len(data_len: usize, data_digest: bool) -> usize {
    data_len + pdu::pad_len(data_len) + if data_digest { DIGEST_LEN } else { 0 }
}
