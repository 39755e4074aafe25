//! The reader task of each connection: PDUs from the target routed to their tasks, large
//! Data-In read straight into their command's buffer, path samples for the tuner.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use iscsi::framing::{PduDecoder, PeekedHeader};
use iscsi::pdu::{async_event, NopOut, Opcode, Pdu, BHS_LEN, RESERVED_TAG};
use tokio::sync::watch;

use super::placed::{ReadSink, PLACE_MIN};
use super::tasks::Routed;
use super::Shared;
use crate::conn::{Conn, Reader};

impl Shared {
    pub(super) fn route(&self, conn: &Arc<Conn>, itt: u32, pdu: Pdu, placed: usize) {
        let st = self.state.lock().unwrap();
        match st.tasks.by_itt.get(&itt) {
            // Sending never blocks: it only queues and wakes the task.
            Some(t) => {
                t.tx.send(Routed {
                    pdu,
                    via: conn.clone(),
                    placed,
                });
            }
            None => {
                drop(st);
                tracing::debug!(itt, "{:?} for no known task", pdu.opcode())
            }
        }
    }

    /// Handles a PDU from the target; `placed` as in [`Routed`].
    pub(super) fn dispatch(self: &Arc<Self>, conn: &Arc<Conn>, pdu: Pdu, placed: usize) {
        let window = match &pdu {
            Pdu::ScsiResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::DataIn(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, p.status_present)),
            Pdu::R2t(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, false)),
            Pdu::NopIn(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, p.itt != RESERVED_TAG)),
            Pdu::TaskMgmtResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::TextResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::LogoutResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::AsyncMessage(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::Reject(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            _ => None,
        };
        if let Some((statsn, exp, max, advances)) = window {
            if advances {
                conn.advance_statsn(statsn);
            }
            self.update_window(exp, max);
        }
        match pdu {
            Pdu::NopIn(p) => {
                if p.ttt != RESERVED_TAG {
                    // The target pings us: answer with its TTT and data (RFC 7143 11.18).
                    let cmdsn = self.state.lock().unwrap().window.cmdsn;
                    conn.send(Pdu::NopOut(NopOut {
                        immediate: true,
                        lun: p.lun,
                        itt: RESERVED_TAG,
                        ttt: p.ttt,
                        cmdsn,
                        expstatsn: 0,
                        data: p.data.clone(),
                    }));
                }
                if p.itt != RESERVED_TAG {
                    self.route(conn, p.itt, Pdu::NopIn(p), 0);
                }
            }
            Pdu::AsyncMessage(m) => match m.async_event {
                async_event::LOGOUT_REQUESTED => {
                    tracing::warn!(
                        cid = conn.cid,
                        "target asks for a logout within {} s",
                        m.parameter3
                    );
                    tokio::spawn(self.clone().logout_requested(conn.clone(), m.parameter3));
                }
                async_event::CONNECTION_DROPPED | async_event::SESSION_DROPPED => {
                    tracing::warn!(
                        cid = conn.cid,
                        "target asks to end the connection (async event {})",
                        m.async_event
                    );
                    conn.kill();
                }
                e => tracing::debug!(cid = conn.cid, "async event {e}"),
            },
            Pdu::Reject(r) => {
                if r.data.len() >= 20 {
                    let itt = u32::from_be_bytes(r.data[16..20].try_into().unwrap());
                    self.route(conn, itt, Pdu::Reject(r), 0);
                } else {
                    tracing::warn!("Reject without the rejected header");
                }
            }
            other => {
                let itt = other.itt();
                self.route(conn, itt, other, placed);
            }
        }
    }

    /// The buffer of the read that the Data-In `h` carries data for, taken out of its
    /// sink to read the segment into, when the segment is large, comes next in it and
    /// fits. `None`: decode the PDU as usual.
    pub(super) fn sink_for(&self, h: &PeekedHeader) -> Option<(Arc<ReadSink>, Vec<u8>)> {
        if h.bhs[0] & 0x3f != Opcode::DataIn as u8
            || h.data_len < PLACE_MIN
            || !h.data_len.is_multiple_of(4)
        {
            return None;
        }
        let itt = u32::from_be_bytes(h.bhs[16..20].try_into().unwrap());
        let off = u32::from_be_bytes(h.bhs[40..44].try_into().unwrap()) as usize;
        let sink = self
            .state
            .lock()
            .unwrap()
            .tasks
            .by_itt
            .get(&itt)?
            .sink
            .clone()?;
        if off + h.data_len > sink.edtl {
            return None;
        }
        let mut v = {
            let mut g = sink.buf.lock().unwrap();
            if g.as_ref().map(Vec::len) != Some(off) {
                return None;
            }
            g.take()?
        };
        if v.capacity() == 0 {
            v = sink.pool.take(sink.edtl);
        }
        Some((sink, v))
    }
}

