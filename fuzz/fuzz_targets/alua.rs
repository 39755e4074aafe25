//! SET TARGET PORT GROUPS' parameter list as the network sends it, against a group of
//! known target port groups: nothing may panic; what is accepted names only known groups,
//! each once, in a state an initiator may choose; REPORT TARGET PORT GROUPS of the result
//! stays within its allocation length and lists every group.
#![no_main]

use backstore::groups::{AccessState, GroupState, Why};
use libfuzzer_sys::fuzz_target;
use scsi::alua;

fuzz_target!(|input: &[u8]| {
    let Some((&[known_n, alloc, format], list)) = input.split_first_chunk::<3>() else {
        return;
    };
    let known: Vec<u16> = (1..=u16::from(known_n % 8)).collect();
    let Ok(set) = alua::parse_set_target_port_groups(list, &known) else {
        return;
    };
    let mut groups: Vec<GroupState> = Vec::new();
    for (g, s) in &set {
        assert!(known.contains(g));
        assert!(groups.iter().all(|x| x.group != *g), "group {g} twice");
        assert_ne!(*s, AccessState::Transitioning);
        groups.push(GroupState {
            group: *g,
            state: *s,
            why: Why::Explicit,
        });
    }
    let cdb = [0xa3, 0x0a | (format << 5), 0, 0, 0, 0, 0, 0, 0, alloc, 0, 0];
    if let Ok(d) = alua::report_target_port_groups(
        &cdb,
        &alua::Report {
            groups: &groups,
            own_group: 1,
            own_port: 1,
            supported: alua::GATEWAY_SUPPORTED,
            transition_time: 6,
        },
    ) {
        assert!(d.len() <= alloc as usize);
    }
    for (_, s) in &set {
        let _ = alua::serves(*s, list);
    }
});
