//! The target spoken to in raw PDUs, over several connections of one session: CmdSN
//! ordering across connections, allegiance, R2T and unsolicited data, task management,
//! and malformed input.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::BytesMut;
use iscsi::framing::{FrameLimits, PduDecoder};
use iscsi::negotiate::{ConnectionParams, SessionParams, TargetPacing};
use iscsi::pdu::*;
use testkit::raw::*;

#[test]
fn commands_are_ordered_by_cmdsn_across_connections_and_answered_on_their_own() {
    let addr = start("");
    let isid = [0x80, 0, 0, 0, 0, 1];
    let mut a = Raw::login(addr, isid, 0, 1, 100, prefs());
    let mut b = Raw::login(addr, isid, a.tsih, 2, 100, prefs());
    assert_eq!(a.params.max_connections, 8);
    clear_ua(&mut a, 1);
    // A writes a block (immediate data is off, InitialR2T=Yes: one R2T).
    let w = a.scsi(0x100, a.cmdsn, &write10(0, 1), false, true, 512, &[]);
    a.cmdsn += 1;
    a.send(&w);
    let Pdu::R2t(r2t) = a.recv() else {
        panic!("expected R2T")
    };
    assert_eq!(
        (
            r2t.itt,
            r2t.buffer_offset,
            r2t.desired_data_transfer_length,
            r2t.r2tsn
        ),
        (0x100, 0, 512, 0)
    );
    a.send(&Pdu::DataOut(DataOut {
        final_: true,
        lun: lun_to_wire(0),
        itt: 0x100,
        ttt: r2t.ttt,
        datasn: 0,
        buffer_offset: 0,
        data: vec![0x42; 512].into(),
        ..Default::default()
    }));
    let Pdu::ScsiResponse(wr) = a.recv() else {
        panic!("expected the write's response on A")
    };
    assert_eq!((wr.itt, wr.status), (0x100, 0));
    let next = a.cmdsn;
    // CmdSN next+1 arrives first on connection B: it must wait for next on A.
    let read_b = b.scsi(0x200, next + 1, &read10(0, 1), true, false, 512, &[]);
    b.send(&read_b);
    b.s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        b.try_recv().is_none(),
        "a command ran before the one ahead of it in CmdSN order"
    );
    b.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = a.scsi(0x101, next, &tur(), false, false, 0, &[]);
    a.send(&t);
    let Pdu::ScsiResponse(tr) = a.recv() else {
        panic!("expected TUR's response on A")
    };
    assert_eq!((tr.itt, tr.status), (0x101, 0));
    // B's read runs now and answers on B (allegiance).
    let Pdu::DataIn(d) = b.recv() else {
        panic!("expected Data-In on B")
    };
    assert_eq!(d.itt, 0x200);
    assert!(d.status_present && d.status == 0);
    assert!(d.data.iter().all(|&x| x == 0x42), "B read what A wrote");
    assert_eq!(d.expcmdsn, next + 2, "both commands consumed their CmdSN");
}

#[test]
fn r2ts_honour_max_burst_and_max_outstanding_and_data_lands() {
    let addr = start("");
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 2], 0, 1, 1, prefs());
    clear_ua(&mut a, 1);
    assert_eq!(a.params.max_burst_length, 16384);
    assert_eq!(a.params.max_outstanding_r2t, 2);
    let blocks = 128u16; // 64 KiB: four bursts of 16 KiB
    let data: Vec<u8> = (0..blocks as usize * 512)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let w = a.scsi(
        0x10,
        a.cmdsn,
        &write10(100, blocks),
        false,
        true,
        data.len() as u32,
        &[],
    );
    a.cmdsn += 1;
    a.send(&w);
    let mut outstanding = Vec::new();
    let mut done = false;
    let mut seen = 0;
    while !done {
        match a.recv() {
            Pdu::R2t(r) => {
                assert!(r.desired_data_transfer_length <= 16384);
                assert_eq!(r.r2tsn, seen);
                seen += 1;
                outstanding.push(r);
                assert!(
                    outstanding.len() <= 2,
                    "more than MaxOutstandingR2T R2Ts outstanding"
                );
                // Answer one R2T at a time, in 4 KiB PDUs, oldest first.
                let r = outstanding.remove(0);
                send_burst(&mut a, 0x10, &r, &data);
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.status, 0);
                assert_eq!(r.expdatasn, 4, "ExpDataSN counts the R2Ts");
                done = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, 4);
    let r = a.scsi(
        0x11,
        a.cmdsn,
        &read10(100, blocks),
        true,
        false,
        data.len() as u32,
        &[],
    );
    a.cmdsn += 1;
    a.send(&r);
    let mut got = Vec::new();
    loop {
        let Pdu::DataIn(d) = a.recv() else { panic!() };
        assert_eq!(d.buffer_offset as usize, got.len());
        got.extend_from_slice(&d.data);
        if d.status_present {
            break;
        }
    }
    assert!(got == data, "read back differs");
}

#[test]
fn unsolicited_and_immediate_data_up_to_first_burst() {
    let addr = start("");
    let p = SessionParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 8192,
        max_burst_length: 16384,
        ..prefs()
    };
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 3], 0, 1, 1, p);
    assert!(!a.params.initial_r2t && a.params.immediate_data);
    assert_eq!(a.params.first_burst_length, 8192);
    clear_ua(&mut a, 1);
    let data = vec![0xabu8; 12288];
    // 2 KiB immediate, 6 KiB unsolicited Data-Out (to FirstBurstLength), 4 KiB by R2T.
    let mut w = a.scsi(
        0x20,
        a.cmdsn,
        &write10(8, 24),
        false,
        true,
        12288,
        &data[..2048],
    );
    if let Pdu::ScsiCommand(c) = &mut w {
        c.final_ = false;
    }
    a.cmdsn += 1;
    a.send(&w);
    a.send(&Pdu::DataOut(DataOut {
        final_: true,
        lun: lun_to_wire(0),
        itt: 0x20,
        ttt: RESERVED_TAG,
        datasn: 0,
        buffer_offset: 2048,
        data: data[2048..8192].to_vec().into(),
        ..Default::default()
    }));
    let Pdu::R2t(r) = a.recv() else {
        panic!("expected an R2T for the rest")
    };
    assert_eq!(
        (r.buffer_offset, r.desired_data_transfer_length),
        (8192, 4096)
    );
    a.send(&Pdu::DataOut(DataOut {
        final_: true,
        lun: lun_to_wire(0),
        itt: 0x20,
        ttt: r.ttt,
        datasn: 0,
        buffer_offset: 8192,
        data: data[8192..].to_vec().into(),
        ..Default::default()
    }));
    let Pdu::ScsiResponse(resp) = a.recv() else {
        panic!()
    };
    assert_eq!(resp.status, 0);
}

