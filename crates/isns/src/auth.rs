//! iSNS authentication (RFC 4171 5.5 and 6.2): the authentication block after a PDU's
//! payload, and DSA signatures over each PDU as open-isns makes them, so that a
//! Reservoir client and `isnsd`, or `isnsadm` and `rsv isns`, accept each other's.
//!
//! RFC 4171 leaves two things open that open-isns settled and peers must copy: the block
//! is SLP's with every field widened (BSD and length 32 bits, timestamp 64 bits, SPI
//! length 32 bits), and what is signed is the PDU as sent (header with the AUTH flag set,
//! then the payload) followed by the block's timestamp as 8 big-endian bytes. The
//! signature is DSA over SHA-1 (BSD 2), DER-encoded as OpenSSL's `EVP_SignFinal` writes
//! it. The SPI names the sender's key: the name a server finds the public key under.
//!
//! No clock and no files here: the caller gives the time and the PEM text.

use std::collections::HashMap;

use dsa::signature::{DigestSigner, DigestVerifier, SignatureEncoding};
use dsa::{SigningKey, VerifyingKey};
use pkcs8::{DecodePrivateKey, DecodePublicKey};
use sha1::{Digest, Sha1};

use crate::message::{Message, Received};
use crate::pdu::{Flags, Header, HEADER_LEN, MAX_PAYLOAD};

/// Block Structure Descriptor of DSA with SHA-1, the one open-isns implements.
pub const BSD_DSA_SHA1: u32 = 2;
/// BSD, length, timestamp and SPI length: the block's fixed part.
pub const FIXED_LEN: usize = 20;
/// The longest SPI accepted (open-isns takes no more either).
pub const MAX_SPI: usize = 512;
/// The longest block accepted: the SPI and a DER DSA signature (under 80 bytes even for
/// 3072-bit keys) with plenty to spare.
pub const MAX_BLOCK: usize = FIXED_LEN + MAX_SPI + 512;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("authentication block of {0} bytes (at least 20, at most {MAX_BLOCK})")]
    BlockLength(u32),
    #[error("authentication block: SPI of {0} bytes does not fit")]
    SpiLength(u32),
    #[error("authentication block: SPI is not UTF-8")]
    SpiNotText,
    #[error("authentication block type {0} (only 2, DSA with SHA-1, is known)")]
    UnknownBsd(u32),
    #[error("PDU {pdu} of the message carries no authentication block")]
    Unsigned { pdu: usize },
    #[error("PDUs of one message signed by different SPIs ({0:?} and {1:?})")]
    MixedSpi(String, String),
    #[error("no key is enrolled for SPI {0:?}")]
    UnknownSpi(String),
    #[error("bad signature from SPI {0:?}")]
    BadSignature(String),
    #[error("timestamp {stamp} from SPI {spi:?} is outside the replay window around {now}")]
    Stale { spi: String, stamp: u64, now: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not a PKCS #8 DSA private key in PEM (\"BEGIN PRIVATE KEY\"): {0}")]
    Private(pkcs8::Error),
    #[error("not a DSA public key in PEM (\"BEGIN PUBLIC KEY\"): {0}")]
    Public(pkcs8::spki::Error),
    #[error("SPI {0:?}: empty, longer than {MAX_SPI} bytes, or holds '/' or a leading '.'")]
    Spi(String),
}

/// RFC 4171 5.5's authentication block, 32/64-bit fields as open-isns lays them out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthBlock {
    pub bsd: u32,
    /// Seconds since the Unix epoch when the sender signed.
    pub timestamp: u64,
    pub spi: String,
    pub signature: Vec<u8>,
}

