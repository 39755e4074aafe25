//! TLS 1.3 under an iSCSI connection (rustls with the ring provider): the target's
//! acceptor per portal, the initiator's connector, certificates and keys read from PEM
//! files (a private key readable by group or others is refused), pinning a self-signed
//! certificate by its SHA-256 fingerprint, and the one-line reasons a handshake failed.
//!
//! ring rather than aws-lc-rs, for the build: aws-lc-sys's C build was 18 % of a cold
//! release build of `rsv` (issue 36). The price is in the cipher (`scripts/tls-provider-bench`,
//! `--bin records`, as `crate::record` seals and opens, CPU seconds on one core): ring
//! seals AES-GCM records at about 1.5 times aws-lc-rs's cost (it has no out-of-place
//! seal, so the plaintext is copied into the record first, and its AES-GCM is VAES-AVX2
//! where aws-lc's is AVX-512) and opens them at about 1.1 times (`docs/bench-tls.md`).
//!
//! Only TLS 1.3 is offered, with its AES-GCM and ChaCha20-Poly1305 suites (as NVMe/TCP's
//! TLS, TP 8011, asks for 1.3). The handshakes themselves are in [`crate::transport`].

use std::fmt::Write as _;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{AlertDescription, CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// Why TLS could not be set up from the files given; one line each.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    File { path: String, why: String },
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// The crypto provider every TLS connection of ours uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 of a certificate's DER encoding: what `pin=` names.
pub fn fingerprint(cert: &CertificateDer<'_>) -> [u8; 32] {
    Sha256::digest(cert.as_ref()).into()
}

/// A fingerprint as `sha256:` and 64 lower-case hex digits.
pub fn fingerprint_text(fp: &[u8; 32]) -> String {
    let mut s = String::from("sha256:");
    for b in fp {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Reads a fingerprint as `fingerprint_text` writes it; the `sha256:` prefix and colons
/// between bytes are optional, case does not matter.
pub fn parse_fingerprint(s: &str) -> Result<[u8; 32], String> {
    let t = s.trim();
    let t = t
        .strip_prefix("sha256:")
        .or_else(|| t.strip_prefix("SHA256:"))
        .unwrap_or(t);
    let hex: String = t.chars().filter(|c| *c != ':').collect();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "pin={s}: expected a SHA-256 fingerprint, 64 hex digits (as `rsv target` logs it)"
        ));
    }
    let mut fp = [0u8; 32];
    for (i, b) in fp.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(fp)
}

/// The certificates of a PEM file, in order (leaf first for a chain).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|e| file_error(path, e))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate in it (PEM expected)"));
    }
    Ok(certs)
}

/// The private key of a PEM file, refused when anyone but its owner may read it.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let meta = std::fs::metadata(path).map_err(|e| file_error(path, e))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(file_error(
            path,
            format!(
                "private key readable by group or others (mode {mode:03o}); chmod 600 {}",
                path.display()
            ),
        ));
    }
    let pem = std::fs::read(path).map_err(|e| file_error(path, e))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            file_error(path, "no private key in it (PEM expected)")
        }
        e => file_error(path, format!("not a PEM private key: {e}")),
    })
}

fn roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(path)? {
        roots
            .add(c)
            .map_err(|e| file_error(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// What a target portal's TLS is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates signed by these CAs are required (mutual TLS); none: no
    /// client certificate is asked for.
    pub client_ca: Option<PathBuf>,
}

/// A portal's TLS, ready to accept handshakes.
#[derive(Clone)]
pub struct ServerTls {
    pub(crate) config: Arc<rustls::ServerConfig>,
    /// Of the portal's own certificate, for initiators that pin it.
    pub fingerprint: [u8; 32],
    pub mutual: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerTls({})", fingerprint_text(&self.fingerprint))
    }
}

impl ServerTls {
    pub fn new(files: &ServerFiles) -> Result<ServerTls, TlsError> {
        let certs = read_certs(&files.cert)?;
        let key = read_key(&files.key)?;
        let fingerprint = fingerprint(&certs[0]);
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &files.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca)?),
                    provider,
                )
                .build()
                .map_err(|e| file_error(ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| {
            file_error(
                &files.key,
                format!("does not fit {}: {e}", files.cert.display()),
            )
        })?;
        // iSCSI has no ALPN name of its own; nothing is offered or asked.
        config.send_tls13_tickets = 0;
        // After the handshake the records are ours (`crate::tlsconn`).
        config.enable_secret_extraction = true;
        Ok(ServerTls {
            config: Arc::new(config),
            fingerprint,
            mutual: files.client_ca.is_some(),
        })
    }
}

