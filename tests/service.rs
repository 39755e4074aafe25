//! `rsv target` as a systemd `Type=notify` service, with a notify socket of the test's own
//! (PID 1 here is not systemd): READY=1 only once a login succeeds, RELOADING=1 (with
//! MONOTONIC_USEC) then READY=1 around a SIGHUP reload, WATCHDOG=1 at half the watchdog
//! interval while 64 sessions are served, STOPPING=1 at SIGTERM.
mod common;

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use common::Target;

const IQN: &str = "iqn.2026-11.org.reservoir:service";

fn config() -> String {
    format!("[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nstore = \"ram:?size=8MiB\"\n")
}

/// The next notification, within `wait`.
fn next(sock: &UnixDatagram, wait: Duration) -> Option<String> {
    sock.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Notifications until one starts with `what` (the others, watchdog pings, are counted).
fn until(sock: &UnixDatagram, what: &str, pings: &mut usize) -> String {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Some(m) = next(sock, Duration::from_secs(1)) {
            if m.starts_with(what) {
                return m;
            }
            if m.trim() == "WATCHDOG=1" {
                *pings += 1;
            }
        }
    }
    panic!("no {what} within 20 s");
}

#[test]
fn notify_protocol_ready_reloading_watchdog_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let mut target = Target::start_in_env(
        dir,
        Some(&config()),
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut pings = 0;
    let ready = until(&sock, "READY=1", &mut pings);
    assert!(ready.contains("STATUS=serving 1 target(s), 1 LUN(s)"), "{ready}");
    // Ready means ready: a login succeeds at once.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = initiator::IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", target.portal)).unwrap();
    let opts = initiator::SessionOptions::default();
    let mut sessions = Vec::new();
    for _ in 0..64 {
        sessions.push(rt.block_on(initiator::Session::connect(&url, &opts)).unwrap());
    }
    // Pinged every 200 ms while 64 sessions are served: at least 5 in 2 s.
    pings = 0;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if next(&sock, Duration::from_millis(500)).is_some_and(|m| m.trim() == "WATCHDOG=1") {
            pings += 1;
        }
    }
    assert!(pings >= 5, "{pings} watchdog pings in 2 s at a 400 ms interval");
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
