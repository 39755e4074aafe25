//! CHAP (RFC 1994) as iSCSI carries it in text keys (RFC 7143 12.1.3, 9.2.1).

use md5::{Digest, Md5};
use thiserror::Error;

use crate::text::{decode_binary, parse_number};

/// CHAP_A value of CHAP with MD5, the only algorithm we implement.
pub const CHAP_MD5: u8 = 5;
/// Length of the challenges we send.
pub const CHALLENGE_LEN: usize = 16;
/// RFC 7143 12.1.3: a binary CHAP value is at most 1024 bytes long.
pub const MAX_CHAP_BINARY_LEN: usize = 1024;
/// Length of an MD5 CHAP response.
pub const RESPONSE_LEN: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChapError {
    #[error("no supported CHAP algorithm offered (need 5 = MD5)")]
    NoAlgorithm,
    #[error("malformed CHAP_I")]
    BadIdentifier,
    #[error("malformed or oversized CHAP_C")]
    BadChallenge,
    #[error("peer reflected our own challenge")]
    Reflected,
    #[error("malformed CHAP_R")]
    BadResponse,
    #[error("CHAP response does not match")]
    Mismatch,
    #[error("unexpected CHAP user name")]
    UnknownUser,
}

/// MD5(id || secret || challenge), RFC 1994 section 4.1.
pub fn chap_response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// Picks MD5 from a CHAP_A list such as "7,5,6".
pub fn select_algorithm(offer: &str) -> Result<u8, ChapError> {
    offer
        .split(',')
        .filter_map(|a| parse_number(a).ok())
        .find(|&a| a == CHAP_MD5 as u64)
        .map(|_| CHAP_MD5)
        .ok_or(ChapError::NoAlgorithm)
}

pub fn parse_identifier(v: &str) -> Result<u8, ChapError> {
    parse_number(v)
        .ok()
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(ChapError::BadIdentifier)
}

/// Decodes a peer's CHAP_C. RFC 7143 9.2.1: a challenge equal to the one we sent is a
/// reflection attack and ends the login.
pub fn parse_challenge(v: &str, ours: Option<&[u8]>) -> Result<Vec<u8>, ChapError> {
    let c = decode_binary(v).map_err(|_| ChapError::BadChallenge)?;
    if c.is_empty() || c.len() > MAX_CHAP_BINARY_LEN {
        return Err(ChapError::BadChallenge);
    }
    if ours == Some(c.as_slice()) {
        return Err(ChapError::Reflected);
    }
    Ok(c)
}

/// Checks a peer's CHAP_R against what `secret` gives for our challenge. The comparison
/// does not stop at the first differing byte.
pub fn verify_response(
    id: u8,
    secret: &[u8],
    challenge: &[u8],
    response_value: &str,
) -> Result<(), ChapError> {
    let got = decode_binary(response_value).map_err(|_| ChapError::BadResponse)?;
    let want = chap_response(id, secret, challenge);
    if got.len() != RESPONSE_LEN {
        return Err(ChapError::Mismatch);
    }
    let diff = got
        .iter()
        .zip(want.iter())
        .fold(0u8, |d, (a, b)| d | (a ^ b));
    if diff == 0 {
        Ok(())
    } else {
        Err(ChapError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::encode_hex;

    #[test]
    fn md5_of_id_secret_challenge() {
        // MD5("") and MD5("abc") are the RFC 1321 test vectors; CHAP just concatenates.
        assert_eq!(
            encode_hex(&chap_response(b'a', b"bc", b"")),
            "0x900150983cd24fb0d6963f7d28e17f72"
        );
        assert_eq!(
            encode_hex(&chap_response(b'a', b"", b"bc")),
            "0x900150983cd24fb0d6963f7d28e17f72"
        );
        // MD5("message digest"), RFC 1321.
        assert_eq!(
            encode_hex(&chap_response(b'm', b"essage", b" digest")),
            "0xf96b697d7cb7938d525a2f31aaf161d0"
        );
    }

    #[test]
    fn algorithm_selection() {
        assert_eq!(select_algorithm("7,5,6"), Ok(5));
        assert_eq!(select_algorithm("5"), Ok(5));
        assert_eq!(select_algorithm("0x5"), Ok(5));
        assert_eq!(select_algorithm("7,6"), Err(ChapError::NoAlgorithm));
        assert_eq!(select_algorithm(""), Err(ChapError::NoAlgorithm));
    }

    #[test]
    fn challenges_and_responses() {
        let ours = [7u8; 16];
        assert_eq!(
            parse_challenge(&encode_hex(&ours), Some(&ours)),
            Err(ChapError::Reflected)
        );
        assert_eq!(parse_challenge("0x0102", Some(&ours)), Ok(vec![1, 2]));
        assert_eq!(parse_challenge("zz", None), Err(ChapError::BadChallenge));
        let big = encode_hex(&[1u8; MAX_CHAP_BINARY_LEN + 1]);
        assert_eq!(parse_challenge(&big, None), Err(ChapError::BadChallenge));
        let r = chap_response(9, b"secretsecret", &ours);
        assert_eq!(
            verify_response(9, b"secretsecret", &ours, &encode_hex(&r)),
            Ok(())
        );
        assert_eq!(
            verify_response(9, b"secretsecreT", &ours, &encode_hex(&r)),
            Err(ChapError::Mismatch)
        );
        assert_eq!(
            verify_response(8, b"secretsecret", &ours, &encode_hex(&r)),
            Err(ChapError::Mismatch)
        );
        assert_eq!(
            verify_response(9, b"secretsecret", &ours, "0x00"),
            Err(ChapError::Mismatch)
        );
        assert_eq!(parse_identifier("255"), Ok(255));
        assert_eq!(parse_identifier("256"), Err(ChapError::BadIdentifier));
    }
}
