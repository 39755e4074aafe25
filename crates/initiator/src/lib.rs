//! Async iSCSI initiator on the sans-IO `iscsi` crate.
//!
//! - [`discover`]: SendTargets discovery on a portal; [`isns`]: targets and portals from an
//!   iSNS server, and `isns://` URLs resolved to `iscsi://` ones.
//! - [`Session::connect`]: login (full negotiation, CHAP one-way or mutual) and a session of
//!   up to `connections` TCP connections (MC/S). Each connection has a reader task that
//!   routes target PDUs by ITT and a writer task; a command goes to the connection with
//!   the least outstanding bytes, and its Data-Out and status stay on that connection
//!   (allegiance). At most `queue_depth` commands are in flight, and only within the
//!   target's CmdSN window.
//! - Writes carry immediate data and unsolicited Data-Out as negotiated and answer R2Ts.
//! - Keep-alive NOP-Outs, answers to the target's NOP-In pings, ABORT TASK for commands
//!   that time out, LUN RESET, clean logout.
//! - Recovery at ErrorRecoveryLevel 2 (proposed by default): when a connection fails, it
//!   is logged out "for recovery" through another connection (or, when it was the last,
//!   its CID logs in again, which does the same), and every command it carried is moved
//!   to a live connection with TASK REASSIGN; the target resends what was lost (R2Ts,
//!   Data-In from the first one missing, status). Commands the target never received are
//!   sent again.
//! - Recovery at ERL 0 (targets such as tgt): when one connection of several fails, the
//!   session goes on over the others, the lost commands are issued again there, and the
//!   connection logs in again with the same TSIH and CID in the background. When the last
//!   one fails, the session is reinstated with the same ISID and every command not yet
//!   answered is issued again. Either way a copy survives a cut link. See [`Session`].
//! - [`Lun`]: a LUN read and written at byte offsets, split at the target's limits.
//! - [`copy`]: the parallel chunk copy behind `rsv cp`, between files, block devices and
//!   LUNs.

mod conn;
pub mod copy;
mod discovery;
mod inbox;
pub mod isns;
mod lun;
pub mod multipath;
pub mod scsi;
mod session;
pub mod tune;
pub mod url;

use std::time::Duration;

use iscsi::chap::ChapAlgorithm;

pub use discovery::{discover, DiscoveredTarget};
pub use lun::{LbaExtent, Lun};
pub use scsi::{Capacity, Inquiry, Provisioning, Sense};
pub use session::{DataDir, PathReport, ScsiResult, Session, SessionInfo};
pub use url::IscsiUrl;

