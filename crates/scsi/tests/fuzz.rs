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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// A transport that tries `try_read_now` first and falls back to `execute` sees
    /// exactly what one that only calls `execute` sees, command for command: the fast
    /// path answers as `execute` would and, when it declines, leaves no trace (a unit
    /// attention it skipped is still reported, a reservation still conflicts).
    #[test]
    fn try_read_now_answers_as_execute_would(
        cdbs in prop::collection::vec((prop_oneof![cdb(), io_cdb(), io_cdb()], prop::collection::vec(any::<u8>(), 0..2048), 0u64..3), 1..10),
        removable: bool,
    ) {
        let fast = lu(removable, false);
        let plain = lu(removable, false);
        let mut served = 0;
        for (cdb, data_out, nexus) in &cdbs {
            let cmd = Command { cdb, data_out, nexus: Nexus(*nexus) };
            let a = match fast.try_read_now(&cmd, u64::MAX) {
                Some(r) => {
                    served += 1;
                    r
                }
                None => fast.execute(&cmd),
            };
            let b = plain.execute(&cmd);
            prop_assert_eq!(a, b, "cdb {:02x?}", cdb);
        }
        let _ = served;
    }
}

/// READ(10) and WRITE(10) within the 1 MiB LU, so that reads are served from data written.
fn io_cdb() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(&[0x28u8, 0x2a][..]),
        0u32..2040,
        1u16..8,
        prop::sample::select(&[0u8, 0x08, 0x10][..]),
    )
        .prop_map(|(op, lba, blocks, flags)| {
            let mut c = vec![op, flags, 0, 0, 0, 0, 0, 0, 0, 0];
            c[2..6].copy_from_slice(&lba.to_be_bytes());
            c[7..9].copy_from_slice(&blocks.to_be_bytes());
            c
        })
}

/// The fast path does serve plain reads once the nexus has seen its unit attention, and
/// leaves anything else to `execute`.
#[test]
fn try_read_now_serves_plain_reads_only() {
    let lu = lu(false, false);
    let n = Nexus(7);
    const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 8, 0, 0, 4, 0];
    let read10 = &READ10;
    let cmd = |cdb: &'static [u8]| Command {
        cdb,
        data_out: &[],
        nexus: n,
    };
    // A new nexus: its power-on unit attention comes first, from execute().
    assert!(lu.try_read_now(&cmd(read10), u64::MAX).is_none());
    assert_eq!(lu.execute(&cmd(read10)).status, 0x02);
    let r = lu
        .try_read_now(&cmd(read10), u64::MAX)
        .expect("a cached read");
    assert_eq!((r.status, r.data_in.len()), (0, 4 * 512));
    // More than the caller will read inline: declined, whatever the transport expects.
    assert!(lu.try_read_now(&cmd(read10), 4 * 512 - 1).is_none());
    assert!(lu.try_read_now(&cmd(read10), 4 * 512).is_some());
    // Not reads, or reads execute() refuses: declined.
    assert!(lu
        .try_read_now(&cmd(&[0x00, 0, 0, 0, 0, 0]), u64::MAX)
        .is_none());
    assert!(lu
        .try_read_now(
            &cmd(&[0x28, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 1, 0]),
            u64::MAX
        )
        .is_none());
    assert!(lu
        .try_read_now(&cmd(&[0x28, 0xe0, 0, 0, 0, 0, 0, 0, 1, 0]), u64::MAX)
        .is_none());
    assert!(lu
        .try_read_now(&cmd(&[0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0]), u64::MAX)
        .is_none());
}
