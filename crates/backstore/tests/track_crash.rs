//! Change tracking against SIGKILL: a child process (this test binary again, with
//! `RSV_TRACK_CRASH_DIR` set) writes random blocks through `Tracked` over a file store from
//! several threads, freezing and releasing now and then, and says on stdout what it is
//! doing; the parent kills it at a random moment (or just as a freeze starts), reopens the
//! map, and checks that nothing written can be missed by a sync:
//! - every write the child finished (its `write_at` returned) has its units dirty, unless
//!   a frozen set holding them was (maybe) released after the write began;
//! - every unit of the store that holds data (any write's bytes, finished or not) is dirty,
//!   unless it is in a frozen set that was (maybe) released: the mark comes before the
//!   data, so data without a mark is a change a sync would never send.
//!
//! Lines (each written whole, after an `@`): `S` ready; `B SEQ OFFSET LEN` before a write, `E SEQ` after;
//! `FB` before a freeze, `F ID A-B,C-D` after, with its units; `RB ID` before a release.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backstore::{Backstore, ChangeMap, FileBackstore, NewMap, Tracked};

const DIR_VAR: &str = "RSV_TRACK_CRASH_DIR";
const SEED_VAR: &str = "RSV_TRACK_CRASH_SEED";
const SIZE: u64 = 256 << 20;
const UNIT: u64 = 4096;

/// xorshift64*: enough randomness for offsets, and no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("@{line}\n").as_bytes());
    let _ = out.flush();
}

fn paths(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    (dir.join("lun.img"), dir.join("lun.img.changes"))
}

/// The child: writes and freezes until it is killed. A test only in name: without the
/// variable it returns at once.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_VAR).unwrap().parse().unwrap();
    let (img, map_path) = paths(Path::new(&dir));
    let store: Arc<dyn Backstore> =
        Arc::new(FileBackstore::open(&img, Some(SIZE), true, false).unwrap());
    let map = Arc::new(ChangeMap::open(&map_path, SIZE, UNIT, NewMap::Clean).unwrap());
    let tracked = Arc::new(Tracked::new(store, map.clone()).unwrap());
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    say("S");
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (tracked, seq) = (tracked.clone(), seq.clone());
            s.spawn(move || {
                let mut rng = Rng(seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                loop {
                    let n = seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let len = 512 * (1 + rng.below(128));
                    let off = 512 * rng.below((SIZE - len) / 512);
                    let data = vec![(n % 251) as u8 + 1; len as usize];
                    say(&format!("B {n} {off} {len}"));
                    tracked.write_at(&data, off).unwrap();
                    say(&format!("E {n}"));
                }
            });
        }
        let mut rng = Rng(seed.rotate_left(17) | 1);
        loop {
            std::thread::sleep(Duration::from_micros(rng.below(20_000)));
            say("FB");
            let f = map.freeze().unwrap();
            let units: Vec<String> = f
                .units()
                .iter()
                .map(|r| format!("{}-{}", r.start, r.end))
                .collect();
            say(&format!("F {} {}", f.id(), units.join(",")));
            // The sync, which fails every third time.
            std::thread::sleep(Duration::from_micros(rng.below(5_000)));
            if rng.below(3) != 0 {
                say(&format!("RB {}", f.id()));
                map.release(f.id()).unwrap();
            }
        }
    });
}

/// What the child said before it died.
#[derive(Default)]
struct Log {
    /// seq → (offset, len, line of `B`, finished)
    writes: HashMap<u64, (u64, u64, usize, bool)>,
    /// id → (line of `F`, its units)
    frozen: HashMap<u64, (usize, BTreeSet<u64>)>,
    /// ids whose release began
    released: Vec<u64>,
    finished: usize,
    freezes: usize,
}

impl Log {
    fn read(&mut self, i: usize, line: &str) {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |k: usize| f[k].parse::<u64>().unwrap();
        match f[0] {
            "B" => {
                self.writes.insert(num(1), (num(2), num(3), i, false));
            }
            "E" => {
                self.writes.get_mut(&num(1)).unwrap().3 = true;
                self.finished += 1;
            }
            "F" => {
                let mut units = BTreeSet::new();
                for r in f.get(2).unwrap_or(&"").split(',').filter(|r| !r.is_empty()) {
                    let (a, b) = r.split_once('-').unwrap();
                    units.extend(a.parse::<u64>().unwrap()..b.parse::<u64>().unwrap());
                }
                self.frozen.insert(num(1), (i, units));
                self.freezes += 1;
            }
            "RB" => self.released.push(num(1)),
            "S" | "FB" => {}
            other => panic!("child said {other:?}"),
        }
    }

