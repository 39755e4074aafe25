//! SEND DIAGNOSTIC's default self-test, on a sound medium and on one whose reads fail.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{LogicalUnit, LuConfig, Nexus};

use support::*;

/// A store whose reads fail: a medium the default self-test must find broken.
#[derive(Debug)]
struct FailingReads(RamBackstore);

impl Backstore for FailingReads {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other("the medium fails"))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.write_zeroes(offset, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> std::io::Result<Vec<(u64, u64, bool)>> {
        self.0.is_allocated(offset, len)
    }
    fn supports_discard(&self) -> bool {
        true
    }
}

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
    let store: Arc<dyn Backstore> = Arc::new(FailingReads(RamBackstore::new(BLOCKS * BS as u64)));
    let broken = LogicalUnit::new(LuConfig::default(), store);
    exec(&broken, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&exec(&broken, &self_test, &[]), 0x04, 0x3e, 0x03);
    good(&exec(&broken, &[0x1d, 0, 0, 0, 0, 0], &[]));
}
