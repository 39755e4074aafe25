//! The parallel chunk copy behind `rsv cp`: between files, block devices and [`Lun`]s,
//! a fixed number of chunks in flight, each read from the source and written to the
//! destination at the same offset, so one slow command never stalls the others.
//!
//! Chunks finish out of order; what a copy stopped by its time limit can be resumed from
//! is the prefix every chunk of which is done ([`CopyReport::copied_prefix_bytes`]), given
//! back as [`CopyOptions::start_offset`]. A chunk that fails (its session not recovered
//! within `recovery_timeout`, a file error) stops the copy the same way, as
//! [`CopyError::Interrupted`] with that prefix. Progress goes to a callback, never to a
//! terminal.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::task::JoinSet;

use crate::{Error, Lun, Result};

/// Chunk sizes and resume offsets are multiples of this, so that every chunk but the
/// source's last is whole blocks of any LUN (512 or 4096 bytes).
pub const ALIGN: u64 = 4096;

/// How long a copy that failed tries to flush its destination before it reports.
const FLUSH_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// One side of a copy.
#[derive(Clone)]
pub enum Endpoint {
    /// A regular file or a block device.
    File {
        file: Arc<std::fs::File>,
        size: u64,
    },
    Lun(Lun),
}

impl Endpoint {
    /// A file or block device to read.
    pub fn open_file(path: &Path) -> std::io::Result<Endpoint> {
        let file = std::fs::File::open(path)?;
        let size = file_size(&file)?;
        Ok(Endpoint::File {
            file: Arc::new(file),
            size,
        })
    }

    /// A file to write, created if missing and sized to `size` (emptied first when
    /// `truncate`), or a block device as it is. The flag says whether it reads as zeros
    /// everywhere, so that zero chunks need no write.
    pub fn create_file(
        path: &Path,
        size: u64,
        truncate: bool,
    ) -> std::io::Result<(Endpoint, bool)> {
        let is_blockdev = std::fs::metadata(path)
            .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
            .unwrap_or(false);
        let truncate = truncate && !is_blockdev;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .create(!is_blockdev)
            .truncate(truncate)
            .open(path)?;
        if !is_blockdev {
            file.set_len(size)?;
        }
        let size = file_size(&file)?;
        Ok((
            Endpoint::File {
                file: Arc::new(file),
                size,
            },
            truncate,
        ))
    }

    pub fn size(&self) -> u64 {
        match self {
            Endpoint::File { size, .. } => *size,
            Endpoint::Lun(l) => l.size(),
        }
    }

    pub fn lun(&self) -> Option<&Lun> {
        match self {
            Endpoint::Lun(l) => Some(l),
            Endpoint::File { .. } => None,
        }
    }

    pub async fn read(&self, offset: u64, len: usize) -> Result<Bytes> {
        match self {
            Endpoint::File { file, .. } => {
                let file = file.clone();
                blocking(move || {
                    let mut buf = BytesMut::zeroed(len);
                    file.read_exact_at(&mut buf, offset).map(|_| buf.freeze())
                })
                .await
            }
            Endpoint::Lun(l) => l.read_at(offset, len).await,
        }
    }

    pub async fn write(&self, offset: u64, data: Bytes) -> Result<()> {
        match self {
            Endpoint::File { file, .. } => {
                let file = file.clone();
                blocking(move || file.write_all_at(&data, offset)).await
            }
            Endpoint::Lun(l) => l.write_at(offset, data).await,
        }
    }

    /// What is written is on stable storage (fdatasync, SYNCHRONIZE CACHE).
    pub async fn flush(&self) -> Result<()> {
        match self {
            Endpoint::File { file, .. } => {
                let file = file.clone();
                blocking(move || file.sync_data()).await
            }
            Endpoint::Lun(l) => l.flush().await,
        }
    }

    /// Writes a chunk; on a LUN, a source that ends inside a block has the rest of that
    /// block zero-filled rather than read back and patched.
    async fn write_chunk(&self, offset: u64, data: Bytes) -> Result<()> {
        let bs = match self {
            Endpoint::Lun(l) => l.block_size() as usize,
            Endpoint::File { .. } => 1,
        };
        if data.len().is_multiple_of(bs) {
            return self.write(offset, data).await;
        }
        let mut padded = BytesMut::zeroed(data.len().div_ceil(bs) * bs);
        padded[..data.len()].copy_from_slice(&data);
        self.write(offset, padded.freeze()).await
    }

