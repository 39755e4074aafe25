//! `rsv crash`, the crash-consistency checker, in short runs (the long one is in the
//! README): a file LUN and a stripe over two disk servers lose nothing and show no
//! phantom across SIGKILLs of the target, the file server and the disk servers; a RAM LUN,
//! which loses everything at a kill, is caught.

use std::process::Command;

use testkit::rsv;

fn crash(args: &[&str]) -> (bool, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(rsv())
        .arg("crash")
        .args(args)
        .args(["--json", "--seed", "20261124", "--dir"])
        .arg(dir.path())
        .output()
        .expect("running rsv crash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "rsv crash printed no JSON ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), summary)
}

#[track_caller]
fn assert_clean(ok: bool, s: &serde_json::Value, rounds: u64) {
    assert!(ok, "rsv crash failed:\n{s:#}");
    assert_eq!(s["rounds"], rounds, "{s:#}");
    assert_eq!(s["losses"], 0, "{s:#}");
    assert_eq!(s["phantoms"], 0, "{s:#}");
    assert!(s["writes_acknowledged"].as_u64().unwrap() > 0, "{s:#}");
    assert!(s["fua_writes"].as_u64().unwrap() > 0, "{s:#}");
    assert!(s["flushes_acknowledged"].as_u64().unwrap() > 0, "{s:#}");
    // Later rounds check what earlier ones made durable.
    assert!(s["durable_units_checked"].as_u64().unwrap() > 0, "{s:#}");
}

#[test]
fn a_file_lun_loses_nothing_across_kills() {
    let (ok, s) = crash(&["--rounds", "4", "--size", "16MiB", "--writers", "4"]);
    assert_clean(ok, &s, 4);
    assert_eq!(s["kills"]["target"], 4, "{s:#}");
}

#[test]
fn a_stripe_loses_nothing_when_its_file_server_or_disk_servers_die() {
    let (ok, s) = crash(&[
        "--rounds",
        "6",
        "--size",
        "16MiB",
        "--writers",
        "4",
        "--stripe",
        "2",
    ]);
    assert_clean(ok, &s, 6);
    // This seed kills the file server once and the disk servers five times.
    assert!(s["kills"]["file server"].as_u64() >= Some(1), "{s:#}");
    assert!(
        s["kills"]["disk server 0"].as_u64().unwrap_or(0)
            + s["kills"]["disk server 1"].as_u64().unwrap_or(0)
            >= 1,
        "{s:#}"
    );
}

#[test]
fn a_ram_lun_is_caught_losing_data() {
    let (ok, s) = crash(&[
        "--rounds",
        "2",
        "--size",
        "8MiB",
        "--writers",
        "2",
        "--store",
        "ram:?size=8M",
        "--min-run",
        "200ms",
        "--max-run",
        "300ms",
    ]);
    assert!(!ok, "a RAM store loses every write at a kill:\n{s:#}");
    assert!(s["losses"].as_u64().unwrap() > 0, "{s:#}");
}

/// `--url`: no target run by the checker; its writers write to a running target's LUN for
/// 2 s, the region is read back and judged: nothing lost, no phantom, no writer error.
/// Then the same against a target killed under it with no other portal to go to: the
/// writers' errors are counted and the run fails (the check that it can).
#[test]
fn a_url_run_judges_a_lun_it_does_not_run_and_counts_writer_errors() {
    let config = "[[target]]\niqn = \"iqn.2026-11.org.reservoir:crash-url\"\n\
                  [[target.lun]]\nid = 0\nstore = \"file:lun.img?size=16M\"\n";
    let target = testkit::Target::start(Some(config));
    let run = |url: &str, duration: &str| {
        let out = Command::new(rsv())
            .args(["crash", "--url", url, "--duration", duration])
            .args([
                "--size",
                "8MiB",
                "--writers",
                "4",
                "--slow",
                "1us",
                "--json",
            ])
            .output()
            .expect("running rsv crash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let s: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "rsv crash printed no JSON ({e}):\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.success(), s)
    };
    let (ok, s) = run(&format!("{}?recovery_timeout=2", target.url(0)), "2s");
    assert!(ok, "{s:#}");
    assert_eq!(s["errors"], 0, "{s:#}");
    assert_eq!(s["losses"], 0, "{s:#}");
    assert_eq!(s["phantoms"], 0, "{s:#}");
    assert!(s["writes_acknowledged"].as_u64().unwrap() > 0, "{s:#}");
    assert!(s["flushes_acknowledged"].as_u64().unwrap() > 0, "{s:#}");
    assert!(!s["slow_commands"].as_array().unwrap().is_empty(), "{s:#}");

    // The target killed 1 s in and left down: the writers fail, and so does the run (its
    // read-back cannot be made either: an error, exit status not 0).
    let url = format!("{}?recovery_timeout=2", target.url(0));
    let crash = Command::new(rsv())
        .args([
            "crash",
            "--url",
            &url,
            "--duration",
            "20s",
            "--size",
            "8MiB",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    target.signal(libc::SIGKILL);
    let out = crash.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "rsv crash passed with its target killed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("reading unit"), "{stderr}");
}
