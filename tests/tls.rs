//! TLS end to end: `rsv target` with TLS portals (certificates made here, at run time) and
//! the initiator over them: discovery, a session of several connections, ERL 2 recovery
//! through a cut, a pinned self-signed certificate, mutual TLS, `require_tls` per target,
//! and each refusal with its one line on both sides (the target's log and the initiator's
//! error) while a session beside them goes on.

use std::path::PathBuf;
use std::process::Command;

use initiator::{IscsiUrl, Session};
use net::testcerts::{self, Ca, Files};
use testkit::output::ok_stdout;
use testkit::*;
use tools::cli::{self, SessionFlags};

const MIB: u64 = 1 << 20;
const IQN: &str = "iqn.2026-11.org.reservoir:tls";
const TLS_ONLY_IQN: &str = "iqn.2026-11.org.reservoir:tls-only";

/// Certificates for one test: a CA, the target's certificate from it (for 127.0.0.1), an
/// expired one, a self-signed one, and a CA for client certificates with one it signed.
struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
    target: Files,
    expired: Files,
    selfsigned: Files,
    clients: Ca,
    client: Files,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ca = Ca::new(d, "ca");
        let target = ca.issue(d, "target", &["127.0.0.1"], false);
        let expired = ca.issue(d, "expired", &["127.0.0.1"], true);
        let selfsigned = testcerts::self_signed(d, "selfsigned", &["target.example"]);
        let clients = Ca::new(d, "clients");
        let client = clients.issue(d, "client", &["initiator.example"], false);
        Pki {
            dir,
            ca,
            target,
            expired,
            selfsigned,
            clients,
            client,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// `rsv target` with the portals of `portals` (TOML values) and two targets: one reachable
/// in plaintext too and one with `require_tls`; its log goes to a file.
fn start(portals: &[String]) -> Target {
    start_with(
        portals,
        &format!(
            "[[target]]\niqn = {IQN:?}\n\
             [[target.lun]]\nid = 0\nstore = \"file:lun0.img?size=256MiB\"\n\
             [[target]]\niqn = {TLS_ONLY_IQN:?}\nrequire_tls = true\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=16MiB\"\n"
        ),
    )
}

/// `rsv target` with the portals of `portals` (TOML values, in the order of the
/// configuration) and `targets`.
fn start_with(portals: &[String], targets: &str) -> Target {
    Target::spawn(Spawn {
        config: Some(&format!("portals = [{}]\n{targets}", portals.join(", "))),
        config_portals: true,
        ..Spawn::default()
    })
}

fn tls_portal(cert: &Files, extra: &str) -> String {
    format!(
        "{{ listen = \"127.0.0.1:0\", tls = {{ cert = {:?}, key = {:?}{extra} }} }}",
        cert.cert, cert.key
    )
}

fn ca_opt(pki: &Pki) -> String {
    format!("ca={}", pki.ca.cert.display())
}

#[test]
fn discovery_sessions_of_four_connections_and_recovery_all_over_tls() {
    let pki = Pki::new();
    let t = start(&[tls_portal(&pki.target, "")]);
    let portal = &t.portals[0];
    let rt = rt();
    // Discovery over TLS: SendTargets lists both targets.
    let url = IscsiUrl::parse(&format!("iscsi://{portal}/?{}", ca_opt(&pki))).unwrap();
    let listing = rt
        .block_on(cli::list(&url, &SessionFlags::default()))
        .unwrap();
    assert!(listing.iter().any(|l| l.target == IQN), "{listing:?}");
    assert!(listing.iter().any(|l| l.target == TLS_ONLY_IQN));

    // A copy over four connections, verified, and read back.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    random_file_with_holes(&img, (32 * MIB) as usize, 7);
    let lun = format!("iscsi://{portal}/{IQN}/0?{}", ca_opt(&pki));
    let s = rt
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &lun,
            "--connections",
            "4",
            "--verify",
        ])))
        .unwrap();
    assert!(s.verified);
    assert_eq!(s.sessions[0].connections, 4);
    let tls = s.sessions[0]
        .tls
        .clone()
        .expect("TLS in the session's info");
    assert!(tls.starts_with("TLSv1_3 TLS13_"), "{tls}");
    // Every connection logged in over TLS, as the target saw it.
    t.log_line("logged in to iqn.2026-11.org.reservoir:tls");
    assert!(
        t.log_count("; TLSv1_3 TLS13_") >= 4,
        "{}",
        t.log_count("TLSv1_3")
    );
    assert_eq!(t.log_count("plain TCP)"), 0);

    // ERL 2 through a cut: the lost connection logs in again over TLS, tasks reassigned.
    let proxy = CuttingProxy::start(portal.clone(), (4 * MIB) as usize);
    let cut = format!(
        "iscsi://{}/{IQN}/0?{}&connections=2&erl=2",
        proxy.portal,
        ca_opt(&pki)
    );
    let s = rt
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &cut,
            "--verify",
        ])))
        .unwrap();
    assert!(s.verified);
    assert!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert!(
        t.log_count("; TLSv1_3 TLS13_") >= 4 + 3,
        "reconnection over TLS"
    );
}