/// Everything that can go wrong, phrased for the person who has to fix it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid iSCSI URL {0}")]
    Url(String),
    #[error("iSNS server {server}: {message}")]
    Isns { server: String, message: String },
    #[error("invalid option: {0}")]
    Option(String),
    #[error("cannot reach portal {portal}: {source}; check the address and port and that the target is running")]
    Unreachable {
        portal: String,
        source: std::io::Error,
    },
    #[error("authentication to {target} failed: {message}; check the user name and password (CHAP secret) in the URL, and that the target accepts a CHAP algorithm we offer (?chap_algorithms=, default SHA3-256,MD5)")]
    Auth { target: String, message: String },
    #[error("login to {target} refused by the target: {message} (status class {class}: {class_name}); {hint}")]
    LoginRefused {
        target: String,
        class: u8,
        detail: u8,
        class_name: &'static str,
        message: String,
        hint: &'static str,
    },
    #[error("login to {target} failed: {message}")]
    Login { target: String, message: String },
    #[error("LUN {lun} not found on {target}; `rsv ls` lists the LUNs it has")]
    LunNotFound { target: String, lun: u16 },
    #[error("{len} bytes at offset {offset} reach past the end of LUN {lun} ({size} bytes)")]
    OutOfRange {
        lun: u16,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("TLS to {portal}: {why}")]
    Tls { portal: String, why: String },
    #[error("login to {target} refused: the target requires TLS (status 0x{class:02x}{detail:02x}); connect with tls=1 (--tls) and ca= or pin=")]
    TlsRequired {
        target: String,
        class: u8,
        detail: u8,
    },
    #[error("connection to {portal} lost: {why}")]
    ConnectionLost { portal: String, why: String },
    #[error("protocol error from the target: {0}")]
    Protocol(String),
    #[error("SCSI command 0x{opcode:02x} failed: status 0x{status:02x}{}", .sense.as_ref().map(|s| format!(", {s}")).unwrap_or_default())]
    Scsi {
        opcode: u8,
        status: u8,
        sense: Option<Sense>,
    },
    #[error("iSCSI response 0x{0:02x} (target failure)")]
    Response(u8),
    #[error("{0} timed out")]
    Timeout(String),
    #[error("session is closed")]
    Closed,
    /// The persistent reservation `pr_key`/`pr_type` asked for could not be made.
    #[error("persistent reservation: {0}")]
    Reservation(String),
    #[error("SCSI command 0x{opcode:02x} was in flight when the session moved to another gateway and is not issued again: {why}")]
    Indeterminate { opcode: u8, why: &'static str },
    #[error("session could not be recovered after {attempts} attempts: {last}")]
    RecoveryFailed { attempts: u32, last: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Tunables of a session. Every field can be set from a URL query string or a flag under
/// the name [`SessionOptions::set`] accepts.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SessionOptions {
    /// TCP connections per session (MC/S); the target may grant fewer.
    pub connections: u16,
    /// Commands in flight per session.
    pub queue_depth: usize,
    /// Other portals of the same target (gateways exporting the same logical unit), as
    /// `host:port`, beside the URL's own: the session logs in to the one whose ALUA
    /// group is active/optimized and moves to another when its gateway fails
    /// (`multipath`). Query string `?portal=HOST:PORT`, repeated.
    pub portals: Vec<String>,
    /// A persistent-reservation key: each session registers it on the LU at login
    /// (REGISTER AND IGNORE EXISTING KEY, on the URL's LUN) and, after moving to another
    /// gateway, again if the registration does not hold there (`multipath`). The
    /// registration stays when the session ends, as a cluster node's key does. Query
    /// string `?pr_key=0xKEY` (hex with 0x, else decimal; not 0).
    pub pr_key: Option<u64>,
    /// With `pr_key`: the reservation to hold (SPC-5 table 182: `we`, `ea`, `we_ro`,
    /// `ea_ro`, `we_ar`, `ea_ar` or the number), taken at login unless the key already
    /// holds it; a login fails when another key holds a reservation. Query string
    /// `?pr_type=we_ro`.
    pub pr_type: Option<u8>,
    pub header_digest: bool,
    pub data_digest: bool,
    pub initiator_name: String,
    /// Password the target must prove it knows (mutual CHAP).
    pub target_secret: Option<String>,
    /// CHAP algorithms offered (CHAP_A), in order of preference: the target takes the
    /// first it accepts. Default [`DEFAULT_CHAP_ALGORITHMS`].
    #[serde(serialize_with = "chap_names")]
    pub chap_algorithms: Vec<ChapAlgorithm>,
    pub max_recv_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    /// Bytes per second per connection (SO_MAX_PACING_RATE).
    pub pacing_rate: Option<u64>,
    /// Bytes per second each connection starts at on `rsv` instead of ten packets, without
    /// pacing to it afterwards (auto-tuning sets it from a remembered rate).
    pub start_rate: Option<u64>,
    /// Bytes per second at which `rsv` sends the start's first round, to find the path's
    /// rate from its ACKs (auto-tuning sets it when no rate is given or remembered; the
    /// target is told too, `X-org.reservoir.ProbeRate`); `probe_rate=0`: no probe.
    pub probe_rate: Option<u64>,
    /// The session's group for `rsv` (its connections take turns at PROBE_RTT, see
    /// docs/congestion.md); 0: a new one for each session ([`Session::connect`] draws it).
    #[serde(skip)]
    pub rsv_group: u32,
    /// With a `pacing_rate` in force, ask the target at each connection's login to pace
    /// its sends (Data-In) the same way (`X-org.reservoir.PacingRate`; targets that do not
    /// know the key answer NotUnderstood and are simply not paced).
    pub pacing_hint: bool,
    pub send_buffer: Option<usize>,
    pub recv_buffer: Option<usize>,
    /// TCP congestion control (a name, or a list whose first the socket takes wins);
    /// `None`: the process's default, `rsv` where it loads, else BBR, else CUBIC
    /// (`net::default_congestion`, decided by [`Session::connect`]).
    pub congestion: Option<String>,
    /// The process's default as [`Session::connect`] found it, when `congestion` was not
    /// given: what `rsv tune` says was chosen and why.
    #[serde(skip)]
    pub congestion_default: Option<net::congestion::Choice>,
    pub notsent_lowat: Option<u32>,
    /// A command with no answer for this long is aborted and issued again.
    #[serde(with = "secs")]
    pub command_timeout: Duration,
    /// Idle time after which a NOP-Out checks the connection.
    #[serde(with = "secs")]
    pub nop_interval: Duration,
    /// How long recovery keeps trying to reinstate a failed session.
    #[serde(with = "secs")]
    pub recovery_timeout: Duration,
    /// ErrorRecoveryLevel to propose (the target may grant less). At 2 a lost connection
    /// is recovered by task reassignment: commands in flight go on where they were. At 0
    /// and 1 they are issued again (this initiator sends no SNACK).
    pub error_recovery_level: u8,
    /// Choose connections, queue depth, bursts, buffers and pacing from the measured path
    /// (see [`tune`]); options set by hand are kept as they are.
    pub auto_tune: bool,
    /// The bottleneck's rate in bytes per second, when known: auto-tuning sizes for it
    /// and paces the connections to share it.
    pub rate: Option<u64>,
    /// Without a `rate`, find the bottleneck's rate while the session runs and pace to it
    /// (`tune::RateControl`). Off by default: see docs/internals.md for what it did in
    /// the lab.
    pub rate_control: bool,
    /// Remember the rate a long path (RTT 10 ms or more) carried, in `net::paths`'s file,
    /// and size and start the next session to the same peer for it when no `rate` is
    /// given.
    pub path_cache: bool,
    /// Bytes per command the caller will issue (cp and bench set it); sizes bursts and
    /// the queue depth.
    #[serde(skip)]
    pub io_size_hint: Option<u64>,
    /// Options set by hand (URL, flags): auto-tuning leaves them alone.
    #[serde(skip)]
    pub pinned: std::collections::BTreeSet<String>,
    /// Opens the session's connections instead of plain TCP (tests run whole sessions in
    /// memory with it).
    #[serde(skip)]
    pub dialer: Option<net::transport::Dialer>,
    /// Every connection (discovery, each of a session's, those logged in again in
    /// recovery) over TLS 1.3.
    pub tls: bool,
    /// How the target's certificate is trusted (CA file, pinned fingerprint, the system's
    /// CAs) and the client certificate, if any.
    pub tls_files: net::tls::ClientFiles,
    /// The session is ready once its leading connection is logged in; the others join as
    /// their logins finish (a round trip later: they need the session's TSIH). Saves a
    /// round trip before the first command (the media server's start of a stream); off by
    /// default, so that a session has all its connections when `connect` returns.
    #[serde(skip)]
    pub join_late: bool,
}

fn chap_names<S: serde::Serializer>(algs: &[ChapAlgorithm], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(algs.iter().map(|a| a.name()))
}

mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            connections: 1,
            queue_depth: 32,
            portals: Vec::new(),
            pr_key: None,
            pr_type: None,
            header_digest: false,
            data_digest: false,
            initiator_name: default_initiator_name(),
            target_secret: None,
            chap_algorithms: DEFAULT_CHAP_ALGORITHMS.to_vec(),
            max_recv_data_segment: 262_144,
            max_burst: 1 << 20,
            first_burst: 262_144,
            immediate_data: true,
            initial_r2t: false,
            pacing_rate: None,
            start_rate: None,
            probe_rate: None,
            rsv_group: 0,
            pacing_hint: true,
            send_buffer: None,
            recv_buffer: None,
            congestion: None,
            congestion_default: None,
            notsent_lowat: Some(256 * 1024),
            command_timeout: Duration::from_secs(30),
            nop_interval: Duration::from_secs(5),
            recovery_timeout: Duration::from_secs(60),
            error_recovery_level: 2,
            auto_tune: true,
            rate: None,
            rate_control: false,
            path_cache: true,
            io_size_hint: None,
            pinned: Default::default(),
            dialer: None,
            tls: false,
            tls_files: Default::default(),
            join_late: false,
        }
    }
}

