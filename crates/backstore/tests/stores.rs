use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use backstore::{Backstore, FileBackstore, RamBackstore};

const MIB: u64 = 1 << 20;

fn stores(dir: &tempfile::TempDir) -> Vec<Arc<dyn Backstore>> {
    vec![
        Arc::new(RamBackstore::new(8 * MIB)),
        Arc::new(
            FileBackstore::open(dir.path().join("sub/lun.img"), Some(8 * MIB), true, false)
                .unwrap(),
        ),
    ]
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn concurrent_writers_to_distinct_regions_read_back() {
    let dir = tempfile::tempdir().unwrap();
    for store in stores(&dir) {
        // Regions straddle the ram store's chunk boundaries on purpose.
        let region = 3 * MIB / 8;
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let store = store.clone();
                s.spawn(move || {
                    let data = pattern(t, region as usize);
                    for piece in 0..6 {
                        let len = region / 6;
                        let off = t as u64 * region + piece * len;
                        store
                            .write_at(
                                &data[(piece * len) as usize..((piece + 1) * len) as usize],
                                off,
                            )
                            .unwrap();
                    }
                });
            }
        });
        for t in 0..8u8 {
            let mut buf = vec![0u8; region as usize];
            store.read_at(&mut buf, t as u64 * region).unwrap();
            assert_eq!(buf, pattern(t, region as usize), "{store:?} region {t}");
        }
    }
}

#[test]
fn out_of_range_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for store in stores(&dir) {
        let mut buf = [0u8; 512];
        assert!(store.read_at(&mut buf, 8 * MIB - 256).is_err());
        assert!(store.write_at(&buf, 8 * MIB).is_err());
        assert!(store.discard(u64::MAX - 1, 2).is_err());
        store.read_at(&mut buf, 8 * MIB - 512).unwrap();
    }
}

#[test]
fn discard_and_write_zeroes_read_back_zeros() {
    let dir = tempfile::tempdir().unwrap();
    for store in stores(&dir) {
        let data = pattern(7, (4 * MIB) as usize);
        store.write_at(&data, 0).unwrap();
        // Partial chunk, whole chunk, unaligned tail.
        store.discard(4096, 8192).unwrap();
        store.discard(MIB, MIB).unwrap();
        store.write_zeroes(3 * MIB + 100, 1000).unwrap();
        let mut buf = vec![0u8; (4 * MIB) as usize];
        store.read_at(&mut buf, 0).unwrap();
        for (i, (&got, &was)) in buf.iter().zip(&data).enumerate() {
            let i = i as u64;
            let zeroed = (4096..12288).contains(&i)
                || (MIB..2 * MIB).contains(&i)
                || (3 * MIB + 100..3 * MIB + 1100).contains(&i);
            assert_eq!(got, if zeroed { 0 } else { was }, "{store:?} byte {i}");
        }
    }
}

#[test]
fn is_allocated_covers_the_range_and_sees_holes() {
    let dir = tempfile::tempdir().unwrap();
    for store in stores(&dir) {
        let all = store.is_allocated(0, 8 * MIB).unwrap();
        assert_eq!(all, vec![(0, 8 * MIB, false)], "{store:?}");
        store.write_at(&[1u8; 4096], 2 * MIB).unwrap();
        let ext = store.is_allocated(0, 8 * MIB).unwrap();
        let mut pos = 0;
        for &(off, len, _) in &ext {
            assert_eq!(off, pos);
            pos += len;
        }
        assert_eq!(pos, 8 * MIB);
        let mapped: Vec<_> = ext.iter().filter(|e| e.2).collect();
        assert_eq!(mapped.len(), 1, "{store:?}: {ext:?}");
        let (off, len, _) = *mapped[0];
        assert!(
            off <= 2 * MIB && off + len >= 2 * MIB + 4096 && len <= MIB,
            "{store:?}: {ext:?}"
        );
        store.discard(0, 8 * MIB).unwrap();
        assert_eq!(
            store.is_allocated(MIB, MIB).unwrap(),
            vec![(MIB, MIB, false)]
        );
    }
}

