//! scsi
