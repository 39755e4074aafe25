//! The target's `/metrics` registry (`[metrics]`, `--metrics`): the events of
//! `crate::stats::Events`, and a collector that reads, at each scrape, the targets in
//! force and their LUNs' counters, so that a LUN a reload removed leaves the exposition
//! with its LU and no series outlives what it counts. Served by `rsv_metrics::serve` on
//! the target's runtime (`Server::run`).
//!
//! Per-connection series (an info series naming the session's initiator and the
//! connection's portal, TLS, ERL and digests, and the path as TCP sees it) come from a
//! `status::Source` snapshot that the collector takes as the scrape is encoded: byte
//! counts are atomics and TCP_INFO is read from a duplicate of each connection's socket,
//! so the snapshot asks no connection and waits for none. A connection's series go when
//! it does.

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use rsv_metrics::SeriesCap;

use crate::shared::Shared;
use crate::stats::{LunStats, Op, LATENCY_BUCKETS, SENSE_KEYS};
use crate::status::{ConnStatus, SessionStatus, Source};

/// Series one LUN may carry: commands and latency per kind, bytes per kind that moves
/// data, commands in flight, and a CHECK CONDITION series per sense key seen.
const SERIES_PER_LUN: usize =
    Op::ALL.len() * (1 + LATENCY_BUCKETS.len() + 3) + (Op::ALL.len() - 1) + 1 + SENSE_KEYS.len();

/// Series one connection carries: its info series, bytes both ways, and seven figures
/// of its path.
const SERIES_PER_CONNECTION: usize = 10;

/// The registry a target serves: its events, and its LUNs and connections as they are at
/// each scrape. LUN and connection series are capped by `max_series` each.
pub(crate) fn metrics(shared: &Arc<Shared>, max_series: usize) -> Registry {
    let mut registry = registry(shared, max_series);
    registry.register_collector(Box::new(ConnCollector {
        source: Source(shared.clone()),
        cap: SeriesCap::new("connection", max_series),
    }));
    registry
}

/// The registry without the per-connection series.
pub(crate) fn registry(shared: &Arc<Shared>, max_series: usize) -> Registry {
    let mut reg = Registry::default();
    let e = &shared.events;
    reg.register(
        "rsv_target_logins_refused",
        "Logins the target refused, by reason",
        e.logins_refused.clone(),
    );
    reg.register(
        "rsv_target_task_management",
        "Task management requests, by function and the target's response",
        e.task_management.clone(),
    );
    reg.register(
        "rsv_target_erl2_recoveries",
        "ErrorRecoveryLevel 2 connection recovery: connections whose tasks wait for \
         reassignment, connections reinstated, sessions that expired waiting",
        e.recoveries.clone(),
    );
    reg.register(
        "rsv_target_limits_reached",
        "Logins or connections refused by a configured limit, by limit",
        e.limits.clone(),
    );
    reg.register_collector(Box::new(LunCollector {
        shared: shared.clone(),
        cap: SeriesCap::new("LUN", max_series),
    }));
    reg
}

/// The sessions and connections of the target, and every LUN's counters with its
/// target and LUN as labels, read from the targets in force at each scrape.
pub(crate) struct LunCollector {
    shared: Arc<Shared>,
    cap: SeriesCap,
}

impl std::fmt::Debug for LunCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LunCollector")
            .field("cap", &self.cap)
            .finish()
    }
}

/// One LUN as a scrape labels it.
struct Lun<'a> {
    target: &'a str,
    lun: String,
    stats: &'a LunStats,
}

impl Lun<'_> {
    fn labels<'a>(&'a self, more: (&'static str, &'a str)) -> [(&'static str, &'a str); 3] {
        [("target", self.target), ("lun", &self.lun), more]
    }
}

