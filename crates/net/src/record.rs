//! TLS 1.3's record protection after the handshake (RFC 8446 5.1-5.4), sans-IO: sealing
//! plaintext into records straight into the caller's buffer, and opening records in place.
//!
//! rustls runs the handshake (`crate::tlsconn`) and then hands over the traffic keys
//! (`rustls::kernel`, the interface made for kernel TLS); from there on the records are
//! ours. Through rustls's buffered connection a record cost an allocation and two
//! copies on the way out (the plaintext into the record, the record to the socket) and,
//! on the way in, reads of at most 4 KiB into a zero-filled buffer, a copy of the
//! plaintext into another allocation and a third copy out (`docs/bench-tls.md`). Here a
//! record is the caller's bytes copied into the output buffer and sealed there (ring
//! seals in place only), many records go out in one write, and a record is opened where
//! it landed and copied once, to the reader.
//!
//! Records: outer type application_data, version 0x0303, length; the body is
//! AEAD(plaintext || inner content type), the nonce the IV XOR the 64-bit sequence
//! number, the additional data the record's 5-byte header. No padding is sent; padding
//! received is stripped.

use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

/// Largest plaintext of a record (2^14).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Record header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;
/// The AEAD tag of every TLS 1.3 suite.
pub const TAG_LEN: usize = 16;
/// Bytes a record adds to its plaintext: header, inner content type, tag.
pub const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
/// Largest record a peer may send: 2^14 + 256 bytes of body (RFC 8446 5.2).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 256;

/// Content types (RFC 8446 B.1).
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;

/// Why a record could not be sealed or opened; the connection is over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("TLS record of type {0} after the handshake (only application_data is allowed)")]
    OuterType(u8),
    #[error("TLS record of {0} bytes: longer than TLS allows")]
    TooLong(usize),
    #[error("TLS record too short to hold its tag")]
    TooShort,
    #[error("TLS record failed to decrypt (bad key, sequence or tampering)")]
    Decrypt,
    #[error("TLS record with no content type (all padding)")]
    NoContentType,
    #[error("TLS: the record sequence number is exhausted")]
    SequenceExhausted,
    #[error("TLS: the cipher refused the record")]
    Seal,
}

fn algorithm(s: &ConnectionTrafficSecrets) -> (&'static aead::Algorithm, &[u8], &[u8]) {
    match s {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
            (&aead::AES_128_GCM, key.as_ref(), iv.as_ref())
        }
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
            (&aead::AES_256_GCM, key.as_ref(), iv.as_ref())
        }
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (&aead::CHACHA20_POLY1305, key.as_ref(), iv.as_ref())
        }
        // `ConnectionTrafficSecrets` is non-exhaustive; TLS 1.3 has no other suite that
        // this build offers (`crate::tls::SUITES`).
        #[allow(unreachable_patterns)]
        _ => unreachable!("a TLS 1.3 suite outside crate::tls::SUITES"),
    }
}

/// One direction's key, IV and next sequence number.
struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({:?}, seq {})", self.key.algorithm(), self.seq)
    }
}

impl Keys {
    fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Keys {
        let (alg, key, iv) = algorithm(secrets);
        Keys::from_parts(alg, key, iv, seq)
    }

    fn from_parts(alg: &'static aead::Algorithm, key: &[u8], iv: &[u8], seq: u64) -> Keys {
        let key = LessSafeKey::new(
            UnboundKey::new(alg, key).expect("rustls hands over keys of the suite's length"),
        );
        Keys {
            key,
            iv: iv.try_into().expect("TLS 1.3 IVs are 12 bytes"),
            seq,
        }
    }

    /// The next record's nonce (RFC 8446 5.3), and the sequence number moved on.
    fn next_nonce(&mut self) -> Result<Nonce, RecordError> {
        let seq = self.seq;
        self.seq = seq.checked_add(1).ok_or(RecordError::SequenceExhausted)?;
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
            *b ^= s;
        }
        Ok(Nonce::assume_unique_for_key(n))
    }
}