/// What the initiator offers in CHAP_A unless told otherwise: SHA3-256, then MD5 for
/// targets that know nothing else. SHA-256 is left out because tgt (and IET, which it
/// comes from) reads CHAP_A 7 as SHA-1: offered 7 before 5, tgt picks 7 and the login
/// fails on the response's length (0x0200), where IANA, LIO, open-iscsi and SCST have 7
/// as SHA-256. Those that know SHA3-256 (8) take it; tgt skips it and takes MD5.
pub const DEFAULT_CHAP_ALGORITHMS: [ChapAlgorithm; 2] =
    [ChapAlgorithm::Sha3_256, ChapAlgorithm::Md5];

pub fn default_initiator_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if host.is_empty() {
        "iqn.2026-01.org.reservoir:initiator".to_owned()
    } else {
        format!("iqn.2026-01.org.reservoir:initiator.{host}")
    }
}

fn parse_bool_opt(key: &str, v: &str) -> Result<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" | "crc32c" => Ok(true),
        "0" | "no" | "false" | "off" | "none" => Ok(false),
        _ => Err(Error::Option(format!("{key}={v}: expected yes or no"))),
    }
}

impl SessionOptions {
    /// Sets one option by its query-string name.
    pub fn set(&mut self, key: &str, v: &str) -> Result<()> {
        let count = |v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| Error::Option(format!("{key}={v}: expected a whole number")))
        };
        let size = |v: &str| units::parse_size(v).map_err(|e| Error::Option(format!("{key}: {e}")));
        let rate = |v: &str| {
            units::parse_rate(v)
                .map(units::Rate::bytes_per_sec)
                .map_err(|e| Error::Option(format!("{key}: {e}")))
        };
        let secs = |v: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|x| *x > 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| Error::Option(format!("{key}={v}: expected seconds")))
        };
        match key {
            "connections" => self.connections = count(v)?.clamp(1, 64) as u16,
            "queue_depth" => self.queue_depth = count(v)?.clamp(1, 4096) as usize,
            "portal" => {
                // Read as a URL's authority, so that IPv6 in brackets and the default
                // port work as in the URL itself.
                let p = IscsiUrl::parse(&format!("iscsi://{}/", v.trim()))
                    .map_err(|_| Error::Option(format!("{key}={v}: expected HOST[:PORT]")))?
                    .portal();
                if !self.portals.contains(&p) {
                    self.portals.push(p);
                }
            }
            "pr_key" => {
                let t = v.trim();
                let k = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(h) => u64::from_str_radix(h, 16).ok(),
                    None => t.parse::<u64>().ok(),
                };
                self.pr_key = Some(k.filter(|k| *k != 0).ok_or_else(|| {
                    Error::Option(format!(
                        "{key}={v}: expected a key other than 0 (0xHEX or decimal)"
                    ))
                })?);
            }
            "pr_type" => {
                self.pr_type = Some(crate::multipath::pr_type(v).ok_or_else(|| {
                    Error::Option(format!(
                        "{key}={v}: expected we, ea, we_ro, ea_ro, we_ar or ea_ar (or 1, 3, 5-8)"
                    ))
                })?)
            }
            "header_digest" => self.header_digest = parse_bool_opt(key, v)?,
            "data_digest" => self.data_digest = parse_bool_opt(key, v)?,
            "initiator_name" => self.initiator_name = v.to_owned(),
            "target_password" | "target_secret" => self.target_secret = Some(v.to_owned()),
            "chap_algorithms" => {
                self.chap_algorithms = iscsi::chap::parse_algorithms(v.split(','))
                    .map_err(|e| Error::Option(format!("{key}={v}: {e}")))?
            }
            "max_recv_data_segment" => {
                self.max_recv_data_segment = size(v)?.clamp(512, 16_777_215) as u32
            }
            "max_burst" => self.max_burst = size(v)?.clamp(512, 16_776_192) as u32,
            "first_burst" => self.first_burst = size(v)?.clamp(512, 16_776_192) as u32,
            "immediate_data" => self.immediate_data = parse_bool_opt(key, v)?,
            "initial_r2t" => self.initial_r2t = parse_bool_opt(key, v)?,
            "pacing_rate" => self.pacing_rate = Some(rate(v)?),
            "pacing_hint" => self.pacing_hint = parse_bool_opt(key, v)?,
            "send_buffer" => self.send_buffer = Some(size(v)? as usize),
            "recv_buffer" => self.recv_buffer = Some(size(v)? as usize),
            "congestion" => self.congestion = Some(v.to_owned()),
            "notsent_lowat" => self.notsent_lowat = Some(size(v)? as u32),
            "command_timeout" => self.command_timeout = secs(v)?,
            "nop_interval" => self.nop_interval = secs(v)?,
            "recovery_timeout" => self.recovery_timeout = secs(v)?,
            "error_recovery_level" | "erl" => {
                self.error_recovery_level = match v {
                    "0" => 0,
                    "1" => 1,
                    "2" => 2,
                    _ => {
                        return Err(Error::Option(format!("{key}={v}: expected 0, 1 or 2")));
                    }
                }
            }
            "auto_tune" => self.auto_tune = parse_bool_opt(key, v)?,
            "rate_control" => self.rate_control = parse_bool_opt(key, v)?,
            "path_cache" => self.path_cache = parse_bool_opt(key, v)?,
            "start_rate" => self.start_rate = Some(rate(v)?),
            // 0 (or none): no probed start.
            "probe_rate" => {
                self.probe_rate = Some(
                    units::parse_rate_limit(v)
                        .map_err(|e| Error::Option(format!("{key}: {e}")))?
                        .map_or(0, units::Rate::bytes_per_sec),
                )
            }
            "rate" => self.rate = Some(rate(v)?),
            "tls" => self.tls = parse_bool_opt(key, v)?,
            // A way to trust the target's certificate means TLS.
            "ca" | "tls_ca" => {
                self.tls_files.ca = Some(v.into());
                self.tls = true;
            }
            "pin" | "tls_pin" => {
                self.tls_files.pin = Some(net::tls::parse_fingerprint(v).map_err(Error::Option)?);
                self.tls = true;
            }
            "cert" | "tls_cert" => self.tls_files.cert = Some(v.into()),
            "key" | "tls_key" => self.tls_files.key = Some(v.into()),
            "tls_name" => self.tls_files.server_name = Some(v.to_owned()),
            "tls_suite" => {
                net::tls::parse_suite(v).map_err(Error::Option)?;
                self.tls_files.suite = Some(v.to_owned());
            }
            _ => {
                return Err(Error::Option(format!(
                    "unknown option {key}; known: connections, queue_depth, portal, pr_key, pr_type, header_digest, \
                     data_digest, initiator_name, target_password, chap_algorithms, \
                     max_recv_data_segment, \
                     max_burst, first_burst, immediate_data, initial_r2t, pacing_rate, \
                     pacing_hint, send_buffer, recv_buffer, congestion, notsent_lowat, command_timeout, \
                     nop_interval, recovery_timeout, error_recovery_level (erl), auto_tune, \
                     rate, rate_control, path_cache, start_rate, probe_rate, tls, ca, pin, cert, key, tls_name, tls_suite"
                )))
            }
        }
        self.pin(key);
        Ok(())
    }

    /// Marks an option as set by hand, so that auto-tuning keeps it.
    pub fn pin(&mut self, key: &str) {
        let key = match key {
            "target_password" => "target_secret",
            k => k,
        };
        self.pinned.insert(key.to_owned());
    }

    pub fn is_pinned(&self, key: &str) -> bool {
        self.pinned.contains(key)
    }

    /// The rate to ask the target to pace each connection at, if any.
    pub(crate) fn target_pacing_hint(&self) -> Option<u64> {
        self.pacing_rate.filter(|r| *r > 0 && self.pacing_hint)
    }

    pub(crate) fn tuning(&self) -> net::SocketTuning {
        net::SocketTuning {
            send_buffer: self.send_buffer,
            recv_buffer: self.recv_buffer,
            // Unset: the process's default where it was decided (Session::connect decides
            // it), else the kernel's preferred one without loading anything (a discovery
            // session before any other).
            congestion: self.congestion.clone().or_else(|| {
                match net::default_congestion_decided() {
                    Some(c) => c.name.clone(),
                    None => net::preferred_congestion(),
                }
            }),
            pacing_rate: self.pacing_rate,
            start_rate: self.start_rate,
            probe_rate: self.probe_rate.filter(|r| *r > 0),
            rsv_group: (self.rsv_group != 0).then_some(self.rsv_group),
            notsent_lowat: self.notsent_lowat,
            nodelay: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_suite_option_names_a_tls13_suite() {
        let mut o = SessionOptions::default();
        o.set("tls_suite", "chacha20").unwrap();
        assert_eq!(o.tls_files.suite.as_deref(), Some("chacha20"));
        let e = o.set("tls_suite", "3des").unwrap_err().to_string();
        assert!(e.contains("unknown TLS 1.3 suite \"3des\""), "{e}");
    }

    #[test]
    fn chap_algorithms_option() {
        let mut o = SessionOptions::default();
        assert_eq!(
            o.chap_algorithms,
            vec![ChapAlgorithm::Sha3_256, ChapAlgorithm::Md5]
        );
        o.set("chap_algorithms", "SHA-256,MD5").unwrap();
        assert_eq!(
            o.chap_algorithms,
            vec![ChapAlgorithm::Sha256, ChapAlgorithm::Md5]
        );
        let e = o.set("chap_algorithms", "SHA1").unwrap_err().to_string();
        assert!(e.contains("unknown CHAP algorithm \"SHA1\""), "{e}");
        let e = o.set("chap_algorithms", "").unwrap_err().to_string();
        assert!(e.contains("unknown CHAP algorithm"), "{e}");
    }

    #[test]
    fn sizes_and_rates_in_options() {
        let mut o = SessionOptions::default();
        o.set("max_burst", "256k").unwrap();
        assert_eq!(o.max_burst, 256 << 10);
        o.set("send_buffer", "1MiB").unwrap();
        assert_eq!(o.send_buffer, Some(1 << 20));
        o.set("recv_buffer", "174080").unwrap();
        assert_eq!(o.recv_buffer, Some(174_080));
        o.set("pacing_rate", "100mbit").unwrap();
        assert_eq!(o.pacing_rate, Some(12_500_000));
        o.set("rate", "12.5MB/s").unwrap();
        assert_eq!(o.rate, Some(12_500_000));
        o.set("connections", "4").unwrap();
        assert_eq!(o.connections, 4);
        // Spellings that used to mean something (bytes/s, bits/s, KiB) now say what to write.
        let err = |k: &str, v: &str| o.clone().set(k, v).unwrap_err().to_string();
        assert!(err("pacing_rate", "5000").contains("say bits or bytes per second"));
        assert!(err("rate", "8k").contains("say 8kbit for bits or 8KB/s"));
        assert!(err("rate", "0").contains("needs a rate"));
        assert!(err("max_burst", "64kb").contains("lowercase b"));
        assert!(err("connections", "1k").contains("expected a whole number"));
    }
}