    fn queue_depth(&self) -> Option<usize> {
        self.lun().map(|l| l.session().queue_depth())
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
        .map_err(Error::Io)
}

fn file_size(file: &std::fs::File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let m = file.metadata()?;
    if m.is_file() {
        return Ok(m.len());
    }
    // Block devices report length 0 in their metadata; their end is their size.
    let mut f = file;
    f.seek(SeekFrom::End(0))
}

/// How to copy.
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// Bytes per chunk (one command each side); rounded down to a multiple of [`ALIGN`],
    /// at least that.
    pub chunk_size: u64,
    /// Chunks in flight. `None`: the largest queue depth of the LUN sessions, followed as
    /// auto-tuning grows it (32 between files).
    pub queue_depth: Option<usize>,
    /// Skip all-zero chunks: only right where the destination already reads as zero.
    pub skip_zeros: bool,
    /// After a complete copy, read both sides again and compare chunk checksums.
    pub verify: bool,
    /// Start no chunk after this long; those in flight finish and the destination is
    /// flushed.
    pub max_time: Option<Duration>,
    /// Copy from here on (a multiple of [`ALIGN`]): what lies below is taken as copied,
    /// as after a copy stopped with this `copied_prefix_bytes`.
    pub start_offset: u64,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            chunk_size: 1 << 20,
            queue_depth: None,
            skip_zeros: false,
            verify: false,
            max_time: None,
            start_offset: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Copy,
    Verify,
}

/// Where a copy is, after each chunk.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub phase: Phase,
    /// Bytes this phase has done (a resumed copy counts from its start offset).
    pub bytes: u64,
    /// Bytes this phase has to do.
    pub total_bytes: u64,
    pub elapsed: Duration,
    /// Average rate since the phase began.
    pub bytes_per_s: f64,
    /// Time left at that rate.
    pub eta: Option<Duration>,
}

impl Progress {
    fn new(phase: Phase, bytes: u64, total_bytes: u64, start: Instant) -> Progress {
        let elapsed = start.elapsed();
        let bytes_per_s = bytes as f64 / elapsed.as_secs_f64().max(1e-9);
        Progress {
            phase,
            bytes,
            total_bytes,
            elapsed,
            bytes_per_s,
            eta: (bytes_per_s > 0.0).then(|| {
                Duration::from_secs_f64((total_bytes - bytes.min(total_bytes)) as f64 / bytes_per_s)
            }),
        }
    }
}

/// What a copy did.
#[derive(Clone, Debug)]
pub struct CopyReport {
    /// Bytes copied by this run.
    pub bytes: u64,
    /// Size of the source.
    pub total_bytes: u64,
    /// Everything from the start offset to the end is copied.
    pub complete: bool,
    /// Every byte below this offset is copied: where a stopped copy can resume.
    pub copied_prefix_bytes: u64,
    /// All-zero bytes not written.
    pub skipped_zero_bytes: u64,
    /// From the first chunk to the flush of the destination (verification not counted).
    pub seconds: f64,
    /// Of `seconds`, the final flush (SYNCHRONIZE CACHE of a LUN) after the last chunk's
    /// answer.
    pub flush_seconds: f64,
    /// CRC32C over the per-chunk CRC32Cs of the source, when verified.
    pub checksum: Option<u32>,
    pub chunk_size: u64,
    /// Chunks in flight at most.
    pub queue_depth: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("the destination holds {dst_bytes} bytes but the source has {src_bytes}")]
    DestinationTooSmall { src_bytes: u64, dst_bytes: u64 },
    #[error("cannot start at offset {offset}: not a multiple of {ALIGN} or past the end of the source ({size} bytes)")]
    StartOffset { offset: u64, size: u64 },
    #[error("reading {len} bytes at offset {offset}")]
    Read {
        offset: u64,
        len: usize,
        #[source]
        source: Error,
    },
    #[error("writing {len} bytes at offset {offset}")]
    Write {
        offset: u64,
        len: usize,
        #[source]
        source: Error,
    },
    #[error("flushing the destination")]
    Flush(#[source] Error),
    /// Reading a side again to verify it failed.
    #[error(transparent)]
    Reread(Error),
    #[error("verify failed: {chunks} chunk(s) differ, first at offset {first_offset}")]
    Mismatch { chunks: usize, first_offset: u64 },
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// A chunk failed (a session that could not be recovered in its `recovery_timeout`,
    /// a file error): no chunk was started after it, those in flight were waited for, and
    /// everything below `copied_prefix_bytes` was written and acknowledged. Copying again
    /// from there ([`CopyOptions::start_offset`]) finishes the copy.
    #[error("copy interrupted: {bytes} bytes copied, the first {copied_prefix_bytes} of {total_bytes} all done{}", if *.flushed { "" } else { " (acknowledged, but the destination could not be flushed)" })]
    Interrupted {
        source: Box<CopyError>,
        /// Bytes this run copied.
        bytes: u64,
        total_bytes: u64,
        copied_prefix_bytes: u64,
        /// Whether the destination was flushed after the failure.
        flushed: bool,
    },
}

