//! The commands that read and change the medium: READ, WRITE and their kin, VERIFY,
//! COMPARE AND WRITE, WRITE SAME, SANITIZE, UNMAP and GET LBA STATUS.

use backstore::buffers::Buf;

use crate::cdb::{be16, be32, be64, block_range, truncate, BlockRange};
use crate::opcodes::service_action::sanitize as sa;
use crate::opcodes::*;
use crate::sanitize;
use crate::sense::{self, Sense};

use super::{LogicalUnit, Outcome, WRITE_SAME_CHUNK};

impl LogicalUnit {
    pub(super) fn read_blocks(&self, lba: u64, blocks: u64) -> Outcome {
        let mut buf = Buf::take((blocks * self.block_size) as usize);
        self.store
            .read_at(&mut buf, lba * self.block_size)
            .map_err(|e| self.io_error(e, sense::UNRECOVERED_READ_ERROR.with_information(lba)))?;
        Ok(buf.into_vec())
    }

    pub(super) fn write_blocks(&self, lba: u64, data: &[u8]) -> Result<(), Sense> {
        self.store
            .write_at(data, lba * self.block_size)
            .map_err(|e| self.io_error(e, sense::WRITE_ERROR.with_information(lba)))
    }

    pub(super) fn read(&self, cdb: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        let _guards = self.lock_range_shared(r.lba, r.blocks);
        self.read_blocks(r.lba, r.blocks)
    }

    /// WRITE ATOMIC(16) (SBC-4 5.49): every write here is atomic under its stripe locks;
    /// atomic boundaries are not offered.
    pub(super) fn write_atomic(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let flags = cdb[1];
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        let lba = be64(&cdb[2..10]);
        if be16(&cdb[10..12]) != 0 {
            return Err(Sense::invalid_field_in_cdb(10, None));
        }
        let blocks = be16(&cdb[12..14]) as u64;
        if blocks > self.limits.max_transfer as u64 {
            return Err(Sense::invalid_field_in_cdb(12, None));
        }
        self.check_range(lba, blocks)?;
        self.check_writable()?;
        let data = self.data(data_out, blocks * self.block_size)?;
        if blocks == 0 {
            return Ok(Vec::new());
        }
        self.write_range(lba, blocks, data, flags & 0x08 != 0)
    }

