//! The analysis, sans-IO: frames in, per-connection report out.
//!
//! For each TCP connection and each direction: the data packets (time, relative sequence
//! number, length), the ACKs that came back for them, **bursts** and the **gaps** between
//! them, and — where the bytes are iSCSI in clear text and were captured whole — the PDUs
//! reassembled from the TCP stream with `iscsi::framing::PduDecoder`, and each SCSI
//! command's latency split into target time and network time.
//!
//! **Burst.** A burst is a run of data packets one sender sent back to back: each follows
//! the one before it by no more than the burst gap. With a link rate given, the gap is one
//! and a half times the later packet's serialization time at that rate (its IP length ×
//! 8 / rate): packets the sender emitted as fast as the link drains them or faster. Without
//! one, a fixed gap (default 100 µs). Pure ACKs in the same direction neither count nor
//! break a burst. A burst's size is given in packets as captured, bytes of payload, and
//! segments (payload / the MSS of the SYN, rounded up: a GSO/TSO blob captured on loopback
//! or before segmentation counts as the segments it becomes).
//!
//! **Command latency**, from what the capture point sees: `total` = first packet of the
//! command's PDU → the packet that completed its SCSI Response (or Data-In with status).
//! `to_first` = command → the first byte of the first answer (R2T, Data-In or Response).
//! The capture point sees the target's answer one round trip (capture → target → capture)
//! after the command passed plus whatever the target took; that round trip, `rtt_to_target`,
//! is the smallest time seen between a packet toward the target and the target's ACK
//! covering it (or the SYN → SYN/ACK). So **target time** = `to_first` − `rtt_to_target`
//! (at least 0): the target working before it answered, its queueing included; **network
//! time** = `total` − target time: the round trip and the time the data took to cross
//! (both ways' serialization, the window, the congestion control). Captured next to the
//! target, `rtt_to_target` is about 0 and target time is what the target took; next to the
//! initiator it removes the path.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use bytes::BytesMut;
use iscsi::framing::{FrameError, FrameLimits, PduDecoder};
use iscsi::pdu::{self, Digests, Opcode, Pdu, BHS_LEN};
use serde::Serialize;

use crate::packet::{self, Tcp, ACK, SYN};
use crate::pcap::Frame;

/// How bursts are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum BurstRule {
    /// Back to back: within this many nanoseconds of the packet before.
    Gap { ns: u64 },
    /// Within 1.5 × the packet's serialization time at this rate (bits/s).
    Link { rate_bps: u64 },
}

impl BurstRule {
    pub const DEFAULT_GAP_NS: u64 = 100_000;

    fn threshold_ns(self, ip_len: u32) -> u64 {
        match self {
            BurstRule::Gap { ns } => ns,
            BurstRule::Link { rate_bps } => {
                (u128::from(ip_len) * 8 * 1_500_000_000 / u128::from(rate_bps.max(1))) as u64
            }
        }
    }

    pub fn describe(self) -> String {
        match self {
            BurstRule::Gap { ns } => format!("gap ≤ {:.1} µs", ns as f64 / 1e3),
            BurstRule::Link { rate_bps } => format!(
                "gap ≤ 1.5 × serialization at {:.0} Mbit/s ({:.1} µs for 1500 bytes)",
                rate_bps as f64 / 1e6,
                1500.0 * 8.0 * 1.5 / rate_bps as f64 * 1e6
            ),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Only connections with this port on one side (it is then the server's).
    pub port: Option<u16>,
    pub burst: BurstRule,
    /// Skip iSCSI decoding.
    pub no_iscsi: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: None,
            burst: BurstRule::Gap {
                ns: BurstRule::DEFAULT_GAP_NS,
            },
            no_iscsi: false,
        }
    }
}

/// A distribution's summary (nearest-rank percentiles).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Dist {
    pub count: usize,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
    pub mean: f64,
}