impl CopyError {
    /// Where a copy that ended with this error can be resumed from, if it can.
    pub fn resume_offset(&self) -> Option<u64> {
        match self {
            CopyError::Interrupted {
                copied_prefix_bytes,
                ..
            } => Some(*copied_prefix_bytes),
            _ => None,
        }
    }
}

/// Copies `src` to `dst` (from `opts.start_offset` to the end of `src`), calling
/// `progress` after each chunk. Returns early only on an error; `max_time` ends it with
/// `complete: false`.
pub async fn copy(
    src: &Endpoint,
    dst: &Endpoint,
    opts: &CopyOptions,
    mut progress: impl FnMut(Progress),
) -> Result<CopyReport, CopyError> {
    let size = src.size();
    if dst.size() < size {
        return Err(CopyError::DestinationTooSmall {
            src_bytes: size,
            dst_bytes: dst.size(),
        });
    }
    let start_at = opts.start_offset;
    if !start_at.is_multiple_of(ALIGN) || start_at > size {
        return Err(CopyError::StartOffset {
            offset: start_at,
            size,
        });
    }
    let io = opts.chunk_size.max(ALIGN);
    let io = io - io % ALIGN;
    // Commands in flight: as given, else the sessions' (auto-tuning may grow it as the
    // copy runs).
    let queue_depth = || {
        opts.queue_depth
            .or_else(|| [src, dst].iter().filter_map(|e| e.queue_depth()).max())
            .unwrap_or(32)
    };
    let mut qd = queue_depth();
    let todo = size - start_at;
    let start = Instant::now();
    let deadline = opts.max_time.map(|t| start + t);
    let mut done = vec![false; todo.div_ceil(io) as usize];
    let (mut copied, mut skipped) = (0u64, 0u64);
    let mut set: JoinSet<Result<(u64, u64, bool), CopyError>> = JoinSet::new();
    let mut off = start_at;
    let mut stopped = false;
    let mut failed: Option<CopyError> = None;
    while (off < size && !stopped) || !set.is_empty() {
        stopped |= deadline.is_some_and(|d| Instant::now() >= d);
        qd = qd.max(queue_depth());
        while off < size && !stopped && set.len() < qd {
            let len = io.min(size - off) as usize;
            let (src, dst, skip_zeros) = (src.clone(), dst.clone(), opts.skip_zeros);
            let at = off;
            set.spawn(async move {
                let data = src.read(at, len).await.map_err(|source| CopyError::Read {
                    offset: at,
                    len,
                    source,
                })?;
                let zero = skip_zeros && is_zero(&data);
                if !zero {
                    dst.write_chunk(at, data)
                        .await
                        .map_err(|source| CopyError::Write {
                            offset: at,
                            len,
                            source,
                        })?;
                }
                Ok((at, len as u64, zero))
            });
            off += len as u64;
        }
        let joined = match deadline.filter(|_| !stopped) {
            // Wake at the deadline even when every chunk in flight is slow.
            Some(d) => tokio::time::timeout_at(d.into(), set.join_next())
                .await
                .unwrap_or(None),
            None => set.join_next().await,
        };
        match joined {
            Some(Ok(Ok((at, len, zero)))) => {
                done[((at - start_at) / io) as usize] = true;
                copied += len;
                if zero {
                    skipped += len;
                }
                progress(Progress::new(Phase::Copy, copied, todo, start));
            }
            // The first failure stops the copy; the chunks in flight are waited for (they
            // share the failed session and end soon), so that the prefix is known.
            Some(Ok(Err(e))) => {
                failed.get_or_insert(e);
                stopped = true;
            }
            Some(Err(e)) => {
                failed.get_or_insert(CopyError::Task(e));
                stopped = true;
            }
            None => {}
        }
    }
    let copied_prefix_bytes = done
        .iter()
        .position(|d| !d)
        .map_or(size, |i| start_at + i as u64 * io);
    if let Some(source) = failed {
        // Worth a try (the failure may have been the source's), but not another
        // recovery_timeout of a session that just failed.
        let flushed = tokio::time::timeout(FLUSH_AFTER_FAILURE, dst.flush())
            .await
            .is_ok_and(|r| r.is_ok());
        return Err(CopyError::Interrupted {
            source: Box::new(source),
            bytes: copied,
            total_bytes: size,
            copied_prefix_bytes,
            flushed,
        });
    }
    let flush_start = Instant::now();
    dst.flush().await.map_err(CopyError::Flush)?;
    let flush_seconds = flush_start.elapsed().as_secs_f64();
    let seconds = start.elapsed().as_secs_f64();
    let complete = copied == todo;
    let checksum = if opts.verify && complete {
        Some(verify(src, dst, io, qd, &mut progress).await?)
    } else {
        None
    };
    Ok(CopyReport {
        bytes: copied,
        total_bytes: size,
        complete,
        copied_prefix_bytes,
        skipped_zero_bytes: skipped,
        seconds,
        flush_seconds,
        checksum,
        chunk_size: io,
        queue_depth: qd,
    })
}

