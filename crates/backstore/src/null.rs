//! The `null` store: no data at all. Reads return zeros, writes are taken and dropped; it
//! measures the network path and the target without a disk under them.

use std::io;
use std::sync::Arc;

use crate::lend::ZEROS_LEN;
use crate::{check_range, Backstore, Lent, OpenContext, OpenError, Param, StoreFactory, StoreSpec};
use units::Size;

/// A store of `size` bytes that keeps nothing: every read gives zeros, every write is
/// accepted and forgotten, and a flush has nothing to make durable. Reads up to 1 MiB are
/// lent from one static page of zeros, so the target's read path copies nothing.
#[derive(Debug)]
pub struct NullBackstore {
    size: u64,
}

impl NullBackstore {
    pub fn new(size: u64) -> Self {
        Self { size }
    }
}

impl Backstore for NullBackstore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        buf.fill(0);
        Ok(())
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        self.read_at(buf, offset).map(|()| true)
    }

    fn can_lend(&self) -> bool {
        true
    }

    fn lends_memory(&self) -> bool {
        true
    }

    /// Zeros from the static page; `None` above its size (the copy serves it).
    fn lend(&self, offset: u64, len: u64, _wait: bool) -> io::Result<Option<Lent>> {
        check_range(offset, len, self.size)?;
        if len == 0 || len > ZEROS_LEN as u64 {
            return Ok(None);
        }
        Ok(Some(Lent::zeros(len as usize)))
    }

    /// In range, dropped: nothing is kept. Out of range, refused as every store does.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.size)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.size)
    }

    /// Nothing is ever allocated: every block reads as zeros, as a deallocated one does.
    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        check_range(offset, len, self.size)?;
        let mut out = Vec::new();
        crate::push_extent(&mut out, offset, len, false);
        Ok(out)
    }

    fn supports_discard(&self) -> bool {
        true
    }

    fn description(&self) -> String {
        format!("null, {} (reads zeros, drops writes)", Size(self.size))
    }
}

/// `null:?size=SIZE`.
pub(crate) struct NullFactory;

impl StoreFactory for NullFactory {
    fn kind(&self) -> &str {
        "null"
    }

    fn summary(&self) -> &str {
        "no data: reads return zeros and writes are dropped (to measure the network \
         path without a disk)"
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
            "null, {} (reads return zeros, writes are dropped)",
            Size(size)
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
        Ok(Arc::new(NullBackstore::new(size)))
    }
}
