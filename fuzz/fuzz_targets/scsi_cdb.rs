//! Arbitrary commands (CDB, data-out, nexus) against a logical unit on a RAM store, one
//! after another so that state carries over (reservations, mode pages, unit attentions,
//! sanitize): nothing may panic; every answer is GOOD with at most the allocation length
//! asked, or CHECK CONDITION with well-formed sense, or another status without data; the
//! data-out length the transport is told agrees with what the command accepts.
#![no_main]

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use libfuzzer_sys::fuzz_target;
use scsi::{status, Command, LogicalUnit, LuConfig, Nexus};

fuzz_target!(|input: &[u8]| {
    let Some((&flags, mut rest)) = input.split_first() else {
        return;
    };
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20));
    let lu = LogicalUnit::new(
        LuConfig {
            thin: flags & 1 != 0,
            read_only: flags & 2 != 0,
            removable: flags & 4 != 0,
            physical_block_exponent: (flags >> 3) & 3,
            // Sanitize unpaced: a run must not wait for it.
            sanitize_rate: None,
            ..LuConfig::default()
        },
        store,
    );
    for _ in 0..16 {
        // [cdb length, nexus, data length, cdb..., data...]
        let Some((&[cdb_len, nexus, data_len], tail)) = rest.split_first_chunk::<3>() else {
            break;
        };
        let cdb_len = cdb_len as usize % 33;
        let data_len = data_len as usize * 8;
        if tail.len() < cdb_len {
            break;
        }
        let (cdb, tail) = tail.split_at(cdb_len);
        let data = &tail[..data_len.min(tail.len())];
        rest = &tail[data.len()..];
        let _ = LogicalUnit::data_out_len(cdb, 512);
        let r = lu.execute(&Command {
            cdb,
            data_out: data,
            nexus: Nexus(nexus as u64 % 3),
        });
        match r.status {
            status::GOOD | status::CONDITION_MET => assert!(r.sense.is_none()),
            status::CHECK_CONDITION => {
                let s = r.sense.as_ref().expect("sense with CHECK CONDITION");
                assert!(scsi::Sense::parse(s).is_some(), "malformed sense {s:02x?}");
                assert!(r.data_in.is_empty());
            }
            _ => assert!(r.data_in.is_empty() && r.sense.is_none()),
        }
    }
});
