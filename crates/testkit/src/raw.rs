//! The raw-PDU harness the target's tests share: a target in this process on a loopback
//! port, and `Raw`, a connection that logs in with the sans-IO login machine and then
//! sends and reads PDUs as they are, nothing more.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use iscsi::framing::{FrameLimits, PduDecoder};
use iscsi::login::{
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginResponseView, SessionType,
};
use iscsi::negotiate::{ConnectionParams, SessionParams, TargetPacing};
use iscsi::pdu::*;

use crate::inproc;

pub const IQN: &str = "iqn.2026-11.org.reservoir:raw";

/// A target in this process whose LUN 0 is a 16 MiB RAM store, with `session_toml` as its
/// `[session]` keys.
pub fn start(session_toml: &str) -> SocketAddr {
    start_with(session_toml, &inproc::ram("16MiB"))
}

/// A target whose LUN 0 is described by `lun_toml`.
pub fn start_with(session_toml: &str, lun_toml: &str) -> SocketAddr {
    start_toml(&inproc::one_lun(
        &format!("[session]\n{session_toml}"),
        IQN,
        lun_toml,
    ))
}

/// A target of this configuration (its portals: one on 127.0.0.1, port chosen).
pub fn start_toml(toml: &str) -> SocketAddr {
    inproc::spawn_thread(toml)
}

/// A raw connection: sends PDUs, reads PDUs, and nothing else.
pub struct Raw {
    pub s: TcpStream,
    pub dec: PduDecoder,
    pub buf: BytesMut,
    pub cmdsn: u32,
    pub statsn: u32,
    pub tsih: u16,
    pub params: SessionParams,
    pub conn: ConnectionParams,
    /// What the target answered to X-org.reservoir.PacingRate.
    pub pacing: TargetPacing,
}

impl Raw {
    pub fn login(
        addr: SocketAddr,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        cmdsn: u32,
        prefs: SessionParams,
    ) -> Raw {
        Self::login_paced(addr, isid, tsih, cid, cmdsn, prefs, None)
    }

    /// Logs in asking the target to pace the connection at `pacing_hint` bytes per second.
    pub fn login_paced(
        addr: SocketAddr,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        cmdsn: u32,
        prefs: SessionParams,
        pacing_hint: Option<u64>,
    ) -> Raw {
        Self::login_as(
            addr,
            "iqn.2026-11.org.reservoir:raw-initiator",
            isid,
            tsih,
            cid,
            cmdsn,
            prefs,
            pacing_hint,
        )
    }

    /// Logs in as the initiator named `initiator`.
    #[allow(clippy::too_many_arguments)]
    pub fn login_as(
        addr: SocketAddr,
        initiator: &str,
        isid: [u8; 6],
        tsih: u16,
        cid: u16,
        cmdsn: u32,
        prefs: SessionParams,
        pacing_hint: Option<u64>,
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
            pacing: TargetPacing::NotAsked,
        };
        let mut login = InitiatorLogin::new(InitiatorLoginConfig {
            initiator_name: initiator.into(),
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
            pacing_hint,
            start_hint: None,
            probe_hint: None,
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
                    raw.pacing = outcome.pacing;
                    raw.dec
                        .set_max_recv_data_segment(raw.conn.max_recv_data_segment_length);
                    return raw;
                }
                InitiatorStep::Failed(e) => panic!("login failed: {}", e.message),
            }
        }
    }

    pub fn send(&mut self, p: &Pdu) {
        let mut v = Vec::new();
        p.encode(&mut v, Digests::default());
        self.s.write_all(&v).unwrap();
    }

    pub fn send_bytes(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    pub fn recv(&mut self) -> Pdu {
        self.try_recv().expect("connection closed")
    }

    pub fn try_recv(&mut self) -> Option<Pdu> {
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
    pub fn scsi(
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

/// Task management, logout and recovery, as PDUs.
impl Raw {
    /// A TASK MANAGEMENT FUNCTION REQUEST (`function`, the high bit set here) about `task`;
    /// the response code.
    pub fn tmf(&mut self, itt: u32, function: u8, task: u32, refcmdsn: u32, expdatasn: u32) -> u8 {
        self.tmf_on(0, itt, function, task, refcmdsn, expdatasn)
    }

    /// [`Raw::tmf`] about LUN `lun`.
    pub fn tmf_on(
        &mut self,
        lun: u16,
        itt: u32,
        function: u8,
        task: u32,
        refcmdsn: u32,
        expdatasn: u32,
    ) -> u8 {
        let p = Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function: 0x80 | function,
            lun: lun_to_wire(lun),
            itt,
            referenced_task_tag: task,
            cmdsn: self.cmdsn,
            expstatsn: self.statsn,
            refcmdsn,
            expdatasn,
        });
        self.send(&p);
        let Pdu::TaskMgmtResponse(t) = self.recv() else {
            panic!("expected a TMF response")
        };
        assert_eq!(t.itt, itt);
        t.response
    }

    /// Connection 1 of this session died with write `task` (CmdSN `cmdsn`) waiting for
    /// data: logs it out for recovery from here, reassigns the task here (TASK REASSIGN)
    /// and returns the R2T the target then sends for the data it lacks.
    pub fn reassign_write_of_cid1(&mut self, task: u32, cmdsn: u32) -> R2t {
        // 0: closed now for recovery; 1: the target had seen it fail and handed it over.
        let logged_out = self.logout(0x601, 2, 1);
        assert!(logged_out <= 1, "logout for recovery answered {logged_out}");
        assert_eq!(self.tmf(0x602, 8, task, cmdsn, 0), 0, "function complete");
        let Pdu::R2t(again) = self.recv() else {
            panic!("expected an R2T on the new connection")
        };
        again
    }

    /// A Logout Request of `cid` for `reason`; the response code.
    pub fn logout(&mut self, itt: u32, reason: u8, cid: u16) -> u8 {
        let p = Pdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason,
            itt,
            cid,
            cmdsn: self.cmdsn,
            expstatsn: self.statsn,
        });
        self.send(&p);
        let Pdu::LogoutResponse(l) = self.recv() else {
            panic!("expected a logout response")
        };
        assert_eq!(l.itt, itt);
        l.response
    }

    /// One Data-Out PDU of `data` at `off` answering the R2T `ttt`.
    pub fn data_out(
        &mut self,
        itt: u32,
        ttt: u32,
        datasn: u32,
        off: usize,
        data: &[u8],
        last: bool,
    ) {
        self.send(&Pdu::DataOut(DataOut {
            final_: last,
            lun: lun_to_wire(0),
            itt,
            ttt,
            datasn,
            buffer_offset: off as u32,
            data: data.to_vec().into(),
            ..Default::default()
        }));
    }

    /// Reads `data.len()` bytes at LBA `lba` and checks them.
    pub fn check_read(&mut self, itt: u32, lba: u32, data: &[u8]) {
        let got = read_at(self, itt, lba, (data.len() / 512) as u16);
        assert!(got == data, "read back differs");
    }
}

