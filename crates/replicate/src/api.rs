//! What the coordinator and the disk servers' agents say to each other: JSON bodies of
//! the control channel's requests and answers (see `docs/replicate.md` for the table).

use serde::{Deserialize, Serialize};

/// The default TCP port of a disk server's control endpoint.
pub const CONTROL_PORT: u16 = 3262;

/// `GET /v1/luns`: what a disk server (or file server) serves.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Luns {
    /// iSCSI portals of the target, as configured (`0.0.0.0` means every address).
    pub portals: Vec<String>,
    pub luns: Vec<LunInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LunInfo {
    pub iqn: String,
    pub lun: u16,
    pub size: u64,
    pub block_size: u32,
    /// The store spec, as in the target's configuration.
    pub store: String,
    /// Change tracking, when the LUN keeps it.
    pub tracking: Option<Tracking>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tracking {
    /// The tracking unit, bytes.
    pub unit: u64,
    /// Bytes in units written since the last completed sync (or never synced).
    pub dirty_bytes: u64,
}

/// Which units a send covers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum What {
    /// Every unit.
    All,
    /// The units the change tracking marks: written since the last completed sync, or
    /// still unsent from an interrupted one. Refused when the LUN keeps no tracking.
    Changed,
    /// These ranges of unit indices (a repair after a checksum mismatch).
    Units(Vec<(u64, u64)>),
}

/// `POST /v1/send`: copy a local LUN to a LUN of another target.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SendRequest {
    pub iqn: String,
    pub lun: u16,
    /// `iscsi://HOST:PORT/IQN/LUN` of the destination member.
    pub dest: String,
    /// Bytes per unit: the transfer, checksum and resume granularity.
    pub unit: u64,
    pub what: What,
    /// Skip the first units of the plan (a resume without change tracking).
    #[serde(default)]
    pub skip_units: u64,
    /// The pacing rate to start at, bytes per second (absent: unpaced).
    #[serde(default)]
    pub pacing: Option<u64>,
    /// Session options for the iSCSI session to the destination (`key=value`, as in an
    /// iscsi:// URL's query), e.g. the path's rate for auto-tuning.
    #[serde(default)]
    pub session: Vec<(String, String)>,
    /// Compression on the wire (`docs/replicate.md`); absent from older coordinators: auto.
    #[serde(default)]
    pub compress: crate::squeeze::Mode,
    /// Read the LUN from the image of this cut (`POST /v1/cut/image`), not the live LUN;
    /// with `what: changed`, the units are those frozen at the cut.
    #[serde(default)]
    pub cut: Option<u64>,
    /// With `what: changed`, these units too (ranges of unit indices): a failback's
    /// destination's own changes since the last image both sites hold.
    #[serde(default)]
    pub also: Vec<(u64, u64)>,
}

/// `POST /v1/connect`: log in a session to `dest` with `session`'s options and keep it
/// for the next send to `dest` with the same options (`POST /v1/send`), so that the send
/// writes at once: a cycle's streams log in while the far cycle opens, before the cut.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConnectRequest {
    pub dest: String,
    #[serde(default)]
    pub session: Vec<(String, String)>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SendStarted {
    pub job: u64,
    pub units: u64,
    pub bytes: u64,
    /// The change-tracking epoch frozen for this send (release it after verification).
    pub epoch: Option<u64>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Connecting,
    Running,
    Done,
    Failed,
    Cancelled,
}

/// `GET /v1/jobs/ID`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobStatus {
    pub job: u64,
    pub state: JobState,
    pub error: Option<String>,
    pub bytes: u64,
    /// Bytes acknowledged by the destination.
    pub done_bytes: u64,
    /// Bytes acknowledged and flushed there (SYNCHRONIZE CACHE): safe to skip on resume.
    pub durable_bytes: u64,
    pub units: u64,
    pub done_units: u64,
    /// Units of the plan, from its start, all durable: a resume may skip this many.
    pub durable_prefix: u64,
    pub elapsed_ms: u64,
    /// When the send ended, ms after it started (the agent's clock, as `elapsed_ms`):
    /// `elapsed_ms - ended_ms` ago. Absent while it runs (and from older agents).
    #[serde(default)]
    pub ended_ms: Option<u64>,
    /// When its session was logged in and the destination LUN opened, ms after it
    /// started (the agent's clock). Absent until then (and from older agents).
    #[serde(default)]
    pub login_ms: Option<u64>,
    /// When the destination acknowledged its first unit, ms after it started.
    #[serde(default)]
    pub first_ack_ms: Option<u64>,
    /// Its session was logged in ahead (`POST /v1/connect`), not by the send.
    #[serde(default)]
    pub connected_ahead: bool,
    pub pacing: Option<u64>,
    pub queue_depth: usize,
    pub connections: usize,
    pub min_rtt_ms: f64,
    pub srtt_ms: f64,
    pub retransmits: u64,
    /// Delivery rate the connections measured last (TCP_INFO), bytes per second.
    pub path_rate: u64,
    /// Bytes per second the connections put across the path over their last span
    /// (segments delivered, SACKed ones included); 0 when not known (older agents).
    #[serde(default)]
    pub wire_rate: u64,
    pub epoch: Option<u64>,
    /// Bytes of the units sent as data (before compression).
    #[serde(default)]
    pub data_bytes: u64,
    /// Bytes those units took in the writes' Data-Out: as they are, or compressed.
    #[serde(default)]
    pub wire_bytes: u64,
    /// Bytes made zeros on the destination without data: units the source does not hold,
    /// or holds as zeros.
    #[serde(default)]
    pub zero_bytes: u64,
    /// Units sent compressed.
    #[serde(default)]
    pub compressed_units: u64,
}