fn is_zero(b: &[u8]) -> bool {
    let chunks = b.chunks_exact(16);
    let rest = chunks.remainder();
    chunks
        .map(|c| u128::from_ne_bytes(c.try_into().unwrap()))
        .all(|x| x == 0)
        && rest.iter().all(|&x| x == 0)
}

/// Reads all of `src` and as much of `dst` again, `chunk_size` at a time with up to
/// half of `queue_depth` chunks in flight, and compares them; returns the CRC32C over the
/// per-chunk CRC32Cs of the source.
pub async fn verify(
    src: &Endpoint,
    dst: &Endpoint,
    chunk_size: u64,
    queue_depth: usize,
    mut progress: impl FnMut(Progress),
) -> Result<u32, CopyError> {
    let (size, io, qd) = (src.size(), chunk_size.max(1), queue_depth);
    let chunks = size.div_ceil(io) as usize;
    let mut crcs = vec![0u32; chunks];
    let mut set: JoinSet<Result<(usize, u32, u32), CopyError>> = JoinSet::new();
    let mut next = 0usize;
    let mut mismatches = Vec::new();
    let (start, mut checked) = (Instant::now(), 0u64);
    while next < chunks || !set.is_empty() {
        while next < chunks && set.len() < qd.max(2) / 2 {
            let (src, dst) = (src.clone(), dst.clone());
            let i = next;
            set.spawn(async move {
                let off = i as u64 * io;
                let len = io.min(size - off) as usize;
                let (a, b) = tokio::try_join!(src.read(off, len), dst.read(off, len))
                    .map_err(CopyError::Reread)?;
                Ok((i, crc32c::crc32c(&a), crc32c::crc32c(&b)))
            });
            next += 1;
        }
        if let Some(r) = set.join_next().await {
            let (i, a, b) = r??;
            crcs[i] = a;
            if a != b {
                mismatches.push(i as u64 * io);
            }
            checked += io.min(size - i as u64 * io);
            progress(Progress::new(Phase::Verify, checked, size, start));
        }
    }
    if let Some(&first_offset) = mismatches.iter().min() {
        return Err(CopyError::Mismatch {
            chunks: mismatches.len(),
            first_offset,
        });
    }
    let mut all = Vec::with_capacity(crcs.len() * 4);
    for c in crcs {
        all.extend_from_slice(&c.to_be_bytes());
    }
    Ok(crc32c::crc32c(&all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("rsv-copy-{}-{name}", std::process::id()))
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// A source that fails past 5 MiB: the copy stops, waits for what is in flight, and
    /// says that the first 5 MiB are done; resumed there once the source reads again, it
    /// ends with the destination equal to the source.
    #[test]
    fn a_failure_leaves_a_resumable_prefix() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (src_path, dst_path) = (scratch("src"), scratch("dst"));
        let whole = pattern(8 << 20);
        std::fs::write(&src_path, &whole[..5 << 20]).unwrap();
        // The source claims 8 MiB but holds 5: reading chunk 5 fails.
        let src = Endpoint::File {
            file: Arc::new(std::fs::File::open(&src_path).unwrap()),
            size: 8 << 20,
        };
        let (dst, _) = Endpoint::create_file(&dst_path, 8 << 20, true).unwrap();
        let opts = CopyOptions {
            queue_depth: Some(2),
            ..CopyOptions::default()
        };
        let err = rt
            .block_on(copy(&src, &dst, &opts, |_| {}))
            .expect_err("the source fails");
        assert_eq!(err.resume_offset(), Some(5 << 20), "{err}");
        let CopyError::Interrupted {
            ref source,
            flushed,
            ..
        } = err
        else {
            panic!("{err:?}")
        };
        assert!(flushed);
        assert!(
            matches!(**source, CopyError::Read { offset, .. } if offset >= 5 << 20),
            "{source:?}"
        );
        assert!(
            err.to_string().contains("the first 5242880 of 8388608"),
            "{err}"
        );
        std::fs::write(&src_path, &whole).unwrap();
        let src = Endpoint::open_file(&src_path).unwrap();
        let opts = CopyOptions {
            start_offset: 5 << 20,
            ..opts
        };
        let r = rt.block_on(copy(&src, &dst, &opts, |_| {})).unwrap();
        assert!(r.complete);
        assert_eq!(r.bytes, 3 << 20);
        assert!(std::fs::read(&dst_path).unwrap() == whole);
        let _ = std::fs::remove_file(&src_path);
        let _ = std::fs::remove_file(&dst_path);
    }
}
