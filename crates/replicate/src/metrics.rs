//! `rsv sync --metrics`: the coordinator's view of a sync while it runs, served by
//! `rsv_metrics::serve`: per stream (stripe member) its rate now, bytes sent and left,
//! an ETA and the pacing cap [`crate::pace`] gave it; the totals; and when the last sync
//! completed (or failed), the gauge a replica's lag is read from.
//!
//! Each progress [`Tick`] replaces the snapshot a scrape encodes; nothing here is on the
//! data path. A stream's labels are its index, and (in one info series) its source agent
//! and destination URL; streams are bounded by the volume's stripe members, and capped by
//! a [`SeriesCap`] all the same.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use rsv_metrics::SeriesCap;

use crate::coord::Tick;

/// Series one stream carries: info, size, sent, left, rate, ETA, pacing cap.
const SERIES_PER_STREAM: usize = 7;

/// A stream as the last tick saw it.
#[derive(Clone, Debug, Default, PartialEq)]
struct Stream {
    source: String,
    dest: String,
    bytes: u64,
    sent: u64,
    left: u64,
    rate: u64,
    eta_s: Option<f64>,
    pacing: Option<u64>,
}

#[derive(Debug, Default)]
struct Snapshot {
    bytes: u64,
    sent: u64,
    left: u64,
    rate: u64,
    eta_s: Option<f64>,
    pacing_total: Option<u64>,
    streams: Vec<Stream>,
    running: bool,
    started_unix: Option<f64>,
    completed_unix: Option<f64>,
    failed_unix: Option<f64>,
    /// When the image the far site last committed was cut at the source (Unix time).
    committed_cut_unix: Option<f64>,
    /// Bytes sent by the runs before this one (continuous mode): the counters go on.
    sent_base: u64,
    stream_sent_base: Vec<u64>,
}

/// What `/metrics` shows of the sync; cheap to clone, shared with the collector.
#[derive(Clone, Debug, Default)]
pub struct SyncMetrics(Arc<Mutex<Snapshot>>);

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl SyncMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A progress tick: the snapshot becomes what it says. Bytes sent only grow (the
    /// counters a scrape reads must not go back).
    pub fn progress(&self, t: &Tick<'_>) {
        let mut s = self.lock();
        if !s.running {
            s.running = true;
            s.started_unix = Some(t.unix - t.t);
            // A new run (the next cycle): its bytes add to the counters.
            s.sent_base = s.sent;
            s.stream_sent_base = s.streams.iter().map(|m| m.sent).collect();
        }
        s.bytes = t.bytes;
        s.sent = s.sent.max(s.sent_base + t.done_bytes);
        s.left = t.left_bytes;
        s.rate = t.rate_bytes_per_s;
        s.eta_s = t.eta_s;
        s.pacing_total = t.pacing_total;
        s.streams.resize(t.streams.len(), Stream::default());
        let bases = std::mem::take(&mut s.stream_sent_base);
        for (i, (m, st)) in s.streams.iter_mut().zip(&t.streams).enumerate() {
            let base = bases.get(i).copied().unwrap_or(0);
            *m = Stream {
                source: st.source.to_owned(),
                dest: st.dest.to_owned(),
                bytes: st.bytes,
                sent: m.sent.max(base + st.done_bytes),
                left: st.left_bytes,
                rate: st.rate_bytes_per_s,
                eta_s: st.eta_s,
                pacing: st.pacing,
            };
        }
        s.stream_sent_base = bases;
    }

    /// The far site committed the image cut at `cut_unix` (Unix time): the replica's lag
    /// (`rsv_sync_rpo_seconds`) runs from it.
    pub fn committed(&self, cut_unix: f64) {
        self.lock().committed_cut_unix = Some(cut_unix);
    }

    /// The sync completed (sent, verified, the epoch released): now is the replica's
    /// newest point.
    pub fn completed(&self) {
        let mut s = self.lock();
        s.running = false;
        s.rate = 0;
        for m in &mut s.streams {
            m.rate = 0;
        }
        s.completed_unix = Some(unix_now());
    }

    /// The sync failed.
    pub fn failed(&self) {
        let mut s = self.lock();
        s.running = false;
        s.failed_unix = Some(unix_now());
    }

    /// The registry `--metrics` serves, per-stream series capped at `max_series`.
    pub fn registry(&self, max_series: usize) -> Registry {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(SyncCollector {
            metrics: self.clone(),
            cap: SeriesCap::new("stream", max_series),
        }));
        reg
    }
}

