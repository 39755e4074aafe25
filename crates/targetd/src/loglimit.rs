//! A cap on the log lines peers can cause: a flood of refused logins, malformed PDUs or
//! connections that close at once must not fill the disk with log lines. Such lines go
//! through [`peer_log!`]: at most [`PER_SECOND`] a second for the whole target; the rest
//! are counted, and the next line let through says how many were left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines a second that peers may cause.
pub(crate) const PER_SECOND: u32 = 20;

#[derive(Debug, Default)]
struct Window {
    start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

/// One second's budget of lines, and the count of lines left out.
#[derive(Debug)]
pub(crate) struct Limiter {
    per_second: u32,
    window: Mutex<Window>,
}

impl Limiter {
    pub(crate) const fn new(per_second: u32) -> Limiter {
        Limiter {
            per_second,
            window: Mutex::new(Window {
                start: None,
                used: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may go out at `now`: `Some(n)` with the lines left out since the
    /// last one that went, `None` to leave this one out too.
    pub(crate) fn allow(&self, now: Instant) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.start
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            w.start = Some(now);
            w.used = 0;
        }
        if w.used >= self.per_second {
            w.suppressed += 1;
            return None;
        }
        w.used += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

/// The limiter of every line a peer can cause.
pub(crate) static PEERS: Limiter = Limiter::new(PER_SECOND);

/// `tracing`'s `info!`/`warn!`/`debug!` for a line a peer causes, under [`PEERS`].
macro_rules! peer_log {
    ($level:ident, $($arg:tt)+) => {
        if let Some(left_out) = $crate::loglimit::PEERS.allow(std::time::Instant::now()) {
            if left_out > 0 {
                tracing::$level!(
                    "{} ({left_out} similar lines left out before this one)",
                    format_args!($($arg)+)
                );
            } else {
                tracing::$level!($($arg)+);
            }
        }
    };
}
pub(crate) use peer_log;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holds_so_many_lines_and_the_next_says_how_many_were_left_out() {
        let l = Limiter::new(3);
        let t0 = Instant::now();
        assert_eq!(l.allow(t0), Some(0));
        assert_eq!(l.allow(t0), Some(0));
        assert_eq!(l.allow(t0 + Duration::from_millis(500)), Some(0));
        for _ in 0..100 {
            assert_eq!(l.allow(t0 + Duration::from_millis(900)), None);
        }
        assert_eq!(l.allow(t0 + Duration::from_millis(1000)), Some(100));
        assert_eq!(l.allow(t0 + Duration::from_millis(1100)), Some(0));
        assert_eq!(l.allow(t0 + Duration::from_millis(1200)), Some(0));
        assert_eq!(l.allow(t0 + Duration::from_millis(1300)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(5)), Some(1));
    }
}
