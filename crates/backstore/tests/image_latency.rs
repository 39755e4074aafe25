//! A benchmark, not a check (`#[ignore]`; it prints figures and asserts no times): the
//! latency of a LUN's writes through the layers `rsv target` stacks (image over change
//! tracking over a file), alone and while a sync's cycles run on it: every cycle freezes
//! the change map and takes an image, a reader reads the image in 256 KiB units (as a
//! send does), then the image is released and the frozen set released. The writes are
//! 256 KiB at random places, as the DR lab's application's records.
//!
//! ```text
//! RSV_BENCH_DIR=/var/tmp cargo test -p backstore --release --test image_latency -- --ignored --nocapture
//! ```
//! `RSV_BENCH_DIR` is where the store, its map and the image's side file go (default: the
//! system's temporary directory); a real disk shows the change map's fsyncs, tmpfs does
//! not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backstore::{
    Backstore, ChangeMap, FileBackstore, ImageOptions, Imaged, NewMap, SidePlace, Tracked,
};

const SIZE: u64 = 64 << 20;
const RECORD: usize = 256 << 10;

fn pcts(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    format!(
        "p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.2} ms (n {})",
        at(0.5),
        at(0.99),
        at(0.999),
        v[v.len() - 1],
        v.len()
    )
}

/// A small xorshift: the places of the writes, the same every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
#[ignore]
fn write_latency_alone_and_while_cycles_run() {
    let base = std::env::var_os("RSV_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).unwrap();
    let file: Arc<dyn Backstore> =
        Arc::new(FileBackstore::open(dir.path().join("lun.img"), Some(SIZE), true, false).unwrap());
    file.write_at(&vec![7u8; SIZE as usize], 0).unwrap();
    let map = Arc::new(
        ChangeMap::open(
            dir.path().join("lun.changes"),
            SIZE,
            RECORD as u64,
            NewMap::Clean,
        )
        .unwrap(),
    );
    let tracked: Arc<dyn Backstore> = Arc::new(Tracked::new(file, map.clone()).unwrap());
    let imaged = Arc::new(
        Imaged::new(
            tracked,
            ImageOptions {
                side: SidePlace::File(dir.path().join("lun.image")),
                unit: backstore::image::DEFAULT_UNIT,
                limit: SIZE,
            },
        )
        .unwrap(),
    );
    let cycles_on = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    // The sync: a cycle every 500 ms while on, reading the image whole.
    let sync = {
        let (imaged, map, on, stop) =
            (imaged.clone(), map.clone(), cycles_on.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cycles = 0;
            let mut buf = vec![0u8; RECORD];
            while !stop.load(Ordering::Relaxed) {
                if !on.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                let started = Instant::now();
                let (image, frozen) = imaged.take_with(|| map.freeze()).unwrap();
                for at in (0..SIZE).step_by(RECORD) {
                    image.read_at(&mut buf, at).unwrap();
                }
                image.release();
                map.release(frozen.id()).unwrap();
                cycles += 1;
                if let Some(rest) = Duration::from_millis(500).checked_sub(started.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            cycles
        })
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let record = vec![1u8; RECORD];
    let mut run = |n: usize| {
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let at = rng.next() % (SIZE / RECORD as u64) * RECORD as u64;
            let t = Instant::now();
            imaged.write_at(&record, at).unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e3);
            // About the lab's 30 % of 800 Mbit/s: a record every 8-9 ms.
            std::thread::sleep(Duration::from_micros(8500));
        }
        lat
    };
    let alone = run(600);
    cycles_on.store(true, Ordering::Relaxed);
    let cycling = run(1200);
    stop.store(true, Ordering::Relaxed);
    let cycles = sync.join().unwrap();
    println!(
        "write latency, 256 KiB records, store in {}:",
        base.display()
    );
    println!("  alone:          {}", pcts(alone));
    println!("  with {cycles} cycles: {}", pcts(cycling));
}
