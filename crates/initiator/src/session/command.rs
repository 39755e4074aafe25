//! One try at a SCSI command: its CmdSN and ITT, the PDUs that carry it and its data,
//! and the answers that end it; task management requests.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi::ffp::{self, tmf};
use iscsi::negotiate::SessionParams;
use iscsi::pdu::{lun_to_wire, DataOut, Pdu, ScsiCommand, TaskMgmtRequest, RESERVED_TAG};

use super::placed::{ReadData, ReadSink, PLACE_MIN};
use super::tasks::{recv_pdu, Reassignable, Routed, TaskGuard};
use super::{DataDir, ScsiResult, Shared};
use crate::conn::Conn;
use crate::scsi::Sense;
use crate::{Error, Result};

pub(super) enum Attempt {
    /// The connection went away: reinstate the session (if nobody did yet) and retry.
    Lost {
        gen: u64,
        why: String,
        /// The command was sent on this connection (serial, CmdSN): it may be recovered
        /// on the others while the session goes on.
        sent: Option<(u64, u32)>,
    },
    /// The command was aborted after a timeout; retry without recovery.
    Aborted,
    Fatal(Error),
}

impl Shared {
    /// One try at a command: wait for a CmdSN in the window, send the command with its
    /// unsolicited data, answer R2Ts and collect Data-In until the status arrives.
    pub(super) async fn attempt(
        &self,
        lun: u16,
        cdb: &[u8],
        dir: &DataDir,
        plug: Option<u32>,
        internal: bool,
    ) -> Result<ScsiResult, Attempt> {
        let (edtl, read, write) = match dir {
            DataDir::None => (0u32, false, None),
            DataDir::Read(n) => (*n, true, None),
            DataDir::Write(d) => (
                u32::try_from(d.len())
                    .map_err(|_| Attempt::Fatal(Error::Option("write larger than 4 GiB".into())))?,
                false,
                Some(d),
            ),
        };
        let wire_lun = lun_to_wire(lun);
        // Set when the command first has to wait for the window (or a connection).
        let mut wait_start = None;
        let exp_datasn = Arc::new(AtomicU32::new(0));
        let sink = (read && edtl as usize >= PLACE_MIN).then(|| {
            Arc::new(ReadSink {
                edtl: edtl as usize,
                buf: Mutex::new(Some(Vec::new())),
                pool: self.bufs.clone(),
            })
        });
        let weight = u64::from(edtl) + 4096;
        let (conn, itt, id, cmdsn, mut rx) = loop {
            // Registered before the state is looked at, so that no opening of the window
            // is missed; only once the command had to wait (the first look is free).
            let notified = wait_start.map(|_| self.window_waiters.notified());
            tokio::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            {
                let mut st = self.state.lock().unwrap();
                if st.conns.closed {
                    return Err(Attempt::Fatal(Error::Closed));
                }
                // Held after a move to another gateway: only the session's own
                // commands (ALUA states, the registration) go before the others.
                let held = st.conns.held && !internal;
                let conn = if held {
                    None
                } else {
                    st.conns.pick_for(weight)
                };
                let conn = match conn {
                    Some(c) => Some(c),
                    // ERL 2: the lost connection is on its way back; wait for it.
                    None if st.conns.recovering() || held => None,
                    None => {
                        return Err(Attempt::Lost {
                            gen: st.conns.gen,
                            why: "no connection left".into(),
                            sent: None,
                        })
                    }
                };
                // A plug reuses the CmdSN of a command the target never received, which
                // was inside the window when first sent; a fresh ITT, because the target
                // may still be forgetting the old one.
                if let Some(conn) = conn.filter(|_| plug.is_some() || st.window.is_open()) {
                    let cmdsn = plug.unwrap_or_else(|| st.window.take());
                    let (itt, id, rx) = st.tasks.new_task(
                        &conn,
                        Some(Reassignable {
                            lun,
                            cmdsn,
                            exp_datasn: exp_datasn.clone(),
                        }),
                        sink.clone(),
                    );
                    // Counted under the lock, so that the next command's pick sees it.
                    conn.outstanding.fetch_add(weight, Ordering::Relaxed);
                    // Sent under the lock so that each connection carries CmdSNs in order.
                    self.send_command(
                        &st.conns.params,
                        &conn,
                        wire_lun,
                        itt,
                        cmdsn,
                        cdb,
                        edtl,
                        read,
                        write,
                    );
                    break (conn, itt, id, cmdsn, rx);
                }
            }
            let Some(since) = wait_start else {
                // Look again, now registered for the window's opening.
                wait_start = Some(Instant::now());
                continue;
            };
            if since.elapsed() > self.opts.command_timeout {
                let gen = self.state.lock().unwrap().conns.gen;
                return Err(Attempt::Lost {
                    gen,
                    why: "the target's command window stayed closed".into(),
                    sent: None,
                });
            }
            if let Some(n) = notified.as_pin_mut() {
                let _ = tokio::time::timeout(Duration::from_millis(500), n).await;
            }
        };
        let mut guard = TaskGuard {
            shared: self,
            itt,
            id,
            conn: conn.clone(),
            weight,
        };
        let mut conn = conn;
        let mut data_in = ReadData {
            sink,
            ..ReadData::default()
        };
        let protocol = |m: String| Attempt::Fatal(Error::Protocol(m));
        loop {
            let (pdu, placed) =
                match tokio::time::timeout(self.opts.command_timeout, rx.recv()).await {
                    Ok(Some(Routed { pdu, via, placed })) => {
                        if via.serial != conn.serial {
                            // Reassigned (ERL 2): R2Ts are answered where they come from.
                            guard.move_to(&via);
                            conn = via;
                        }
                        (pdu, placed)
                    }
                    Ok(None) => {
                        return Err(Attempt::Lost {
                            gen: conn.gen,
                            why: format!("connection {} failed", conn.cid),
                            sent: Some((conn.serial, cmdsn)),
                        })
                    }
                    Err(_) => {
                        tracing::warn!(itt, "command 0x{:02x} timed out; aborting it", cdb[0]);
                        // Boxed: a rare branch, kept out of every command's future.
                        let abort = self.task_mgmt(&conn, tmf::ABORT_TASK, lun, itt, cmdsn, 0);
                        return match Box::pin(abort).await {
                            Ok(_) => Err(Attempt::Aborted),
                            Err(_) => {
                                conn.kill();
                                Err(Attempt::Lost {
                                    gen: conn.gen,
                                    why: "command and abort timed out".into(),
                                    sent: None,
                                })
                            }
                        };
                    }
                };
            match pdu {
                Pdu::DataIn(d) => {
                    let off = d.buffer_offset as usize;
                    let end = off + d.data.len() + placed;
                    if !read || end > edtl as usize {
                        return Err(protocol(format!(
                            "Data-In at {off}..{end} beyond the expected {} bytes",
                            if read { edtl } else { 0 }
                        )));
                    }
                    if placed > 0 {
                        data_in.placed(off, placed);
                    } else {
                        data_in.add(off, d.data);
                    }
                    let _ = exp_datasn.compare_exchange(
                        d.datasn,
                        d.datasn.wrapping_add(1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if d.status_present {
                        let residual = if d.underflow { d.residual_count } else { 0 };
                        return Ok(ScsiResult {
                            status: d.status,
                            sense: None,
                            data: data_in.into_bytes(edtl, residual),
                            residual,
                        });
                    }
                }
                Pdu::R2t(r) => {
                    let Some(data) = write else {
                        return Err(protocol("R2T for a command without write data".into()));
                    };
                    let off = r.buffer_offset as usize;
                    let end = off + r.desired_data_transfer_length as usize;
                    if end > data.len() {
                        return Err(protocol(format!(
                            "R2T for {off}..{end} beyond the {} bytes of the write",
                            data.len()
                        )));
                    }
                    send_data_out(&conn, wire_lun, itt, r.ttt, data, off, end);
                }
                Pdu::ScsiResponse(r) => {
                    if r.response != 0 {
                        return Err(Attempt::Fatal(Error::Response(r.response)));
                    }
                    let residual = if r.underflow { r.residual_count } else { 0 };
                    return Ok(ScsiResult {
                        status: r.status,
                        sense: r.sense().and_then(Sense::parse),
                        data: if read {
                            data_in.into_bytes(edtl, residual)
                        } else {
                            Bytes::new()
                        },
                        residual,
                    });
                }
                Pdu::Reject(r) => {
                    return Err(protocol(format!(
                        "target rejected command 0x{:02x} (reason 0x{:02x})",
                        cdb[0], r.reason
                    )))
                }
                other => {
                    return Err(protocol(format!(
                        "unexpected {:?} for a SCSI command",
                        other.opcode()
                    )))
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_command(
        &self,
        params: &SessionParams,
        conn: &Conn,
        lun: u64,
        itt: u32,
        cmdsn: u32,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        write: Option<&Bytes>,
    ) {
        let plan = match write {
            Some(_) => ffp::WritePlan::initiator(
                edtl,
                &ffp::DataRules::from(params),
                conn.max_send_segment,
            ),
            None => ffp::WritePlan {
                immediate: 0,
                unsolicited_end: 0,
            },
        };
        let (immediate_len, unsolicited_end) =
            (plan.immediate as usize, plan.unsolicited_end as usize);
        let final_ = plan.final_bit();
        conn.send(Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_,
            read,
            write: write.is_some(),
            attr: 1,
            lun,
            itt,
            edtl,
            cmdsn,
            cdb: cdb.to_vec(),
            data: write.map(|d| d.slice(..immediate_len)).unwrap_or_default(),
            ..ScsiCommand::default()
        }));
        if let Some(d) = write {
            if unsolicited_end > immediate_len {
                send_data_out(
                    conn,
                    lun,
                    itt,
                    RESERVED_TAG,
                    d,
                    immediate_len,
                    unsolicited_end,
                );
            }
        }
    }

    /// Sends a task management request and waits for its response code.
    pub(super) async fn task_mgmt(
        &self,
        conn: &Arc<Conn>,
        function: u8,
        lun: u16,
        referenced: u32,
        refcmdsn: u32,
        expdatasn: u32,
    ) -> Result<u8> {
        let (guard, mut rx) = self.register(conn);
        let cmdsn = self.state.lock().unwrap().window.cmdsn;
        conn.send(Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function,
            lun: lun_to_wire(lun),
            itt: guard.itt,
            referenced_task_tag: referenced,
            cmdsn,
            refcmdsn,
            expdatasn,
            ..TaskMgmtRequest::default()
        }));
        match tokio::time::timeout(Duration::from_secs(10), recv_pdu(&mut rx)).await {
            Ok(Some(Pdu::TaskMgmtResponse(r))) => Ok(r.response),
            Ok(_) => Err(Error::ConnectionLost {
                portal: conn.portal.clone(),
                why: "during task management".into(),
            }),
            Err(_) => Err(Error::Timeout("task management request".into())),
        }
    }
}

/// Data-Out PDUs for `data[off..end]`, each at most the target's MaxRecvDataSegmentLength.
fn send_data_out(conn: &Conn, lun: u64, itt: u32, ttt: u32, data: &Bytes, off: usize, end: usize) {
    for seg in ffp::data_out(off as u32..end as u32, conn.max_send_segment) {
        let at = seg.offset as usize;
        conn.send(Pdu::DataOut(DataOut {
            final_: seg.final_,
            lun,
            itt,
            ttt,
            expstatsn: 0,
            datasn: seg.datasn,
            buffer_offset: seg.offset,
            data: data.slice(at..at + seg.len as usize),
        }));
    }
}
