//! The target's TOML configuration, and the embedded default used when there is none.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use backstore::{Registry, StoreSpec};
use iscsi::chap::{self, ChapAlgorithm};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

pub const DEFAULT_PORTAL: &str = "127.0.0.1:3260";
pub const DEFAULT_IQN: &str = "iqn.2026-11.org.reservoir:target0";
pub const DEFAULT_LUN_SIZE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{col}: {message}")]
    Parse {
        path: String,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{path}: {0}", path = .1)]
    Invalid(String, String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Addresses to listen on: `"ADDR:PORT"`, or a table with `listen` and `tls` (see
    /// [`Portal`]).
    #[serde(default = "default_portals")]
    pub portals: Vec<Portal>,
    /// Relative LUN paths are taken from here.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    #[serde(default)]
    pub session: SessionDefaults,
    #[serde(default)]
    pub discovery: Discovery,
    #[serde(default, rename = "target")]
    pub targets: Vec<TargetConfig>,
    /// The control endpoint that `rsv sync` drives (a disk server's agent) and the local
    /// control socket (`rsv target status`, `drop`); absent: no agent, and the socket
    /// only under systemd (in its RuntimeDirectory).
    #[serde(default)]
    pub control: Option<ControlConfig>,
    /// Registration with an iSNS server (RFC 4171); none when absent.
    pub isns: Option<Isns>,
    /// The target portal group tag of every portal of this process, which is also the
    /// ALUA target port group and the relative target port identifier of its targets'
    /// one port each: 1..65535, 1 by default.
    #[serde(default = "default_portal_group")]
    pub portal_group: u16,
    /// The portal groups of other Reservoir targets that export the same targets (same IQN
    /// and LUN ids, the same stores: an RBD image through two gateways). Not empty: the LUs
    /// report every group (REPORT TARGET PORT GROUPS, all active/optimized), refuse
    /// reservations, and their stores are opened as shared (no librbd cache).
    #[serde(default)]
    pub peer_portal_groups: Vec<u16>,
    /// `[threads]`: the threads connections run on.
    #[serde(default)]
    pub threads: Threads,
    /// `[metrics]`: the OpenMetrics endpoint; absent: none, and no per-LUN counting.
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
}

/// `[metrics]`: serve Prometheus/OpenMetrics text at `http://LISTEN/metrics`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// The most series of LUNs one scrape carries (each LUN has about a hundred), and
    /// apart the most of connections (ten each); those past it are left out, and the log
    /// says so once.
    #[serde(default = "default_max_series")]
    pub max_series: usize,
}

impl MetricsConfig {
    pub fn at(listen: SocketAddr) -> MetricsConfig {
        MetricsConfig {
            listen,
            max_series: default_max_series(),
        }
    }
}

fn default_max_series() -> usize {
    100_000
}

/// `[threads]`: connections run on single-threaded runtimes, `connections` of them, each
/// a connection's reader, writer and inline commands kept on one thread; or with
/// `placement = "shared"` on one multi-thread runtime whose workers take any task.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Threads {
    /// How many; 0 (the default): one per core the process may run on.
    pub connections: usize,
    pub placement: Placement,
}

/// Which thread a new connection runs on.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Its session's, when its login joins a session; else the one with the fewest
    /// connections (default). Spreading a session's connections over the threads
    /// instead was measured: their commands wait on each other's CmdSN, and 1 MiB reads
    /// over 8 connections fell to a third of one connection's rate.
    #[default]
    Session,
    /// No thread of its own: tokio's multi-thread scheduler moves its tasks at will.
    Shared,
}

impl Threads {
    /// The number of connection threads to start; `None` for the shared scheduler.
    pub fn count(&self) -> Option<usize> {
        if self.placement == Placement::Shared {
            return None;
        }
        Some(match self.connections {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        })
    }
}

fn default_portal_group() -> u16 {
    1
}

/// `[control]`: where the agent of `rsv sync` listens and the key every request must be
/// signed with (a file readable by its owner only), both or neither; and the local
/// control socket of `rsv target status` and `drop`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    pub listen: Option<SocketAddr>,
    pub key_file: Option<PathBuf>,
    /// The control socket's path; without it, `$RUNTIME_DIRECTORY/control.sock` when
    /// systemd gives the service a RuntimeDirectory, else none (`crate::control`).
    pub socket: Option<PathBuf>,
    /// A group (name or number) whose members may use the socket too: mode 0660 rather
    /// than 0600.
    pub group: Option<String>,
}

impl ControlConfig {
    /// The agent of `rsv sync`: its address and key file, when configured.
    pub fn agent(&self) -> Option<(SocketAddr, &Path)> {
        Some((self.listen?, self.key_file.as_deref()?))
    }
}

/// `[isns]`: the target registers its entity, portals, targets (with their aliases) and
/// portal groups with this server at start, refreshes the registration within the
/// period the server grants, and deregisters at shutdown.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Isns {
    /// `host`, `host:port`, `[v6]:port`; the port defaults to 3205.
    pub server: String,
    /// The network entity's identifier; default `rsv:` and the first target's IQN.
    pub entity: Option<String>,
    /// Seconds the registration should last; the server may grant another period.
    pub registration_period: Option<u32>,
    /// `[isns.auth]`: sign every message and take only answers the server signed
    /// (RFC 4171 5.5, open-isns's `Security = 1`).
    pub auth: Option<IsnsAuth>,
}

/// The target's iSNS identity: the SPI the server enrolled its key under, that DSA
/// private key (PKCS #8 PEM), and the server's public key (PEM): open-isns's `AuthName`,
/// `AuthKeyFile`, `ServerKeyFile`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct IsnsAuth {
    pub name: String,
    pub key: PathBuf,
    pub server_key: PathBuf,
}

impl IsnsAuth {
    /// The keys read and checked.
    pub fn load(&self) -> Result<isns::auth::ClientAuth, String> {
        let read =
            |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        isns::auth::ClientAuth::from_pem(&self.name, &read(&self.key)?, &read(&self.server_key)?)
            .map_err(|e| e.to_string())
    }
}

fn default_portals() -> Vec<Portal> {
    vec![Portal::plain(DEFAULT_PORTAL.parse().unwrap())]
}

/// One address the target listens on, in plain TCP or TLS 1.3. In TOML a plain portal is
/// its address; a TLS one is a table:
/// `{ listen = "0.0.0.0:3261", tls = { cert = "t.crt", key = "t.key" } }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Portal {
    pub listen: SocketAddr,
    pub tls: Option<PortalTls>,
}

