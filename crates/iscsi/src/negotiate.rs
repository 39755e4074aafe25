//! Login/text key negotiation (RFC 7143 sections 6, 12 and 13; RFC 7144 for
//! iSCSIProtocolLevel).
//!
//! The [`KEYS`] table describes every key; [`Responder`] answers an offer the way the RFC
//! prescribes for each key type, and [`Originator`] builds our offer and checks the
//! peer's answers against the same rules.

use std::collections::HashMap;

use thiserror::Error;

use crate::text::{
    encode_bool, parse_bool, parse_number, TextKeys, IRRELEVANT, NOT_UNDERSTOOD, REJECT,
};

/// How the outcome of a key is computed (RFC 7143 6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    List,
    NumericalMin,
    NumericalMax,
    BooleanAnd,
    BooleanOr,
    Declarative,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Connection,
    Session,
}

/// When a key may be used (the "Use" line of RFC 7143 13 and 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// Security negotiation stage of the login only.
    Security,
    /// Login of the leading connection only (LO).
    LeadingOnly,
    /// Any login, never in full feature phase (IO).
    InitializeOnly,
    /// Login and full feature phase (ALL).
    All,
    /// Full feature phase only (FFPO).
    FullFeatureOnly,
    /// Obsoleted by RFC 7143 (the marker keys).
    Obsolete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    Initiator,
    Target,
    Both,
}

/// Where a negotiation takes place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Security,
    Operational,
    FullFeature,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

impl SessionType {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Normal => "Normal",
            SessionType::Discovery => "Discovery",
        }
    }

    pub fn parse(v: &str) -> Option<SessionType> {
        match v {
            "Normal" => Some(SessionType::Normal),
            "Discovery" => Some(SessionType::Discovery),
            _ => None,
        }
    }
}

/// TaskReporting (RFC 7143 13.23). The variants are ordered by capability: a party that
/// supports FastAbort also supports ResponseFence, which implies RFC3720 semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum TaskReporting {
    #[default]
    Rfc3720,
    ResponseFence,
    FastAbort,
}

impl TaskReporting {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskReporting::Rfc3720 => "RFC3720",
            TaskReporting::ResponseFence => "ResponseFence",
            TaskReporting::FastAbort => "FastAbort",
        }
    }

    pub fn parse(v: &str) -> Option<TaskReporting> {
        match v {
            "RFC3720" => Some(TaskReporting::Rfc3720),
            "ResponseFence" => Some(TaskReporting::ResponseFence),
            "FastAbort" => Some(TaskReporting::FastAbort),
            _ => None,
        }
    }
}

/// One row of the key table.
#[derive(Debug, Clone, Copy)]
pub struct KeyDef {
    pub name: &'static str,
    pub kind: KeyKind,
    pub scope: Scope,
    pub usage: Usage,
    pub sender: Sender,
    /// Admissible range of a numerical value.
    pub range: Option<(u64, u64)>,
    /// Admissible values of a list (or the enumerated declarative values).
    pub values: &'static [&'static str],
    /// The RFC default, if the key has one.
    pub default: Option<&'static str>,
    /// "Irrelevant when: SessionType=Discovery".
    pub irrelevant_in_discovery: bool,
}

const fn key(
    name: &'static str,
    kind: KeyKind,
    scope: Scope,
    usage: Usage,
    sender: Sender,
) -> KeyDef {
    KeyDef {
        name,
        kind,
        scope,
        usage,
        sender,
        range: None,
        values: &[],
        default: None,
        irrelevant_in_discovery: false,
    }
}

const fn num(
    name: &'static str,
    kind: KeyKind,
    lo: u64,
    hi: u64,
    default: &'static str,
    discovery_irrelevant: bool,
) -> KeyDef {
    KeyDef {
        name,
        kind,
        scope: Scope::Session,
        usage: Usage::LeadingOnly,
        sender: Sender::Both,
        range: Some((lo, hi)),
        values: &[],
        default: Some(default),
        irrelevant_in_discovery: discovery_irrelevant,
    }
}

const fn boolean(
    name: &'static str,
    kind: KeyKind,
    default: &'static str,
    discovery_irrelevant: bool,
) -> KeyDef {
    KeyDef {
        name,
        kind,
        scope: Scope::Session,
        usage: Usage::LeadingOnly,
        sender: Sender::Both,
        range: None,
        values: &["Yes", "No"],
        default: Some(default),
        irrelevant_in_discovery: discovery_irrelevant,
    }
}

const SEGMENT_MAX: u64 = (1 << 24) - 1;
const DIGESTS: &[&str] = &["CRC32C", "None"];

use KeyKind::*;

/// Every key of RFC 7143 (plus iSCSIProtocolLevel from RFC 7144).
pub static KEYS: &[KeyDef] = &[
    KeyDef {
        values: DIGESTS,
        default: Some("None"),
        ..key(
            "HeaderDigest",
            List,
            Scope::Connection,
            Usage::InitializeOnly,
            Sender::Both,
        )
    },
    KeyDef {
        values: DIGESTS,
        default: Some("None"),
        ..key(
            "DataDigest",
            List,
            Scope::Connection,
            Usage::InitializeOnly,
            Sender::Both,
        )
    },
    num("MaxConnections", NumericalMin, 1, 65535, "1", true),
    key(
        "SendTargets",
        Declarative,
        Scope::Session,
        Usage::FullFeatureOnly,
        Sender::Initiator,
    ),
    key(
        "TargetName",
        Declarative,
        Scope::Session,
        Usage::All,
        Sender::Both,
    ),
    key(
        "InitiatorName",
        Declarative,
        Scope::Session,
        Usage::InitializeOnly,
        Sender::Initiator,
    ),
    key(
        "TargetAlias",
        Declarative,
        Scope::Session,
        Usage::All,
        Sender::Target,
    ),
    key(
        "InitiatorAlias",
        Declarative,
        Scope::Session,
        Usage::All,
        Sender::Initiator,
    ),
    key(
        "TargetAddress",
        Declarative,
        Scope::Session,
        Usage::All,
        Sender::Target,
    ),
    KeyDef {
        range: Some((0, 65535)),
        ..key(
            "TargetPortalGroupTag",
            Declarative,
            Scope::Session,
            Usage::InitializeOnly,
            Sender::Target,
        )
    },
    boolean("InitialR2T", BooleanOr, "Yes", true),
    boolean("ImmediateData", BooleanAnd, "Yes", true),
    KeyDef {
        range: Some((512, SEGMENT_MAX)),
        default: Some("8192"),
        ..key(
            "MaxRecvDataSegmentLength",
            Declarative,
            Scope::Connection,
            Usage::All,
            Sender::Both,
        )
    },
    num(
        "MaxBurstLength",
        NumericalMin,
        512,
        SEGMENT_MAX,
        "262144",
        true,
    ),
    num(
        "FirstBurstLength",
        NumericalMin,
        512,
        SEGMENT_MAX,
        "65536",
        true,
    ),
    num("DefaultTime2Wait", NumericalMax, 0, 3600, "2", false),
    num("DefaultTime2Retain", NumericalMin, 0, 3600, "20", false),
    num("MaxOutstandingR2T", NumericalMin, 1, 65535, "1", true),
    boolean("DataPDUInOrder", BooleanOr, "Yes", true),
    boolean("DataSequenceInOrder", BooleanOr, "Yes", true),
    num("ErrorRecoveryLevel", NumericalMin, 0, 2, "0", false),
    KeyDef {
        values: &["Discovery", "Normal"],
        default: Some("Normal"),
        ..key(
            "SessionType",
            Declarative,
            Scope::Session,
            Usage::LeadingOnly,
            Sender::Initiator,
        )
    },
    KeyDef {
        values: &["KRB5", "SRP", "SPKM1", "SPKM2", "CHAP", "None"],
        default: Some("None"),
        ..key(
            "AuthMethod",
            List,
            Scope::Connection,
            Usage::Security,
            Sender::Both,
        )
    },
    key(
        "CHAP_A",
        List,
        Scope::Connection,
        Usage::Security,
        Sender::Both,
    ),
    key(
        "CHAP_I",
        Declarative,
        Scope::Connection,
        Usage::Security,
        Sender::Both,
    ),
    key(
        "CHAP_C",
        Declarative,
        Scope::Connection,
        Usage::Security,
        Sender::Both,
    ),
    key(
        "CHAP_N",
        Declarative,
        Scope::Connection,
        Usage::Security,
        Sender::Both,
    ),
    key(
        "CHAP_R",
        Declarative,
        Scope::Connection,
        Usage::Security,
        Sender::Both,
    ),
    num("iSCSIProtocolLevel", NumericalMin, 0, 31, "1", true),
    KeyDef {
        values: &["RFC3720", "ResponseFence", "FastAbort"],
        default: Some("RFC3720"),
        irrelevant_in_discovery: true,
        ..key(
            "TaskReporting",
            List,
            Scope::Session,
            Usage::LeadingOnly,
            Sender::Both,
        )
    },
    KeyDef {
        default: Some("No"),
        ..key(
            "OFMarker",
            BooleanAnd,
            Scope::Connection,
            Usage::Obsolete,
            Sender::Both,
        )
    },
    KeyDef {
        default: Some("No"),
        ..key(
            "IFMarker",
            BooleanAnd,
            Scope::Connection,
            Usage::Obsolete,
            Sender::Both,
        )
    },
    key(
        "OFMarkInt",
        NumericalMin,
        Scope::Connection,
        Usage::Obsolete,
        Sender::Both,
    ),
    key(
        "IFMarkInt",
        NumericalMin,
        Scope::Connection,
        Usage::Obsolete,
        Sender::Both,
    ),
];

