//! COMPARE AND WRITE through librbd (`rbd_compare_and_write`): the OSD that holds the
//! object compares and writes in one operation, so the step is atomic against every
//! client of the image — the other gateways of a shared image included — where the
//! logical unit's range lock holds only within one process.
//!
//! What librbd 16.2.15 (Debian 12's) takes, measured on the test cluster
//! (`scripts/ceph-cluster.sh`; docs/bench-gateway-caw.md): a range inside one
//! 512-byte sector, aligned or not crossing it; anything longer, or crossing a sector,
//! fails with EINVAL before any I/O (its request is cut per object and refused unless it
//! is one object extent within one sector). A range inside one sector is also inside one
//! object, so the OSD's compare-and-write (a `cmpext` and a `write` in one op) covers it
//! whole. Longer ranges are refused here, never split: two sectors compared and written
//! one after the other are not one atomic step (the first may be written when the second
//! miscompares), which is the lost update COMPARE AND WRITE exists to prevent. The logical
//! unit reports the limit (MAXIMUM COMPARE AND WRITE LENGTH, 1 block of 512 bytes) on an
//! image shared by several gateways.
//!
//! The mismatch offset: librbd 16.2 returns it counted from the range's start (a
//! mismatch at byte 300 of a range at 4096 reads 300); a librbd that counts it from the
//! image's start is read as such when the value can only be that.

use std::io;

use backstore::{within_unit, Compared};

use crate::{errno, ffi, Conn};

/// The unit within which librbd takes a compare-and-write (see the module's text).
pub(crate) const UNIT: u64 = 512;

/// EILSEQ: librbd's answer to a compare that found a difference.
const EILSEQ: isize = 84;

impl Conn {
    pub(crate) fn compare_and_write(
        &self,
        offset: u64,
        verify: &[u8],
        write: &[u8],
    ) -> io::Result<Compared> {
        let len = verify.len();
        let mut mismatch = u64::MAX;
        // SAFETY: both buffers are valid for `len` bytes for the whole (synchronous) call;
        // `mismatch` outlives it.
        let r = unsafe {
            ffi::rbd_compare_and_write(
                self.image,
                offset,
                len,
                verify.as_ptr().cast(),
                write.as_ptr().cast(),
                &mut mismatch,
                0,
            )
        };
        if r == -EILSEQ {
            return Ok(Compared::Mismatch(mismatch_offset(
                offset, len as u64, mismatch,
            )));
        }
        if r < 0 {
            return Err(errno(
                r as i64,
                format!("compare-and-write of {len} at {offset}"),
            ));
        }
        if r as usize != len {
            return Err(io::Error::other(format!(
                "compare-and-write of {len} at {offset}: only {r} bytes"
            )));
        }
        Ok(Compared::Written)
    }
}

/// Refuses what librbd would refuse, before asking it, with the reason.
pub(crate) fn check(offset: u64, verify: &[u8], write: &[u8]) -> io::Result<()> {
    let len = verify.len() as u64;
    if write.len() != verify.len() || !within_unit(offset, len, UNIT) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "compare-and-write of {len} bytes at {offset}: librbd compares and writes \
                 atomically only within one {UNIT}-byte sector"
            ),
        ));
    }
    Ok(())
}

/// The first differing byte, counted from the range's start, from what librbd reported.
fn mismatch_offset(offset: u64, len: u64, reported: u64) -> u64 {
    if reported < len {
        reported
    } else if reported >= offset && reported - offset < len {
        reported - offset
    } else {
        // Nothing was written: the miscompare stands, with the only offset that is
        // surely within the range.
        tracing::warn!(
            offset,
            len,
            reported,
            "librbd reported a mismatch offset outside the range"
        );
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_librbd_takes() {
        assert!(check(0, &[0; 512], &[0; 512]).is_ok());
        assert!(check(4096, &[0; 512], &[0; 512]).is_ok());
        assert!(check(512 * 7, &[0; 512], &[0; 512]).is_ok());
        assert!(check(0, &[0; 1024], &[0; 1024]).is_err());
        assert!(check(256, &[0; 512], &[0; 512]).is_err());
        assert!(check(0, &[0; 512], &[0; 256]).is_err());
    }

    #[test]
    fn mismatch_offsets() {
        assert_eq!(mismatch_offset(4096, 512, 300), 300);
        assert_eq!(mismatch_offset(4096, 512, 4096 + 300), 300);
        assert_eq!(mismatch_offset(0, 512, 511), 511);
        assert_eq!(mismatch_offset(4096, 512, 9999), 0);
    }
}