impl Portal {
    pub fn plain(listen: SocketAddr) -> Portal {
        Portal { listen, tls: None }
    }
}

/// `tls` of a portal: its certificate (chain, PEM) and private key (PEM, readable by its
/// owner only), and optionally the CAs that sign initiators' client certificates, which
/// makes one required (mutual TLS).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortalTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    /// true (default): every connection must be TLS, and a plaintext login is refused
    /// (status 0x0201, authentication failure); false: a plaintext login is served too,
    /// told apart by its first byte (a TLS handshake starts with 0x16, a Login Request
    /// with 0x03 or 0x43).
    #[serde(default = "yes")]
    pub require: bool,
}

impl PortalTls {
    pub fn files(&self) -> net::tls::ServerFiles {
        net::tls::ServerFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: self.client_ca.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PortalTable {
    listen: SocketAddr,
    tls: Option<PortalTls>,
}

impl<'de> Deserialize<'de> for Portal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Portal;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"ADDR:PORT\" or { listen = \"ADDR:PORT\", tls = { cert, key } }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Portal, E> {
                v.parse()
                    .map(Portal::plain)
                    .map_err(|_| E::custom(format!("{v:?} is not ADDR:PORT")))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<Portal, A::Error> {
                let t = PortalTable::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(Portal {
                    listen: t.listen,
                    tls: t.tls,
                })
            }
        }
        d.deserialize_any(V)
    }
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("./data")
}

/// What the target offers in negotiation; the result is per the RFC's rule for each key.
/// Lengths and buffers are bytes: a number, or a string such as "256KiB" or "1MB".
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SessionDefaults {
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    #[serde(deserialize_with = "size")]
    pub first_burst_length: u32,
    #[serde(deserialize_with = "size")]
    pub max_burst_length: u32,
    #[serde(deserialize_with = "size")]
    pub max_recv_data_segment_length: u32,
    pub max_outstanding_r2t: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub error_recovery_level: u8,
    /// Digests the target accepts, in order of preference: "None", "CRC32C".
    pub header_digest: Vec<String>,
    pub data_digest: Vec<String>,
    /// Commands a session may have queued beyond ExpCmdSN (the CmdSN window).
    pub queue_depth: u32,
    /// Seconds a connection may take to finish logging in.
    pub login_timeout: u64,
    /// Sessions the target holds at once; a login beyond is refused (status 0302h, out of
    /// resources).
    pub max_sessions: usize,
    /// TCP connections the target holds at once, logged in or not; one beyond is closed
    /// as it is accepted. With `login_timeout` this bounds what a flood of half-open
    /// connections can hold (file descriptors, tasks).
    pub max_open_connections: usize,
    /// Seconds of silence before the target sends a NOP-In ping (0: never).
    pub nop_interval: u64,
    /// SO_SNDBUF / SO_RCVBUF per connection; unset: auto-tuned from the handshake's RTT.
    #[serde(deserialize_with = "some_size")]
    pub send_buffer: Option<usize>,
    #[serde(deserialize_with = "some_size")]
    pub recv_buffer: Option<usize>,
    pub congestion: Option<String>,
    /// SO_MAX_PACING_RATE per connection, bytes per second, written as a rate ("100mbit",
    /// "12.5MB/s"). Wins over initiators' hints.
    #[serde(deserialize_with = "pacing_rate")]
    pub pacing_rate: Option<u64>,
    /// Pace each connection's sends (Data-In) at the rate its initiator asks for, at
    /// login or later in a Text request (`X-org.reservoir.PacingRate`, clamped to
    /// 1 Mbit/s..400 Gbit/s). Off: the target answers that it does not pace.
    pub accept_pacing_hint: bool,
    /// TCP_NOTSENT_LOWAT per connection, bytes.
    #[serde(deserialize_with = "some_size")]
    pub notsent_lowat: Option<u32>,
    /// Size socket buffers from each connection's measured RTT where the kernel's
    /// autotuning would stop short of the path's needs.
    pub auto_tune: bool,
}

impl Default for SessionDefaults {
    fn default() -> Self {
        SessionDefaults {
            max_connections: 32,
            initial_r2t: false,
            immediate_data: true,
            first_burst_length: 1 << 20,
            max_burst_length: (16 << 20) - 1024,
            max_recv_data_segment_length: 256 << 10,
            max_outstanding_r2t: 16,
            default_time2wait: 2,
            default_time2retain: 20,
            error_recovery_level: 2,
            header_digest: vec!["None".into(), "CRC32C".into()],
            data_digest: vec!["None".into(), "CRC32C".into()],
            queue_depth: 256,
            login_timeout: 15,
            max_sessions: 1024,
            max_open_connections: 4096,
            nop_interval: 30,
            send_buffer: None,
            recv_buffer: None,
            congestion: None,
            pacing_rate: None,
            accept_pacing_hint: true,
            notsent_lowat: None,
            auto_tune: true,
        }
    }
}

impl SessionDefaults {
    /// What the target does with an initiator's `X-org.reservoir.PacingRate`, at login
    /// or later.
    pub fn pacing_policy(&self) -> iscsi::negotiate::PacingPolicy {
        iscsi::negotiate::PacingPolicy {
            accept_hint: self.accept_pacing_hint,
            configured: self.pacing_rate,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    pub chap: Option<Chap>,
}

#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Chap {
    pub user: String,
    pub secret: String,
    /// Mutual CHAP: the name and secret the target answers the initiator's challenge with.
    pub mutual_user: Option<String>,
    pub mutual_secret: Option<String>,
    /// The CHAP algorithms these credentials may be used with ("SHA3-256", "SHA-256",
    /// "MD5"); absent: all three. The initiator's order of preference decides among them
    /// (RFC 7143 6.2.1), so leaving one out is how a site refuses it.
    pub algorithms: Option<Vec<String>>,
}

impl Chap {
    /// The algorithms accepted. The list is checked when the configuration is validated;
    /// one that does not parse accepts nothing rather than everything.
    pub fn accepted_algorithms(&self) -> Vec<ChapAlgorithm> {
        match &self.algorithms {
            None => ChapAlgorithm::ALL.to_vec(),
            Some(names) => {
                chap::parse_algorithms(names.iter().map(String::as_str)).unwrap_or_default()
            }
        }
    }
}

/// Names, never secrets: a configuration is printed whole by `--check`.
impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "***");
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &"***")
            .field("mutual_user", &self.mutual_user)
            .field("mutual_secret", &hidden(&self.mutual_secret))
            .finish()
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    pub iqn: String,
    pub alias: Option<String>,
    /// Initiator IQNs allowed to log in; empty allows every initiator.
    #[serde(default)]
    pub allowed_initiators: Vec<String>,
    pub chap: Option<Chap>,
    /// Logins to this target only over TLS: a plaintext one is refused with status 0x0202
    /// (authorization failure), on any portal.
    #[serde(default)]
    pub require_tls: bool,
    /// Reachable only through these portals (as configured, or the address bound); empty:
    /// all. Elsewhere the target is not listed and a login is answered 0x0203 (not found).
    #[serde(default)]
    pub portals: Vec<SocketAddr>,
    /// Every login must pass CHAP: an initiator with no secret (its own or the target's)
    /// is refused with 0x0202.
    #[serde(default)]
    pub require_chap: bool,
    /// Per-initiator access: admitted (beside `allowed_initiators`), its own CHAP secret,
    /// and the LUNs it sees.
    #[serde(default, rename = "initiator")]
    pub initiators: Vec<InitiatorAccess>,
    #[serde(default, rename = "lun")]
    pub luns: Vec<LunConfig>,
}

