//! Reads of large Data-In straight into their command's buffer: the sink a reader fills,
//! the pool of such buffers, and the assembly of a read's data when its status arrives.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

/// Data-In segments at least this large that arrive in order go from the socket straight
/// into their read's buffer rather than through the connection's buffer and a copy when
/// the read completes.
pub(super) const PLACE_MIN: usize = 32 * 1024;

/// The buffer of one read that its connection's reader fills straight from the socket
/// with the Data-In segments that arrive in order (see [`PLACE_MIN`]).
pub(super) struct ReadSink {
    /// The read's expected length: the buffer's capacity.
    pub(super) edtl: usize,
    /// The data placed so far, from offset 0. The reader takes it out while it reads
    /// into it (`None` meanwhile) and puts it back before it tells the task.
    pub(super) buf: Mutex<Option<Vec<u8>>>,
    /// Where the buffer comes from and goes back to once the caller drops the data.
    pub(super) pool: Arc<BufPool>,
}

/// Read buffers used before, kept for the next reads: a fresh one costs a page fault and
/// a zeroed page per 4 KiB as the socket's data is copied into it.
#[derive(Default)]
pub(super) struct BufPool {
    pub(super) free: Mutex<Vec<Vec<u8>>>,
}

impl BufPool {
    /// Bytes of idle buffers kept at most.
    const MAX_IDLE: usize = 64 << 20;

    /// An empty buffer of at least `cap` bytes' capacity (and not wastefully more): the
    /// one given back last, whose memory is likeliest still in the CPU's caches.
    pub(super) fn take(&self, cap: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap();
        match free
            .iter()
            .rposition(|v| v.capacity() >= cap && v.capacity() / 2 <= cap)
        {
            Some(i) => free.remove(i),
            None => {
                drop(free);
                Vec::with_capacity(cap)
            }
        }
    }

    pub(super) fn put(&self, mut v: Vec<u8>) {
        v.clear();
        let mut free = self.free.lock().unwrap();
        let idle: usize = free.iter().map(Vec::capacity).sum();
        if idle + v.capacity() <= Self::MAX_IDLE {
            free.push(v);
        }
    }

    /// `v` as the caller's data; the buffer comes back here when the last `Bytes` of it
    /// is dropped.
    pub(super) fn wrap(self: &Arc<Self>, v: Vec<u8>) -> Bytes {
        struct Pooled(Vec<u8>, std::sync::Weak<BufPool>);
        impl AsRef<[u8]> for Pooled {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Pooled {
            fn drop(&mut self) {
                if let Some(pool) = self.1.upgrade() {
                    pool.put(std::mem::take(&mut self.0));
                }
            }
        }
        Bytes::from_owner(Pooled(v, Arc::downgrade(self)))
    }
}

/// The Data-In payloads of one read: a prefix its reader placed in the read's own buffer
/// ([`ReadSink`]), and the others as the reader's copies of them. Nothing is zeroed or
/// copied again until the status arrives, and then only when segments were not placed.
#[derive(Default)]
pub(super) struct ReadData {
    pub(super) parts: Vec<(usize, Bytes)>,
    pub(super) received: usize,
    pub(super) sink: Option<Arc<ReadSink>>,
    /// Bytes of the sink, from offset 0, that the reader said it placed.
    pub(super) placed: usize,
}

impl ReadData {
    /// The reader put `len` bytes at `off` into the sink: always where the previous
    /// placement ended.
    pub(super) fn placed(&mut self, off: usize, len: usize) {
        self.placed = self.placed.max(off + len);
        self.received = self.received.max(off + len);
    }

    pub(super) fn add(&mut self, off: usize, data: Bytes) {
        self.received = self.received.max(off + data.len());
        if !data.is_empty() {
            self.parts.push((off, data));
        }
    }

    /// The data of a read of `edtl` bytes with `residual` not sent: one payload is
    /// returned as it is, several in order are joined with a single copy; gaps (out of
    /// order, or less sent than the residual says) read as zeros.
    pub(super) fn into_bytes(mut self, edtl: u32, residual: u32) -> Bytes {
        let len = self
            .received
            .max(edtl.saturating_sub(residual) as usize)
            .min(edtl as usize);
        if let Some(sink) = self.sink.take().filter(|_| self.placed > 0) {
            let mut v = sink.buf.lock().unwrap().take().unwrap_or_default();
            // What the task was told of (the reader puts the buffer back first).
            v.resize(self.placed, 0);
            if self.parts.is_empty() || v.len() >= len {
                v.resize(len, 0);
                return sink.pool.wrap(v);
            }
            self.parts.insert(0, (0, sink.pool.wrap(v)));
        }
        if let [(0, b)] = &self.parts[..] {
            if b.len() >= len {
                return b.slice(..len);
            }
        }
        let in_order = self
            .parts
            .iter()
            .try_fold(0, |pos, (off, b)| (*off == pos).then_some(pos + b.len()))
            .is_some();
        let mut out = BytesMut::with_capacity(len);
        if in_order {
            for (_, b) in &self.parts {
                out.extend_from_slice(&b[..b.len().min(len - out.len())]);
            }
            out.resize(len, 0);
        } else {
            out.resize(len, 0);
            for (off, b) in &self.parts {
                let end = (off + b.len()).min(len);
                if *off < end {
                    out[*off..end].copy_from_slice(&b[..end - off]);
                }
            }
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_data_assembly() {
        let whole = ReadData {
            parts: vec![(0, Bytes::from_static(b"abcd"))],
            received: 4,
            ..ReadData::default()
        };
        assert_eq!(&whole.into_bytes(4, 0)[..], b"abcd");
        let mut parts = ReadData::default();
        parts.add(0, Bytes::from_static(b"ab"));
        parts.add(2, Bytes::from_static(b"cd"));
        assert_eq!(&parts.into_bytes(6, 0)[..], b"abcd\0\0");
        let mut shuffled = ReadData::default();
        shuffled.add(2, Bytes::from_static(b"cd"));
        shuffled.add(0, Bytes::from_static(b"ab"));
        assert_eq!(&shuffled.into_bytes(8, 4)[..], b"abcd");
    }

    #[test]
    fn read_data_with_a_placed_prefix() {
        let pool = Arc::new(BufPool::default());
        let sink = |placed: &[u8]| {
            Arc::new(ReadSink {
                edtl: 8,
                buf: Mutex::new(Some(placed.to_vec())),
                pool: pool.clone(),
            })
        };
        // Placed, then a segment that was not: joined.
        let mut d = ReadData {
            sink: Some(sink(b"abcd")),
            ..ReadData::default()
        };
        d.placed(0, 4);
        d.add(4, Bytes::from_static(b"efgh"));
        assert_eq!(&d.into_bytes(8, 0)[..], b"abcdefgh");
        // All placed: the buffer itself, which goes back to the pool when dropped.
        let mut d = ReadData {
            sink: Some(sink(b"abcdefgh")),
            ..ReadData::default()
        };
        d.placed(0, 4);
        d.placed(4, 4);
        let b = d.into_bytes(8, 0);
        assert_eq!(&b[..], b"abcdefgh");
        assert_eq!(pool.free.lock().unwrap().len(), 1);
        drop(b);
        assert_eq!(pool.free.lock().unwrap().len(), 2);
        assert!(pool.take(8).capacity() >= 8);
        // Less sent than expected: what the reader placed, no more.
        let mut d = ReadData {
            sink: Some(sink(b"abcdef")),
            ..ReadData::default()
        };
        d.placed(0, 6);
        assert_eq!(&d.into_bytes(8, 2)[..], b"abcdef");
    }
}
