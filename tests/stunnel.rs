//! TLS interop with peers that speak no TLS themselves, through Debian's `stunnel4`:
//! libiscsi's tools and qemu-img reach a Reservoir TLS portal through a local stunnel
//! client (which checks the portal's certificate against our CA), and Reservoir's
//! initiator, with TLS, reaches tgt behind an stunnel server.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use net::testcerts::{Ca, Files};
use testkit::output::{ok_stdout, said};
use testkit::*;

/// A foreground stunnel with this configuration; killed on drop.
struct Stunnel(Child, String);

impl Stunnel {
    fn start(dir: &Path, name: &str, service: &str, accept: u16) -> Stunnel {
        let conf = dir.join(format!("{name}.conf"));
        let log = dir.join(format!("{name}.log"));
        std::fs::write(
            &conf,
            format!("foreground = yes\npid =\ndebug = 6\noutput = {}\n[{name}]\naccept = 127.0.0.1:{accept}\n{service}", log.display()),
        )
        .unwrap();
        let child = Command::new("stunnel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting stunnel");
        wait_for_port(&format!("127.0.0.1:{accept}"), Duration::from_secs(10));
        Stunnel(child, log.display().to_string())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
}

impl Drop for Stunnel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rsv target` with one TLS-only portal (and the file LUN of the default target).
struct TlsTarget {
    child: Child,
    portal: String,
    iqn: String,
    _dir: tempfile::TempDir,
}

impl TlsTarget {
    fn start(cert: &Files) -> TlsTarget {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(rsv())
            .args(["target", "--tls-listen", "127.0.0.1:0", "--tls-cert"])
            .arg(&cert.cert)
            .arg("--tls-key")
            .arg(&cert.key)
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("target.log")).unwrap(),
            ))
            .spawn()
            .expect("starting rsv target");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (mut portal, mut iqn) = (String::new(), String::new());
        for line in out.lines() {
            let line = line.unwrap();
            if let Some(p) = line.strip_prefix("portal ") {
                portal = p.trim().to_owned();
            } else if let Some(t) = line.strip_prefix("target ") {
                iqn = t.trim().to_owned();
            } else if line.trim() == "ready" {
                break;
            }
        }
        assert!(!portal.is_empty(), "rsv target did not start");
        TlsTarget {
            child,
            portal,
            iqn,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("target.log")).unwrap_or_default()
    }
}

impl Drop for TlsTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn libiscsi_and_qemu_img_reach_a_tls_portal_through_an_stunnel_client() {
    if !have("stunnel") || !have("iscsi-inq") || !have("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let cert = ca.issue(dir.path(), "target", &["127.0.0.1"], false);
    let t = TlsTarget::start(&cert);
    let local = testkit::free_port();
    let tunnel = Stunnel::start(
        dir.path(),
        "client",
        &format!(
            "client = yes\nconnect = {}\nCAfile = {}\nverifyChain = yes\ncheckIP = 127.0.0.1\nsslVersionMin = TLSv1.3\n",
            t.portal,
            ca.cert.display()
        ),
        local,
    );
    let url = format!("iscsi://127.0.0.1:{local}/{}/0", t.iqn);
    let inq = run_ok("iscsi-inq", &[&url]);
    assert!(inq.contains("Vendor:RESERVOI"), "{inq}");
    // A few tests of libiscsi's suite through the tunnel.
    let out = run(
        "iscsi-test-cu",
        &[
            "-d",
            "-t",
            "SCSI.Read16.Simple,SCSI.Write16.Simple,SCSI.Inquiry.Standard",
            &url,
        ],
    );
    let text = said(&out);
    let (ran, _passed, failed) =
        cunit_summary(&text).unwrap_or_else(|| panic!("no summary:\n{text}"));
    assert!(ran >= 3, "{text}");
    assert_eq!(failed, 0, "{text}");
    // qemu-img writes an image through the tunnel and reads it back.
    qemu_round_trip(&url, dir.path(), 8 << 20, 5);
    // It was TLS: the target logged the logins as such, none in plain TCP.
    let log = t.log();
    assert!(log.contains("; TLSv1_3 TLS13_"), "{log}");
    assert!(!log.contains("plain TCP)"), "{log}");
    assert!(tunnel.log().contains("TLSv1.3"), "{}", tunnel.log());
}

#[test]
fn rsv_with_tls_reaches_tgt_behind_an_stunnel_server() {
    if !have("stunnel") {
        return;
    }
    let Some(tgt) = testkit::Tgt::start(64 << 20, None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let cert = ca.issue(dir.path(), "tgt", &["127.0.0.1"], false);
    let front = testkit::free_port();
    let tunnel = Stunnel::start(
        dir.path(),
        "server",
        &format!(
            "connect = {}\ncert = {}\nkey = {}\nsslVersionMin = TLSv1.3\n",
            tgt.portal(),
            cert.cert.display(),
            cert.key.display()
        ),
        front,
    );
    let img = dir.path().join("img");
    random_file(&img, 16 << 20, 9);
    let url = format!("iscsi://127.0.0.1:{front}/{}/1", tgt.iqn);
    let stdout = ok_stdout(
        Command::new(rsv())
            .args(["cp", "--json", "--verify", "--connections", "2", "--tls-ca"])
            .arg(&ca.cert)
            .arg(&img)
            .arg(&url),
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["verified"], true, "{stdout}");
    let tls = v["sessions"][0]["tls"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(tls.starts_with("TLSv1_3"), "{stdout}");
    // Without TLS the tunnel lets nothing through: stunnel wanted a handshake.
    let out = Command::new(rsv()).args(["inq", &url]).output().unwrap();
    assert!(!out.status.success());
    assert!(tunnel.log().contains("TLSv1.3"), "{}", tunnel.log());
}
