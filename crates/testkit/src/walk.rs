//! The LUN-masking walk: an initiator masked to some LUNs of a target sends every opcode
//! and service action the target lists in REPORT SUPPORTED OPERATION CODES, with no data,
//! reading and writing, to a LUN it may see, to a LUN it may not see and to a LUN that
//! does not exist; then the crafted cross-LU commands (EXTENDED COPY both ways,
//! persistent reservations with ALL_TG_PT and REGISTER AND MOVE). It must not read a
//! hidden LUN's bytes, change them or its reservations, and every answer about a hidden
//! LUN must be the answer about a LUN that does not exist: nothing beyond what SPC
//! requires. Run through three clients: raw PDUs (each LUN named by every address
//! method), Reservoir's initiator, and libiscsi through `libiscsi_cdb.c`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A command's data phase.
#[derive(Clone, Debug)]
pub enum Dir {
    None,
    Read(u32),
    Write(Vec<u8>),
}

/// What came back: status, sense key/ASC/ASCQ (zeros without sense), and Data-In.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u8,
    pub sense: (u8, u8, u8),
    pub data: Vec<u8>,
}

pub trait Client {
    /// Sends one command; `Err` when the transport could not carry it.
    fn cmd(&mut self, lun: u16, cdb: &[u8], dir: &Dir) -> Result<Answer, String>;
}

/// Sends a command again while it meets a UNIT ATTENTION (a reset or a reservation
/// change reported to this nexus); the walk compares answers, not attentions.
fn send(c: &mut dyn Client, lun: u16, cdb: &[u8], dir: &Dir) -> Answer {
    for _ in 0..8 {
        let a = c
            .cmd(lun, cdb, dir)
            .unwrap_or_else(|e| panic!("LUN {lun}, CDB {cdb:02x?}: {e}"));
        if a.status != 0x02 || a.sense.0 != 0x06 {
            return a;
        }
    }
    panic!("LUN {lun}, CDB {cdb:02x?}: unit attentions keep coming");
}

/// Reservoir's own initiator.
pub struct Ours {
    rt: tokio::runtime::Runtime,
    session: initiator::Session,
}

impl Ours {
    pub fn login(portal: &str, iqn: &str, initiator_name: &str) -> Ours {
        Self::login_with(portal, iqn, initiator_name, Default::default())
    }

    pub fn login_with(
        portal: &str,
        iqn: &str,
        initiator_name: &str,
        opts: initiator::SessionOptions,
    ) -> Ours {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let url = initiator::IscsiUrl::parse(&format!("iscsi://{portal}/{iqn}/0")).unwrap();
        let opts = initiator::SessionOptions {
            initiator_name: initiator_name.into(),
            ..opts
        };
        let session = rt
            .block_on(initiator::Session::connect(&url, &opts))
            .unwrap_or_else(|e| panic!("{initiator_name} logs in: {e:#}"));
        Ours { rt, session }
    }
}

impl Client for Ours {
    fn cmd(&mut self, lun: u16, cdb: &[u8], dir: &Dir) -> Result<Answer, String> {
        let dir = match dir {
            Dir::None => initiator::DataDir::None,
            Dir::Read(n) => initiator::DataDir::Read(*n),
            Dir::Write(d) => initiator::DataDir::Write(d.clone().into()),
        };
        let r = self
            .rt
            .block_on(self.session.command(lun, cdb, dir))
            .map_err(|e| format!("{e:#}"))?;
        Ok(Answer {
            status: r.status,
            sense: r.sense.map(|s| (s.key, s.asc, s.ascq)).unwrap_or_default(),
            data: r.data.to_vec(),
        })
    }
}

/// Raw PDUs: logs in with the sans-IO login machine, then sends each command as one SCSI
/// Command PDU (its data as immediate data, or as R2Ts ask) and reads the PDUs back as
/// they are. Each command's LUN field takes the next of the three LUN address methods the
/// target decodes (peripheral, flat, extended flat), so a hidden LUN is named every way.
pub struct RawPdus {
    s: std::net::TcpStream,
    dec: iscsi::framing::PduDecoder,
    buf: bytes::BytesMut,
    cmdsn: u32,
    statsn: u32,
    itt: u32,
}

