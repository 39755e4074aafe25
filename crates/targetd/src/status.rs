//! A snapshot of every session of a running target: who, from where, to what, over which
//! connections with which negotiated keys, how long and how much, and the path as TCP
//! sees it at snapshot time. Plain data (serde both ways): `rsv target status` prints it,
//! its `--json` is it, and a metrics exporter can turn it into per-session series at
//! scrape time ([`Source::snapshot`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::session::{ConnInfo, Session};
use crate::shared::Shared;

/// Every session of the target at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetStatus {
    /// When it was taken: milliseconds since the Unix epoch.
    pub taken_at_ms: u64,
    /// In TSIH order.
    pub sessions: Vec<SessionStatus>,
    /// The congestion control the target gives its connections, and why (absent from a
    /// target older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<CongestionStatus>,
}

/// Which congestion control the target's connections are given: `by` the configuration
/// (`[session] congestion`, `--congestion`) or the process's `default` (`rsv` where it
/// loads, else BBR, else CUBIC), and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CongestionStatus {
    /// The name (or list, first taken wins); `None`: the kernel's default.
    pub name: Option<String>,
    /// `configured` or `default`.
    pub by: String,
    pub why: String,
}

impl CongestionStatus {
    /// From the configured option and the process's default (when decided).
    pub fn of(
        configured: Option<&str>,
        default: Option<&net::congestion::Choice>,
    ) -> CongestionStatus {
        match (configured, default) {
            (Some(c), _) => CongestionStatus {
                name: Some(c.to_owned()),
                by: "configured".into(),
                why: format!("{c}: set by [session] congestion or --congestion"),
            },
            (None, Some(d)) => CongestionStatus {
                name: d.name.clone(),
                by: "default".into(),
                why: d.why.clone(),
            },
            (None, None) => CongestionStatus {
                name: net::preferred_congestion(),
                by: "default".into(),
                why: "the kernel's preferred (the default was not decided)".into(),
            },
        }
    }
}

/// One session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// The target-assigned session identifying handle: what `rsv target drop` takes.
    pub tsih: u16,
    /// The initiator's session ID, 12 hex digits.
    pub isid: String,
    pub initiator: String,
    /// The target's IQN; `None`: a discovery session.
    pub target: Option<String>,
    /// The LUNs the session's view of its target shows (LUN masking applied).
    pub luns: Vec<u16>,
    /// When it logged in: milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    pub age_s: f64,
    /// Bytes from the initiator and to it over all its connections (ended ones included),
    /// in full feature phase: PDUs whole, headers and digests included; over TLS, the
    /// plaintext.
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub keys: SessionKeys,
    /// In CID order.
    pub connections: Vec<ConnStatus>,
}

/// The session-wide keys its leading login negotiated (RFC 7143 13).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionKeys {
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
}

/// One connection of a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConnStatus {
    pub cid: u16,
    /// The target's address of the connection (the portal it came in at).
    pub local: SocketAddr,
    /// The initiator's address.
    pub remote: SocketAddr,
    /// TLS version and cipher suite; `None`: plain TCP.
    pub tls: Option<String>,
    pub header_digest: bool,
    pub data_digest: bool,
    /// MaxRecvDataSegmentLength as the target declared it (the most it receives per PDU)
    /// and as the initiator did (the most the target sends).
    pub target_max_recv_data_segment_length: u32,
    pub initiator_max_recv_data_segment_length: u32,
    pub age_s: f64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// `None`: no TCP socket under it (an in-memory carrier), or the connection ended
    /// as the snapshot was taken.
    pub path: Option<PathStatus>,
}

/// The path as the connection's TCP socket sees it (TCP_INFO) at snapshot time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStatus {
    /// Smoothed round-trip time and its variation, microseconds.
    pub srtt_us: u32,
    pub rttvar_us: u32,
    /// The least round trip seen lately (the kernel's windowed minimum).
    pub min_rtt_us: u32,
    /// Congestion window, in segments of `mss` bytes.
    pub cwnd: u32,
    pub mss: u32,
    /// The latest delivery rate sample and the pacing rate, bytes per second.
    pub delivery_rate: u64,
    pub pacing_rate: u64,
    /// Segments retransmitted over the connection's life.
    pub retransmits: u32,
    pub packets_in_flight: u32,
    /// `packets_in_flight` × `mss`.
    pub bytes_in_flight: u64,
}