/// The table row of a standard key; `None` for unknown and X-/X# extension keys.
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|k| k.name == name)
}

/// Reservoir's private login key (RFC 7143 13.1: `X-` and a reversed domain name): the
/// initiator asks the target to pace what it sends on this connection (Data-In above all)
/// at most at the value, in bytes per second, as the initiator paces its own sends.
///
/// - Sent by the initiator only, in the operational stage of every connection's login
///   (leading and non-leading: each connection has its own share of the rate), only in a
///   normal session and only when it has a rate. `0` asks for no pacing.
/// - A target that knows the key answers with the rate it paces the connection at after
///   the login, in bytes per second, `0` for none: the hint clamped to
///   [`PACING_HINT_MIN`]..=[`PACING_HINT_MAX`]; its own configured rate instead, which
///   wins; `0` when it is configured to ignore hints. A value that is no number is
///   answered `Reject`, the key in a discovery session `Irrelevant`.
/// - In full feature phase the initiator may send the key again, alone in a Text request
///   (immediate, on the connection it is about), when its rate control has found the
///   bottleneck and the connection's share of it changes; the target answers and paces
///   as at login, from then on.
/// - A target that does not know it (tgt, LIO) answers `NotUnderstood` (RFC 7143 6.2).
///   None of these answers fails a login: the initiator records them and goes on.
pub const PACING_RATE_KEY: &str = "X-org.reservoir.PacingRate";
/// `X-org.reservoir.StartRate`, Reservoir's private key (RFC 7143 13.5.4 `X-` form): the
/// initiator tells the target the rate, in bytes per second, at which this connection's
/// sends may start (a rate the initiator remembers for the path, `net::paths`), so that the
/// target's first Data-In does not start from ten packets. A start only: after it the
/// target's congestion control runs as before (with Reservoir's `rsv`, until BBR leaves
/// STARTUP; other congestion controls ignore it).
///
/// - Sent by the initiator only, in the operational stage of a connection's login in a
///   normal session, when it has such a rate and sends no [`PACING_RATE_KEY`] (a pacing
///   rate is also a start).
/// - A target that knows the key answers the start it applies: the value clamped to
///   [`PACING_HINT_MIN`]..=[`PACING_HINT_MAX`]; `0` when it takes no hints or paces at a
///   configured rate (which is its start); `Reject` for a value that is no number;
///   `Irrelevant` in a discovery session. A target that does not know it answers
///   `NotUnderstood`. No answer fails a login.
pub const START_RATE_KEY: &str = "X-org.reservoir.StartRate";
/// `X-org.reservoir.ProbeRate`, Reservoir's private key (RFC 7143 13.5.4 `X-` form): with a
/// [`START_RATE_KEY`] for a path whose rate neither side knows, the rate in bytes per
/// second at which the target may send the start's first round (the start rate x RTT) so
/// that its ACKs come back spaced at the bottleneck's rate, which then becomes the start
/// (Reservoir's `rsv` congestion control: the probed start, `docs/congestion.md`).
///
/// - Sent by the initiator only beside a [`START_RATE_KEY`] it sends, in the operational
///   stage of a connection's login in a normal session.
/// - A target that knows the key answers the probe it applies, by the rules of
///   [`START_RATE_KEY`] (clamped to [`PACING_HINT_MIN`]..=[`PACING_HINT_MAX`]; `0` when it
///   takes no hints or paces at a configured rate; `Reject` for a value that is no number;
///   `Irrelevant` in a discovery session), and applies it only with the start. A target
///   that does not know it answers `NotUnderstood` and starts at the start rate alone. No
///   answer fails a login.
pub const PROBE_RATE_KEY: &str = "X-org.reservoir.ProbeRate";
/// Smallest rate a target applies from a hint (1 Mbit/s): slower would stall commands.
pub const PACING_HINT_MIN: u64 = 125_000;
/// Largest rate a target applies from a hint (400 Gbit/s): beyond, pacing means nothing.
pub const PACING_HINT_MAX: u64 = 50_000_000_000;

/// What a target does with [`PACING_RATE_KEY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacingPolicy {
    /// Pace a connection at the rate its initiator asks for.
    pub accept_hint: bool,
    /// The target's own rate for every connection (bytes per second); wins over a hint.
    pub configured: Option<u64>,
}

/// How [`PACING_RATE_KEY`] went on one connection's login, on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetPacing {
    /// The key was not exchanged.
    #[default]
    NotAsked,
    /// The target paces this connection's sends at most at this many bytes per second.
    Paced(u64),
    /// The target answered 0: it does not pace this connection.
    NotPaced,
    /// The target does not know the key: not paced by the target.
    NotUnderstood,
    /// Reject, Irrelevant, or an answer that is no number: not paced by the target.
    Refused,
}

impl TargetPacing {
    /// The rate in force, if the target paces.
    pub fn rate(self) -> Option<u64> {
        match self {
            TargetPacing::Paced(r) => Some(r),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TargetPacing::NotAsked => "not asked",
            TargetPacing::Paced(_) => "paced",
            TargetPacing::NotPaced => "not paced",
            TargetPacing::NotUnderstood => "not understood",
            TargetPacing::Refused => "refused",
        }
    }
}

/// The target's answer to `X-org.reservoir.PacingRate=offered` and what it then does.
/// Pure; the context (sender, phase, session type) is checked by the caller.
pub fn answer_pacing_hint(offered: &str, policy: &PacingPolicy) -> (Answer, TargetPacing) {
    let Ok(hint) = parse_number(offered) else {
        return (Answer::Reject, TargetPacing::Refused);
    };
    if let Some(r) = policy.configured.filter(|r| *r > 0) {
        return (Answer::Value(r.to_string()), TargetPacing::Paced(r));
    }
    if !policy.accept_hint || hint == 0 {
        return (Answer::Value("0".into()), TargetPacing::NotPaced);
    }
    let r = hint.clamp(PACING_HINT_MIN, PACING_HINT_MAX);
    (Answer::Value(r.to_string()), TargetPacing::Paced(r))
}

/// The target's answer to a [`START_RATE_KEY`] of `offered`, by `policy`, and the start
/// it applies (`None`: none).
pub fn answer_start_hint(offered: &str, policy: &PacingPolicy) -> (Answer, Option<u64>) {
    let Ok(hint) = parse_number(offered) else {
        return (Answer::Reject, None);
    };
    if policy.configured.is_some_and(|r| r > 0) || !policy.accept_hint || hint == 0 {
        return (Answer::Value("0".into()), None);
    }
    let r = hint.clamp(PACING_HINT_MIN, PACING_HINT_MAX);
    (Answer::Value(r.to_string()), Some(r))
}

