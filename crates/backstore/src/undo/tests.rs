//! The undo layer's rules against a model, with a crash injected at every step: after any
//! crash (and a crash during the roll back that follows), the store holds a whole image:
//! the one before the open cycle, or, for a crash during a commit, that one or the new.

use super::*;
use crate::RamBackstore;
use proptest::prelude::*;
use std::sync::atomic::AtomicI64;

const SIZE: u64 = 64 << 10;
const UNIT: u64 = 4096;

/// Steps left before the crash; every effect on the log or the store takes one.
#[derive(Clone, Debug)]
struct Budget(Arc<AtomicI64>);

impl Budget {
    fn new(steps: i64) -> Budget {
        Budget(Arc::new(AtomicI64::new(steps)))
    }
    fn step(&self) -> io::Result<()> {
        if self.0.fetch_sub(1, Ordering::SeqCst) <= 0 {
            Err(io::Error::other("crashed"))
        } else {
            Ok(())
        }
    }
    fn crashed(&self) -> bool {
        self.0.load(Ordering::SeqCst) < 0
    }
}

/// A log whose unsynced writes a crash loses (all, none, or the first part of each).
#[derive(Debug)]
struct CrashFile {
    durable: Arc<Mutex<Vec<u8>>>,
    volatile: Vec<u8>,
    budget: Budget,
}

impl UndoFile for CrashFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = (offset as usize).min(self.volatile.len());
        let n = buf.len().min(self.volatile.len() - s);
        buf[..n].copy_from_slice(&self.volatile[s..s + n]);
        Ok(n)
    }
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.budget.step()?;
        let end = offset as usize + buf.len();
        if self.volatile.len() < end {
            self.volatile.resize(end, 0);
        }
        self.volatile[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.budget.step()?;
        *self.durable.lock().unwrap() = self.volatile.clone();
        Ok(())
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.budget.step()?;
        self.volatile.resize(len as usize, 0);
        Ok(())
    }
}

/// What survives a crash of `file`: its durable bytes, with `keep` of what was not synced
/// (0: nothing, 1: all of it, 2: the first half of each differing byte run).
fn survivor(durable: &[u8], volatile: &[u8], keep: u8) -> Vec<u8> {
    match keep {
        0 => durable.to_vec(),
        1 => volatile.to_vec(),
        _ => {
            let mut out = durable.to_vec();
            let n = volatile.len().max(durable.len());
            out.resize(n, 0);
            let diff: Vec<usize> = (0..volatile.len())
                .filter(|&i| durable.get(i) != Some(&volatile[i]))
                .collect();
            for &i in &diff[..diff.len() / 2] {
                out[i] = volatile[i];
            }
            out.truncate(volatile.len().max(durable.len()));
            out
        }
    }
}

/// A store whose changes land at once (a crash keeps them, flushed or not: the worst
/// case for an undo log), each one a step.
#[derive(Debug)]
struct CrashStore {
    ram: Arc<RamBackstore>,
    budget: Mutex<Budget>,
}

impl CrashStore {
    fn step(&self) -> io::Result<()> {
        self.budget.lock().unwrap().step()
    }
}

impl Backstore for CrashStore {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.ram.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.step()?;
        self.ram.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.step()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.step()?;
        self.ram.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.step()?;
        self.ram.write_zeroes(offset, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        self.ram.is_allocated(offset, len)
    }
    fn supports_discard(&self) -> bool {
        true
    }
}

#[derive(Clone, Debug)]
enum Op {
    Open,
    Write { at: u64, len: u64, byte: u8 },
    Zero { at: u64, len: u64 },
    Discard { at: u64, len: u64 },
    Commit,
    RollBack,
}

fn op() -> impl Strategy<Value = Op> {
    let range = (0..SIZE, 1..20_000u64).prop_map(|(at, len)| (at, len.min(SIZE - at)));
    prop_oneof![
        2 => Just(Op::Open),
        6 => (range.clone(), 1..=255u8).prop_map(|((at, len), byte)| Op::Write { at, len, byte }),
        1 => range.clone().prop_map(|(at, len)| Op::Zero { at, len }),
        1 => range.prop_map(|(at, len)| Op::Discard { at, len }),
        2 => Just(Op::Commit),
        1 => Just(Op::RollBack),
    ]
}

struct Rig {
    ram: Arc<RamBackstore>,
    durable: Arc<Mutex<Vec<u8>>>,
}