#[test]
fn file_is_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.img");
    let store = FileBackstore::open(&path, Some(1 << 30), true, false).unwrap();
    store.write_at(&[0xaa; 4096], 512 * MIB).unwrap();
    store.flush().unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(
        meta.blocks() * 512 < 4 * MIB,
        "{} blocks allocated",
        meta.blocks()
    );
    store.discard(512 * MIB, 4096).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.blocks(), 0);
}

#[test]
fn file_sizes_never_truncate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    assert!(
        FileBackstore::open(&path, Some(MIB), false, false).is_err(),
        "missing file without create"
    );
    FileBackstore::open(&path, Some(MIB), true, false)
        .unwrap()
        .write_at(b"keep", 0)
        .unwrap();
    assert_eq!(
        FileBackstore::open(&path, None, false, false)
            .unwrap()
            .size(),
        MIB
    );
    assert!(FileBackstore::open(&path, Some(MIB / 2), true, false).is_err());
    let grown = FileBackstore::open(&path, Some(2 * MIB), true, false).unwrap();
    assert_eq!(grown.size(), 2 * MIB);
    let mut buf = [0u8; 4];
    grown.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"keep");
}

#[test]
fn read_only_file_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    drop(FileBackstore::open(&path, Some(MIB), true, false).unwrap());
    let ro = FileBackstore::open(&path, None, false, true).unwrap();
    assert!(ro.read_only());
    let err = ro.write_at(&[1], 0).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(err.to_string().contains("read-only"));
    assert!(ro.discard(0, 512).is_err());
    assert!(ro.write_zeroes(0, 512).is_err());
    let mut buf = [1u8; 16];
    ro.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0; 16]);
}

#[test]
fn ram_store_is_lazy() {
    let store = RamBackstore::new(1 << 40);
    let mut buf = [1u8; 64];
    store.read_at(&mut buf, (1 << 40) - 64).unwrap();
    assert_eq!(buf, [0; 64]);
    assert_eq!(
        store.is_allocated(0, 1 << 30).unwrap(),
        vec![(0, 1 << 30, false)]
    );
}

/// A read the store serves without waiting returns exactly what `read_at` would; one it
/// cannot serve says so and is no error. Data just written is in memory or the page cache,
/// so the ram store, a file on tmpfs and a file on a `RWF_NOWAIT` file system serve it.
#[test]
fn try_read_at_serves_cached_data_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = stores(&dir);
    let shm = std::path::Path::new("/dev/shm");
    let shm_dir = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
    if let Some(d) = &shm_dir {
        all.push(Arc::new(
            FileBackstore::open(d.path().join("lun.img"), Some(8 * MIB), true, false).unwrap(),
        ));
    }
    for store in all {
        let data = pattern(9, MIB as usize);
        store.write_at(&data, 3 * MIB + 512).unwrap();
        let mut buf = vec![0u8; MIB as usize];
        let served = store.try_read_at(&mut buf, 3 * MIB + 512).unwrap();
        if served {
            assert_eq!(buf, data, "{store:?}");
        }
        let is_ram = format!("{store:?}").starts_with("Ram");
        let on_tmpfs = format!("{store:?}").contains("/dev/shm");
        if is_ram || on_tmpfs {
            assert!(served, "{store:?} keeps its data in memory");
        }
        let mut past = [0u8; 512];
        assert!(store.try_read_at(&mut past, 8 * MIB - 256).is_err());
    }
}

