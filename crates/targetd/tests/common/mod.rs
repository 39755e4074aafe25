//! The raw-PDU harness the target's tests share: a target in this process on a loopback
//! port, and `Raw`, a connection that logs in with the sans-IO login machine and then
//! sends and reads PDUs as they are, nothing more.
#![allow(dead_code)]

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
use targetd::config::Config;

pub const IQN: &str = "iqn.2026-11.org.reservoir:raw";

pub fn start(session_toml: &str) -> SocketAddr {
    start_with(session_toml, "backstore = \"ram\"\nsize = \"16MiB\"")
}

/// A target whose LUN 0 is described by `lun_toml`.
pub fn start_with(session_toml: &str, lun_toml: &str) -> SocketAddr {
    start_toml(&format!(
        r#"
[session]
{session_toml}
[[target]]
iqn = "{IQN}"
[[target.lun]]
id = 0
{lun_toml}
"#
    ))
}

/// A target of this configuration (its portals: one on 127.0.0.1, port chosen).
pub fn start_toml(toml: &str) -> SocketAddr {
    let toml = format!("portals = [\"127.0.0.1:0\"]\n{toml}");
    let config = Config::parse(&toml, "test").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let server = targetd::Server::bind(config, &backstore::Registry::with_builtins())
                .await
                .unwrap();
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
