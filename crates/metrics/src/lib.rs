//! Reservoir's `/metrics` endpoint, shared by the commands that have one (`rsv target`,
//! `rsv isns`, `rsv media`, `rsv sync`): a `prometheus-client` [`Registry`] encoded as
//! OpenMetrics text and served over HTTP/1.1 by hyper on the caller's tokio runtime.
//!
//! Also here, because every daemon's metrics need them: [`Histogram`], a latency
//! histogram whose observation is a few relaxed atomic adds (prometheus-client's own
//! takes a mutex per observation, which a command path shared by many connection threads
//! should not), and [`SeriesCap`], the bound on the series a scrape may carry.
//!
//! A crate of its own rather than part of `net`: `net` is the transport under iSCSI
//! connections, and nothing on that path needs HTTP; here the daemons that serve metrics
//! share one HTTP server, one exposition and one cap, and nothing else.

mod histogram;
mod http;

pub use histogram::Histogram;
pub use http::{respond, serve, serve_refreshed, Refresh, CONTENT_TYPE};
pub use prometheus_client;

use std::sync::atomic::{AtomicBool, Ordering};

/// `registry` as OpenMetrics text: what `/metrics` answers a scraper that asks for it.
pub fn text(registry: &prometheus_client::registry::Registry) -> Result<String, std::fmt::Error> {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry)?;
    Ok(s)
}

/// A bound on the number of series one scrape carries, so that what a peer can make
/// many of (LUNs a configuration lists, sessions an initiator opens) cannot grow the
/// exposition, and every scraper's storage, without end. Those over the cap are left
/// out of the scrape; the first scrape that meets the cap logs one line saying so, and
/// the next one after the count fell below it again logs again.
#[derive(Debug)]
pub struct SeriesCap {
    max: usize,
    what: &'static str,
    reached: AtomicBool,
}

impl SeriesCap {
    /// A cap of `max` series on `what` (for the log line: "LUN", "session").
    pub fn new(what: &'static str, max: usize) -> SeriesCap {
        SeriesCap {
            max,
            what,
            reached: AtomicBool::new(false),
        }
    }

    /// Of `wanted` items of `each` series apiece, how many one scrape may carry.
    pub fn admit(&self, wanted: usize, each: usize) -> usize {
        let fits = self.max / each.max(1);
        if wanted > fits {
            if !self.reached.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "metrics: {wanted} {what}s of {each} series each pass the cap of {max} \
                     series; /metrics carries the first {fits} {what}s only",
                    what = self.what,
                    max = self.max
                );
            }
            fits
        } else {
            self.reached.store(false, Ordering::Relaxed);
            wanted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_admits_what_fits_and_remembers_it_was_reached() {
        let cap = SeriesCap::new("LUN", 100);
        assert_eq!(cap.admit(3, 30), 3);
        assert!(!cap.reached.load(Ordering::Relaxed));
        assert_eq!(cap.admit(4, 30), 3);
        assert!(cap.reached.load(Ordering::Relaxed));
        // Still over: no new line (the flag stays), and the same three.
        assert_eq!(cap.admit(10, 30), 3);
        assert!(cap.reached.load(Ordering::Relaxed));
        assert_eq!(cap.admit(2, 30), 2);
        assert!(!cap.reached.load(Ordering::Relaxed));
    }
}
