//! SANITIZE: block erase and overwrite, its refusals, commands turned away while it runs,
//! and its run in the background after IMMED and an abort.

mod support;

use std::sync::Arc;

use backstore::{Backstore, RamBackstore};
use scsi::{Command, LogicalUnit, LuConfig, Nexus};

use support::*;

#[test]
fn sanitize_block_erase() {
    let lu = lu();
    good(&exec(&lu, &write10(7, 1), &fill(0x5a, 1)));
    let mut s = [0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0];
    good(&exec(&lu, &s, &[]));
    assert_eq!(good(&exec(&lu, &read10(7, 1), &[])), &fill(0, 1)[..]);
    // Reserved bits and bytes, parameter data and unknown service actions.
    s[1] = 0x42;
    assert_invalid_cdb(&exec(&lu, &s, &[]), 1);
    s[1] = 0x02;
    s[4] = 1;
    assert_invalid_cdb(&exec(&lu, &s, &[]), 4);
    s[4] = 0;
    s[8] = 8;
    assert_invalid_cdb(&exec(&lu, &s, &[0; 8]), 7);
    s[8] = 0;
    s[1] = 0x05; // no such service action
    assert_invalid_cdb(&exec(&lu, &s, &[]), 1);
    s[1] = 0x01; // OVERWRITE needs its parameter list
    assert_invalid_cdb(&exec(&lu, &s, &[]), 7);
    s[1] = 0x1f;
    good(&exec(&lu, &s, &[]));
    let ro = lu_with(LuConfig {
        read_only: true,
        ..LuConfig::default()
    });
    assert_sense(
        &exec(&ro, &[0x48, 0x03, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        0x07,
        0x27,
        0x00,
    );
}

fn sanitize_overwrite(len: u16) -> [u8; 10] {
    let mut s = [0x48, 0x01, 0, 0, 0, 0, 0, 0, 0, 0];
    s[7..9].copy_from_slice(&len.to_be_bytes());
    s
}

#[test]
fn sanitize_overwrite_writes_the_pattern_everywhere() {
    let lu = lu();
    good(&exec(&lu, &write10(7, 1), &fill(0x5a, 1)));
    // One pass of a two-byte pattern.
    let p = [0x01, 0, 0, 2, 0xab, 0xcd];
    good(&exec(&lu, &sanitize_overwrite(6), &p));
    let want: Vec<u8> = [0xab, 0xcd].repeat(BS / 2);
    for lba in [0, 7, BLOCKS as u32 - 1] {
        assert_eq!(good(&exec(&lu, &read10(lba, 1), &[])), &want[..]);
    }
    // INVERT with two passes leaves the inverted pattern.
    let p = [0x82, 0, 0, 1, 0x0f];
    good(&exec(&lu, &sanitize_overwrite(5), &p));
    assert_eq!(good(&exec(&lu, &read10(3, 1), &[])), &[0xf0; BS][..]);
    // A whole block of pattern.
    let mut p = vec![0x01, 0, 0x02, 0x00];
    p.extend(fill(0x11, 1));
    good(&exec(&lu, &sanitize_overwrite(BS as u16 + 4), &p));
    assert_eq!(good(&exec(&lu, &read10(9, 1), &[])), &fill(0x11, 1)[..]);
}

#[test]
fn sanitize_overwrite_refuses_bad_parameters() {
    let lu = lu();
    let mut p = vec![0x01, 0, 0x02, 0x00];
    p.extend(fill(0xaa, 1));
    for len in [0u16, 4, BS as u16 + 5] {
        assert_invalid_cdb(&exec(&lu, &sanitize_overwrite(len), &p), 7);
    }
    let invalid_parameter = |p: &[u8]| {
        let r = exec(&lu, &sanitize_overwrite(p.len() as u16), p);
        assert_sense(&r, 0x05, 0x26, 0x00);
    };
    invalid_parameter(&[0x00, 0, 0, 1, 0xaa]); // no passes
    invalid_parameter(&[0x01, 0, 0, 0, 0xaa]); // empty pattern
    invalid_parameter(&[0x01, 0, 0, 2, 0xaa]); // longer than the list
    invalid_parameter(&[0x21, 0, 0, 1, 0xaa]); // TEST
    let mut long = vec![0x01, 0, 0x02, 0x04];
    long.extend(fill(0, 1));
    invalid_parameter(&long); // pattern longer than a block
                              // Too little data for the length in the CDB.
    assert_sense(
        &exec(&lu, &sanitize_overwrite(8), &[0x01, 0, 0, 4]),
        0x05,
        0x0e,
        0x03,
    );
    let ro = lu_with(LuConfig {
        read_only: true,
        ..LuConfig::default()
    });
    assert_sense(
        &exec(&ro, &sanitize_overwrite(5), &[0x01, 0, 0, 1, 0xaa]),
        0x07,
        0x27,
        0x00,
    );
    // Reported with its service action.
    let rsoc = [0xa3, 0x0c, 0x02, 0x48, 0, 0x01, 0, 0, 0, 64, 0, 0];
    assert_eq!(good(&exec(&lu, &rsoc, &[]))[1] & 0x07, 0x03);
}

#[test]
fn commands_during_a_sanitize_are_turned_away() {
    let (lu, started, go) = gated_lu(LuConfig::default());
    assert_sense(&exec(&lu, &[0, 0, 0, 0, 0, 0], &[]), 0x06, 0x29, 0x00);
    let other = Nexus(2);
    assert_sense(
        &exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]),
        0x06,
        0x29,
        0x00,
    );
    let erase = {
        let lu = lu.clone();
        std::thread::spawn(move || exec(&lu, &[0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]))
    };
    started.recv().unwrap();
    for cdb in [&[0u8, 0, 0, 0, 0, 0][..], &read10(0, 1), &write10(0, 1)] {
        assert_sense(&exec_on(&lu, other, cdb, &fill(1, 1)), 0x02, 0x04, 0x1b);
    }
    good(&exec_on(&lu, other, &[0x12, 0, 0, 0, 36, 0], &[]));
    let rs = good(&exec_on(&lu, other, &[0x03, 0, 0, 0, 18, 0], &[])).to_vec();
    assert_eq!((rs[2] & 0x0f, rs[12], rs[13]), (0x02, 0x04, 0x1b));
    go.send(()).unwrap();
    good(&erase.join().unwrap());
    good(&exec_on(&lu, other, &[0, 0, 0, 0, 0, 0], &[]));
}

