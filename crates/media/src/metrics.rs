//! What `rsv media --metrics` counts, and the registry it serves (`rsv_metrics::serve`):
//! HTTP requests by route class and status, body bytes handed to the connections, file
//! streams in flight, iSNS lookups and logins to storage (and sessions open now), and per
//! storage and LUN the bytes its files gave to answers and how long each read took.
//!
//! Every label is a fixed word or a number the server chose (route classes, the statuses
//! it answers with), but for the storage's name and LUN: storage comes and goes with iSNS,
//! so those series are read from the catalog at each scrape (storage that left the
//! catalog leaves the exposition) and capped by a [`SeriesCap`].

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use rsv_metrics::{Histogram, SeriesCap};

use crate::listing::Route;
use crate::storage::Catalog;

/// The upper bounds of the read latency histogram, seconds: a read from a LUN's cache
/// takes microseconds, one that waits for its unit a round trip or more.
pub const READ_BUCKETS: [f64; 14] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Series one storage LUN carries: its read bytes, and its histogram (buckets, +Inf,
/// count, sum).
const SERIES_PER_LUN: usize = 1 + READ_BUCKETS.len() + 3;

/// The server's counts; always kept (a few atomic adds a request), served only with
/// `--metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: Family<RequestLabels, Counter>,
    /// Body bytes handed to the HTTP connections.
    pub sent: Counter,
    /// Files being streamed now.
    pub streams: Gauge,
    pub lookups: Family<ResultLabels, Counter>,
    pub logins: Family<ResultLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

impl Stats {
    pub fn request(&self, route: &'static str, status: hyper::StatusCode) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                status: status.as_u16(),
            })
            .inc();
    }

    pub fn lookup(&self, ok: bool) {
        self.lookups.get_or_create(&result(ok)).inc();
    }

    pub fn login(&self, ok: bool) {
        self.logins.get_or_create(&result(ok)).inc();
    }
}

fn result(ok: bool) -> ResultLabels {
    ResultLabels {
        result: if ok { "ok" } else { "error" },
    }
}

/// A route's class as a label: a fixed word whatever the path.
pub fn route_class(r: &Route) -> &'static str {
    match r {
        Route::Page => "page",
        Route::Json => "api",
        Route::Player { .. } => "player",
        Route::File { .. } => "file",
        Route::NotFound => "other",
    }
}

/// What one LUN of one storage gave to answers.
#[derive(Debug)]
pub struct LunStats {
    pub read: Counter,
    pub latency: Histogram,
}

impl Default for LunStats {
    fn default() -> LunStats {
        LunStats {
            read: Counter::default(),
            latency: Histogram::new(&READ_BUCKETS),
        }
    }
}

impl LunStats {
    pub fn read(&self, bytes: usize, took: Duration) {
        self.read.inc_by(bytes as u64);
        self.latency.observe(took);
    }
}

/// The registry `--metrics` serves: `stats`, and the catalog's storage at each scrape,
/// their LUN series capped at `max_series`.
pub fn registry(catalog: &Arc<Catalog>, max_series: usize) -> Registry {
    let stats = catalog.stats();
    let mut reg = Registry::default();
    reg.register(
        "rsv_media_http_requests",
        "HTTP requests answered, by route class (page, api, player, file, other) and status",
        stats.requests.clone(),
    );
    reg.register_with_unit(
        "rsv_media_http_sent",
        "Body bytes handed to the HTTP connections (pages, listings and files)",
        Unit::Bytes,
        stats.sent.clone(),
    );
    reg.register(
        "rsv_media_streams_in_flight",
        "Files being streamed to clients now",
        stats.streams.clone(),
    );
    reg.register(
        "rsv_media_isns_lookups",
        "Lookups of storage in the iSNS servers, by result",
        stats.lookups.clone(),
    );
    reg.register(
        "rsv_media_logins",
        "Logins to storage on demand (a session and its LUNs' file systems opened), by result",
        stats.logins.clone(),
    );
    reg.register_collector(Box::new(StorageCollector {
        catalog: catalog.clone(),
        cap: SeriesCap::new("storage LUN", max_series),
    }));
    reg
}

