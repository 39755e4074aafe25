use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use proptest::prelude::*;
use scsi::{Command, LogicalUnit, LuConfig, Nexus};

fn lu(removable: bool, read_only: bool) -> LogicalUnit {
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20));
    LogicalUnit::new(
        LuConfig {
            removable,
            read_only,
            ..LuConfig::default()
        },
        store,
    )
}

/// Opcodes the LU knows, so that random CDBs reach the command bodies often.
const KNOWN: &[u8] = &[
    0x00, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x1a, 0x1b, 0x1e, 0x25, 0x28, 0x2a, 0x2e, 0x2f, 0x34, 0x35,
    0x37, 0x41, 0x42, 0x55, 0x5a, 0x88, 0x89, 0x8a, 0x8b, 0x8e, 0x8f, 0x90, 0x91, 0x93, 0x9e, 0xa0,
    0xa3, 0xa8, 0xaa, 0xae, 0xaf, 0xb7,
];

fn cdb() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..32),
        (
            prop::sample::select(KNOWN),
            prop::collection::vec(any::<u8>(), 0..31)
        )
            .prop_map(|(op, mut rest)| {
                rest.insert(0, op);
                rest
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn any_cdb_gives_a_well_formed_response(
        cdbs in prop::collection::vec((cdb(), prop::collection::vec(any::<u8>(), 0..2048), 0u64..3), 1..6),
        removable: bool,
        read_only: bool,
    ) {
        let lu = lu(removable, read_only);
        for (cdb, data_out, nexus) in &cdbs {
            let r = lu.execute(&Command { cdb, data_out, nexus: Nexus(*nexus) });
            match r.status {
                0x00 => prop_assert!(r.sense.is_none()),
                0x02 => {
                    let s = r.sense.as_ref().expect("sense with CHECK CONDITION");
                    prop_assert!(s.len() >= 18);
                    prop_assert_eq!(s[0] & 0x7f, 0x70);
                    prop_assert!(s[2] & 0x0f != 0);
                    prop_assert!(r.data_in.is_empty());
                }
                other => prop_assert!(false, "status {other:#x}"),
            }
            let _ = LogicalUnit::data_out_len(cdb, 512);
            let _ = scsi::report_luns(&[0, 1], cdb);
            let _ = scsi::lun_not_supported(cdb);
        }
    }
}
