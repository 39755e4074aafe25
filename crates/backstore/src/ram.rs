use std::io;
use std::sync::{Arc, RwLock};

use crate::lend::{LentMemory, ZEROS_LEN};
use crate::sized::SizedFactory;
use crate::{check_range, push_extent, within_unit, Backstore, Compared, Lent};
use units::Size;

const CHUNK: u64 = 1 << 20;
const _: () = assert!(CHUNK as usize <= ZEROS_LEN);

/// One chunk's bytes. Written only under the chunk's lock (exclusive); read under it
/// (shared) by copies, and without it through windows lent on ranges that the logical
/// unit keeps writers off while they live. Freed when the store and every window let go.
#[derive(Debug)]
struct Chunk {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the bytes are reached only as described on `Chunk`: writes under the exclusive
// lock, never to a range a window is lent on.
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl LentMemory for Chunk {}

impl Chunk {
    /// `len` zeros (calloc'd: pages the kernel hands over already zeroed).
    fn zeroed(len: usize) -> Chunk {
        let b = vec![0u8; len].into_boxed_slice();
        let len = b.len();
        Chunk {
            ptr: Box::into_raw(b).cast::<u8>(),
            len,
        }
    }

    fn bytes(&self, at: usize, n: usize) -> &[u8] {
        assert!(at + n <= self.len);
        // SAFETY: within the allocation; see `Chunk` for who writes meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), n) }
    }