impl AuthBlock {
    pub fn encoded_len(&self) -> usize {
        FIXED_LEN + self.spi.len() + self.signature.len()
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bsd.to_be_bytes());
        out.extend_from_slice(&(self.encoded_len() as u32).to_be_bytes());
        out.extend_from_slice(&self.timestamp.to_be_bytes());
        out.extend_from_slice(&(self.spi.len() as u32).to_be_bytes());
        out.extend_from_slice(self.spi.as_bytes());
        out.extend_from_slice(&self.signature);
    }

    /// The block's length from its first 8 bytes, checked against the limits: how much of
    /// the stream after the payload belongs to it.
    pub fn peek_len(b: &[u8; 8]) -> Result<usize, AuthError> {
        let len = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        if (len as usize) < FIXED_LEN || len as usize > MAX_BLOCK {
            return Err(AuthError::BlockLength(len));
        }
        Ok(len as usize)
    }

    /// A whole block (exactly its announced length).
    pub fn decode(b: &[u8]) -> Result<AuthBlock, AuthError> {
        let fixed = b
            .first_chunk::<FIXED_LEN>()
            .ok_or(AuthError::BlockLength(b.len() as u32))?;
        let w = |i: usize| u32::from_be_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]);
        let len = w(4);
        if len as usize != b.len() {
            return Err(AuthError::BlockLength(len));
        }
        let spi_len = w(16);
        let rest = &b[FIXED_LEN..];
        if spi_len as usize > rest.len() || spi_len as usize > MAX_SPI {
            return Err(AuthError::SpiLength(spi_len));
        }
        let (spi, signature) = rest.split_at(spi_len as usize);
        Ok(AuthBlock {
            bsd: w(0),
            timestamp: u64::from_be_bytes(fixed[8..16].try_into().expect("8 bytes")),
            spi: std::str::from_utf8(spi)
                .map_err(|_| AuthError::SpiNotText)?
                .to_owned(),
            signature: signature.to_vec(),
        })
    }
}

/// One received PDU of a signed message: the bytes the signature covers and its block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seal {
    /// Header (as received, AUTH flag set) and payload.
    pub signed: Vec<u8>,
    pub block: AuthBlock,
}

fn digest(pdu: &[u8], timestamp: u64) -> Sha1 {
    let mut d = Sha1::new();
    d.update(pdu);
    d.update(timestamp.to_be_bytes());
    d
}

/// Checks an SPI as a key store's file name: open-isns's simple key store refuses the
/// same names, so a name that works here works there.
pub fn check_spi(spi: &str) -> Result<(), KeyError> {
    if spi.is_empty() || spi.len() > MAX_SPI || spi.contains('/') || spi.starts_with('.') {
        return Err(KeyError::Spi(spi.to_owned()));
    }
    Ok(())
}

/// Who we sign as: an SPI and its DSA private key.
#[derive(Clone)]
pub struct Identity {
    spi: String,
    key: SigningKey,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("spi", &self.spi)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// `pem`: a PKCS #8 DSA private key, as `isnsadm --enroll`, `isnsd --init` (OpenSSL
    /// 3) and `openssl genpkey` write it.
    pub fn from_pem(spi: &str, pem: &str) -> Result<Identity, KeyError> {
        check_spi(spi)?;
        let key = SigningKey::from_pkcs8_pem(pem).map_err(KeyError::Private)?;
        Ok(Identity {
            spi: spi.to_owned(),
            key,
        })
    }

    pub fn spi(&self) -> &str {
        &self.spi
    }

    /// The matching public key (what a server enrolls for this SPI).
    pub fn public(&self) -> &VerifyingKey {
        self.key.verifying_key()
    }

    /// `pdus` (PDUs back to back, as [`crate::Message::encode`] makes them) with the AUTH
    /// flag set in each header and each followed by its authentication block, signed at
    /// `now`. RFC 6979's deterministic nonces: no random source needed.
    pub fn seal(&self, pdus: &[u8], now: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(pdus.len() + 128);
        let mut rest = pdus;
        while let Some(head) = rest.first_chunk::<HEADER_LEN>() {
            let Ok(mut h) = Header::decode(head) else {
                break;
            };
            let end = (HEADER_LEN + usize::from(h.length)).min(rest.len());
            h.flags = Flags(h.flags.0 | Flags::AUTH);
            let start = out.len();
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(&rest[HEADER_LEN..end]);
            let sig: dsa::Signature = self.key.sign_digest(digest(&out[start..], now));
            AuthBlock {
                bsd: BSD_DSA_SHA1,
                timestamp: now,
                spi: self.spi.clone(),
                signature: sig.to_vec(),
            }
            .encode(&mut out);
            rest = &rest[end..];
        }
        out
    }
}

