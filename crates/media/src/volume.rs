//! A file system read in-process from a block device: ext2/3/4 through `ext4-view`, FAT
//! through `fatfs`, the whole device or its first MBR partition. Neither reader is `Send`
//! (ext4-view keeps its caches in an `Rc`), so each volume lives on a thread of its own
//! and is asked through a channel; a [`Volume`] is the handle, and the thread ends when
//! the last handle goes. Nothing here mounts anything or needs root; nothing writes.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::rc::Rc;
use std::sync::mpsc as std_mpsc;

use bytes::Bytes;
use tokio::sync::oneshot;

/// What a volume reads its blocks from (a LUN through the initiator, a file in tests).
pub trait Device: Send + 'static {
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`; an error when the bytes cannot all be had.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Byte ranges that hold no file data (the file system's metadata and journal,
    /// [`crate::ext4layout`]): a device reading ahead may step over them. A hint: reads
    /// there are answered all the same.
    fn no_file_data(&mut self, _ranges: &[std::ops::Range<u64>]) {}
    /// Fills `buf` from `offset` only if that costs no I/O worth counting (bytes a LUN
    /// holds in its caches; a local file reads them): for hints, which must neither wait
    /// a round trip nor change what the device reads ahead.
    fn read_if_cached(&mut self, offset: u64, buf: &mut [u8]) -> bool {
        self.read_at(offset, buf).is_ok()
    }
}

impl Device for std::fs::File {
    fn size(&self) -> u64 {
        self.metadata().map_or(0, |m| m.len())
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

/// A window of another device (a partition).
struct Window {
    dev: Box<dyn Device>,
    base: u64,
    len: u64,
}

impl Device for Window {
    fn size(&self) -> u64 {
        self.len
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset.saturating_add(buf.len() as u64) > self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the partition",
            ));
        }
        self.dev.read_at(self.base + offset, buf)
    }
    fn no_file_data(&mut self, ranges: &[std::ops::Range<u64>]) {
        let moved: Vec<_> = ranges
            .iter()
            .map(|r| self.base.saturating_add(r.start)..self.base.saturating_add(r.end))
            .collect();
        self.dev.no_file_data(&moved);
    }
    fn read_if_cached(&mut self, offset: u64, buf: &mut [u8]) -> bool {
        offset.saturating_add(buf.len() as u64) <= self.len
            && self.dev.read_if_cached(self.base + offset, buf)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    Ext4,
    Fat,
}

/// What the first 4 KiB of a device say it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Fs(FsKind),
    /// An MBR whose first partition starts at this byte and is this long.
    Partition {
        base: u64,
        len: u64,
    },
    Unknown,
}

/// Sans-IO: reads the signatures in the first 4 KiB (or fewer) of a device.
pub fn probe(head: &[u8]) -> Probe {
    if head.len() >= 1082 && head[1080..1082] == [0x53, 0xEF] {
        return Probe::Fs(FsKind::Ext4);
    }
    if head.len() >= 512 && head[510..512] == [0x55, 0xAA] {
        if &head[54..59] == b"FAT12" || &head[54..59] == b"FAT16" || &head[82..87] == b"FAT32" {
            return Probe::Fs(FsKind::Fat);
        }
        // An MBR: the first partition entry of a known type.
        let e = &head[446..462];
        let kind = e[4];
        let lba = u32::from_le_bytes([e[8], e[9], e[10], e[11]]);
        let count = u32::from_le_bytes([e[12], e[13], e[14], e[15]]);
        if kind != 0 && kind != 0xEE && lba > 0 && count > 0 {
            return Probe::Partition {
                base: u64::from(lba) * 512,
                len: u64::from(count) * 512,
            };
        }
    }
    Probe::Unknown
}

/// A file the listing shows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    /// From the volume's root, starting with `/`.
    pub path: String,
    pub size: u64,
}

/// Listing limits: a pathological tree must not keep a volume busy for long.
const MAX_DEPTH: usize = 16;
const MAX_ENTRIES: usize = 20_000;

enum Job {
    List(oneshot::Sender<io::Result<Vec<Entry>>>),
    Stat(String, oneshot::Sender<io::Result<u64>>),
    Read {
        path: String,
        offset: u64,
        len: usize,
        reply: oneshot::Sender<io::Result<Bytes>>,
    },
}

/// The handle of a volume's thread.
#[derive(Clone)]
pub struct Volume {
    jobs: std_mpsc::Sender<Job>,
    pub kind: FsKind,
    /// Where the file system starts on the device (a partition's offset, else 0).
    pub base: u64,
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the volume was closed")
}

impl Volume {
    /// Finds the file system on `dev` and opens it on a thread of its own. Blocking: call
    /// it where blocking is allowed.
    pub fn open(mut dev: Box<dyn Device>, name: &str) -> io::Result<Volume> {
        let mut head = vec![0u8; 4096.min(dev.size() as usize)];
        dev.read_at(0, &mut head)?;
        let (kind, base, dev): (FsKind, u64, Box<dyn Device>) = match probe(&head) {
            Probe::Fs(k) => (k, 0, dev),
            Probe::Partition { base, len } => {
                let len = len.min(dev.size().saturating_sub(base));
                let mut w = Window { dev, base, len };
                let mut head = vec![0u8; 4096.min(len as usize)];
                w.read_at(0, &mut head)?;
                match probe(&head) {
                    Probe::Fs(k) => (k, base, Box::new(w)),
                    _ => return Err(err("no ext2/3/4 or FAT file system on the first partition")),
                }
            }
            Probe::Unknown => return Err(err("no ext2/3/4 or FAT file system found")),
        };
        let (tx, rx) = std_mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std_mpsc::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name(format!("vol {name}"))
            .spawn(move || match kind {
                FsKind::Ext4 => serve_ext4(dev, rx, ready_tx),
                FsKind::Fat => serve_fat(dev, rx, ready_tx),
            })?;
        ready_rx.recv().map_err(|_| gone())??;
        Ok(Volume {
            jobs: tx,
            kind,
            base,
        })
    }

    pub async fn list(&self) -> io::Result<Vec<Entry>> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send(Job::List(tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// The length of the regular file at `path`.
    pub async fn stat(&self, path: &str) -> io::Result<u64> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Job::Stat(path.to_owned(), tx))
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Up to `len` bytes of `path` from `offset` (fewer only at the end of the file).
    pub async fn read(&self, path: &str, offset: u64, len: usize) -> io::Result<Bytes> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Job::Read {
                path: path.to_owned(),
                offset,
                len,
                reply: tx,
            })
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

// --- ext2/3/4 ------------------------------------------------------------------------

/// The device under `ext4-view`, shared with the volume's thread (which tells it where
/// the file system's metadata is once `ext4-view` has loaded).
struct Ext4Dev(Rc<RefCell<Box<dyn Device>>>);

impl ext4_view::Ext4Read for Ext4Dev {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        self.0
            .borrow_mut()
            .read_at(start_byte, dst)
            .map_err(|e| e.into())
    }
}

/// Where the file system on `dev` keeps what is not file data ([`crate::ext4layout`]),
/// from what `dev` already holds (`Device::read_if_cached`: `ext4-view` has read the
/// superblock and descriptors when it loads, and the journal's inode with the root's at
/// the first path it looks up): no round trip, and nothing read ahead differently. `None`
/// until the superblock and descriptors are had; the bool says whether the journal was.
fn ext4_metadata(dev: &mut dyn Device) -> Option<(Vec<std::ops::Range<u64>>, bool)> {
    use crate::ext4layout::{journal_extents, Superblock, SUPERBLOCK_LEN, SUPERBLOCK_OFFSET};
    let mut read = |at: std::ops::Range<u64>| -> Option<Vec<u8>> {
        let mut b = vec![0u8; usize::try_from(at.end.checked_sub(at.start)?).ok()?];
        dev.read_if_cached(at.start, &mut b).then_some(b)
    };
    let sb = read(SUPERBLOCK_OFFSET..SUPERBLOCK_OFFSET + SUPERBLOCK_LEN as u64)
        .and_then(|b| Superblock::parse(&b))?;
    let groups = sb.groups_from(&read(sb.gdt())?);
    let journal = match sb.journal_inode {
        None => Some(Vec::new()),
        Some(n) => sb
            .inode_at(n, &groups)
            .and_then(&mut read)
            .map(|ino| journal_extents(&sb, &ino)),
    };
    let known = journal.is_some();
    Some((sb.metadata(&groups, &journal.unwrap_or_default()), known))
}

/// Tells the device where the file system's metadata is, once more with the journal
/// when that is first had; returns whether there is nothing left to tell.
fn tell_metadata(dev: &RefCell<Box<dyn Device>>, told: usize) -> usize {
    let mut d = dev.borrow_mut();
    match ext4_metadata(&mut **d) {
        Some((holes, journal)) => {
            let now = if journal { 2 } else { 1 };
            if now > told {
                d.no_file_data(&holes);
            }
            now.max(told)
        }
        None => told,
    }
}

fn ext4_err(e: ext4_view::Ext4Error) -> io::Error {
    match e {
        ext4_view::Ext4Error::NotFound => io::Error::new(io::ErrorKind::NotFound, "no such file"),
        ext4_view::Ext4Error::IsADirectory | ext4_view::Ext4Error::IsASpecialFile => {
            io::Error::new(io::ErrorKind::NotFound, "not a regular file")
        }
        e => err(e),
    }
}

/// Open files kept between reads (a stream reads one chunk after another), at most 8.
struct OpenFiles<F> {
    files: VecDeque<(String, F)>,
}

impl<F> OpenFiles<F> {
    fn take(&mut self, path: &str) -> Option<F> {
        let i = self.files.iter().position(|(p, _)| p == path)?;
        self.files.remove(i).map(|(_, f)| f)
    }
    fn put(&mut self, path: &str, f: F) {
        if self.files.len() >= 8 {
            self.files.pop_front();
        }
        self.files.push_back((path.to_owned(), f));
    }
}

/// What a volume's thread answers jobs with: one file system of a kind.
trait FileSystem {
    /// Before each job (ext4 tells the device what is metadata, a step at a time).
    fn before_job(&mut self) {}
    fn list(&mut self) -> io::Result<Vec<Entry>>;
    /// The size of the regular file at `path`.
    fn size(&mut self, path: &str) -> io::Result<u64>;
    /// `len` bytes of `path` from `offset`, fewer only where the file ends.
    fn read(&mut self, path: &str, offset: u64, len: usize) -> io::Result<Bytes>;
}

/// Answers the jobs until every handle of the volume is dropped.
fn serve(mut fs: impl FileSystem, jobs: std_mpsc::Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        fs.before_job();
        match job {
            Job::List(reply) => {
                let _ = reply.send(fs.list());
            }
            Job::Stat(path, reply) => {
                let _ = reply.send(fs.size(&path));
            }
            Job::Read {
                path,
                offset,
                len,
                reply,
            } => {
                let _ = reply.send(fs.read(&path, offset, len));
            }
        }
    }
}

/// `len` bytes through `read`, fewer where it finds the end (a read of 0).
fn read_up_to(
    len: usize,
    mut read: impl FnMut(&mut [u8]) -> io::Result<usize>,
) -> io::Result<Bytes> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = read(&mut buf[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(Bytes::from(buf))
}

struct Ext4Volume {
    fs: ext4_view::Ext4,
    dev: Rc<RefCell<Box<dyn Device>>>,
    /// 0: nothing told the device yet, 1: the metadata but the journal, 2: all of it.
    told: usize,
    open: OpenFiles<ext4_view::File>,
}

impl FileSystem for Ext4Volume {
    fn before_job(&mut self) {
        if self.told < 2 {
            self.told = tell_metadata(&self.dev, self.told);
        }
    }
    fn list(&mut self) -> io::Result<Vec<Entry>> {
        list_ext4(&self.fs)
    }
    fn size(&mut self, path: &str) -> io::Result<u64> {
        let m = self.fs.metadata(path).map_err(ext4_err)?;
        if m.file_type().is_regular_file() {
            Ok(m.len())
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                "not a regular file",
            ))
        }
    }
    fn read(&mut self, path: &str, offset: u64, len: usize) -> io::Result<Bytes> {
        let mut f = match self.open.take(path) {
            Some(f) => f,
            None => self.fs.open(path).map_err(ext4_err)?,
        };
        if f.position() != offset {
            f.seek_to(offset).map_err(ext4_err)?;
        }
        let data = read_up_to(len, |b| f.read_bytes(b).map_err(ext4_err))?;
        self.open.put(path, f);
        Ok(data)
    }
}

fn serve_ext4(
    dev: Box<dyn Device>,
    jobs: std_mpsc::Receiver<Job>,
    ready: std_mpsc::Sender<io::Result<()>>,
) {
    let dev = Rc::new(RefCell::new(dev));
    let fs = match ext4_view::Ext4::load(Box::new(Ext4Dev(dev.clone()))) {
        Ok(fs) => {
            let _ = ready.send(Ok(()));
            fs
        }
        Err(e) => {
            let _ = ready.send(Err(err(format!("ext4: {e}"))));
            return;
        }
    };
    let open = OpenFiles {
        files: VecDeque::new(),
    };
    let told = tell_metadata(&dev, 0);
    serve(
        Ext4Volume {
            fs,
            dev,
            told,
            open,
        },
        jobs,
    );
}

fn list_ext4(fs: &ext4_view::Ext4) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut stack = vec![("/".to_owned(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        for e in fs.read_dir(dir.as_str()).map_err(ext4_err)? {
            let e = e.map_err(ext4_err)?;
            let Ok(name) = e.file_name().as_str().map(str::to_owned) else {
                continue;
            };
            if name == "." || name == ".." || (depth == 0 && name == "lost+found") {
                continue;
            }
            let path = if dir == "/" {
                format!("/{name}")
            } else {
                format!("{dir}/{name}")
            };
            let ft = e.file_type().map_err(ext4_err)?;
            if ft.is_dir() {
                if depth + 1 < MAX_DEPTH {
                    stack.push((path, depth + 1));
                }
            } else if ft.is_regular_file() {
                let size = e.metadata().map_err(ext4_err)?.len();
                out.push(Entry { path, size });
            }
            if out.len() >= MAX_ENTRIES {
                return Ok(sorted(out));
            }
        }
    }
    Ok(sorted(out))
}

fn sorted(mut v: Vec<Entry>) -> Vec<Entry> {
    v.sort_by(|a, b| a.path.cmp(&b.path));
    v
}

// --- FAT -------------------------------------------------------------------------------

/// `Read + Write + Seek` over a device, as fatfs wants it; writes are refused.
struct FatDev {
    dev: Box<dyn Device>,
    pos: u64,
}

impl Read for FatDev {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.dev.size().saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        self.dev.read_at(self.pos, &mut buf[..n])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for FatDev {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the media server reads only",
        ))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for FatDev {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let size = self.dev.size() as i128;
        let p = match to {
            SeekFrom::Start(p) => p as i128,
            SeekFrom::End(d) => size + d as i128,
            SeekFrom::Current(d) => self.pos as i128 + d as i128,
        };
        if p < 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "seek before 0"));
        }
        self.pos = p as u64;
        Ok(self.pos)
    }
}

struct FatVolume(fatfs::FileSystem<FatDev>);

/// A FAT path as fatfs takes it: from the root, without the leading `/`.
fn rel(p: &str) -> &str {
    p.trim_start_matches('/')
}

impl FileSystem for FatVolume {
    fn list(&mut self) -> io::Result<Vec<Entry>> {
        list_fat(&self.0)
    }
    fn size(&mut self, path: &str) -> io::Result<u64> {
        self.0
            .root_dir()
            .open_file(rel(path))
            .and_then(|mut f| f.seek(SeekFrom::End(0)))
    }
    fn read(&mut self, path: &str, offset: u64, len: usize) -> io::Result<Bytes> {
        let mut f = self.0.root_dir().open_file(rel(path))?;
        f.seek(SeekFrom::Start(offset))?;
        read_up_to(len, |b| f.read(b))
    }
}

fn serve_fat(
    dev: Box<dyn Device>,
    jobs: std_mpsc::Receiver<Job>,
    ready: std_mpsc::Sender<io::Result<()>>,
) {
    let fs = match fatfs::FileSystem::new(FatDev { dev, pos: 0 }, fatfs::FsOptions::new()) {
        Ok(fs) => {
            let _ = ready.send(Ok(()));
            fs
        }
        Err(e) => {
            let _ = ready.send(Err(err(format!("FAT: {e}"))));
            return;
        }
    };
    serve(FatVolume(fs), jobs);
}

fn list_fat<T: fatfs::ReadWriteSeek>(fs: &fatfs::FileSystem<T>) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut stack = vec![(fs.root_dir(), String::new(), 0usize)];
    while let Some((dir, prefix, depth)) = stack.pop() {
        for e in dir.iter() {
            let e = e?;
            let name = e.file_name();
            if name == "." || name == ".." {
                continue;
            }
            let path = format!("{prefix}/{name}");
            if e.is_dir() {
                if depth + 1 < MAX_DEPTH {
                    stack.push((e.to_dir(), path, depth + 1));
                }
            } else {
                out.push(Entry {
                    path,
                    size: e.len(),
                });
            }
            if out.len() >= MAX_ENTRIES {
                return Ok(sorted(out));
            }
        }
    }
    Ok(sorted(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes() {
        let mut b = vec![0u8; 4096];
        assert_eq!(probe(&b), Probe::Unknown);
        b[1080] = 0x53;
        b[1081] = 0xEF;
        assert_eq!(probe(&b), Probe::Fs(FsKind::Ext4));
        let mut b = vec![0u8; 4096];
        b[510] = 0x55;
        b[511] = 0xAA;
        b[82..87].copy_from_slice(b"FAT32");
        assert_eq!(probe(&b), Probe::Fs(FsKind::Fat));
        let mut b = vec![0u8; 512];
        b[510] = 0x55;
        b[511] = 0xAA;
        b[450] = 0x83;
        b[454..458].copy_from_slice(&2048u32.to_le_bytes());
        b[458..462].copy_from_slice(&4096u32.to_le_bytes());
        assert_eq!(
            probe(&b),
            Probe::Partition {
                base: 1 << 20,
                len: 2 << 20
            }
        );
        assert_eq!(probe(&b[..100]), Probe::Unknown);
    }
}
