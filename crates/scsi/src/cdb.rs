//! CDB fields, as the vocabulary declares them (`scsi_proto::cdb`), and the building
//! blocks of the parameter data this logical unit returns.

pub use scsi_proto::cdb::*;

/// Cuts data to the allocation length.
pub(crate) fn truncate(mut data: Vec<u8>, alloc: usize) -> Vec<u8> {
    data.truncate(alloc);
    data
}

/// Pads or cuts an ASCII string to a fixed-width, space-filled field.
pub(crate) fn ascii_field(s: &str, width: usize) -> Vec<u8> {
    let mut out: Vec<u8> = s
        .bytes()
        .map(|b| if (0x20..=0x7e).contains(&b) { b } else { b' ' })
        .take(width)
        .collect();
    out.resize(width, b' ');
    out
}
