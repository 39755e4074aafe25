//! What the target counts for `/metrics`: per LUN, its commands, bytes and latency by
//! kind of command, its CHECK CONDITIONs by sense key and its commands in flight
//! ([`LunStats`]); for the whole target, the events an operator wants alerts on
//! ([`Events`]: logins refused, task management, ERL 2 recoveries, limits reached).
//!
//! A LUN's counters are atomics in a [`LunStats`] made when its LU is opened (only with
//! `[metrics]`) and kept in its `LunStore`, which the command path holds already: counting
//! a command is a few relaxed atomic adds, no lookup by labels. The labels are put on at
//! scrape time by `crate::metrics`, from the targets in force, so the series of a LUN a
//! reload removed go with it. Events are rare: their families are looked up by label.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rsv_metrics::Histogram;
use scsi::opcodes as op;

/// The kind of a command, for its LUN's series (`op` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Reads of the medium: READ (6), (10), (12), (16).
    Read,
    /// Writes to the medium: WRITE (6)..(16), WRITE AND VERIFY, WRITE SAME, COMPARE AND
    /// WRITE, ORWRITE, WRITE ATOMIC.
    Write,
    /// SYNCHRONIZE CACHE (10), (16).
    Flush,
    /// Every other command (INQUIRY, TEST UNIT READY, UNMAP, VERIFY, reservations...).
    Other,
}

impl Op {
    pub(crate) const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Other];

    /// By operation code: what the command does to the medium, not which way its data
    /// goes (an INQUIRY sends data in, but reads no block).
    pub(crate) fn of(cdb: &[u8]) -> Op {
        match cdb.first() {
            Some(&(op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16)) => Op::Read,
            Some(
                &(op::WRITE_6
                | op::WRITE_10
                | op::WRITE_12
                | op::WRITE_16
                | op::WRITE_VERIFY_10
                | op::WRITE_VERIFY_12
                | op::WRITE_VERIFY_16
                | op::WRITE_SAME_10
                | op::WRITE_SAME_16
                | op::COMPARE_AND_WRITE
                | op::ORWRITE_16
                | op::WRITE_ATOMIC_16),
            ) => Op::Write,
            Some(&(op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16)) => Op::Flush,
            _ => Op::Other,
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Other => "other",
        }
    }

    /// Whether its commands move data (a flush moves none: no bytes series).
    pub(crate) fn moves_data(self) -> bool {
        self != Op::Flush
    }
}

/// Upper bounds of the latency buckets, in seconds: from a page-cache hit (tens of
/// microseconds) to a store across a long path (seconds).
pub(crate) const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// The sense keys (SPC-5 4.4.8) as label values, by key.
pub(crate) const SENSE_KEYS: [&str; 16] = [
    "no_sense",
    "recovered_error",
    "not_ready",
    "medium_error",
    "hardware_error",
    "illegal_request",
    "unit_attention",
    "data_protect",
    "blank_check",
    "vendor_specific",
    "copy_aborted",
    "aborted_command",
    "reserved_0c",
    "volume_overflow",
    "miscompare",
    "completed",
];

/// One kind of command on one LUN.
#[derive(Debug)]
pub(crate) struct OpStats {
    pub(crate) commands: Counter,
    /// Data-In sent and Data-Out received, as the command's transfer.
    pub(crate) bytes: Counter,
    /// From the command's start at the LU (its data all received) to its answer.
    pub(crate) latency: Histogram,
}

/// One LUN's counters.
#[derive(Debug)]
pub struct LunStats {
    ops: [OpStats; 4],
    pub(crate) in_flight: Gauge,
    /// By sense key.
    pub(crate) check_conditions: [Counter; 16],
}

impl Default for LunStats {
    fn default() -> Self {
        let op = || OpStats {
            commands: Counter::default(),
            bytes: Counter::default(),
            latency: Histogram::new(&LATENCY_BUCKETS),
        };
        LunStats {
            ops: [op(), op(), op(), op()],
            in_flight: Gauge::default(),
            check_conditions: Default::default(),
        }
    }
}

impl LunStats {
    pub(crate) fn op(&self, op: Op) -> &OpStats {
        &self.ops[op as usize]
    }

    /// A command starts at the LU.
    pub(crate) fn started(&self) {
        self.in_flight.inc();
    }

    /// A command that [`LunStats::started`] answered: its CDB, the bytes it moved, how
    /// long it took, its status and sense data.
    pub(crate) fn answered(
        &self,
        cdb: &[u8],
        bytes: u64,
        took: Duration,
        status: u8,
        sense: Option<&[u8]>,
    ) {
        let s = self.op(Op::of(cdb));
        s.commands.inc();
        if bytes > 0 {
            s.bytes.inc_by(bytes);
        }
        s.latency.observe(took);
        if status == scsi::status::CHECK_CONDITION {
            if let Some(key) = sense.and_then(scsi::Sense::parse).map(|s| s.key) {
                self.check_conditions[usize::from(key & 0x0f)].inc();
            }
        }
        self.in_flight.dec();
    }
}

