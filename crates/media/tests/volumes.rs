//! The file system readers on images made by the real tools: `mkfs.ext4 -d` (e2fsprogs)
//! and `mkfs.vfat` + `mcopy` (dosfstools, mtools), the whole device and behind an MBR
//! partition; every byte read back at odd offsets. No root, no mount.

use std::path::Path;
use std::process::Command;

use media::volume::{FsKind, Volume};

fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var_os("RESERVOIR_TEST_STRICT").is_some() {
            panic!("{tool} is not installed; scripts/setup.sh installs it");
        }
        eprintln!("SKIP: {tool} not installed");
    }
    ok
}

fn run(cmd: &mut Command) {
    let o = cmd.output().expect("running a tool");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 * 31 + seed as u32 * 7 + (i as u32 >> 9)) as u8)
        .collect()
}

fn check(img: &Path, kind: FsKind, files: &[(&str, Vec<u8>)]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let f = std::fs::File::open(img).unwrap();
    let v = Volume::open(Box::new(f), "test").unwrap();
    assert_eq!(v.kind, kind);
    rt.block_on(async {
        let list = v.list().await.unwrap();
        for (path, data) in files {
            let e = list
                .iter()
                .find(|e| e.path == *path)
                .unwrap_or_else(|| panic!("{path} not in {list:?}"));
            assert_eq!(e.size, data.len() as u64);
            assert_eq!(v.stat(path).await.unwrap(), data.len() as u64);
            // Whole, then odd pieces, then past the end.
            assert_eq!(&v.read(path, 0, data.len()).await.unwrap()[..], &data[..]);
            let mut off = 0usize;
            let mut step = 1usize;
            while off < data.len() {
                let n = step.min(data.len() - off);
                let got = v.read(path, off as u64, n).await.unwrap();
                assert_eq!(&got[..], &data[off..off + n], "{path} at {off}");
                off += n;
                step = step * 3 + 7;
            }
            assert!(v
                .read(path, data.len() as u64 + 10, 5)
                .await
                .unwrap()
                .is_empty());
        }
        assert!(v.stat("/nope.mp4").await.is_err());
        assert!(v.read("/nope.mp4", 0, 1).await.is_err());
    });
}

#[test]
fn ext4_image_from_mkfs() {
    if !have("mkfs.ext4") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("src");
    std::fs::create_dir_all(src.join("films/deep/er")).unwrap();
    let a = pattern(3 << 20, 1);
    let b = pattern(4097, 2);
    std::fs::write(src.join("films/a.mp4"), &a).unwrap();
    std::fs::write(src.join("films/deep/er/b c.webm"), &b).unwrap();
    let img = d.path().join("fs.img");
    run(Command::new("truncate").args(["-s", "32M"]).arg(&img));
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&src)
        .arg(&img));
    check(
        &img,
        FsKind::Ext4,
        &[("/films/a.mp4", a), ("/films/deep/er/b c.webm", b)],
    );
}

#[test]
fn fat_image_whole_and_partitioned() {
    if !have("mkfs.vfat") || !have("mcopy") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let a = pattern(1 << 20, 3);
    let fa = d.path().join("a.mp4");
    std::fs::write(&fa, &a).unwrap();
    // The whole device.
    let img = d.path().join("fat.img");
    run(Command::new("truncate").args(["-s", "16M"]).arg(&img));
    run(Command::new("mkfs.vfat").arg(&img));
    run(Command::new("mmd").arg("-i").arg(&img).arg("::/clips"));
    run(Command::new("mcopy")
        .arg("-i")
        .arg(&img)
        .arg(&fa)
        .arg("::/clips/a.mp4"));
    check(&img, FsKind::Fat, &[("/clips/a.mp4", a.clone())]);
    // Behind an MBR, as a USB stick comes: the first partition at 1 MiB.
    let disk = d.path().join("disk.img");
    run(Command::new("truncate").args(["-s", "18M"]).arg(&disk));
    // An MBR with one FAT16 (LBA) partition: 2048 sectors in, 32768 long.
    let mut mbr = vec![0u8; 512];
    mbr[446 + 4] = 0x0e;
    mbr[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    mbr[446 + 12..446 + 16].copy_from_slice(&32768u32.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    let part = std::fs::read(&img).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &mbr, 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &part, 1 << 20).unwrap();
    drop(f);
    let v = Volume::open(Box::new(std::fs::File::open(&disk).unwrap()), "p").unwrap();
    assert_eq!(v.base, 1 << 20);
    check(&disk, FsKind::Fat, &[("/clips/a.mp4", a)]);
}

#[test]
fn no_file_system_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let img = d.path().join("zero.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let e = Volume::open(Box::new(std::fs::File::open(&img).unwrap()), "z")
        .err()
        .unwrap();
    assert!(e.to_string().contains("no ext2/3/4 or FAT"), "{e}");
}

/// A file as a device that keeps what the volume tells it holds no file data.
struct Recording {
    f: std::fs::File,
    holes: std::sync::Arc<std::sync::Mutex<Vec<std::ops::Range<u64>>>>,
}

impl media::volume::Device for Recording {
    fn size(&self) -> u64 {
        self.f.metadata().map_or(0, |m| m.len())
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.f, buf, offset)
    }
    fn no_file_data(&mut self, ranges: &[std::ops::Range<u64>]) {
        *self.holes.lock().unwrap() = ranges.to_vec();
    }
}

