//! CHAP (RFC 1994) as iSCSI carries it in text keys (RFC 7143 12.1.3, 9.2.1), with the
//! hash functions IANA's "PPP Authentication Algorithms" registry numbers for CHAP_A:
//! MD5 (5), SHA-256 (7) and SHA3-256 (8), as Linux LIO and open-iscsi offer them. SHA-1
//! (6) is left out: MD5 is there for old peers, and no peer offers SHA-1 without SHA-256.

use std::fmt;
use std::str::FromStr;

use md5::Md5;
use sha2::{Digest, Sha256};
use sha3::Sha3_256;
use thiserror::Error;

use crate::text::{decode_binary, parse_number};

/// RFC 7143 12.1.3: a binary CHAP value is at most 1024 bytes long.
pub const MAX_CHAP_BINARY_LEN: usize = 1024;

/// A hash CHAP runs on, as CHAP_A numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChapAlgorithm {
    Md5,
    Sha256,
    Sha3_256,
}

impl ChapAlgorithm {
    /// Every algorithm we implement, strongest first.
    pub const ALL: [ChapAlgorithm; 3] = [
        ChapAlgorithm::Sha3_256,
        ChapAlgorithm::Sha256,
        ChapAlgorithm::Md5,
    ];

    /// The CHAP_A value (IANA PPP Authentication Algorithms).
    pub fn code(self) -> u8 {
        match self {
            ChapAlgorithm::Md5 => 5,
            ChapAlgorithm::Sha256 => 7,
            ChapAlgorithm::Sha3_256 => 8,
        }
    }

    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|a| u64::from(a.code()) == code)
    }

    /// The name configurations and messages use: "MD5", "SHA-256", "SHA3-256".
    pub fn name(self) -> &'static str {
        match self {
            ChapAlgorithm::Md5 => "MD5",
            ChapAlgorithm::Sha256 => "SHA-256",
            ChapAlgorithm::Sha3_256 => "SHA3-256",
        }
    }

    /// Bytes in a response. Our challenges are as long (as LIO and open-iscsi make
    /// theirs): a shorter one would be the weaker input.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha256 | ChapAlgorithm::Sha3_256 => 32,
        }
    }

    /// H(id || secret || challenge), RFC 1994 section 4.1, with this algorithm's H.
    pub fn response(self, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        fn hash<D: Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
            let mut h = D::new();
            h.update([id]);
            h.update(secret);
            h.update(challenge);
            h.finalize().to_vec()
        }
        match self {
            ChapAlgorithm::Md5 => hash::<Md5>(id, secret, challenge),
            ChapAlgorithm::Sha256 => hash::<Sha256>(id, secret, challenge),
            ChapAlgorithm::Sha3_256 => hash::<Sha3_256>(id, secret, challenge),
        }
    }
}

impl fmt::Display for ChapAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChapAlgorithm {
    type Err = ChapError;

    /// A name in any case; "SHA256" as open-iscsi's `chap_algs` spells it is taken too.
    fn from_str(s: &str) -> Result<Self, ChapError> {
        match s.trim().to_ascii_uppercase().as_str() {
            "MD5" => Ok(ChapAlgorithm::Md5),
            "SHA-256" | "SHA256" => Ok(ChapAlgorithm::Sha256),
            "SHA3-256" => Ok(ChapAlgorithm::Sha3_256),
            _ => Err(ChapError::UnknownName(s.to_owned())),
        }
    }
}

/// A list of algorithms as configured (names, in order of preference): at least one,
/// each known, none twice.
pub fn parse_algorithms<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<ChapAlgorithm>, ChapError> {
    let mut out = Vec::new();
    for n in names {
        let a: ChapAlgorithm = n.parse()?;
        if out.contains(&a) {
            return Err(ChapError::Duplicate(a));
        }
        out.push(a);
    }
    if out.is_empty() {
        return Err(ChapError::EmptyList);
    }
    Ok(out)
}

/// Names of `algs` joined by ", ", for messages.
pub fn names(algs: &[ChapAlgorithm]) -> String {
    algs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
}