/// Why a login was refused (`reason` label): a small fixed set, told by the Login
/// Response's status (RFC 7143 11.13.5) and what the target checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// CHAP failed or was not offered as required (0201h).
    Auth,
    /// The target requires TLS and the connection is plaintext.
    Tls,
    /// The initiator is not admitted to the target (0202h), or the target requires CHAP
    /// and has no secret for it.
    NotAdmitted,
    /// No such target (0203h), not offered on that portal, or removed (0204h).
    NotFound,
    /// A limit: MaxConnections of the session (0206h), `max_sessions` (0302h).
    Limit,
    /// The target is shutting down (0301h) or failed (0300h).
    Unavailable,
    /// Anything else the initiator got wrong: versions, keys, session types, a TSIH that
    /// names no session.
    Protocol,
}

impl Refusal {
    const ALL: [Refusal; 7] = [
        Refusal::Auth,
        Refusal::Tls,
        Refusal::NotAdmitted,
        Refusal::NotFound,
        Refusal::Limit,
        Refusal::Unavailable,
        Refusal::Protocol,
    ];

    /// By the status the login was refused with; `wants_tls`: the target named needs TLS
    /// and the connection was plaintext (refused as not admitted, 0202h).
    pub(crate) fn of(status: (u8, u8), wants_tls: bool) -> Refusal {
        match status {
            (0x02, 0x02) if wants_tls => Refusal::Tls,
            (0x02, 0x01) => Refusal::Auth,
            (0x02, 0x02) => Refusal::NotAdmitted,
            (0x02, 0x03 | 0x04) => Refusal::NotFound,
            (0x02, 0x06) | (0x03, 0x02) => Refusal::Limit,
            (0x03, _) => Refusal::Unavailable,
            _ => Refusal::Protocol,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Refusal::Auth => "auth",
            Refusal::Tls => "tls",
            Refusal::NotAdmitted => "not_admitted",
            Refusal::NotFound => "not_found",
            Refusal::Limit => "limit",
            Refusal::Unavailable => "unavailable",
            Refusal::Protocol => "protocol",
        }
    }
}

/// A limit of the configuration that refused something (`limit` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    /// `[session] max_sessions`: a login for a new session refused.
    Sessions,
    /// The session's MaxConnections: a login for another connection refused.
    Connections,
    /// `[session] max_open_connections`: a TCP connection closed at accept.
    OpenConnections,
}

impl Limit {
    const ALL: [Limit; 3] = [Limit::Sessions, Limit::Connections, Limit::OpenConnections];

    fn label(self) -> &'static str {
        match self {
            Limit::Sessions => "max_sessions",
            Limit::Connections => "max_connections",
            Limit::OpenConnections => "max_open_connections",
        }
    }
}

/// What ErrorRecoveryLevel 2 did (`event` label). Reassigned tasks are the task
/// management series with function `task_reassign`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// A connection ended (failed, or logged out for recovery) and its tasks wait for
    /// reassignment.
    ConnectionRetired,
    /// The same CID logged in again: connection reinstatement, an implicit logout for
    /// recovery.
    ConnectionReinstated,
    /// No connection came back within DefaultTime2Wait + DefaultTime2Retain: the session
    /// ended with its retained tasks.
    SessionExpired,
}

impl Recovery {
    const ALL: [Recovery; 3] = [
        Recovery::ConnectionRetired,
        Recovery::ConnectionReinstated,
        Recovery::SessionExpired,
    ];

    fn label(self) -> &'static str {
        match self {
            Recovery::ConnectionRetired => "connection_retired",
            Recovery::ConnectionReinstated => "connection_reinstated",
            Recovery::SessionExpired => "session_expired",
        }
    }
}

/// A task management function code as a label (RFC 7143 11.5.1).
fn tmf_function(f: u8) -> &'static str {
    use iscsi::ffp::tmf;
    match f {
        tmf::ABORT_TASK => "abort_task",
        tmf::ABORT_TASK_SET => "abort_task_set",
        tmf::CLEAR_ACA => "clear_aca",
        tmf::CLEAR_TASK_SET => "clear_task_set",
        tmf::LOGICAL_UNIT_RESET => "logical_unit_reset",
        tmf::TARGET_WARM_RESET => "target_warm_reset",
        tmf::TARGET_COLD_RESET => "target_cold_reset",
        tmf::TASK_REASSIGN => "task_reassign",
        _ => "other",
    }
}