/// The catalog's storage as it is at each scrape.
struct StorageCollector {
    catalog: Arc<Catalog>,
    cap: SeriesCap,
}

impl std::fmt::Debug for StorageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageCollector")
            .field("cap", &self.cap)
            .finish()
    }
}

impl Collector for StorageCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let all = self.catalog.all();
        ConstGauge::new(all.len() as i64).encode(enc.encode_descriptor(
            "rsv_media_storages",
            "Storage known (found in iSNS or given as URLs)",
            None,
            MetricType::Gauge,
        )?)?;
        let open = all.iter().filter(|s| s.is_open()).count();
        ConstGauge::new(open as i64).encode(enc.encode_descriptor(
            "rsv_media_sessions",
            "Storage logged in to now (a session open, or its login under way)",
            None,
            MetricType::Gauge,
        )?)?;
        let mut luns: Vec<(String, String, Arc<LunStats>)> = all
            .iter()
            .flat_map(|s| {
                let id = s.source.lock().unwrap_or_else(|e| e.into_inner()).id();
                s.lun_stats()
                    .into_iter()
                    .map(move |(lun, st)| (id.clone(), lun.to_string(), st))
            })
            .collect();
        luns.truncate(self.cap.admit(luns.len(), SERIES_PER_LUN));
        let mut m = enc.encode_descriptor(
            "rsv_media_lun_read",
            "Bytes of files read from the storage's LUN for answers",
            Some(&Unit::Bytes),
            MetricType::Counter,
        )?;
        for (storage, lun, st) in &luns {
            let labels = [("storage", storage.as_str()), ("lun", lun.as_str())];
            st.read.encode(m.encode_family(&labels)?)?;
        }
        let mut m = enc.encode_descriptor(
            "rsv_media_lun_read_duration",
            "Time each read of a file (a stream's chunk) took, read-ahead waits included",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (storage, lun, st) in &luns {
            let labels = [("storage", storage.as_str()), ("lun", lun.as_str())];
            st.latency.encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_the_cap_on_storage_luns() {
        let catalog = Catalog::new(initiator::SessionOptions::default(), None);
        let mut sources = Vec::new();
        for i in 0..3 {
            let s = crate::storage::from_url(&format!("iscsi://127.0.0.1/iqn.2026-11.x:s{i}/0"));
            sources.push(s.unwrap());
        }
        catalog.update("url", sources);
        for s in catalog.all() {
            s.lun_stat(0).read(1000, Duration::from_millis(3));
        }
        catalog
            .stats()
            .request("file", hyper::StatusCode::PARTIAL_CONTENT);
        catalog.stats().sent.inc_by(1000);
        // Room for two LUNs' series.
        let reg = registry(&catalog, 2 * SERIES_PER_LUN);
        let t = rsv_metrics::text(&reg).unwrap();
        assert!(
            t.contains("rsv_media_http_requests_total{route=\"file\",status=\"206\"} 1\n"),
            "{t}"
        );
        assert!(t.contains("rsv_media_http_sent_bytes_total 1000\n"), "{t}");
        assert!(t.contains("rsv_media_storages 3\n"), "{t}");
        assert!(t.contains("rsv_media_sessions 0\n"), "{t}");
        let reads: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("rsv_media_lun_read_bytes_total{"))
            .collect();
        assert_eq!(reads.len(), 2, "{t}");
        assert!(reads.iter().all(|l| l.ends_with(" 1000")), "{t}");
        assert!(
            t.contains(
                "rsv_media_lun_read_duration_seconds_bucket{le=\"0.005\",storage=\"iqn.2026-11.x:s0\",lun=\"0\"} 1\n"
            ),
            "{t}"
        );
        assert!(!t.contains("s2\""), "past the cap:\n{t}");
    }
}
