//! The SCSI commands a session issues for its callers: INQUIRY, READ CAPACITY, READ and
//! WRITE of whole blocks, and the like.

use bytes::Bytes;

use super::{DataDir, ScsiResult, Session};
use scsi_proto::cdb;

use crate::scsi::{self, Capacity, Inquiry, Sense};
use crate::{Error, Result};

impl Session {
    /// Like [`Session::command`] but a status other than GOOD is an error.
    pub async fn command_ok(&self, lun: u16, cdb: &[u8], dir: DataDir) -> Result<ScsiResult> {
        let r = self.command(lun, cdb, dir).await?;
        if r.is_good() {
            return Ok(r);
        }
        if r.sense.as_ref().is_some_and(Sense::is_lun_not_supported) {
            return Err(Error::LunNotFound {
                target: self.shared.target.clone(),
                lun,
            });
        }
        Err(Error::Scsi {
            opcode: cdb[0],
            status: r.status,
            sense: r.sense,
        })
    }

    pub async fn test_unit_ready(&self, lun: u16) -> Result<()> {
        self.command_ok(lun, &cdb::test_unit_ready(), DataDir::None)
            .await
            .map(drop)
    }

    pub async fn inquiry(&self, lun: u16) -> Result<Inquiry> {
        let r = self
            .command_ok(lun, &cdb::inquiry(None, 96), DataDir::Read(96))
            .await?;
        let inq = Inquiry::parse(&r.data)
            .ok_or_else(|| Error::Protocol("INQUIRY data shorter than 36 bytes".into()))?;
        if inq.peripheral_qualifier == 3 {
            return Err(Error::LunNotFound {
                target: self.shared.target.clone(),
                lun,
            });
        }
        Ok(inq)
    }

    /// A VPD page, raw.
    pub async fn vpd(&self, lun: u16, page: u8) -> Result<Bytes> {
        let r = self
            .command_ok(lun, &cdb::inquiry(Some(page), 4096), DataDir::Read(4096))
            .await?;
        Ok(r.data)
    }

    /// READ CAPACITY (16), falling back to (10); cached for [`Session::read`]/`write`.
    pub async fn read_capacity(&self, lun: u16) -> Result<Capacity> {
        let r = self
            .command(lun, &cdb::read_capacity16(), DataDir::Read(32))
            .await?;
        let cap = if r.is_good() {
            Capacity::parse16(&r.data)
        } else {
            if r.sense.as_ref().is_some_and(Sense::is_lun_not_supported) {
                return Err(Error::LunNotFound {
                    target: self.shared.target.clone(),
                    lun,
                });
            }
            let r = self
                .command_ok(lun, &cdb::read_capacity10(), DataDir::Read(8))
                .await?;
            Capacity::parse10(&r.data)
        }
        .filter(|c| c.block_size > 0)
        .ok_or_else(|| Error::Protocol("malformed READ CAPACITY data".into()))?;
        self.shared
            .capacity
            .lock()
            .unwrap()
            .insert(lun, cap.clone());
        Ok(cap)
    }

    pub async fn report_luns(&self) -> Result<Vec<u16>> {
        let r = self
            .command_ok(0, &cdb::report_luns(16384), DataDir::Read(16384))
            .await?;
        Ok(scsi::parse_report_luns(&r.data))
    }

    async fn block_size(&self, lun: u16) -> Result<u32> {
        if let Some(c) = self.shared.capacity.lock().unwrap().get(&lun) {
            return Ok(c.block_size);
        }
        // Boxed: asked once per LUN, and READ CAPACITY's two commands would otherwise
        // be part of every read's and write's future.
        Ok(Box::pin(self.read_capacity(lun)).await?.block_size)
    }

    /// Reads `blocks` blocks at `lba`.
    pub async fn read(&self, lun: u16, lba: u64, blocks: u32) -> Result<Bytes> {
        let bs = self.block_size(lun).await?;
        let len = blocks
            .checked_mul(bs)
            .ok_or_else(|| Error::Option("read too large".into()))?;
        let r = self
            .command_ok(lun, &cdb::read16(lba, blocks), DataDir::Read(len))
            .await?;
        if r.data.len() != len as usize {
            return Err(Error::Protocol(format!(
                "READ returned {} bytes of {len}",
                r.data.len()
            )));
        }
        Ok(r.data)
    }

    /// Writes `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lun: u16, lba: u64, data: Bytes) -> Result<()> {
        let bs = self.block_size(lun).await?;
        if !data.len().is_multiple_of(bs as usize) {
            return Err(Error::Option(format!(
                "write of {} bytes is not a multiple of the block size {bs}",
                data.len()
            )));
        }
        let blocks = (data.len() / bs as usize) as u32;
        self.command_ok(lun, &cdb::write16(lba, blocks), DataDir::Write(data))
            .await
            .map(drop)
    }

    pub async fn sync_cache(&self, lun: u16) -> Result<()> {
        self.command_ok(lun, &cdb::sync_cache10(), DataDir::None)
            .await
            .map(drop)
    }
}