/// Physical blocks `debugfs -R "blocks WHAT"` lists (a path, or `<8>` for an inode).
fn debugfs_blocks(img: &Path, what: &str) -> Vec<u64> {
    let o = Command::new("debugfs")
        .args(["-R", &format!("blocks {what}")])
        .arg(img)
        .output()
        .expect("debugfs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|x| x.parse().expect("a block number"))
        .collect()
}

/// mkfs.ext4 puts the journal in the middle of the file system and leaves room in the
/// groups for backup superblocks and descriptors, so a file that fills most of it jumps
/// over them; the volume tells its device where they are (for read-ahead to step over),
/// and none of it is the file's: checked against debugfs, 1 KiB and 4 KiB blocks.
#[test]
fn ext4_metadata_told_to_the_device_is_never_file_data() {
    if !have("mkfs.ext4") || !have("debugfs") {
        return;
    }
    for block in ["1024", "4096"] {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("f.bin"), pattern(60 << 20, 4)).unwrap();
        let img = d.path().join("fs.img");
        run(Command::new("truncate").args(["-s", "96M"]).arg(&img));
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", block, "-d"])
            .arg(&src)
            .arg(&img));
        let bs: u64 = block.parse().unwrap();
        let holes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let dev = Recording {
            f: std::fs::File::open(&img).unwrap(),
            holes: holes.clone(),
        };
        let v = Volume::open(Box::new(dev), "t").unwrap();
        // The volume's thread tells the device before it serves a request.
        let rt = tokio::runtime::Runtime::new().unwrap();
        assert_eq!(rt.block_on(v.stat("/f.bin")).unwrap(), 60 << 20);
        let holes = holes.lock().unwrap().clone();
        let inside = |b: u64| {
            holes
                .iter()
                .any(|r| r.start <= b * bs && (b + 1) * bs <= r.end)
        };
        let overlaps = |b: u64| {
            holes
                .iter()
                .any(|r| r.start < (b + 1) * bs && b * bs < r.end)
        };
        let file = debugfs_blocks(&img, "/f.bin");
        assert!(
            file.len() as u64 >= (60 << 20) / bs,
            "{block}: {} blocks",
            file.len()
        );
        for b in &file {
            assert!(!overlaps(*b), "{block}: file block {b} inside {holes:?}");
        }
        let journal = debugfs_blocks(&img, "<8>");
        assert!(!journal.is_empty());
        for b in &journal {
            assert!(inside(*b), "{block}: journal block {b} not in {holes:?}");
        }
        // With 1 KiB blocks (twelve groups) the journal sits in the middle and the file
        // jumps over it: its data lies on both sides.
        if bs == 1024 {
            let (j0, j1) = (journal[0], *journal.last().unwrap());
            assert!(file.iter().any(|b| *b < j0) && file.iter().any(|b| *b > j1));
        }
        // Superblock, descriptors, bitmaps and inode table of group 0.
        let first = if bs == 1024 { 1 } else { 0 };
        assert!(inside(first) && inside(first + 1), "{block}: {holes:?}");
    }
}
