//! A writer of dependent, sequence-stamped writes (write n+1 only once write n was
//! acknowledged, each to a unit of its own, stamped as `rsv crash` stamps), and the writes
//! a copy of its volume holds: a copy of one moment holds every write up to some n and
//! none after (a prefix). What the tests of cuts and of continuous sync share.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tools::crash::model::{self, Found, UNIT};

/// Where write `n` (from 1) goes among `units`: spread over the whole volume (every
/// member, ahead of and behind a sync's reading), each unit written once.
pub fn unit_of(n: u64, units: u64) -> u64 {
    (n * 2473) % units
}

/// A thread writing stamped units of `UNIT` bytes, one after the other, until stopped or
/// the units run out. Told to stop when dropped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    acks: Arc<Mutex<Vec<f64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Writes to the LUN at `url`, `units` units of it, waiting `pause` after each
    /// acknowledgement (none when zero).
    pub fn start(url: &str, units: u64, pause: Duration) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let (s, a, t) = (stop.clone(), acked.clone(), acks.clone());
        let url = initiator::IscsiUrl::parse(url).unwrap();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let lun = initiator::Lun::open_url(&url, &initiator::SessionOptions::default())
                    .await
                    .unwrap();
                let mut n = 1;
                while !s.load(Ordering::Relaxed) && n < units {
                    let mut buf = vec![0u8; UNIT];
                    model::stamp(&mut buf, 1, n, n);
                    lun.write_at(unit_of(n, units) * UNIT as u64, Bytes::from(buf))
                        .await
                        .unwrap();
                    t.lock().unwrap().push(unix_now());
                    a.store(n, Ordering::SeqCst);
                    n += 1;
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
                let _ = lun.session().logout().await;
            })
        });
        Writer {
            stop,
            acked,
            acks,
            thread: Some(thread),
        }
    }

    /// How many writes were acknowledged so far (the last one's number).
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits until `n` writes were acknowledged; panics if the writer ended before.
    pub fn wait_for(&self, n: u64) {
        while self.acked() < n {
            let ended = match &self.thread {
                Some(t) => t.is_finished(),
                None => true,
            };
            assert!(
                !ended || self.acked() >= n,
                "the writer ended after {} writes, before {n}",
                self.acked()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Stops it and waits for its end (a failed write fails the test here); the Unix time
    /// at which each write was acknowledged, in order.
    pub fn stop(mut self) -> Vec<f64> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("the writer failed");
        }
        std::mem::take(&mut *self.acks.lock().unwrap())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Now, as a Unix time in seconds (what a sync reports its cuts in).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The writes a copy of `units` units holds, by number, sorted; panics on a unit that
/// holds anything but one of the writer's stamps (in its own unit) or zeros.
pub fn writes_in(copy: &[u8], units: u64) -> Vec<u64> {
    let mut found = Vec::new();
    for u in 0..units {
        let at = (u as usize) * UNIT;
        match model::parse(&copy[at..at + UNIT]) {
            Found::Empty => {}
            Found::Stamp { unit: n, gen, .. } => {
                assert_eq!(n, gen);
                assert_eq!(unit_of(n, units), u, "write {n} found in unit {u}");
                found.push(n);
            }
            Found::Garbage => panic!("unit {u} of the copy is torn or foreign"),
        }
    }
    found.sort_unstable();
    found
}

/// The first ten writes missing below the last one `found` holds (sorted, as
/// [`writes_in`] gives them): none in a copy of one moment.
pub fn holes(found: &[u64]) -> Vec<u64> {
    (1..=found.last().copied().unwrap_or(0))
        .filter(|n| found.binary_search(n).is_err())
        .take(10)
        .collect()
}