impl From<net::TcpInfo> for PathStatus {
    fn from(t: net::TcpInfo) -> PathStatus {
        PathStatus {
            srtt_us: t.rtt_us,
            rttvar_us: t.rtt_var_us,
            min_rtt_us: t.min_rtt_us,
            cwnd: t.snd_cwnd,
            mss: t.snd_mss,
            delivery_rate: t.delivery_rate,
            pacing_rate: t.pacing_rate,
            retransmits: t.total_retrans,
            packets_in_flight: t.packets_in_flight(),
            bytes_in_flight: t.bytes_in_flight(),
        }
    }
}

/// Takes snapshots of a running target's sessions; cheap to clone
/// ([`crate::Server::status_source`], [`crate::Running::status_source`]).
#[derive(Clone)]
pub struct Source(pub(crate) Arc<Shared>);

impl Source {
    /// The congestion control the target's connections are given, and why.
    pub fn congestion(&self) -> CongestionStatus {
        CongestionStatus::of(
            self.0.config.session.congestion.as_deref(),
            net::default_congestion_decided(),
        )
    }

    /// Every session now. Byte counts and keys are read from what each connection shares
    /// with the session's registry, and TCP_INFO from a duplicate of each connection's
    /// socket, all on the calling thread: no connection is asked, so none is waited for
    /// behind its I/O, and a connection that has ended has no path.
    pub fn snapshot(&self) -> TargetStatus {
        let mut sessions = self.0.all_sessions();
        sessions.sort_by_key(|s| s.tsih);
        let taken_at_ms = unix_ms(std::time::SystemTime::now());
        let sessions = sessions
            .into_iter()
            .map(|s| {
                let connections = s
                    .connections()
                    .into_iter()
                    .map(|h| conn_status(&h.info))
                    .collect();
                session_status(&s, connections)
            })
            .collect();
        TargetStatus {
            taken_at_ms,
            sessions,
            congestion: Some(self.congestion()),
        }
    }
}

fn conn_status(info: &ConnInfo) -> ConnStatus {
    let (bytes_received, bytes_sent) = info.bytes.get();
    ConnStatus {
        cid: info.cid,
        local: info.local,
        remote: info.remote,
        tls: info.tls.clone(),
        header_digest: info.params.header_digest,
        data_digest: info.params.data_digest,
        target_max_recv_data_segment_length: info.params.max_recv_data_segment_length,
        initiator_max_recv_data_segment_length: info.params.max_send_data_segment_length,
        age_s: info.since.elapsed().as_secs_f64(),
        bytes_received,
        bytes_sent,
        path: info.tcp_info().map(PathStatus::from),
    }
}

fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn session_status(s: &Session, connections: Vec<ConnStatus>) -> SessionStatus {
    let target = s.target();
    let p = &s.params;
    let (bytes_received, bytes_sent) = s.bytes.get();
    SessionStatus {
        tsih: s.tsih,
        isid: s.isid.iter().map(|b| format!("{b:02x}")).collect(),
        initiator: s.initiator.clone(),
        target: target.as_ref().map(|t| t.iqn.clone()),
        luns: target.map(|t| t.lun_ids()).unwrap_or_default(),
        started_at_ms: unix_ms(s.since.1),
        age_s: s.since.0.elapsed().as_secs_f64(),
        bytes_received,
        bytes_sent,
        keys: SessionKeys {
            max_connections: p.max_connections,
            initial_r2t: p.initial_r2t,
            immediate_data: p.immediate_data,
            max_burst_length: p.max_burst_length,
            first_burst_length: p.first_burst_length,
            default_time2wait: p.default_time2wait,
            default_time2retain: p.default_time2retain,
            max_outstanding_r2t: p.max_outstanding_r2t,
            data_pdu_in_order: p.data_pdu_in_order,
            data_sequence_in_order: p.data_sequence_in_order,
            error_recovery_level: p.error_recovery_level,
        },
        connections,
    }
}