impl Rig {
    fn new() -> Rig {
        Rig {
            ram: Arc::new(RamBackstore::new(SIZE)),
            durable: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The layer as a (re)started target opens it, `steps` effects from a crash, over
    /// the log bytes `log`.
    fn open(&self, log: Vec<u8>, steps: i64) -> (io::Result<Undo>, Budget) {
        let budget = Budget::new(steps);
        *self.durable.lock().unwrap() = log.clone();
        let file = CrashFile {
            durable: self.durable.clone(),
            volatile: log,
            budget: budget.clone(),
        };
        let store = Arc::new(CrashStore {
            ram: self.ram.clone(),
            budget: Mutex::new(budget.clone()),
        });
        (Undo::open(store, Box::new(file), UNIT), budget)
    }

    fn content(&self) -> Vec<u8> {
        let mut b = vec![0; SIZE as usize];
        self.ram.read_at(&mut b, 0).unwrap();
        b
    }
}

/// The log bytes a crash leaves from `undo`'s file.
fn crashed_log(rig: &Rig, undo: Undo, keep: u8) -> Vec<u8> {
    let log = Arc::try_unwrap(undo.shared)
        .expect("one handle")
        .log
        .into_inner()
        .unwrap();
    // The file's volatile bytes, read through its trait.
    let mut volatile = vec![0u8; 64 << 20];
    let n = log.file.read_at(&mut volatile, 0).unwrap();
    volatile.truncate(n);
    let durable = rig.durable.lock().unwrap().clone();
    survivor(&durable, &volatile, keep)
}

fn apply(undo: &Undo, op: &Op, cycle: &mut u64) -> io::Result<()> {
    match *op {
        Op::Open => {
            *cycle += 1;
            let o = undo.open_cycle(*cycle, *cycle * 1000)?;
            *cycle = o.id(*cycle);
            Ok(())
        }
        Op::Write { at, len, byte } => undo.write_at(&vec![byte; len as usize], at),
        Op::Zero { at, len } => undo.write_zeroes(at, len),
        Op::Discard { at, len } => undo.discard(at, len),
        Op::Commit => undo.commit(*cycle),
        Op::RollBack => undo.roll_back().map(|_| ()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// A run of cycles with a crash after `steps` effects, then a restart that may crash
    /// after `again` effects of its roll back, then one that does not: the store holds the
    /// image the model says is whole.
    #[test]
    fn a_crash_at_any_step_leaves_a_whole_image(
        ops in proptest::collection::vec(op(), 1..30),
        steps in 0..160i64,
        again in 0..40i64,
        keep in 0..3u8,
    ) {
        let rig = Rig::new();
        let (undo, budget) = rig.open(Vec::new(), steps);
        let Ok(undo) = undo else {
            // Crashed making the log: nothing was written to the store.
            prop_assert!(rig.content().iter().all(|&b| b == 0));
            return Ok(());
        };
        let mut live = vec![0u8; SIZE as usize];
        // The image before the open cycle, while one is open.
        let mut at_open: Option<Vec<u8>> = None;
        let mut cycle = 0u64;
        let mut committed = 0u64;
        // What the store may hold after recovery (any of these).
        let mut whole: Option<Vec<Vec<u8>>> = None;
        for o in &ops {
            let r = apply(&undo, o, &mut cycle);
            if budget.crashed() {
                whole = match o {
                    Op::Open | Op::RollBack => Some(vec![at_open.clone().unwrap_or(live.clone())]),
                    Op::Commit => Some(match &at_open {
                        // Rolled back, or committed: both whole.
                        Some(before) => vec![before.clone(), live.clone()],
                        None => vec![live.clone()],
                    }),
                    // A change with no cycle open has no guarantee; with one, the image
                    // before it.
                    _ => at_open.clone().map(|b| vec![b]),
                };
                break;
            }
            match *o {
                Op::Open => {
                    prop_assert!(r.is_ok(), "{r:?}");
                    // A cycle open already goes on: its image before stays the one.
                    if at_open.is_none() {
                        at_open = Some(live.clone());
                    }
                }
                Op::Write { at, len, byte } => {
                    prop_assert!(r.is_ok(), "{r:?}");
                    live[at as usize..(at + len) as usize].fill(byte);
                }
                Op::Zero { at, len } | Op::Discard { at, len } => {
                    prop_assert!(r.is_ok(), "{r:?}");
                    live[at as usize..(at + len) as usize].fill(0);
                }
                Op::Commit => {
                    // Asked again for the cycle committed last: no change, and fine.
                    let again = at_open.is_none() && committed == cycle && cycle != 0;
                    prop_assert_eq!(r.is_ok(), at_open.is_some() || again, "{:?}", r);
                    if at_open.take().is_some() {
                        committed = cycle;
                    }
                }
                Op::RollBack => {
                    prop_assert!(r.is_ok(), "{r:?}");
                    if let Some(before) = at_open.take() {
                        live = before;
                    }
                }
            }
            prop_assert_eq!(rig.content(), live.clone(), "after {:?}", o);
            prop_assert_eq!(undo.cycle_open(), at_open.as_ref().map(|_| cycle));
        }
        if !budget.crashed() {
            // Power lost at the end, nothing in flight.
            whole = Some(vec![at_open.clone().unwrap_or(live.clone())]);
        }
        let log = crashed_log(&rig, undo, keep);
        // A restart that crashes during its roll back, then one that does not.
        let (first, _) = rig.open(log.clone(), again);
        let log = match first {
            Ok(u) => crashed_log(&rig, u, keep),
            // The log went with the failed open: what it had synced survives.
            Err(_) => rig.durable.lock().unwrap().clone(),
        };
        let (last, _) = rig.open(log, i64::MAX);
        let last = last.expect("a restart with no crash opens");
        prop_assert_eq!(last.cycle_open(), None, "rolled back at start");
        if let Some(whole) = whole {
            let got = rig.content();
            prop_assert!(whole.contains(&got), "the store holds no whole image after {:?}", ops);
        }
    }
}

#[test]
fn a_committed_cycle_stays_and_an_open_one_goes_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.undo");
    let ram = Arc::new(RamBackstore::new(SIZE));
    let undo = Undo::open_file(ram.clone(), &path, UNIT).unwrap();
    undo.write_at(&[1; 10_000], 0).unwrap();
    undo.open_cycle(7, 7000).unwrap();
    undo.write_at(&[2; 5000], 3000).unwrap();
    undo.commit(7).unwrap();
    undo.commit(7).expect("a commit asked again is no change");
    assert_eq!(undo.state().committed, Some((7, 7000)));
    assert_eq!(undo.open_cycle(8, 7900).unwrap(), Opened::New);
    // Its coordinator gone, the next one's open goes on with it.
    undo.write_at(&[3; 100], 60_000).unwrap();
    assert_eq!(undo.open_cycle(9, 8000).unwrap(), Opened::Continued(8));
    undo.write_at(&[3; 20_000], 1000).unwrap();
    undo.discard(40_000, 8192).unwrap();
    assert_eq!(undo.cycle_open(), Some(8));
    // Units 0-2 held data (saved whole); 3-5, 9-11 and 14 zeros (saved as such).
    assert_eq!(
        undo.state().saved_bytes,
        3 * (UNIT + rules::RECORD_HEAD as u64) + 7 * rules::RECORD_HEAD as u64
    );
    assert!(matches!(undo.commit(9), Err(e) if e.kind() == io::ErrorKind::InvalidInput));
    drop(undo);
    // The target restarts: cycle 8 is rolled back before anything is served.
    let undo = Undo::open_file(ram.clone(), &path, UNIT).unwrap();
    assert_eq!(undo.cycle_open(), None);
    assert_eq!(undo.state().committed, Some((7, 7000)));
    assert_eq!(
        undo.state().rolled_back,
        Some(8),
        "remembered until a commit"
    );
    let mut b = vec![0u8; 10_000];
    undo.read_at(&mut b, 0).unwrap();
    let mut want = vec![1u8; 10_000];
    want[3000..8000].fill(2);
    assert_eq!(b, want);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), RECORDS_AT);
    undo.open_cycle(10, 10_000).unwrap();
    undo.commit(10).unwrap();
    assert_eq!(undo.state().rolled_back, None);
}

/// Three threads writing through `undo` for `time`: `write(undo, w, n)` is writer `w`'s
/// write number `n`.
fn write_for(undo: &Arc<Undo>, time: Duration, write: fn(&Undo, u64, u64)) {
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (undo, stop) = (undo.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    write(&undo, w, n);
                    n += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
}

#[test]
fn writes_with_no_cycle_save_nothing_and_concurrent_writers_are_safe() {
    let ram = Arc::new(RamBackstore::new(1 << 20));
    let undo = Arc::new(Undo::open(ram, Box::new(MemLog::default()), UNIT).unwrap());
    undo.write_at(&[9; 8192], 0).unwrap();
    assert_eq!(undo.state().saved_bytes, 0);
    let before = {
        let mut b = vec![0; 1 << 20];
        undo.read_at(&mut b, 0).unwrap();
        b
    };
    // Writers run while cycles open and roll back under them: whenever no write runs
    // and a cycle is rolled back, the store is the image at its open.
    write_for(&undo, Duration::from_millis(20), |undo, w, n| {
        let at = ((n * 7 + w * 13) % 120) * 8192;
        let _ = undo.write_at(&[(n % 200) as u8 + 1; 8192], at);
    });
    let mut image = vec![0; 1 << 20];
    undo.read_at(&mut image, 0).unwrap();
    assert_ne!(image, before);
    undo.open_cycle(1, 0).unwrap();
    write_for(&undo, Duration::from_millis(50), |undo, w, n| {
        let at = ((n * 5 + w * 11) % 120) * 8192 + 100;
        undo.write_at(&[(n % 200) as u8 + 1; 9000], at).unwrap();
    });
    assert_eq!(undo.roll_back().unwrap(), Some(1));
    let mut after = vec![0; 1 << 20];
    undo.read_at(&mut after, 0).unwrap();
    assert!(
        after == image,
        "the roll back restored the image at the open"
    );
}

#[test]
fn is_hole_needs_the_whole_unit_unallocated() {
    use rules::is_hole;
    let map = [(0, 100, true), (100, 200, false), (300, 50, true)];
    assert!(is_hole(&map, 100, 300));
    assert!(is_hole(&map, 150, 250));
    assert!(!is_hole(&map, 50, 150), "part allocated");
    assert!(!is_hole(&map, 250, 310), "ends in an allocated extent");
    assert!(!is_hole(&[], 0, 10), "no answer: read it");
    assert!(!is_hole(&[(0, 50, false)], 0, 100), "the map stops short");
    assert!(!is_hole(&[(10, 90, false)], 0, 100), "the map starts late");
    assert!(is_hole(&[(0, 40, false), (40, 60, false)], 0, 100));
}

#[test]
fn kind_of_finds_zeros_to_the_last_byte() {
    use rules::{kind_of, Kind};
    assert_eq!(kind_of(&[0; 65536]), Kind::Zeros);
    assert_eq!(kind_of(&[0; 4099]), Kind::Zeros);
    for at in [0, 15, 16, 4095, 4098] {
        let mut b = vec![0u8; 4099];
        b[at] = 1;
        assert_eq!(kind_of(&b), Kind::Data, "a byte at {at}");
    }
}

/// A data record is byte for byte what the first format wrote (so a log written before
/// hole records existed still rolls back); hole and zero records read back as written,
/// and a head whose kind was changed does not check.
#[test]
fn records_of_each_kind_read_back_and_old_ones_still_read() {
    use rules::{Kind, RecordHead};
    let data = [7u8; 4096];
    let h = RecordHead::new(5, 3, &data);
    // The first format, written out by hand: magic, cycle, unit, len, crc32c of cycle,
    // unit, len and data.
    let mut old = Vec::new();
    old.extend_from_slice(&0x5253_5655u32.to_le_bytes());
    old.extend_from_slice(&5u64.to_le_bytes());
    old.extend_from_slice(&3u64.to_le_bytes());
    old.extend_from_slice(&4096u32.to_le_bytes());
    let mut summed = Vec::new();
    summed.extend_from_slice(&5u64.to_le_bytes());
    summed.extend_from_slice(&3u64.to_le_bytes());
    summed.extend_from_slice(&4096u32.to_le_bytes());
    summed.extend_from_slice(&data);
    old.extend_from_slice(&crc32c::crc32c(&summed).to_le_bytes());
    assert_eq!(h.encode().as_slice(), old.as_slice());
    let back = RecordHead::decode(&old).unwrap();
    assert_eq!(back.kind, Kind::Data);
    assert!(back.holds(&data));
    for kind in [Kind::Hole, Kind::Zeros] {
        let h = RecordHead::empty(kind, 5, 3, 4096);
        let back = RecordHead::decode(&h.encode()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.data_len(), 0);
        assert!(back.holds(&[]));
        assert!(!back.holds(&data));
        // A head torn into another kind fails its checksum.
        let mut other = h.encode();
        let flip = if kind == Kind::Hole {
            Kind::Zeros
        } else {
            Kind::Hole
        };
        let flip_magic = RecordHead::empty(flip, 5, 3, 4096).encode();
        other[..4].copy_from_slice(&flip_magic[..4]);
        assert!(!RecordHead::decode(&other).unwrap().holds(&[]));
    }
}

/// Extents `(offset, len, allocated)` of `store`, merged.
fn allocation_of(store: &dyn Backstore, offset: u64, len: u64) -> Vec<(u64, u64, bool)> {
    store.is_allocated(offset, len).unwrap()
}

fn unallocated(store: &dyn Backstore, offset: u64, len: u64) -> bool {
    rules::is_hole(&allocation_of(store, offset, len), offset, offset + len)
}

/// A cycle over a partly sparse file store (units of data, units of zeros written, holes)
/// that writes over every kind and is then rolled back: the store reads as before, byte
/// for byte, the holes are holes again, and the log kept bytes only for the units that
/// held data. (With a hole rolled back as "nothing to do" the units written over holes
/// keep the cycle's bytes and this fails.) Then the same after a restart, as a target
/// that crashed with the cycle open rolls back.
#[test]
fn a_cycle_over_a_sparse_file_rolls_back_to_its_holes_zeros_and_data() {
    const U: u64 = DEFAULT_UNIT;
    const N: u64 = 16;
    let dir = tempfile::tempdir().unwrap();
    let file: Arc<dyn Backstore> = Arc::new(
        crate::FileBackstore::open(dir.path().join("lun"), Some(N * U), true, false).unwrap(),
    );
    assert!(
        unallocated(&*file, 0, N * U),
        "the file system under {} reports no holes: this test cannot check them",
        dir.path().display()
    );
    // Units 0-3 data, 4-5 zeros written (allocated), 6-15 holes.
    let data: Vec<u8> = (0..4 * U).map(|i| (i % 251) as u8 + 1).collect();
    file.write_at(&data, 0).unwrap();
    file.write_at(&vec![0; 2 * U as usize], 4 * U).unwrap();
    assert!(
        !unallocated(&*file, 4 * U, 2 * U),
        "zeros written are allocated"
    );
    let mut before = vec![0u8; (N * U) as usize];
    file.read_at(&mut before, 0).unwrap();
    let map_before = allocation_of(&*file, 0, N * U);

    let log = dir.path().join("lun.undo");
    for restart in [false, true] {
        let undo = Undo::open_file(file.clone(), &log, U).unwrap();
        undo.open_cycle(1 + restart as u64, 1000).unwrap();
        // Over data (2-3), zeros (4-5) and holes (6-8); 4 KiB inside a hole (10);
        // zeros written over a hole (12); data unmapped (1).
        undo.write_at(&vec![0xAB; 7 * U as usize], 2 * U).unwrap();
        undo.write_at(&[0xCD; 4096], 10 * U + 4096).unwrap();
        undo.write_zeroes(12 * U, U).unwrap();
        undo.discard(U, U).unwrap();
        let mut during = vec![0u8; (N * U) as usize];
        undo.read_at(&mut during, 0).unwrap();
        assert_ne!(
            during, before,
            "the cycle changed nothing: the test proves nothing"
        );
        assert!(!unallocated(&*file, 6 * U, 3 * U));
        // Data kept for units 1-3 only; 7 more records with no bytes.
        let saved = undo.state().saved_bytes;
        let heads = rules::RECORD_HEAD as u64;
        assert_eq!(saved, 3 * (heads + U) + 7 * heads, "saved {saved} bytes");
        if restart {
            // A crash with the cycle open: the next open rolls it back.
            drop(undo);
            let undo = Undo::open_file(file.clone(), &log, U).unwrap();
            assert_eq!(undo.state().rolled_back, Some(2));
        } else {
            assert_eq!(undo.roll_back().unwrap(), Some(1));
        }
        let mut after = vec![0u8; (N * U) as usize];
        file.read_at(&mut after, 0).unwrap();
        if let Some(at) = after.iter().zip(&before).position(|(a, b)| a != b) {
            panic!(
                "after the roll back (restart: {restart}) byte {at} (unit {}) is {:#x}, was {:#x}",
                at as u64 / U,
                after[at],
                before[at]
            );
        }
        for u in 6..N {
            assert!(
                unallocated(&*file, u * U, U),
                "unit {u} was a hole and is allocated after the roll back (restart: {restart})"
            );
        }
        assert_eq!(allocation_of(&*file, 0, N * U), map_before);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), RECORDS_AT);
    }
}