fn header(body_len: usize) -> [u8; HEADER_LEN] {
    let l = (body_len as u16).to_be_bytes();
    [APPLICATION_DATA, 3, 3, l[0], l[1]]
}

/// A sending key without a counter: seals the record of any given sequence number, so
/// that records may be sealed on other threads (`crate::sealing`) with numbers assigned
/// in order by the one sender, and still be written in that order.
pub struct SealKey {
    key: LessSafeKey,
    iv: [u8; 12],
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SealKey({:?})", self.key.algorithm())
    }
}

impl SealKey {
    /// From the traffic secrets rustls hands over.
    pub fn new(secrets: &ConnectionTrafficSecrets) -> SealKey {
        let (alg, key, iv) = algorithm(secrets);
        let k = Keys::from_parts(alg, key, iv, 0);
        SealKey {
            key: k.key,
            iv: k.iv,
        }
    }

    /// A key of suite `alg` from its raw parts (tests of other modules).
    #[cfg(test)]
    pub(crate) fn for_tests(alg: &'static aead::Algorithm, key: &[u8], iv: &[u8]) -> SealKey {
        let k = Keys::from_parts(alg, key, iv, 0);
        SealKey {
            key: k.key,
            iv: k.iv,
        }
    }

    fn nonce(&self, seq: u64) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
            *b ^= s;
        }
        Nonce::assume_unique_for_key(n)
    }

    /// Seals `plain` (at most [`MAX_PLAINTEXT`] bytes) of content type `typ` as record
    /// number `seq` into the front of `out`, which must hold `plain.len() + OVERHEAD`
    /// bytes; returns the record's length. `plain` is copied into the record and sealed
    /// there (the copy is hot in the cache for the cipher that follows). Each `seq` must
    /// be sealed at most once under one key.
    pub fn seal(
        &self,
        seq: u64,
        typ: u8,
        plain: &[u8],
        out: &mut [u8],
    ) -> Result<usize, RecordError> {
        assert!(plain.len() <= MAX_PLAINTEXT);
        let body = plain.len() + 1 + TAG_LEN;
        let out = &mut out[..HEADER_LEN + body];
        out[HEADER_LEN..HEADER_LEN + plain.len()].copy_from_slice(plain);
        self.seal_in_place(seq, typ, plain.len(), out)
    }

    /// Seals the `n` bytes of plaintext already at `out[HEADER_LEN..HEADER_LEN + n]` in
    /// place as record number `seq` (for plaintext gathered from pieces too small to seal
    /// one by one); `out` must hold `n + OVERHEAD` bytes. Returns the record's length.
    pub fn seal_in_place(
        &self,
        seq: u64,
        typ: u8,
        n: usize,
        out: &mut [u8],
    ) -> Result<usize, RecordError> {
        assert!(n <= MAX_PLAINTEXT);
        let body = n + 1 + TAG_LEN;
        let out = &mut out[..HEADER_LEN + body];
        let hdr = header(body);
        out[..HEADER_LEN].copy_from_slice(&hdr);
        out[HEADER_LEN + n] = typ;
        let (inout, tag_out) = out[HEADER_LEN..].split_at_mut(n + 1);
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(seq), Aad::from(hdr), inout)
            .map_err(|_| RecordError::Seal)?;
        tag_out.copy_from_slice(tag.as_ref());
        Ok(HEADER_LEN + body)
    }
}

/// Seals records for one direction, numbering them itself.
#[derive(Debug)]
pub struct Sealer {
    key: std::sync::Arc<SealKey>,
    seq: u64,
}

impl Sealer {
    /// From the traffic secrets rustls hands over, at sequence number `seq`.
    pub fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Sealer {
        Sealer {
            key: std::sync::Arc::new(SealKey::new(secrets)),
            seq,
        }
    }

    /// Records sealed so far with this key (the next sequence number).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The key, shared with whoever seals the records [`Sealer::reserve`] numbers.
    pub fn key(&self) -> &std::sync::Arc<SealKey> {
        &self.key
    }

