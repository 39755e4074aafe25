//! NOP-Out pings on idle connections.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use iscsi::pdu::{NopOut, Pdu, RESERVED_TAG};

use super::Shared;

/// Pings idle connections with NOP-Out; one that does not answer is dropped (and the
/// session recovered by the next command that needs it).
pub(super) async fn keepalive(shared: Weak<Shared>) {
    loop {
        let interval = match shared.upgrade() {
            Some(s) => s.opts.nop_interval,
            None => return,
        };
        tokio::time::sleep(interval / 2).await;
        let Some(s) = shared.upgrade() else { return };
        let (conns, closed) = {
            let st = s.state.lock().unwrap();
            (st.conns.all.clone(), st.conns.closed)
        };
        if closed {
            return;
        }
        let now = s.epoch.elapsed().as_millis() as u64;
        for c in conns {
            let idle = now.saturating_sub(c.last_rx_ms.load(Ordering::Relaxed));
            if !c.is_alive()
                || idle < interval.as_millis() as u64
                || c.pinging.swap(true, Ordering::AcqRel)
            {
                continue;
            }
            let s2 = s.clone();
            tokio::spawn(async move {
                let (guard, mut rx) = s2.register(&c);
                let cmdsn = s2.state.lock().unwrap().window.cmdsn;
                c.send(Pdu::NopOut(NopOut {
                    immediate: true,
                    lun: 0,
                    itt: guard.itt,
                    ttt: RESERVED_TAG,
                    cmdsn,
                    expstatsn: 0,
                    data: Bytes::new(),
                }));
                let timeout = (interval * 2).max(Duration::from_secs(5));
                // Over a long, full path the answer may wait behind seconds of our own
                // data: while the target's TCP keeps acknowledging it, keep waiting (up
                // to the command timeout); a connection that moves nothing is dropped.
                let give_up = tokio::time::Instant::now() + timeout.max(s2.opts.command_timeout);
                let mut acked = c.acked.load(Ordering::Relaxed);
                loop {
                    match tokio::time::timeout(timeout, rx.recv()).await {
                        Ok(_) => break,
                        Err(_) => {
                            let now_acked = c.acked.load(Ordering::Relaxed);
                            if now_acked > acked && tokio::time::Instant::now() < give_up {
                                tracing::debug!(
                                    cid = c.cid,
                                    "NOP-Out not answered yet; the target acknowledges data, waiting"
                                );
                                acked = now_acked;
                                continue;
                            }
                            tracing::warn!(
                                cid = c.cid,
                                "no answer to NOP-Out; dropping the connection"
                            );
                            c.kill();
                            break;
                        }
                    }
                }
                drop(guard);
                c.pinging.store(false, Ordering::Release);
            });
        }
    }
}