/// A task management response code as a label (RFC 7143 11.6.1).
fn tmf_response(r: u8) -> &'static str {
    use iscsi::ffp::tmf;
    match r {
        tmf::COMPLETE => "complete",
        tmf::NO_TASK => "no_task",
        tmf::NO_LUN => "no_lun",
        tmf::ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED => "allegiance_reassignment_not_supported",
        tmf::REASSIGNMENT_NOT_SUPPORTED => "reassignment_not_supported",
        tmf::NOT_SUPPORTED => "not_supported",
        tmf::AUTHORIZATION_FAILED => "authorization_failed",
        tmf::REJECTED => "rejected",
        _ => "other",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabel {
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EventLabel {
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TmfLabels {
    function: &'static str,
    response: &'static str,
}

/// The target's events, counted whether or not metrics are served (they are rare).
/// Every label set is fixed and small; those of refusals, limits and recoveries are
/// there from the start, at zero, so that a rate over them starts with the target.
#[derive(Debug, Default)]
pub(crate) struct Events {
    pub(crate) logins_refused: Family<ReasonLabel, Counter>,
    pub(crate) task_management: Family<TmfLabels, Counter>,
    pub(crate) recoveries: Family<EventLabel, Counter>,
    pub(crate) limits: Family<LimitLabel, Counter>,
}

impl Events {
    pub(crate) fn new() -> Events {
        let e = Events::default();
        for r in Refusal::ALL {
            let _ = e
                .logins_refused
                .get_or_create(&ReasonLabel { reason: r.label() });
        }
        for l in Limit::ALL {
            let _ = e.limits.get_or_create(&LimitLabel { limit: l.label() });
        }
        for r in Recovery::ALL {
            let _ = e.recoveries.get_or_create(&EventLabel { event: r.label() });
        }
        e
    }

    pub(crate) fn login_refused(&self, why: Refusal) {
        self.logins_refused
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    pub(crate) fn limit(&self, limit: Limit) {
        self.limits
            .get_or_create(&LimitLabel {
                limit: limit.label(),
            })
            .inc();
    }

    pub(crate) fn recovery(&self, what: Recovery) {
        self.recoveries
            .get_or_create(&EventLabel {
                event: what.label(),
            })
            .inc();
    }

    pub(crate) fn task_management(&self, function: u8, response: u8) {
        self.task_management
            .get_or_create(&TmfLabels {
                function: tmf_function(function),
                response: tmf_response(response),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scsi::Sense;

    fn sense(s: &Sense) -> Vec<u8> {
        scsi::Response::check_condition(s).sense.unwrap()
    }

    #[test]
    fn commands_are_classified_by_operation_code() {
        for (code, want) in [
            (op::READ_6, Op::Read),
            (op::READ_16, Op::Read),
            (op::WRITE_10, Op::Write),
            (op::WRITE_SAME_16, Op::Write),
            (op::COMPARE_AND_WRITE, Op::Write),
            (op::WRITE_VERIFY_12, Op::Write),
            (op::SYNCHRONIZE_CACHE_10, Op::Flush),
            (op::SYNCHRONIZE_CACHE_16, Op::Flush),
            (op::INQUIRY, Op::Other),
            (op::VERIFY_16, Op::Other),
            (op::UNMAP, Op::Other),
        ] {
            assert_eq!(Op::of(&[code, 0, 0]), want, "opcode {code:#04x}");
        }
        assert_eq!(Op::of(&[]), Op::Other);
    }

    #[test]
    fn a_check_condition_counts_under_its_sense_key() {
        let s = LunStats::default();
        let read = [op::READ_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        s.started();
        s.answered(&read, 4096, Duration::from_micros(80), 0, None);
        s.started();
        let lba_out_of_range = sense(&Sense::new(0x05, 0x21, 0x00));
        s.answered(
            &read,
            0,
            Duration::from_micros(20),
            scsi::status::CHECK_CONDITION,
            Some(&lba_out_of_range),
        );
        s.started();
        let write = [op::WRITE_16; 16];
        let medium_error = sense(&Sense::new(0x03, 0x0c, 0x00));
        s.answered(
            &write,
            512,
            Duration::from_millis(3),
            scsi::status::CHECK_CONDITION,
            Some(&medium_error),
        );
        assert_eq!(s.op(Op::Read).commands.get(), 2);
        assert_eq!(s.op(Op::Read).bytes.get(), 4096);
        assert_eq!(s.op(Op::Read).latency.count(), 2);
        assert_eq!(s.op(Op::Write).commands.get(), 1);
        assert_eq!(s.op(Op::Write).bytes.get(), 512);
        assert_eq!(s.op(Op::Flush).commands.get(), 0);
        let keys: Vec<(usize, u64)> = s
            .check_conditions
            .iter()
            .map(|c| c.get())
            .enumerate()
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(keys, vec![(3, 1), (5, 1)]);
        assert_eq!(SENSE_KEYS[5], "illegal_request");
        assert_eq!(s.in_flight.get(), 0);
    }

    #[test]
    fn refusals_are_told_by_their_login_status() {
        use iscsi::login::status;
        for (code, tls, want) in [
            (status::AUTHENTICATION_FAILURE, false, Refusal::Auth),
            (status::AUTHORIZATION_FAILURE, false, Refusal::NotAdmitted),
            (status::AUTHORIZATION_FAILURE, true, Refusal::Tls),
            (status::NOT_FOUND, false, Refusal::NotFound),
            (status::TOO_MANY_CONNECTIONS, false, Refusal::Limit),
            (status::OUT_OF_RESOURCES, false, Refusal::Limit),
            (status::SERVICE_UNAVAILABLE, false, Refusal::Unavailable),
            (status::SESSION_DOES_NOT_EXIST, false, Refusal::Protocol),
            (status::CANT_INCLUDE_IN_SESSION, false, Refusal::Protocol),
        ] {
            assert_eq!(Refusal::of(code, tls), want, "{code:?}");
        }
    }
}
