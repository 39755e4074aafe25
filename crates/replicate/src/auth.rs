//! The control channel's authentication: every request and every answer carries an
//! HMAC-SHA256 over what it says, keyed with a secret that the coordinator and the disk
//! servers share (a key file). Sans-IO: strings in, strings out.
//!
//! A request carries `Authorization: RSV1 ts=UNIX,nonce=HEX,mac=HEX` where `mac` is the
//! HMAC of `RSV1 request\n{method}\n{path}\n{ts}\n{nonce}\n{sha256(body)}`. The server
//! refuses a timestamp more than [`SKEW`] away from its clock and a nonce it has seen
//! within that window (replay), so a captured request cannot be played again. The answer
//! carries `X-Rsv-Mac: HEX`, the HMAC of `RSV1 answer\n{nonce}\n{status}\n{sha256(body)}`:
//! the coordinator knows the answer came from a holder of the key and belongs to its
//! request (a fake disk server cannot report checksums). Nothing is encrypted: the
//! channel carries commands and figures, never data or the key.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// How far a request's timestamp may be from the server's clock.
pub const SKEW: Duration = Duration::from_secs(300);

/// The shared secret.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("no Authorization header")]
    Missing,
    #[error("Authorization header is not `RSV1 ts=..,nonce=..,mac=..`")]
    Malformed,
    #[error(
        "request timestamp is {0} s away from this host's clock (more than 300): check both clocks"
    )]
    Skew(u64),
    #[error("request replayed (nonce seen before)")]
    Replay,
    #[error("wrong key: the request's MAC does not match")]
    BadMac,
}

impl Key {
    /// A key of at least 16 bytes.
    pub fn new(secret: &[u8]) -> anyhow::Result<Key> {
        anyhow::ensure!(
            secret.len() >= 16,
            "the control key is {} bytes; it needs at least 16 (e.g. `head -c 32 /dev/urandom | base64`)",
            secret.len()
        );
        Ok(Key(secret.to_vec()))
    }

    /// Reads a key file: its contents without surrounding white space. The file must not
    /// be readable by group or others.
    pub fn from_file(path: &Path) -> anyhow::Result<Key> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("control key {}: {e}", path.display()))?;
        let mode = meta.permissions().mode() & 0o777;
        anyhow::ensure!(
            mode & 0o077 == 0,
            "control key {}: mode {mode:03o} lets others read it; chmod 600 it",
            path.display()
        );
        let text = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("control key {}: {e}", path.display()))?;
        let trimmed = text.trim_ascii();
        Key::new(trimmed).map_err(|e| anyhow::anyhow!("control key {}: {e}", path.display()))
    }

    fn mac(&self, text: &str) -> String {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(text.as_bytes());
        hex(&m.finalize().into_bytes())
    }

    fn verify(&self, text: &str, mac_hex: &str) -> bool {
        let Some(given) = unhex(mac_hex) else {
            return false;
        };
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(text.as_bytes());
        m.verify_slice(&given).is_ok()
    }

    /// The `Authorization` value for a request, and its nonce (to check the answer).
    pub fn sign_request(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        now_unix: u64,
    ) -> (String, String) {
        let nonce = hex(&rand::random::<[u8; 16]>());
        let mac = self.mac(&request_text(method, path, now_unix, &nonce, body));
        (format!("RSV1 ts={now_unix},nonce={nonce},mac={mac}"), nonce)
    }

    /// The `X-Rsv-Mac` value of an answer to the request with `nonce`.
    pub fn sign_answer(&self, nonce: &str, status: u16, body: &[u8]) -> String {
        self.mac(&answer_text(nonce, status, body))
    }

    /// Whether an answer's `X-Rsv-Mac` is right.
    pub fn check_answer(&self, nonce: &str, status: u16, body: &[u8], mac: &str) -> bool {
        self.verify(&answer_text(nonce, status, body), mac)
    }
}

fn request_text(method: &str, path: &str, ts: u64, nonce: &str, body: &[u8]) -> String {
    format!(
        "RSV1 request\n{method}\n{path}\n{ts}\n{nonce}\n{}",
        hex(&Sha256::digest(body))
    )
}

