//! The target spoken to in raw PDUs, over several connections of one session: CmdSN
//! ordering across connections, allegiance, R2T and unsolicited data, task management,
//! and malformed input.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use iscsi::framing::{FrameLimits, PduDecoder};
use iscsi::login::{
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginResponseView, SessionType,
};
use iscsi::negotiate::{ConnectionParams, SessionParams};
use iscsi::pdu::*;
use target::config::Config;

const IQN: &str = "iqn.2026-11.org.reservoir:raw";

fn start(session_toml: &str) -> SocketAddr {
    let toml = format!(
        r#"
portals = ["127.0.0.1:0"]
[session]
{session_toml}
[[target]]
iqn = "{IQN}"
[[target.lun]]
id = 0
backstore = "ram"
size = "16MiB"
"#
    );
    let config = Config::parse(&toml, "test").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let server = target::Server::bind(config).await.unwrap();
            tx.send(server.portals()[0]).unwrap();
            server
                .run(std::future::pending(), Duration::from_secs(1))
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}

/// A raw connection: sends PDUs, reads PDUs, and nothing else.
struct Raw {
    s: TcpStream,
    dec: PduDecoder,
    buf: BytesMut,
    cmdsn: u32,
    statsn: u32,
    tsih: u16,
    params: SessionParams,
    conn: ConnectionParams,
}

impl Raw {
    fn login(
        addr: SocketAddr,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        cmdsn: u32,
        prefs: SessionParams,
    ) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut raw = Raw {
            s,
            dec: PduDecoder::new(FrameLimits::default()),
            buf: BytesMut::new(),
            cmdsn,
            statsn: 0,
            tsih,
            params: prefs.clone(),
            conn: ConnectionParams::default(),
        };
        let mut login = InitiatorLogin::new(InitiatorLoginConfig {
            initiator_name: "iqn.2026-11.org.reservoir:raw-initiator".into(),
            initiator_alias: None,
            target_name: Some(IQN.into()),
            session_type: SessionType::Normal,
            isid,
            tsih,
            cid,
            auth: None,
            session: prefs,
            connection: ConnectionParams {
                max_recv_data_segment_length: 65536,
                ..ConnectionParams::default()
            },
            leading: tsih == 0,
        });
        let mut rng = |b: &mut [u8]| b.fill(7);
        let mut out = login.start(&mut rng);
        loop {
            raw.send(&Pdu::LoginRequest(
                out.clone().into_pdu(1, raw.cmdsn, raw.statsn),
            ));
            let Pdu::LoginResponse(r) = raw.recv() else {
                panic!("expected a login response")
            };
            raw.statsn = r.statsn.wrapping_add(1);
            let view = LoginResponseView::from(&r);
            match login.on_response(&view, &mut rng) {
                InitiatorStep::Send(next) => out = next,
                InitiatorStep::Done(outcome) => {
                    raw.tsih = r.tsih;
                    raw.params = outcome.session;
                    raw.conn = outcome.connection;
                    raw.dec
                        .set_max_recv_data_segment(raw.conn.max_recv_data_segment_length);
                    return raw;
                }
                InitiatorStep::Failed(e) => panic!("login failed: {}", e.message),
            }
        }
    }

    fn send(&mut self, p: &Pdu) {
        let mut v = Vec::new();
        p.encode(&mut v, Digests::default());
        self.s.write_all(&v).unwrap();
    }

    fn send_bytes(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    fn recv(&mut self) -> Pdu {
        self.try_recv().expect("connection closed")
    }

    fn try_recv(&mut self) -> Option<Pdu> {
        loop {
            if let Some(p) = self
                .dec
                .decode(&mut self.buf)
                .expect("well-formed PDU from the target")
            {
                return Some(p);
            }
            let mut tmp = [0u8; 65536];
            let n = self.s.read(&mut tmp).ok()?;
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn scsi(
        &self,
        itt: u32,
        cmdsn: u32,
        cdb: &[u8],
        read: bool,
        write: bool,
        edtl: u32,
        imm: &[u8],
    ) -> Pdu {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        Pdu::ScsiCommand(ScsiCommand {
            read,
            write,
            final_: true,
            lun: lun_to_wire(0),
            itt,
            edtl,
            cmdsn,
            expstatsn: self.statsn,
            cdb: c.to_vec(),
            data: imm.to_vec().into(),
            ..Default::default()
        })
    }
}

fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

fn tur() -> Vec<u8> {
    vec![0; 6]
}

fn prefs() -> SessionParams {
    SessionParams {
        max_connections: 8,
        initial_r2t: true,
        immediate_data: false,
        max_burst_length: 16384,
        first_burst_length: 8192,
        max_outstanding_r2t: 2,
        ..SessionParams::default()
    }
}

/// Clears the power-on unit attention so later status checks see GOOD.
fn clear_ua(c: &mut Raw, itt: u32) {
    let p = c.scsi(itt, c.cmdsn, &tur(), false, false, 0, &[]);
    c.cmdsn += 1;
    c.send(&p);
    let Pdu::ScsiResponse(_) = c.recv() else {
        panic!()
    };
}

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
                let (off, len) = (
                    r.buffer_offset as usize,
                    r.desired_data_transfer_length as usize,
                );
                for (sn, chunk) in data[off..off + len].chunks(4096).enumerate() {
                    a.send(&Pdu::DataOut(DataOut {
                        final_: (sn + 1) * 4096 >= len,
                        lun: lun_to_wire(0),
                        itt: 0x10,
                        ttt: r.ttt,
                        datasn: sn as u32,
                        buffer_offset: (off + sn * 4096) as u32,
                        data: chunk.to_vec().into(),
                        ..Default::default()
                    }));
                }
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