/// `[[target.initiator]]`: one initiator's access to a target.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InitiatorAccess {
    pub name: String,
    /// CHAP for this initiator, instead of the target's.
    pub chap: Option<Chap>,
    /// The LUNs it sees (REPORT LUNS, commands); absent: all (LUN masking).
    pub luns: Option<Vec<u16>>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LunConfig {
    pub id: u16,
    /// The store, as `"file:lun0.img?size=1GiB"` or a table with `kind`; relative paths
    /// are taken from `data_dir`. Any kind the target's registry knows.
    pub store: Option<StoreSpec>,
    /// The form from before `store`, kept working: a kind, with `path` and `size` as its
    /// parameters.
    pub backstore: Option<String>,
    /// File backstores: the image path, relative to `data_dir` unless absolute.
    pub path: Option<PathBuf>,
    /// "1GiB" or "1G" (binary), "1GB" (decimal), 4096 (bytes). Files: created sparse when
    /// missing; an existing file's size is used when this is absent.
    pub size: Option<Size>,
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Logical blocks per physical block as a power of two (0: one; 3 with 512-byte
    /// blocks: 4 KiB physical sectors), as READ CAPACITY(16) reports it.
    #[serde(default)]
    pub physical_block_exponent: u8,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub removable: bool,
    /// Report thin provisioning and honour UNMAP by punching holes.
    #[serde(default = "yes")]
    pub thin: bool,
    pub serial: Option<String>,
    /// Keep a crash-safe map of the units written (`backstore::track`) for incremental
    /// sync: in the store's `.changes` file beside its data, or in `track_file`.
    #[serde(default)]
    pub track: bool,
    /// Where the change map goes, relative to `data_dir` unless absolute: for a store with
    /// no place of its own beside its data (ram, stripe, iscsi), or elsewhere by choice.
    pub track_file: Option<PathBuf>,
    /// The change map's unit: a power of two of at least 4 KiB; 1 MiB when absent.
    pub track_unit: Option<Size>,
    /// Keep the LUN whole as a replica of `rsv sync` (`backstore::undo`): while a sync's
    /// cycle is open on it, the first change of each unit saves the old content in an
    /// undo log first, and a cycle cut off is rolled back (at the next cycle, or when the
    /// target starts). Costs nothing until a cycle opens; off: a sync cut off halfway
    /// leaves the LUN holding no single image.
    #[serde(default = "yes")]
    pub undo: bool,
    /// Where the undo log goes, relative to `data_dir` unless absolute: the store's
    /// `.undo` file beside its data when absent (a store with no such place keeps it in
    /// `data_dir`; a RAM store in memory).
    pub undo_file: Option<PathBuf>,
    /// How fast a SANITIZE OVERWRITE writes the whole LUN: a rate ("128MiB/s", "1gbit"),
    /// or "unlimited"; 128 MiB/s when absent (`scsi::DEFAULT_SANITIZE_RATE`).
    #[serde(default = "default_sanitize_rate", deserialize_with = "sanitize_rate")]
    pub sanitize_rate: Option<u64>,
}

impl LunConfig {
    /// The change map's unit.
    pub fn track_unit(&self) -> u64 {
        self.track_unit
            .map_or(backstore::track::DEFAULT_UNIT, |Size(n)| n)
    }

    /// The store to open: `store` as written, or the older keys mapped onto a spec
    /// (`backstore = "file"`, `path = "a.img"`, `size = "1GiB"` is `file:a.img?size=1073741824`).
    /// Older keys that `stores` says the kind does not take are left out, as they always
    /// were ignored (a ram LUN's `path`).
    pub fn store_spec(&self, stores: &Registry) -> Result<StoreSpec, String> {
        match (&self.store, &self.backstore) {
            (Some(spec), None) if self.path.is_none() && self.size.is_none() => Ok(spec.clone()),
            (Some(_), _) => Err(
                "`store` takes the place of `backstore`, `path` and `size`: give one form, not both"
                    .into(),
            ),
            (None, Some(kind)) => {
                // An unknown kind keeps every key: opening it fails on the kind.
                let takes = |key: &str| match stores.get(kind) {
                    Some(f) => f.params().iter().any(|p| p.name == key),
                    None => true,
                };
                let mut spec = StoreSpec::new(kind.as_str()).map_err(|e| e.to_string())?;
                if let Some(p) = self.path.as_ref().filter(|_| takes("path")) {
                    spec = spec
                        .with("path", p.to_string_lossy())
                        .map_err(|e| e.to_string())?;
                }
                if let Some(Size(n)) = self.size.filter(|_| takes("size")) {
                    spec = spec
                        .with("size", n.to_string())
                        .map_err(|e| e.to_string())?;
                }
                Ok(spec)
            }
            (None, None) => Err(
                "no store: give one, as in `store = \"file:lun0.img?size=1GiB\"` (or \
                 `backstore = \"file\"` with `path` and `size`)"
                    .into(),
            ),
        }
    }
}

fn default_sanitize_rate() -> Option<u64> {
    Some(scsi::DEFAULT_SANITIZE_RATE)
}

/// Bytes per second, or `None` for "unlimited" (or 0).
fn sanitize_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    units::parse_rate_limit(&NumberOrText::deserialize(d)?.into_text())
        .map(|r| r.map(|r| r.bytes_per_sec()))
        .map_err(D::Error::custom)
}

