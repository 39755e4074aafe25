//! systemd's notify protocol (sd_notify(3)) for `rsv target` run as a `Type=notify`
//! service: READY=1 once the portals listen and the LUNs are open, RELOADING=1 then
//! READY=1 around a SIGHUP reload, STOPPING=1 at shutdown, and WATCHDOG=1 while the
//! threads that serve connections answer. Without NOTIFY_SOCKET (not under systemd)
//! every call does nothing.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tracing::warn;

use crate::shared::Shared;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!("telling the service manager {states:?}: {e}");
    }
}

pub(crate) fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Before a reload; `ready` follows it, whatever its outcome. systemd wants the
/// monotonic time with RELOADING=1 (Type=notify-reload) and takes it with Type=notify.
pub(crate) fn reloading() {
    let mut states = vec![NotifyState::Reloading];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

pub(crate) fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// Pings the watchdog at half its interval, each time after every connection thread has
/// run a task (`Shared::serving`): a target whose connection threads are stuck stops
/// pinging and systemd restarts it. Never returns; without a watchdog it waits forever.
pub(crate) async fn watchdog(shared: Arc<Shared>) -> std::convert::Infallible {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return std::future::pending().await;
    };
    let every = interval / 2;
    loop {
        tokio::time::sleep(every).await;
        if shared.serving(every).await {
            send(&[NotifyState::Watchdog]);
        } else {
            warn!("a connection thread did not answer within {every:?}: no watchdog ping");
        }
    }
}

/// How long the watchdog interval is, for the log; `None` without one.
pub(crate) fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}