impl RawPdus {
    pub fn login(portal: &str, iqn: &str, initiator_name: &str) -> RawPdus {
        use iscsi::login::{
            InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginResponseView,
        };
        use iscsi::negotiate::ConnectionParams;
        let s = std::net::TcpStream::connect(portal).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut raw = RawPdus {
            s,
            dec: iscsi::framing::PduDecoder::new(iscsi::framing::FrameLimits::default()),
            buf: bytes::BytesMut::new(),
            cmdsn: 1,
            statsn: 0,
            itt: 0,
        };
        let mut login = InitiatorLogin::new(InitiatorLoginConfig {
            initiator_name: initiator_name.into(),
            initiator_alias: None,
            target_name: Some(iqn.into()),
            session_type: iscsi::login::SessionType::Normal,
            isid: [0x80, 0, 0, 0, 0x3a, 0x11],
            tsih: 0,
            cid: 1,
            auth: None,
            session: Default::default(),
            connection: ConnectionParams {
                max_recv_data_segment_length: 65536,
                ..ConnectionParams::default()
            },
            leading: true,
            pacing_hint: None,
            start_hint: None,
            probe_hint: None,
        });
        let mut rng = |b: &mut [u8]| b.fill(9);
        let mut out = login.start(&mut rng);
        loop {
            let pdu = out.clone().into_pdu(1, raw.cmdsn, raw.statsn);
            raw.send(&iscsi::pdu::Pdu::LoginRequest(pdu)).unwrap();
            let Ok(iscsi::pdu::Pdu::LoginResponse(r)) = raw.recv() else {
                panic!("{initiator_name}: expected a login response")
            };
            raw.statsn = r.statsn.wrapping_add(1);
            match login.on_response(&LoginResponseView::from(&r), &mut rng) {
                InitiatorStep::Send(next) => out = next,
                InitiatorStep::Done(done) => {
                    raw.dec
                        .set_max_recv_data_segment(done.connection.max_recv_data_segment_length);
                    return raw;
                }
                InitiatorStep::Failed(e) => panic!("{initiator_name} logs in: {}", e.message),
            }
        }
    }

    fn send(&mut self, p: &iscsi::pdu::Pdu) -> Result<(), String> {
        use std::io::Write;
        let mut v = Vec::new();
        p.encode(&mut v, iscsi::pdu::Digests::default());
        self.s.write_all(&v).map_err(|e| e.to_string())
    }

    fn recv(&mut self) -> Result<iscsi::pdu::Pdu, String> {
        use std::io::Read;
        loop {
            if let Some(p) = self
                .dec
                .decode(&mut self.buf)
                .map_err(|e| format!("{e:?}"))?
            {
                return Ok(p);
            }
            let mut tmp = [0u8; 65536];
            let n = self.s.read(&mut tmp).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("connection closed".into());
            }
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }
}