/// How an initiator trusts a target and proves itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClientFiles {
    /// CA certificates to trust; none (and no pin): the system's bundle.
    pub ca: Option<PathBuf>,
    /// Trust exactly the certificate with this SHA-256 fingerprint, whoever signed it and
    /// whatever names it carries (a self-signed certificate at a site without a CA).
    #[serde(serialize_with = "ser_pin")]
    pub pin: Option<[u8; 32]>,
    /// A client certificate and its key, for targets that ask for one (mutual TLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the target's certificate must carry; default the host of the URL.
    pub server_name: Option<String>,
    /// Offer only this TLS 1.3 cipher suite (see [`parse_suite`]); default all three.
    pub suite: Option<String>,
}

/// The TLS 1.3 suites offered, by their IANA names.
pub const SUITES: &[&str] = &[
    "TLS13_AES_128_GCM_SHA256",
    "TLS13_AES_256_GCM_SHA384",
    "TLS13_CHACHA20_POLY1305_SHA256",
];

/// A TLS 1.3 suite by name: its IANA name (any case) or `aes128`, `aes256`, `chacha20`.
pub fn parse_suite(name: &str) -> Result<&'static str, String> {
    let n = name.trim().to_ascii_uppercase().replace('-', "_");
    let full = match n.as_str() {
        "AES128" | "AES_128_GCM" | "AES128GCM" => SUITES[0],
        "AES256" | "AES_256_GCM" | "AES256GCM" => SUITES[1],
        "CHACHA20" | "CHACHA20_POLY1305" | "CHACHA" => SUITES[2],
        other => SUITES
            .iter()
            .copied()
            .find(|s| *s == other)
            .ok_or_else(|| {
                format!(
                    "unknown TLS 1.3 suite {name:?}; known: aes128, aes256, chacha20 or {}",
                    SUITES.join(", ")
                )
            })?,
    };
    Ok(full)
}

fn ser_pin<S: serde::Serializer>(pin: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
    match pin {
        Some(p) => s.serialize_some(&fingerprint_text(p)),
        None => s.serialize_none(),
    }
}

/// The system's CA bundle, used when neither a CA file nor a pin is given.
const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// An initiator's TLS, ready to start handshakes.
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    server_name: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    pub fn new(files: &ClientFiles) -> Result<ClientTls, TlsError> {
        let mut provider = provider();
        if let Some(name) = &files.suite {
            let want = parse_suite(name).map_err(TlsError::Config)?;
            let mut p = (*provider).clone();
            p.cipher_suites
                .retain(|s| format!("{:?}", s.suite()) == want);
            if p.cipher_suites.is_empty() {
                return Err(TlsError::Config(format!(
                    "{want} is not offered by this build"
                )));
            }
            provider = Arc::new(p);
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match (&files.pin, &files.ca) {
            (Some(_), Some(_)) => {
                return Err(TlsError::Config("give either ca= or pin=, not both".into()))
            }
            (Some(pin), None) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Pinned {
                    pin: *pin,
                    provider,
                })),
            (None, Some(ca)) => builder.with_root_certificates(roots(ca)?),
            (None, None) => builder.with_root_certificates(roots(Path::new(SYSTEM_CAS))?),
        };
        let mut config = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
                .map_err(|e| file_error(key, format!("does not fit {}: {e}", cert.display())))?,
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsError::Config(
                    "a client certificate needs both cert= and key=".into(),
                ))
            }
        };
        config.enable_secret_extraction = true;
        Ok(ClientTls {
            config: Arc::new(config),
            server_name: files.server_name.clone(),
        })
    }

    /// The name to verify the target's certificate against when dialling `host`.
    pub(crate) fn server_name(&self, host: &str) -> io::Result<ServerName<'static>> {
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = name.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(name.to_owned()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "TLS: {name:?} is not a host name or address to verify a certificate against"
                ),
            )
        })
    }
}

/// Trusts the one certificate whose fingerprint is pinned; its signature over the
/// handshake is still checked, so only the holder of its key passes.
#[derive(Debug)]
struct Pinned {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = fingerprint(end_entity);
        if got == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(PinMismatch(got))),
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[derive(Debug)]
struct PinMismatch([u8; 32]);