impl Dist {
    pub fn of(values: &[f64]) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Dist {
            count: v.len(),
            median: rank(0.5),
            p90: rank(0.9),
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// One data packet: time since the capture's first frame, sequence number relative to
/// the direction's first byte, payload length.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    pub t_ns: u64,
    pub seq: u64,
    pub len: u32,
    pub retransmit: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Bursts {
    pub count: usize,
    pub packets: Dist,
    pub segments: Dist,
    pub bytes: Dist,
    /// Gaps between bursts, microseconds.
    pub gaps_us: Dist,
    /// Share of the payload bytes sent in bursts of one packet (%).
    pub single_packet_pct: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Direction {
    pub packets: u64,
    pub data_packets: u64,
    pub payload_bytes: u64,
    /// Data packets that end at or below the highest sequence already seen: retransmitted,
    /// or reordered before the capture point.
    pub retransmits: u64,
    pub mss: Option<u32>,
    /// Payload over the time from its first to its last data packet.
    pub mbit_per_s: f64,
    pub bursts: Bursts,
    /// Every data packet (in JSON only with `--packets`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<Point>,
    /// The other side's ACKs of this direction's bytes: (time, relative ACK number).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub acks: Vec<(u64, u64)>,
    /// Each burst's size in segments, in order (in JSON with `--packets`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub burst_sizes: Vec<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PduRecord {
    pub t_ns: u64,
    /// The packet that completed it.
    pub t_end_ns: u64,
    /// "i>t" (initiator to target) or "t>i".
    pub dir: &'static str,
    pub opcode: u8,
    pub name: String,
    pub itt: u32,
    pub buffer_offset: Option<u32>,
    /// DataSegmentLength.
    pub data_len: u32,
    /// An R2T's desired data transfer length.
    pub r2t_len: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Command {
    pub itt: u32,
    /// The CDB's operation code.
    pub op: u8,
    pub read: bool,
    pub write: bool,
    pub length: u32,
    pub t_ns: u64,
    pub first_answer: Option<String>,
    pub to_first_ms: Option<f64>,
    pub total_ms: Option<f64>,
    pub target_ms: Option<f64>,
    pub network_ms: Option<f64>,
    pub status: Option<u8>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Iscsi {
    pub pdus: Vec<PduRecord>,
    pub commands: Vec<Command>,
    pub total_ms: Dist,
    pub target_ms: Dist,
    pub network_ms: Dist,
    pub header_digest: bool,
    pub data_digest: bool,
    /// Why decoding stopped in a direction, if it did.
    pub stopped: Vec<String>,
    /// Stretches of a stream the capture does not hold (dropped by the capturer), skipped.
    pub holes: Vec<String>,
    pub decode_errors: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Connection {
    pub client: SocketAddr,
    pub server: SocketAddr,
    pub start_s: f64,
    pub duration_s: f64,
    /// Capture point → server → capture point, milliseconds (smallest seen).
    pub rtt_to_server_ms: Option<f64>,
    pub rtt_to_client_ms: Option<f64>,
    pub to_server: Direction,
    pub to_client: Direction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<Iscsi>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub frames: u64,
    pub tcp_packets: u64,
    /// The first frame's time, seconds since the Unix epoch; every `t_ns` counts from it.
    pub start_unix_s: f64,
    pub burst_rule: String,
    pub connections: Vec<Connection>,
}

/// The stream of one direction reassembled for the PDU decoder.
struct Reasm {
    /// Next relative sequence number wanted; `None` before the stream's start is known.
    next: Option<u64>,
    pending: BTreeMap<u64, (Vec<u8>, u64)>,
    pending_bytes: usize,
    buf: BytesMut,
    /// Bytes appended so far, and when each chunk arrived (stream offset, time).
    appended: u64,
    chunks: VecDeque<(u64, u64)>,
    decoder: PduDecoder,
    stopped: Option<String>,
    from_initiator: bool,
    /// Holes in the stream the capture never filled, skipped to the next PDU start.
    holes: Vec<String>,
}

const MAX_PENDING: usize = 64 << 20;
/// A hole with this much of the stream captured after it is taken as lost by the capture
/// (a sender's retransmission would have filled it long before).
const HOLE_AFTER: usize = 4 << 20;

impl Reasm {
    fn new(from_initiator: bool) -> Reasm {
        Reasm {
            next: None,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            buf: BytesMut::new(),
            appended: 0,
            chunks: VecDeque::new(),
            decoder: PduDecoder::new(FrameLimits {
                max_recv_data_segment: 16_777_215,
            }),
            stopped: None,
            from_initiator,
            holes: Vec::new(),
        }
    }

    /// Skips a hole the capture left: drops what is buffered of the PDU it cut, and goes
    /// on at the first segment after it that starts with a plausible PDU header.
    fn skip_hole(&mut self) {
        let Some(next) = self.next else { return };
        let digests = self.decoder.digests();
        while let Some((s, (p, t))) = self.pending.pop_first() {
            self.pending_bytes -= p.len();
            if self.plausible_bhs(&p) {
                self.holes.push(format!(
                    "stream bytes {next}..{s} not captured; the PDU they cut was skipped"
                ));
                self.buf.clear();
                self.chunks.clear();
                self.appended = 0;
                self.decoder = PduDecoder::new(FrameLimits {
                    max_recv_data_segment: 16_777_215,
                });
                self.decoder.set_digests(digests);
                self.next = Some(s);
                let len = p.len() as u32;
                self.feed(s, &p, len, true, t);
                return;
            }
        }
    }

    fn plausible_bhs(&self, b: &[u8]) -> bool {
        let Some(bhs) = b.first_chunk::<BHS_LEN>() else {
            return false;
        };
        Opcode::from_u8(bhs[0] & 0x3f).is_some_and(|o| o.is_initiator() == self.from_initiator)
            && pdu::total_ahs_len(bhs) <= 64
            && pdu::data_segment_len(bhs) <= 16_777_215
    }

    fn append(&mut self, data: &[u8], t: u64) {
        self.chunks.push_back((self.appended, t));
        self.buf.extend_from_slice(data);
        self.appended += data.len() as u64;
    }

    /// Takes a segment's captured payload at relative sequence `seq`.
    fn feed(&mut self, seq: u64, payload: &[u8], payload_len: u32, syn_seen: bool, t: u64) {
        if self.stopped.is_some() || payload_len == 0 {
            return;
        }
        let end = seq + u64::from(payload_len);
        let next = match self.next {
            Some(n) => n,
            None if syn_seen => 1,
            None if self.plausible_bhs(payload) => seq,
            None => return,
        };
        self.next = Some(next);
        if end <= next {
            return; // all seen already
        }
        if (payload.len() as u32) < payload_len {
            self.stopped = Some(format!(
                "the snapshot length cut a segment ({} of {payload_len} bytes captured) at \
                 stream byte {}",
                payload.len(),
                seq.max(next)
            ));
            return;
        }
        if seq > next {
            self.pending_bytes += payload.len();
            if self.pending_bytes > MAX_PENDING {
                self.stopped = Some(format!("bytes from {next} never captured"));
                return;
            }
            self.pending.insert(seq, (payload.to_vec(), t));
            if self.pending_bytes > HOLE_AFTER {
                self.skip_hole();
            }
            return;
        }
        self.append(&payload[(next - seq) as usize..], t);
        let mut next = end;
        while let Some((&s, _)) = self.pending.first_key_value() {
            if s > next {
                break;
            }
            let (p, pt) = self.pending.pop_first().map(|x| x.1).unwrap_or_default();
            self.pending_bytes -= p.len();
            let e = s + p.len() as u64;
            if e > next {
                self.append(&p[(next - s) as usize..], pt.max(t));
                next = e;
            }
        }
        self.next = Some(next);
    }

    /// The next whole PDU, with the arrival time of its first byte.
    fn next_pdu(&mut self, errors: &mut u64) -> Option<(Pdu, u64)> {
        loop {
            if self.stopped.is_some() {
                return None;
            }
            let start = self.appended - self.buf.len() as u64;
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(p)) => {
                    while self.chunks.len() > 1 && self.chunks[1].0 <= start {
                        self.chunks.pop_front();
                    }
                    let t = self.chunks.front().map_or(0, |c| c.1);
                    return Some((p, t));
                }
                Ok(None) => return None,
                Err(FrameError::HeaderDigest) => {
                    self.stopped = Some(format!("header digest mismatch at stream byte {start}"));
                    return None;
                }
                Err(_) => *errors += 1,
            }
        }
    }
}

struct Dir {
    base: Option<u32>,
    last: u64,
    syn_seen: bool,
    max_end: u64,
    out: Direction,
    /// Data toward the peer awaiting its ACK, for the round-trip estimate: (end, time).
    unacked: VecDeque<(u64, u64)>,
    syn_t: Option<u64>,
    reasm: Reasm,
}

impl Dir {
    fn new(from_initiator: bool) -> Dir {
        Dir {
            base: None,
            last: 0,
            syn_seen: false,
            max_end: 0,
            out: Direction::default(),
            unacked: VecDeque::new(),
            syn_t: None,
            reasm: Reasm::new(from_initiator),
        }
    }

    /// A 32-bit sequence number as a 64-bit offset from the direction's base.
    fn rel(&mut self, seq: u32) -> u64 {
        let base = *self.base.get_or_insert(seq);
        let guess = self.last as i64
            + i64::from(seq.wrapping_sub(base).wrapping_sub(self.last as u32) as i32);
        let r = guess.max(0) as u64;
        self.last = self.last.max(r);
        r
    }
}

struct Conn {
    client: SocketAddr,
    server: SocketAddr,
    first: u64,
    last: u64,
    /// [to server, to client]
    dirs: [Dir; 2],
    rtt: [Option<u64>; 2],
    iscsi: Iscsi,
    keys: Vec<(String, String)>,
    open: HashMap<u32, usize>,
}

fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

fn opcode_name(op: u8) -> String {
    Opcode::from_u8(op).map_or_else(|| format!("0x{op:02x}"), |o| format!("{o:?}"))
}

impl Conn {
    fn packet(&mut self, from_client: bool, p: &Tcp<'_>, t: u64, iscsi: bool) {
        self.last = t;
        let d = usize::from(!from_client);
        let o = 1 - d;
        // SYN handshake: the SYN's sender learns the round trip to the other side.
        if p.flags & SYN != 0 {
            let dir = &mut self.dirs[d];
            dir.base = Some(p.seq);
            dir.last = 0;
            dir.syn_seen = true;
            dir.syn_t = Some(t);
            if let Some(m) = p.mss {
                dir.out.mss = Some(u32::from(m));
            }
            if p.flags & ACK != 0 {
                if let Some(t0) = self.dirs[o].syn_t {
                    let s = t.saturating_sub(t0);
                    self.rtt[o] = Some(self.rtt[o].map_or(s, |r| r.min(s)));
                }
            }
        }
        // This packet's ACK covers the other direction's data.
        if p.flags & ACK != 0 && self.dirs[o].base.is_some() {
            let a = self.dirs[o].rel(p.ack);
            let other = &mut self.dirs[o];
            other.out.acks.push((t, a));
            let mut sample = None;
            while other.unacked.front().is_some_and(|&(e, _)| e <= a) {
                sample = other
                    .unacked
                    .pop_front()
                    .map(|(_, t0)| t.saturating_sub(t0));
            }
            if let Some(s) = sample {
                self.rtt[o] = Some(self.rtt[o].map_or(s, |r| r.min(s)));
            }
            if self.dirs[o].syn_t.is_some() && p.flags & SYN == 0 && a == 1 {
                // The handshake's last ACK.
                if let Some(t0) = self.dirs[o].syn_t.take() {
                    let s = t.saturating_sub(t0);
                    if self.rtt[o].is_none() {
                        self.rtt[o] = Some(s);
                    }
                }
            }
        }
        let dir = &mut self.dirs[d];
        dir.out.packets += 1;
        if p.payload_len == 0 {
            return;
        }
        let seq = dir.rel(p.seq);
        let end = seq + u64::from(p.payload_len);
        let retransmit = end <= dir.max_end;
        if retransmit {
            dir.out.retransmits += 1;
        } else {
            dir.unacked.push_back((end, t));
            if dir.unacked.len() > 100_000 {
                dir.unacked.pop_front();
            }
        }
        dir.max_end = dir.max_end.max(end);
        dir.out.data_packets += 1;
        dir.out.payload_bytes += u64::from(p.payload_len);
        dir.out.points.push(Point {
            t_ns: t,
            seq,
            len: p.payload_len,
            retransmit,
        });
        if iscsi {
            let syn = dir.syn_seen;
            dir.reasm.feed(seq, p.payload, p.payload_len, syn, t);
            self.drain_pdus(d, t);
        }
    }

    fn drain_pdus(&mut self, d: usize, t_end: u64) {
        loop {
            let mut errs = 0;
            let got = self.dirs[d].reasm.next_pdu(&mut errs);
            self.iscsi.decode_errors += errs;
            let Some((p, t)) = got else { break };
            self.pdu(d, p, t, t_end);
        }
    }

    fn pdu(&mut self, d: usize, p: Pdu, t: u64, t_end: u64) {
        let (offset, r2t_len) = match &p {
            Pdu::DataIn(x) => (Some(x.buffer_offset), None),
            Pdu::DataOut(x) => (Some(x.buffer_offset), None),
            Pdu::R2t(x) => (Some(x.buffer_offset), Some(x.desired_data_transfer_length)),
            _ => (None, None),
        };
        let op = p.opcode() as u8;
        self.iscsi.pdus.push(PduRecord {
            t_ns: t,
            t_end_ns: t_end,
            dir: if d == 0 { "i>t" } else { "t>i" },
            opcode: op,
            name: opcode_name(op),
            itt: p.itt(),
            buffer_offset: offset,
            data_len: p.data().len() as u32,
            r2t_len,
        });
        match &p {
            Pdu::LoginResponse(r) => {
                for kv in r.data.split(|&b| b == 0) {
                    if let Some((k, v)) =
                        std::str::from_utf8(kv).ok().and_then(|s| s.split_once('='))
                    {
                        self.keys.push((k.to_owned(), v.to_owned()));
                    }
                }
                if r.transit && r.nsg == 3 && r.status_class == 0 {
                    let on = |key: &str| {
                        self.keys
                            .iter()
                            .rev()
                            .find(|(k, _)| k == key)
                            .is_some_and(|(_, v)| v.eq_ignore_ascii_case("CRC32C"))
                    };
                    let dg = Digests {
                        header: on("HeaderDigest"),
                        data: on("DataDigest"),
                    };
                    self.iscsi.header_digest = dg.header;
                    self.iscsi.data_digest = dg.data;
                    for dir in &mut self.dirs {
                        dir.reasm.decoder.set_digests(dg);
                    }
                }
            }
            Pdu::ScsiCommand(c) if d == 0 => {
                self.open.insert(c.itt, self.iscsi.commands.len());
                self.iscsi.commands.push(Command {
                    itt: c.itt,
                    op: c.cdb.first().copied().unwrap_or(0),
                    read: c.read,
                    write: c.write,
                    length: c.edtl,
                    t_ns: t,
                    first_answer: None,
                    to_first_ms: None,
                    total_ms: None,
                    target_ms: None,
                    network_ms: None,
                    status: None,
                });
            }
            Pdu::DataIn(_) | Pdu::R2t(_) | Pdu::ScsiResponse(_) if d == 1 => {
                let Some(&i) = self.open.get(&p.itt()) else {
                    return;
                };
                let rtt = self.rtt[0].map_or(0.0, |r| r as f64 / 1e6);
                let c = &mut self.iscsi.commands[i];
                if c.first_answer.is_none() {
                    c.first_answer = Some(opcode_name(op));
                    c.to_first_ms = Some(t.saturating_sub(c.t_ns) as f64 / 1e6);
                }
                let status = match &p {
                    Pdu::ScsiResponse(r) => Some(r.status),
                    Pdu::DataIn(x) if x.status_present => Some(x.status),
                    _ => None,
                };
                if let Some(s) = status {
                    c.status = Some(s);
                    let total = t_end.saturating_sub(c.t_ns) as f64 / 1e6;
                    let target = (c.to_first_ms.unwrap_or(0.0) - rtt).max(0.0);
                    c.total_ms = Some(total);
                    c.target_ms = Some(target);
                    c.network_ms = Some((total - target).max(0.0));
                    self.open.remove(&p.itt());
                }
            }
            _ => {}
        }
    }

    fn finish(mut self, rule: BurstRule, origin: u64, keep: bool, iscsi: bool) -> Connection {
        let rtt = self.rtt.map(|r| r.map(|x| x as f64 / 1e6));
        let mut dirs = self.dirs.map(|d| {
            let mut out = d.out;
            bursts(&mut out, rule);
            for p in &mut out.points {
                p.t_ns -= origin;
            }
            for a in &mut out.acks {
                a.0 = a.0.saturating_sub(origin);
            }
            if !keep {
                out.points = Vec::new();
                out.acks = Vec::new();
                out.burst_sizes = Vec::new();
            }
            let mut stopped = d.reasm.stopped;
            if stopped.is_none() && !d.reasm.pending.is_empty() {
                stopped = Some(format!(
                    "stream bytes from {} not captured (the capture dropped packets?)",
                    d.reasm.next.unwrap_or(0)
                ));
            }
            (out, stopped, d.reasm.holes)
        });
        let mut stopped = Vec::new();
        let mut holes = Vec::new();
        for (i, (_, s, h)) in dirs.iter_mut().enumerate() {
            let side = if i == 0 {
                "initiator→target"
            } else {
                "target→initiator"
            };
            if let Some(s) = s.take() {
                stopped.push(format!("{side}: {s}"));
            }
            holes.extend(h.drain(..).map(|x| format!("{side}: {x}")));
        }
        let [(to_server, _, _), (to_client, _, _)] = dirs;
        let has_iscsi = iscsi && (!self.iscsi.pdus.is_empty() || !stopped.is_empty());
        let iscsi = has_iscsi.then(|| {
            let mut i = std::mem::take(&mut self.iscsi);
            i.stopped = stopped;
            i.holes = holes;
            for p in &mut i.pdus {
                p.t_ns = p.t_ns.saturating_sub(origin);
                p.t_end_ns = p.t_end_ns.saturating_sub(origin);
            }
            for c in &mut i.commands {
                c.t_ns = c.t_ns.saturating_sub(origin);
            }
            let col = |f: fn(&Command) -> Option<f64>| -> Vec<f64> {
                i.commands.iter().filter_map(f).collect()
            };
            i.total_ms = Dist::of(&col(|c| c.total_ms));
            i.target_ms = Dist::of(&col(|c| c.target_ms));
            i.network_ms = Dist::of(&col(|c| c.network_ms));
            i
        });
        Connection {
            client: self.client,
            server: self.server,
            start_s: self.first.saturating_sub(origin) as f64 / 1e9,
            duration_s: self.last.saturating_sub(self.first) as f64 / 1e9,
            rtt_to_server_ms: rtt[0],
            rtt_to_client_ms: rtt[1],
            to_server,
            to_client,
            iscsi,
        }
    }
}

/// Bursts and gaps of one direction's data packets, by `rule`.
fn bursts(d: &mut Direction, rule: BurstRule) {
    let mss = u64::from(d.mss.unwrap_or(0)).max(if d.mss.is_none() {
        d.points.iter().map(|p| u64::from(p.len)).max().unwrap_or(1)
    } else {
        1
    });
    let segs = |len: u32| u64::from(len).div_ceil(mss).max(1);
    let (mut pk, mut sg, mut by, mut gaps) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut cur: Option<(u64, u64, u64)> = None; // packets, segments, bytes
    let mut prev_t = 0u64;
    for p in &d.points {
        // IP length: payload plus 40 bytes of headers is near enough for the rule.
        let thr = rule.threshold_ns(p.len + 40);
        match cur.as_mut() {
            Some(c) if p.t_ns.saturating_sub(prev_t) <= thr => {
                c.0 += 1;
                c.1 += segs(p.len);
                c.2 += u64::from(p.len);
            }
            _ => {
                if let Some(c) = cur.take() {
                    pk.push(c.0 as f64);
                    sg.push(c.1 as f64);
                    by.push(c.2 as f64);
                    d.burst_sizes.push(c.1);
                    gaps.push(p.t_ns.saturating_sub(prev_t) as f64 / 1e3);
                }
                cur = Some((1, segs(p.len), u64::from(p.len)));
            }
        }
        prev_t = p.t_ns;
    }
    if let Some(c) = cur {
        pk.push(c.0 as f64);
        sg.push(c.1 as f64);
        by.push(c.2 as f64);
        d.burst_sizes.push(c.1);
    }
    let single: f64 = pk
        .iter()
        .zip(&by)
        .filter(|(p, _)| **p == 1.0)
        .map(|(_, b)| *b)
        .sum();
    d.bursts = Bursts {
        count: pk.len(),
        packets: Dist::of(&pk),
        segments: Dist::of(&sg),
        bytes: Dist::of(&by),
        gaps_us: Dist::of(&gaps),
        single_packet_pct: if d.payload_bytes > 0 {
            single / d.payload_bytes as f64 * 100.0
        } else {
            0.0
        },
    };
    if let (Some(f), Some(l)) = (d.points.first(), d.points.last()) {
        let span = l.t_ns.saturating_sub(f.t_ns) as f64 / 1e9;
        if span > 0.0 {
            d.mbit_per_s = d.payload_bytes as f64 * 8.0 / span / 1e6;
        }
    }
}

/// Analyses the frames of a capture. `keep_packets` keeps every data packet and ACK in the
/// report (for plots and `--packets`).
pub fn analyse(frames: &[Frame<'_>], opts: &Options, keep_packets: bool) -> Report {
    // The earliest frame, not the first: a capture's frames need not be in time order
    // (merged files, several interfaces), and every time is reported from here.
    let origin = frames.iter().map(|f| f.ts_ns).min().unwrap_or(0);
    let mut conns: Vec<Conn> = Vec::new();
    let mut index: HashMap<(SocketAddr, SocketAddr), usize> = HashMap::new();
    let mut tcp_packets = 0;
    for f in frames {
        let Some(p) = packet::tcp(f.linktype, f.data) else {
            continue;
        };
        if let Some(port) = opts.port {
            if p.sport != port && p.dport != port {
                continue;
            }
        }
        tcp_packets += 1;
        let (s, d) = (sa(p.src, p.sport), sa(p.dst, p.dport));
        let key = if s < d { (s, d) } else { (d, s) };
        // A new SYN (no ACK) on a finished tuple starts a new connection.
        let fresh = p.flags & SYN != 0 && p.flags & ACK == 0;
        let i = match index.get(&key) {
            Some(&i)
                if !(fresh
                    && conns[i].dirs[0].syn_seen
                    && conns[i].client == s
                    && conns[i].dirs[0].out.data_packets > 0) =>
            {
                i
            }
            _ => {
                let server_is_dst = match opts.port {
                    Some(port) => p.dport == port,
                    None if fresh => true,
                    None if p.flags & SYN != 0 => false,
                    None => p.dport < p.sport,
                };
                let (client, server) = if server_is_dst { (s, d) } else { (d, s) };
                conns.push(Conn {
                    client,
                    server,
                    first: f.ts_ns,
                    last: f.ts_ns,
                    dirs: [Dir::new(true), Dir::new(false)],
                    rtt: [None, None],
                    iscsi: Iscsi::default(),
                    keys: Vec::new(),
                    open: HashMap::new(),
                });
                index.insert(key, conns.len() - 1);
                conns.len() - 1
            }
        };
        let c = &mut conns[i];
        let from_client = s == c.client;
        c.packet(from_client, &p, f.ts_ns, !opts.no_iscsi);
    }
    Report {
        frames: frames.len() as u64,
        tcp_packets,
        start_unix_s: origin as f64 / 1e9,
        burst_rule: opts.burst.describe(),
        connections: conns
            .into_iter()
            .map(|c| c.finish(opts.burst, origin, keep_packets, !opts.no_iscsi))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::build_ipv4_tcp;
    use crate::pcap;
    use bytes::Bytes;
    use iscsi::pdu::{DataIn, LoginRequest, LoginResponse, ScsiCommand, ScsiResponse};

    const C: ([u8; 4], u16) = ([10, 0, 0, 1], 40000);
    const S: ([u8; 4], u16) = ([10, 0, 0, 2], 3260);
    const CISN: u32 = 1000;
    const SISN: u32 = 0xffff_fff0; // wraps within the test

    /// A synthetic capture: frames as (time ns, raw IPv4 packet).
    struct Cap(Vec<(u64, Vec<u8>)>);

    impl Cap {
        fn handshake(rtt_ns: u64) -> Cap {
            Cap(vec![
                (0, build_ipv4_tcp(C, S, CISN, 0, SYN, Some(1460), b"")),
                (
                    rtt_ns,
                    build_ipv4_tcp(S, C, SISN, CISN + 1, SYN | ACK, Some(1460), b""),
                ),
                (
                    rtt_ns + 1000,
                    build_ipv4_tcp(C, S, CISN + 1, SISN.wrapping_add(1), ACK, None, b""),
                ),
            ])
        }
        fn push(&mut self, t: u64, from_client: bool, seq: u32, ack: u32, data: &[u8]) {
            let (a, b) = if from_client { (C, S) } else { (S, C) };
            self.0
                .push((t, build_ipv4_tcp(a, b, seq, ack, ACK, None, data)));
        }
        fn report(&self, opts: &Options) -> Report {
            let refs: Vec<(u64, &[u8])> = self.0.iter().map(|(t, d)| (*t, d.as_slice())).collect();
            let file = pcap::write_classic(101, &refs);
            analyse(&pcap::frames(&file).unwrap(), opts, true)
        }
    }

    /// Found by the timing_capture fuzz target: a frame earlier than the capture's first
    /// made the report's times underflow (a panic in a debug build, times near 2^64 ns
    /// in a release one).
    #[test]
    fn frames_out_of_time_order() {
        let mut cap = Cap::handshake(10_000);
        let ack = SISN.wrapping_add(1);
        cap.0.insert(
            0,
            (
                2_000_000,
                build_ipv4_tcp(C, S, CISN + 1, ack, ACK, None, &[1u8; 100]),
            ),
        );
        cap.push(1_000_000, true, CISN + 101, ack, &[2u8; 100]);
        let r = cap.report(&Options::default());
        assert_eq!(r.start_unix_s, 0.0);
        let times: Vec<u64> = r.connections[0]
            .to_server
            .points
            .iter()
            .map(|p| p.t_ns)
            .collect();
        assert_eq!(times, [2_000_000, 1_000_000]);
    }

    #[test]
    fn bursts_and_gaps_by_a_fixed_gap() {
        let mut cap = Cap::handshake(50_000);
        let mut seq = SISN.wrapping_add(1);
        let mut t = 1_000_000;
        // Three bursts of 10, 4 and 10 segments, 1 µs apart, 1 ms between bursts.
        for n in [10, 4, 10] {
            for _ in 0..n {
                cap.push(t, false, seq, CISN + 1, &[0u8; 1460]);
                seq = seq.wrapping_add(1460);
                t += 1_000;
            }
            cap.push(t + 200_000, true, CISN + 1, seq, b""); // an ACK back
            t += 1_000_000;
        }
        let r = cap.report(&Options::default());
        assert_eq!(r.connections.len(), 1);
        let c = &r.connections[0];
        assert_eq!(c.server.port(), 3260);
        let d = &c.to_client;
        assert_eq!(d.data_packets, 24);
        assert_eq!(d.mss, Some(1460));
        assert_eq!(d.retransmits, 0);
        assert_eq!(d.bursts.count, 3);
        assert_eq!(d.bursts.segments.median, 10.0);
        assert_eq!(d.bursts.segments.max, 10.0);
        assert_eq!(d.burst_sizes, vec![10, 4, 10]);
        assert_eq!(d.bursts.gaps_us.count, 2);
        assert!(
            (d.bursts.gaps_us.median - 1001.0).abs() < 1.0,
            "{:?}",
            d.bursts.gaps_us
        );
        // Sequence numbers wrapped past 2^32 and still count up from the first byte.
        assert_eq!(d.points.last().unwrap().seq, 1 + 23 * 1460);
        assert_eq!(c.rtt_to_server_ms, Some(0.05));
        // The ACKs of the server's data came back 200 µs after each burst's last packet.
        assert_eq!(d.acks.len(), 4); // the handshake's last ACK, then one per burst
        assert!(c.rtt_to_client_ms.unwrap() <= 0.202);
    }

    #[test]
    fn a_link_rate_makes_the_gap_the_serialization_time() {
        let mut cap = Cap::handshake(10_000);
        let mut seq = SISN.wrapping_add(1);
        // At 100 Mbit/s a 1500-byte packet takes 120 µs: packets 120 µs apart are back to
        // back; 300 µs apart they are not.
        let mut t = 100_000;
        for gap in [120_000u64, 120_000, 120_000, 300_000, 120_000, 300_000] {
            cap.push(t, false, seq, CISN + 1, &[0u8; 1460]);
            seq = seq.wrapping_add(1460);
            t += gap;
        }
        let link = Options {
            burst: BurstRule::Link {
                rate_bps: 100_000_000,
            },
            ..Options::default()
        };
        let r = cap.report(&link);
        assert_eq!(r.connections[0].to_client.burst_sizes, vec![4, 2]);
        // The fixed 100 µs default sees no bursts at all there.
        let r = cap.report(&Options::default());
        assert_eq!(r.connections[0].to_client.burst_sizes, vec![1; 6]);
        assert_eq!(r.connections[0].to_client.bursts.single_packet_pct, 100.0);
    }

    fn enc(p: impl Into<Pdu>, dg: Digests) -> Vec<u8> {
        let mut v = Vec::new();
        p.into().encode(&mut v, dg);
        v
    }

    #[test]
    fn iscsi_pdus_from_a_reordered_stream_with_digests_and_latency() {
        let mut cap = Cap::handshake(100_000); // 0.1 ms to the server and back
        let (mut cs, mut ss) = (CISN + 1, SISN.wrapping_add(1));
        let login = enc(
            LoginRequest {
                transit: true,
                csg: 1,
                nsg: 3,
                itt: 1,
                data: Bytes::from_static(b"HeaderDigest=CRC32C,None\0DataDigest=CRC32C,None\0"),
                ..Default::default()
            },
            Digests::default(),
        );
        cap.push(200_000, true, cs, ss, &login);
        cs = cs.wrapping_add(login.len() as u32);
        let resp = enc(
            LoginResponse {
                transit: true,
                csg: 1,
                nsg: 3,
                itt: 1,
                data: Bytes::from_static(b"HeaderDigest=CRC32C\0DataDigest=CRC32C\0"),
                ..Default::default()
            },
            Digests::default(),
        );
        cap.push(300_000, false, ss, cs, &resp);
        ss = ss.wrapping_add(resp.len() as u32);
        let dg = Digests {
            header: true,
            data: true,
        };
        let cmd = enc(
            ScsiCommand {
                read: true,
                itt: 7,
                edtl: 8192,
                cdb: {
                    let mut c = vec![0x28];
                    c.resize(16, 0);
                    c
                },
                ..Default::default()
            },
            dg,
        );
        cap.push(1_000_000, true, cs, ss, &cmd);
        cs = cs.wrapping_add(cmd.len() as u32);
        let mut reply = enc(
            DataIn {
                itt: 7,
                buffer_offset: 0,
                data: Bytes::from(vec![5u8; 4096]),
                ..Default::default()
            },
            dg,
        );
        reply.extend(enc(
            DataIn {
                itt: 7,
                buffer_offset: 4096,
                data: Bytes::from(vec![6u8; 4096]),
                final_: true,
                ..Default::default()
            },
            dg,
        ));
        reply.extend(enc(
            ScsiResponse {
                itt: 7,
                ..Default::default()
            },
            dg,
        ));
        // Three segments; the second is captured before the first (reordered), and the
        // first is captured twice (a retransmission).
        let (a, rest) = reply.split_at(1460);
        let (b, c) = rest.split_at(1460);
        let sb = ss.wrapping_add(1460);
        let sc = sb.wrapping_add(1460);
        cap.push(3_000_000, false, sb, cs, b);
        cap.push(3_000_500, false, ss, cs, a);
        cap.push(3_001_000, false, ss, cs, a);
        cap.push(3_400_000, false, sc, cs, c);
        let r = cap.report(&Options::default());
        let i = r.connections[0].iscsi.as_ref().unwrap();
        assert!(i.stopped.is_empty(), "{:?}", i.stopped);
        assert_eq!(i.decode_errors, 0);
        assert!(i.header_digest && i.data_digest);
        let got: Vec<_> = i
            .pdus
            .iter()
            .map(|p| (p.dir, p.opcode, p.itt, p.buffer_offset, p.data_len))
            .collect();
        assert_eq!(
            got,
            vec![
                ("i>t", 0x03, 1, None, 48),
                ("t>i", 0x23, 1, None, 38),
                ("i>t", 0x01, 7, None, 0),
                ("t>i", 0x25, 7, Some(0), 4096),
                ("t>i", 0x25, 7, Some(4096), 4096),
                ("t>i", 0x21, 7, None, 0),
            ]
        );
        // The reordered first segment and its copy both sit below the highest sequence seen.
        assert_eq!(r.connections[0].to_client.retransmits, 2);
        let c = &i.commands[0];
        assert_eq!((c.op, c.read, c.length), (0x28, true, 8192));
        assert_eq!(c.first_answer.as_deref(), Some("DataIn"));
        // Command at 1 ms; its answer's first byte arrived in the segment captured at
        // 3.0005 ms; done with the last at 3.4 ms. The round trip to the target is 0.1 ms.
        assert!((c.to_first_ms.unwrap() - 2.0005).abs() < 1e-9, "{c:?}");
        assert!((c.total_ms.unwrap() - 2.4).abs() < 1e-9);
        assert!((c.target_ms.unwrap() - 1.9005).abs() < 1e-9);
        assert!((c.network_ms.unwrap() - 0.4995).abs() < 1e-9);
        assert_eq!(i.total_ms.count, 1);
    }

    #[test]
    fn a_snapshot_cut_stops_decoding_with_a_reason() {
        let mut cap = Cap::handshake(10_000);
        let cmd = enc(
            ScsiCommand {
                write: true,
                itt: 9,
                edtl: 4096,
                data: Bytes::from(vec![1u8; 4096]),
                ..Default::default()
            },
            Digests::default(),
        );
        cap.push(100_000, true, CISN + 1, SISN.wrapping_add(1), &cmd);
        let last = cap.0.last_mut().unwrap();
        last.1.truncate(200);
        let r = cap.report(&Options::default());
        let c = &r.connections[0];
        assert_eq!(c.to_server.payload_bytes, cmd.len() as u64);
        let i = c.iscsi.as_ref().unwrap();
        assert!(i.pdus.is_empty());
        assert!(i.stopped[0].contains("snapshot length"), "{:?}", i.stopped);
    }

    #[test]
    fn a_capture_starting_mid_stream_finds_the_next_pdu_start() {
        // No handshake: the first segment is the middle of something, the second a PDU.
        let mut cap = Cap(Vec::new());
        cap.push(0, true, 5000, 1, &[0xffu8; 100]);
        let cmd = enc(
            ScsiCommand {
                itt: 3,
                ..Default::default()
            },
            Digests::default(),
        );
        cap.push(1000, true, 5100, 1, &cmd);
        let r = cap.report(&Options {
            port: Some(3260),
            ..Options::default()
        });
        let i = r.connections[0].iscsi.as_ref().unwrap();
        assert_eq!(i.pdus.len(), 1);
        assert_eq!(i.pdus[0].itt, 3);
    }

    #[test]
    fn a_hole_the_capture_left_is_skipped_to_the_next_pdu() {
        let mut cap = Cap::handshake(10_000);
        let mut seq = CISN + 1;
        let mut t = 100_000;
        let dout = |itt: u32, n: usize| {
            enc(
                iscsi::pdu::DataOut {
                    itt,
                    data: Bytes::from(vec![1u8; n]),
                    ..Default::default()
                },
                Digests::default(),
            )
        };
        // A PDU whose end the capture lost, then 160 PDUs of 32 KiB (5 MiB).
        let first = dout(1, 3000);
        cap.push(t, true, seq, SISN.wrapping_add(1), &first[..1000]);
        seq = seq.wrapping_add(first.len() as u32); // bytes 1000.. never captured
        for i in 0..160 {
            t += 1000;
            let p = dout(100 + i, 32768);
            cap.push(t, true, seq, SISN.wrapping_add(1), &p);
            seq = seq.wrapping_add(p.len() as u32);
        }
        let r = cap.report(&Options::default());
        let i = r.connections[0].iscsi.as_ref().unwrap();
        assert_eq!(i.holes.len(), 1, "{:?}", i.holes);
        assert!(i.holes[0].contains("not captured"), "{:?}", i.holes);
        assert!(i.stopped.is_empty(), "{:?}", i.stopped);
        assert_eq!(i.pdus.len(), 160);
        assert_eq!(i.pdus[0].itt, 100);
        assert_eq!(i.pdus[159].itt, 259);
    }

    #[test]
    fn dist_is_nearest_rank() {
        let d = Dist::of(&[5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!((d.median, d.p90, d.max, d.count), (5.0, 9.0, 10.0, 10));
        assert_eq!(Dist::of(&[]).count, 0);
    }
}