impl Client for RawPdus {
    fn cmd(&mut self, lun: u16, cdb: &[u8], dir: &Dir) -> Result<Answer, String> {
        use iscsi::pdu::{DataOut, Pdu, ScsiCommand};
        if cdb.len() > 16 {
            return Err(format!("a {}-byte CDB needs an AHS", cdb.len()));
        }
        self.itt = self.itt.wrapping_add(1);
        let lun = match self.itt % 3 {
            0 => iscsi::pdu::lun_to_wire(lun),
            1 => (0x4000 | u64::from(lun)) << 48,
            _ => (0xd2 << 56) | (u64::from(lun) << 32),
        };
        let (read, write, edtl, out) = match dir {
            Dir::None => (false, false, 0, &[][..]),
            Dir::Read(n) => (true, false, *n, &[][..]),
            Dir::Write(d) => (false, true, d.len() as u32, &d[..]),
        };
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        self.send(&Pdu::ScsiCommand(ScsiCommand {
            read,
            write,
            final_: true,
            lun,
            itt: self.itt,
            edtl,
            cmdsn: self.cmdsn,
            expstatsn: self.statsn,
            cdb: c.to_vec(),
            data: bytes::Bytes::copy_from_slice(&out[..out.len().min(65536)]),
            ..Default::default()
        }))?;
        self.cmdsn = self.cmdsn.wrapping_add(1);
        let mut data = Vec::new();
        loop {
            match self.recv()? {
                Pdu::DataIn(d) => {
                    data.extend_from_slice(&d.data);
                    if d.status_present {
                        self.statsn = d.statsn.wrapping_add(1);
                        return Ok(Answer {
                            status: d.status,
                            sense: (0, 0, 0),
                            data,
                        });
                    }
                }
                Pdu::R2t(r) => {
                    let at = r.buffer_offset as usize;
                    let end = (at + r.desired_data_transfer_length as usize).min(out.len());
                    self.send(&Pdu::DataOut(DataOut {
                        final_: true,
                        lun,
                        itt: self.itt,
                        ttt: r.ttt,
                        expstatsn: self.statsn,
                        datasn: 0,
                        buffer_offset: r.buffer_offset,
                        data: bytes::Bytes::copy_from_slice(&out[at.min(end)..end]),
                    }))?;
                }
                Pdu::ScsiResponse(r) => {
                    self.statsn = r.statsn.wrapping_add(1);
                    // Sense data: a 2-byte length, then fixed (70h) or descriptor (72h).
                    let sense = match &r.data[..] {
                        [_, _, s @ ..] if s.len() >= 14 && s[0] & 0x7f == 0x70 => {
                            (s[2] & 0x0f, s[12], s[13])
                        }
                        [_, _, s @ ..] if s.len() >= 4 && s[0] & 0x7f == 0x72 => {
                            (s[1] & 0x0f, s[2], s[3])
                        }
                        _ => (0, 0, 0),
                    };
                    return Ok(Answer {
                        status: r.status,
                        sense,
                        data,
                    });
                }
                Pdu::NopIn(_) => {}
                other => return Err(format!("unexpected {other:?}")),
            }
        }
    }
}

/// libiscsi, through `libiscsi_cdb.c` built with the system's cc.
pub struct Libiscsi {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Libiscsi {
    /// Builds the client in `dir` (needs cc and libiscsi-dev).
    pub fn build(dir: &Path) -> std::path::PathBuf {
        crate::build_libiscsi_client(dir)
    }

    pub fn login(bin: &Path, portal: &str, iqn: &str, initiator_name: &str, lun: u16) -> Libiscsi {
        let mut child = Command::new(bin)
            .args([initiator_name, portal, iqn, &lun.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the libiscsi client");
        let to = child.stdin.take().unwrap();
        let mut from = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        from.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "libiscsi client as {initiator_name}: {line}"
        );
        Libiscsi { child, to, from }
    }

    /// Starts a stream of writes (`libiscsi_cdb.c`'s `stream`): one WRITE(16) of `blocks`
    /// 512-byte blocks in flight per slot, each write's bytes its own sequence number,
    /// for at most `submit_ms`, stopping at the first answer that is not GOOD, then up to
    /// `grace_ms` for the writes still out. Returns once a first write answered GOOD (the
    /// stream is flowing); [`Libiscsi::stream_result`] waits for its end. No other
    /// request may be sent meanwhile.
    pub fn start_stream(
        &mut self,
        lun: u16,
        slots: u32,
        blocks: u32,
        submit_ms: u32,
        grace_ms: u32,
    ) {
        writeln!(
            self.to,
            "stream {lun} {slots} {blocks} {submit_ms} {grace_ms}"
        )
        .unwrap();
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "streaming", "libiscsi client's stream: {line}");
    }