    /// What WRITE, WRITE AND VERIFY and ORWRITE check before they touch the medium:
    /// WRPROTECT (no protection information here), the range, the transfer length, that
    /// the LU takes writes, and a Data-Out buffer that holds the range. `None`: no blocks,
    /// nothing to do.
    fn write_start<'a>(
        &self,
        cdb: &[u8],
        data_out: &'a [u8],
    ) -> Result<Option<(BlockRange, &'a [u8])>, Sense> {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        self.check_writable()?;
        let data = self.data(data_out, r.blocks * self.block_size)?;
        Ok((r.blocks != 0).then_some((r, data)))
    }

    /// Writes `data` at `lba` under the blocks' locks, then makes it durable when
    /// `durable` (FUA) or the write cache is off.
    fn write_range(&self, lba: u64, blocks: u64, data: &[u8], durable: bool) -> Outcome {
        {
            let _guards = self.lock_range(lba, blocks);
            self.write_blocks(lba, data)?;
        }
        self.write_through(durable)?;
        Ok(Vec::new())
    }

    pub(super) fn write(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        match self.write_start(cdb, data_out)? {
            Some((r, data)) => self.write_range(r.lba, r.blocks, data, r.flags & 0x08 != 0),
            None => Ok(Vec::new()),
        }
    }

    /// WRITE COMPRESSED (16): as WRITE (16), its blocks sent as one zstd frame
    /// ([`crate::compressed`]); a frame that is not exactly the blocks is refused
    /// before anything is written.
    pub(super) fn write_compressed(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & !0x08 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, None));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        self.check_writable()?;
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        let len = r.blocks * self.block_size;
        let data = crate::compressed::decompress(data_out, len as usize)
            .ok_or(sense::INVALID_FIELD_IN_PARAMETER_LIST)?;
        {
            let _guards = self.lock_range(r.lba, r.blocks);
            self.write_blocks(r.lba, &data)?;
        }
        self.write_through(r.flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    pub(super) fn write_verify(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        // BYTCHK 2 and 3 are reserved; a CDB that sets WRPROTECT too is refused for
        // WRPROTECT, by write_start.
        if cdb[1] & 0xe0 == 0 && (cdb[1] >> 1) & 0x03 > 1 {
            return Err(Sense::invalid_field_in_cdb(1, Some(2)));
        }
        match self.write_start(cdb, data_out)? {
            // Verification means the data is on the medium, not in a cache.
            Some((r, data)) => self.write_range(r.lba, r.blocks, data, true),
            None => Ok(Vec::new()),
        }
    }

    pub(super) fn verify(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        let bytchk = (r.flags >> 1) & 0x03;
        if bytchk == 2 {
            return Err(Sense::invalid_field_in_cdb(1, Some(2)));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_transfer(cdb, r.blocks)?;
        let expected = match bytchk {
            0 => None,
            1 => Some(self.data(data_out, r.blocks * self.block_size)?),
            _ => Some(self.data(data_out, self.block_size)?),
        };
        if r.blocks == 0 {
            return Ok(Vec::new());
        }
        let media = self.read_blocks(r.lba, r.blocks)?;
        if let Some(expected) = expected {
            let bs = self.block_size as usize;
            let mismatch = media.iter().enumerate().position(|(i, b)| {
                *b != if bytchk == 1 {
                    expected[i]
                } else {
                    expected[i % bs]
                }
            });
            if let Some(offset) = mismatch {
                return Err(sense::MISCOMPARE_DURING_VERIFY.with_information(offset as u64));
            }
        }
        Ok(Vec::new())
    }

    pub(super) fn orwrite(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let Some((r, data)) = self.write_start(cdb, data_out)? else {
            return Ok(Vec::new());
        };
        {
            let _guards = self.lock_range(r.lba, r.blocks);
            let mut media = self.read_blocks(r.lba, r.blocks)?;
            media.iter_mut().zip(data).for_each(|(m, d)| *m |= d);
            self.write_blocks(r.lba, &media)?;
        }
        self.write_through(r.flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    pub(super) fn compare_and_write(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let flags = cdb[1];
        if flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        let lba = be64(&cdb[2..10]);
        let blocks = cdb[13] as u64;
        if blocks > self.limits.max_compare_and_write as u64 {
            return Err(Sense::invalid_field_in_cdb(13, None));
        }
        self.check_range(lba, blocks)?;
        self.check_writable()?;
        let len = blocks * self.block_size;
        // An initiator that sends another amount of data than the CDB implies has its
        // CDB wrong.
        if data_out.len() as u64 > 2 * len {
            return Err(Sense::invalid_field_in_cdb(13, None));
        }
        let data = self.data(data_out, 2 * len)?;
        if blocks == 0 {
            return Ok(Vec::new());
        }
        let (verify, write) = data.split_at(len as usize);
        {
            // Held in either case: it orders this command against the other writes that
            // reach the store through this process (and the reads it lends).
            let _guards = self.lock_range(lba, blocks);
            let offset = lba * self.block_size;
            match self.store.atomic_compare_and_write_unit() {
                // The store compares and writes as one step against every writer of the
                // data, this target's and the other gateways' of a shared image.
                Some(unit) if backstore::within_unit(offset, len, unit) => {
                    match self.store.compare_and_write(offset, verify, write) {
                        Ok(backstore::Compared::Written) => {}
                        Ok(backstore::Compared::Mismatch(at)) => {
                            return Err(sense::MISCOMPARE_DURING_VERIFY.with_information(at))
                        }
                        Err(e) => {
                            return Err(self.io_error(e, sense::WRITE_ERROR.with_information(lba)))
                        }
                    }
                }
                // Another target writes this data too: a compare under this process's
                // lock alone could lose its updates, and a range split in pieces could
                // be half written. The Block Limits page says how long a range may be.
                _ if self.shared() => return Err(Sense::invalid_field_in_cdb(13, None)),
                _ => {
                    let media = self.read_blocks(lba, blocks)?;
                    if let Some(offset) = media.iter().zip(verify).position(|(m, v)| m != v) {
                        return Err(sense::MISCOMPARE_DURING_VERIFY.with_information(offset as u64));
                    }
                    self.write_blocks(lba, write)?;
                }
            }
        }
        self.write_through(flags & 0x08 != 0)?;
        Ok(Vec::new())
    }

    pub(super) fn synchronize_cache(&self, cdb: &[u8]) -> Outcome {
        let r = block_range(cdb);
        self.check_range(r.lba, r.blocks)?;
        self.store
            .flush()
            .map_err(|e| self.io_error(e, sense::WRITE_ERROR))?;
        Ok(Vec::new())
    }

    pub(super) fn write_same(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        let r = block_range(cdb);
        let sixteen = cdb[0] == WRITE_SAME_16;
        if r.flags & 0xe0 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(7)));
        }
        if r.flags & 0x10 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)));
        }
        // PBDATA and LBDATA (obsolete) are not supported.
        if r.flags & 0x06 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(2)));
        }
        if !sixteen && r.flags & 0x01 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(0)));
        }
        let unmap = r.flags & 0x08 != 0;
        // UNMAP on a fully provisioned LU (LBPME and LBPWS clear): SBC-4 5.48.
        if unmap && !self.config.thin {
            return Err(Sense::invalid_field_in_cdb(1, Some(3)));
        }
        let ndob = sixteen && r.flags & 0x01 != 0;
        // WSNZ is clear: no blocks means up to the end of the medium.
        let mut r = r;
        if r.blocks == 0 {
            let capacity = self.capacity_blocks();
            if r.lba >= capacity {
                return Err(sense::LBA_OUT_OF_RANGE);
            }
            r.blocks = capacity - r.lba;
        }
        if r.blocks > self.limits.max_write_same {
            return Err(Sense::invalid_field_in_cdb(Self::length_field(cdb), None));
        }
        self.check_range(r.lba, r.blocks)?;
        self.check_writable()?;
        let zeros;
        let block = if ndob {
            zeros = vec![0u8; self.block_size as usize];
            &zeros[..]
        } else {
            if data_out.len() as u64 > self.block_size {
                return Err(Sense::invalid_field_in_cdb(Self::length_field(cdb), None));
            }
            self.data(data_out, self.block_size)?
        };
        let offset = r.lba * self.block_size;
        let len = r.blocks * self.block_size;
        let _guards = self.lock_range(r.lba, r.blocks);
        let deallocate = unmap && self.config.thin && self.store.supports_discard();
        if deallocate || block.iter().all(|&b| b == 0) {
            // With UNMAP the blocks are deallocated whatever the data says (SBC-4 5.48:
            // the device server may unmap instead of writing); LBPRZ makes them read zero.
            let result = if deallocate {
                self.store.discard(offset, len)
            } else {
                self.store.write_zeroes(offset, len)
            };
            result.map_err(|e| self.io_error(e, sense::WRITE_ERROR.with_information(r.lba)))?;
        } else {
            let per = (WRITE_SAME_CHUNK / self.block_size).max(1);
            let buf = block.repeat(per.min(r.blocks) as usize);
            let mut done = 0;
            while done < r.blocks {
                let n = per.min(r.blocks - done);
                self.write_blocks(r.lba + done, &buf[..(n * self.block_size) as usize])?;
                done += n;
            }
        }
        drop(_guards);
        self.write_through(false)?;
        Ok(Vec::new())
    }

    /// SANITIZE (SBC-4 5.30): BLOCK ERASE and CRYPTOGRAPHIC ERASE both deallocate (or
    /// zero) every block, OVERWRITE writes its pattern to every block; the operation runs
    /// on in the background (`sanitize`), the command waits for it unless IMMED is set.
    /// There is no failure mode to leave: a failed operation is reported to the command
    /// that waits for it and logged.
    pub(super) fn sanitize(
        &self,
        cdb: &[u8],
        data_out: &[u8],
        aborted: &dyn Fn() -> bool,
    ) -> Outcome {
        let sa = cdb[1] & 0x1f;
        let immed = cdb[1] & 0x80 != 0;
        if cdb[1] & 0x40 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(6)));
        }
        if let Some(i) = cdb[2..7].iter().position(|&b| b != 0) {
            return Err(Sense::invalid_field_in_cdb(2 + i as u16, None));
        }
        if !matches!(
            sa,
            sa::OVERWRITE | sa::BLOCK_ERASE | sa::CRYPTOGRAPHIC_ERASE | sa::EXIT_FAILURE_MODE
        ) {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)));
        }
        // BLOCK and CRYPTOGRAPHIC ERASE deallocate: only where the LU is thin (LBPME), as
        // REPORT SUPPORTED OPERATION CODES says; a fully provisioned LU offers OVERWRITE.
        if matches!(sa, sa::BLOCK_ERASE | sa::CRYPTOGRAPHIC_ERASE) && !self.config.thin {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)));
        }
        let len = be16(&cdb[7..9]) as u64;
        if sa == sa::OVERWRITE {
            // The parameter list holds four bytes and a pattern of at most one block.
            if len < 5 || len > self.block_size + 4 {
                return Err(Sense::invalid_field_in_cdb(7, None));
            }
        } else if len != 0 {
            return Err(Sense::invalid_field_in_cdb(7, None));
        }
        if sa == sa::EXIT_FAILURE_MODE {
            return Ok(Vec::new());
        }
        self.check_writable()?;
        let method = if sa == sa::OVERWRITE {
            sanitize::Method::Overwrite(self.overwrite_pattern(self.data(data_out, len)?)?)
        } else {
            sanitize::Method::Erase {
                discard: self.config.thin && self.store.supports_discard(),
            }
        };
        let medium = sanitize::Medium {
            store: self.store.clone(),
            locks: self.locks.clone(),
            block_size: self.block_size,
            capacity: self.capacity_blocks(),
            rate: self.config.sanitize_rate,
        };
        // Only one operation runs; a SANITIZE that comes meanwhile is turned away.
        let Some(id) = self.sanitizer.start(medium, method) else {
            return Err(self.sanitizer.in_progress());
        };
        if immed {
            return Ok(Vec::new());
        }
        match self.sanitizer.wait(id, aborted) {
            Some(result) => result.map(|()| Vec::new()),
            // Aborted: nobody reads this answer, and the operation goes on.
            None => Err(sense::SANITIZE_IN_PROGRESS),
        }
    }

    /// The block SANITIZE OVERWRITE leaves everywhere: the initialization pattern repeated,
    /// inverted when the last of an even number of passes with INVERT is. The passes
    /// themselves are not repeated: on a file or in memory the last one is all that stays.
    pub(super) fn overwrite_pattern(&self, p: &[u8]) -> Result<Vec<u8>, Sense> {
        let invert = p[0] & 0x80 != 0;
        if p[0] & 0x60 != 0 {
            return Err(Sense::invalid_field_in_parameter_list(0, Some(6)));
        }
        let passes = p[0] & 0x1f;
        if passes == 0 {
            return Err(Sense::invalid_field_in_parameter_list(0, Some(4)));
        }
        let len = be16(&p[2..4]) as usize;
        if len == 0 || len > self.block_size as usize || len > p.len() - 4 {
            return Err(Sense::invalid_field_in_parameter_list(2, None));
        }
        let pattern = &p[4..4 + len];
        let flip = if invert && passes.is_multiple_of(2) {
            0xff
        } else {
            0x00
        };
        Ok(pattern
            .iter()
            .cycle()
            .take(self.block_size as usize)
            .map(|b| b ^ flip)
            .collect())
    }

    pub(super) fn unmap(&self, cdb: &[u8], data_out: &[u8]) -> Outcome {
        if cdb[1] & 0x01 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, Some(0)));
        }
        let len = be16(&cdb[7..9]) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        if len < 8 {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let p = self.data(data_out, len as u64)?;
        let bddl = be16(&p[2..4]) as usize;
        let count = bddl.min(len - 8) / 16;
        if count > self.limits.max_unmap_descriptors as usize {
            return Err(Sense::invalid_field_in_parameter_list(2, None));
        }
        self.check_writable()?;
        let mut ranges = Vec::with_capacity(count);
        for i in 0..count {
            let d = &p[8 + 16 * i..8 + 16 * (i + 1)];
            let lba = be64(&d[0..8]);
            let blocks = be32(&d[8..12]) as u64;
            if blocks > self.limits.max_unmap_lba as u64 {
                return Err(Sense::invalid_field_in_parameter_list(
                    (8 + 16 * i + 8) as u16,
                    None,
                ));
            }
            self.check_range(lba, blocks)?;
            if blocks > 0 {
                ranges.push((lba, blocks));
            }
        }
        for (lba, blocks) in ranges {
            let _guards = self.lock_range(lba, blocks);
            self.store
                .discard(lba * self.block_size, blocks * self.block_size)
                .map_err(|e| self.io_error(e, sense::WRITE_ERROR.with_information(lba)))?;
        }
        Ok(Vec::new())
    }

    pub(super) fn get_lba_status(&self, cdb: &[u8]) -> Outcome {
        let lba = be64(&cdb[2..10]);
        let alloc = be32(&cdb[10..14]) as usize;
        let capacity = self.capacity_blocks();
        if lba >= capacity {
            return Err(sense::LBA_OUT_OF_RANGE);
        }
        // Enough descriptors to fill the allocation length (one at least), each as long as
        // its kind of blocks runs: the store is asked for ever larger windows, their
        // extents joined, until a descriptor is known to end before the allocation
        // length is full or the device ends. Doubling keeps a LUN of any size to a few
        // dozen asks, and a run longer than one descriptor holds continues in the next.
        let want = (alloc.saturating_sub(8) / 16).max(1);
        let bs = self.block_size;
        let mut runs: Vec<(u64, u64, bool)> = Vec::new(); // (lba, blocks, mapped)
        let mut scanned = lba;
        let mut window = (self.limits.max_transfer as u64 * 64).max(1);
        while scanned < capacity {
            let span = window.min(capacity - scanned);
            let extents = self
                .store
                .is_allocated(scanned * bs, span * bs)
                .map_err(|e| {
                    self.io_error(e, sense::UNRECOVERED_READ_ERROR.with_information(scanned))
                })?;
            let end = scanned + span;
            for (offset, len, allocated) in extents {
                let start = (offset / bs).max(scanned);
                let stop = (offset + len).div_ceil(bs).min(end);
                if stop <= start {
                    continue;
                }
                match runs.last_mut() {
                    Some(r) if r.2 == allocated && r.0 + r.1 >= start => r.1 = stop - r.0,
                    _ => runs.push((start, stop - start, allocated)),
                }
            }
            scanned = end;
            window = window.saturating_mul(2);
            // Every run but the last is complete.
            if runs.len() > want {
                break;
            }
        }
        let mut descriptors = Vec::new();
        'runs: for (mut start, mut blocks, allocated) in runs {
            while blocks > 0 {
                if descriptors.len() == want {
                    break 'runs;
                }
                let n = blocks.min(u32::MAX as u64);
                let mut d = start.to_be_bytes().to_vec();
                d.extend_from_slice(&(n as u32).to_be_bytes());
                d.push(if allocated { 0 } else { 1 });
                d.extend_from_slice(&[0; 3]);
                descriptors.push(d);
                start += n;
                blocks -= n;
            }
        }
        let mut data = ((4 + 16 * descriptors.len()) as u32).to_be_bytes().to_vec();
        data.extend_from_slice(&[0; 4]);
        descriptors.into_iter().for_each(|d| data.extend(d));
        Ok(truncate(data, alloc))
    }
}