/// The initiator's reading of the target's answer to [`PACING_RATE_KEY`]. Never an error:
/// whatever the target says, the login goes on.
pub fn pacing_from_answer(answer: &str) -> TargetPacing {
    match answer {
        NOT_UNDERSTOOD => TargetPacing::NotUnderstood,
        REJECT | IRRELEVANT => TargetPacing::Refused,
        v => match parse_number(v) {
            Ok(0) => TargetPacing::NotPaced,
            Ok(n) => TargetPacing::Paced(n),
            Err(_) => TargetPacing::Refused,
        },
    }
}

/// Session-wide operational parameters. As a configuration these are our preferences and
/// limits; as a negotiation result, the values in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionParams {
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
    pub iscsi_protocol_level: u8,
    pub task_reporting: TaskReporting,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            iscsi_protocol_level: 1,
            task_reporting: TaskReporting::Rfc3720,
        }
    }
}

/// Per-connection parameters. As a preference, `header_digest`/`data_digest` mean "we
/// accept (or offer) CRC32C"; as a result, "CRC32C is in use".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionParams {
    pub header_digest: bool,
    pub data_digest: bool,
    /// What we receive, as we declared it.
    pub max_recv_data_segment_length: u32,
    /// What the peer declared it receives: the most we may send in one PDU.
    pub max_send_data_segment_length: u32,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 8192,
            max_send_data_segment_length: 8192,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NegotiationError {
    /// RFC 7143 6.1: a parameter declared or negotiated twice in one login; the target
    /// answers with a Login reject (initiator error), the initiator drops the connection.
    #[error("key {0} negotiated more than once")]
    Duplicate(String),
    #[error("answer {key}={value} is not a valid result of our offer {offered:?}")]
    InvalidAnswer {
        key: String,
        value: String,
        offered: String,
    },
    #[error("answer to {0} that we never offered")]
    Unsolicited(String),
}

/// What the negotiation is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NegotiationContext {
    pub session_type: SessionType,
    /// True on the leading connection of a session (TSIH 0 in the login request).
    pub leading: bool,
    pub phase: Phase,
    /// Which side we are: decides which keys the peer may send.
    pub we_are_target: bool,
}

/// The answer to one offered key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Send this value back.
    Value(String),
    /// A declaration: recorded, no answer.
    Declared,
    NotUnderstood,
    Irrelevant,
    Reject,
}

impl Answer {
    /// The value as it goes on the wire; `None` for a declaration (no answer).
    pub fn wire(&self) -> Option<&str> {
        match self {
            Answer::Value(v) => Some(v),
            Answer::Declared => None,
            Answer::NotUnderstood => Some(NOT_UNDERSTOOD),
            Answer::Irrelevant => Some(IRRELEVANT),
            Answer::Reject => Some(REJECT),
        }
    }
}

/// List rule: the first value offered that we also support.
pub fn select_from_list<'a>(offered: &'a str, ours: &[&str]) -> Option<&'a str> {
    offered.split(',').find(|v| ours.contains(v))
}

/// Numerical rule: the minimum or maximum of the two values.
pub fn select_numerical(kind: KeyKind, offered: u64, ours: u64) -> u64 {
    match kind {
        KeyKind::NumericalMax => offered.max(ours),
        _ => offered.min(ours),
    }
}

/// Boolean rule: AND or OR of the two values.
pub fn select_boolean(kind: KeyKind, offered: bool, ours: bool) -> bool {
    match kind {
        KeyKind::BooleanOr => offered || ours,
        _ => offered && ours,
    }
}

fn digest_values(accept_crc: bool) -> &'static [&'static str] {
    if accept_crc {
        DIGESTS
    } else {
        &["None"]
    }
}

fn task_reporting_values(pref: TaskReporting) -> Vec<&'static str> {
    [
        TaskReporting::FastAbort,
        TaskReporting::ResponseFence,
        TaskReporting::Rfc3720,
    ]
    .into_iter()
    .filter(|t| *t <= pref)
    .map(TaskReporting::as_str)
    .collect()
}

/// Our own value for a numerical or boolean key, as a number (booleans as 0/1).
fn our_value(name: &str, s: &SessionParams) -> Option<u64> {
    Some(match name {
        "MaxConnections" => s.max_connections as u64,
        "MaxBurstLength" => s.max_burst_length as u64,
        "FirstBurstLength" => s.first_burst_length as u64,
        "DefaultTime2Wait" => s.default_time2wait as u64,
        "DefaultTime2Retain" => s.default_time2retain as u64,
        "MaxOutstandingR2T" => s.max_outstanding_r2t as u64,
        "ErrorRecoveryLevel" => s.error_recovery_level as u64,
        "iSCSIProtocolLevel" => s.iscsi_protocol_level as u64,
        "InitialR2T" => s.initial_r2t as u64,
        "ImmediateData" => s.immediate_data as u64,
        "DataPDUInOrder" => s.data_pdu_in_order as u64,
        "DataSequenceInOrder" => s.data_sequence_in_order as u64,
        _ => return None,
    })
}

/// Stores a negotiated result. Values were range-checked against the table, so the
/// narrowing casts cannot truncate.
fn apply(name: &str, value: &str, s: &mut SessionParams, c: &mut ConnectionParams) {
    let n = || parse_number(value).unwrap_or(0);
    let b = || parse_bool(value).unwrap_or(false);
    match name {
        "HeaderDigest" => c.header_digest = value == "CRC32C",
        "DataDigest" => c.data_digest = value == "CRC32C",
        "MaxConnections" => s.max_connections = n() as u16,
        "MaxBurstLength" => s.max_burst_length = n() as u32,
        "FirstBurstLength" => s.first_burst_length = n() as u32,
        "DefaultTime2Wait" => s.default_time2wait = n() as u16,
        "DefaultTime2Retain" => s.default_time2retain = n() as u16,
        "MaxOutstandingR2T" => s.max_outstanding_r2t = n() as u16,
        "ErrorRecoveryLevel" => s.error_recovery_level = n() as u8,
        "iSCSIProtocolLevel" => s.iscsi_protocol_level = n() as u8,
        "InitialR2T" => s.initial_r2t = b(),
        "ImmediateData" => s.immediate_data = b(),
        "DataPDUInOrder" => s.data_pdu_in_order = b(),
        "DataSequenceInOrder" => s.data_sequence_in_order = b(),
        "TaskReporting" => {
            s.task_reporting = TaskReporting::parse(value).unwrap_or_default();
        }
        _ => {}
    }
}

fn in_range(def: &KeyDef, value: &str) -> Option<u64> {
    let v = parse_number(value).ok()?;
    let (lo, hi) = def.range?;
    (lo..=hi).contains(&v).then_some(v)
}

/// Whether a key may be used in this context; `None` if it may, else the answer to give.
fn relevance(def: &KeyDef, ctx: &NegotiationContext) -> Option<Answer> {
    let from_peer_ok = match def.sender {
        Sender::Both => true,
        Sender::Initiator => ctx.we_are_target,
        Sender::Target => !ctx.we_are_target,
    };
    let phase_ok = match def.usage {
        Usage::Security => ctx.phase == Phase::Security,
        Usage::LeadingOnly => ctx.phase != Phase::FullFeature && ctx.leading,
        Usage::InitializeOnly => ctx.phase != Phase::FullFeature,
        Usage::All | Usage::Obsolete => true,
        Usage::FullFeatureOnly => ctx.phase == Phase::FullFeature,
    };
    let discovery_ok = !(def.irrelevant_in_discovery && ctx.session_type == SessionType::Discovery);
    if from_peer_ok && phase_ok && discovery_ok {
        None
    } else {
        Some(Answer::Irrelevant)
    }
}

