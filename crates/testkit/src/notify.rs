//! The receiving end of systemd's notify protocol for tests: a datagram socket of the
//! test's own as NOTIFY_SOCKET (PID 1 here is not systemd).

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// The next notification, within `wait`.
pub fn next(sock: &UnixDatagram, wait: Duration) -> Option<String> {
    sock.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Notifications until one starts with `what` (the others, watchdog pings, are counted).
pub fn until(sock: &UnixDatagram, what: &str, pings: &mut usize) -> String {
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