    /// Takes the next `n` sequence numbers for records sealed elsewhere with
    /// [`Sealer::key`]; the first of them.
    pub fn reserve(&mut self, n: u64) -> Result<u64, RecordError> {
        let first = self.seq;
        self.seq = first.checked_add(n).ok_or(RecordError::SequenceExhausted)?;
        Ok(first)
    }

    /// Seals `plain` as the next record; see [`SealKey::seal`].
    pub fn seal(&mut self, typ: u8, plain: &[u8], out: &mut [u8]) -> Result<usize, RecordError> {
        let seq = self.reserve(1)?;
        self.key.seal(seq, typ, plain, out)
    }

    /// Seals what lies in `out` in place as the next record; see
    /// [`SealKey::seal_in_place`].
    pub fn seal_in_place(
        &mut self,
        typ: u8,
        n: usize,
        out: &mut [u8],
    ) -> Result<usize, RecordError> {
        let seq = self.reserve(1)?;
        self.key.seal_in_place(seq, typ, n, out)
    }
}

/// Opens records for one direction.
#[derive(Debug)]
pub struct Opener(Keys);

/// The length of the record at the front of `buf` if its header is there (the whole
/// record may not be yet), or why the header is not one this side accepts.
pub fn record_len(buf: &[u8]) -> Option<Result<usize, RecordError>> {
    let h = buf.get(..HEADER_LEN)?;
    if h[0] != APPLICATION_DATA {
        return Some(Err(RecordError::OuterType(h[0])));
    }
    let body = u16::from_be_bytes([h[3], h[4]]) as usize;
    Some(if HEADER_LEN + body > MAX_RECORD {
        Err(RecordError::TooLong(body))
    } else if body < 1 + TAG_LEN {
        Err(RecordError::TooShort)
    } else {
        Ok(HEADER_LEN + body)
    })
}

impl Opener {
    pub fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Opener {
        Opener(Keys::new(secrets, seq))
    }

    /// An opener of suite `alg` from its raw parts, at `seq` (tests of other modules).
    #[cfg(test)]
    pub(crate) fn for_tests(
        alg: &'static aead::Algorithm,
        key: &[u8],
        iv: &[u8],
        seq: u64,
    ) -> Opener {
        Opener(Keys::from_parts(alg, key, iv, seq))
    }