    /// How the stream [`Libiscsi::start_stream`] began ended.
    pub fn stream_result(&mut self) -> Stream {
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(
            f.len() == 7 && f[0] == "stream",
            "libiscsi client's stream: {line}"
        );
        let n = |i: usize| f[i].parse::<u64>().unwrap();
        let senses = if f[6] == "-" {
            Vec::new()
        } else {
            f[6].split(',')
                .map(|s| {
                    let b: Vec<u8> = s
                        .split('/')
                        .map(|x| u8::from_str_radix(x, 16).unwrap())
                        .collect();
                    (b[0], b[1], b[2])
                })
                .collect()
        };
        Stream {
            good: n(1),
            conflict: n(2),
            check: n(3),
            other: n(4),
            unanswered: n(5),
            senses,
        }
    }

    /// Each slot of a stream, read back: the sequence number of the write its blocks
    /// hold (`Some(0)` never written), `None` when they do not all hold the same one or
    /// the read failed.
    pub fn seqs(&mut self, lun: u16, slots: u32, blocks: u32) -> Vec<Option<u64>> {
        writeln!(self.to, "seqs {lun} {slots} {blocks}").unwrap();
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        let mut f = line.split_whitespace();
        assert_eq!(f.next(), Some("seqs"), "libiscsi client's seqs: {line}");
        f.map(|x| x.parse().ok()).collect()
    }
}

/// What a stream of writes ([`Libiscsi::start_stream`]) met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    pub good: u64,
    pub conflict: u64,
    pub check: u64,
    /// Neither GOOD, RESERVATION CONFLICT nor CHECK CONDITION (TASK ABORTED among them),
    /// or lost with the connection.
    pub other: u64,
    /// Writes never answered by the end of the grace: aborted by the target with TAS 0.
    pub unanswered: u64,
    /// Sense key, ASC, ASCQ of each CHECK CONDITION, in order.
    pub senses: Vec<(u8, u8, u8)>,
}

