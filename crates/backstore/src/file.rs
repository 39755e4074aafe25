use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use crate::lend::{Lent, Mapping, ZEROS_LEN};
use crate::{
    check_range, push_extent, Backstore, OpenContext, OpenError, Param, StoreError, StoreFactory,
    StoreSpec,
};
use units::Size;

/// A sparse file accessed with positioned reads and writes, so many threads share one
/// descriptor without seeking.
#[derive(Debug)]
pub struct FileBackstore {
    path: PathBuf,
    file: File,
    size: u64,
    read_only: bool,
    /// How [`Backstore::try_read_at`] learns whether a read would wait: one of `NOWAIT_*`.
    nowait: AtomicU8,
    /// The whole file mapped read-only, made on the first [`Backstore::lend`]; `None` when
    /// the system would not map it.
    map: OnceLock<Option<Arc<Mapping>>>,
    /// `MADV_POPULATE_READ` is refused (a kernel before 5.14): lend only what is resident.
    no_populate: AtomicBool,
}

/// The file system honours `RWF_NOWAIT` on reads (ext4, xfs, btrfs): a read that would go
/// to the device fails with `EAGAIN`.
const NOWAIT_PROBE: u8 = 0;
/// tmpfs: the data is in memory, reads never wait for a device (tmpfs refuses
/// `RWF_NOWAIT`, so it cannot be asked).
const NOWAIT_MEMORY: u8 = 1;
/// Neither: every read may wait.
const NOWAIT_NEVER: u8 = 2;

fn nowait_mode(file: &File) -> u8 {
    const TMPFS_MAGIC: libc::c_long = 0x0102_1994;
    // SAFETY: fstatfs fills the zeroed struct we own; the descriptor is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    if rc == 0 && st.f_type as libc::c_long == TMPFS_MAGIC {
        NOWAIT_MEMORY
    } else {
        NOWAIT_PROBE
    }
}

const ZERO_BUF: usize = 1 << 20;

