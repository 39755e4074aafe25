//! The target's `/metrics` registry (`[metrics]`, `--metrics`): the events of
//! `crate::stats::Events`, and a collector that reads, at each scrape, the targets in
//! force and their LUNs' counters, so that a LUN a reload removed leaves the exposition
//! with its LU and no series outlives what it counts. Served by `rsv_metrics::serve` on
//! the target's runtime (`Server::run`).
//!
//! More collectors over the running target (per-session series) register beside
//! [`LunCollector`] in [`registry`].

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use rsv_metrics::SeriesCap;

use crate::shared::Shared;
use crate::stats::{LunStats, Op, LATENCY_BUCKETS, SENSE_KEYS};

/// Series one LUN may carry: commands and latency per kind, bytes per kind that moves
/// data, commands in flight, and a CHECK CONDITION series per sense key seen.
const SERIES_PER_LUN: usize =
    Op::ALL.len() * (1 + LATENCY_BUCKETS.len() + 3) + (Op::ALL.len() - 1) + 1 + SENSE_KEYS.len();

/// The registry a target serves: its events, and its LUNs and sessions as they are at
/// each scrape.
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
