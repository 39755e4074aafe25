//! Lending a store's bytes without copying them: a read-only memory mapping of the backing
//! file, of which a [`Lent`] is a window, or a memory store's own buffer (the ram store;
//! see [`Lent::readable_in_user_space`]).
//!
//! A copy from the page cache into a buffer was a third of the target's CPU on large reads;
//! a window on the mapping goes from the page cache to the socket in the kernel's one copy.
//! The window is meant for the kernel only (`writev`, `send`): if the file shrinks behind
//! our back, or a page cannot be read from the device, a user-space read of the window
//! raises SIGBUS where a kernel copy from it fails with `EFAULT`. Callers that must look
//! at the bytes themselves (a data digest, say) read them instead.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::io::RawFd;
use std::sync::Arc;

/// A shared, read-only mapping of a whole file, unmapped when the last window goes.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only for us and lives until the last owner drops it; the
// pointer is only handed out as windows within `len`.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from its start; `None` when the system refuses (or `len` is 0).
    pub(crate) fn new(fd: RawFd, len: u64) -> Option<Arc<Self>> {
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        // SAFETY: a fresh shared read-only mapping of our own open descriptor; nothing else
        // refers to the address range the kernel picks.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            tracing::debug!(
                "no memory mapping of the store ({}); reads copy",
                io::Error::last_os_error()
            );
            return None;
        }
        Some(Arc::new(Self { ptr, len }))
    }

    /// The page-aligned address range that covers `[offset, offset + len)`.
    fn pages(&self, offset: usize, len: usize) -> (*mut libc::c_void, usize) {
        let page = page_size();
        let start = offset / page * page;
        let end = (offset + len).div_ceil(page) * page;
        // SAFETY: `start` is within the mapping (offset < self.len), so is the pointer.
        (
            unsafe { self.ptr.cast::<u8>().add(start) }.cast(),
            end - start,
        )
    }

    /// Whether every page of the range is in memory now (in the page cache; not
    /// necessarily mapped in this process yet, which then costs a minor fault only).
    pub(crate) fn resident(&self, offset: usize, len: usize) -> bool {
        const MAX_PAGES: usize = 4096;
        let (addr, bytes) = self.pages(offset, len);
        let pages = bytes / page_size();
        if pages > MAX_PAGES {
            return false;
        }
        let mut vec = [0u8; MAX_PAGES];
        // SAFETY: the range lies within our mapping; `vec` has room for one byte per page.
        let rc = unsafe { libc::mincore(addr, bytes, vec.as_mut_ptr()) };
        rc == 0 && vec[..pages].iter().all(|b| b & 1 == 1)
    }

    /// Reads the range into memory now, waiting for the device if need be. Errors (a bad
    /// sector, a file cut short) come back as errors, not as a signal; `Unsupported` on a
    /// kernel before 5.14.
    pub(crate) fn populate(&self, offset: usize, len: usize) -> io::Result<()> {
        let (addr, bytes) = self.pages(offset, len);
        // SAFETY: advice on a range within our own mapping; it changes no memory contents.
        let rc = unsafe { libc::madvise(addr, bytes, MADV_POPULATE_READ) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINVAL) => Err(io::ErrorKind::Unsupported.into()),
            _ => Err(err),
        }
    }

    /// A window on `[offset, offset + len)`, which the caller has checked lies within.
    pub(crate) fn lend(self: &Arc<Self>, offset: usize, len: usize) -> Lent {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        Lent {
            // SAFETY: within the mapping (asserted above).
            ptr: unsafe { self.ptr.cast::<u8>().add(offset) },
            len,
            owner: Owner::Map(self.clone()),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no window outlives the Arc that owns us.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// `MADV_POPULATE_READ` (Linux 5.14, the same on every architecture); not in `libc` yet.
const MADV_POPULATE_READ: libc::c_int = 22;

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Memory a store lends out of its own buffers: kept alive by the window, whatever the
/// store does with it meanwhile (a ram chunk discarded while lent is freed with the
/// last window).
pub(crate) trait LentMemory: Send + Sync + std::fmt::Debug {}

/// Any owner of bytes, as [`Lent::owned`] keeps it.
#[derive(Debug)]
struct Held<T>(T);

impl<T: Send + Sync + std::fmt::Debug> LentMemory for Held<T> {}

/// What keeps a window's bytes where they are.
#[derive(Debug)]
enum Owner {
    Map(#[allow(dead_code)] Arc<Mapping>),
    Memory(#[allow(dead_code)] Arc<dyn LentMemory>),
    Zeros,
}

/// Never-written blocks of a memory store: lent from here, without filling a buffer.
static ZEROS: [u8; ZEROS_LEN] = [0; ZEROS_LEN];
/// The longest run of zeros [`Lent::zeros`] lends (a ram chunk).
pub(crate) const ZEROS_LEN: usize = 1 << 20;

/// Bytes of a store lent without a copy: a read-only window on the store's memory mapping
/// (hand it to the kernel, `writev`; see the module's note before reading it in user
/// space), or on a memory store's buffer (which anyone may read). The bytes are those on
/// the store while the window is sent: whoever lends it keeps writers off the range until
/// it is dropped.
#[derive(Debug)]
pub struct Lent {
    ptr: *const u8,
    len: usize,
    owner: Owner,
}

// SAFETY: the window is a read-only view of memory its owner keeps alive (an `Arc` of the
// mapping or the buffer, or a static); nothing writes through it.
unsafe impl Send for Lent {}
unsafe impl Sync for Lent {}

impl Lent {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether user space may read the bytes (encrypt them, digest them): true for memory,
    /// false for a file's mapping, where a page gone from under us is SIGBUS.
    pub fn readable_in_user_space(&self) -> bool {
        !matches!(self.owner, Owner::Map(_))
    }

    /// `len` bytes at `ptr` inside `owner`'s memory, which stays where it is while `owner`
    /// lives.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must lie within memory that `owner` keeps allocated, and the
    /// lender must keep writers off it while the window lives.
    pub(crate) unsafe fn memory(owner: Arc<dyn LentMemory>, ptr: *const u8, len: usize) -> Lent {
        Lent {
            ptr,
            len,
            owner: Owner::Memory(owner),
        }
    }

    /// The whole of `owner`'s bytes, lent for as long as the window lives: a store's read
    /// handed over in its own memory (librbd's buffers: see
    /// [`Backstore::read_lent_async`](crate::Backstore::read_lent_async)). `owner` must
    /// keep its bytes where they are and unchanged while it lives (as `Bytes::from_owner`
    /// asks): they are looked up once, here.
    pub fn owned<T>(owner: T) -> Lent
    where
        T: AsRef<[u8]> + Send + Sync + std::fmt::Debug + 'static,
    {
        let owner = Arc::new(Held(owner));
        let (ptr, len) = {
            let b = owner.0.as_ref();
            (b.as_ptr(), b.len())
        };
        Lent {
            ptr,
            len,
            owner: Owner::Memory(owner),
        }
    }

    /// `len` (at most 1 MiB) zeros.
    pub(crate) fn zeros(len: usize) -> Lent {
        assert!(len <= ZEROS_LEN);
        Lent {
            ptr: ZEROS.as_ptr(),
            len,
            owner: Owner::Zeros,
        }
    }
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the window lies within memory its owner keeps alive as long as `self`
        // (checked in `Mapping::lend`, promised to `Lent::memory`, a static for zeros).
        // A mapping is read-only; writes through the file or into the buffer are kept off
        // this range by the lender's lock while the window lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Copies bytes that may lie in a lent window into a fresh buffer, through the kernel: a
/// page it cannot read (a file cut short behind our back, a failing device) comes back as
/// an error (`EFAULT`, `EIO`) where a copy in user space would take SIGBUS. For when lent
/// bytes must be kept past their lease; slower than a plain copy (a pipe, two kernel
/// copies), so not for the fast path.
pub fn copy_checked(src: &[u8]) -> io::Result<Vec<u8>> {
    const CHUNK: usize = 64 * 1024; // a pipe's default capacity: a write never blocks
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors we pass room for.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours alone; OwnedFd closes them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut out = vec![0u8; src.len()];
    let mut off = 0;
    while off < src.len() {
        let n = (src.len() - off).min(CHUNK);
        // SAFETY: reads at most `n` bytes of `src` from `off`; the kernel checks the pages.
        let wrote = unsafe { libc::write(w.as_raw_fd(), src[off..].as_ptr().cast(), n) };
        if wrote <= 0 {
            return Err(io::Error::last_os_error());
        }
        let wrote = wrote as usize;
        let mut got = 0;
        while got < wrote {
            // SAFETY: fills at most `wrote - got` bytes of `out`, which we own, from `off + got`.
            let n = unsafe {
                libc::read(
                    r.as_raw_fd(),
                    out[off + got..].as_mut_ptr().cast(),
                    wrote - got,
                )
            };
            if n <= 0 {
                return Err(io::Error::last_os_error());
            }
            got += n as usize;
        }
        off += wrote;
    }
    Ok(out)
}