/// Gives a PDU the reader decoded a data segment of its own. The decoder's segment is a
/// slice of the reader's buffer, and even an empty one holds a reference to it: while any
/// PDU handed to a task lives (a read's Data-In until its caller drops the data), the
/// buffer is shared, and each reserve in the reader then allocates a fresh one, whose
/// pages fault in as the socket fills them, and which the allocator gets from the kernel
/// with brk or mmap and gives back again. A small segment's copy lands in memory the
/// allocator just freed, still in the cache; large ones go to their read's buffer
/// ([`ReadSink`]) and do not come here unless out of order.
pub(super) fn detach_data(pdu: &mut Pdu) {
    let data = match pdu {
        Pdu::NopOut(p) => &mut p.data,
        Pdu::ScsiCommand(p) => &mut p.data,
        Pdu::LoginRequest(p) => &mut p.data,
        Pdu::TextRequest(p) => &mut p.data,
        Pdu::DataOut(p) => &mut p.data,
        Pdu::NopIn(p) => &mut p.data,
        Pdu::ScsiResponse(p) => &mut p.data,
        Pdu::LoginResponse(p) => &mut p.data,
        Pdu::TextResponse(p) => &mut p.data,
        Pdu::DataIn(p) => &mut p.data,
        Pdu::AsyncMessage(p) => &mut p.data,
        Pdu::Reject(p) => &mut p.data,
        Pdu::TaskMgmtRequest(_)
        | Pdu::LogoutRequest(_)
        | Pdu::SnackRequest(_)
        | Pdu::TaskMgmtResponse(_)
        | Pdu::LogoutResponse(_)
        | Pdu::R2t(_) => return,
    };
    *data = Bytes::copy_from_slice(data);
}

/// Bytes of data a connection's reader hands to commands before it lets them run. Left
/// alone, it goes on until the socket is drained or tokio's budget runs out, which with a
/// target streaming 1 MiB reads is some 17 reads: 17 buffers filled before any caller
/// takes its data and frees its buffer, so each new read lands in memory long out of the
/// CPU's caches. Yielding once per 1 MiB lets the callers drop their data and the pool
/// hand the same few buffers out again: the kernel's copy into them, most of the
/// initiator's CPU time for large reads, got some 20 % cheaper per read on loopback.
pub(super) const YIELD_BYTES: usize = 1 << 20;

