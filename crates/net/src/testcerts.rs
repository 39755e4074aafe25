//! Certificates for tests, made at run time (no key is ever committed): a CA, leaf
//! certificates it signs (expired ones too), and self-signed ones. Behind the
//! `test-certs` feature, which only tests turn on.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

/// A certificate and its key as PEM files.
#[derive(Clone, Debug)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// SHA-256 of the certificate, as `pin=` takes it.
    pub fingerprint: String,
}

/// A CA that signs leaf certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, for `ca=` and `client_ca`.
    pub cert: PathBuf,
}

fn write(dir: &Path, stem: &str, cert_pem: &str, der: &[u8], key: &KeyPair) -> Files {
    std::fs::create_dir_all(dir).expect("test certificate directory");
    let cert = dir.join(format!("{stem}.crt"));
    let key_path = dir.join(format!("{stem}.key"));
    std::fs::write(&cert, cert_pem).expect("write certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
    let fp = crate::tls::fingerprint(&rustls::pki_types::CertificateDer::from(der.to_vec()));
    Files {
        cert,
        key: key_path,
        fingerprint: crate::tls::fingerprint_text(&fp),
    }
}

fn leaf_params(names: &[&str], expired: bool) -> CertificateParams {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    for n in names {
        p.subject_alt_names
            .push(match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("DNS name")),
            });
    }
    p.distinguished_name.push(
        rcgen::DnType::CommonName,
        names.first().copied().unwrap_or("test"),
    );
    if expired {
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    p
}

impl Ca {
    /// A new CA whose certificate is written to `dir/STEM.crt`.
    pub fn new(dir: &Path, stem: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{stem} test CA"));
        let cert = p.self_signed(&key).expect("CA certificate");
        let files = write(dir, stem, &cert.pem(), cert.der(), &key);
        Ca {
            issuer: Issuer::new(p, key),
            cert: files.cert,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by this CA; one that
    /// expired in 2021 when `expired`.
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str], expired: bool) -> Files {
        let key = KeyPair::generate().expect("key");
        let cert = leaf_params(names, expired)
            .signed_by(&key, &self.issuer)
            .expect("certificate");
        write(dir, stem, &cert.pem(), cert.der(), &key)
    }
}

/// A self-signed certificate for `names`.
pub fn self_signed(dir: &Path, stem: &str, names: &[&str]) -> Files {
    let key = KeyPair::generate().expect("key");
    let cert = leaf_params(names, false)
        .self_signed(&key)
        .expect("certificate");
    write(dir, stem, &cert.pem(), cert.der(), &key)
}