fn answer_text(nonce: &str, status: u16, body: &[u8]) -> String {
    format!(
        "RSV1 answer\n{nonce}\n{status}\n{}",
        hex(&Sha256::digest(body))
    )
}

/// The server's side: checks requests and remembers nonces for the skew window.
#[derive(Debug)]
pub struct Verifier {
    key: Key,
    seen: HashMap<String, u64>,
}

impl Verifier {
    pub fn new(key: Key) -> Verifier {
        Verifier {
            key,
            seen: HashMap::new(),
        }
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Checks a request; on success returns its nonce (to sign the answer with).
    pub fn check(
        &mut self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        body: &[u8],
        now_unix: u64,
    ) -> Result<String, AuthError> {
        let value = authorization.ok_or(AuthError::Missing)?;
        let fields = value.strip_prefix("RSV1 ").ok_or(AuthError::Malformed)?;
        let (mut ts, mut nonce, mut mac) = (None, None, None);
        for f in fields.split(',') {
            match f.trim().split_once('=') {
                Some(("ts", v)) => ts = v.parse::<u64>().ok(),
                Some(("nonce", v)) if !v.is_empty() && v.len() <= 64 => nonce = Some(v),
                Some(("mac", v)) => mac = Some(v),
                _ => return Err(AuthError::Malformed),
            }
        }
        let (Some(ts), Some(nonce), Some(mac)) = (ts, nonce, mac) else {
            return Err(AuthError::Malformed);
        };
        let skew = ts.abs_diff(now_unix);
        if skew > SKEW.as_secs() {
            return Err(AuthError::Skew(skew));
        }
        if !self
            .key
            .verify(&request_text(method, path, ts, nonce, body), mac)
        {
            return Err(AuthError::BadMac);
        }
        let window = SKEW.as_secs();
        self.seen.retain(|_, t| t.abs_diff(now_unix) <= window);
        if self.seen.insert(nonce.to_owned(), ts).is_some() {
            return Err(AuthError::Replay);
        }
        Ok(nonce.to_owned())
    }
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new(b"0123456789abcdef-shared").unwrap()
    }

    #[test]
    fn signed_request_passes_once() {
        let mut v = Verifier::new(key());
        let (auth, nonce) = key().sign_request("POST", "/v1/send", b"{}", 1000);
        assert_eq!(
            v.check("POST", "/v1/send", Some(&auth), b"{}", 1010),
            Ok(nonce)
        );
        assert_eq!(
            v.check("POST", "/v1/send", Some(&auth), b"{}", 1010),
            Err(AuthError::Replay)
        );
    }

    #[test]
    fn anything_changed_fails() {
        let mut v = Verifier::new(key());
        let (auth, _) = key().sign_request("POST", "/v1/send", b"{}", 1000);
        assert_eq!(
            v.check("GET", "/v1/send", Some(&auth), b"{}", 1000),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            v.check("POST", "/v1/sends", Some(&auth), b"{}", 1000),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            v.check("POST", "/v1/send", Some(&auth), b"{ }", 1000),
            Err(AuthError::BadMac)
        );
        let other = Key::new(b"another key of 16+ bytes").unwrap();
        let (auth2, _) = other.sign_request("POST", "/v1/send", b"{}", 1000);
        assert_eq!(
            v.check("POST", "/v1/send", Some(&auth2), b"{}", 1000),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            v.check("POST", "/v1/send", None, b"{}", 1000),
            Err(AuthError::Missing)
        );
        assert_eq!(
            v.check("POST", "/v1/send", Some("Basic x"), b"{}", 1000),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            v.check("POST", "/v1/send", Some(&auth), b"{}", 2000),
            Err(AuthError::Skew(1000))
        );
    }

    #[test]
    fn answers_are_bound_to_their_request() {
        let k = key();
        let mac = k.sign_answer("abc", 200, b"[1]");
        assert!(k.check_answer("abc", 200, b"[1]", &mac));
        assert!(!k.check_answer("abd", 200, b"[1]", &mac));
        assert!(!k.check_answer("abc", 500, b"[1]", &mac));
        assert!(!k.check_answer("abc", 200, b"[2]", &mac));
        assert!(!k.check_answer("abc", 200, b"[1]", "zz"));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(Key::new(b"short").is_err());
    }
}