struct SyncCollector {
    metrics: SyncMetrics,
    cap: SeriesCap,
}

impl std::fmt::Debug for SyncCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncCollector")
            .field("cap", &self.cap)
            .finish()
    }
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    v: f64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(v).encode(enc.encode_descriptor(
        name,
        help,
        unit.as_ref(),
        MetricType::Gauge,
    )?)
}

impl Collector for SyncCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.metrics.lock();
        ConstGauge::new(i64::from(s.running)).encode(enc.encode_descriptor(
            "rsv_sync_running",
            "1 while the sync's streams run, 0 before and after",
            None,
            MetricType::Gauge,
        )?)?;
        for (name, help, at) in [
            (
                "rsv_sync_started_timestamp",
                "When the streams of the sync started (Unix time)",
                s.started_unix,
            ),
            (
                "rsv_sync_last_complete_timestamp",
                "When a sync last completed, sent and verified (Unix time): the replica \
                 holds the source as it was when that sync started",
                s.completed_unix,
            ),
            (
                "rsv_sync_last_failure_timestamp",
                "When a sync last failed (Unix time)",
                s.failed_unix,
            ),
            (
                "rsv_sync_committed_cut_timestamp",
                "When the image the far site last committed was cut at the source (Unix time)",
                s.committed_cut_unix,
            ),
        ] {
            if let Some(at) = at {
                gauge(&mut enc, name, help, Some(Unit::Seconds), at)?;
            }
        }
        if let Some(cut) = s.committed_cut_unix {
            // At scrape time: the lag grows between cycles, and a scrape must see it grow.
            gauge(
                &mut enc,
                "rsv_sync_rpo",
                "The replica's lag: now minus the moment the far site's last committed \
                 image was cut at the source",
                Some(Unit::Seconds),
                (unix_now() - cut).max(0.0),
            )?;
        }
        ConstGauge::new(s.streams.len() as i64).encode(enc.encode_descriptor(
            "rsv_sync_streams",
            "Streams (stripe members) of the sync",
            None,
            MetricType::Gauge,
        )?)?;
        gauge(
            &mut enc,
            "rsv_sync_size",
            "Bytes the sync sends in all",
            Some(Unit::Bytes),
            s.bytes as f64,
        )?;
        ConstCounter::new(s.sent).encode(enc.encode_descriptor(
            "rsv_sync_sent",
            "Bytes the streams have sent",
            Some(&Unit::Bytes),
            MetricType::Counter,
        )?)?;
        gauge(
            &mut enc,
            "rsv_sync_left",
            "Bytes the streams have still to send",
            Some(Unit::Bytes),
            s.left as f64,
        )?;
        gauge(
            &mut enc,
            "rsv_sync_rate_bytes_per_second",
            "The streams' rate now, together",
            None,
            s.rate as f64,
        )?;
        if let Some(eta) = s.eta_s {
            gauge(
                &mut enc,
                "rsv_sync_eta",
                "Time until the last stream ends, at the rates now",
                Some(Unit::Seconds),
                eta,
            )?;
        }
        if let Some(p) = s.pacing_total {
            gauge(
                &mut enc,
                "rsv_sync_pacing_total_bytes_per_second",
                "The sum of the streams' pacing caps",
                None,
                p as f64,
            )?;
        }

        let n = self.cap.admit(s.streams.len(), SERIES_PER_STREAM);
        let streams: Vec<(String, &Stream)> = s.streams[..n]
            .iter()
            .enumerate()
            .map(|(i, m)| (i.to_string(), m))
            .collect();
        let mut m = enc.encode_descriptor(
            "rsv_sync_stream_info",
            "One series per stream, 1, naming its source agent and destination member",
            None,
            MetricType::Gauge,
        )?;
        for (i, st) in &streams {
            let labels = [
                ("stream", i.as_str()),
                ("source", st.source.as_str()),
                ("dest", st.dest.as_str()),
            ];
            ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
        }
        let mut m = enc.encode_descriptor(
            "rsv_sync_stream_sent",
            "Bytes the stream has sent",
            Some(&Unit::Bytes),
            MetricType::Counter,
        )?;
        for (i, st) in &streams {
            ConstCounter::new(st.sent).encode(m.encode_family(&[("stream", i.as_str())])?)?;
        }
        type Figure = fn(&Stream) -> Option<f64>;
        let figures: [(&str, &str, Option<Unit>, Figure); 5] = [
            (
                "rsv_sync_stream_size",
                "Bytes the stream sends in all",
                Some(Unit::Bytes),
                |s| Some(s.bytes as f64),
            ),
            (
                "rsv_sync_stream_left",
                "Bytes the stream has still to send (0 once it ended)",
                Some(Unit::Bytes),
                |s| Some(s.left as f64),
            ),
            (
                "rsv_sync_stream_rate_bytes_per_second",
                "The stream's rate now",
                None,
                |s| Some(s.rate as f64),
            ),
            (
                "rsv_sync_stream_eta",
                "Time until the stream ends at its rate now (absent while it has no rate)",
                Some(Unit::Seconds),
                |s| s.eta_s,
            ),
            (
                "rsv_sync_stream_pacing_rate_bytes_per_second",
                "The pacing cap the cooperative rate control gave the stream (absent when \
                 unpaced)",
                None,
                |s| s.pacing.map(|p| p as f64),
            ),
        ];
        for (name, help, unit, figure) in figures {
            let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
            for (i, st) in &streams {
                if let Some(v) = figure(st) {
                    ConstGauge::new(v).encode(m.encode_family(&[("stream", i.as_str())])?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::JobState;
    use crate::coord::StreamTick;

    fn stream(done: u64, left: u64, rate: u64) -> StreamTick<'static> {
        StreamTick {
            source: "127.0.0.11:3262",
            dest: "iscsi://127.0.0.21:3260/iqn.x:v/0",
            state: JobState::Running,
            bytes: done + left,
            done_bytes: done,
            left_bytes: left,
            eta_s: (rate > 0).then(|| left as f64 / rate as f64),
            durable_bytes: 0,
            rate_bytes_per_s: rate,
            pacing: Some(rate),
            min_rtt_ms: 1.0,
            srtt_ms: 1.0,
            retransmits: 0,
            connections: 1,
            finished_at: None,
        }
    }

    #[test]
    fn a_tick_and_the_end_as_series_with_the_cap() {
        let m = SyncMetrics::default();
        let tick = Tick {
            event: "progress",
            t: 2.0,
            unix: 1000.0,
            bytes: 300,
            done_bytes: 120,
            left_bytes: 180,
            eta_s: Some(9.0),
            rate_bytes_per_s: 30,
            phase: crate::pace::Phase::Cruise,
            pacing_total: Some(30),
            streams: vec![stream(40, 60, 10), stream(40, 90, 10), stream(40, 30, 10)],
        };
        m.progress(&tick);
        // Room for two streams' series.
        let reg = m.registry(2 * SERIES_PER_STREAM);
        let t = rsv_metrics::text(&reg).unwrap();
        for line in [
            "rsv_sync_running 1",
            "rsv_sync_started_timestamp_seconds 998.0",
            "rsv_sync_left_bytes 180.0",
            "rsv_sync_sent_bytes_total 120",
            "rsv_sync_eta_seconds 9.0",
            "rsv_sync_stream_left_bytes{stream=\"0\"} 60.0",
            "rsv_sync_stream_eta_seconds{stream=\"1\"} 9.0",
            "rsv_sync_stream_pacing_rate_bytes_per_second{stream=\"0\"} 10.0",
            "rsv_sync_stream_sent_bytes_total{stream=\"1\"} 40",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} not in\n{t}");
        }
        assert!(!t.contains("stream=\"2\""), "past the cap:\n{t}");
        assert!(!t.contains("last_complete"), "{t}");
        assert!(!t.contains("rsv_sync_rpo"), "nothing committed yet:\n{t}");
        m.completed();
        m.committed(unix_now() - 5.0);
        let t = rsv_metrics::text(&reg).unwrap();
        let rpo: f64 = t
            .lines()
            .find_map(|l| l.strip_prefix("rsv_sync_rpo_seconds "))
            .unwrap_or_else(|| panic!("no rpo in\n{t}"))
            .parse()
            .unwrap();
        assert!((5.0..60.0).contains(&rpo), "{rpo}");
        // The next run's bytes add to the counter.
        m.progress(&tick);
        assert!(
            rsv_metrics::text(&reg)
                .unwrap()
                .contains("rsv_sync_sent_bytes_total 240"),
            "{}",
            rsv_metrics::text(&reg).unwrap()
        );
        m.completed();
        let t = rsv_metrics::text(&reg).unwrap();
        assert!(t.contains("rsv_sync_running 0\n"), "{t}");
        assert!(
            t.contains("rsv_sync_last_complete_timestamp_seconds "),
            "{t}"
        );
    }
}
