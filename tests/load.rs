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