fn hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    if s == "-" {
        return Vec::new();
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

impl Client for Libiscsi {
    fn cmd(&mut self, lun: u16, cdb: &[u8], dir: &Dir) -> Result<Answer, String> {
        let (d, len, data) = match dir {
            Dir::None => ("n", 0, "-".to_string()),
            Dir::Read(n) => ("r", *n, "-".to_string()),
            Dir::Write(v) => ("w", v.len() as u32, hex(v)),
        };
        writeln!(self.to, "{lun} {d} {len} {} {data}", hex(cdb)).map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.from.read_line(&mut line).map_err(|e| e.to_string())?;
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first() == Some(&"ERROR") || f.len() != 5 {
            return Err(line);
        }
        let n = |i: usize| f[i].parse::<u8>().unwrap();
        Ok(Answer {
            status: n(0),
            sense: (n(1), n(2), n(3)),
            data: unhex(f[4]),
        })
    }
}

impl Drop for Libiscsi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The target as the walk sees it.
pub struct Layout {
    /// A LUN the masked initiator may see.
    pub visible: u16,
    /// A LUN it may not see (the admin sees it).
    pub hidden: u16,
    /// A LUN the target does not have.
    pub absent: u16,
    pub block_size: usize,
}

/// What the walk did, for the test's output.
#[derive(Debug, Default)]
pub struct Report {
    pub opcodes: usize,
    pub commands: usize,
}

/// The bytes the admin writes at the start of the hidden LUN; none of them may reach the
/// masked initiator.
fn marker(len: usize) -> Vec<u8> {
    b"HIDDEN-LUN-SECRET-"
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

const MARKER_BLOCKS: usize = 64;

/// The initiator that sees every LUN (it receives the masked one's reservation).
pub const ADMIN: &str = "iqn.2026-11.org.reservoir:walk-admin";
/// The initiator masked to `Layout::visible`.
pub const MASKED: &str = "iqn.2026-11.org.reservoir:walk-masked";
/// An initiator the target does not admit.
pub const STRANGER: &str = "iqn.2026-11.org.reservoir:walk-stranger";

/// Puts the CDB's LBA at 0 and its transfer (or parameter/allocation) length at 1 where
/// the common layouts of its size keep them.
fn cdb_for(opcode: u8, sa: Option<u16>, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; len];
    c[0] = opcode;
    match len {
        6 => c[4] = 1,
        10 => c[8] = 1,
        12 => c[9] = 1,
        16 => c[13] = 1,
        _ => {}
    }
    if let Some(sa) = sa {
        if opcode == 0x7f && len >= 10 {
            c[7] = (len - 8) as u8;
            c[8..10].copy_from_slice(&sa.to_be_bytes());
        } else {
            c[1] = (c[1] & !0x1f) | (sa as u8 & 0x1f);
        }
    }
    c
}

/// (opcode, service action, CDB length) of every command the LUN lists.
fn supported(c: &mut dyn Client, lun: u16) -> Vec<(u8, Option<u16>, usize)> {
    let rsoc = [0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0];
    let a = send(c, lun, &rsoc, &Dir::Read(0x4000));
    assert_eq!(a.status, 0, "REPORT SUPPORTED OPERATION CODES: {a:?}");
    let d = &a.data;
    let total = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    let mut at = 4;
    let mut out = Vec::new();
    while at + 8 <= d.len().min(4 + total) {
        let e = &d[at..at + 8];
        let sa = (e[5] & 0x01 != 0).then(|| u16::from_be_bytes([e[2], e[3]]));
        out.push((e[0], sa, u16::from_be_bytes([e[6], e[7]]) as usize));
        at += if e[5] & 0x02 != 0 { 20 } else { 8 };
    }
    assert!(out.len() > 20, "only {} commands listed", out.len());
    out
}

/// VPD page 83h's NAA designator of `lun` (what an EXTENDED COPY names it by).
fn naa_of(c: &mut dyn Client, lun: u16) -> Vec<u8> {
    let a = send(c, lun, &[0x12, 0x01, 0x83, 0x01, 0x00, 0], &Dir::Read(256));
    assert_eq!(a.status, 0, "VPD 83h of LUN {lun}: {a:?}");
    let p = &a.data;
    let mut at = 4;
    while at + 4 <= p.len() {
        let len = p[at + 3] as usize;
        if p[at + 1] & 0x0f == 3 && (p[at + 1] >> 4) & 0x03 == 0 {
            return p[at..at + 4 + len].to_vec();
        }
        at += 4 + len;
    }
    panic!("LUN {lun} has no NAA designator");
}

/// An EXTENDED COPY (LID1) parameter list: CSCD identification descriptors for
/// `designators` (each a VPD 83h designation descriptor) and one block-to-block segment
/// from the first to the second of `blocks` blocks.
fn xcopy_list(designators: &[&[u8]], block_size: usize, blocks: u16) -> Vec<u8> {
    let mut cscds = Vec::new();
    for d in designators {
        let mut c = [0u8; 32];
        c[0] = 0xe4;
        c[1] = 0x00;
        c[4..4 + d.len()].copy_from_slice(d);
        c[29..32].copy_from_slice(&(block_size as u32).to_be_bytes()[1..]);
        cscds.extend_from_slice(&c);
    }
    let mut seg = [0u8; 28];
    seg[0] = 0x02;
    seg[2..4].copy_from_slice(&24u16.to_be_bytes());
    seg[4..6].copy_from_slice(&0u16.to_be_bytes());
    seg[6..8].copy_from_slice(&1u16.to_be_bytes());
    seg[10..12].copy_from_slice(&blocks.to_be_bytes());
    let mut p = vec![0u8; 16];
    p[0] = 7;
    p[1] = 0x18; // LIST ID USAGE 11b: no list identifier kept
    p[2..4].copy_from_slice(&(cscds.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(seg.len() as u32).to_be_bytes());
    p.extend_from_slice(&cscds);
    p.extend_from_slice(&seg);
    p
}

fn xcopy_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn pr_out(sa: u8, scope_type: u8, param: &[u8]) -> Vec<u8> {
    let mut c = vec![0x5f, sa, scope_type, 0, 0, 0, 0, 0, 0, 0];
    c[5..9].copy_from_slice(&(param.len() as u32).to_be_bytes());
    c
}

fn pr_register_params(key: u64, sa_key: u64, flags: u8) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    p
}

/// PR IN READ KEYS and READ RESERVATION of `lun` as `c` sees them.
fn pr_state(c: &mut dyn Client, lun: u16) -> (Answer, Answer) {
    let keys = send(
        c,
        lun,
        &[0x5e, 0x00, 0, 0, 0, 0, 0, 0x10, 0, 0],
        &Dir::Read(0x1000),
    );
    let res = send(
        c,
        lun,
        &[0x5e, 0x01, 0, 0, 0, 0, 0, 0x10, 0, 0],
        &Dir::Read(0x1000),
    );
    (keys, res)
}

/// Walks the command set as `masked` against `layout`, with `admin` (sees every LUN)
/// preparing and checking the hidden LUN. Panics at the first leak.
pub fn walk(masked: &mut dyn Client, admin: &mut dyn Client, l: &Layout) -> Report {
    let bs = l.block_size;
    let secret = marker(MARKER_BLOCKS * bs);
    let mut write = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, MARKER_BLOCKS as u8, 0];
    let a = send(admin, l.hidden, &write, &Dir::Write(secret.clone()));
    assert_eq!(a.status, 0, "admin writes the hidden LUN: {a:?}");
    write[0] = 0x28;
    let read_hidden = write.clone();
    let hidden_naa = naa_of(admin, l.hidden);
    let visible_naa = naa_of(admin, l.visible);
    let hidden_pr = pr_state(admin, l.hidden);

    let luns = send(
        masked,
        l.visible,
        &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &Dir::Read(4096),
    );
    assert_eq!(luns.status, 0);
    let listed: Vec<u16> = luns.data[8..]
        .chunks(8)
        .map(|e| u16::from_be_bytes([e[0] & 0x3f, e[1]]))
        .collect();
    assert_eq!(
        listed,
        vec![l.visible],
        "REPORT LUNS of the masked initiator"
    );

    let mut report = Report::default();
    let mut seen: Vec<u8> = Vec::new();
    let ops = supported(masked, l.visible);
    report.opcodes = ops.len();
    let dirs = [Dir::None, Dir::Read(4096), Dir::Write(vec![0xee; bs])];
    for &(op, sa, len) in &ops {
        let cdb = cdb_for(op, sa, len);
        for dir in &dirs {
            let hidden = send(masked, l.hidden, &cdb, dir);
            let absent = send(masked, l.absent, &cdb, dir);
            assert_eq!(
                hidden, absent,
                "opcode {op:02x} sa {sa:?} {dir:?}: a hidden LUN answers unlike an absent one"
            );
            seen.extend_from_slice(&hidden.data);
            let v = send(masked, l.visible, &cdb, dir);
            seen.extend_from_slice(&v.data);
            report.commands += 3;
        }
    }

    // EXTENDED COPY naming the hidden LUN by its designator, both ways and to itself,
    // sent to the visible one: refused as a copy target that does not exist is.
    let made_up = {
        let mut d = hidden_naa.clone();
        let last = d.len() - 1;
        d[last] ^= 0x5a;
        d
    };
    let expect = {
        let p = xcopy_list(&[&made_up, &visible_naa], bs, 8);
        send(masked, l.visible, &xcopy_cdb(p.len()), &Dir::Write(p))
    };
    assert_eq!(
        expect.status, 0x02,
        "a copy from a LUN that does not exist: {expect:?}"
    );
    for pair in [
        [&hidden_naa, &visible_naa],
        [&visible_naa, &hidden_naa],
        [&hidden_naa, &hidden_naa],
    ] {
        let p = xcopy_list(&[pair[0], pair[1]], bs, 8);
        let a = send(masked, l.visible, &xcopy_cdb(p.len()), &Dir::Write(p));
        assert_eq!(a, expect, "EXTENDED COPY reaching the hidden LUN");
        report.commands += 1;
    }
    let v = send(
        masked,
        l.visible,
        &read_hidden,
        &Dir::Read((MARKER_BLOCKS * bs) as u32),
    );
    seen.extend_from_slice(&v.data);

    // Reservations: registered for all target ports, reserved, moved; they stay on the
    // LU they were made on.
    let reg = pr_register_params(0, 0xb0b, 0x04);
    send(
        masked,
        l.visible,
        &pr_out(0x00, 0, &reg),
        &Dir::Write(reg.clone()),
    );
    let res = pr_register_params(0xb0b, 0, 0);
    send(
        masked,
        l.visible,
        &pr_out(0x01, 0x01, &res),
        &Dir::Write(res.clone()),
    );
    let move_to = |name: &str| {
        let mut mv = vec![0u8; 24];
        mv[0..8].copy_from_slice(&0xb0bu64.to_be_bytes());
        mv[8..16].copy_from_slice(&0xa0au64.to_be_bytes());
        let mut tid = format!("{name}\0").into_bytes();
        tid.resize(tid.len().div_ceil(4) * 4, 0);
        let mut t = vec![0x05, 0, 0, 0];
        t[2..4].copy_from_slice(&(tid.len() as u16).to_be_bytes());
        t.extend_from_slice(&tid);
        mv[20..24].copy_from_slice(&(t.len() as u32).to_be_bytes());
        mv.extend_from_slice(&t);
        mv
    };
    // Not to an initiator the target does not admit: it could never use or release it.
    let mv = move_to(STRANGER);
    let refused = send(
        masked,
        l.visible,
        &pr_out(0x07, 0x01, &mv),
        &Dir::Write(mv.clone()),
    );
    assert_eq!(
        (refused.status, refused.sense),
        (0x02, (0x05, 0x26, 0x00)),
        "REGISTER AND MOVE to an initiator the target does not admit"
    );
    let mv = move_to(ADMIN);
    let moved = send(
        masked,
        l.visible,
        &pr_out(0x07, 0x01, &mv),
        &Dir::Write(mv.clone()),
    );
    assert_eq!(moved.status, 0, "REGISTER AND MOVE to the admin: {moved:?}");
    report.commands += 4;
    // The admin registers its own nexus and clears every registration and the
    // reservation for whatever runs next.
    let reg = pr_register_params(0, 0xa0a, 0);
    let a = send(
        admin,
        l.visible,
        &pr_out(0x06, 0, &reg),
        &Dir::Write(reg.clone()),
    );
    assert_eq!(
        a.status, 0,
        "the admin registers on LUN {}: {a:?}",
        l.visible
    );
    let clear = pr_register_params(0xa0a, 0, 0);
    let a = send(
        admin,
        l.visible,
        &pr_out(0x03, 0, &clear),
        &Dir::Write(clear.clone()),
    );
    assert_eq!(
        a.status, 0,
        "the admin clears LUN {}'s reservations: {a:?}",
        l.visible
    );

    // The hidden LUN as the admin finds it afterwards: its blocks and its reservations
    // as they were, and writable by the admin (no reservation reached it).
    let back = send(
        admin,
        l.hidden,
        &read_hidden,
        &Dir::Read((MARKER_BLOCKS * bs) as u32),
    );
    assert_eq!(back.status, 0);
    assert!(back.data == secret, "the hidden LUN's blocks changed");
    assert_eq!(
        pr_state(admin, l.hidden),
        hidden_pr,
        "the hidden LUN's reservations changed"
    );
    let mut w = write.clone();
    w[0] = 0x2a;
    w[8] = 1;
    let a = send(admin, l.hidden, &w, &Dir::Write(secret[..bs].to_vec()));
    assert_eq!(
        a.status, 0,
        "the admin writes the hidden LUN after the walk: {a:?}"
    );

    let needle = &secret[..32];
    assert!(
        !seen.windows(needle.len()).any(|w| w == needle),
        "the masked initiator read the hidden LUN's bytes"
    );
    report
}
