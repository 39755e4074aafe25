//! The initiator against tgt, a standard target, started by each test.

use initiator::{Error, IscsiUrl, Session, SessionOptions};
use testkit::*;
use tools::cli::{self, SessionFlags};

const MIB: u64 = 1 << 20;

macro_rules! tgt_or_skip {
    ($size:expr, $chap:expr) => {
        match Tgt::start($size, $chap) {
            Some(t) => t,
            None => {
                skip("tgtd/tgtadm not installed");
                return;
            }
        }
    };
}

#[test]
fn ls_and_inq() {
    let tgt = tgt_or_skip!(64 * MIB, None);
    let rt = rt();
    let portal = IscsiUrl::parse(&format!("iscsi://{}/", tgt.portal())).unwrap();
    let listing = rt
        .block_on(cli::list(&portal, &SessionFlags::default()))
        .unwrap();
    assert_eq!(listing.len(), 1, "{listing:?}");
    assert_eq!(listing[0].target, tgt.iqn);
    assert!(listing[0]
        .portals
        .iter()
        .any(|p| p.starts_with(&tgt.portal())));
    let lun1 = listing[0].luns.iter().find(|l| l.lun == 1).expect("LUN 1");
    assert_eq!(lun1.device_type, "disk");
    assert_eq!(lun1.size_bytes, Some(64 * MIB));
    assert_eq!(lun1.block_size, Some(512));

    let url = IscsiUrl::parse(&tgt.url(1)).unwrap();
    let inq = rt
        .block_on(cli::inquire(&url, &SessionFlags::default()))
        .unwrap();
    assert_eq!(inq.standard.device_type, 0);
    assert!(!inq.standard.vendor.is_empty());
    assert!(inq.supported_vpd_pages.contains(&0x83), "{inq:?}");
    assert!(!inq.designators.is_empty());
    assert_eq!(inq.capacity.as_ref().unwrap().bytes(), 64 * MIB);
    serde_json::to_string(&inq).unwrap();
}

#[test]
fn errors_say_what_failed() {
    let tgt = tgt_or_skip!(8 * MIB, None);
    let rt = rt();
    let o = SessionOptions::default();
    let bad_target =
        IscsiUrl::parse(&format!("iscsi://{}/iqn.2026-01.nope:x/1", tgt.portal())).unwrap();
    let e = rt
        .block_on(Session::connect(&bad_target, &o))
        .err()
        .unwrap();
    assert!(matches!(e, Error::LoginRefused { class: 2, .. }), "{e}");
    assert!(e.to_string().contains("rsv ls"), "{e}");

    let closed = IscsiUrl::parse(&format!("iscsi://127.0.0.1:{}/x/1", free_port())).unwrap();
    let e = rt.block_on(Session::connect(&closed, &o)).err().unwrap();
    assert!(matches!(e, Error::Unreachable { .. }), "{e}");

    let url = IscsiUrl::parse(&tgt.url(9)).unwrap();
    let e = rt
        .block_on(cli::inquire(&url, &SessionFlags::default()))
        .err()
        .unwrap();
    assert!(matches!(e, Error::LunNotFound { lun: 9, .. }), "{e}");
}

#[test]
fn chap_one_way_and_mutual() {
    let tgt = tgt_or_skip!(
        8 * MIB,
        Some(Chap {
            user: "alice",
            password: "alicesecret12",
            target: Some(("tgtuser", "targetsecret12")),
        })
    );
    let rt = rt();
    let o = SessionOptions::default();
    let good = IscsiUrl::parse(&format!(
        "iscsi://alice%alicesecret12@{}/{}/1",
        tgt.portal(),
        tgt.iqn
    ))
    .unwrap();
    let s = rt.block_on(Session::connect(&good, &o)).unwrap();
    let cap = rt.block_on(s.read_capacity(1)).unwrap();
    assert_eq!(cap.bytes(), 8 * MIB);
    rt.block_on(s.logout()).unwrap();

    let wrong = IscsiUrl::parse(&format!(
        "iscsi://alice%wrongsecret12@{}/{}/1",
        tgt.portal(),
        tgt.iqn
    ))
    .unwrap();
    let e = rt.block_on(Session::connect(&wrong, &o)).err().unwrap();
    assert!(matches!(e, Error::Auth { .. }), "{e}");

    let none = IscsiUrl::parse(&tgt.url(1)).unwrap();
    let e = rt.block_on(Session::connect(&none, &o)).err().unwrap();
    assert!(matches!(e, Error::Auth { .. }), "{e}");

    let mutual = SessionOptions {
        target_secret: Some("targetsecret12".into()),
        ..o.clone()
    };
    let s = rt.block_on(Session::connect(&good, &mutual)).unwrap();
    rt.block_on(s.logout()).unwrap();

    let bad_mutual = SessionOptions {
        target_secret: Some("notthetarget1".into()),
        ..o
    };
    let e = rt
        .block_on(Session::connect(&good, &bad_mutual))
        .err()
        .unwrap();
    assert!(matches!(e, Error::Auth { .. }), "{e}");
}

