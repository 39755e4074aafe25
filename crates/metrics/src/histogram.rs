//! A histogram of durations whose observation costs a few relaxed atomic adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram of durations in seconds with fixed upper bounds. Each bucket counts its
/// own observations (the encoder makes them cumulative); the sum is kept in whole
/// nanoseconds, so that it adds up exactly whatever the order of the adds.
///
/// A scrape reads the buckets, count and sum one after another while observations go on,
/// so a scrape may see an observation in its bucket and not yet in the sum; the next
/// scrape sees both. Prometheus's rates over many scrapes do not notice.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in nanoseconds, increasing; the +Inf bucket is implicit.
    bounds: Vec<u64>,
    /// One per bound, then +Inf.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Buckets with these upper bounds, in seconds, increasing.
    pub fn new(bounds_s: &[f64]) -> Histogram {
        debug_assert!(bounds_s.windows(2).all(|w| w[0] < w[1]));
        Histogram {
            bounds: bounds_s.iter().map(|s| (s * 1e9) as u64).collect(),
            counts: (0..=bounds_s.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.bounds.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .map(|&b| b as f64 / 1e9)
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|b| b.1).sum();
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1)); // on the bound: le is "less or equal"
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(3));
        assert_eq!(h.count(), 4);
        let mut reg = Registry::default();
        reg.register_with_unit(
            "op_duration",
            "t",
            prometheus_client::registry::Unit::Seconds,
            h,
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for line in [
            "op_duration_seconds_bucket{le=\"0.001\"} 2",
            "op_duration_seconds_bucket{le=\"0.01\"} 3",
            "op_duration_seconds_bucket{le=\"+Inf\"} 4",
            "op_duration_seconds_count 4",
            "op_duration_seconds_sum 3.0065",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