impl prometheus_client::collector::Collector for LunCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::gauge::ConstGauge;
        let sessions = ConstGauge::new(self.shared.session_count() as i64);
        sessions.encode(enc.encode_descriptor(
            "rsv_target_sessions",
            "Sessions logged in (discovery sessions too)",
            None,
            MetricType::Gauge,
        )?)?;
        let connections = ConstGauge::new(self.shared.open_connection_count() as i64);
        connections.encode(enc.encode_descriptor(
            "rsv_target_connections",
            "TCP connections open at the portals, logged in or not",
            None,
            MetricType::Gauge,
        )?)?;
        let cc = crate::status::CongestionStatus::of(
            self.shared.config.session.congestion.as_deref(),
            net::default_congestion_decided(),
        );
        let mut m = enc.encode_descriptor(
            "rsv_target_congestion_info",
            "1, naming the congestion control the target gives its connections and who \
             chose it (configured, or the default: rsv where it loads, else bbr or cubic)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1i64).encode(m.encode_family(&[
            ("congestion", cc.name.as_deref().unwrap_or("kernel")),
            ("by", cc.by.as_str()),
        ])?)?;

        let live = self.shared.live();
        let mut luns: Vec<Lun> = live
            .targets
            .iter()
            .flat_map(|t| {
                t.stores.iter().filter_map(|(id, s)| {
                    Some(Lun {
                        target: &t.iqn,
                        lun: id.to_string(),
                        stats: s.stats.as_deref()?,
                    })
                })
            })
            .collect();
        let admitted = self.cap.admit(luns.len(), SERIES_PER_LUN);
        luns.truncate(admitted);

        let mut m = enc.encode_descriptor(
            "rsv_target_lun_commands",
            "SCSI commands answered, by LUN and kind (read, write, flush, other)",
            None,
            MetricType::Counter,
        )?;
        for l in &luns {
            for op in Op::ALL {
                l.stats
                    .op(op)
                    .commands
                    .encode(m.encode_family(&l.labels(("op", op.label())))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "rsv_target_lun",
            "Data moved by SCSI commands (Data-In sent, Data-Out received), by LUN and kind",
            Some(&Unit::Bytes),
            MetricType::Counter,
        )?;
        for l in &luns {
            for op in Op::ALL.into_iter().filter(|o| o.moves_data()) {
                l.stats
                    .op(op)
                    .bytes
                    .encode(m.encode_family(&l.labels(("op", op.label())))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "rsv_target_lun_command_duration",
            "Time from a command's start at the LU (its data received) to its answer, by \
             LUN and kind",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for l in &luns {
            for op in Op::ALL {
                l.stats
                    .op(op)
                    .latency
                    .encode(m.encode_family(&l.labels(("op", op.label())))?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "rsv_target_lun_commands_in_flight",
            "SCSI commands started at the LU and not yet answered",
            None,
            MetricType::Gauge,
        )?;
        for l in &luns {
            let labels = [("target", l.target), ("lun", l.lun.as_str())];
            l.stats.in_flight.encode(m.encode_family(&labels)?)?;
        }
        let mut m = enc.encode_descriptor(
            "rsv_target_lun_check_conditions",
            "Commands answered CHECK CONDITION, by LUN and sense key (keys seen only)",
            None,
            MetricType::Counter,
        )?;
        for l in &luns {
            for (key, c) in SENSE_KEYS.iter().zip(&l.stats.check_conditions) {
                if c.get() > 0 {
                    c.encode(m.encode_family(&l.labels(("sense_key", key)))?)?;
                }
            }
        }
        Ok(())
    }
}

/// Each logged-in connection at the scrape: an info series, bytes, and the path.
struct ConnCollector {
    source: Source,
    cap: SeriesCap,
}

impl std::fmt::Debug for ConnCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnCollector")
            .field("cap", &self.cap)
            .finish()
    }
}

/// One connection as a scrape labels it: `target`, `tsih` and `cid` join its series.
struct Conn<'a> {
    session: &'a SessionStatus,
    conn: &'a ConnStatus,
    target: &'a str,
    tsih: String,
    cid: String,
}

impl Conn<'_> {
    fn id(&self) -> [(&'static str, &str); 3] {
        [
            ("target", self.target),
            ("tsih", &self.tsih),
            ("cid", &self.cid),
        ]
    }
}

impl prometheus_client::collector::Collector for ConnCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let sessions = self.source.snapshot().sessions;
        // Discovery sessions name no target: they move no data worth a series.
        let mut conns: Vec<Conn> = sessions
            .iter()
            .filter_map(|s| Some((s, s.target.as_deref()?)))
            .flat_map(|(session, target)| {
                session.connections.iter().map(move |conn| Conn {
                    session,
                    conn,
                    target,
                    tsih: session.tsih.to_string(),
                    cid: conn.cid.to_string(),
                })
            })
            .collect();
        conns.truncate(self.cap.admit(conns.len(), SERIES_PER_CONNECTION));

        let mut m = enc.encode_descriptor(
            "rsv_target_connection_info",
            "One series per logged-in connection, 1, naming its session's initiator, the \
             portal it reached, TLS (the version, or no), ErrorRecoveryLevel and digests",
            None,
            MetricType::Gauge,
        )?;
        for k in &conns {
            let (s, c, id) = (k.session, k.conn, k.id());
            let portal = c.local.to_string();
            let erl = s.keys.error_recovery_level.to_string();
            let digest = |on: bool| if on { "crc32c" } else { "none" };
            let labels = [
                id[0],
                id[1],
                id[2],
                ("initiator", s.initiator.as_str()),
                ("portal", portal.as_str()),
                ("tls", c.tls.as_deref().unwrap_or("no")),
                ("erl", erl.as_str()),
                ("header_digest", digest(c.header_digest)),
                ("data_digest", digest(c.data_digest)),
            ];
            ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
        }
        for (name, help, received) in [
            (
                "rsv_target_connection_received",
                "Bytes of PDUs received on the connection since login",
                true,
            ),
            (
                "rsv_target_connection_sent",
                "Bytes of PDUs sent on the connection since login",
                false,
            ),
        ] {
            let mut m =
                enc.encode_descriptor(name, help, Some(&Unit::Bytes), MetricType::Counter)?;
            for k in &conns {
                let c = k.conn;
                let v = if received {
                    c.bytes_received
                } else {
                    c.bytes_sent
                };
                ConstCounter::new(v).encode(m.encode_family(&k.id())?)?;
            }
        }
        // The path as TCP sees it (TCP_INFO, sampled for this scrape); a connection that
        // ended as the snapshot was taken has none of these series.
        type Figure = fn(&crate::status::PathStatus) -> f64;
        let gauges: [(&str, &str, Option<Unit>, Figure); 6] = [
            (
                "rsv_target_connection_srtt",
                "Smoothed round-trip time",
                Some(Unit::Seconds),
                |p| p.srtt_us as f64 / 1e6,
            ),
            (
                "rsv_target_connection_min_rtt",
                "Lowest round-trip time TCP has seen",
                Some(Unit::Seconds),
                |p| p.min_rtt_us as f64 / 1e6,
            ),
            (
                "rsv_target_connection_cwnd_segments",
                "Congestion window, in segments",
                None,
                |p| p.cwnd as f64,
            ),
            (
                "rsv_target_connection_delivery_rate_bytes_per_second",
                "TCP's latest delivery rate estimate",
                None,
                |p| p.delivery_rate as f64,
            ),
            (
                "rsv_target_connection_pacing_rate_bytes_per_second",
                "The rate TCP paces the connection's sends at",
                None,
                |p| p.pacing_rate as f64,
            ),
            (
                "rsv_target_connection_in_flight",
                "Bytes sent and not yet acknowledged (segments in flight times the MSS)",
                Some(Unit::Bytes),
                |p| p.bytes_in_flight as f64,
            ),
        ];
        for (name, help, unit, figure) in gauges {
            let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
            for k in &conns {
                if let Some(p) = &k.conn.path {
                    ConstGauge::new(figure(p)).encode(m.encode_family(&k.id())?)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "rsv_target_connection_retransmits",
            "Segments TCP sent again on the connection",
            None,
            MetricType::Counter,
        )?;
        for k in &conns {
            if let Some(p) = &k.conn.path {
                ConstCounter::new(p.retransmits as u64).encode(m.encode_family(&k.id())?)?;
            }
        }
        Ok(())
    }
}