/// The RFC answer to one offered key, given our preferences. Pure: records nothing.
/// Declarative and security keys answer `Declared`; the caller interprets them.
pub fn respond_key(
    name: &str,
    offered: &str,
    ctx: &NegotiationContext,
    session_prefs: &SessionParams,
    conn_prefs: &ConnectionParams,
) -> Answer {
    let Some(def) = lookup(name) else {
        return Answer::NotUnderstood;
    };
    if let Some(answer) = relevance(def, ctx) {
        return answer;
    }
    match def.usage {
        // RFC 7143 13: markers are gone; "No" keeps RFC 3720 peers happy, and with markers
        // off their intervals are irrelevant.
        Usage::Obsolete => {
            return match def.kind {
                KeyKind::BooleanAnd => Answer::Value("No".into()),
                _ => Answer::Irrelevant,
            }
        }
        Usage::Security => return Answer::Declared,
        _ => {}
    }
    match def.kind {
        KeyKind::List => {
            let ours: Vec<&str> = match name {
                "HeaderDigest" => digest_values(conn_prefs.header_digest).to_vec(),
                "DataDigest" => digest_values(conn_prefs.data_digest).to_vec(),
                "TaskReporting" => task_reporting_values(session_prefs.task_reporting),
                _ => def.values.to_vec(),
            };
            match select_from_list(offered, &ours) {
                Some(v) => Answer::Value(v.to_owned()),
                None => Answer::Reject,
            }
        }
        KeyKind::NumericalMin | KeyKind::NumericalMax => {
            let Some(v) = in_range(def, offered) else {
                return Answer::Reject;
            };
            let ours = our_value(name, session_prefs).unwrap_or(v);
            Answer::Value(select_numerical(def.kind, v, ours).to_string())
        }
        KeyKind::BooleanAnd | KeyKind::BooleanOr => {
            let Some(v) = parse_bool(offered) else {
                return Answer::Reject;
            };
            let ours = our_value(name, session_prefs).unwrap_or(0) != 0;
            Answer::Value(encode_bool(select_boolean(def.kind, v, ours)).to_owned())
        }
        KeyKind::Declarative => {
            if def.range.is_some() && in_range(def, offered).is_none() {
                return Answer::Reject;
            }
            if !def.values.is_empty() && !def.values.contains(&offered) {
                return Answer::Reject;
            }
            Answer::Declared
        }
    }
}

/// Remembers which keys were used in this login so that a repeat is caught (RFC 7143 6.1).
/// Re-declaring a declarative key with the same value is tolerated: some initiators send
/// their names again when they move to the operational stage.
#[derive(Debug, Clone, Default)]
pub struct KeyLedger {
    seen: HashMap<String, String>,
}

impl KeyLedger {
    /// Records `key`; `Ok(false)` when it is a harmless identical re-declaration.
    pub fn record(&mut self, key: &str, value: &str) -> Result<bool, NegotiationError> {
        if key == "TargetAddress" {
            return Ok(true);
        }
        match self.seen.get(key) {
            None => {
                self.seen.insert(key.to_owned(), value.to_owned());
                Ok(true)
            }
            Some(prev)
                if prev == value
                    && lookup(key).is_some_and(|d| {
                        d.kind == KeyKind::Declarative && d.usage != Usage::Security
                    }) =>
            {
                Ok(false)
            }
            Some(_) => Err(NegotiationError::Duplicate(key.to_owned())),
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.seen.contains_key(key)
    }
}

/// Responder side of operational negotiation: answers the peer's offers and keeps the
/// results.
#[derive(Debug, Clone)]
pub struct Responder {
    pub ctx: NegotiationContext,
    session_prefs: SessionParams,
    conn_prefs: ConnectionParams,
    /// Results so far, starting from the RFC defaults (or the fixed values of the session
    /// a non-leading connection joins).
    pub session: SessionParams,
    pub connection: ConnectionParams,
    ledger: KeyLedger,
    /// Header and data digests without which the connection is refused.
    required_digests: (bool, bool),
    /// `None`: [`PACING_RATE_KEY`] is not understood, as by a target without it.
    pacing_policy: Option<PacingPolicy>,
    /// What the answer to [`PACING_RATE_KEY`] promised.
    pub pacing: TargetPacing,
    /// The start the answer to [`START_RATE_KEY`] promised, bytes per second.
    pub start: Option<u64>,
    /// The probe rate the answer to [`PROBE_RATE_KEY`] promised, bytes per second.
    pub probe: Option<u64>,
}

impl Responder {
    pub fn new(
        ctx: NegotiationContext,
        session_prefs: SessionParams,
        conn_prefs: ConnectionParams,
        existing_session: Option<SessionParams>,
    ) -> Self {
        let connection = ConnectionParams {
            max_recv_data_segment_length: conn_prefs.max_recv_data_segment_length,
            ..ConnectionParams::default()
        };
        Responder {
            ctx,
            session_prefs,
            conn_prefs,
            session: existing_session.unwrap_or_default(),
            connection,
            ledger: KeyLedger::default(),
            required_digests: (false, false),
            pacing_policy: None,
            pacing: TargetPacing::NotAsked,
            start: None,
            probe: None,
        }
    }

    /// Understands [`PACING_RATE_KEY`], [`START_RATE_KEY`] and [`PROBE_RATE_KEY`] and
    /// answers them by `policy`.
    pub fn pacing(mut self, policy: Option<PacingPolicy>) -> Self {
        self.pacing_policy = policy;
        self
    }

    /// The policy for Reservoir's hint keys in this login, or the answer when there is
    /// none: `NotUnderstood` without a policy, `Irrelevant` outside a normal session's
    /// login on the target side.
    fn hint_policy(&self) -> Result<PacingPolicy, Answer> {
        let policy = self.pacing_policy.ok_or(Answer::NotUnderstood)?;
        let relevant = self.ctx.we_are_target
            && self.ctx.phase != Phase::FullFeature
            && self.ctx.session_type == SessionType::Normal;
        if relevant {
            Ok(policy)
        } else {
            Err(Answer::Irrelevant)
        }
    }

    fn answer_pacing(&mut self, offered: &str) -> Answer {
        match self.hint_policy() {
            Ok(policy) => {
                let (answer, pacing) = answer_pacing_hint(offered, &policy);
                self.pacing = pacing;
                answer
            }
            Err(answer) => answer,
        }
    }

    fn answer_start(&mut self, offered: &str) -> Answer {
        match self.hint_policy() {
            Ok(policy) => {
                let (answer, start) = answer_start_hint(offered, &policy);
                self.start = start;
                answer
            }
            Err(answer) => answer,
        }
    }

    /// The probe rate is answered by the start's rules; it is applied only with a start.
    fn answer_probe(&mut self, offered: &str) -> Answer {
        match self.hint_policy() {
            Ok(policy) => {
                let (answer, probe) = answer_start_hint(offered, &policy);
                self.probe = probe;
                answer
            }
            Err(answer) => answer,
        }
    }

    /// Accepts only CRC32C for the header and/or data digest: an initiator offering
    /// "None,CRC32C" gets CRC32C, one offering only None a Reject.
    pub fn require_digests(mut self, header: bool, data: bool) -> Self {
        self.required_digests = (header, data);
        self
    }

    /// Answers every key of one complete (continuation-joined) text. Keys handled by the
    /// caller (identity and security keys) must be removed first or are answered as
    /// declarations. Errors mean the login must fail with an initiator error.
    pub fn respond(&mut self, offer: &TextKeys) -> Result<TextKeys, NegotiationError> {
        let mut out = TextKeys::new();
        let mut answers: Vec<(String, Answer)> = Vec::new();
        for (k, v) in offer.iter() {
            if !self.ledger.record(k, v)? {
                continue;
            }
            let mut answer = if k == PACING_RATE_KEY {
                self.answer_pacing(v)
            } else if k == START_RATE_KEY {
                self.answer_start(v)
            } else if k == PROBE_RATE_KEY {
                self.answer_probe(v)
            } else {
                respond_key(k, v, &self.ctx, &self.session_prefs, &self.conn_prefs)
            };
            let required = match k {
                "HeaderDigest" => self.required_digests.0,
                "DataDigest" => self.required_digests.1,
                _ => false,
            };
            if required && matches!(answer, Answer::Value(_)) {
                answer = match select_from_list(v, &["CRC32C"]) {
                    Some(d) => Answer::Value(d.to_owned()),
                    None => Answer::Reject,
                };
            }
            if k == "MaxRecvDataSegmentLength" && answer == Answer::Declared {
                // Range-checked by respond_key.
                self.connection.max_send_data_segment_length =
                    parse_number(v).unwrap_or(8192) as u32;
            }
            answers.push((k.to_owned(), answer));
        }
        // FirstBurstLength must not exceed MaxBurstLength (RFC 7143 13.14), whichever order
        // the two arrived in.
        let mut max_burst = self.session.max_burst_length as u64;
        for (k, a) in &answers {
            if let (true, Answer::Value(v)) = (k == "MaxBurstLength", a) {
                max_burst = parse_number(v).unwrap_or(max_burst);
            }
        }
        for (k, a) in answers.iter_mut() {
            if k == "FirstBurstLength" {
                if let Answer::Value(v) = a {
                    let fb = parse_number(v).unwrap_or(0).min(max_burst);
                    *v = fb.to_string();
                }
            }
        }
        for (k, a) in answers {
            if let Answer::Value(v) = &a {
                apply(&k, v, &mut self.session, &mut self.connection);
            }
            if let Some(w) = a.wire() {
                out.push(k, w);
            }
        }
        Ok(out)
    }