fn default_block_size() -> u32 {
    512
}
fn yes() -> bool {
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        size(d).map(Size)
    }
}

/// A size or rate as TOML gives it: a bare number or a string with its unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    N(u64),
    T(String),
}

impl NumberOrText {
    fn into_text(self) -> String {
        match self {
            NumberOrText::N(n) => n.to_string(),
            NumberOrText::T(t) => t,
        }
    }
}

/// Bytes: a bare number, or a string in the units crate's spelling ("1GiB", "10MB").
fn size<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    let bytes = match NumberOrText::deserialize(d)? {
        NumberOrText::N(n) => n,
        NumberOrText::T(t) => units::parse_size(&t).map_err(D::Error::custom)?,
    };
    T::try_from(bytes)
        .map_err(|_| D::Error::custom(format!("{} is too large here", units::Size(bytes))))
}

fn some_size<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    size(d).map(Some)
}

/// Bytes per second, from a rate written with its unit; a bare number is refused as on the
/// command line, since it reads as bits to some and as bytes to others.
fn pacing_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match units::parse_rate_limit(&NumberOrText::deserialize(d)?.into_text()) {
        Ok(Some(rate)) => Ok(Some(rate.bytes_per_sec())),
        Ok(None) => Err(D::Error::custom(
            "leave pacing_rate out for no pacing; it takes a rate such as \"100mbit\" or \
             \"12.5MB/s\"",
        )),
        Err(e) => Err(D::Error::custom(e)),
    }
}

impl Config {
    /// The configuration used when none is given.
    pub fn embedded_default() -> Config {
        Config {
            portals: default_portals(),
            data_dir: default_data_dir(),
            session: SessionDefaults::default(),
            discovery: Discovery::default(),
            isns: None,
            portal_group: default_portal_group(),
            peer_portal_groups: Vec::new(),
            threads: Threads::default(),
            targets: vec![TargetConfig {
                iqn: DEFAULT_IQN.into(),
                alias: Some("reservoir".into()),
                allowed_initiators: vec![],
                chap: None,
                require_tls: false,
                portals: vec![],
                require_chap: false,
                initiators: vec![],
                luns: vec![LunConfig {
                    id: 0,
                    store: None,
                    backstore: Some("file".into()),
                    path: Some("lun0.img".into()),
                    size: Some(Size(DEFAULT_LUN_SIZE)),
                    block_size: 512,
                    physical_block_exponent: 0,
                    read_only: false,
                    removable: false,
                    thin: true,
                    serial: None,
                    track: false,
                    track_file: None,
                    track_unit: None,
                    undo: true,
                    undo_file: None,
                    sanitize_rate: default_sanitize_rate(),
                }],
            }],
            control: None,
            metrics: None,
        }
    }