#[test]
fn abort_task_stops_a_write_waiting_for_data_and_lun_reset_answers() {
    let addr = start("");
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 4], 0, 1, 1, prefs());
    clear_ua(&mut a, 1);
    let w = a.scsi(0x30, a.cmdsn, &write10(0, 8), false, true, 4096, &[]);
    let refcmdsn = a.cmdsn;
    a.cmdsn += 1;
    a.send(&w);
    let Pdu::R2t(_) = a.recv() else {
        panic!("expected R2T")
    };
    a.send(&Pdu::TaskMgmtRequest(TaskMgmtRequest {
        immediate: true,
        function: 0x80 | 1,
        lun: lun_to_wire(0),
        itt: 0x31,
        referenced_task_tag: 0x30,
        cmdsn: a.cmdsn,
        refcmdsn,
        ..Default::default()
    }));
    let Pdu::TaskMgmtResponse(t) = a.recv() else {
        panic!("expected TMF response")
    };
    assert_eq!((t.itt, t.response), (0x31, 0), "function complete");
    // The aborted task is gone: aborting it again finds nothing.
    a.send(&Pdu::TaskMgmtRequest(TaskMgmtRequest {
        immediate: true,
        function: 0x80 | 1,
        lun: lun_to_wire(0),
        itt: 0x32,
        referenced_task_tag: 0x30,
        cmdsn: a.cmdsn,
        ..Default::default()
    }));
    let Pdu::TaskMgmtResponse(t) = a.recv() else {
        panic!()
    };
    assert_eq!(t.response, 1, "task does not exist");
    // LUN reset, then a unit attention for the reset on the next command.
    a.send(&Pdu::TaskMgmtRequest(TaskMgmtRequest {
        immediate: true,
        function: 0x80 | 5,
        lun: lun_to_wire(0),
        itt: 0x33,
        cmdsn: a.cmdsn,
        ..Default::default()
    }));
    let Pdu::TaskMgmtResponse(t) = a.recv() else {
        panic!()
    };
    assert_eq!(t.response, 0);
    let p = a.scsi(0x34, a.cmdsn, &tur(), false, false, 0, &[]);
    a.cmdsn += 1;
    a.send(&p);
    let Pdu::ScsiResponse(r) = a.recv() else {
        panic!()
    };
    assert_eq!(r.status, 2);
    let sense = r.sense().unwrap();
    assert_eq!(
        (sense[2] & 0x0f, sense[12]),
        (6, 0x29),
        "UNIT ATTENTION, reset occurred"
    );
    // A TMF on a LUN that does not exist.
    a.send(&Pdu::TaskMgmtRequest(TaskMgmtRequest {
        immediate: true,
        function: 0x80 | 5,
        lun: lun_to_wire(9),
        itt: 0x35,
        cmdsn: a.cmdsn,
        ..Default::default()
    }));
    let Pdu::TaskMgmtResponse(t) = a.recv() else {
        panic!()
    };
    assert_eq!(t.response, 2, "LUN does not exist");
}

#[test]
fn nop_ping_logout_and_cmdsn_outside_the_window() {
    let addr = start("queue_depth = 4");
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 5], 0, 1, 10, prefs());
    a.send(&Pdu::NopOut(NopOut {
        immediate: true,
        itt: 0x40,
        cmdsn: a.cmdsn,
        data: b"ping".to_vec().into(),
        ..Default::default()
    }));
    let Pdu::NopIn(n) = a.recv() else { panic!() };
    assert_eq!((n.itt, &n.data[..]), (0x40, &b"ping"[..]));
    assert_eq!(
        (n.expcmdsn, n.maxcmdsn),
        (10, 13),
        "window of queue_depth 4"
    );
    // Beyond MaxCmdSN: silently ignored.
    let p = a.scsi(0x41, 14, &tur(), false, false, 0, &[]);
    a.send(&p);
    // In the window: answered.
    clear_ua(&mut a, 0x42);
    a.send(&Pdu::LogoutRequest(LogoutRequest {
        immediate: true,
        reason: 0,
        itt: 0x43,
        cmdsn: a.cmdsn,
        ..Default::default()
    }));
    let Pdu::LogoutResponse(l) = a.recv() else {
        panic!("expected logout response, the ignored command must not answer")
    };
    assert_eq!((l.itt, l.response), (0x43, 0));
    assert!(a.try_recv().is_none(), "connection closes after logout");
}