impl FileBackstore {
    /// Opens (or, with `create`, makes) a file store. `size: None` takes the file's size;
    /// a larger requested size grows the file, a smaller one is refused rather than lose data.
    pub fn open(
        path: impl AsRef<Path>,
        size: Option<u64>,
        create: bool,
        read_only: bool,
    ) -> io::Result<Self> {
        let path = path.as_ref();
        let exists = path.exists();
        if !exists && create {
            if read_only {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: cannot create a read-only store", path.display()),
                ));
            }
            if size.is_none() {
                return Err(StoreError::NoSize.into());
            }
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .create(create && !read_only)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let existing = file.metadata()?.len();
        let size = match size {
            None => existing,
            Some(requested) if requested < existing => {
                return Err(StoreError::WouldTruncate {
                    requested,
                    existing,
                }
                .into());
            }
            Some(requested) if requested > existing => {
                if read_only {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: read-only file is {existing} bytes, {requested} requested",
                            path.display()
                        ),
                    ));
                }
                file.set_len(requested)?;
                requested
            }
            Some(requested) => requested,
        };
        Ok(Self {
            path: path.to_path_buf(),
            nowait: AtomicU8::new(nowait_mode(&file)),
            file,
            size,
            read_only,
            map: OnceLock::new(),
            no_populate: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            Err(StoreError::ReadOnly.into())
        } else {
            Ok(())
        }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate only reads its integer arguments; the descriptor is ours and open.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeros = vec![0u8; (len as usize).min(ZERO_BUF)];
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], offset + pos)?;
            pos += n as u64;
        }
        Ok(())
    }

    /// [`Backstore::lend`] on tmpfs, where the data is in memory but a hole is no page at
    /// all: reading a hole through the shared mapping makes tmpfs allocate a page for it,
    /// which the file then holds as data (SEEK_DATA finds it, GET LBA STATUS reports the
    /// blocks mapped after an UNMAP or a SANITIZE erase, and the memory stays used), where
    /// `pread` reads zeros and allocates nothing. So only a range without holes is lent
    /// from the mapping, one that is all hole is lent as zeros, and a mix is left to the
    /// copy. The caller's lock keeps UNMAP off the range from before this look until the
    /// window is dropped.
    ///
    /// "Without holes" is asked of `mincore` (on tmpfs a hole is no page, so a range whose
    /// every page is in memory holds none), whose cost is the window's pages. Not of
    /// SEEK_HOLE: tmpfs finds the next hole by walking every page after `offset`, to the
    /// end of a file that has none, so each 1 MiB read of a written 1 GiB LUN walked up to
    /// 262,144 pages and the target read 1 MiB blocks at a thirtieth of its speed. A page
    /// swapped out reads as not in memory: that range goes to the copy, which is correct.
    /// SEEK_DATA stays for the all-hole case: it skips holes without walking them.
    fn lend_from_memory(&self, map: &Arc<Mapping>, offset: u64, len: u64) -> Option<Lent> {
        let end = offset + len;
        if map.resident(offset as usize, len as usize) {
            return Some(map.lend(offset as usize, len as usize));
        }
        // An error (there should be none on tmpfs) leaves the read to the copy, which
        // reports a real one.
        let data = self.seek(offset, libc::SEEK_DATA).ok()?.unwrap_or(end);
        (data >= end && len <= ZEROS_LEN as u64).then(|| Lent::zeros(len as usize))
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        // SAFETY: lseek on our own open descriptor. SEEK_DATA/SEEK_HOLE move the shared file
        // offset, which nothing else uses: all I/O is positioned.
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
        if rc >= 0 {
            return Ok(Some(rc as u64));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        }
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

impl Backstore for FileBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        self.file.read_exact_at(buf, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        check_range(offset, buf.len() as u64, self.size)?;
        match self.nowait.load(Ordering::Relaxed) {
            NOWAIT_MEMORY => return self.read_at(buf, offset).map(|()| true),
            NOWAIT_NEVER => return Ok(false),
            _ => {}
        }
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: one iovec over `buf`, which we borrow mutably for the call; the
        // descriptor is ours and open.
        let n = unsafe {
            libc::preadv2(
                self.file.as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if n == buf.len() as isize {
            return Ok(true);
        }
        if n >= 0 {
            // Partly cached (or a racing truncation): the blocking path reads it whole.
            return Ok(false);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) => Ok(false),
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                self.nowait.store(NOWAIT_NEVER, Ordering::Relaxed);
                Ok(false)
            }
            _ => Err(err),
        }
    }

    fn can_lend(&self) -> bool {
        true
    }

    fn lend(&self, offset: u64, len: u64, wait: bool) -> io::Result<Option<Lent>> {
        check_range(offset, len, self.size)?;
        let Some(map) = self
            .map
            .get_or_init(|| Mapping::new(self.file.as_raw_fd(), self.size))
        else {
            return Ok(None);
        };
        if self.nowait.load(Ordering::Relaxed) == NOWAIT_MEMORY {
            return Ok(self.lend_from_memory(map, offset, len));
        }
        let (offset, len) = (offset as usize, len as usize);
        // The pages must be in the page cache, or be read in now if the caller may wait.
        let ready = map.resident(offset, len)
            || (wait
                && !self.no_populate.load(Ordering::Relaxed)
                && match map.populate(offset, len) {
                    Ok(()) => true,
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                        self.no_populate.store(true, Ordering::Relaxed);
                        false
                    }
                    // The copying read reports it, with the offset that failed.
                    Err(_) => false,
                });
        Ok(ready.then(|| map.lend(offset, len)))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writable()?;
        check_range(offset, buf.len() as u64, self.size)?;
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range(offset, len, self.size)?;
        if len == 0 {
            return Ok(());
        }
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.write_zero_bytes(offset, len),
            r => r,
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range(offset, len, self.size)?;
        if len == 0 {
            return Ok(());
        }
        match self.fallocate(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.write_zero_bytes(offset, len),
            r => r,
        }
    }

    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        check_range(offset, len, self.size)?;
        let end = offset + len;
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end {
            let data = match self.seek(pos, libc::SEEK_DATA) {
                Ok(d) => d.unwrap_or(end).min(end),
                Err(e) if unsupported(&e) => {
                    push_extent(&mut out, pos, end - pos, true);
                    break;
                }
                Err(e) => return Err(e),
            };
            push_extent(&mut out, pos, data - pos, false);
            if data >= end {
                break;
            }
            let hole = self.seek(data, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
            push_extent(&mut out, data, hole - data, true);
            pos = hole;
        }
        Ok(out)
    }

    fn supports_discard(&self) -> bool {
        !self.read_only
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn description(&self) -> String {
        format!("file {}, {}", self.path.display(), Size(self.size))
    }

    fn sidecar(&self, suffix: &str) -> Option<PathBuf> {
        let mut name = self.path.clone().into_os_string();
        name.push(suffix);
        Some(name.into())
    }
}

