//! What the initiator reads to follow a gateway group, from the network: REPORT TARGET
//! PORT GROUPS data, VPD page 83h, READ KEYS, READ RESERVATION and READ FULL STATUS data.
//! Each decodes or fails, never panics, and the group's state machine and the decision on
//! a registration after a move take whatever decoded.
#![no_main]

use initiator::multipath::{self, Group};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let groups = multipath::parse_rtpg(data).unwrap_or_default();
    let own = multipath::vpd83_port_group(data);
    let _ = multipath::parse_read_keys(data);
    let _ = multipath::parse_read_reservation(data);
    let status = multipath::parse_full_status(data);
    let _ = multipath::on_new_nexus(&status, 0xabc, "iqn.x,i,0x1");
    let mut g = Group::new(vec!["a:3260".into(), "b:3260".into(), "c:3260".into()]);
    for _ in 0..6 {
        match g.logged_in(own, &groups) {
            multipath::Action::MoveTo(to) => g.move_to(to, false),
            _ => break,
        }
    }
    assert!(g.current() < 3);
});
