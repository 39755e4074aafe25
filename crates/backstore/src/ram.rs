use std::io;
use std::sync::{Arc, RwLock};

use crate::registry::human_size;
use crate::{
    check_range, push_extent, Backstore, OpenContext, OpenError, Param, StoreFactory, StoreSpec,
};

const CHUNK: u64 = 1 << 20;

/// A memory store split into 1 MiB chunks, each behind its own lock and allocated on first
/// write, so a large LUN costs nothing until used and unrelated I/O never contends.
#[derive(Debug)]
pub struct RamBackstore {
    size: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
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
            } else if let Some(data) = chunk.as_mut() {
                data[within..within + n].fill(0);
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
                Some(data) => dst.copy_from_slice(&data[within..within + n]),
                None => dst.fill(0),
            }
            Ok(())
        })
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        self.read_at(buf, offset).map(|()| true)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        Self::pieces(offset, buf.len() as u64, |index, within, pos, n| {
            let mut chunk = self.chunks[index]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let len = self.chunk_len(index);
            let data = chunk.get_or_insert_with(|| vec![0u8; len].into_boxed_slice());
            data[within..within + n].copy_from_slice(&buf[pos..pos + n]);
            Ok(())
        })
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
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
        format!("ram, {}", human_size(self.size))
    }
}

/// `ram:?size=SIZE`.
pub(crate) struct RamFactory;

impl StoreFactory for RamFactory {
    fn kind(&self) -> &str {
        "ram"
    }

    fn summary(&self) -> &str {
        "memory, allocated in 1 MiB chunks as they are first written; lost when the \
         target stops"
    }

    fn params(&self) -> &[Param] {
        &[Param {
            name: "size",
            required: true,
            help: "1GiB or 1G (binary), 1GB (decimal) or bytes",
        }]
    }

    fn check(&self, spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let size = spec.size("size")?.ok_or_else(|| spec.missing("size"))?;
        Ok(format!(
            "ram, {} (lost when the target stops)",
            human_size(size)
        ))
    }

    fn capacity(&self, spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<u64, String> {
        spec.size("size")
            .map_err(|e| e.to_string())?
            .ok_or_else(|| spec.missing("size").to_string())
    }

    fn open(
        &self,
        spec: &StoreSpec,
        _ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        let size = spec.size("size")?.ok_or_else(|| spec.missing("size"))?;
        Ok(Arc::new(RamBackstore::new(size)))
    }
}