    /// Whether unit `u`, written by a write that began on line `began`, may have been
    /// sent and forgotten.
    fn maybe_released(&self, u: u64, began: usize) -> bool {
        self.released.iter().any(|id| {
            let (line, units) = &self.frozen[id];
            *line > began && units.contains(&u)
        })
    }

    /// Whether unit `u` is in a frozen set whose release began.
    fn in_released_set(&self, u: u64) -> bool {
        self.released
            .iter()
            .any(|id| self.frozen[id].1.contains(&u))
    }
}

enum Kill {
    /// After this long.
    After(Duration),
    /// As a freeze starts, once this many writes have finished.
    AtFreeze(usize),
}

fn round(seed: u64, kill: Kill) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(DIR_VAR, dir.path())
        .env(SEED_VAR, seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut out = BufReader::new(out);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match out.read_until(b'\n', &mut buf) {
                // A line cut short by the kill is no line.
                Ok(0) | Err(_) => break,
                Ok(_) if buf.ends_with(b"\n") => {
                    // Ours start at `@`; the test harness says things too.
                    let line = String::from_utf8_lossy(&buf[..buf.len() - 1]);
                    let Some((_, ours)) = line.split_once('@') else {
                        continue;
                    };
                    if tx.send(ours.to_owned()).is_err() {
                        break;
                    }
                }
                Ok(_) => break,
            }
        }
    });
    let mut lines = Vec::new();
    let mut started = None;
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < give_up, "the child never got to the kill");
        let line = match rx.recv_timeout(Duration::from_millis(1)) {
            Ok(l) => Some(l),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the child died by itself"),
        };
        let now = Instant::now();
        if let Some(l) = &line {
            if l == "S" {
                started = Some(now);
            }
            lines.push(l.clone());
        }
        let due = match &kill {
            Kill::After(d) => started.is_some_and(|s| now >= s + *d),
            Kill::AtFreeze(n) => {
                line.as_deref() == Some("FB")
                    && lines.iter().filter(|l| l.starts_with("E ")).count() >= *n
            }
        };
        if due {
            child.kill().unwrap();
            break;
        }
    }
    child.wait().unwrap();
    lines.extend(rx.iter());
    reader.join().unwrap();

    let mut log = Log::default();
    for (i, l) in lines.iter().enumerate() {
        log.read(i, l);
    }
    let (img, map_path) = paths(dir.path());
    let map = ChangeMap::open(&map_path, SIZE, UNIT, NewMap::AllDirty).unwrap();
    assert_eq!(
        map.recovery(),
        None,
        "a kill must leave a map that needs no recovery"
    );

    let mut checked = 0;
    for &(off, len, began, finished) in log.writes.values() {
        if !finished {
            continue;
        }
        for u in off / UNIT..(off + len).div_ceil(UNIT) {
            if !log.maybe_released(u, began) {
                assert!(
                    map.is_dirty(u),
                    "seed {seed}: a finished write of {off}+{len} changed unit {u}, not marked"
                );
                checked += 1;
            }
        }
    }

    let store = FileBackstore::open(&img, None, false, true).unwrap();
    let mut with_data = 0;
    let mut buf = vec![0u8; UNIT as usize];
    for (at, len, allocated) in store.is_allocated(0, SIZE).unwrap() {
        if !allocated {
            continue;
        }
        for u in at / UNIT..(at + len).div_ceil(UNIT) {
            store.read_at(&mut buf, u * UNIT).unwrap();
            if buf.iter().any(|&b| b != 0) && !log.in_released_set(u) {
                with_data += 1;
                assert!(
                    map.is_dirty(u),
                    "seed {seed}: unit {u} holds written data but is not marked"
                );
            }
        }
    }
    eprintln!(
        "seed {seed}: {} writes finished, {} freezes, {} releases begun; {checked} units of \
         finished writes and {with_data} units with data found marked; {} bytes dirty",
        log.finished,
        log.freezes,
        log.released.len(),
        map.dirty_bytes()
    );
    assert!(log.finished > 0, "the child wrote nothing before the kill");
    assert!(map.dirty_bytes() < SIZE, "everything dirty proves nothing");
}

#[test]
fn killed_writers_lose_no_change() {
    if std::env::var_os(DIR_VAR).is_some() {
        return;
    }
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut rng = Rng(base | 1);
    for r in 0..8 {
        let seed = rng.next();
        let kill = match r % 4 {
            0 | 2 => Kill::After(Duration::from_millis(20 + rng.below(300))),
            1 => Kill::AtFreeze(10),
            _ => Kill::AtFreeze(100),
        };
        round(seed, kill);
    }
}