/// The initiator's CHAP_A value: `algs` in its order of preference, as numbers.
pub fn offer(algs: &[ChapAlgorithm]) -> String {
    algs.iter()
        .map(|a| a.code().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChapError {
    #[error("initiator offered CHAP_A={offered}; accepted here: {}", names(.accepted))]
    NoAlgorithm {
        offered: String,
        accepted: Vec<ChapAlgorithm>,
    },
    #[error("target chose CHAP_A={0}, which we did not offer")]
    NotOffered(String),
    #[error("unknown CHAP algorithm {0:?}; known: SHA3-256, SHA-256, MD5")]
    UnknownName(String),
    #[error("CHAP algorithm {0} listed twice")]
    Duplicate(ChapAlgorithm),
    #[error("no CHAP algorithm listed")]
    EmptyList,
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

/// The target's choice from an initiator's CHAP_A list such as "8,7,5": the first value
/// in the initiator's order that `accepted` holds. RFC 7143 6.2.1 has a list answered by
/// "the first value that it supports (and is allowed to use for the specific
/// originator) selected from the originator list", and 12.1.3 makes the answer "one of
/// A1,A2... that were proposed by the initiator"; LIO and open-iscsi choose so too.
/// Values we do not know (6, 128, "Reject", garbage) are passed over.
pub fn select_algorithm(
    offer: &str,
    accepted: &[ChapAlgorithm],
) -> Result<ChapAlgorithm, ChapError> {
    offer
        .split(',')
        .filter_map(|a| parse_number(a).ok())
        .filter_map(ChapAlgorithm::from_code)
        .find(|a| accepted.contains(a))
        .ok_or_else(|| ChapError::NoAlgorithm {
            offered: offer.to_owned(),
            accepted: accepted.to_vec(),
        })
}

/// The initiator's check of the target's CHAP_A answer: a single value, one of those we
/// offered.
pub fn parse_choice(answer: &str, offered: &[ChapAlgorithm]) -> Result<ChapAlgorithm, ChapError> {
    parse_number(answer)
        .ok()
        .and_then(ChapAlgorithm::from_code)
        .filter(|a| offered.contains(a))
        .ok_or_else(|| ChapError::NotOffered(answer.to_owned()))
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

/// Checks a peer's CHAP_R against what `secret` gives for our challenge under `alg`: a
/// response of another length (another algorithm's) does not match. The comparison does
/// not stop at the first differing byte.
pub fn verify_response(
    alg: ChapAlgorithm,
    id: u8,
    secret: &[u8],
    challenge: &[u8],
    response_value: &str,
) -> Result<(), ChapError> {
    let got = decode_binary(response_value).map_err(|_| ChapError::BadResponse)?;
    let want = alg.response(id, secret, challenge);
    if got.len() != want.len() {
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
    use ChapAlgorithm::*;

    /// `alg`'s response to id, secret and challenge, in hex.
    fn hex(alg: ChapAlgorithm, id: u8, secret: &[u8], challenge: &[u8]) -> String {
        encode_hex(&alg.response(id, secret, challenge))
    }

    #[test]
    fn md5_of_id_secret_challenge() {
        // MD5("") and MD5("abc") are the RFC 1321 test vectors; CHAP just concatenates;
        // then MD5("message digest"), RFC 1321.
        for (id, secret, challenge, md5) in [
            (
                b'a',
                &b"bc"[..],
                &b""[..],
                "0x900150983cd24fb0d6963f7d28e17f72",
            ),
            (b'a', b"", b"bc", "0x900150983cd24fb0d6963f7d28e17f72"),
            (
                b'm',
                b"essage",
                b" digest",
                "0xf96b697d7cb7938d525a2f31aaf161d0",
            ),
        ] {
            assert_eq!(hex(Md5, id, secret, challenge), md5);
        }
    }

    #[test]
    fn sha_responses_known_answers() {
        // SHA-256("abc") (FIPS 180-2) and SHA3-256("abc") (FIPS 202), split as CHAP does.
        assert_eq!(
            hex(Sha256, b'a', b"b", b"c"),
            "0xba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(Sha3_256, b'a', b"b", b"c"),
            "0x3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532"
        );
        // A CHAP exchange's inputs: id 0x2a, a 12-byte secret, the 32-byte challenge
        // 00 01 .. 1f. Computed independently with python3's hashlib:
        //   hashlib.new(n, bytes([0x2a]) + b"twelve-bytes" + bytes(range(32))).hexdigest()
        let challenge: Vec<u8> = (0u8..32).collect();
        let r = |a: ChapAlgorithm| hex(a, 0x2a, b"twelve-bytes", &challenge);
        assert_eq!(r(Md5), "0x6bdc0707e265654eef4ffa12bf76632a");
        assert_eq!(
            r(Sha256),
            "0xe60bbb864b41d6d815b9e8a4a965ade2fc1cfcd21af23d10e5f3d6943f2428a0"
        );
        assert_eq!(
            r(Sha3_256),
            "0x6169bb49734570c14d69df0f84942cbeef2591d0c4dcbd5bb6fe569820317c10"
        );
        for a in ChapAlgorithm::ALL {
            assert_eq!(a.response(1, b"s", b"c").len(), a.digest_len());
        }
    }

    #[test]
    fn algorithm_selection_follows_the_initiators_order() {
        let all = ChapAlgorithm::ALL;
        assert_eq!(select_algorithm("7,5,6", &all), Ok(Sha256));
        assert_eq!(select_algorithm("5,8", &all), Ok(Md5));
        assert_eq!(select_algorithm("8,7,5", &all), Ok(Sha3_256));
        assert_eq!(select_algorithm("0x5", &all), Ok(Md5));
        // Unknown and malformed values are passed over.
        assert_eq!(select_algorithm("6,128,x,,7", &all), Ok(Sha256));
        // MD5 refused: an MD5-only initiator gets nothing, a mixed one its next choice.
        let sha_only = [Sha3_256, Sha256];
        assert_eq!(select_algorithm("5,7", &sha_only), Ok(Sha256));
        let e = select_algorithm("5", &sha_only).unwrap_err();
        assert_eq!(
            e.to_string(),
            "initiator offered CHAP_A=5; accepted here: SHA3-256, SHA-256"
        );
        assert!(matches!(
            select_algorithm("", &all),
            Err(ChapError::NoAlgorithm { .. })
        ));
        assert!(select_algorithm("7,6", &[Md5]).is_err());
    }

    #[test]
    fn initiator_checks_the_choice() {
        assert_eq!(parse_choice("8", &ChapAlgorithm::ALL), Ok(Sha3_256));
        assert_eq!(
            parse_choice("5", &[Sha256]),
            Err(ChapError::NotOffered("5".into()))
        );
        assert!(parse_choice("7,5", &ChapAlgorithm::ALL).is_err());
        assert!(parse_choice("6", &ChapAlgorithm::ALL).is_err());
        assert_eq!(offer(&[Sha3_256, Sha256, Md5]), "8,7,5");
    }

    #[test]
    fn configured_lists() {
        assert_eq!(
            parse_algorithms(["SHA3-256", "sha256", "md5"]),
            Ok(vec![Sha3_256, Sha256, Md5])
        );
        assert_eq!(parse_algorithms(["SHA-256"]), Ok(vec![Sha256]));
        assert_eq!(
            parse_algorithms(["SHA-256", "SHA256"]),
            Err(ChapError::Duplicate(Sha256))
        );
        assert_eq!(
            parse_algorithms(["SHA1"]),
            Err(ChapError::UnknownName("SHA1".into()))
        );
        assert_eq!(parse_algorithms([]), Err(ChapError::EmptyList));
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
        for a in ChapAlgorithm::ALL {
            let r = a.response(9, b"secretsecret", &ours);
            assert_eq!(
                verify_response(a, 9, b"secretsecret", &ours, &encode_hex(&r)),
                Ok(())
            );
            assert_eq!(
                verify_response(a, 9, b"secretsecreT", &ours, &encode_hex(&r)),
                Err(ChapError::Mismatch)
            );
            assert_eq!(
                verify_response(a, 8, b"secretsecret", &ours, &encode_hex(&r)),
                Err(ChapError::Mismatch)
            );
            assert_eq!(
                verify_response(a, 9, b"secretsecret", &ours, "0x00"),
                Err(ChapError::Mismatch)
            );
        }
        // Another algorithm's response never passes, even a prefix of the right length.
        let sha = Sha256.response(9, b"secretsecret", &ours);
        assert_eq!(
            verify_response(Md5, 9, b"secretsecret", &ours, &encode_hex(&sha[..16])),
            Err(ChapError::Mismatch)
        );
        let md5 = Md5.response(9, b"secretsecret", &ours);
        assert_eq!(
            verify_response(Sha256, 9, b"secretsecret", &ours, &encode_hex(&md5)),
            Err(ChapError::Mismatch)
        );
        assert_eq!(parse_identifier("255"), Ok(255));
        assert_eq!(parse_identifier("256"), Err(ChapError::BadIdentifier));
    }
}
