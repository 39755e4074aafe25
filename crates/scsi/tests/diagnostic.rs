//! SEND DIAGNOSTIC's default self-test, on a sound medium and on one whose reads fail.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{LogicalUnit, LuConfig, Nexus};

use support::*;

#[test]
fn send_diagnostic_runs_the_default_self_test() {
    let lu = lu();
    let self_test = [0x1d, 0x04, 0, 0, 0, 0];
    good(&exec(&lu, &self_test, &[]));
    // With PF, DEVOFFL and UNITOFFL set too, as smartctl and sg_senddiag send it.
    good(&exec(&lu, &[0x1d, 0x17, 0, 0, 0, 0], &[]));
    // PF, SELFTEST and PARAMETER LIST LENGTH zero: no test, no error.
    good(&exec(&lu, &[0x1d, 0, 0, 0, 0, 0], &[]));
    assert_eq!(LogicalUnit::data_out_len(&self_test, 512), Some(0));
    // The short and extended self-tests report in a log page there is none of.
    for code in 1..8u8 {
        assert_invalid_cdb(&exec(&lu, &[0x1d, code << 5, 0, 0, 0, 0], &[]), 1);
    }
    // The default self-test takes no parameter list.
    assert_invalid_cdb(&exec(&lu, &[0x1d, 0x04, 0, 0, 4, 0], &[0; 4]), 3);
    // A diagnostic page: none is supported, and the initiator sends it first.
    let page = [0x1d, 0x10, 0, 0, 8, 0];
    assert_eq!(LogicalUnit::data_out_len(&page, 512), Some(8));
    assert_sense(
        &exec(&lu, &page, &[0x80, 0, 0, 4, 0, 0, 0, 0]),
        0x05,
        0x26,
        0x00,
    );
    // Listed with its usage data.
    let one = good(&exec(
        &lu,
        &[0xa3, 0x0c, 1, 0x1d, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
    ))
    .to_vec();
    assert_eq!(one[1] & 0x07, 0x03);
    assert_eq!(&one[4..], &[0x1d, 0xf7, 0, 0xff, 0xff, 0]);
    // Another nexus's RESERVE keeps it out, as any command that may disturb the medium.
    let other = Nexus(2);
    exec_on(&lu, other, &[0x00, 0, 0, 0, 0, 0], &[]);
    good(&exec_on(&lu, other, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(exec(&lu, &self_test, &[]).status, 0x18);
    good(&exec_on(&lu, other, &[0x17, 0, 0, 0, 0, 0], &[]));

    // A medium whose reads fail fails the self-test.
    let store: Arc<dyn Backstore> = Arc::new(ReadsThrough {
        ram: RamBackstore::new(BLOCKS * BS as u64),
        read: |_, _, _| Err(std::io::Error::other("the medium fails")),
    });
    let broken = LogicalUnit::new(LuConfig::default(), store);
    exec(&broken, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&exec(&broken, &self_test, &[]), 0x04, 0x3e, 0x03);
    good(&exec(&broken, &[0x1d, 0, 0, 0, 0, 0], &[]));
}