#[test]
fn a_pinned_self_signed_certificate_and_mutual_tls() {
    let pki = Pki::new();
    let mutual = format!(", client_ca = {:?}", pki.clients.cert);
    let t = start(&[
        tls_portal(&pki.selfsigned, ""),
        tls_portal(&pki.target, &mutual),
    ]);
    let rt = rt();
    let inq = |url: String| {
        rt.block_on(cli::inquire(
            &IscsiUrl::parse(&url).unwrap(),
            &SessionFlags::default(),
        ))
    };
    // Pinned: the certificate names target.example, we dial 127.0.0.1: the pin is enough.
    let r = inq(format!(
        "iscsi://{}/{IQN}/0?pin={}",
        t.portals[0], pki.selfsigned.fingerprint
    ));
    assert!(r.is_ok(), "{r:?}");
    let e = inq(format!(
        "iscsi://{}/{IQN}/0?pin={}",
        t.portals[0], pki.target.fingerprint
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("the target's certificate is not trusted: its fingerprint sha256:")
            && e.contains("is not the pinned one"),
        "{e}"
    );
    t.log_line("the initiator rejected our certificate");

    // Mutual TLS: with the client certificate, in; without, a line that says so.
    let with = format!(
        "iscsi://{}/{IQN}/0?{}&cert={}&key={}",
        t.portals[1],
        ca_opt(&pki),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    assert!(inq(with).is_ok());
    let e = inq(format!("iscsi://{}/{IQN}/0?{}", t.portals[1], ca_opt(&pki)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the target requires a client certificate (give cert= and key=)"),
        "{e}"
    );
    t.log_line("the initiator presented no client certificate, and this portal requires one");
}

/// Each refusal ends with one line naming its cause on both sides, and a session open
/// beside them all goes on.
#[test]
fn refusals_name_their_cause_on_both_sides_and_touch_no_other_session() {
    let pki = Pki::new();
    let t = start(&[
        "\"127.0.0.1:0\"".to_owned(),
        tls_portal(&pki.target, ""),
        tls_portal(&pki.expired, ""),
    ]);
    let (plain, tls, expired) = (&t.portals[0], &t.portals[1], &t.portals[2]);
    let rt = rt();
    let bystander_url =
        IscsiUrl::parse(&format!("iscsi://{tls}/{IQN}/0?{}", ca_opt(&pki))).unwrap();
    let bystander = rt
        .block_on(Session::connect(
            &bystander_url,
            &bystander_url.options(&Default::default()).unwrap(),
        ))
        .unwrap();
    let inq = |url: String| {
        rt.block_on(cli::inquire(
            &IscsiUrl::parse(&url).unwrap(),
            &SessionFlags::default(),
        ))
        .unwrap_err()
        .to_string()
    };
    let one_line = |e: &str| assert!(!e.contains('\n'), "{e}");

    // Plaintext to a TLS portal.
    let e = inq(format!("iscsi://{tls}/{IQN}/0"));
    one_line(&e);
    assert!(
        e.ends_with("refused: the target requires TLS (status 0x0201); connect with tls=1 (--tls) and ca= or pin="),
        "{e}"
    );
    t.log_line(&format!(
        "plaintext login on portal {tls} refused (status 0x0201): this portal requires TLS"
    ));
    // TLS to a plaintext portal.
    let e = inq(format!("iscsi://{plain}/{IQN}/0?{}", ca_opt(&pki)));
    one_line(&e);
    assert!(
        e.contains(
            "the portal closed the connection during the TLS handshake: it does not speak TLS"
        ),
        "{e}"
    );
    t.log_line(&format!(
        "a TLS handshake on portal {plain}, which is plaintext: closed"
    ));
    // A certificate from a CA we do not trust.
    let e = inq(format!(
        "iscsi://{tls}/{IQN}/0?ca={}",
        pki.clients.cert.display()
    ));
    one_line(&e);
    assert!(
        e.contains("the target's certificate is not trusted: signed by an unknown issuer"),
        "{e}"
    );
    t.log_line("the initiator rejected our certificate (TLS alert UnknownCA)");
    // An expired certificate.
    let e = inq(format!("iscsi://{expired}/{IQN}/0?{}", ca_opt(&pki)));
    one_line(&e);
    assert!(
        e.contains("the target's certificate is not trusted: it has expired"),
        "{e}"
    );
    t.log_line("the initiator rejected our certificate (TLS alert CertificateExpired)");
    // The certificate names 127.0.0.1, we ask for another name.
    let e = inq(format!(
        "iscsi://{tls}/{IQN}/0?{}&tls_name=other.example",
        ca_opt(&pki)
    ));
    one_line(&e);
    assert!(
        e.contains("it does not carry the name we connected to"),
        "{e}"
    );
    t.log_line("the initiator rejected our certificate (TLS alert BadCertificate)");
    // A target that requires TLS, reached in plaintext; over TLS it answers.
    let e = inq(format!("iscsi://{plain}/{TLS_ONLY_IQN}/0"));
    one_line(&e);
    assert!(e.contains("the target requires TLS (status 0x0202)"), "{e}");
    t.log_line(&format!(
        "login refused: target {TLS_ONLY_IQN} requires TLS and this connection is plaintext (0x0202)"
    ));
    let ok = rt.block_on(cli::inquire(
        &IscsiUrl::parse(&format!("iscsi://{tls}/{TLS_ONLY_IQN}/0?{}", ca_opt(&pki))).unwrap(),
        &SessionFlags::default(),
    ));
    assert!(ok.is_ok(), "{ok:?}");

    // The session beside all that still works.
    let data = bytes::Bytes::from(vec![0x5a; 64 << 10]);
    rt.block_on(bystander.write(0, 0, data.clone())).unwrap();
    let back = rt.block_on(bystander.read(0, 0, 128)).unwrap();
    assert_eq!(back, data);
}

/// The binary: `--tls-pin` on the command line, `rsv tune` shows TLS, a failure is one
/// line on stderr, and a target whose key others may read does not start.
#[test]
fn rsv_flags_tune_and_a_key_others_may_read() {
    let pki = Pki::new();
    let t = start(&[tls_portal(&pki.selfsigned, "")]);
    let bin = rsv();
    let url = format!("iscsi://{}/{IQN}/0", t.portals[0]);
    let stdout = ok_stdout(Command::new(&bin).args([
        "tune",
        &url,
        "--tls-pin",
        &pki.selfsigned.fingerprint,
    ]));
    assert!(
        stdout.contains("transport: TLS (TLSv1_3 TLS13_"),
        "{stdout}"
    );
    // (No backtrace: this environment may ask anyhow for one.)
    let out = Command::new(&bin)
        .args(["inq", &url])
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("the target requires TLS"), "{stderr}");

    use std::os::unix::fs::PermissionsExt;
    let key = pki.path("open.key");
    std::fs::copy(&pki.target.key, &key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(&bin)
        .args(["target", "--tls-listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&pki.target.cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--data-dir")
        .arg(pki.dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: private key readable by group or others (mode 644); chmod 600",
            key.display()
        )),
        "{stderr}"
    );
}

/// Access control per target: the portals it is reachable through, the initiators allowed
/// with a CHAP secret each, `require_chap`, and LUN masking; each refusal with its RFC 7143
/// status and a log line that names the cause and no secret.
#[test]
fn access_per_initiator_portal_chap_and_lun_masking() {
    const ACL: &str = "iqn.2026-11.org.reservoir:acl";
    const HOST1: &str = "iqn.2026-11.org.example:host1";
    const HOST2: &str = "iqn.2026-11.org.example:host2";
    const HOST3: &str = "iqn.2026-11.org.example:host3";
    const SECRET: &str = "host1-secret-12";
    let (p1, p2) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let t = start_with(
        &[format!("{p1:?}"), format!("{p2:?}")],
        &format!(
            "[[target]]\niqn = {ACL:?}\nportals = [{p2:?}]\nrequire_chap = true\n\
             [[target.initiator]]\nname = {HOST1:?}\nluns = [1]\n\
             chap = {{ user = \"host1\", secret = {SECRET:?} }}\n\
             [[target.initiator]]\nname = {HOST2:?}\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=8MiB\"\n\
             [[target.lun]]\nid = 1\nstore = \"ram:?size=16MiB\"\n"
        ),
    );
    let rt = rt();
    let flags = |name: &str| SessionFlags {
        initiator_name: Some(name.to_owned()),
        ..Default::default()
    };
    let inq = |user: &str, portal: &str, lun: u16, name: &str| {
        rt.block_on(cli::inquire(
            &IscsiUrl::parse(&format!("iscsi://{user}{portal}/{ACL}/{lun}")).unwrap(),
            &flags(name),
        ))
    };
    let creds = format!("host1%{SECRET}@");
    // Through its portal, with its secret: in, and it sees LUN 1 only.
    assert!(inq(&creds, &p2, 1, HOST1).is_ok());
    let listing = rt
        .block_on(cli::list(
            &IscsiUrl::parse(&format!("iscsi://{creds}{p2}/")).unwrap(),
            &flags(HOST1),
        ))
        .unwrap();
    let acl = listing
        .iter()
        .find(|l| l.target == ACL)
        .expect("listed on its portal");
    let luns: Vec<u16> = acl.luns.iter().map(|l| l.lun).collect();
    assert_eq!(luns, [1], "{listing:?}");
    let e = inq(&creds, &p2, 0, HOST1).unwrap_err().to_string();
    assert!(e.contains("LUN 0 not found"), "{e}");
    // Not offered on the other portal: not listed there, a login is "not found".
    let listing = rt
        .block_on(cli::list(
            &IscsiUrl::parse(&format!("iscsi://{p1}/")).unwrap(),
            &flags(HOST1),
        ))
        .unwrap();
    assert!(!listing.iter().any(|l| l.target == ACL), "{listing:?}");
    let e = inq(&creds, &p1, 1, HOST1).unwrap_err().to_string();
    assert!(e.contains("(status class 2"), "{e}");
    t.log_line(&format!(
        "login refused: target {ACL} is not offered on this portal ({p1}) (0x0203)"
    ));
    // A wrong secret: authentication failure, and no secret in the log.
    let e = inq("host1%wrong-secret-99@", &p2, 1, HOST1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("authentication"), "{e}");
    t.log_line("(0x0201)");
    // An initiator allowed but without a secret, where CHAP is required.
    let e = inq("", &p2, 1, HOST2).unwrap_err().to_string();
    assert!(e.contains("(status class 2"), "{e}");
    t.log_line(&format!(
        "login refused: target {ACL} requires CHAP and has no secret for initiator {HOST2} (0x0202)"
    ));
    // An initiator not named at all.
    let e = inq("", &p2, 1, HOST3).unwrap_err().to_string();
    assert!(e.contains("ACL does not admit"), "{e}");
    t.log_line(&format!(
        "login refused: initiator {HOST3} is not allowed to target {ACL} (0x0202)"
    ));
    let log = t.log();
    assert!(
        !log.contains(SECRET) && !log.contains("wrong-secret-99"),
        "{log}"
    );
}