/// A DSA public key from PEM (`BEGIN PUBLIC KEY`, as `openssl pkey -pubout` and open-isns
/// write it).
pub fn public_key_from_pem(pem: &str) -> Result<VerifyingKey, KeyError> {
    VerifyingKey::from_public_key_pem(pem).map_err(KeyError::Public)
}

/// Whether `seal`'s signature is `key`'s.
fn signed_by(seal: &Seal, key: &VerifyingKey) -> bool {
    let Ok(sig) = dsa::Signature::try_from(seal.signature()) else {
        return false;
    };
    key.verify_digest(digest(&seal.signed, seal.block.timestamp), &sig)
        .is_ok()
}

impl Seal {
    fn signature(&self) -> &[u8] {
        &self.block.signature
    }
}

/// The checks one side makes on what it receives: signatures by the keys it knows,
/// timestamps near its clock and never going back (RFC 4171 6.2's replay protection,
/// with open-isns's allowances: `window` seconds of clock difference, `jitter` seconds
/// of reordering).
#[derive(Debug)]
pub struct Verifier {
    keys: HashMap<String, VerifyingKey>,
    /// A client knows one key, its server's, whatever SPI the server signs as.
    any_spi: Option<VerifyingKey>,
    window: u64,
    jitter: u64,
    last: HashMap<String, u64>,
}

impl Verifier {
    /// A server's: a key per enrolled SPI.
    pub fn enrolled(keys: HashMap<String, VerifyingKey>, window: u64) -> Verifier {
        Verifier {
            keys,
            any_spi: None,
            window,
            jitter: 1,
            last: HashMap::new(),
        }
    }

    /// A client's: the server's key.
    pub fn server(key: VerifyingKey, window: u64) -> Verifier {
        Verifier {
            keys: HashMap::new(),
            any_spi: Some(key),
            window,
            jitter: 1,
            last: HashMap::new(),
        }
    }

    /// Enrolls (or replaces) the key of `spi`.
    pub fn enroll(&mut self, spi: &str, key: VerifyingKey) {
        self.keys.insert(spi.to_owned(), key);
    }

    /// The SPI the first seal names (whose key a server may want to look up first).
    pub fn spi_of(seals: &[Seal]) -> Option<&str> {
        seals.first().map(|s| s.block.spi.as_str())
    }

    /// Whether a key is enrolled for `spi`.
    pub fn knows(&self, spi: &str) -> bool {
        self.any_spi.is_some() || self.keys.contains_key(spi)
    }

    /// The SPI that signed every one of a message's `pdus` PDUs (`seals`, in order), at
    /// time `now`; an error when any is unsigned, signed by another SPI or key, or stale.
    pub fn check(&mut self, pdus: usize, seals: &[Seal], now: u64) -> Result<String, AuthError> {
        if seals.len() < pdus || pdus == 0 {
            return Err(AuthError::Unsigned { pdu: seals.len() });
        }
        let spi = seals[0].block.spi.clone();
        for s in seals {
            if s.block.bsd != BSD_DSA_SHA1 {
                return Err(AuthError::UnknownBsd(s.block.bsd));
            }
            if s.block.spi != spi {
                return Err(AuthError::MixedSpi(spi, s.block.spi.clone()));
            }
            let key = self
                .any_spi
                .as_ref()
                .or_else(|| self.keys.get(&spi))
                .ok_or_else(|| AuthError::UnknownSpi(spi.clone()))?;
            if !signed_by(s, key) {
                return Err(AuthError::BadSignature(spi));
            }
        }
        for s in seals {
            let stamp = s.block.timestamp;
            let last = self.last.get(&spi).copied().unwrap_or(0);
            if stamp.abs_diff(now) > self.window || stamp.saturating_add(self.jitter) < last {
                return Err(AuthError::Stale { spi, stamp, now });
            }
            self.last.insert(spi.clone(), stamp.max(last));
        }
        Ok(spi)
    }
}

/// A client's half (open-isns with `Security = 1`): it signs every message with its own
/// key (`AuthName`/`AuthKeyFile`) and takes only answers signed by its server's key
/// (`ServerKeyFile`).
#[derive(Debug)]
pub struct ClientAuth {
    me: Identity,
    server: Verifier,
}

impl ClientAuth {
    pub fn new(me: Identity, server_key: VerifyingKey, window: u64) -> ClientAuth {
        ClientAuth {
            me,
            server: Verifier::server(server_key, window),
        }
    }