    /// # Safety
    /// The caller holds the chunk's lock exclusively, and no window is lent on the range.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, at: usize, n: usize) -> &mut [u8] {
        assert!(at + n <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(at), n)
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` of a boxed slice of `len` bytes in `zeroed`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// A memory store split into 1 MiB chunks, each behind its own lock and allocated on first
/// write, so a large LUN costs nothing until used and unrelated I/O never contends. Large
/// reads lend the chunk's bytes (or zeros, for a chunk never written) rather than copy
/// them: the bytes are memory, which the TLS carrier may encrypt from where they lie.
#[derive(Debug)]
pub struct RamBackstore {
    size: u64,
    chunks: Vec<RwLock<Option<Arc<Chunk>>>>,
}

impl RamBackstore {
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK) as usize;
        Self {
            size,
            chunks: (0..n).map(|_| RwLock::new(None)).collect(),
        }
    }

    fn chunk_len(&self, index: usize) -> usize {
        let start = index as u64 * CHUNK;
        (self.size - start).min(CHUNK) as usize
    }

    /// Calls `f(chunk index, offset in chunk, position in the request, length)` for every
    /// piece of `[offset, offset + len)`.
    fn pieces(
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, usize, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut pos = 0u64;
        while pos < len {
            let abs = offset + pos;
            let index = (abs / CHUNK) as usize;
            let within = abs % CHUNK;
            let n = (CHUNK - within).min(len - pos);
            f(index, within as usize, pos as usize, n as usize)?;
            pos += n;
        }
        Ok(())
    }

    /// Zeros or frees part of a chunk; a chunk cleared whole is freed.
    fn clear(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.size)?;
        Self::pieces(offset, len, |index, within, _, n| {
            let mut chunk = self.chunks[index]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            if n == self.chunk_len(index) {
                *chunk = None;
            } else if let Some(data) = chunk.as_ref() {
                // SAFETY: the chunk's lock is held exclusively; the logical unit keeps
                // lent windows off a range being zeroed.
                unsafe { data.bytes_mut(within, n) }.fill(0);
            }
            Ok(())
        })
    }
}

impl Backstore for RamBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::pieces(offset, buf.len() as u64, |index, within, pos, n| {
            let chunk = self.chunks[index].read().unwrap_or_else(|e| e.into_inner());
            let dst = &mut buf[pos..pos + n];
            match chunk.as_ref() {
                Some(data) => dst.copy_from_slice(data.bytes(within, n)),
                None => dst.fill(0),
            }
            Ok(())
        })
    }

    in_memory!();

    /// A window on one chunk's bytes, or zeros for a chunk never written; `None` for a
    /// range across chunks (the copy serves it).
    fn lend(&self, offset: u64, len: u64, _wait: bool) -> io::Result<Option<Lent>> {
        check_range(offset, len, self.size)?;
        let (index, within) = ((offset / CHUNK) as usize, (offset % CHUNK) as usize);
        if len == 0 || within as u64 + len > CHUNK {
            return Ok(None);
        }
        let chunk = self.chunks[index].read().unwrap_or_else(|e| e.into_inner());
        Ok(Some(match chunk.as_ref() {
            None => Lent::zeros(len as usize),
            Some(data) => {
                let ptr = data.bytes(within, len as usize).as_ptr();
                // SAFETY: the range lies within the chunk (checked by `bytes`), which the
                // window's `Arc` keeps allocated; the caller keeps writers off it.
                unsafe { Lent::memory(data.clone(), ptr, len as usize) }
            }
        }))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::pieces(offset, buf.len() as u64, |index, within, pos, n| {
            let mut chunk = self.chunks[index]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let len = self.chunk_len(index);
            let data = chunk.get_or_insert_with(|| Arc::new(Chunk::zeroed(len)));
            // SAFETY: the chunk's lock is held exclusively; the logical unit keeps lent
            // windows off a range being written.
            unsafe { data.bytes_mut(within, n) }.copy_from_slice(&buf[pos..pos + n]);
            Ok(())
        })
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    /// Atomic within a chunk: the compare and the write both happen under the chunk's
    /// lock, which every writer of the chunk takes.
    fn atomic_compare_and_write_unit(&self) -> Option<u64> {
        Some(CHUNK)
    }

    fn compare_and_write(&self, offset: u64, verify: &[u8], write: &[u8]) -> io::Result<Compared> {
        let len = verify.len() as u64;
        if write.len() != verify.len() || !within_unit(offset, len, CHUNK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("compare-and-write of {len} bytes at {offset} crosses a unit of {CHUNK}"),
            ));
        }
        check_range(offset, len, self.size)?;
        if len == 0 {
            return Ok(Compared::Written);
        }
        let (index, within) = ((offset / CHUNK) as usize, (offset % CHUNK) as usize);
        let mut chunk = self.chunks[index]
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mismatch = match chunk.as_ref() {
            Some(data) => data
                .bytes(within, verify.len())
                .iter()
                .zip(verify)
                .position(|(m, v)| m != v),
            None => verify.iter().position(|&v| v != 0),
        };
        if let Some(at) = mismatch {
            return Ok(Compared::Mismatch(at as u64));
        }
        let n = self.chunk_len(index);
        let data = chunk.get_or_insert_with(|| Arc::new(Chunk::zeroed(n)));
        // SAFETY: the chunk's lock is held exclusively; the logical unit keeps lent
        // windows off a range being written.
        unsafe { data.bytes_mut(within, write.len()) }.copy_from_slice(write);
        Ok(Compared::Written)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.clear(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.clear(offset, len)
    }

    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        check_range(offset, len, self.size)?;
        let mut out = Vec::new();
        Self::pieces(offset, len, |index, _, pos, n| {
            let alloc = self.chunks[index]
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            push_extent(&mut out, offset + pos as u64, n as u64, alloc);
            Ok(())
        })?;
        Ok(out)
    }

    fn supports_discard(&self) -> bool {
        true
    }

    fn description(&self) -> String {
        format!("ram, {}", Size(self.size))
    }
}

/// `ram:?size=SIZE`.
pub(crate) const RAM: SizedFactory = SizedFactory {
    kind: "ram",
    summary: "memory, allocated in 1 MiB chunks as they are first written; lost when the \
              target stops",
    note: "lost when the target stops",
    open: |size| Arc::new(RamBackstore::new(size)),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lends_zeros_then_the_chunk_and_keeps_a_discarded_chunk_for_its_window() {
        let s = RamBackstore::new(3 * CHUNK);
        assert!(s.can_lend() && s.lends_memory());
        // Never written: zeros, from no buffer of the store's.
        let z = s.lend(CHUNK, CHUNK, false).unwrap().unwrap();
        assert!(z.readable_in_user_space());
        assert_eq!(z.len(), CHUNK as usize);
        assert!(z.as_ref().iter().all(|&b| b == 0));
        let data: Vec<u8> = (0..CHUNK).map(|i| (i % 249) as u8 + 1).collect();
        s.write_at(&data, CHUNK).unwrap();
        // The window lent before the write still says what was there then.
        assert!(z.as_ref().iter().all(|&b| b == 0));
        let w = s.lend(CHUNK + 4096, 65536, false).unwrap().unwrap();
        assert_eq!(w.as_ref(), &data[4096..4096 + 65536]);
        // Discarding the chunk frees it from the store, not from under the window.
        s.discard(CHUNK, CHUNK).unwrap();
        assert_eq!(w.as_ref(), &data[4096..4096 + 65536]);
        let mut back = vec![1u8; 65536];
        s.read_at(&mut back, CHUNK + 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        // Across two chunks: not lent (the copy serves it); out of range: an error.
        assert!(s.lend(CHUNK - 512, 1024, false).unwrap().is_none());
        assert!(s.lend(3 * CHUNK - 512, 1024, false).is_err());
        // A partial clear zeroes what a copy reads.
        s.write_at(&data[..8192], 0).unwrap();
        s.write_zeroes(0, 4096).unwrap();
        let mut back = vec![1u8; 8192];
        s.read_at(&mut back, 0).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(&back[4096..], &data[4096..8192]);
    }
}
