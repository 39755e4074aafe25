//! `rsv load` in a short run: 16 sessions of two connections each, verified mixed I/O in
//! regions of their own, against `rsv target`: every session logs in, no error, no
//! mismatch. (The 256-session, 10-minute run is `scripts/load-256.sh`.)

use std::process::Command;

#[test]
fn sixteen_sessions_of_verified_io_see_no_error() {
    let target = testkit::Target::start(Some(
        "[[target]]\niqn = \"iqn.2026-11.org.reservoir:load\"\n\
         [[target.lun]]\nid = 0\nstore = \"file:lun.img?size=32M\"\n",
    ));
    let out = Command::new(testkit::rsv())
        .args([
            "load",
            &target.url(0),
            "--sessions",
            "16",
            "--duration",
            "2s",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{r:#}");
    assert_eq!(r["sessions_logged_in"], 16, "{r:#}");
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["mismatches"], 0, "{r:#}");
    assert!(r["verified_reads"].as_u64().unwrap() > 0, "{r:#}");
    assert!(r["writes"].as_u64().unwrap() > 0, "{r:#}");
}

/// `?pr_key=...&pr_type=we_ro` in the URL: every session registers, one takes WRITE
/// EXCLUSIVE – REGISTRANTS ONLY, and all of them write (registrants may); another
/// initiator's WRITE meets RESERVATION CONFLICT and its READ RESERVATION shows the key.
/// SIGTERM ends the load early with its report, and `--slow` lists the slow commands.
#[test]
fn a_reservation_from_the_url_holds_and_a_signal_ends_the_load_with_its_report() {
    use testkit::walk::{Client, Dir, Ours};
    let target = testkit::Target::start(Some(
        "[[target]]\niqn = \"iqn.2026-11.org.reservoir:load\"\n\
         [[target.lun]]\nid = 0\nstore = \"file:lun.img?size=32M\"\n",
    ));
    let url = format!("{}?pr_key=0x5e55&pr_type=we_ro", target.url(0));
    let load = Command::new(testkit::rsv())
        .args([
            "load",
            &url,
            "--sessions",
            "4",
            "--duration",
            "60s",
            "--slow",
            "1us",
            "--json",
        ])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let mut other = Ours::login(
        &target.portal,
        "iqn.2026-11.org.reservoir:load",
        "iqn.2026-11.org.reservoir:other",
    );
    let mut send = |cdb: &[u8], dir: Dir| {
        for _ in 0..4 {
            let a = other.cmd(0, cdb, &dir).unwrap();
            if a.status != 0x02 || a.sense.0 != 0x06 {
                return a;
            }
        }
        panic!("unit attentions keep coming");
    };
    let r = send(
        &initiator::multipath::read_reservation_cdb(64),
        Dir::Read(64),
    );
    assert_eq!(
        initiator::multipath::parse_read_reservation(&r.data),
        Some((0x5e55, 5)),
        "{r:?}"
    );
    // One 512-byte block at LBA 60000, outside the sessions' regions (4 x 1 MiB).
    let w = send(
        &[0x2a, 0, 0, 0, 0xea, 0x60, 0, 0, 1, 0],
        Dir::Write(vec![0xee; 512]),
    );
    assert_eq!(w.status, 0x18, "the other initiator's WRITE: {w:?}");
    let t = std::time::Instant::now();
    unsafe { libc::kill(load.id() as i32, libc::SIGTERM) };
    let out = load.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    println!(
        "rsv load reported {:.1} s after SIGTERM",
        t.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "{r:#}");
    assert_eq!(r["sessions_logged_in"], 4, "{r:#}");
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["mismatches"], 0, "{r:#}");
    assert!(r["writes"].as_u64().unwrap() > 0, "{r:#}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("signal: ending the load"),
        "the signal did not end it: {r:#}"
    );
    let slow = r["slow_commands"].as_array().unwrap();
    assert!(!slow.is_empty(), "{r:#}");
    assert!(slow[0]["start_unix_s"].as_f64().unwrap() > 1.7e9, "{r:#}");
}
