//! Task management from an initiator that LUN masking keeps from some LUs: a target
//! reset would reach them (and, cold, end every session of the target), so it is refused
//! with "function authorization failed"; a LU reset of a LUN it does not see answers as
//! for a LUN that does not exist. An initiator that sees every LUN resets the target.

use testkit::raw::*;

const ADMIN: &str = "iqn.2026-11.org.reservoir:tmf-admin";
const MASKED: &str = "iqn.2026-11.org.reservoir:tmf-masked";

fn target() -> std::net::SocketAddr {
    let ram = testkit::inproc::ram("1MiB");
    start_toml(&format!(
        "[[target]]\niqn = \"{IQN}\"\n\
         [[target.initiator]]\nname = \"{ADMIN}\"\n\
         [[target.initiator]]\nname = \"{MASKED}\"\nluns = [1]\n\
         [[target.lun]]\nid = 0\n{ram}\n[[target.lun]]\nid = 1\n{ram}\n"
    ))
}

/// A task management function about LUN `lun` (no task named); the response code.
fn tmf(c: &mut Raw, itt: u32, function: u8, lun: u16) -> u8 {
    c.tmf_on(lun, itt, function, 0xffff_ffff, 0, 0)
}

#[test]
fn a_masked_initiator_cannot_reset_what_it_does_not_see() {
    let addr = target();
    let mut admin = Raw::login_as(addr, ADMIN, [0x80, 0, 0, 0, 0, 1], 0, 1, 1, prefs(), None);
    let mut masked = Raw::login_as(addr, MASKED, [0x80, 0, 0, 0, 0, 2], 0, 1, 1, prefs(), None);
    // LOGICAL UNIT RESET (5): its own LUN resets; the hidden LUN answers as an absent one.
    assert_eq!(tmf(&mut masked, 1, 5, 1), 0);
    assert_eq!(tmf(&mut masked, 2, 5, 0), tmf(&mut masked, 3, 5, 9));
    assert_eq!(tmf(&mut masked, 4, 5, 0), 2, "LUN does not exist");
    // TARGET WARM RESET (6) and TARGET COLD RESET (7): refused.
    assert_eq!(tmf(&mut masked, 5, 6, 1), 6, "authorization failed");
    assert_eq!(tmf(&mut masked, 6, 7, 1), 6, "authorization failed");
    // The admin's session goes on, its LUN 0 not reset (no unit attention beyond the
    // power-on one of its login).
    clear_ua(&mut admin, 0x10);
    assert_eq!(read_at(&mut admin, 0x20, 0, 1).len(), 512);
    // The admin sees every LUN: its warm reset is done.
    assert_eq!(tmf(&mut admin, 0x30, 6, 0), 0);
}