    /// Keys we declare on our own: our MaxRecvDataSegmentLength.
    pub fn declarations(&self) -> TextKeys {
        let mut out = TextKeys::new();
        out.push(
            "MaxRecvDataSegmentLength",
            self.conn_prefs.max_recv_data_segment_length.to_string(),
        );
        out
    }
}

/// Originator side: builds our offer and validates the answers.
#[derive(Debug, Clone)]
pub struct Originator {
    pub ctx: NegotiationContext,
    session_prefs: SessionParams,
    conn_prefs: ConnectionParams,
    pub session: SessionParams,
    pub connection: ConnectionParams,
    /// Offers still waiting for an answer.
    outstanding: Vec<(String, String)>,
    ledger: KeyLedger,
    /// Bytes per second to ask the target to pace this connection at.
    pacing_hint: Option<u64>,
    /// How the target answered [`PACING_RATE_KEY`].
    pub pacing: TargetPacing,
    /// Bytes per second at which to tell the target this connection may start.
    start_hint: Option<u64>,
    /// The start the target said it applies ([`START_RATE_KEY`]); `None`: none, or the key
    /// not understood.
    pub start: Option<u64>,
    /// Bytes per second at which to tell the target the start's first round may be sent.
    probe_hint: Option<u64>,
    /// The probe rate the target said it applies ([`PROBE_RATE_KEY`]); `None`: none, or the
    /// key not understood.
    pub probe: Option<u64>,
}

impl Originator {
    pub fn new(
        ctx: NegotiationContext,
        session_prefs: SessionParams,
        conn_prefs: ConnectionParams,
        existing_session: Option<SessionParams>,
    ) -> Self {
        let connection = ConnectionParams {
            max_recv_data_segment_length: conn_prefs.max_recv_data_segment_length,
            ..ConnectionParams::default()
        };
        Originator {
            ctx,
            session_prefs,
            conn_prefs,
            session: existing_session.unwrap_or_default(),
            connection,
            outstanding: Vec::new(),
            ledger: KeyLedger::default(),
            pacing_hint: None,
            pacing: TargetPacing::NotAsked,
            start_hint: None,
            start: None,
            probe_hint: None,
            probe: None,
        }
    }

    /// With a start hint, tells the target that the start's first round may be sent at
    /// `rate` bytes per second ([`PROBE_RATE_KEY`]); `None` sends no key.
    pub fn probe_hint(mut self, rate: Option<u64>) -> Self {
        self.probe_hint = rate;
        self
    }

    /// Tells the target that this connection may start at `rate` bytes per second
    /// ([`START_RATE_KEY`]), unless a pacing hint goes (which is also the start); `None`
    /// sends no key.
    pub fn start_hint(mut self, rate: Option<u64>) -> Self {
        self.start_hint = rate;
        self
    }

    /// Asks the target to pace this connection at `rate` bytes per second
    /// ([`PACING_RATE_KEY`]); `None` sends no key.
    pub fn pacing_hint(mut self, rate: Option<u64>) -> Self {
        self.pacing_hint = rate;
        self
    }

    /// Our offer: digests and our MaxRecvDataSegmentLength always; the session keys on the
    /// leading connection of a normal session.
    pub fn offer(&mut self) -> TextKeys {
        let s = &self.session_prefs;
        let c = &self.conn_prefs;
        let mut keys = TextKeys::new();
        keys.push("HeaderDigest", digest_values(c.header_digest).join(","));
        keys.push("DataDigest", digest_values(c.data_digest).join(","));
        keys.push(
            "MaxRecvDataSegmentLength",
            c.max_recv_data_segment_length.to_string(),
        );
        if self.ctx.leading && self.ctx.session_type == SessionType::Normal {
            keys.push("MaxConnections", s.max_connections.to_string());
            keys.push("InitialR2T", encode_bool(s.initial_r2t));
            keys.push("ImmediateData", encode_bool(s.immediate_data));
            keys.push("MaxBurstLength", s.max_burst_length.to_string());
            keys.push(
                "FirstBurstLength",
                s.first_burst_length.min(s.max_burst_length).to_string(),
            );
            keys.push("DefaultTime2Wait", s.default_time2wait.to_string());
            keys.push("DefaultTime2Retain", s.default_time2retain.to_string());
            keys.push("MaxOutstandingR2T", s.max_outstanding_r2t.to_string());
            keys.push("DataPDUInOrder", encode_bool(s.data_pdu_in_order));
            keys.push("DataSequenceInOrder", encode_bool(s.data_sequence_in_order));
            keys.push("ErrorRecoveryLevel", s.error_recovery_level.to_string());
        }
        if self.ctx.session_type == SessionType::Normal {
            match (self.pacing_hint, self.start_hint) {
                (Some(rate), _) => keys.push(PACING_RATE_KEY, rate.to_string()),
                (None, Some(rate)) if rate > 0 => {
                    keys.push(START_RATE_KEY, rate.to_string());
                    if let Some(probe) = self.probe_hint.filter(|&p| p > 0) {
                        keys.push(PROBE_RATE_KEY, probe.to_string());
                    }
                }
                _ => {}
            }
        }
        for (k, v) in keys.iter() {
            // Our own declaration needs no answer; the peer declares its own value.
            if k != "MaxRecvDataSegmentLength" {
                self.outstanding.push((k.to_owned(), v.to_owned()));
            }
        }
        keys
    }

    /// True while some offer has not been answered.
    pub fn awaiting_answers(&self) -> bool {
        !self.outstanding.is_empty()
    }

    /// Processes the peer's text: answers to our offers are checked and applied, its own
    /// offers are answered (returned, to be sent in our next PDU), its declarations
    /// recorded. Keys the caller handles itself (names, aliases, TargetPortalGroupTag)
    /// should be removed first.
    pub fn on_response(&mut self, keys: &TextKeys) -> Result<TextKeys, NegotiationError> {
        let mut reply = TextKeys::new();
        for (k, v) in keys.iter() {
            if let Some(pos) = self.outstanding.iter().position(|(ok, _)| ok == k) {
                let (_, offered) = self.outstanding.remove(pos);
                self.check_answer(k, &offered, v)?;
                continue;
            }
            if !self.ledger.record(k, v)? {
                continue;
            }
            if k == "MaxRecvDataSegmentLength" {
                match lookup(k).and_then(|d| in_range(d, v)) {
                    Some(n) => self.connection.max_send_data_segment_length = n as u32,
                    None => reply.push(k, REJECT),
                }
                continue;
            }
            let answer = respond_key(k, v, &self.ctx, &self.session_prefs, &self.conn_prefs);
            if let Answer::Value(val) = &answer {
                apply(k, val, &mut self.session, &mut self.connection);
            }
            if let Some(w) = answer.wire() {
                reply.push(k, w);
            }
        }
        Ok(reply)
    }

    fn check_answer(
        &mut self,
        key: &str,
        offered: &str,
        answer: &str,
    ) -> Result<(), NegotiationError> {
        let invalid = || NegotiationError::InvalidAnswer {
            key: key.to_owned(),
            value: answer.to_owned(),
            offered: offered.to_owned(),
        };
        if key == PACING_RATE_KEY {
            self.pacing = pacing_from_answer(answer);
            return Ok(());
        }
        if key == START_RATE_KEY {
            self.start = parse_number(answer).ok().filter(|&r| r > 0);
            return Ok(());
        }
        if key == PROBE_RATE_KEY {
            self.probe = parse_number(answer).ok().filter(|&r| r > 0);
            return Ok(());
        }
        // Keys the peer could not or would not take keep their defaults.
        if matches!(answer, NOT_UNDERSTOOD | IRRELEVANT | REJECT) {
            return Ok(());
        }
        let def = lookup(key).ok_or_else(invalid)?;
        let ok = match def.kind {
            KeyKind::List => offered.split(',').any(|o| o == answer),
            KeyKind::NumericalMin | KeyKind::NumericalMax => {
                match (in_range(def, answer), parse_number(offered)) {
                    (Some(a), Ok(o)) => {
                        if def.kind == KeyKind::NumericalMin {
                            a <= o
                        } else {
                            a >= o
                        }
                    }
                    _ => false,
                }
            }
            KeyKind::BooleanAnd | KeyKind::BooleanOr => {
                match (parse_bool(answer), parse_bool(offered)) {
                    (Some(a), Some(o)) => select_boolean(def.kind, o, a) == a,
                    _ => false,
                }
            }
            KeyKind::Declarative => true,
        };
        if !ok {
            return Err(invalid());
        }
        apply(key, answer, &mut self.session, &mut self.connection);
        Ok(())
    }