pub fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

pub fn tur() -> Vec<u8> {
    vec![0; 6]
}

pub fn prefs() -> SessionParams {
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
pub fn clear_ua(c: &mut Raw, itt: u32) {
    let p = c.scsi(itt, c.cmdsn, &tur(), false, false, 0, &[]);
    c.cmdsn += 1;
    c.send(&p);
    let Pdu::ScsiResponse(_) = c.recv() else {
        panic!()
    };
}

/// Writes `data` at `lba` as the target's R2Ts ask, in 4 KiB Data-Out PDUs, and checks GOOD.
pub fn write_at(c: &mut Raw, itt: u32, lba: u32, data: &[u8]) {
    let w = c.scsi(
        itt,
        c.cmdsn,
        &write10(lba, (data.len() / 512) as u16),
        false,
        true,
        data.len() as u32,
        &[],
    );
    c.cmdsn += 1;
    c.send(&w);
    loop {
        match c.recv() {
            Pdu::R2t(r) => send_burst(c, itt, &r, data),
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.status, 0);
                return;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Answers one R2T with its part of `data`, in 4 KiB Data-Out PDUs.
pub fn send_burst(c: &mut Raw, itt: u32, r: &R2t, data: &[u8]) {
    let (off, len) = (
        r.buffer_offset as usize,
        r.desired_data_transfer_length as usize,
    );
    for (sn, chunk) in data[off..off + len].chunks(4096).enumerate() {
        c.send(&Pdu::DataOut(DataOut {
            final_: (sn + 1) * 4096 >= len,
            lun: lun_to_wire(0),
            itt,
            ttt: r.ttt,
            datasn: sn as u32,
            buffer_offset: (off + sn * 4096) as u32,
            data: chunk.to_vec().into(),
            ..Default::default()
        }));
    }
}

/// Reads `blocks` blocks at `lba`, checking GOOD.
pub fn read_at(c: &mut Raw, itt: u32, lba: u32, blocks: u16) -> Vec<u8> {
    let r = c.scsi(
        itt,
        c.cmdsn,
        &read10(lba, blocks),
        true,
        false,
        u32::from(blocks) * 512,
        &[],
    );
    c.cmdsn += 1;
    c.send(&r);
    let mut got = Vec::new();
    loop {
        let Pdu::DataIn(d) = c.recv() else {
            panic!("expected Data-In")
        };
        assert_eq!(d.buffer_offset as usize, got.len());
        got.extend_from_slice(&d.data);
        if d.status_present {
            assert_eq!(d.status, 0);
            return got;
        }
    }
}