/// How often the reader looks at the socket's acknowledgements.
const QUIET_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) async fn reader(
    shared: Weak<Shared>,
    conn: Arc<Conn>,
    mut rd: Reader,
    mut buf: BytesMut,
    mut dec: PduDecoder,
    mut dead: watch::Receiver<bool>,
) {
    // The first read samples at once; later ones once per interval, so that the hot path
    // pays one clock read per socket read.
    let mut next_sample = Instant::now();
    let Some(epoch) = shared.upgrade().map(|s| s.epoch) else {
        return;
    };
    // After a segment was read into its command's buffer, the next read takes only the
    // next header, so that the segment after it (a read's next Data-In, typically) can go
    // straight to its place too rather than into `buf`.
    let header_only = BHS_LEN + if dec.digests().header { 4 } else { 0 };
    let mut read_limit = usize::MAX;
    // Data bytes handed to tasks since the reader last let them run.
    let mut moved = 0usize;
    let quiet = tokio::time::sleep(QUIET_LOOK);
    tokio::pin!(quiet);
    let why: String = 'outer: loop {
        loop {
            let Some(s) = shared.upgrade() else { return };
            let h = match dec.peek_header(&buf) {
                Ok(h) => h,
                Err(e) => break 'outer format!("bad PDU from the target: {e}"),
            };
            if let Some((h, sink, mut v)) = h.and_then(|h| s.sink_for(&h).map(|(k, v)| (h, k, v))) {
                drop(s);
                let pdu = match dec.take_header(&mut buf, &h) {
                    Ok(p) => p,
                    Err(e) => {
                        *sink.buf.lock().unwrap() = Some(v);
                        break 'outer format!("bad PDU from the target: {e}");
                    }
                };
                let committed = v.len();
                let have = buf.len().min(h.data_len);
                v.extend_from_slice(&buf[..have]);
                buf.advance(have);
                let rest = h.data_len - have;
                let r = if rest > 0 {
                    read_limit = header_only;
                    tokio::select! {
                        r = rd.read_exact_into(&mut v, rest) => r.map_err(|e| e.to_string()),
                        _ = dead.changed() => Err("closed".to_owned()),
                    }
                } else {
                    Ok(())
                };
                if r.is_err() {
                    v.truncate(committed);
                }
                *sink.buf.lock().unwrap() = Some(v);
                if let Err(why) = r {
                    break 'outer why;
                }
                match shared.upgrade() {
                    Some(s) => s.dispatch(&conn, pdu, h.data_len),
                    None => return,
                }
                // The tasks this reader woke run now and then (see YIELD_BYTES).
                moved += h.data_len;
                if moved >= YIELD_BYTES {
                    moved = 0;
                    tokio::task::yield_now().await;
                }
                continue;
            }
            match dec.decode(&mut buf) {
                Ok(Some(mut pdu)) => {
                    moved += pdu.data().len();
                    detach_data(&mut pdu);
                    s.dispatch(&conn, pdu, 0);
                    if moved >= YIELD_BYTES {
                        moved = 0;
                        drop(s);
                        tokio::task::yield_now().await;
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer format!("bad PDU from the target: {e}"),
            }
        }
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        let mut dst = (&mut buf).limit(std::mem::replace(&mut read_limit, usize::MAX));
        tokio::select! {
            // Once a second, arriving bytes or not: the keepalive wants to know whether
            // ours still reach the target.
            _ = &mut quiet => {
                if let Some(fd) = rd.socket() {
                    conn.note_acked(fd);
                }
                quiet.as_mut().reset(tokio::time::Instant::now() + QUIET_LOOK);
            }
            r = rd.fill(&mut dst) => match r {
                Ok(0) => break "closed by the target".to_owned(),
                Ok(_) => {
                    let now = Instant::now();
                    conn.last_rx_ms
                        .store(now.duration_since(epoch).as_millis() as u64, Ordering::Relaxed);
                    if now >= next_sample {
                        if let Some(s) = shared.upgrade() {
                            next_sample = now + s.sample_every();
                            s.observe(&conn, &rd);
                        }
                    }
                }
                Err(e) => break e.to_string(),
            },
            _ = conn.repace.notified() => {
                if let Some(s) = shared.upgrade() {
                    s.repace(&conn, &rd);
                }
            }
            _ = dead.changed() => break "closed".to_owned(),
        }
    };
    if let Some(s) = shared.upgrade() {
        s.conn_failed(&conn, &why);
    }
}