/// `file:PATH?size=SIZE`.
pub(crate) struct FileFactory;

impl StoreFactory for FileFactory {
    fn kind(&self) -> &str {
        "file"
    }

    fn summary(&self) -> &str {
        "a sparse image file (pread/pwrite; UNMAP punches holes); reservations kept with \
         APTPL go beside it, in PATH.pr"
    }

    fn params(&self) -> &[Param] {
        &[
            Param {
                name: "path",
                required: true,
                help: "the image, relative to the target's data_dir unless absolute; \
                       created sparse when missing",
            },
            Param {
                name: "size",
                required: false,
                help: "1GiB or 1G (binary), 1GB (decimal) or bytes; grows a smaller file, \
                       never truncates; absent: the file's own size",
            },
        ]
    }

    fn check(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let path = ctx.resolve(spec.require("path")?);
        let size = spec.size("size")?;
        let shown = path.display();
        match std::fs::metadata(&path) {
            Ok(meta) => {
                let existing = meta.len();
                match size {
                    Some(want) if want < existing => Err(OpenError::invalid(
                        spec,
                        format!(
                            "{shown} is {existing} bytes, more than size {want}; it is never \
                             truncated (raise size, or leave it out to take the file's)"
                        ),
                    )),
                    Some(want) if want > existing && ctx.is_read_only() => Err(OpenError::invalid(
                        spec,
                        format!("{shown} is {existing} bytes and read-only, size asks for {want}"),
                    )),
                    Some(want) if want > existing => Ok(format!(
                        "file {shown}, {} (grown from {} on start)",
                        Size(want),
                        Size(existing)
                    )),
                    _ => Ok(format!("file {shown}, {}", Size(existing))),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match size {
                _ if ctx.is_read_only() => Err(OpenError::invalid(
                    spec,
                    format!("{shown} does not exist, and a read-only store is not created"),
                )),
                None => Err(OpenError::invalid(
                    spec,
                    format!("{shown} does not exist, and no size is given to create it"),
                )),
                Some(want) => Ok(format!(
                    "file {shown}, {} (created sparse on start)",
                    Size(want)
                )),
            },
            Err(e) => Err(OpenError::io(
                spec,
                io::Error::new(e.kind(), format!("{shown}: {e}")),
            )),
        }
    }

    fn capacity(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<u64, String> {
        let path = ctx.resolve(spec.require("path").map_err(|e| e.to_string())?);
        let size = spec.size("size").map_err(|e| e.to_string())?;
        let existing = std::fs::metadata(&path).map(|m| m.len()).ok();
        size.max(existing)
            .ok_or_else(|| format!("{} does not exist and no size is given", path.display()))
    }

    fn open(
        &self,
        spec: &StoreSpec,
        ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        let path = ctx.resolve(spec.require("path")?);
        let store = FileBackstore::open(&path, spec.size("size")?, true, ctx.is_read_only())
            .map_err(|e| OpenError::io(spec, e))?;
        Ok(Arc::new(store))
    }
}