    /// From the PEM texts of the client's private key and the server's public key.
    pub fn from_pem(spi: &str, key_pem: &str, server_pem: &str) -> Result<ClientAuth, KeyError> {
        Ok(ClientAuth::new(
            Identity::from_pem(spi, key_pem)?,
            public_key_from_pem(server_pem)?,
            DEFAULT_WINDOW,
        ))
    }

    pub fn spi(&self) -> &str {
        self.me.spi()
    }

    /// `m` as sent: its PDUs, each signed at `now`.
    pub fn seal(&self, m: &Message, now: u64) -> Vec<u8> {
        self.me.seal(&m.encode(MAX_PAYLOAD), now)
    }

    /// The message in `r` when the server signed all of it; an error otherwise.
    pub fn open(&mut self, r: Received, now: u64) -> Result<Message, AuthError> {
        self.server.check(r.pdus, &r.seals, now)?;
        Ok(r.message)
    }
}

/// `m` as sent: signed when `auth` is given.
pub fn wire(auth: Option<&ClientAuth>, m: &Message, now: u64) -> Vec<u8> {
    match auth {
        Some(a) => a.seal(m, now),
        None => m.encode(MAX_PAYLOAD),
    }
}

/// The message in `r`: checked when `auth` is given, taken as it is otherwise.
pub fn open(auth: Option<&mut ClientAuth>, r: Received, now: u64) -> Result<Message, AuthError> {
    match auth {
        Some(a) => a.open(r, now),
        None => Ok(r.message),
    }
}