/// A file store lends what `read_at` would read, on tmpfs and on the test directory's file
/// system alike; a hole lends zeros; the window shows later writes (the lender's lock is
/// what keeps them off); a range past the end is an error; a window outlives its store.
#[test]
fn file_store_lends_exactly_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let shm = std::path::Path::new("/dev/shm");
    let shm_dir = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
    let mut paths = vec![dir.path().join("lun.img")];
    paths.extend(shm_dir.as_ref().map(|d| d.path().join("lun.img")));
    for path in paths {
        let store = FileBackstore::open(&path, Some(8 * MIB), true, false).unwrap();
        let data = pattern(5, MIB as usize + 1000);
        store.write_at(&data, 2 * MIB + 512).unwrap();
        for wait in [false, true] {
            // Just written, so in memory: lent with or without waiting.
            let lent = store
                .lend(2 * MIB + 512, data.len() as u64, wait)
                .unwrap()
                .unwrap_or_else(|| panic!("{path:?}: cached data not lent (wait {wait})"));
            assert_eq!(lent.len(), data.len());
            assert_eq!(lent.as_ref(), &data[..], "{path:?}");
        }
        let hole = store.lend(6 * MIB, 4096, true).unwrap().expect("a hole");
        assert!(hole.as_ref().iter().all(|&b| b == 0));
        let before = store.lend(2 * MIB + 512, 16, true).unwrap().unwrap();
        store.write_at(&[0xee; 16], 2 * MIB + 512).unwrap();
        assert_eq!(before.as_ref(), &[0xee; 16]);
        assert!(store.lend(8 * MIB - 256, 512, true).is_err());
        assert!(store.lend(u64::MAX - 10, 20, false).is_err());
        drop(store);
        assert_eq!(before.as_ref(), &[0xee; 16]);
    }
    // The ram store lends memory: zeros where never written, its chunk where written.
    let ram = RamBackstore::new(MIB);
    assert!(ram.lends_memory());
    let zeros = ram.lend(0, 4096, true).unwrap().expect("zeros lent");
    assert!(zeros.readable_in_user_space() && zeros.as_ref() == [0u8; 4096]);
    ram.write_at(&[7u8; 512], 512).unwrap();
    let lent = ram.lend(0, 4096, false).unwrap().expect("a chunk lent");
    assert_eq!(&lent.as_ref()[512..1024], &[7u8; 512]);
    assert!(lent.as_ref()[..512].iter().all(|&b| b == 0));
}

/// On tmpfs a page read through a shared mapping is a page allocated, data from then on:
/// a file store there lends no hole from its mapping, so reading what it lends leaves
/// holes holes (GET LBA STATUS after UNMAP or a SANITIZE erase, and the memory); it lends
/// a range that is all hole as zeros, and what it lends reads as `read_at` would.
#[test]
fn a_file_on_tmpfs_lends_no_hole_from_its_mapping() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm: not run");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let store =
        FileBackstore::open(dir.path().join("lun.img"), Some(8 * MIB), true, false).unwrap();
    let data = pattern(7, 256 * 1024);
    store.write_at(&data, 0).unwrap();
    store.write_at(&data, 2 * MIB).unwrap();
    // Data written, then deallocated as SANITIZE BLOCK ERASE does: every byte of it.
    store.discard(0, MIB).unwrap();
    assert_eq!(store.is_allocated(0, MIB).unwrap(), vec![(0, MIB, false)]);
    // All hole; across the end of the data into a hole; all data.
    for (offset, len) in [
        (0, 128 * 1024),
        (2 * MIB + 128 * 1024, 256 * 1024),
        (2 * MIB, 4096),
    ] {
        for wait in [false, true] {
            let mut want = vec![0u8; len as usize];
            store.read_at(&mut want, offset).unwrap();
            if let Some(lent) = store.lend(offset, len, wait).unwrap() {
                // A user-space read faults the pages in as the socket's copy would.
                assert_eq!(lent.as_ref(), &want[..], "{offset}+{len}");
            }
        }
    }
    assert!(
        store.lend(0, 128 * 1024, true).unwrap().is_some(),
        "a hole is lent as zeros"
    );
    assert_eq!(
        store.is_allocated(0, 8 * MIB).unwrap(),
        vec![
            (0, 2 * MIB, false),
            (2 * MIB, 256 * 1024, true),
            (2 * MIB + 256 * 1024, 6 * MIB - 256 * 1024, false)
        ],
        "reading lent windows allocated pages"
    );
}

/// A lent window whose file is cut short behind the store's back: copying it through
/// `copy_checked` is an error, not a SIGBUS that kills the process; before, it copies
/// exactly.
#[test]
fn a_window_on_a_file_cut_short_copies_as_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let store = FileBackstore::open(&path, Some(4 * MIB), true, false).unwrap();
    let data = pattern(3, 200_000);
    store.write_at(&data, MIB).unwrap();
    let lent = store.lend(MIB, data.len() as u64, true).unwrap().unwrap();
    assert_eq!(backstore::copy_checked(lent.as_ref()).unwrap(), data);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let err = backstore::copy_checked(lent.as_ref()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
}
