//! `rsv target` as a systemd `Type=notify` service, with a notify socket of the test's own
//! (PID 1 here is not systemd): READY=1 only once a login succeeds, RELOADING=1 (with
//! MONOTONIC_USEC) then READY=1 around a SIGHUP reload, WATCHDOG=1 at half the watchdog
//! interval while 64 sessions are served, STOPPING=1 at SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use testkit::notify::{next, until};
use testkit::output::said;
use testkit::Target;

const IQN: &str = "iqn.2026-11.org.reservoir:service";

fn config() -> String {
    format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nstore = \"ram:?size=8MiB\"\n")
}

#[test]
fn notify_protocol_ready_reloading_watchdog_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let target = Target::start_in_env(
        dir,
        Some(&config()),
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut pings = 0;
    let ready = until(&sock, "READY=1", &mut pings);
    assert!(
        ready.contains("STATUS=serving 1 target(s), 1 LUN(s)"),
        "{ready}"
    );
    // Ready means ready: a login succeeds at once.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = initiator::IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", target.portal)).unwrap();
    let opts = initiator::SessionOptions::default();
    let mut sessions = Vec::new();
    for _ in 0..64 {
        sessions.push(
            rt.block_on(initiator::Session::connect(&url, &opts))
                .unwrap(),
        );
    }
    // Pinged every 200 ms while 64 sessions are served: at least 5 in 2 s.
    pings = 0;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if next(&sock, Duration::from_millis(500)).is_some_and(|m| m.trim() == "WATCHDOG=1") {
            pings += 1;
        }
    }
    assert!(
        pings >= 5,
        "{pings} watchdog pings in 2 s at a 400 ms interval"
    );
    for s in &sessions {
        rt.block_on(s.test_unit_ready(0)).ok();
    }
    // A reload is bracketed by RELOADING=1 and READY=1.
    target.signal(libc::SIGHUP);
    let reloading = until(&sock, "RELOADING=1", &mut pings);
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    let ready = until(&sock, "READY=1", &mut pings);
    assert!(ready.contains("64 session(s)"), "{ready}");
    for s in sessions {
        rt.block_on(s.logout()).ok();
    }
    target.signal(libc::SIGTERM);
    until(&sock, "STOPPING=1", &mut pings);
}

fn packaging() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging")
}

/// Every unit passes `systemd-analyze verify` (with ExecStart pointing at this build's
/// rsv: the packaged path is not installed here) and every service's exposure by
/// `systemd-analyze security` is at most 4.0 (the goal for the target; the
/// others are lower).
#[test]
fn units_verify_and_are_hardened() {
    if !testkit::have("systemd-analyze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rsv = testkit::rsv();
    let mut units: Vec<_> = std::fs::read_dir(packaging().join("systemd"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    units.sort();
    assert!(units.len() >= 5, "{units:?}");
    // Copied first, all of them: a timer is verified with its service beside it, and a
    // template (reservoir-sync@.service) as an instance of it.
    let mut copies = Vec::new();
    for unit in &units {
        let name = unit
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .replace("@.", "@check.");
        let text = std::fs::read_to_string(unit).unwrap();
        if name.ends_with(".service") {
            assert!(text.contains("ExecStart=/usr/bin/rsv "), "{name}");
        }
        let here = dir.path().join(&name);
        std::fs::write(&here, text.replace("/usr/bin/rsv", rsv.to_str().unwrap())).unwrap();
        copies.push((name, here));
    }
    for (name, here) in copies {
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&here)
            .output()
            .unwrap();
        let printed = said(&out);
        assert!(
            out.status.success() && printed.trim().is_empty(),
            "{name}: {printed}"
        );
        if !name.ends_with(".service") {
            continue;
        }
        let out = std::process::Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&here)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let exposure: f64 = text
            .lines()
            .find_map(|l| l.split("exposure level for ").nth(1))
            .and_then(|l| l.split(": ").nth(1))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no exposure level in\n{text}"));
        eprintln!("{name}: exposure {exposure}");
        assert!(exposure <= 4.0, "{name}: exposure {exposure}");
    }
}

/// The packaged configuration is the embedded default written out, with its data in
/// /var/lib/reservoir.
#[test]
fn the_packaged_configuration_is_the_embedded_default() {
    let mut packaged = targetd::config::Config::load(&packaging().join("target.toml")).unwrap();
    assert_eq!(
        packaged.data_dir,
        std::path::Path::new("/var/lib/reservoir")
    );
    let default = targetd::config::Config::embedded_default();
    packaged.data_dir = default.data_dir.clone();
    // Config has no PartialEq: its Debug form shows every field.
    assert_eq!(format!("{packaged:#?}"), format!("{default:#?}"));
}

/// Under systemd, standard error is the journal (JOURNAL_STREAM names its device and
/// inode): one line per event without our own timestamp, which the journal adds.
#[test]
fn log_lines_fit_the_journal() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    // The harness writes standard error to target.log: made here first, it keeps its inode.
    let log = dir.path().join("target.log");
    std::fs::write(&log, "").unwrap();
    let m = std::fs::metadata(&log).unwrap();
    let stream = format!("{}:{}", m.dev(), m.ino());
    let journal = Target::start_in_env(dir, Some(&config()), &[("JOURNAL_STREAM", &stream)]);
    let plain = Target::start(Some(&config()));
    let first = |t: &Target| t.log().lines().next().unwrap_or_default().to_owned();
    let (j, p) = (first(&journal), first(&plain));
    assert!(j.starts_with(" INFO") || j.starts_with("INFO"), "{j}");
    assert!(
        p.starts_with("20"),
        "a timestamp first when not the journal: {p}"
    );
}