impl std::fmt::Display for PinMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "its fingerprint {} is not the pinned one",
            fingerprint_text(&self.0)
        )
    }
}

impl std::error::Error for PinMismatch {}

/// Which end of a handshake is explaining its failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Initiator,
    Target,
}

/// The cause in one line when `e` is a TLS failure (an alert, a certificate refused
/// after the handshake, as TLS 1.3 does with client certificates); `None` otherwise.
pub fn tls_failure(side: Side, e: &io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .map(|_| handshake_failure(side, e))
}

/// A failed handshake's cause in one line, from the side that saw it: the error rustls
/// gave (inside `e`), or the connection ending before the handshake did.
pub fn handshake_failure(side: Side, e: &io::Error) -> String {
    let peer = match side {
        Side::Initiator => "the target",
        Side::Target => "the initiator",
    };
    let ours = match side {
        Side::Initiator => "the target's certificate",
        Side::Target => "the initiator's client certificate",
    };
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => match side {
                Side::Initiator => "the portal closed the connection during the TLS \
                                   handshake: it does not speak TLS (a plaintext portal?)"
                    .to_owned(),
                Side::Target => "the initiator closed the connection during the TLS \
                                 handshake"
                    .to_owned(),
            },
            _ => format!("TLS handshake: {e}"),
        };
    };
    use rustls::Error as E;
    match tls {
        E::InvalidCertificate(c) => {
            format!("{ours} is not trusted: {}", certificate_problem(c, side))
        }
        E::NoCertificatesPresented => {
            "the initiator presented no client certificate, and this portal requires one".into()
        }
        E::AlertReceived(a) => match (side, a) {
            (Side::Initiator, AlertDescription::CertificateRequired) => {
                "the target requires a client certificate (give cert= and key=)".into()
            }
            (_, AlertDescription::UnknownCA)
            | (_, AlertDescription::BadCertificate)
            | (_, AlertDescription::CertificateExpired)
            | (_, AlertDescription::CertificateUnknown)
            | (_, AlertDescription::AccessDenied) => {
                let what = match side {
                    Side::Initiator => "our client certificate",
                    Side::Target => "our certificate",
                };
                format!("{peer} rejected {what} (TLS alert {a:?})")
            }
            _ => format!("{peer} ended the TLS handshake (alert {a:?})"),
        },
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => match side {
            Side::Initiator => "the portal answered the TLS handshake with something else: it \
                                does not speak TLS (a plaintext portal?)"
                .into(),
            Side::Target => "the initiator sent something other than a TLS handshake".into(),
        },
        E::PeerIncompatible(p) => format!("{peer} offers nothing we accept: {p:?} (TLS 1.3 only)"),
        other => format!("TLS handshake: {other}"),
    }
}

fn certificate_problem(c: &CertificateError, side: Side) -> String {
    let ca_hint = match side {
        Side::Initiator => " (give ca=FILE with the CA that signed it, or pin= its fingerprint)",
        Side::Target => " (not signed by the portal's client_ca)",
    };
    match c {
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "it has expired".into()
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "it is not valid yet (check the clocks)".into()
        }
        CertificateError::UnknownIssuer => format!("signed by an unknown issuer{ca_hint}"),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "it does not carry the name we connected to (give tls_name= the name it has)".into()
        }
        CertificateError::BadSignature => "its signature does not verify".into(),
        CertificateError::Revoked => "it was revoked".into(),
        CertificateError::Other(o) => o.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_read_back_in_every_spelling() {
        let fp: [u8; 32] = std::array::from_fn(|i| i as u8 * 7);
        let text = fingerprint_text(&fp);
        assert!(text.starts_with("sha256:"));
        assert_eq!(parse_fingerprint(&text).unwrap(), fp);
        let colons: Vec<String> = fp.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(parse_fingerprint(&colons.join(":")).unwrap(), fp);
        assert!(parse_fingerprint("sha256:abcd").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn a_key_others_may_read_is_refused_with_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("net-tls-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key.pem");
        std::fs::write(&key, "not a key").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key(&key).unwrap_err().to_string();
        assert!(e.contains("readable by group or others (mode 644)"), "{e}");
        assert!(!e.contains('\n'));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_key(&key).unwrap_err().to_string();
        assert!(e.contains("no private key in it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