    /// Reads and validates `path`; a file that holds CHAP secrets and that every user may
    /// read is said so in one warning (a group may read it: a packaged service's user).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let config = Self::parse(&text, &path.display().to_string())?;
        if let Some(warning) = std::fs::metadata(path)
            .ok()
            .and_then(|m| config.exposed_secrets(path, m.permissions()))
        {
            tracing::warn!("{warning}");
        }
        Ok(config)
    }

    /// What to say when the file at `path`, with `permissions`, lets every user read the
    /// CHAP secrets this configuration holds.
    fn exposed_secrets(&self, path: &Path, permissions: std::fs::Permissions) -> Option<String> {
        use std::os::unix::fs::PermissionsExt;
        let chaps = self.targets.iter().flat_map(|t| {
            t.chap
                .iter()
                .chain(t.initiators.iter().filter_map(|i| i.chap.as_ref()))
        });
        let holds = self.discovery.chap.is_some() || chaps.count() > 0;
        let mode = permissions.mode() & 0o777;
        (holds && mode & 0o004 != 0).then(|| {
            format!(
                "{}: mode {mode:03o} lets every user read its CHAP secrets; chmod o-r it",
                path.display()
            )
        })
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            let (line, col) = e
                .span()
                .map(|sp| line_col(text, sp.start))
                .unwrap_or((0, 0));
            ConfigError::Parse {
                path: origin.to_owned(),
                line,
                col,
                message: e.message().to_owned(),
            }
        })?;
        cfg.validate()
            .map_err(|m| ConfigError::Invalid(m, origin.to_owned()))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.portals.is_empty() {
            return Err("no portals to listen on".into());
        }
        if let Some(c) = &self.control {
            if c.listen.is_some() != c.key_file.is_some() {
                return Err("[control] listen and key_file go together (the agent of \
                            `rsv sync` needs both)"
                    .into());
            }
        }
        if self.metrics.as_ref().is_some_and(|m| m.max_series == 0) {
            return Err("metrics.max_series must be at least 1".into());
        }
        if self.targets.iter().any(|t| t.require_tls)
            && self.portals.iter().all(|p| p.tls.is_none())
        {
            return Err("a target has require_tls = true but no portal has tls".into());
        }
        let s = &self.session;
        if !(1..=65535).contains(&s.max_connections) {
            return Err("session.max_connections must be 1..65535".into());
        }
        if !(512..=16_777_215).contains(&s.max_burst_length) {
            return Err("session.max_burst_length must be 512..16777215".into());
        }
        if !(512..=16_777_215).contains(&s.first_burst_length) {
            return Err("session.first_burst_length must be 512..16777215".into());
        }
        if !(512..=16_777_215).contains(&s.max_recv_data_segment_length) {
            return Err("session.max_recv_data_segment_length must be 512..16777215".into());
        }
        if s.max_outstanding_r2t == 0 {
            return Err("session.max_outstanding_r2t must be at least 1".into());
        }
        if s.error_recovery_level > 2 {
            return Err("session.error_recovery_level must be 0, 1 or 2".into());
        }
        if s.queue_depth == 0 || s.queue_depth > 1 << 20 {
            return Err("session.queue_depth must be 1..1048576".into());
        }
        for (name, list) in [
            ("header_digest", &s.header_digest),
            ("data_digest", &s.data_digest),
        ] {
            if list.is_empty() {
                return Err(format!(
                    "session.{name} must list at least one of None, CRC32C"
                ));
            }
            for d in list {
                if d != "None" && d != "CRC32C" {
                    return Err(format!("session.{name}: {d:?} is not None or CRC32C"));
                }
            }
        }
        if self.targets.is_empty() {
            return Err("no [[target]] defined".into());
        }
        if let Some(i) = &self.isns {
            isns::server_address(&i.server).map_err(|e| format!("isns.server: {e}"))?;
            if i.registration_period == Some(0) {
                return Err("isns.registration_period must be at least 1 second".into());
            }
            if i.entity.as_deref() == Some("") {
                return Err("isns.entity must not be empty".into());
            }
            if let Some(a) = &i.auth {
                a.load().map_err(|e| format!("isns.auth: {e}"))?;
            }
        }
        let mut iqns = HashSet::new();
        for t in &self.targets {
            validate_iscsi_name(&t.iqn).map_err(|e| format!("target {:?}: {e}", t.iqn))?;
            if !iqns.insert(t.iqn.to_ascii_lowercase()) {
                return Err(format!("target {:?} defined twice", t.iqn));
            }
            for i in &t.allowed_initiators {
                validate_iscsi_name(i)
                    .map_err(|e| format!("target {:?}: initiator {i:?}: {e}", t.iqn))?;
            }
            if let Some(c) = &t.chap {
                validate_chap(c).map_err(|e| format!("target {:?}: chap: {e}", t.iqn))?;
            }
            for i in &t.initiators {
                let at = format!("target {:?}: initiator {:?}", t.iqn, i.name);
                validate_iscsi_name(&i.name).map_err(|e| format!("{at}: {e}"))?;
                if let Some(c) = &i.chap {
                    validate_chap(c).map_err(|e| format!("{at}: chap: {e}"))?;
                }
                for l in i.luns.iter().flatten() {
                    if !t.luns.iter().any(|x| x.id == *l) {
                        return Err(format!("{at}: LUN {l} is not one of the target's"));
                    }
                }
            }
            for p in &t.portals {
                let known = self.portals.iter().any(|q| q.listen == *p);
                if !known {
                    return Err(format!(
                        "target {:?}: portal {p} is not one of the portals listened on",
                        t.iqn
                    ));
                }
            }
            let mut ids = HashSet::new();
            for l in &t.luns {
                let at = format!("target {:?} lun {}", t.iqn, l.id);
                if l.id >= 16384 {
                    return Err(format!("{at}: LUN ids go up to 16383"));
                }
                if !ids.insert(l.id) {
                    return Err(format!("{at}: defined twice"));
                }
                if l.block_size != 512 && l.block_size != 4096 {
                    return Err(format!("{at}: block_size must be 512 or 4096"));
                }
                if l.physical_block_exponent > 8 {
                    return Err(format!("{at}: physical_block_exponent must be 0..8"));
                }
                // The form only: which parameters a kind takes is for the registry to say
                // when the store is opened.
                l.store_spec(&Registry::new())
                    .map_err(|e| format!("{at}: {e}"))?;
                if !l.track && (l.track_file.is_some() || l.track_unit.is_some()) {
                    return Err(format!(
                        "{at}: track_file and track_unit go with track = true"
                    ));
                }
                if !l.undo && l.undo_file.is_some() {
                    return Err(format!("{at}: undo_file goes with undo = true"));
                }
                let unit = l.track_unit();
                if unit < backstore::track::MIN_UNIT || !unit.is_power_of_two() {
                    return Err(format!(
                        "{at}: track_unit {unit} is not a power of two of at least 4 KiB"
                    ));
                }
                if let Some(Size(n)) = l.size {
                    if n == 0 || n % l.block_size as u64 != 0 {
                        return Err(format!(
                            "{at}: size {n} is not a positive multiple of the block size {}",
                            l.block_size
                        ));
                    }
                }
            }
        }
        if let Some(c) = &self.discovery.chap {
            validate_chap(c).map_err(|e| format!("discovery chap: {e}"))?;
        }
        if self.portal_group == 0 {
            return Err("portal_group must be 1..65535 (0 is no relative port id)".into());
        }
        let mut groups = HashSet::from([self.portal_group]);
        for &g in &self.peer_portal_groups {
            if g == 0 {
                return Err("peer_portal_groups: 0 is not a group (1..65535)".into());
            }
            if !groups.insert(g) {
                return Err(format!(
                    "peer_portal_groups: group {g} given twice, or it is this target's own \
                     portal_group; every target exporting the LUs needs a group of its own"
                ));
            }
        }
        Ok(())
    }

    /// Whether other targets export these LUs too (`peer_portal_groups`).
    pub fn multipath(&self) -> bool {
        !self.peer_portal_groups.is_empty()
    }
}

fn validate_chap(c: &Chap) -> Result<(), String> {
    if c.user.is_empty() || c.secret.is_empty() {
        return Err("user and secret must not be empty".into());
    }
    match (&c.mutual_user, &c.mutual_secret) {
        (Some(_), None) | (None, Some(_)) => {
            return Err("mutual_user and mutual_secret go together".into());
        }
        (Some(_), Some(ms)) if ms == &c.secret => {
            return Err("mutual_secret must differ from secret (RFC 7143 12.1.3)".into());
        }
        _ => {}
    }
    if let Some(names) = &c.algorithms {
        chap::parse_algorithms(names.iter().map(String::as_str))
            .map_err(|e| format!("algorithms: {e}"))?;
    }
    Ok(())
}

