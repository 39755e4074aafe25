//! The `null` store: no data at all. Reads return zeros, writes are taken and dropped; it
//! measures the network path and the target without a disk under them.

use std::io;
use std::sync::Arc;

use crate::lend::ZEROS_LEN;
use crate::sized::SizedFactory;
use crate::{check_range, Backstore, Lent};
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

    in_memory!();

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
pub(crate) const NULL: SizedFactory = SizedFactory {
    kind: "null",
    summary: "no data: reads return zeros and writes are dropped (to measure the network \
              path without a disk)",
    note: "reads return zeros, writes are dropped",
    open: |size| Arc::new(NullBackstore::new(size)),
};
