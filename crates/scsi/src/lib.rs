//! Sans-IO SCSI: CDB decode, sense data, INQUIRY/VPD, mode pages and SBC/SPC command
//! emulation against the `backstore::Backstore` trait.