/// iqn., eui. or naa. names as RFC 3720 3.2.6 has them (lower-case is not enforced:
/// comparisons are case-insensitive).
pub fn validate_iscsi_name(n: &str) -> Result<(), String> {
    if n.len() > 223 {
        return Err("longer than 223 bytes".into());
    }
    let lower = n.to_ascii_lowercase();
    let ok_chars = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'))
    };
    if let Some(rest) = lower.strip_prefix("iqn.") {
        let date = rest.get(..7).unwrap_or("");
        let valid_date = date.len() == 7
            && date[..4].chars().all(|c| c.is_ascii_digit())
            && &date[4..5] == "-"
            && date[5..].chars().all(|c| c.is_ascii_digit());
        if !valid_date || !ok_chars(rest) {
            return Err("expected iqn.YYYY-MM.reversed.domain[:name]".into());
        }
        Ok(())
    } else if let Some(hex) = lower.strip_prefix("eui.") {
        if hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            Err("eui. names take 16 hex digits".into())
        }
    } else if let Some(hex) = lower.strip_prefix("naa.") {
        if (hex.len() == 16 || hex.len() == 32) && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            Ok(())
        } else {
            Err("naa. names take 16 or 32 hex digits".into())
        }
    } else {
        Err("must start with iqn., eui. or naa.".into())
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_readable_file_with_chap_secrets_is_said_so() {
        use std::os::unix::fs::PermissionsExt;
        let with = Config::parse(
            "[[target]]\niqn = \"iqn.2026-11.org.reservoir:t\"\n\
             chap = { user = \"u\", secret = \"a-secret-of-12\" }\n",
            "t",
        )
        .unwrap();
        let without = Config::embedded_default();
        let p = Path::new("target.toml");
        let mode = |m| std::fs::Permissions::from_mode(m);
        let said = with.exposed_secrets(p, mode(0o644)).unwrap();
        assert!(said.contains("644") && !said.contains("a-secret"), "{said}");
        assert_eq!(with.exposed_secrets(p, mode(0o640)), None);
        assert_eq!(without.exposed_secrets(p, mode(0o644)), None);
    }

    #[test]
    fn control_section_socket_group_and_agent() {
        let base = "[[target]]\niqn = \"iqn.2026-11.org.reservoir:t\"\n";
        let c = Config::parse(
            &format!("[control]\nsocket = \"/run/r/c.sock\"\ngroup = \"admins\"\n{base}"),
            "c.toml",
        )
        .unwrap();
        let control = c.control.unwrap();
        assert_eq!(control.socket, Some(PathBuf::from("/run/r/c.sock")));
        assert_eq!(control.group.as_deref(), Some("admins"));
        assert_eq!(control.agent(), None);
        let agent = Config::parse(
            &format!("[control]\nlisten = \"127.0.0.1:3262\"\nkey_file = \"k\"\n{base}"),
            "c.toml",
        )
        .unwrap();
        assert_eq!(
            agent.control.unwrap().agent(),
            Some(("127.0.0.1:3262".parse().unwrap(), Path::new("k")))
        );
        // The agent needs both.
        let half = format!("[control]\nlisten = \"127.0.0.1:3262\"\n{base}");
        let e = Config::parse(&half, "c.toml").unwrap_err().to_string();
        assert!(e.contains("listen and key_file go together"), "{e}");
        assert!(Config::parse(&format!("[control]\nsockets = \"x\"\n{base}"), "c").is_err());
    }

    #[test]
    fn isns_section() {
        let base = "[[target]]\niqn = \"iqn.2026-11.org.reservoir:t\"\n";
        let c = Config::parse(
            &format!("{base}[isns]\nserver = \"10.0.0.5\"\nregistration_period = 60\n"),
            "i.toml",
        )
        .unwrap();
        c.validate().unwrap();
        let i = c.isns.unwrap();
        assert_eq!(
            (i.server.as_str(), i.registration_period),
            ("10.0.0.5", Some(60))
        );
        assert_eq!(i.entity, None);
        for bad in [
            "server = \"h:0\"",
            "server = \"h\"\nregistration_period = 0",
            "server = \"h\"\nentity = \"\"",
        ] {
            let e = Config::parse(&format!("{base}[isns]\n{bad}\n"), "i.toml").unwrap_err();
            assert!(e.to_string().contains(": isns."), "{bad}: {e}");
        }
        assert!(Config::parse(&format!("{base}[isns]\nsrv = \"h\"\n"), "i.toml").is_err());

        // [isns.auth]: the keys are read and checked with the configuration.
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pem");
        let auth = |key: &std::path::Path, server: &std::path::Path| {
            format!(
                "{base}[isns]\nserver = \"h\"\n[isns.auth]\nname = \"t.example.org\"\n\
                 key = \"{}\"\nserver_key = \"{}\"\n",
                key.display(),
                server.display()
            )
        };
        let e = Config::parse(&auth(&key, &key), "i.toml").unwrap_err();
        assert!(e.to_string().contains("isns.auth: "), "{e}");
        std::fs::write(&key, "not a key").unwrap();
        let e = Config::parse(&auth(&key, &key), "i.toml").unwrap_err();
        assert!(e.to_string().contains("PKCS #8"), "{e}");
    }

    #[test]
    fn portal_groups() {
        let base = "[[target]]\niqn = \"iqn.2026-11.org.reservoir:t\"\n";
        let c = Config::parse(base, "p.toml").unwrap();
        assert_eq!((c.portal_group, c.multipath()), (1, false));
        let c = Config::parse(
            &format!("portal_group = 2\npeer_portal_groups = [1, 3]\n{base}"),
            "p.toml",
        )
        .unwrap();
        assert_eq!((c.portal_group, c.multipath()), (2, true));
        for (bad, says) in [
            ("portal_group = 0", "portal_group must be"),
            ("peer_portal_groups = [0]", "0 is not a group"),
            ("peer_portal_groups = [1]", "own"),
            ("portal_group = 2\npeer_portal_groups = [3, 3]", "twice"),
        ] {
            let e = Config::parse(&format!("{bad}\n{base}"), "p.toml").unwrap_err();
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn tls_portals_and_access_rules_read_and_are_checked() {
        let lun = "[[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n\
                   [[target.lun]]\nid = 1\nstore = \"ram:?size=1MiB\"\n";
        let portals = "portals = [\"127.0.0.1:3260\", { listen = \"0.0.0.0:3261\", tls = { \
                       cert = \"t.crt\", key = \"t.key\", client_ca = \"ca.crt\" } }]\n";
        let c = Config::parse(
            &format!(
                "{portals}[[target]]\niqn = \"iqn.2026-11.org.example:t\"\nrequire_tls = true\n\
                 portals = [\"0.0.0.0:3261\"]\nrequire_chap = true\n\
                 [[target.initiator]]\nname = \"iqn.2026-11.org.example:h\"\nluns = [1]\n\
                 chap = {{ user = \"h\", secret = \"h-secret-1234\" }}\n{lun}"
            ),
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            c.portals[0],
            Portal::plain("127.0.0.1:3260".parse().unwrap())
        );
        let tls = c.portals[1].tls.as_ref().unwrap();
        assert_eq!(
            (tls.cert.to_str(), tls.client_ca.as_deref(), tls.require),
            (Some("t.crt"), Some(Path::new("ca.crt")), true)
        );
        let t = &c.targets[0];
        assert!(t.require_tls && t.require_chap);
        assert_eq!(t.initiators[0].luns, Some(vec![1]));
        let target = "[[target]]\niqn = \"iqn.2026-11.org.example:t\"\n";
        for (bad, says) in [
            (
                format!("portals = [{{ listen = \"127.0.0.1:1\", tls = {{ cert = \"c\" }} }}]\n{target}{lun}"),
                "key",
            ),
            (
                format!("portals = [{{ listen = \"127.0.0.1:1\", tsl = {{}} }}]\n{target}{lun}"),
                "tsl",
            ),
            (format!("portals = [\"nowhere\"]\n{target}{lun}"), "not ADDR:PORT"),
            (
                format!("{target}require_tls = true\n{lun}"),
                "require_tls = true but no portal has tls",
            ),
            (
                format!("{target}portals = [\"10.0.0.1:3260\"]\n{lun}"),
                "portal 10.0.0.1:3260 is not one of the portals listened on",
            ),
            (
                format!("{target}[[target.initiator]]\nname = \"iqn.2026-11.x:h\"\nluns = [7]\n{lun}"),
                "LUN 7 is not one of the target's",
            ),
        ] {
            let e = Config::parse(&bad, "t.toml").unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn threads_section() {
        let base = "[[target]]\niqn = \"iqn.2026-11.org.reservoir:t\"\n";
        let c = Config::parse(base, "t.toml").unwrap();
        assert_eq!(c.threads.placement, Placement::Session);
        assert!(c.threads.count().is_some_and(|n| n >= 1));
        let c = Config::parse(&format!("[threads]\nconnections = 3\n{base}"), "t.toml").unwrap();
        assert_eq!(c.threads.count(), Some(3));
        let c = Config::parse(
            &format!("[threads]\nplacement = \"shared\"\n{base}"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.threads.count(), None);
        let e = Config::parse(
            &format!("[threads]\nplacement = \"anywhere\"\n{base}"),
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("anywhere") && e.contains("session"), "{e}");
    }

    #[test]
    fn chap_algorithms_are_validated() {
        let with = |algs: &str| {
            Config::parse(
                &format!(
                    "[discovery]\nchap = {{ user = \"d\", secret = \"discsecret12\"{algs} }}\n\
                     [[target]]\niqn = \"iqn.2026-11.org.example:a\"\n\
                     [[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n"
                ),
                "t.toml",
            )
        };
        let c = with("").unwrap();
        let chap = c.discovery.chap.unwrap();
        assert_eq!(chap.accepted_algorithms(), ChapAlgorithm::ALL.to_vec());
        let c = with(", algorithms = [\"SHA3-256\", \"SHA-256\"]").unwrap();
        assert_eq!(
            c.discovery.chap.unwrap().accepted_algorithms(),
            vec![ChapAlgorithm::Sha3_256, ChapAlgorithm::Sha256]
        );
        let err = |algs: &str| with(algs).unwrap_err().to_string();
        let e = err(", algorithms = [\"SHA1\"]");
        assert!(
            e.contains("discovery chap: algorithms: unknown CHAP algorithm \"SHA1\""),
            "{e}"
        );
        assert!(err(", algorithms = []").contains("no CHAP algorithm listed"));
        assert!(err(", algorithms = [\"MD5\", \"md5\"]").contains("MD5 listed twice"));
    }

    #[test]
    fn embedded_default_is_valid() {
        Config::embedded_default().validate().unwrap();
    }

    #[test]
    fn full_config_parses() {
        let c = Config::parse(
            r#"
portals = ["127.0.0.1:3260", "[::1]:3260"]
data_dir = "/var/lib/reservoir"
[session]
max_connections = 16
initial_r2t = false
header_digest = ["CRC32C", "None"]
[discovery]
chap = { user = "disc", secret = "discsecret12" }
[[target]]
iqn = "iqn.2026-11.org.example:disk1"
alias = "disk one"
allowed_initiators = ["iqn.2026-11.org.example:host"]
chap = { user = "u", secret = "secretsecret", mutual_user = "t", mutual_secret = "othersecret1" }
[[target.lun]]
id = 0
backstore = "file"
path = "disk1.img"
size = "2GiB"
[[target.lun]]
id = 1
backstore = "ram"
size = "64MiB"
block_size = 4096
read_only = true
[[target.lun]]
id = 2
backstore = "ram"
size = "64MiB"
physical_block_exponent = 3
"#,
            "test.toml",
        )
        .unwrap();
        assert_eq!(c.portals.len(), 2);
        assert_eq!(c.session.max_connections, 16);
        assert_eq!(c.targets[0].luns[0].size, Some(Size(2 << 30)));
        assert_eq!(c.targets[0].luns[1].block_size, 4096);
        assert_eq!(c.targets[0].luns[1].physical_block_exponent, 0);
        assert_eq!(c.targets[0].luns[2].physical_block_exponent, 3);
        let stores = Registry::with_builtins();
        let spec = c.targets[0].luns[0].store_spec(&stores).unwrap();
        assert_eq!(spec.to_string(), "file:disk1.img?size=2147483648");
        let desc = stores.context(&c.data_dir).check(&spec).unwrap();
        assert!(
            desc.starts_with("file /var/lib/reservoir/disk1.img,"),
            "{desc}"
        );
    }

    #[test]
    fn store_specs_as_text_or_table_and_the_older_keys() {
        let c = Config::parse(
            r#"
[[target]]
iqn = "iqn.2026-11.x:y"
[[target.lun]]
id = 0
store = "ram:?size=64MiB"
[[target.lun]]
id = 1
backstore = "ram"
path = "ignored.img"
size = "64MiB"
[[target.lun]]
id = 2
block_size = 4096
[target.lun.store]
kind = "file"
path = "two.img"
size = "1GiB"
"#,
            "s.toml",
        )
        .unwrap();
        let specs: Vec<String> = c.targets[0]
            .luns
            .iter()
            .map(|l| {
                l.store_spec(&Registry::with_builtins())
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            specs,
            [
                "ram:?size=64MiB",
                "ram:?size=67108864",
                "file:two.img?size=1GiB"
            ]
        );
        assert_eq!(c.targets[0].luns[2].block_size, 4096);
        let default = &Config::embedded_default().targets[0].luns[0];
        assert_eq!(
            default
                .store_spec(&Registry::with_builtins())
                .unwrap()
                .to_string(),
            format!("file:lun0.img?size={DEFAULT_LUN_SIZE}")
        );
    }

    #[test]
    fn store_errors_name_the_lun_and_the_spec() {
        let lun = |body: &str| {
            Config::parse(
                &format!("[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid = 3\n{body}"),
                "e.toml",
            )
            .unwrap_err()
            .to_string()
        };
        let e = lun("store = \"ram:?size=1M\"\nbackstore = \"ram\"\n");
        assert!(e.contains("lun 3") && e.contains("one form"), "{e}");
        let e = lun("store = \"ram:?size=1M\"\nsize = 4096\n");
        assert!(e.contains("lun 3") && e.contains("one form"), "{e}");
        let e = lun("block_size = 512\n");
        assert!(e.contains("lun 3") && e.contains("no store"), "{e}");
        let e = lun("store = \"lun0.img\"\n");
        assert!(
            e.starts_with("e.toml:5:") && e.contains("`lun0.img`") && e.contains("KIND:"),
            "{e}"
        );
        let e = lun("[target.lun.store]\npath = \"a.img\"\n");
        assert!(e.starts_with("e.toml:") && e.contains("no `kind`"), "{e}");
        let e = lun("backstore = \"File\"\npath = \"a.img\"\n");
        assert!(e.contains("lun 3") && e.contains("\"File\""), "{e}");
    }

    #[test]
    fn change_tracking_keys() {
        let lun = |body: &str| {
            Config::parse(
                &format!(
                    "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid = 4\n\
                     store = \"ram:?size=1M\"\n{body}"
                ),
                "t.toml",
            )
            .map(|c| c.targets[0].luns[0].clone())
            .map_err(|e| e.to_string())
        };
        let l = lun("").unwrap();
        assert!(!l.track && l.track_file.is_none());
        assert_eq!(l.track_unit(), 1 << 20);
        let l = lun("track = true\ntrack_file = \"x.changes\"\ntrack_unit = \"4KiB\"\n").unwrap();
        assert!(l.track);
        assert_eq!(l.track_file.as_deref(), Some(Path::new("x.changes")));
        assert_eq!(l.track_unit(), 4096);
        let e = lun("track_file = \"x.changes\"\n").unwrap_err();
        assert!(e.contains("lun 4") && e.contains("track = true"), "{e}");
        for unit in ["2KiB", "3MiB"] {
            let e = lun(&format!("track = true\ntrack_unit = \"{unit}\"\n")).unwrap_err();
            assert!(e.contains("lun 4") && e.contains("power of two"), "{e}");
        }
    }

    #[test]
    fn bad_config_names_line_and_reason() {
        let e = Config::parse(
            "portals = [\"127.0.0.1:3260\"]\n[session]\nmax_connectionz = 3\n",
            "bad.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("bad.toml:3:"), "{e}");
        assert!(e.contains("max_connectionz"), "{e}");

        let e = Config::parse(
            "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = 1000\n",
            "b.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("multiple of the block size"), "{e}");

        let e = Config::parse(
            "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid = 0\nbackstore = \"ram\"\nsize = 4096\nphysical_block_exponent = 9\n",
            "p.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("physical_block_exponent"), "{e}");

        let e = Config::parse("[[target]]\niqn = \"foo\"\n", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("iqn."), "{e}");
    }

    #[test]
    fn pacing_settings() {
        let d = Config::embedded_default();
        assert!(d.session.accept_pacing_hint);
        assert_eq!(d.session.pacing_rate, None);
        let c = Config::parse(
            "[session]\naccept_pacing_hint = false\npacing_rate = \"100mbit\"\n[[target]]\niqn = \"iqn.2026-11.x:y\"\n",
            "p.toml",
        )
        .unwrap();
        assert!(!c.session.accept_pacing_hint);
        assert_eq!(c.session.pacing_rate, Some(12_500_000));
        let e = Config::parse(
            "[session]\npacing_rate = 0\n[[target]]\niqn = \"iqn.2026-11.x:y\"\n",
            "z.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("leave pacing_rate out"), "{e}");
        // Bytes per second before, and bits to tc: neither guessed now.
        let e = Config::parse(
            "[session]\npacing_rate = 12500000\n[[target]]\niqn = \"iqn.2026-11.x:y\"\n",
            "b.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("say bits or bytes per second"), "{e}");
        let c = Config::parse(
            "[session]\npacing_rate = \"12.5MB/s\"\n[[target]]\niqn = \"iqn.2026-11.x:y\"\n",
            "m.toml",
        )
        .unwrap();
        assert_eq!(c.session.pacing_rate, Some(12_500_000));
    }

    #[test]
    fn sizes() {
        let lun = |size: &str| {
            Config::parse(
                &format!(
                    "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid = 0\n\
                     backstore = \"ram\"\nsize = {size}\n"
                ),
                "s.toml",
            )
            .map(|c| c.targets[0].luns[0].size)
            .map_err(|e| e.to_string())
        };
        assert_eq!(lun("\"1GiB\""), Ok(Some(Size(1 << 30))));
        assert_eq!(lun("\"1g\""), Ok(Some(Size(1 << 30))));
        assert_eq!(lun("\"1.5M\""), Ok(Some(Size(3 << 19))));
        assert_eq!(lun("\"10240KB\""), Ok(Some(Size(10_240_000))));
        assert_eq!(lun("4096"), Ok(Some(Size(4096))));
        assert_eq!(lun("\"4096\""), Ok(Some(Size(4096))));
        assert!(lun("\"12 parsecs\"").unwrap_err().contains("unknown unit"));
        assert!(lun("\"64mb\"").unwrap_err().contains("lowercase b"));
        assert!(lun("\"\"").is_err());

        let c = Config::parse(
            "[session]\nmax_burst_length = \"256KiB\"\nsend_buffer = \"4M\"\n\
             recv_buffer = 174080\nnotsent_lowat = \"128K\"\n[[target]]\niqn = \"iqn.2026-11.x:y\"\n",
            "b.toml",
        )
        .unwrap();
        assert_eq!(c.session.max_burst_length, 256 << 10);
        assert_eq!(c.session.send_buffer, Some(4 << 20));
        assert_eq!(c.session.recv_buffer, Some(174_080));
        assert_eq!(c.session.notsent_lowat, Some(128 << 10));
        let e = Config::parse("[session]\nnotsent_lowat = \"8GiB\"\n", "n.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("8GiB is too large here"), "{e}");
    }

    #[test]
    fn names() {
        validate_iscsi_name("iqn.2026-11.org.reservoir:target0").unwrap();
        validate_iscsi_name("eui.02004567A425678D").unwrap();
        assert!(validate_iscsi_name("iqn.26-11.x").is_err());
        assert!(validate_iscsi_name("iqn.2026-11.x y").is_err());
    }
}