#[test]
fn cp_image_to_lun_and_back_with_verify() {
    let size = 96 * MIB;
    let tgt = tgt_or_skip!(size, None);
    tgt.set_param("HeaderDigest", "CRC32C");
    tgt.set_param("DataDigest", "CRC32C");
    // Immediate data and unsolicited Data-Out rather than R2T only.
    tgt.set_param("InitialR2T", "No");
    tgt.set_param("FirstBurstLength", "262144");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    let back = dir.path().join("back");
    random_file_with_holes(&img, size as usize, 1);
    let url = tgt.url(1);
    let s = rt()
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &url,
            "--verify",
            "--queue-depth",
            "16",
            "--header-digest",
            "--data-digest",
        ])))
        .unwrap();
    assert_eq!(s.bytes, size);
    assert!(s.verified && s.checksum.is_some());
    assert_eq!(s.skipped_zero_bytes, 0, "a LUN is not known zero");
    let info = &s.sessions[0];
    assert!(info.header_digest && info.data_digest, "{info:?}");
    assert!(!info.initial_r2t && info.immediate_data, "{info:?}");
    let s2 = rt()
        .block_on(cli::copy(&cp_args(&[
            &url,
            back.to_str().unwrap(),
            "--verify",
        ])))
        .unwrap();
    assert_eq!(s2.checksum, s.checksum);
    assert!(
        s2.skipped_zero_bytes > 0,
        "zero chunks go unwritten to a fresh file"
    );
    assert!(same_files(&img, &back));
}

/// tgt grants ErrorRecoveryLevel 0 only: the initiator falls back to session
/// reinstatement and reissue.
#[test]
fn cp_survives_a_cut_connection() {
    let size = 64 * MIB;
    let tgt = tgt_or_skip!(size, None);
    let proxy = CuttingProxy::start(tgt.portal(), 24 * MIB as usize);
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    let back = dir.path().join("back");
    random_file_with_holes(&img, size as usize, 2);
    let url = format!("iscsi://{}/{}/1", proxy.portal, tgt.iqn);
    let s = rt()
        .block_on(cli::copy(&cp_args(&[img.to_str().unwrap(), &url])))
        .unwrap();
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    // We ask for ErrorRecoveryLevel 2; tgt grants 0, so recovery is by reinstatement.
    assert_eq!(s.sessions[0].error_recovery_level, 0, "{s:?}");
    assert_eq!(s.reassigned_tasks, 0, "{s:?}");
    assert!(s.reinstatements >= 1, "{s:?}");
    assert!(s.retries >= 1, "{s:?}");
    rt().block_on(cli::copy(&cp_args(&[&url, back.to_str().unwrap()])))
        .unwrap();
    assert!(same_files(&img, &back));
}

/// tgt does not know X-org.reservoir.PacingRate: it answers NotUnderstood, every
/// connection logs in as without the key, and the session reports the target unpaced.
#[test]
fn pacing_hint_not_understood_by_tgt_leaves_the_login_intact() {
    let tgt = tgt_or_skip!(8 * MIB, None);
    let rt = rt();
    let url = IscsiUrl::parse(&tgt.url(1)).unwrap();
    let mut o = SessionOptions::default();
    o.set("connections", "2").unwrap();
    o.set("pacing_rate", "80mbit").unwrap();
    let s = rt.block_on(Session::connect(&url, &o)).unwrap();
    let info = s.info();
    let p = &info.target_pacing;
    assert_eq!(p.requested, Some(10_000_000));
    assert_eq!(p.paced_connections, 0);
    assert_eq!(p.connections.len(), info.connections);
    assert!(
        p.connections.iter().all(|c| c.answer == "not understood"),
        "{p:?}"
    );
    assert!(p.summary().contains("not understood"), "{}", p.summary());
    let data = rt.block_on(s.read(1, 0, 64)).unwrap();
    assert_eq!(data.len(), 64 * 512);
    rt.block_on(s.logout()).unwrap();
}

/// The rate control asks a target in full feature phase only when it knew the pacing key
/// at login: tgt answers NotUnderstood there, and a Text request with the key would make
/// it reset the connection. So with `rate_control=yes` a session to tgt runs on, paced on
/// our side only, without a single reinstatement.
#[test]
fn rate_control_sends_tgt_no_hints() {
    let tgt = tgt_or_skip!(16 * MIB, None);
    let rt = rt();
    let url = IscsiUrl::parse(&tgt.url(1)).unwrap();
    let mut o = SessionOptions::default();
    o.set("rate_control", "yes").unwrap();
    let s = rt.block_on(Session::connect(&url, &o)).unwrap();
    let depth = s.queue_depth();
    let limit = std::time::Duration::from_secs(30);
    rt.block_on(busy_until(&s, 1, depth, limit, |s| {
        s.info()
            .rate_control
            .is_some_and(|r| r.pacing_bytes_per_s.is_some())
    }));
    // A few more samples in cruise, where a hint would go out.
    let more = std::time::Duration::from_millis(500);
    rt.block_on(busy_until(&s, 1, depth, more, |_| false));
    let info = s.info();
    let rc = info.rate_control.clone().unwrap();
    assert_eq!(rc.phase, "cruise", "{rc:?}");
    assert!(
        info.target_pacing
            .connections
            .iter()
            .all(|c| c.answer == "not understood"),
        "{:?}",
        info.target_pacing
    );
    assert_eq!((s.reinstatements(), s.retries()), (0, 0));
    rt.block_on(s.logout()).unwrap();
}