/// SANITIZE runs in the background (SBC-4 4.11): with IMMED the command answers at once
/// and the LU answers NOT READY, SANITIZE IN PROGRESS with a progress indication until it
/// ends; a second SANITIZE is turned away; an aborted waiter leaves it running.
#[test]
fn sanitize_runs_on_after_immed_and_abort() {
    // 4 MiB at 4 MiB/s: about a second.
    let store: Arc<dyn Backstore> = Arc::new(RamBackstore::new(4 << 20));
    let lu = Arc::new(LogicalUnit::new(
        LuConfig {
            sanitize_rate: Some(4 << 20),
            ..LuConfig::default()
        },
        store,
    ));
    exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    good(&exec(&lu, &write10(9, 1), &fill(0x77, 1)));
    let mut p = vec![0x01, 0, 0, 1, 0xee];
    let mut s = sanitize_overwrite(p.len() as u16);
    s[1] |= 0x80; // IMMED
    let started = std::time::Instant::now();
    good(&exec(&lu, &s, &p));
    let tur = exec(&lu, &[0x00, 0, 0, 0, 0, 0], &[]);
    assert_sense(&tur, 0x02, 0x04, 0x1b);
    assert_eq!(tur.sense.as_ref().unwrap()[15], 0x80, "progress indication");
    assert_sense(&exec(&lu, &read10(0, 1), &[]), 0x02, 0x04, 0x1b);
    good(&exec(&lu, &[0x12, 0, 0, 0, 36, 0], &[]));
    assert_sense(&exec(&lu, &s, &p), 0x02, 0x04, 0x1b);
    // A waiting SANITIZE that is aborted stops waiting; the first operation goes on.
    s[1] &= !0x80;
    while lu_busy(&lu) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(good(&exec(&lu, &read10(9, 1), &[])), &fill(0xee, 1)[..]);
    p[4] = 0x11;
    let r = lu.execute_abortable(
        &Command {
            cdb: &s,
            data_out: &p,
            nexus: N,
        },
        &scsi::OnlyItself,
        &|| true,
    );
    assert_sense(&r, 0x02, 0x04, 0x1b);
    assert!(lu_busy(&lu), "the operation outlives its aborted command");
    while lu_busy(&lu) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(good(&exec(&lu, &read10(9, 1), &[])), &fill(0x11, 1)[..]);
}

fn lu_busy(lu: &LogicalUnit) -> bool {
    exec(lu, &[0x00, 0, 0, 0, 0, 0], &[]).status != 0
}
