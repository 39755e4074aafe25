//! SCSI's vocabulary, declared once for the target's logical unit, the initiator and the
//! iSCSI codec: operation codes and service actions ([`opcodes`]), status codes
//! ([`status`]), sense keys, additional sense codes and the [`Sense`] type ([`sense`]),
//! the CDB fields both ends read or build ([`cdb`]) and the LUN field's encodings
//! ([`lun`]). No I/O, no crate of ours: it is the floor everything that speaks SCSI
//! stands on.

pub mod cdb;
pub mod lun;
pub mod opcodes;
pub mod sense;
pub mod status;

pub use sense::Sense;