#[test]
fn malformed_input_closes_only_that_connection() {
    let addr = start("");
    let mut good = Raw::login(addr, [0x80, 0, 0, 0, 0, 6], 0, 1, 1, prefs());
    clear_ua(&mut good, 1);
    // A SCSI command before login: the connection is closed, nothing else happens.
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut early = [0u8; 48];
    early[0] = 0x01;
    bad.write_all(&early).unwrap();
    let mut sink = [0u8; 64];
    assert!(matches!(bad.read(&mut sink), Ok(0) | Err(_)));
    // A huge data segment length in full feature phase: Reject then close.
    let mut hostile = Raw::login(addr, [0x80, 0, 0, 0, 0, 7], 0, 1, 1, prefs());
    let mut bhs = [0u8; 48];
    bhs[0] = 0x01; // SCSI command
    bhs[1] = 0x80;
    bhs[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    hostile.send_bytes(&bhs);
    match hostile.try_recv() {
        Some(Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        None => {}
        other => panic!("unexpected {other:?}"),
    }
    // An unknown opcode on a third connection: Reject, and the connection lives on.
    let mut odd = Raw::login(addr, [0x80, 0, 0, 0, 0, 8], 0, 1, 1, prefs());
    let mut bhs = [0u8; 48];
    bhs[0] = 0x1c;
    odd.send_bytes(&bhs);
    let Pdu::Reject(r) = odd.recv() else {
        panic!("expected Reject")
    };
    assert_eq!(r.reason, reject_reason::COMMAND_NOT_SUPPORTED);
    clear_ua(&mut odd, 2);
    // The first session never noticed.
    let p = good.scsi(0x50, good.cmdsn, &tur(), false, false, 0, &[]);
    good.cmdsn += 1;
    good.send(&p);
    let Pdu::ScsiResponse(r) = good.recv() else {
        panic!()
    };
    assert_eq!(r.status, 0);
}

fn erl(level: u8) -> SessionParams {
    SessionParams {
        error_recovery_level: level,
        ..prefs()
    }
}

/// ERL 2: a write whose connection dies half-way through its data is reassigned to
/// another connection of the session (RFC 7143 6.2.2): after Logout "remove the
/// connection for recovery" and TASK REASSIGN, the target asks there for exactly the data
/// it lacks, and the command completes on the new connection.
#[test]
fn task_reassign_at_erl2_carries_a_half_written_command_on() {
    let addr = start("");
    let isid = [0x80, 0, 0, 0, 0, 0x21];
    let mut a = Raw::login(addr, isid, 0, 1, 1, erl(2));
    let mut b = Raw::login(addr, isid, a.tsih, 2, 1, erl(2));
    assert_eq!(a.params.error_recovery_level, 2, "the target grants ERL 2");
    clear_ua(&mut a, 1);
    b.cmdsn = a.cmdsn;
    let data: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
    let cmdsn = a.cmdsn;
    let w = a.scsi(0x500, cmdsn, &write10(40, 16), false, true, 8192, &[]);
    a.cmdsn += 1;
    b.cmdsn = a.cmdsn;
    a.send(&w);
    let Pdu::R2t(r2t) = a.recv() else {
        panic!("expected R2T")
    };
    assert_eq!(r2t.desired_data_transfer_length, 8192);
    // Half of the burst, then the connection dies.
    a.data_out(0x500, r2t.ttt, 0, 0, &data[..3072], false);
    std::thread::sleep(Duration::from_millis(100));
    drop(a);
    // The R2T of the dead connection is void: a new one asks for the rest only.
    let again = b.reassign_write_of_cid1(0x500, cmdsn);
    assert_eq!(
        (
            again.itt,
            again.buffer_offset,
            again.desired_data_transfer_length
        ),
        (0x500, 3072, 8192 - 3072)
    );
    assert!(again.r2tsn >= 1, "R2TSN goes on counting");
    b.data_out(0x500, again.ttt, 0, 3072, &data[3072..], true);
    let Pdu::ScsiResponse(resp) = b.recv() else {
        panic!("expected the write's status on the new connection")
    };
    assert_eq!((resp.itt, resp.status), (0x500, 0));
    b.check_read(0x501, 40, &data);
}

/// ERL 2: a read whose Data-In and status were lost with their connection is answered
/// again after reassignment, from the ExpDataSN the initiator gives; its connection's
/// CID logging in again to the session is the logout for recovery (implicit).
#[test]
fn task_reassign_at_erl2_resends_lost_data_in_and_status_from_expdatasn() {
    let addr = start("");
    let isid = [0x80, 0, 0, 0, 0, 0x22];
    let mut a = Raw::login(addr, isid, 0, 1, 1, erl(2));
    clear_ua(&mut a, 1);
    let data: Vec<u8> = (0..131072).map(|i| (i * 13 % 251) as u8).collect();
    let w = a.scsi(0x700, a.cmdsn, &write10(200, 256), false, true, 131072, &[]);
    a.cmdsn += 1;
    a.send(&w);
    let mut sent = 0;
    while sent < data.len() {
        let Pdu::R2t(r) = a.recv() else {
            panic!("expected R2T")
        };
        let (off, len) = (
            r.buffer_offset as usize,
            r.desired_data_transfer_length as usize,
        );
        for (sn, chunk) in data[off..off + len].chunks(16384).enumerate() {
            let at = off + sn * 16384;
            a.data_out(
                0x700,
                r.ttt,
                sn as u32,
                at,
                chunk,
                at + chunk.len() == off + len,
            );
        }
        sent += len;
    }
    let Pdu::ScsiResponse(_) = a.recv() else {
        panic!()
    };
    // 128 KiB read in Data-In of 16 KiB (MaxBurstLength): DataSN 0 to 7. The initiator
    // gets DataSN 0 to 2, then the connection is lost.
    let cmdsn = a.cmdsn;
    let r = a.scsi(0x701, cmdsn, &read10(200, 256), true, false, 131072, &[]);
    a.cmdsn += 1;
    a.send(&r);
    let mut got = Vec::new();
    for sn in 0..3 {
        let Pdu::DataIn(d) = a.recv() else {
            panic!("expected Data-In")
        };
        assert_eq!((d.datasn, d.status_present), (sn, false));
        got.extend_from_slice(&d.data);
    }
    let next_cmdsn = a.cmdsn;
    let statsn = a.statsn;
    // The same CID logs in again: the old connection is logged out for recovery.
    let mut b = Raw::login(addr, isid, a.tsih, 1, next_cmdsn, erl(2));
    b.statsn = statsn;
    assert_eq!(b.tmf(0x800, 8, 0x701, cmdsn, 3), 0, "function complete");
    for sn in 3..8 {
        let Pdu::DataIn(d) = b.recv() else {
            panic!("expected the rest of the Data-In on the new connection")
        };
        assert_eq!((d.itt, d.datasn, d.buffer_offset), (0x701, sn, sn * 16384));
        assert_eq!(d.status_present, sn == 7, "status in the last Data-In");
        got.extend_from_slice(&d.data);
    }
    assert!(got == data, "reassigned read returned other data");
    drop(a);
}

/// Sends `stream` cut in pieces of 1000, 47, 70,001, 3 and 100,000 bytes (again and again),
/// pausing 5 ms after every other piece (those whose index has the parity `pause`).
fn send_in_uneven_pieces(a: &mut Raw, stream: &[u8], pause: usize) {
    let pieces = [1000usize, 47, 70_001, 3, 100_000];
    let mut from = 0;
    for (i, n) in pieces.iter().cycle().enumerate() {
        if from == stream.len() {
            break;
        }
        let to = (from + n).min(stream.len());
        a.send_bytes(&stream[from..to]);
        from = to;
        if i % 2 == pause {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Data-Out segments of 32 KiB and more are read from the socket straight into their
/// command's buffer: whether they arrive whole, in pieces of any size, behind one another
/// in one segment of TCP, or mixed with small ones (copied as before), the data lands where
/// its buffer offset says; one whose DataSN is wrong is not taken that way but ends its
/// command with CHECK CONDITION as before, and the connection goes on.
#[test]
fn large_data_out_segments_land_whole_however_they_arrive() {
    let addr = start("");
    let p = SessionParams {
        max_burst_length: 256 << 10,
        ..prefs()
    };
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 0x40], 0, 1, 1, p);
    assert_eq!(a.params.max_burst_length, 256 << 10);
    assert!(a.conn.max_send_data_segment_length >= 128 << 10);
    clear_ua(&mut a, 1);
    let data: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 31 % 253) as u8).collect();
    let w = a.scsi(0x40, a.cmdsn, &write10(64, 2048), false, true, 1 << 20, &[]);
    a.cmdsn += 1;
    a.send(&w);
    // Each burst of 256 KiB as Data-Out PDUs of 64, 4, 60 and 128 KiB, sent as one byte
    // stream cut in uneven pieces with pauses between them.
    let cuts = [64usize << 10, 4 << 10, 60 << 10, 128 << 10];
    let mut bursts = 0;
    loop {
        match a.recv() {
            Pdu::R2t(r) => {
                let (off, len) = (
                    r.buffer_offset as usize,
                    r.desired_data_transfer_length as usize,
                );
                assert_eq!(len, 256 << 10);
                let mut stream = Vec::new();
                let mut at = off;
                for (sn, n) in cuts.iter().enumerate() {
                    Pdu::DataOut(DataOut {
                        final_: at + n == off + len,
                        lun: lun_to_wire(0),
                        itt: 0x40,
                        ttt: r.ttt,
                        datasn: sn as u32,
                        buffer_offset: at as u32,
                        data: data[at..at + n].to_vec().into(),
                        ..Default::default()
                    })
                    .encode(&mut stream, Digests::default());
                    at += n;
                }
                send_in_uneven_pieces(&mut a, &stream, bursts % 2);
                bursts += 1;
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!((r.itt, r.status), (0x40, 0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(bursts, 4);
    let mut got = Vec::new();
    for part in 0..4u32 {
        got.extend(read_at(&mut a, 0x41 + part, 64 + part * 512, 512));
    }
    assert!(got == data, "read back differs");
    // A large Data-Out out of sequence (DataSN 1 where 0 is due) ends its command.
    let w = a.scsi(0x50, a.cmdsn, &write10(0, 128), false, true, 64 << 10, &[]);
    a.cmdsn += 1;
    a.send(&w);
    let Pdu::R2t(r) = a.recv() else {
        panic!("expected R2T")
    };
    a.data_out(0x50, r.ttt, 1, 0, &data[..64 << 10], true);
    let Pdu::ScsiResponse(resp) = a.recv() else {
        panic!("expected the write's status")
    };
    assert_eq!((resp.itt, resp.status), (0x50, 2), "CHECK CONDITION");
    let sense = resp.sense().unwrap();
    assert_eq!(
        (sense[2] & 0x0f, sense[12]),
        (0x0b, 0x4b),
        "DATA PHASE ERROR"
    );
    // The connection goes on.
    let again = read_at(&mut a, 0x51, 64, 128);
    assert!(again[..] == data[..64 << 10]);
}

/// A WRITE's large immediate data (32 KiB and more) lands whole: cut in pieces of any size,
/// followed by Data-Out for an R2T, or the whole write in one PDU (which runs once the data
/// is in); the immediate data of a command the target ignores (CmdSN outside the window) is
/// read off the stream and dropped, and the connection goes on. (The data is copied from
/// the receive buffer into the task's; reading it straight into the task's buffer was
/// tried and reverted: no gain measured.)
#[test]
fn large_immediate_data_lands_whole_however_it_arrives() {
    let addr = start("");
    let p = SessionParams {
        immediate_data: true,
        first_burst_length: 128 << 10,
        max_burst_length: 256 << 10,
        ..prefs()
    };
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 0x41], 0, 1, 1, p);
    assert!(a.params.immediate_data);
    assert_eq!(a.params.first_burst_length, 128 << 10);
    assert!(a.conn.max_send_data_segment_length >= 128 << 10);
    clear_ua(&mut a, 1);
    let data: Vec<u8> = (0..(640usize << 10))
        .map(|i| (i * 37 % 251) as u8)
        .collect();
    // 512 KiB at LBA 0: 128 KiB immediate, cut unevenly with pauses, the rest by R2T.
    let mut stream = Vec::new();
    a.scsi(
        0x60,
        a.cmdsn,
        &write10(0, 1024),
        false,
        true,
        512 << 10,
        &data[..128 << 10],
    )
    .encode(&mut stream, Digests::default());
    a.cmdsn += 1;
    send_in_uneven_pieces(&mut a, &stream, 0);
    loop {
        match a.recv() {
            Pdu::R2t(r) => {
                let (off, len) = (
                    r.buffer_offset as usize,
                    r.desired_data_transfer_length as usize,
                );
                for (sn, at) in (off..off + len).step_by(64 << 10).enumerate() {
                    let end = (at + (64 << 10)).min(off + len);
                    a.data_out(0x60, r.ttt, sn as u32, at, &data[at..end], end == off + len);
                }
            }
            Pdu::ScsiResponse(r) => {
                assert_eq!((r.itt, r.status), (0x60, 0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // A command the target ignores (CmdSN far outside the window): its 64 KiB of immediate
    // data are skipped, not taken for a header.
    let ignored = a.scsi(
        0x61,
        a.cmdsn + 1000,
        &write10(0, 128),
        false,
        true,
        64 << 10,
        &[0xee; 64 << 10],
    );
    a.send(&ignored);
    // 128 KiB at LBA 1024, all of it immediate: it runs once the data is in.
    let w = a.scsi(
        0x62,
        a.cmdsn,
        &write10(1024, 256),
        false,
        true,
        128 << 10,
        &data[512 << 10..],
    );
    a.cmdsn += 1;
    a.send(&w);
    let Pdu::ScsiResponse(r) = a.recv() else {
        panic!("expected the write's status")
    };
    assert_eq!((r.itt, r.status), (0x62, 0));
    let mut got = Vec::new();
    for part in 0..5u32 {
        got.extend(read_at(&mut a, 0x70 + part, part * 256, 256));
    }
    assert!(got == data, "read back differs");
}

/// ERL 2: a connection that dies in the middle of a large Data-Out segment, which was
/// being read straight into its command's buffer, leaves the command whole for
/// reassignment: the new connection is asked for the segment again and the command
/// completes with the right data.
#[test]
fn task_reassign_at_erl2_after_a_connection_dies_mid_segment() {
    let addr = start("");
    let isid = [0x80, 0, 0, 0, 0, 0x24];
    let p = SessionParams {
        max_burst_length: 256 << 10,
        ..erl(2)
    };
    let mut a = Raw::login(addr, isid, 0, 1, 1, p.clone());
    let mut b = Raw::login(addr, isid, a.tsih, 2, 1, p);
    clear_ua(&mut a, 1);
    b.cmdsn = a.cmdsn;
    let data: Vec<u8> = (0..(128usize << 10))
        .map(|i| (i * 17 % 251) as u8)
        .collect();
    let cmdsn = a.cmdsn;
    let w = a.scsi(
        0x600,
        cmdsn,
        &write10(300, 256),
        false,
        true,
        128 << 10,
        &[],
    );
    a.cmdsn += 1;
    b.cmdsn = a.cmdsn;
    a.send(&w);
    let Pdu::R2t(r2t) = a.recv() else {
        panic!("expected R2T")
    };
    assert_eq!(r2t.desired_data_transfer_length, 128 << 10);
    // The first 64 KiB whole, then the header and 20 KiB of the second 64 KiB.
    a.data_out(0x600, r2t.ttt, 0, 0, &data[..64 << 10], false);
    let mut second = Vec::new();
    Pdu::DataOut(DataOut {
        final_: true,
        lun: lun_to_wire(0),
        itt: 0x600,
        ttt: r2t.ttt,
        datasn: 1,
        buffer_offset: 64 << 10,
        data: data[64 << 10..].to_vec().into(),
        ..Default::default()
    })
    .encode(&mut second, Digests::default());
    a.send_bytes(&second[..BHS_LEN + (20 << 10)]);
    std::thread::sleep(Duration::from_millis(100));
    drop(a);
    // What the dead connection had not brought whole is asked for again.
    let again = b.reassign_write_of_cid1(0x600, cmdsn);
    assert_eq!(
        (
            again.itt,
            again.buffer_offset,
            again.desired_data_transfer_length
        ),
        (0x600, 64 << 10, 64 << 10)
    );
    b.data_out(0x600, again.ttt, 0, 64 << 10, &data[64 << 10..], true);
    let Pdu::ScsiResponse(resp) = b.recv() else {
        panic!("expected the write's status on the new connection")
    };
    assert_eq!((resp.itt, resp.status), (0x600, 0));
    b.check_read(0x603, 300, &data);
}

/// Below ERL 2 there is no connection recovery: TASK REASSIGN is answered "task
/// allegiance reassignment not supported" and Logout reason 2 "connection recovery not
/// supported". At ERL 2, a task whose connection is alive is "still allegiant", and an
/// unknown one "does not exist".
#[test]
fn task_reassign_refused_below_erl2_and_for_live_or_unknown_tasks() {
    let addr = start("");
    for level in [0u8, 1] {
        let isid = [0x80, 0, 0, 0, 0, 0x30 + level];
        let mut a = Raw::login(addr, isid, 0, 1, 1, erl(level));
        assert_eq!(a.params.error_recovery_level, level);
        let mut b = Raw::login(addr, isid, a.tsih, 2, 1, erl(level));
        clear_ua(&mut a, 1);
        b.cmdsn = a.cmdsn;
        let w = a.scsi(0x900, a.cmdsn, &write10(0, 1), false, true, 512, &[]);
        a.cmdsn += 1;
        b.cmdsn = a.cmdsn;
        a.send(&w);
        let Pdu::R2t(_) = a.recv() else {
            panic!("expected R2T")
        };
        drop(a);
        assert_eq!(
            b.logout(0x901, 2, 1),
            2,
            "connection recovery not supported"
        );
        assert_eq!(
            b.tmf(0x902, 8, 0x900, 0, 0),
            4,
            "reassignment not supported"
        );
    }
    let isid = [0x80, 0, 0, 0, 0, 0x3f];
    let mut a = Raw::login(addr, isid, 0, 1, 1, erl(2));
    let mut b = Raw::login(addr, isid, a.tsih, 2, 1, erl(2));
    clear_ua(&mut a, 1);
    b.cmdsn = a.cmdsn;
    let w = a.scsi(0xa00, a.cmdsn, &write10(0, 1), false, true, 512, &[]);
    a.cmdsn += 1;
    b.cmdsn = a.cmdsn;
    a.send(&w);
    let Pdu::R2t(r2t) = a.recv() else {
        panic!("expected R2T")
    };
    assert_eq!(b.tmf(0xa01, 8, 0xa00, 0, 0), 3, "task still allegiant");
    assert_eq!(b.tmf(0xa02, 8, 0xdead, 0, 0), 1, "task does not exist");
    // The command is unharmed on its own connection.
    a.data_out(0xa00, r2t.ttt, 0, 0, &[7; 512], true);
    let Pdu::ScsiResponse(r) = a.recv() else {
        panic!()
    };
    assert_eq!((r.itt, r.status), (0xa00, 0));
}

/// ERL 2: a command waiting for an earlier CmdSN when its connection died keeps its
/// place in the order. The hole is filled on the connection that logged in again with
/// the same CID, before the command is reassigned there: it runs in its turn all the
/// same, and answers on the new connection.
#[test]
fn task_reassign_at_erl2_keeps_a_waiting_command_in_cmdsn_order() {
    let addr = start("");
    let isid = [0x80, 0, 0, 0, 0, 0x23];
    let mut a = Raw::login(addr, isid, 0, 1, 1, erl(2));
    clear_ua(&mut a, 1);
    let hole = a.cmdsn;
    // CmdSN hole+1 arrives; hole never does on this connection.
    let r = a.scsi(0xb00, hole + 1, &read10(0, 1), true, false, 512, &[]);
    a.send(&r);
    let (tsih, statsn) = (a.tsih, a.statsn);
    std::thread::sleep(Duration::from_millis(100));
    drop(a);
    let mut b = Raw::login(addr, isid, tsih, 1, hole, erl(2));
    b.statsn = statsn;
    let t = b.scsi(0xb01, hole, &tur(), false, false, 0, &[]);
    b.send(&t);
    let Pdu::ScsiResponse(r) = b.recv() else {
        panic!("expected the TUR's status")
    };
    assert_eq!((r.itt, r.status), (0xb01, 0));
    assert_eq!(r.expcmdsn, hole + 2, "the waiting read took its turn");
    assert_eq!(b.tmf(0xb02, 8, 0xb00, hole + 1, 0), 0, "function complete");
    let Pdu::DataIn(d) = b.recv() else {
        panic!("expected the read's Data-In on the new connection")
    };
    assert_eq!(d.itt, 0xb00);
    assert!(d.status_present && d.status == 0);
}

/// SO_MAX_PACING_RATE of the target's end of `client`'s connection. The target runs in
/// this process, so its socket is among our file descriptors; `u64::MAX` is unpaced.
fn target_side_pacing(client: &TcpStream) -> u64 {
    use std::os::fd::{AsFd, FromRawFd};
    let (ours, theirs) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: dup only creates a descriptor of our own (-1 if fd is gone meanwhile).
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            continue;
        }
        // SAFETY: dup is a fresh descriptor nobody else owns; dropping s closes it.
        let s = unsafe { TcpStream::from_raw_fd(dup) };
        if s.local_addr().ok() == Some(theirs) && s.peer_addr().ok() == Some(ours) {
            return net::max_pacing_rate(s.as_fd()).unwrap();
        }
    }
    panic!("the target's end of {ours} is not among our descriptors");
}

/// One READ of `blocks` blocks at LBA 0 on `c`, answered with GOOD status.
fn read_ok(c: &mut Raw, itt: u32, blocks: u16) {
    let p = c.scsi(
        itt,
        c.cmdsn,
        &read10(0, blocks),
        true,
        false,
        512 * u32::from(blocks),
        &[],
    );
    c.cmdsn += 1;
    c.send(&p);
    loop {
        match c.recv() {
            Pdu::DataIn(d) if d.status_present => {
                assert_eq!(d.status, 0);
                return;
            }
            Pdu::DataIn(_) => {}
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.status, 0);
                return;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn pacing_hint_paces_each_connection_at_its_own_rate() {
    let addr = start("");
    let isid = [0x80, 0, 0, 0, 0, 0x21];
    let mut a = Raw::login_paced(addr, isid, 0, 1, 1, prefs(), Some(1_640_625));
    let mut b = Raw::login_paced(addr, isid, a.tsih, 2, 1, prefs(), Some(2_000_000));
    let mut c = Raw::login(addr, isid, a.tsih, 3, 1, prefs());
    // The answers say what the target did...
    assert_eq!(a.pacing, TargetPacing::Paced(1_640_625));
    assert_eq!(b.pacing, TargetPacing::Paced(2_000_000));
    assert_eq!(c.pacing, TargetPacing::NotAsked);
    // ...and it did: each socket of the target carries its own connection's rate.
    assert_eq!(target_side_pacing(&a.s), 1_640_625);
    assert_eq!(target_side_pacing(&b.s), 2_000_000);
    assert_eq!(target_side_pacing(&c.s), u64::MAX);
    clear_ua(&mut a, 1);
    // CmdSN is the session's: 2, 3, 4 over the three connections.
    for (cmdsn, conn) in [(2, &mut a), (3, &mut b), (4, &mut c)] {
        conn.cmdsn = cmdsn;
        read_ok(conn, cmdsn, 8);
    }
    // An absurd hint is clamped to 1 Mbit/s, and the answer says so.
    let d = Raw::login_paced(addr, [0x80, 0, 0, 0, 0, 0x22], 0, 1, 1, prefs(), Some(1));
    assert_eq!(d.pacing, TargetPacing::Paced(125_000));
    assert_eq!(target_side_pacing(&d.s), 125_000);
}

#[test]
fn pacing_hint_off_or_configured_rate_wins() {
    // Hints off: "0" (not paced), the socket untouched, the login as good as any.
    let addr = start("accept_pacing_hint = false");
    let mut a = Raw::login_paced(
        addr,
        [0x80, 0, 0, 0, 0, 0x23],
        0,
        1,
        1,
        prefs(),
        Some(1_640_625),
    );
    assert_eq!(a.pacing, TargetPacing::NotPaced);
    assert_eq!(target_side_pacing(&a.s), u64::MAX);
    clear_ua(&mut a, 1);
    read_ok(&mut a, 2, 8);
    // A configured rate is what every connection gets, and what the answer reports.
    let addr = start("pacing_rate = \"5MB/s\"");
    let a = Raw::login_paced(
        addr,
        [0x80, 0, 0, 0, 0, 0x24],
        0,
        1,
        1,
        prefs(),
        Some(1_640_625),
    );
    assert_eq!(a.pacing, TargetPacing::Paced(5_000_000));
    assert_eq!(target_side_pacing(&a.s), 5_000_000);
    let b = Raw::login(addr, [0x80, 0, 0, 0, 0, 0x25], 0, 1, 1, prefs());
    assert_eq!(target_side_pacing(&b.s), 5_000_000);
}

/// A hand-written login straight into the operational stage with a pacing hint that is no
/// number: the key is answered Reject, nothing is paced, and the login succeeds. Later
/// hints in Text requests pace the connection, or stop pacing it.
#[test]
fn malformed_pacing_hint_is_rejected_without_failing_the_login_and_later_hints_apply() {
    let addr = start("");
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut raw = Raw {
        s,
        dec: PduDecoder::new(FrameLimits::default()),
        buf: BytesMut::new(),
        cmdsn: 1,
        statsn: 0,
        tsih: 0,
        params: SessionParams::default(),
        conn: ConnectionParams::default(),
        pacing: TargetPacing::NotAsked,
    };
    let text = format!(
        "InitiatorName=iqn.2026-11.org.reservoir:raw-initiator\0TargetName={IQN}\0\
         SessionType=Normal\0X-org.reservoir.PacingRate=fast\0"
    );
    raw.send(&Pdu::LoginRequest(LoginRequest {
        transit: true,
        cont: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 0x26],
        tsih: 0,
        itt: 1,
        cid: 1,
        cmdsn: 1,
        expstatsn: 0,
        data: text.into_bytes().into(),
    }));
    let Pdu::LoginResponse(r) = raw.recv() else {
        panic!("expected a login response")
    };
    assert_eq!((r.status_class, r.status_detail), (0, 0));
    assert!(
        r.transit && r.nsg == 3,
        "the login goes to full feature phase"
    );
    let keys = iscsi::text::TextKeys::parse(&r.data).unwrap();
    assert_eq!(keys.get("X-org.reservoir.PacingRate"), Some("Reject"));
    raw.statsn = r.statsn.wrapping_add(1);
    assert_eq!(target_side_pacing(&raw.s), u64::MAX);
    clear_ua(&mut raw, 2);
    read_ok(&mut raw, 3, 1);
    // In full feature phase a hint (the initiator's rate control found the bottleneck)
    // paces the connection from the answer on; 0 ends the pacing; no number is refused.
    for (itt, hint, answer, paced) in [
        (4, "1000000", "1000000", 1_000_000),
        (5, "fast", "Reject", 1_000_000),
        (6, "1", "125000", 125_000),
        (7, "0", "0", u64::MAX),
    ] {
        raw.send(&Pdu::TextRequest(TextRequest {
            immediate: true,
            final_: true,
            itt,
            ttt: RESERVED_TAG,
            cmdsn: raw.cmdsn,
            expstatsn: raw.statsn,
            data: format!("X-org.reservoir.PacingRate={hint}\0")
                .into_bytes()
                .into(),
            ..Default::default()
        }));
        let Pdu::TextResponse(t) = raw.recv() else {
            panic!("expected a text response")
        };
        raw.statsn = t.statsn.wrapping_add(1);
        let keys = iscsi::text::TextKeys::parse(&t.data).unwrap();
        assert_eq!(
            keys.get("X-org.reservoir.PacingRate"),
            Some(answer),
            "{hint}"
        );
        assert_eq!(target_side_pacing(&raw.s), paced, "{hint}");
    }
    read_ok(&mut raw, 8, 1);
}

/// Large reads of a file LUN send the file's bytes without a copy (on tmpfs from the
/// connection's task, elsewhere after a worker has read them in), holding their blocks
/// against writes until sent: a write after them goes through, and a read racing an
/// overlapping write returns one of the two whole. (Whether a write waits for a lent read
/// is pinned down deterministically in the scsi crate's tests, not by this race.)
#[test]
fn large_reads_of_a_file_lun_send_whole_data_and_free_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let shm = std::path::Path::new("/dev/shm");
    let shm_dir = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
    let mut dirs = vec![dir.path()];
    dirs.extend(shm_dir.as_ref().map(|d| d.path()));
    for (i, d) in dirs.into_iter().enumerate() {
        {
            let path = d.join("lun.img");
            let addr = start_with(
                "",
                &format!(
                    "backstore = \"file\"\npath = \"{}\"\nsize = \"16MiB\"",
                    path.display()
                ),
            );
            let p = SessionParams {
                max_burst_length: 262144,
                ..prefs()
            };
            let mut c = Raw::login(addr, [0x80, 0, 0, 0, i as u8, 0x30], 0, 1, 1, p);
            clear_ua(&mut c, 1);
            let blocks = 256u16; // 128 KiB
            let a = vec![0xa1u8; blocks as usize * 512];
            let b = vec![0xb2u8; blocks as usize * 512];
            write_at(&mut c, 2, 64, &a);
            assert!(read_at(&mut c, 3, 64, blocks) == a, "{path:?}: read back A");
            write_at(&mut c, 4, 64, &b);
            assert!(read_at(&mut c, 5, 64, blocks) == b, "{path:?}: read back B");
            // A read and an overlapping write in flight together, many times over.
            let mut itt = 10;
            for round in 0..20 {
                let new = if round % 2 == 0 { &a } else { &b };
                let r = c.scsi(
                    itt,
                    c.cmdsn,
                    &read10(64, blocks),
                    true,
                    false,
                    a.len() as u32,
                    &[],
                );
                let w = c.scsi(
                    itt + 1,
                    c.cmdsn + 1,
                    &write10(64, blocks),
                    false,
                    true,
                    a.len() as u32,
                    &[],
                );
                c.cmdsn += 2;
                c.send(&r);
                c.send(&w);
                let (mut got, mut read_done, mut write_done) = (Vec::new(), false, false);
                while !(read_done && write_done) {
                    match c.recv() {
                        Pdu::DataIn(d) => {
                            assert_eq!(d.itt, itt);
                            got.extend_from_slice(&d.data);
                            read_done |= d.status_present;
                        }
                        Pdu::R2t(r) => send_burst(&mut c, itt + 1, &r, new),
                        Pdu::ScsiResponse(r) => {
                            assert_eq!((r.itt, r.status), (itt + 1, 0));
                            write_done = true;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                assert_eq!(got.len(), a.len());
                assert!(
                    got.iter().all(|&x| x == got[0]),
                    "{path:?}: a read saw a write half done"
                );
                itt += 2;
            }
        }
    }
}

/// A peer that stops reading cannot hold up writes to the blocks of the reads queued for
/// it: after a second the target copies the lent Data-In still unsent and lets the blocks
/// go. The stalled reads then deliver the data as it was when they ran.
#[test]
fn a_peer_that_stops_reading_holds_no_write_up_for_long() {
    stalled_reader_at(0);
}

/// The same at ERL 2, where the session also keeps every answer until its status is
/// acknowledged (for a task reassignment) and the stalled peer acknowledges nothing: the
/// kept answers are copied after a second too. Then a peer that reads at once but goes
/// quiet, never acknowledging, holds no write up either.
#[test]
fn at_erl2_kept_answers_hold_no_write_up_for_long() {
    let (mut a, mut b) = stalled_reader_at(2);
    let blocks = 2048u16;
    for i in 0..4u32 {
        let got = read_at(&mut a, 0x200 + i, i * u32::from(blocks), blocks);
        assert_eq!(got.len(), 1 << 20);
    }
    // A says nothing more: its last read's status is never acknowledged, and the session
    // keeps that answer, lent, for a reassignment.
    write_at(&mut b, 4, 3 * u32::from(blocks), &vec![0xdd; 1 << 20]);
    assert!(read_at(&mut b, 5, 3 * u32::from(blocks), blocks)
        .iter()
        .all(|&x| x == 0xdd));
}

/// Logs in A (at `erl`) and B, stalls A behind 24 MiB of reads while B writes the last
/// read's blocks, and checks both. Returns both sessions.
fn stalled_reader_at(erl_level: u8) -> (Raw, Raw) {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let path = dir.path().join("lun.img");
    let addr = start_with(
        "",
        &format!(
            "backstore = \"file\"\npath = \"{}\"\nsize = \"64MiB\"",
            path.display()
        ),
    );
    let p = SessionParams {
        max_burst_length: 262144,
        ..erl(erl_level)
    };
    let mut a = Raw::login(addr, [0x80, 0, 0, 0, 0, 0x40], 0, 1, 1, p.clone());
    assert_eq!(a.params.error_recovery_level, erl_level);
    let mut b = Raw::login(addr, [0x80, 0, 0, 0, 0, 0x41], 0, 1, 1, p);
    clear_ua(&mut a, 1);
    clear_ua(&mut b, 1);
    // 24 MiB of reads, more than the sockets between us hold; A reads none of it yet.
    const READS: u32 = 24;
    const BLOCKS: u16 = 2048; // 1 MiB
    for i in 0..READS {
        let r = a.scsi(
            0x100 + i,
            a.cmdsn,
            &read10(i * u32::from(BLOCKS), BLOCKS),
            true,
            false,
            1 << 20,
            &[],
        );
        a.cmdsn += 1;
        a.send(&r);
    }
    std::thread::sleep(Duration::from_millis(300));
    // B overwrites the last read's blocks; its answer must come while A still sleeps.
    let last = (READS - 1) * u32::from(BLOCKS);
    write_at(&mut b, 2, last, &vec![0xee; 1 << 20]);
    let mut got = vec![Vec::new(); READS as usize];
    let mut done = 0;
    while done < READS {
        let Pdu::DataIn(d) = a.recv() else {
            panic!("expected Data-In")
        };
        let i = (d.itt - 0x100) as usize;
        assert_eq!(d.buffer_offset as usize, got[i].len());
        got[i].extend_from_slice(&d.data);
        if d.status_present {
            assert_eq!(d.status, 0);
            done += 1;
        }
    }
    assert!(
        got[READS as usize - 1].iter().all(|&x| x == 0),
        "the stalled read shows the blocks as they were when it ran"
    );
    assert!(read_at(&mut b, 3, last, BLOCKS).iter().all(|&x| x == 0xee));
    (a, b)
}

/// libiscsi's iSCSISendTargets.Invalid, request by request on one connection: a
/// SendTargets whose value is none of All, nothing or an iSCSI name is refused with a
/// Reject PDU (protocol error, as LIO refuses it) that names the request, where an empty
/// list would have said "no such target"; a key the target does not know is answered
/// NotUnderstood (RFC 7143 6.2: MUST); the connection serves a valid SendTargets after
/// each.
#[test]
fn send_targets_with_a_malformed_value_is_rejected_and_the_connection_goes_on() {
    let addr = start("");
    let mut raw = Raw::login(addr, [0x80, 0, 0, 0, 0, 0x27], 0, 1, 1, prefs());
    let mut itt = 0x40;
    let mut ask = |raw: &mut Raw, text: &str| {
        itt += 1;
        raw.send(&Pdu::TextRequest(TextRequest {
            immediate: true,
            final_: true,
            itt,
            ttt: RESERVED_TAG,
            cmdsn: raw.cmdsn,
            expstatsn: raw.statsn,
            data: format!("{text}\0").into_bytes().into(),
            ..Default::default()
        }));
        let answer = raw.recv();
        let statsn = match &answer {
            Pdu::TextResponse(t) => t.statsn,
            Pdu::Reject(r) => r.statsn,
            other => panic!("{text}: expected a text response or a reject, got {other:?}"),
        };
        raw.statsn = statsn.wrapping_add(1);
        (itt, answer)
    };
    for bad in ["SendTargets=Alle", "SendTargets=A", "SendTargets=aLL"] {
        let (itt, answer) = ask(&mut raw, bad);
        let Pdu::Reject(r) = answer else {
            panic!("{bad}: expected a Reject, got {answer:?}")
        };
        assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR, "{bad}");
        assert_eq!(
            r.data[0] & 0x3f,
            0x04,
            "{bad}: the rejected header is the request's"
        );
        assert_eq!(
            u32::from_be_bytes(r.data[16..20].try_into().unwrap()),
            itt,
            "{bad}: the rejected header's ITT"
        );
        let (_, answer) = ask(&mut raw, "SendTargets=All");
        let Pdu::TextResponse(t) = answer else {
            panic!("after {bad}: expected a text response, got {answer:?}")
        };
        let keys = iscsi::text::TextKeys::parse(&t.data).unwrap();
        assert_eq!(keys.get("TargetName"), Some(IQN), "after {bad}");
    }
    for unknown in ["SendTargetsPlease=All", "sENDtARGETS=aLL"] {
        let (_, answer) = ask(&mut raw, unknown);
        let Pdu::TextResponse(t) = answer else {
            panic!("{unknown}: expected a text response, got {answer:?}")
        };
        let keys = iscsi::text::TextKeys::parse(&t.data).unwrap();
        let key = unknown.split_once('=').unwrap().0;
        assert_eq!(keys.get(key), Some("NotUnderstood"), "{unknown}");
    }
    // A name that is well formed but not the session's target: an empty list.
    let (_, answer) = ask(&mut raw, "SendTargets=iqn.2026-11.org.example:other");
    let Pdu::TextResponse(t) = answer else {
        panic!("expected a text response, got {answer:?}")
    };
    assert!(t.data.iter().all(|&b| b == 0), "{:?}", t.data);
}