    /// Opens the whole record `rec` (as long as [`record_len`] says) in place: its
    /// content type and where in `rec` its plaintext now lies.
    pub fn open(&mut self, rec: &mut [u8]) -> Result<(u8, Range<usize>), RecordError> {
        let len = match record_len(rec) {
            Some(r) => r?,
            None => return Err(RecordError::TooShort),
        };
        let rec = &mut rec[..len];
        let hdr: [u8; HEADER_LEN] = rec[..HEADER_LEN].try_into().expect("checked length");
        let nonce = self.0.next_nonce()?;
        let plain = self
            .0
            .key
            .open_in_place(nonce, Aad::from(hdr), &mut rec[HEADER_LEN..])
            .map_err(|_| RecordError::Decrypt)?;
        // The content type is the last byte that is not padding (zeros).
        let end = plain
            .iter()
            .rposition(|&b| b != 0)
            .ok_or(RecordError::NoContentType)?;
        Ok((plain[end], HEADER_LEN..HEADER_LEN + end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of each suite: AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305.
    fn keys(which: u8, seq: u64) -> Keys {
        let (alg, len): (&'static aead::Algorithm, usize) = match which {
            0 => (&aead::AES_128_GCM, 16),
            1 => (&aead::AES_256_GCM, 32),
            _ => (&aead::CHACHA20_POLY1305, 32),
        };
        Keys::from_parts(alg, &[which + 1; 32][..len], &[7; 12], seq)
    }

    fn sealer(which: u8, seq: u64) -> Sealer {
        let k = keys(which, 0);
        Sealer {
            key: std::sync::Arc::new(SealKey {
                key: k.key,
                iv: k.iv,
            }),
            seq,
        }
    }

    fn opener(which: u8, seq: u64) -> Opener {
        Opener(keys(which, seq))
    }

    #[test]
    fn sealed_records_open_in_order_with_their_type_and_bytes() {
        for suite in 0..3 {
            let mut s = sealer(suite, 5);
            let mut o = opener(suite, 5);
            let plain: Vec<u8> = (0..MAX_PLAINTEXT).map(|i| (i % 253) as u8).collect();
            let mut out = vec![0u8; 3 * (MAX_PLAINTEXT + OVERHEAD)];
            let a = s.seal(APPLICATION_DATA, &plain, &mut out).unwrap();
            assert_eq!(a, plain.len() + OVERHEAD);
            out[a + HEADER_LEN..a + HEADER_LEN + 3].copy_from_slice(b"abc");
            let b = s.seal_in_place(HANDSHAKE, 3, &mut out[a..]).unwrap();
            let c = s.seal(ALERT, &[1, 0], &mut out[a + b..]).unwrap();
            assert_eq!(s.seq(), 8);
            assert_eq!(record_len(&out), Some(Ok(a)));
            let (t, r) = o.open(&mut out[..a]).unwrap();
            assert_eq!((t, &out[r]), (APPLICATION_DATA, &plain[..]));
            let (t, r) = o.open(&mut out[a..a + b]).unwrap();
            assert_eq!((t, &out[a..][r]), (HANDSHAKE, &b"abc"[..]));
            let (t, r) = o.open(&mut out[a + b..a + b + c]).unwrap();
            assert_eq!((t, &out[a + b..][r]), (ALERT, &[1u8, 0][..]));
        }
    }

    #[test]
    fn a_record_out_of_sequence_or_altered_does_not_open() {
        let mut s = sealer(0, 0);
        let mut out = vec![0u8; 64];
        let n = s.seal(APPLICATION_DATA, b"hello", &mut out).unwrap();
        // Opened as if it were the second record: the nonce differs.
        let mut o = opener(0, 1);
        assert_eq!(o.open(&mut out.clone()[..n]), Err(RecordError::Decrypt));
        // One bit of the header (the additional data) flipped.
        let mut o = opener(0, 0);
        let mut bad = out.clone();
        bad[2] ^= 1;
        assert_eq!(o.open(&mut bad[..n]), Err(RecordError::Decrypt));
        // One bit of the body.
        let mut o = opener(0, 0);
        let mut bad = out.clone();
        bad[HEADER_LEN + 1] ^= 0x80;
        assert_eq!(o.open(&mut bad[..n]), Err(RecordError::Decrypt));
        let mut o = opener(0, 0);
        assert!(o.open(&mut out[..n]).is_ok());
    }

    #[test]
    fn headers_are_checked_before_the_body_arrives() {
        assert_eq!(record_len(&[23, 3, 3, 0]), None);
        assert_eq!(
            record_len(&[22, 3, 3, 0, 40]),
            Some(Err(RecordError::OuterType(22)))
        );
        assert_eq!(
            record_len(&[23, 3, 3, 0xff, 0xff]),
            Some(Err(RecordError::TooLong(0xffff)))
        );
        assert_eq!(
            record_len(&[23, 3, 3, 0, 16]),
            Some(Err(RecordError::TooShort))
        );
        assert_eq!(record_len(&[23, 3, 3, 0, 17]), Some(Ok(22)));
    }

    #[test]
    fn padding_is_stripped_and_all_padding_refused() {
        // Padding is part of the sealed plaintext: seal "x", type, zeros by hand.
        let mut s = sealer(2, 0);
        let mut out = vec![0u8; 64];
        out[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&[b'x', APPLICATION_DATA, 0, 0]);
        let n = s.seal_in_place(0, 4, &mut out).unwrap();
        let mut o = opener(2, 0);
        let (t, r) = o.open(&mut out[..n]).unwrap();
        assert_eq!((t, &out[r]), (APPLICATION_DATA, &b"x"[..]));
        let mut out = vec![0u8; 64];
        let n = s.seal_in_place(0, 2, &mut out).unwrap();
        assert_eq!(o.open(&mut out[..n]), Err(RecordError::NoContentType));
    }
}