/// open-isns's default replay window (`Auth.ReplayWindow`), in seconds.
pub const DEFAULT_WINDOW: u64 = 300;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::attr::{Attr, Tag};
    use crate::message::Reassembler;
    use crate::pdu::FunctionId;

    // A 1024-bit test key made once with `openssl genpkey` (the size open-isns's own
    // parameters have); only ever used in tests.
    pub const TEST_KEY: &str = include_str!("../tests/data/dsa-test.key");
    pub const TEST_PUB: &str = include_str!("../tests/data/dsa-test.pub");
    pub const OTHER_KEY: &str = include_str!("../tests/data/dsa-other.key");

    fn msg() -> Message {
        let mut m = Message::request(
            FunctionId::DEV_ATTR_REG,
            3,
            Attr::string(Tag::ISCSI_NAME, "iqn.2026-11.org.reservoir:a"),
            vec![],
            vec![Attr::string(Tag::ENTITY_ID, "e")],
        );
        for i in 0..20 {
            m.attrs
                .push(Attr::string(Tag::ISCSI_ALIAS, &format!("alias number {i}")));
        }
        m
    }

    #[test]
    fn block_layout() {
        let b = AuthBlock {
            bsd: 2,
            timestamp: 0x0102030405060708,
            spi: "ab".into(),
            signature: vec![9, 9, 9],
        };
        let mut w = Vec::new();
        b.encode(&mut w);
        assert_eq!(
            w,
            [0, 0, 0, 2, 0, 0, 0, 25, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 2, b'a', b'b', 9, 9, 9]
        );
        assert_eq!(AuthBlock::decode(&w), Ok(b));
        assert_eq!(AuthBlock::peek_len(w.first_chunk().unwrap()), Ok(25));
        let mut long_spi = w.clone();
        long_spi[19] = 200;
        assert_eq!(AuthBlock::decode(&long_spi), Err(AuthError::SpiLength(200)));
        let mut short = w.clone();
        short[7] = 19;
        assert_eq!(
            AuthBlock::peek_len(short.first_chunk().unwrap()),
            Err(AuthError::BlockLength(19))
        );
    }

    fn receive(wire: &[u8]) -> (Message, usize, Vec<Seal>) {
        let mut r = Reassembler::new();
        r.push(wire);
        let got = r.next_received().unwrap().unwrap();
        (got.message, got.pdus, got.seals)
    }

    #[test]
    fn sealed_message_round_trip_and_checks() {
        let me = Identity::from_pem("client-a", TEST_KEY).unwrap();
        let m = msg();
        let wire = me.seal(&m.encode(64), 1000);
        let (got, pdus, seals) = receive(&wire);
        assert!(pdus > 3, "split over several PDUs: {pdus}");
        assert_eq!(seals.len(), pdus);
        assert!(got.flags.has(Flags::AUTH));
        assert_eq!(got.attrs, m.attrs);

        let public = public_key_from_pem(TEST_PUB).unwrap();
        let mut server =
            Verifier::enrolled(HashMap::from([("client-a".into(), public.clone())]), 300);
        assert_eq!(server.check(pdus, &seals, 1010), Ok("client-a".into()));
        // The same message again, earlier than one already seen: a replay.
        let old = me.seal(&m.encode(64), 990);
        let (_, pdus2, seals2) = receive(&old);
        assert!(matches!(
            server.check(pdus2, &seals2, 1010),
            Err(AuthError::Stale { .. })
        ));
        // Too far from the server's clock.
        assert!(matches!(
            server.check(pdus, &seals, 2000),
            Err(AuthError::Stale { .. })
        ));

        // One byte of the payload changed: the signature no longer holds.
        let mut bent = seals.clone();
        let n = bent[1].signed.len() - 1;
        bent[1].signed[n] ^= 1;
        let mut fresh =
            Verifier::enrolled(HashMap::from([("client-a".into(), public.clone())]), 300);
        assert_eq!(
            fresh.check(pdus, &bent, 1000),
            Err(AuthError::BadSignature("client-a".into()))
        );
        // Another key claiming the SPI.
        let liar = Identity::from_pem("client-a", OTHER_KEY).unwrap();
        let (_, p3, s3) = receive(&liar.seal(&m.encode(64), 1000));
        assert_eq!(
            fresh.check(p3, &s3, 1000),
            Err(AuthError::BadSignature("client-a".into()))
        );
        // An SPI nobody enrolled.
        let stranger = Identity::from_pem("stranger", OTHER_KEY).unwrap();
        let (_, p4, s4) = receive(&stranger.seal(&m.encode(64), 1000));
        assert_eq!(
            fresh.check(p4, &s4, 1000),
            Err(AuthError::UnknownSpi("stranger".into()))
        );
        // Unsigned, or one PDU of several unsigned.
        let (_, p5, s5) = receive(&m.encode(64));
        assert_eq!(
            fresh.check(p5, &s5, 1000),
            Err(AuthError::Unsigned { pdu: 0 })
        );
        // A client knows its server's key whatever the SPI.
        let mut client = Verifier::server(public, 300);
        assert_eq!(client.check(pdus, &seals, 1000), Ok("client-a".into()));
    }

    #[test]
    fn client_signs_and_takes_only_its_servers_answers() {
        let mut c = ClientAuth::from_pem("client-a", OTHER_KEY, TEST_PUB).unwrap();
        let server = Identity::from_pem("srv", TEST_KEY).unwrap();
        let m = msg();
        let rsp = Message::response_to(&m, crate::Status::SUCCESS, Vec::new());
        let mut r = Reassembler::new();
        r.push(&server.seal(&rsp.encode(MAX_PAYLOAD), 50));
        let mut signed = rsp.clone();
        signed.flags.0 |= Flags::AUTH;
        assert_eq!(c.open(r.next_received().unwrap().unwrap(), 60), Ok(signed));
        // Unsigned, or signed by someone else: refused.
        r.push(&rsp.encode(MAX_PAYLOAD));
        assert!(c.open(r.next_received().unwrap().unwrap(), 60).is_err());
        let other = Identity::from_pem("srv", OTHER_KEY).unwrap();
        r.push(&other.seal(&rsp.encode(MAX_PAYLOAD), 60));
        assert!(c.open(r.next_received().unwrap().unwrap(), 60).is_err());
        // What the client sends carries its SPI.
        r.push(&c.seal(&m, 70));
        let got = r.next_received().unwrap().unwrap();
        assert_eq!(got.seals[0].block.spi, "client-a");
    }

    #[test]
    fn spi_and_key_errors() {
        assert!(Identity::from_pem("../x", TEST_KEY).is_err());
        assert!(Identity::from_pem("", TEST_KEY).is_err());
        assert!(Identity::from_pem("ok", TEST_PUB).is_err());
        assert!(public_key_from_pem(TEST_KEY).is_err());
    }
}
