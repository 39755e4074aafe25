//! The full-feature-phase rules (`iscsi::ffp`) with arbitrary negotiated values, lengths,
//! sequence numbers and Data-Out headers: nothing may panic; a plan the initiator makes
//! the target accepts as the same plan; Data-In and Data-Out segmentation cover their
//! range exactly in segments within the limits; a data sequence never takes more than its
//! length or data out of order; CmdOrder hands out every admitted command once, in order.
#![no_main]

use iscsi::ffp::{self, CmdOrder, CmdWindow, DataRules, DataSequence, WritePlan};
use libfuzzer_sys::fuzz_target;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn more(&self) -> bool {
        !self.0.is_empty()
    }
}

fuzz_target!(|input: &[u8]| {
    let mut b = Bytes(input);
    // Negotiated values within RFC 7143's ranges: 512..2^24-1.
    let burst = |x: u32| 512 + x % ((1 << 24) - 512);
    let max_burst = burst(b.u32());
    let rules = DataRules {
        immediate_data: b.bool(),
        initial_r2t: b.bool(),
        first_burst_length: burst(b.u32()).min(max_burst),
        max_burst_length: max_burst,
        max_outstanding_r2t: (b.u8() as u16).max(1),
    };
    let edtl = b.u32();
    let max_send = burst(b.u32());

    // The initiator's plan is the target's.
    let plan = WritePlan::initiator(edtl, &rules, max_send);
    assert!(plan.immediate <= plan.unsolicited_end && plan.unsolicited_end <= edtl);
    let seen = WritePlan::target(true, edtl, plan.immediate, plan.final_bit(), &rules)
        .expect("the target accepts the initiator's plan");
    assert_eq!(seen, plan);
    // Any claim the target accepts stays within the command.
    let (imm, fin, write) = (b.u32() % (1 << 24), b.bool(), b.bool());
    if let Ok(p) = WritePlan::target(write, edtl, imm, fin, &rules) {
        assert!(p.immediate <= p.unsolicited_end && p.unsolicited_end <= edtl);
    }

    // Segmentation, on a bounded total so that a run stays short.
    // (a segment is at least 512 bytes once negotiated: RFC 7143 13.12)
    let total = edtl % (1 << 20);
    let seg = 512 + b.u32() % (1 << 20);
    let mut at = 0;
    for s in ffp::data_in(total, seg, rules.max_burst_length) {
        assert_eq!(s.offset, at);
        assert!(s.len > 0 && s.len <= seg);
        at += s.len;
    }
    assert_eq!(at, total);
    let start = b.u32() % (total + 1);
    let mut at = start;
    for s in ffp::data_out(start..total, seg) {
        assert_eq!(s.offset, at);
        assert_eq!(s.final_, s.offset + s.len == total);
        at += s.len;
    }
    assert_eq!(at, total.max(start));

    // R2Ts cover the rest of the write; each sequence takes what it should and no more.
    let mut next = plan.unsolicited_end;
    let mut r2ts = 0;
    while let Some(r) = ffp::next_r2t(next, edtl, &rules) {
        assert!(r.start == next && r.end > r.start && r.end <= edtl);
        assert!(r.end - r.start <= rules.max_burst_length);
        next = r.end;
        r2ts += 1;
        if r2ts > 64 {
            break;
        }
    }
    let len = b.u32();
    let from = b.u32();
    let mut seq = DataSequence::new(b.u32(), from..from.saturating_add(len));
    let mut taken = 0u64;
    for _ in 0..64 {
        if !b.more() {
            break;
        }
        let (datasn, offset, n, f) = (b.u32() % 8, b.u32(), b.u32() % (1 << 24), b.bool());
        let due = seq.missing().start;
        if seq.check(datasn, offset, n, f).is_ok() {
            assert_eq!(offset, due);
            seq.advance(n);
            taken += n as u64;
            assert!(taken <= seq.len as u64);
            assert!(!f || seq.is_done());
        }
    }

    // Commands admitted in any order come out once each, in CmdSN order.
    let first = b.u32();
    let depth = (b.u8() as u32 % 64).max(1);
    let mut order = CmdOrder::new(first, depth);
    let mut out = Vec::new();
    for _ in 0..128 {
        if !b.more() {
            break;
        }
        let sn = first.wrapping_add(b.u8() as u32 % (depth + 4));
        if let Ok(ready) = order.admit(sn, sn) {
            out.extend(ready);
        }
    }
    for (i, sn) in out.iter().enumerate() {
        assert_eq!(*sn, first.wrapping_add(i as u32));
    }
    assert_eq!(order.exp_cmdsn(), first.wrapping_add(out.len() as u32));

    // The initiator's window moves forward only.
    let mut w = CmdWindow::new(b.u32(), b.u32(), b.u32());
    for _ in 0..8 {
        let before = w;
        w.advance(b.u32(), b.u32());
        assert!(!iscsi::serial::sn_lt(w.expcmdsn, before.expcmdsn));
        if w.is_open() {
            w.take();
        }
    }
});