    /// Offers nobody answered keep the RFC defaults (RFC 7143 6.2.1: a key not answered is
    /// not negotiated). Call when the peer transits to the next stage.
    pub fn finish(&mut self) {
        // A target that let the pacing key pass without an answer did not understand it.
        if self.outstanding.iter().any(|(k, _)| k == PACING_RATE_KEY) {
            self.pacing = TargetPacing::NotUnderstood;
        }
        self.outstanding.clear();
        if self.session.first_burst_length > self.session.max_burst_length {
            self.session.first_burst_length = self.session.max_burst_length;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(session_type: SessionType, leading: bool) -> NegotiationContext {
        NegotiationContext {
            session_type,
            leading,
            phase: Phase::Operational,
            we_are_target: true,
        }
    }

    fn answer(name: &str, offered: &str) -> Answer {
        respond_key(
            name,
            offered,
            &ctx(SessionType::Normal, true),
            &SessionParams::default(),
            &ConnectionParams::default(),
        )
    }

    #[test]
    fn table_has_every_key_once() {
        for k in KEYS {
            assert_eq!(
                KEYS.iter().filter(|o| o.name == k.name).count(),
                1,
                "{}",
                k.name
            );
        }
        assert_eq!(KEYS.len(), 34);
        assert!(lookup("X-com.example.foo").is_none());
    }

    #[test]
    fn rfc_defaults() {
        let s = SessionParams::default();
        assert_eq!(s.max_burst_length, 262144);
        assert_eq!(s.first_burst_length, 65536);
        assert!(s.initial_r2t && s.immediate_data);
        assert_eq!(s.max_outstanding_r2t, 1);
        let c = ConnectionParams::default();
        assert_eq!(c.max_recv_data_segment_length, 8192);
        assert_eq!(c.max_send_data_segment_length, 8192);
        assert!(!c.header_digest);
    }

    #[test]
    fn per_kind_answers() {
        assert_eq!(
            answer("MaxBurstLength", "1048576"),
            Answer::Value("262144".into())
        );
        assert_eq!(
            answer("MaxBurstLength", "4096"),
            Answer::Value("4096".into())
        );
        assert_eq!(answer("DefaultTime2Wait", "0"), Answer::Value("2".into()));
        assert_eq!(answer("InitialR2T", "No"), Answer::Value("Yes".into()));
        assert_eq!(answer("ImmediateData", "No"), Answer::Value("No".into()));
        assert_eq!(
            answer("HeaderDigest", "CRC32C,None"),
            Answer::Value("None".into())
        );
        assert_eq!(answer("HeaderDigest", "CRC32C"), Answer::Reject);
        assert_eq!(
            answer("MaxRecvDataSegmentLength", "65536"),
            Answer::Declared
        );
    }

    #[test]
    fn malformed_and_out_of_range_values_are_rejected() {
        assert_eq!(answer("MaxBurstLength", "511"), Answer::Reject);
        assert_eq!(answer("MaxBurstLength", "16777216"), Answer::Reject);
        assert_eq!(answer("MaxBurstLength", "lots"), Answer::Reject);
        assert_eq!(answer("ErrorRecoveryLevel", "3"), Answer::Reject);
        assert_eq!(answer("InitialR2T", "yes"), Answer::Reject);
        assert_eq!(answer("MaxRecvDataSegmentLength", "100"), Answer::Reject);
    }

    #[test]
    fn unknown_irrelevant_and_obsolete() {
        assert_eq!(answer("X-com.example.Foo", "1"), Answer::NotUnderstood);
        assert_eq!(answer("X#foo", "1"), Answer::NotUnderstood);
        assert_eq!(answer("Bogus", "1"), Answer::NotUnderstood);
        assert_eq!(answer("OFMarker", "Yes"), Answer::Value("No".into()));
        assert_eq!(answer("IFMarkInt", "2048~8192"), Answer::Irrelevant);
        assert_eq!(answer("TargetAlias", "x"), Answer::Irrelevant);
        assert_eq!(answer("SendTargets", "All"), Answer::Irrelevant);
        let d = ctx(SessionType::Discovery, true);
        let sp = SessionParams::default();
        let cp = ConnectionParams::default();
        assert_eq!(
            respond_key("MaxConnections", "4", &d, &sp, &cp),
            Answer::Irrelevant
        );
        assert_eq!(
            respond_key("InitialR2T", "No", &d, &sp, &cp),
            Answer::Irrelevant
        );
        assert_eq!(
            respond_key("HeaderDigest", "None", &d, &sp, &cp),
            Answer::Value("None".into())
        );
        let non_leading = ctx(SessionType::Normal, false);
        assert_eq!(
            respond_key("MaxBurstLength", "4096", &non_leading, &sp, &cp),
            Answer::Irrelevant
        );
    }

    #[test]
    fn responder_clamps_first_burst_and_records_results() {
        let prefs = SessionParams {
            max_burst_length: 1 << 20,
            first_burst_length: 1 << 20,
            ..SessionParams::default()
        };
        let mut r = Responder::new(
            ctx(SessionType::Normal, true),
            prefs,
            ConnectionParams::default(),
            None,
        );
        let mut offer = TextKeys::new();
        offer.push("FirstBurstLength", "262144");
        offer.push("MaxBurstLength", "131072");
        offer.push("MaxRecvDataSegmentLength", "262144");
        let out = r.respond(&offer).unwrap();
        assert_eq!(out.get("FirstBurstLength"), Some("131072"));
        assert_eq!(out.get("MaxBurstLength"), Some("131072"));
        assert_eq!(out.get("MaxRecvDataSegmentLength"), None);
        assert_eq!(r.session.first_burst_length, 131072);
        assert_eq!(r.connection.max_send_data_segment_length, 262144);
        assert_eq!(r.connection.max_recv_data_segment_length, 8192);
    }

    #[test]
    fn required_digests_take_crc32c_from_a_none_first_offer() {
        let accept = ConnectionParams {
            header_digest: true,
            data_digest: true,
            ..ConnectionParams::default()
        };
        let respond = |header: bool, data: bool, offer: &str| {
            let mut r = Responder::new(
                ctx(SessionType::Normal, true),
                SessionParams::default(),
                accept.clone(),
                None,
            )
            .require_digests(header, data);
            let mut keys = TextKeys::new();
            keys.push("HeaderDigest", offer);
            keys.push("DataDigest", offer);
            let out = r.respond(&keys).unwrap();
            (
                out.get("HeaderDigest").map(str::to_owned),
                out.get("DataDigest").map(str::to_owned),
                r.connection.header_digest,
                r.connection.data_digest,
            )
        };
        let none = Some("None".to_owned());
        let crc = Some("CRC32C".to_owned());
        let reject = Some("Reject".to_owned());
        assert_eq!(
            respond(false, false, "None,CRC32C"),
            (none.clone(), none.clone(), false, false)
        );
        assert_eq!(
            respond(true, false, "None,CRC32C"),
            (crc.clone(), none.clone(), true, false)
        );
        assert_eq!(
            respond(true, true, "None,CRC32C"),
            (crc.clone(), crc, true, true)
        );
        assert_eq!(respond(true, false, "None"), (reject, none, false, false));
    }

    #[test]
    fn duplicate_keys_are_an_error_but_identical_names_are_not() {
        let mut r = Responder::new(
            ctx(SessionType::Normal, true),
            SessionParams::default(),
            ConnectionParams::default(),
            None,
        );
        let mut a = TextKeys::new();
        a.push("MaxBurstLength", "4096");
        a.push("InitiatorAlias", "host");
        r.respond(&a).unwrap();
        let mut b = TextKeys::new();
        b.push("InitiatorAlias", "host");
        assert!(r.respond(&b).unwrap().is_empty());
        let mut c = TextKeys::new();
        c.push("MaxBurstLength", "4096");
        assert_eq!(
            r.respond(&c),
            Err(NegotiationError::Duplicate("MaxBurstLength".into()))
        );
    }

    #[test]
    fn originator_checks_answers() {
        let mk = || {
            let mut o = Originator::new(
                NegotiationContext {
                    we_are_target: false,
                    ..ctx(SessionType::Normal, true)
                },
                SessionParams {
                    immediate_data: false,
                    ..SessionParams::default()
                },
                ConnectionParams::default(),
                None,
            );
            o.offer();
            o
        };
        let answer = |k: &str, v: &str| {
            let mut keys = TextKeys::new();
            keys.push(k, v);
            mk().on_response(&keys)
        };
        assert!(answer("MaxBurstLength", "4096").is_ok());
        assert!(answer("MaxBurstLength", "1048576").is_err());
        assert!(answer("DefaultTime2Wait", "1").is_err());
        assert!(answer("DefaultTime2Wait", "5").is_ok());
        assert!(answer("ImmediateData", "Yes").is_err());
        assert!(answer("InitialR2T", "No").is_err());
        assert!(answer("HeaderDigest", "CRC32C").is_err());
        assert!(answer("HeaderDigest", "None").is_ok());
        assert!(answer("MaxBurstLength", "Reject").is_ok());
        // The target offers a key we did not: we answer it.
        let mut keys = TextKeys::new();
        keys.push("TaskReporting", "FastAbort,RFC3720");
        let reply = mk().on_response(&keys).unwrap();
        assert_eq!(reply.get("TaskReporting"), Some("RFC3720"));
        // Its MaxRecvDataSegmentLength limits what we send.
        let mut o = mk();
        let mut keys = TextKeys::new();
        keys.push("MaxRecvDataSegmentLength", "65536");
        o.on_response(&keys).unwrap();
        assert_eq!(o.connection.max_send_data_segment_length, 65536);
    }

    const ACCEPT: PacingPolicy = PacingPolicy {
        accept_hint: true,
        configured: None,
    };

    #[test]
    fn pacing_hint_answers() {
        let v = |s: &str| Answer::Value(s.into());
        assert_eq!(
            answer_pacing_hint("1640625", &ACCEPT),
            (v("1640625"), TargetPacing::Paced(1_640_625))
        );
        // Hex is a number too (RFC 7143 6.1).
        assert_eq!(
            answer_pacing_hint("0x100000", &ACCEPT),
            (v("1048576"), TargetPacing::Paced(1 << 20))
        );
        // Absurd values are clamped, and the answer says to what.
        assert_eq!(
            answer_pacing_hint("1", &ACCEPT),
            (
                v(&PACING_HINT_MIN.to_string()),
                TargetPacing::Paced(PACING_HINT_MIN)
            )
        );
        assert_eq!(
            answer_pacing_hint("18446744073709551615", &ACCEPT),
            (
                v(&PACING_HINT_MAX.to_string()),
                TargetPacing::Paced(PACING_HINT_MAX)
            )
        );
        // 0 asks for none.
        assert_eq!(
            answer_pacing_hint("0", &ACCEPT),
            (v("0"), TargetPacing::NotPaced)
        );
        // Malformed: Reject, nothing applied.
        for bad in ["", "-5", "fast", "18446744073709551616", "1e6", "0xZZ"] {
            assert_eq!(
                answer_pacing_hint(bad, &ACCEPT),
                (Answer::Reject, TargetPacing::Refused),
                "{bad:?}"
            );
        }
        // Hints off: the target says it does not pace.
        let off = PacingPolicy {
            accept_hint: false,
            configured: None,
        };
        assert_eq!(
            answer_pacing_hint("1640625", &off),
            (v("0"), TargetPacing::NotPaced)
        );
        // A configured rate wins over the hint, whatever the switch says.
        for accept_hint in [true, false] {
            let fixed = PacingPolicy {
                accept_hint,
                configured: Some(5_000_000),
            };
            assert_eq!(
                answer_pacing_hint("1640625", &fixed),
                (v("5000000"), TargetPacing::Paced(5_000_000))
            );
        }
    }

    #[test]
    fn start_hint_answers() {
        let accept = PacingPolicy {
            accept_hint: true,
            configured: None,
        };
        assert_eq!(
            answer_start_hint("12500000", &accept),
            (Answer::Value("12500000".into()), Some(12_500_000))
        );
        assert_eq!(
            answer_start_hint("1", &accept),
            (
                Answer::Value(PACING_HINT_MIN.to_string()),
                Some(PACING_HINT_MIN)
            )
        );
        assert_eq!(
            answer_start_hint("0", &accept),
            (Answer::Value("0".into()), None)
        );
        assert_eq!(answer_start_hint("fast", &accept), (Answer::Reject, None));
        for policy in [
            PacingPolicy {
                accept_hint: false,
                configured: None,
            },
            PacingPolicy {
                accept_hint: true,
                configured: Some(1_000_000),
            },
        ] {
            assert_eq!(
                answer_start_hint("12500000", &policy),
                (Answer::Value("0".into()), None),
                "{policy:?}"
            );
        }
    }

    #[test]
    fn start_hint_goes_alone_and_is_answered_where_known() {
        let ctx = |we_are_target, session_type| NegotiationContext {
            session_type,
            leading: true,
            phase: Phase::Operational,
            we_are_target,
        };
        let originator = |pacing: Option<u64>, start: Option<u64>, t| {
            Originator::new(
                ctx(false, t),
                SessionParams::default(),
                ConnectionParams::default(),
                None,
            )
            .pacing_hint(pacing)
            .start_hint(start)
        };
        let offer = originator(None, Some(12_500_000), SessionType::Normal).offer();
        assert_eq!(offer.get(START_RATE_KEY), Some("12500000"));
        // A pacing hint is the start too: the start key stays home.
        let both = originator(Some(1_000_000), Some(12_500_000), SessionType::Normal).offer();
        assert_eq!(both.get(START_RATE_KEY), None);
        assert_eq!(both.get(PACING_RATE_KEY), Some("1000000"));
        let disc = originator(None, Some(12_500_000), SessionType::Discovery).offer();
        assert_eq!(disc.get(START_RATE_KEY), None);

        let responder = |policy| {
            Responder::new(
                ctx(true, SessionType::Normal),
                SessionParams::default(),
                ConnectionParams::default(),
                None,
            )
            .pacing(policy)
        };
        let mut knows = responder(Some(PacingPolicy {
            accept_hint: true,
            configured: None,
        }));
        let answer = knows.respond(&offer).unwrap();
        assert_eq!(answer.get(START_RATE_KEY), Some("12500000"));
        assert_eq!(knows.start, Some(12_500_000));
        let mut o = originator(None, Some(12_500_000), SessionType::Normal);
        o.offer();
        assert!(o.on_response(&answer).unwrap().is_empty());
        assert_eq!(o.start, Some(12_500_000));

        let mut old = responder(None);
        let answer = old.respond(&offer).unwrap();
        assert_eq!(answer.get(START_RATE_KEY), Some("NotUnderstood"));
        assert_eq!(old.start, None);
        let mut o = originator(None, Some(12_500_000), SessionType::Normal);
        o.offer();
        assert!(o.on_response(&answer).unwrap().is_empty());
        o.finish();
        assert_eq!(o.start, None);
    }

    #[test]
    fn probe_hint_goes_only_beside_a_start_and_is_answered_where_known() {
        let ctx = |we_are_target, session_type| NegotiationContext {
            session_type,
            leading: true,
            phase: Phase::Operational,
            we_are_target,
        };
        let originator = |pacing: Option<u64>, start: Option<u64>, t| {
            Originator::new(
                ctx(false, t),
                SessionParams::default(),
                ConnectionParams::default(),
                None,
            )
            .pacing_hint(pacing)
            .start_hint(start)
            .probe_hint(Some(62_500_000))
        };
        let offer = originator(None, Some(1_250_000), SessionType::Normal).offer();
        assert_eq!(offer.get(START_RATE_KEY), Some("1250000"));
        assert_eq!(offer.get(PROBE_RATE_KEY), Some("62500000"));
        // No start, no probe: a pacing hint (a known rate) or nothing at all.
        let paced = originator(Some(1_000_000), Some(1_250_000), SessionType::Normal).offer();
        assert_eq!(paced.get(PROBE_RATE_KEY), None);
        assert_eq!(
            originator(None, None, SessionType::Normal)
                .offer()
                .get(PROBE_RATE_KEY),
            None
        );
        assert_eq!(
            originator(None, Some(1_250_000), SessionType::Discovery)
                .offer()
                .get(PROBE_RATE_KEY),
            None
        );

        let responder = |policy| {
            Responder::new(
                ctx(true, SessionType::Normal),
                SessionParams::default(),
                ConnectionParams::default(),
                None,
            )
            .pacing(policy)
        };
        let mut knows = responder(Some(PacingPolicy {
            accept_hint: true,
            configured: None,
        }));
        let answer = knows.respond(&offer).unwrap();
        assert_eq!(answer.get(PROBE_RATE_KEY), Some("62500000"));
        assert_eq!(
            (knows.start, knows.probe),
            (Some(1_250_000), Some(62_500_000))
        );
        let mut o = originator(None, Some(1_250_000), SessionType::Normal);
        o.offer();
        assert!(o.on_response(&answer).unwrap().is_empty());
        assert_eq!(o.probe, Some(62_500_000));

        // Hints off: neither applied.
        let mut off = responder(Some(PacingPolicy {
            accept_hint: false,
            configured: None,
        }));
        let answer = off.respond(&offer).unwrap();
        assert_eq!(answer.get(PROBE_RATE_KEY), Some("0"));
        assert_eq!((off.start, off.probe), (None, None));

        // A malformed probe is refused alone; the start still holds.
        let mut bad = TextKeys::new();
        bad.push(START_RATE_KEY, "1250000");
        bad.push(PROBE_RATE_KEY, "fast");
        let mut knows = responder(Some(PacingPolicy {
            accept_hint: true,
            configured: None,
        }));
        let answer = knows.respond(&bad).unwrap();
        assert_eq!(answer.get(PROBE_RATE_KEY), Some("Reject"));
        assert_eq!((knows.start, knows.probe), (Some(1_250_000), None));

        // A target without the key: NotUnderstood, and the initiator reads no probe.
        let mut old = responder(None);
        let answer = old.respond(&offer).unwrap();
        assert_eq!(answer.get(PROBE_RATE_KEY), Some("NotUnderstood"));
        let mut o = originator(None, Some(1_250_000), SessionType::Normal);
        o.offer();
        assert!(o.on_response(&answer).unwrap().is_empty());
        o.finish();
        assert_eq!(o.probe, None);
    }

    #[test]
    fn pacing_answers_as_the_initiator_reads_them() {
        assert_eq!(
            pacing_from_answer("1640625"),
            TargetPacing::Paced(1_640_625)
        );
        assert_eq!(pacing_from_answer("0"), TargetPacing::NotPaced);
        assert_eq!(
            pacing_from_answer("NotUnderstood"),
            TargetPacing::NotUnderstood
        );
        assert_eq!(pacing_from_answer("Reject"), TargetPacing::Refused);
        assert_eq!(pacing_from_answer("Irrelevant"), TargetPacing::Refused);
        assert_eq!(pacing_from_answer("lots"), TargetPacing::Refused);
        assert_eq!(pacing_from_answer(""), TargetPacing::Refused);
    }

    #[test]
    fn responder_answers_pacing_only_where_it_knows_the_key() {
        let offer = |r: &mut Responder, v: &str| {
            let mut keys = TextKeys::new();
            keys.push(PACING_RATE_KEY, v);
            r.respond(&keys)
        };
        let mk = |ctx: NegotiationContext, policy: Option<PacingPolicy>| {
            Responder::new(
                ctx,
                SessionParams::default(),
                ConnectionParams::default(),
                None,
            )
            .pacing(policy)
        };
        // Like tgt: not understood, nothing recorded.
        let mut r = mk(ctx(SessionType::Normal, true), None);
        let out = offer(&mut r, "1640625").unwrap();
        assert_eq!(out.get(PACING_RATE_KEY), Some("NotUnderstood"));
        assert_eq!(r.pacing, TargetPacing::NotAsked);
        // Reservoir: on leading and non-leading connections.
        for leading in [true, false] {
            let mut r = mk(ctx(SessionType::Normal, leading), Some(ACCEPT));
            let out = offer(&mut r, "1640625").unwrap();
            assert_eq!(out.get(PACING_RATE_KEY), Some("1640625"));
            assert_eq!(r.pacing, TargetPacing::Paced(1_640_625));
            // Twice in one login is a renegotiation (RFC 7143 6.1).
            assert!(offer(&mut r, "1640625").is_err());
        }
        let mut r = mk(ctx(SessionType::Normal, true), Some(ACCEPT));
        assert_eq!(
            offer(&mut r, "soon").unwrap().get(PACING_RATE_KEY),
            Some("Reject")
        );
        assert_eq!(r.pacing, TargetPacing::Refused);
        // Discovery and full feature phase: irrelevant.
        let mut r = mk(ctx(SessionType::Discovery, true), Some(ACCEPT));
        assert_eq!(
            offer(&mut r, "1640625").unwrap().get(PACING_RATE_KEY),
            Some("Irrelevant")
        );
        assert_eq!(r.pacing, TargetPacing::NotAsked);
        let ffp = NegotiationContext {
            phase: Phase::FullFeature,
            ..ctx(SessionType::Normal, true)
        };
        let mut r = mk(ffp, Some(ACCEPT));
        assert_eq!(
            offer(&mut r, "1640625").unwrap().get(PACING_RATE_KEY),
            Some("Irrelevant")
        );
        // An initiator does not answer a target that offers it.
        let mut r = mk(
            NegotiationContext {
                we_are_target: false,
                ..ctx(SessionType::Normal, true)
            },
            Some(ACCEPT),
        );
        assert_eq!(
            offer(&mut r, "1640625").unwrap().get(PACING_RATE_KEY),
            Some("Irrelevant")
        );
    }

    #[test]
    fn originator_offers_pacing_and_takes_any_answer() {
        let mk = |session_type, leading, hint| {
            let mut o = Originator::new(
                NegotiationContext {
                    we_are_target: false,
                    ..ctx(session_type, leading)
                },
                SessionParams::default(),
                ConnectionParams::default(),
                None,
            )
            .pacing_hint(hint);
            let offer = o.offer();
            (o, offer)
        };
        for leading in [true, false] {
            let (_, offer) = mk(SessionType::Normal, leading, Some(1_640_625));
            assert_eq!(offer.get(PACING_RATE_KEY), Some("1640625"));
        }
        assert_eq!(
            mk(SessionType::Normal, true, None).1.get(PACING_RATE_KEY),
            None
        );
        assert_eq!(
            mk(SessionType::Discovery, true, Some(1))
                .1
                .get(PACING_RATE_KEY),
            None
        );
        for (answer, want) in [
            ("1640625", TargetPacing::Paced(1_640_625)),
            ("0", TargetPacing::NotPaced),
            ("NotUnderstood", TargetPacing::NotUnderstood),
            ("Reject", TargetPacing::Refused),
            ("Irrelevant", TargetPacing::Refused),
            ("a lot", TargetPacing::Refused),
        ] {
            let (mut o, _) = mk(SessionType::Normal, true, Some(1_640_625));
            let mut keys = TextKeys::new();
            keys.push(PACING_RATE_KEY, answer);
            let reply = o.on_response(&keys).expect("no answer fails a login");
            assert!(reply.is_empty(), "{answer}: {reply:?}");
            o.finish();
            assert_eq!(o.pacing, want, "{answer}");
            assert_eq!(o.session, SessionParams::default());
        }
        // A target that lets it pass unanswered did not understand it.
        let (mut o, _) = mk(SessionType::Normal, true, Some(1_640_625));
        o.on_response(&TextKeys::new()).unwrap();
        o.finish();
        assert_eq!(o.pacing, TargetPacing::NotUnderstood);
    }
}
