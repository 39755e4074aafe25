//! WRITE COMPRESSED (16)'s Data-Out, a zstd frame from the network: decompressed only to
//! exactly the length the CDB names, never more; against a logical unit, the answer is
//! GOOD (and the blocks hold the frame's bytes) or CHECK CONDITION, never a panic.
#![no_main]

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use libfuzzer_sys::fuzz_target;
use scsi::{status, Command, LogicalUnit, LuConfig, Nexus};

fuzz_target!(|input: &[u8]| {
    let Some((&[blocks, flags], frame)) = input.split_first_chunk::<2>() else {
        return;
    };
    // The decoder alone, at lengths around the frame's.
    for len in [
        0usize,
        frame.len(),
        512 * blocks as usize,
        4096 * blocks as usize,
    ] {
        if let Some(out) = scsi::compressed::decompress(frame, len) {
            assert_eq!(out.len(), len);
            assert!(frame.len() <= len);
        }
    }
    // Through the logical unit.
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20));
    let lu = LogicalUnit::new(LuConfig::default(), store.clone());
    let nexus = Nexus(1);
    let tur = [0u8; 6];
    lu.execute(&Command {
        cdb: &tur,
        data_out: &[],
        nexus,
    });
    let lba = u64::from(flags & 0x0f) * 64;
    let cdb = scsi::cdb::write_compressed16(lba, u32::from(blocks), flags & 0x80 != 0);
    let r = lu.execute(&Command {
        cdb: &cdb,
        data_out: frame,
        nexus,
    });
    if r.status == status::GOOD && blocks > 0 {
        let len = blocks as usize * 512;
        let want = scsi::compressed::decompress(frame, len).expect("GOOD means it decompressed");
        let mut got = vec![0u8; len];
        store.read_at(&mut got, lba * 512).unwrap();
        assert_eq!(got, want);
    } else {
        assert!(r.status == status::CHECK_CONDITION || r.status == status::GOOD);
    }
});
