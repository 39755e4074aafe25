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
    /// Shared with the syncs the group's leader runs without the log's lock.
    volatile: Arc<Mutex<Vec<u8>>>,
    budget: Budget,
    /// Syncs made, and how long each takes (none: at once).
    syncs: Arc<AtomicI64>,
    slow: Option<Duration>,
}

impl CrashFile {
    fn new(durable: Arc<Mutex<Vec<u8>>>, log: Vec<u8>, budget: Budget) -> CrashFile {
        CrashFile {
            durable,
            volatile: Arc::new(Mutex::new(log)),
            budget,
            syncs: Arc::new(AtomicI64::new(0)),
            slow: None,
        }
    }
}

impl UndoFile for CrashFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let v = self.volatile.lock().unwrap();
        let s = (offset as usize).min(v.len());
        let n = buf.len().min(v.len() - s);
        buf[..n].copy_from_slice(&v[s..s + n]);
        Ok(n)
    }
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.budget.step()?;
        let mut v = self.volatile.lock().unwrap();
        let end = offset as usize + buf.len();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[offset as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        (self.syncer()?)()
    }
    fn syncer(&mut self) -> io::Result<Syncer> {
        let (budget, volatile, durable) = (
            self.budget.clone(),
            self.volatile.clone(),
            self.durable.clone(),
        );
        let (syncs, slow) = (self.syncs.clone(), self.slow);
        Ok(Box::new(move || {
            budget.step()?;
            // What was written before the sync began is what it makes durable (at least).
            let now = volatile.lock().unwrap().clone();
            if let Some(d) = slow {
                std::thread::sleep(d);
            }
            syncs.fetch_add(1, Ordering::SeqCst);
            *durable.lock().unwrap() = now;
            Ok(())
        }))
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.budget.step()?;
        self.volatile.lock().unwrap().resize(len as usize, 0);
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
    Prepare,
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
        1 => Just(Op::Prepare),
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
        let file = CrashFile::new(self.durable.clone(), log, budget.clone());
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
        Op::Prepare => undo.prepare(*cycle),
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
                    Op::Open | Op::RollBack | Op::Prepare => {
                        Some(vec![at_open.clone().unwrap_or(live.clone())])
                    }
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
                Op::Prepare => {
                    prop_assert_eq!(r.is_ok(), at_open.is_some(), "{:?}", r);
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
        // A prepared cycle is kept at start (another member may have committed it); its
        // records must still bring the image before it back.
        if let Some(c) = last.cycle_open() {
            prop_assert_eq!(last.state().prepared, Some(c), "only a prepared cycle is kept");
            prop_assert_eq!(last.roll_back().unwrap(), Some(c));
        }
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
fn a_prepared_cycle_is_kept_at_restart_then_commits_or_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.undo");
    let ram = Arc::new(RamBackstore::new(SIZE));
    let undo = Undo::open_file(ram.clone(), &path, UNIT).unwrap();
    undo.write_at(&[1; 20_000], 0).unwrap();
    undo.open_cycle(3, 3000).unwrap();
    undo.commit(3).unwrap();
    assert!(
        matches!(undo.prepare(4), Err(e) if e.kind() == io::ErrorKind::InvalidInput),
        "nothing open to prepare"
    );
    undo.open_cycle(4, 4000).unwrap();
    undo.write_at(&[2; 9000], 5000).unwrap();
    assert_eq!(undo.state().prepared, None);
    assert!(matches!(undo.prepare(5), Err(e) if e.kind() == io::ErrorKind::InvalidInput));
    undo.prepare(4).unwrap();
    undo.prepare(4).expect("asked again: no change");
    assert_eq!(undo.state().prepared, Some(4));
    drop(undo);
    // Restarted: the prepared cycle stays open, whole, and the next open goes on with it.
    let undo = Undo::open_file(ram.clone(), &path, UNIT).unwrap();
    assert_eq!(undo.cycle_open(), Some(4));
    assert_eq!(undo.state().prepared, Some(4));
    let mut b = vec![0u8; 20_000];
    undo.read_at(&mut b, 0).unwrap();
    assert!(
        b[5000..14_000].iter().all(|&x| x == 2),
        "kept, not rolled back"
    );
    // A change after the restart still saves its unit first.
    undo.write_at(&[3; 100], 30_000).unwrap();
    assert_eq!(undo.open_cycle(9, 9000).unwrap(), Opened::Continued(4));
    assert_eq!(undo.state().prepared, None, "going on: prepared no more");
    drop(undo);
    // Not prepared any more: a restart rolls it back, the unit written after the first
    // restart included.
    let undo = Undo::open_file(ram.clone(), &path, UNIT).unwrap();
    assert_eq!(undo.cycle_open(), None);
    assert_eq!(undo.state().rolled_back, Some(4));
    undo.read_at(&mut b, 0).unwrap();
    assert!(b.iter().all(|&x| x == 1), "the image of cycle 3");
    let mut c = vec![9u8; 100];
    undo.read_at(&mut c, 30_000).unwrap();
    assert!(c.iter().all(|&x| x == 0));
    // Prepared, then committed after a restart.
    undo.open_cycle(10, 10_000).unwrap();
    undo.write_at(&[5; 4096], 0).unwrap();
    undo.prepare(10).unwrap();
    drop(undo);
    let undo = Undo::open_file(ram.clone(), &path, UNIT).unwrap();
    undo.commit(10).unwrap();
    assert_eq!(undo.state().committed, Some((10, 10_000)));
    assert_eq!(undo.state().prepared, None);
    undo.read_at(&mut b, 0).unwrap();
    assert!(b[..4096].iter().all(|&x| x == 5));
}

#[test]
fn a_log_of_the_first_format_still_reads() {
    // A header as the first format wrote it (no prepared state): an open cycle in it is
    // still found, and rolled back at start.
    let h = Header {
        seq: 1,
        open: 6,
        unit: UNIT,
        size: SIZE,
        ..Header::default()
    };
    let mut v1 = b"RSVUNDO1".to_vec();
    for v in [h.seq, h.open, 0, 0, 0, h.unit, h.size, 0] {
        v1.extend_from_slice(&v.to_le_bytes());
    }
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(Header::decode(&v1), Some(h));
    assert_eq!(rules::at_start(&h), rules::AtStart::RollBack { cycle: 6 });
    let prepared = Header { prepared: 6, ..h };
    assert_eq!(Header::decode(&prepared.encode()), Some(prepared));
    assert_eq!(
        rules::at_start(&prepared),
        rules::AtStart::Keep { cycle: 6 }
    );
}

#[test]
fn pieces_cut_runs_of_consecutive_units() {
    assert_eq!(
        rules::pieces(&[1, 2, 3, 5, 6, 9], 2),
        vec![(1, 2), (3, 1), (5, 2), (9, 1)]
    );
    assert_eq!(rules::pieces(&[4, 5, 6, 7], 16), vec![(4, 4)]);
    assert!(rules::pieces(&[], 16).is_empty());
    assert_eq!(
        rules::pieces(&[0, 1], 0),
        vec![(0, 1), (1, 1)],
        "at least one a piece"
    );
}

#[test]
fn a_roll_back_marks_the_units_it_restores_in_the_change_map() {
    let dir = tempfile::tempdir().unwrap();
    let ram = Arc::new(RamBackstore::new(SIZE));
    let map = Arc::new(
        ChangeMap::open(dir.path().join("map"), SIZE, 4096, crate::NewMap::Clean).unwrap(),
    );
    // No tracking layer under the undo layer here: only the roll back marks.
    let undo = Undo::open_with(
        ram.clone(),
        Box::new(MemLog::default()),
        8192,
        Some(map.clone()),
    )
    .unwrap();
    undo.open_cycle(1, 0).unwrap();
    undo.write_at(&[7; 100], 8192 * 2 + 10).unwrap();
    undo.write_at(&[7; 8192], 8192 * 5).unwrap();
    undo.write_at(&[7; 10], 8192 * 6).unwrap();
    assert!(
        map.dirty_units().is_empty(),
        "the cycle's writes mark nothing here"
    );
    undo.roll_back().unwrap();
    // Units of 8 KiB restored: 2, 5 and 6, that is map units (4 KiB) 4-5 and 10-13.
    assert_eq!(map.dirty_units(), vec![4..6, 10..14]);
}

#[test]
fn one_sync_covers_every_writer_whose_records_were_written_before_it() {
    let mut g = Group::new(RECORDS_AT);
    assert_eq!(g.turn(0), Turn::Go, "a writer that saved nothing goes on");
    // A appends and leads; B and C append while A's sync runs, and wait.
    g.appended(RECORDS_AT + 100);
    assert_eq!(
        g.turn(RECORDS_AT + 100),
        Turn::Sync {
            upto: RECORDS_AT + 100
        }
    );
    g.appended(RECORDS_AT + 200);
    g.appended(RECORDS_AT + 300);
    assert_eq!(g.turn(RECORDS_AT + 200), Turn::Wait);
    assert_eq!(g.turn(RECORDS_AT + 300), Turn::Wait);
    assert_eq!(
        g.turn(RECORDS_AT + 100),
        Turn::Wait,
        "not before its sync returns"
    );
    g.synced(RECORDS_AT + 100);
    assert_eq!(g.turn(RECORDS_AT + 100), Turn::Go);
    // A's sync began before B's and C's records were written: it does not cover them.
    // B leads one sync for both.
    assert_eq!(
        g.turn(RECORDS_AT + 200),
        Turn::Sync {
            upto: RECORDS_AT + 300
        }
    );
    assert_eq!(g.turn(RECORDS_AT + 300), Turn::Wait);
    g.synced(RECORDS_AT + 300);
    assert_eq!(g.turn(RECORDS_AT + 200), Turn::Go);
    assert_eq!(g.turn(RECORDS_AT + 300), Turn::Go);
    assert_eq!(g.syncs(), 2, "three writers, two syncs");
}

#[test]
fn a_failed_sync_fails_every_writer_it_did_not_cover_for_good() {
    let mut g = Group::new(RECORDS_AT);
    g.appended(RECORDS_AT + 10);
    assert!(matches!(g.turn(RECORDS_AT + 10), Turn::Sync { .. }));
    g.synced(RECORDS_AT + 10);
    g.appended(RECORDS_AT + 20);
    g.appended(RECORDS_AT + 30);
    assert!(matches!(g.turn(RECORDS_AT + 20), Turn::Sync { .. }));
    assert_eq!(g.turn(RECORDS_AT + 30), Turn::Wait);
    g.sync_failed();
    assert_eq!(g.turn(RECORDS_AT + 20), Turn::Fail);
    assert_eq!(
        g.turn(RECORDS_AT + 30),
        Turn::Fail,
        "no second try after a failure"
    );
    assert_eq!(
        g.turn(RECORDS_AT + 10),
        Turn::Go,
        "durable before the failure"
    );
    // Records never written whole cannot be waited for.
    let mut g = Group::new(RECORDS_AT);
    g.appended(RECORDS_AT + 10);
    assert_eq!(g.turn(RECORDS_AT + 11), Turn::Fail);
}

proptest! {
    /// Writers appending, asking and syncing in any interleaving: a writer goes on only
    /// once a sync that began after its records were written has returned; one sync runs
    /// at a time; every writer goes on in the end.
    #[test]
    fn the_group_lets_no_writer_go_before_a_sync_that_covers_it(
        steps in proptest::collection::vec((0..6usize, 0..3u8), 1..200),
    ) {
        let mut g = Group::new(0);
        let mut end = 0u64;
        // Each writer: where its records end (once appended), whether it went on.
        let mut need: [Option<u64>; 6] = [None; 6];
        let mut gone = [false; 6];
        // The sync running: its upto, taken when it began.
        let mut running: Option<u64> = None;
        let mut durable = 0u64;
        for (w, what) in steps {
            match what {
                0 if need[w].is_none() => {
                    end += 1 + w as u64;
                    g.appended(end);
                    need[w] = Some(end);
                }
                1 if need[w].is_some() && !gone[w] => match g.turn(need[w].unwrap()) {
                    Turn::Go => {
                        prop_assert!(need[w].unwrap() <= durable);
                        gone[w] = true;
                    }
                    Turn::Sync { upto } => {
                        prop_assert!(running.is_none(), "two syncs at once");
                        prop_assert_eq!(upto, end, "a sync covers all appended");
                        running = Some(upto);
                    }
                    Turn::Wait => prop_assert!(running.is_some()),
                    Turn::Fail => prop_assert!(false, "no sync failed"),
                },
                2 => {
                    if let Some(upto) = running.take() {
                        g.synced(upto);
                        durable = upto;
                    }
                }
                _ => {}
            }
        }
        // Then every writer that appended asks until it goes on.
        for _ in 0..20 {
            if let Some(upto) = running.take() {
                g.synced(upto);
            }
            for (n, gone) in need.iter().zip(gone.iter_mut()) {
                if let (Some(n), false) = (*n, *gone) {
                    match g.turn(n) {
                        Turn::Go => *gone = true,
                        Turn::Sync { upto } => running = Some(upto),
                        Turn::Wait => {}
                        Turn::Fail => prop_assert!(false),
                    }
                }
            }
        }
        for (n, gone) in need.iter().zip(gone) {
            prop_assert_eq!(gone, n.is_some());
        }
    }
}

/// Eight writers' first changes in one cycle, over a log whose syncs take a while (so that
/// saves group), crashing after `steps` effects of log and store (never, with `None`) and
/// losing what the log had not synced as `keep` says; then a restart. Returns the image
/// before the cycle, the store after the restart, the syncs and the units saved (with no
/// crash).
fn concurrent_first_writes(steps: Option<i64>, keep: u8) -> (Vec<u8>, Vec<u8>, i64, u64) {
    const BIG: u64 = 1 << 20;
    let ram = Arc::new(RamBackstore::new(BIG));
    let before: Vec<u8> = (0..BIG).map(|i| (i * 7 % 251) as u8).collect();
    ram.write_at(&before, 0).unwrap();
    let durable = Arc::new(Mutex::new(Vec::new()));
    let budget = Budget::new(i64::MAX);
    let mut file = CrashFile::new(durable.clone(), Vec::new(), budget.clone());
    file.slow = Some(Duration::from_micros(300));
    let syncs = file.syncs.clone();
    let store = Arc::new(CrashStore {
        ram: ram.clone(),
        budget: Mutex::new(budget.clone()),
    });
    let undo = Arc::new(Undo::open(store, Box::new(file), UNIT).unwrap());
    undo.open_cycle(1, 1000).unwrap();
    if let Some(s) = steps {
        budget.0.store(s, Ordering::SeqCst);
    }
    let start = Arc::new(std::sync::Barrier::new(8));
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let (undo, start) = (undo.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for n in 0..8u64 {
                    // Writes of one to three units, some shared with other writers, some
                    // across a unit's edge, one of them a zeroing.
                    let at = ((w * 37 + n * 53) % 250) * UNIT + (n % 3) * 1000;
                    let len = UNIT * (1 + (w + n) % 3) - 500;
                    let len = len.min(BIG - at);
                    let r = if n == 5 {
                        undo.write_zeroes(at, len)
                    } else {
                        undo.write_at(&vec![(w * 8 + n) as u8 | 1; len as usize], at)
                    };
                    if r.is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    for t in writers {
        t.join().unwrap();
    }
    let saved = undo.state().saved_units;
    let undo = Arc::try_unwrap(undo).expect("the writers are done");
    let log = {
        let log = Arc::try_unwrap(undo.shared)
            .expect("one handle")
            .log
            .into_inner()
            .unwrap();
        let mut volatile = vec![0u8; 64 << 20];
        let n = log.file.read_at(&mut volatile, 0).unwrap();
        volatile.truncate(n);
        let d = durable.lock().unwrap().clone();
        // With no crash, the power is lost at the end: what was not synced may go too.
        survivor(&d, &volatile, keep)
    };
    let file = CrashFile::new(durable, log, Budget::new(i64::MAX));
    let undo = Undo::open(ram.clone(), Box::new(file), UNIT).expect("restart");
    assert_eq!(undo.cycle_open(), None, "rolled back at start");
    let mut after = vec![0u8; BIG as usize];
    ram.read_at(&mut after, 0).unwrap();
    (before, after, syncs.load(Ordering::SeqCst), saved)
}

#[test]
fn concurrent_first_writes_in_one_cycle_all_roll_back_exactly() {
    let (before, after, syncs, saved) = concurrent_first_writes(None, 0);
    let differ = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert!(differ == 0, "{differ} bytes not rolled back");
    eprintln!("{saved} units saved in {syncs} syncs of the log");
    assert!(saved > 60, "the writers saved {saved} units");
    // The open's header took one sync; the records the rest. Eight writers released at
    // once over syncs of 300 µs: they must have shared some.
    assert!(
        syncs - 1 < saved as i64,
        "{saved} units saved in {} syncs: none grouped",
        syncs - 1
    );
}

#[test]
fn concurrent_first_writes_roll_back_exactly_after_a_crash_at_any_step() {
    for steps in (0..200).step_by(3) {
        for keep in 0..3u8 {
            let (before, after, _, _) = concurrent_first_writes(Some(steps), keep);
            let differ = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            assert!(
                differ == 0,
                "crash after {steps} effects, keep {keep}: {differ} bytes not rolled back"
            );
        }
    }
}

/// A store that completes writes on threads of its own (as librbd's does).
#[derive(Debug)]
struct AsyncStore {
    inner: RamBackstore,
}

impl Backstore for AsyncStore {
    crate::forward! { inner =>
        size, read_at, write_at, flush, discard, write_zeroes, is_allocated, supports_discard,
    }
    fn writes_async(&self) -> bool {
        true
    }
}

#[test]
fn writes_go_to_a_blocking_worker_while_a_cycle_is_open() {
    let undo = Undo::open(
        Arc::new(AsyncStore {
            inner: RamBackstore::new(SIZE),
        }),
        Box::new(MemLog::default()),
        UNIT,
    )
    .unwrap();
    assert!(undo.writes_async(), "no cycle: as the store says");
    undo.open_cycle(3, 0).unwrap();
    assert!(!undo.writes_async(), "a save may wait for a sync");
    undo.commit(3).unwrap();
    assert!(undo.writes_async());
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
