//! CRC32C (Castagnoli) digests as iSCSI uses them (RFC 7143 section 13.1).
//!
//! The CRC register value is put on the wire least-significant byte first: RFC 3720
//! Appendix B.4 lists the digest of 32 zero bytes as the wire bytes `aa 36 91 8a`, i.e. the
//! value 0x8a9136aa, and Linux and libiscsi agree. Padding bytes are covered by the digest.

/// Length of a header or data digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// CRC32C of `data`, using the CPU's CRC instructions where available.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC32C over `data`, so a digest can span non-contiguous pieces.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// The four wire bytes of a digest value.
pub fn to_wire(crc: u32) -> [u8; DIGEST_LEN] {
    crc.to_le_bytes()
}

/// The digest value carried by four wire bytes.
pub fn from_wire(wire: [u8; DIGEST_LEN]) -> u32 {
    u32::from_le_bytes(wire)
}

/// Appends the digest of `covered` to `out` in wire byte order.
pub fn append_digest(out: &mut Vec<u8>, covered: &[u8]) {
    out.extend_from_slice(&to_wire(crc32c(covered)));
}

/// Whether `wire` (exactly four bytes) is the digest of `covered`.
pub fn verify_digest(covered: &[u8], wire: &[u8]) -> bool {
    verify_digest_value(crc32c(covered), wire)
}

/// Whether `wire` (exactly four bytes) carries the digest value `crc`, computed with
/// [`crc32c_append`] over a segment in pieces.
pub fn verify_digest_value(crc: u32, wire: &[u8]) -> bool {
    <[u8; DIGEST_LEN]>::try_from(wire).is_ok_and(|w| from_wire(w) == crc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_order_is_little_endian() {
        let mut out = Vec::new();
        append_digest(&mut out, &[0u8; 32]);
        assert_eq!(out, [0xaa, 0x36, 0x91, 0x8a]);
        assert!(verify_digest(&[0u8; 32], &out));
        assert!(!verify_digest(&[0u8; 31], &out));
        assert!(!verify_digest(&[0u8; 32], &out[..3]));
    }

    #[test]
    fn append_matches_one_shot() {
        let data: Vec<u8> = (0..=255).collect();
        let split = crc32c_append(crc32c(&data[..100]), &data[100..]);
        assert_eq!(split, crc32c(&data));
    }
}