/// `POST /v1/jobs/ID/pace`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Pace {
    pub rate: Option<u64>,
}

/// `GET /v1/jobs/ID/sums` and `POST /v1/sums`'s answer: BLAKE3 of each unit (first 16
/// bytes, hex), by unit index.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct Sums {
    pub unit: u64,
    pub sums: Vec<(u64, String)>,
}

/// `POST /v1/sums`: checksum these units of a local LUN.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SumsRequest {
    pub iqn: String,
    pub lun: u16,
    pub unit: u64,
    /// Ranges of unit indices; the last unit of a LUN may be short.
    pub units: Vec<(u64, u64)>,
}

/// `POST /v1/release`: the sync of a frozen epoch is complete and verified.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Release {
    pub iqn: String,
    pub lun: u16,
    pub epoch: u64,
}

/// `POST /v1/cut/{hold,image,release,drop}`: one member's part in a consistency group's
/// cut (`crate::cut`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CutRequest {
    pub iqn: String,
    pub lun: u16,
    /// The cut's id, chosen by the coordinator.
    pub cut: u64,
    /// `hold`: the agent releases the hold by itself after this long (ms).
    #[serde(default)]
    pub hold_ms: u64,
    /// `image`: the agent drops the image when no request has named it for this long
    /// (ms; the coordinator is gone).
    #[serde(default)]
    pub lease_ms: u64,
}

/// The answer to a cut request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct CutAnswer {
    pub cut: u64,
    /// `release`: how long write answers were held, µs (absent: no such hold was on).
    #[serde(default)]
    pub held_us: Option<u64>,
    /// `release`: write answers that waited.
    #[serde(default)]
    pub answers: Option<u64>,
    /// `image`: the change-tracking epoch frozen at the cut, when the LUN keeps tracking.
    #[serde(default)]
    pub epoch: Option<u64>,
}

/// Every error answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error: String,
}

/// A unit's checksum: the first 16 bytes of its BLAKE3, hex.
pub fn unit_sum(data: &[u8]) -> String {
    crate::auth::hex(&blake3::hash(data).as_bytes()[..16])
}

/// Total units of `size` bytes in `unit`s (the last may be short).
pub fn unit_count(size: u64, unit: u64) -> u64 {
    size.div_ceil(unit)
}

/// The byte range of unit `i`.
pub fn unit_range(i: u64, unit: u64, size: u64) -> (u64, u64) {
    let start = i * unit;
    (start, (start + unit).min(size))
}

/// `POST /v1/cycle/{state,open,commit,rollback}`: a destination member's part in keeping
/// the far copy whole (`crate::cycle`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct CycleRequest {
    pub iqn: String,
    pub lun: u16,
    /// `open`, `commit`: the cycle's id (the cut's), not 0.
    #[serde(default)]
    pub cycle: u64,
    /// `open`: when the cycle's image was cut at the source, ms since the Unix epoch.
    #[serde(default)]
    pub cut_ms: u64,
    /// `open`: the epoch the transfer gives both sides (`role::Allowed`); a LUN at a
    /// higher epoch (promoted since) refuses it. 0: not said (an older coordinator).
    #[serde(default)]
    pub epoch: u64,
}

/// The answer to a cycle request: the member's state after it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct CycleAnswer {
    /// Whether the LUN keeps an undo log (`undo = true`): without one, a cycle cut off
    /// leaves it holding no single image.
    pub undo: bool,
    /// The cycle open now: the LUN holds no whole image until it commits or rolls back.
    #[serde(default)]
    pub open: Option<u64>,
    /// The last committed cycle, and when its image was cut (ms since the Unix epoch).
    #[serde(default)]
    pub committed: Option<u64>,
    #[serde(default)]
    pub committed_cut_ms: Option<u64>,
    /// Bytes of old content the open cycle saved.
    #[serde(default)]
    pub saved_bytes: u64,
    /// A cycle rolled back since the last commit (at the target's start, or asked): what
    /// the source counted as sent in it is gone, so the next cycle sends every unit.
    #[serde(default)]
    pub rolled_back: Option<u64>,
    /// The open cycle, when it is prepared (`POST /v1/cycle/prepare`): every unit of it
    /// received and durable here, its streams shut out; it waits to be committed or
    /// rolled back, and a restart keeps it.
    #[serde(default)]
    pub prepared: Option<u64>,
    /// Units the open cycle saved, and the syncs (fdatasync) of its undo log that made
    /// them durable: concurrent saves share syncs, so fewer syncs than units.
    #[serde(default)]
    pub saved_units: u64,
    #[serde(default)]
    pub log_syncs: u64,
}
