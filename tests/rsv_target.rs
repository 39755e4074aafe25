//! The initiator against Reservoir's own target (the `rsv` binary), with many connections
//! per session.

use std::path::{Path, PathBuf};

use clap::Parser;
use initiator::{IscsiUrl, Session, SessionOptions};
use testkit::output::said;
use testkit::*;
use tools::cli::{self, CpSummary, SessionFlags};

const MIB: u64 = 1 << 20;

#[test]
fn ls_and_inq() {
    let t = Target::with_args(&[]);
    let rt = rt();
    let portal = IscsiUrl::parse(&format!("iscsi://{}/", t.portal)).unwrap();
    let listing = rt
        .block_on(cli::list(&portal, &SessionFlags::default()))
        .unwrap();
    let target = listing
        .iter()
        .find(|l| l.target == t.iqn())
        .expect("our target");
    let lun0 = target.luns.iter().find(|l| l.lun == 0).expect("LUN 0");
    assert_eq!(lun0.device_type, "disk");
    assert!(lun0.size_bytes.unwrap() >= 256 * MIB);
    let url = IscsiUrl::parse(&t.url(0)).unwrap();
    let inq = rt
        .block_on(cli::inquire(&url, &SessionFlags::default()))
        .unwrap();
    assert_eq!(inq.standard.device_type, 0);
    assert!(inq.serial.is_some());
    assert!(inq.block_limits.is_some());
}

#[test]
fn cp_with_eight_connections_and_verify() {
    let t = Target::with_args(&[]);
    let size = 128 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    let back = dir.path().join("back");
    random_file_with_holes(&img, size as usize, 3);
    let url = t.url(0);
    let s = rt()
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &url,
            "--connections",
            "8",
            "--queue-depth",
            "32",
            "--verify",
        ])))
        .unwrap();
    assert_eq!(s.sessions[0].connections, 8, "{:?}", s.sessions[0]);
    assert!(s.verified);
    // The LUN is larger than the image: read back only the image's length.
    let lun_back = dir.path().join("lun");
    let s2 = rt()
        .block_on(cli::copy(&cp_args(&[
            &url,
            lun_back.to_str().unwrap(),
            "--connections",
            "8",
        ])))
        .unwrap();
    assert!(s2.bytes >= size);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&lun_back)
        .unwrap();
    f.set_len(size).unwrap();
    std::fs::rename(&lun_back, &back).unwrap();
    assert!(same_files(&img, &back));
}

/// Copies a random image of 64 MiB (in `dir`, returned) to LUN 0 with `--verify` through
/// a proxy that cuts the first busy connection after 4 MiB, with `query` on the URL;
/// checks the one cut and returns the summary.
fn cp_through_a_cut(t: &Target, dir: &Path, seed: u64, query: &str) -> (CpSummary, PathBuf) {
    let proxy = CuttingProxy::start(t.portal.clone(), 4 * MIB as usize);
    let img = dir.join("image");
    random_file_with_holes(&img, (64 * MIB) as usize, seed);
    let url = format!("iscsi://{}/{}/0?{query}", proxy.portal, t.iqn());
    let s = rt()
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &url,
            "--verify",
        ])))
        .unwrap();
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(s.verified, "{s:?}");
    (s, img)
}

/// Reads `size` bytes of LUN 0 straight from the target into a file.
fn read_back(t: &Target, back: &Path, size: u64) {
    rt().block_on(cli::copy(&cp_args(&[&t.url(0), back.to_str().unwrap()])))
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(back)
        .unwrap()
        .set_len(size)
        .unwrap();
}

/// At ErrorRecoveryLevel 0 (asked for here; tgt grants no more) a session of one
/// connection recovers by reinstatement.
#[test]
fn cp_with_one_connection_survives_a_cut_by_session_reinstatement() {
    let t = Target::with_args(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = cp_through_a_cut(&t, dir.path(), 4, "connections=1&erl=0");
    assert!(s.reinstatements >= 1, "{s:?}");
}

/// ERL 0: one of four connections is cut mid-copy: the session goes on over the other
/// three, the lost commands are issued again there, and the connection comes back with
/// the same TSIH and CID — no session reinstatement.
#[test]
fn cp_with_four_connections_recovers_a_cut_connection_alone() {
    let t = Target::with_args(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (s, img) = cp_through_a_cut(&t, dir.path(), 5, "connections=4&erl=0");
    assert_eq!(s.reinstatements, 0, "{s:?}");
    assert!(s.retries >= 1, "the cut lost no command? {s:?}");
    // Byte for byte, through the target directly.
    let back = dir.path().join("back");
    read_back(&t, &back, 64 * MIB);
    assert!(same_files(&img, &back));
}

/// ERL 2 (our default, and the target's): a connection cut in the middle of a write is
/// logged out for recovery through another one, and its commands are moved there by
/// TASK REASSIGN: the target asks again for the data it lacked, or answers again what
/// was lost. Nothing is issued twice that the target had, no session reinstatement.
#[test]
fn cp_at_erl2_survives_a_cut_connection_by_task_reassignment() {
    let t = Target::with_args(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (s, img) = cp_through_a_cut(&t, dir.path(), 6, "connections=4");
    assert_eq!(s.sessions[0].error_recovery_level, 2, "{s:?}");
    assert_eq!(s.reinstatements, 0, "{s:?}");
    eprintln!("{}", serde_json::to_string(&s).unwrap());
    assert!(s.reassigned_tasks > 0, "nothing was reassigned: {s:?}");
    assert!(s.complete);
    let back = dir.path().join("back");
    read_back(&t, &back, 64 * MIB);
    assert!(same_files(&img, &back));
}

/// Writes a random image of `size` bytes to LUN 0 directly, then copies it back through a
/// proxy that cuts the first busy connection once `cut_after` bytes of replies (Data-In)
/// went by, with `query` on the URL and `extra` cp flags. Returns the summary once the
/// copy-back is checked byte-identical (the file is extended to `size` first: the copy
/// skips zero chunks).
fn read_back_through_a_cut(
    t: &Target,
    seed: u64,
    cut_after: usize,
    query: &str,
    extra: &[&str],
) -> CpSummary {
    let size = 64 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    let back = dir.path().join("back");
    random_file_with_holes(&img, size as usize, seed);
    let direct = t.url(0);
    rt().block_on(cli::copy(&cp_args(&[img.to_str().unwrap(), &direct])))
        .unwrap();
    let proxy = CuttingProxy::start_on_replies(t.portal.clone(), cut_after);
    let url = format!("iscsi://{}/{}/0?{query}", proxy.portal, t.iqn());
    let mut args = vec![url.as_str(), back.to_str().unwrap(), "--io-size", "64k"];
    args.extend_from_slice(extra);
    let s = rt().block_on(cli::copy(&cp_args(&args))).unwrap();
    eprintln!("{}", serde_json::to_string(&s).unwrap());
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&back)
        .unwrap()
        .set_len(size)
        .unwrap();
    assert!(same_files(&img, &back));
    s
}

/// ERL 2 with one connection: its CID logs in again to the same session (an implicit
/// logout for recovery) and the commands are reassigned to the new connection. Reads
/// this time: the target sends the Data-In the initiator had not received again.
#[test]
fn cp_at_erl2_with_one_connection_survives_a_cut_by_logging_the_cid_in_again() {
    let t = Target::with_args(&[]);
    // Cut amid the Data-In, so that some reads the target has are lost with it.
    let s = read_back_through_a_cut(&t, 7, 24 * MIB as usize, "connections=1", &["--json"]);
    assert_eq!(s.reinstatements, 0, "{s:?}");
    assert!(s.reassigned_tasks > 0, "nothing was reassigned: {s:?}");
    assert!(s.reconnections >= 1, "{s:?}");
}

/// `rsv cp --max-time`: a copy paced far below what the time allows stops cleanly —
/// exit status 3, a JSON progress line per second on stderr, the summary saying how far
/// it got — and everything below `copied_prefix_bytes` is on the LUN.
#[test]
fn cp_max_time_stops_cleanly_with_json_progress_and_exit_status_3() {
    let t = Target::with_args(&[]);
    let bin = rsv();
    let size = 64 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    random_file_with_holes(&img, size as usize, 8);
    let url = t.url(0);
    // 8 Mbit/s: a megabyte a second, over a minute for the whole image.
    let out = std::process::Command::new(bin)
        .args(["cp", img.to_str().unwrap(), &url])
        .args([
            "--pacing-rate",
            "8mbit",
            "--queue-depth",
            "2",
            "--io-size",
            "256k",
        ])
        .args(["--max-time", "2.5", "--progress", "json", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["complete"], false);
    let bytes = summary["bytes"].as_u64().unwrap();
    let prefix = summary["copied_prefix_bytes"].as_u64().unwrap();
    assert!(bytes > 0 && bytes < size, "{summary}");
    assert!(prefix <= bytes && prefix > 0, "{summary}");
    assert_eq!(summary["total_bytes"], size);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.len() >= 2,
        "one line a second and a last one: {lines:?}"
    );
    for l in &lines {
        assert!(l["bytes"].as_u64().unwrap() <= size);
        assert_eq!(l["total_bytes"], size);
        assert!(l["bytes_per_s"].is_number() && l.get("eta_s").is_some());
    }
    assert_eq!(lines.last().unwrap()["bytes"], bytes);
    // What the summary calls done is on the LUN.
    let back = dir.path().join("back");
    let s = rt()
        .block_on(cli::copy(&cp_args(&[&url, back.to_str().unwrap()])))
        .unwrap();
    assert!(s.complete);
    let (a, b) = (std::fs::read(&img).unwrap(), std::fs::read(&back).unwrap());
    assert!(a[..prefix as usize] == b[..prefix as usize]);
}

#[derive(Parser)]
struct BenchCli {
    #[command(flatten)]
    args: cli::BenchArgs,
}

/// `rsv bench --duration` issues for that long, then waits (a quarter of it, at least a
/// second) for what is in flight and counts it over the time to the last completion; what
/// is still not done then is abandoned, not counted, and the whole wait counts as time.
#[test]
fn bench_drains_its_queue_after_the_window_and_abandons_what_does_not_finish() {
    let t = Target::with_args(&[]);
    let url = t.url(0);
    let bench = |qd: &str, bs: &str| {
        let args = BenchCli::parse_from([
            "bench",
            &url,
            "--rw",
            "write",
            "--block-size",
            bs,
            "--queue-depth",
            qd,
            "--pacing-rate",
            "8mbit",
            "--duration",
            "2",
            "--span",
            "64m",
        ])
        .args;
        rt().block_on(cli::run_bench(&args)).unwrap()
    };
    // Paced at 1 MB/s, one 256 KiB write at a time: the one in flight at 2 s finishes
    // within the wait and counts.
    let r = bench("1", "256k");
    assert_eq!(
        (r.drained_after_window, r.abandoned_at_deadline),
        (1, 0),
        "{r:?}"
    );
    assert!(r.seconds > 2.0 && r.seconds < 3.0, "{r:?}");
    assert_eq!(r.mb_per_s, r.ios as f64 * 262144.0 / 1e6 / r.seconds);
    // Per second of the run, the last one (the wait) partial; together, every I/O.
    assert_eq!(r.per_second_mb.len(), 3, "{r:?}");
    let total: f64 = r.per_second_mb.iter().sum();
    assert!(
        (total - r.ios as f64 * 262144.0 / 1e6).abs() < 1e-6,
        "{total} MB in the seconds, {} I/Os: {r:?}",
        r.ios
    );
    // Eight 1 MiB writes in flight: 8 MiB cannot finish within 3 s at 1 MB/s.
    let r = bench("8", "1m");
    assert!(r.abandoned_at_deadline > 0, "{r:?}");
    assert!(r.ios < 8, "{r:?}");
    assert!(
        (r.seconds - 3.0).abs() < 0.01,
        "the wait counts whole: {r:?}"
    );
    assert_eq!(r.mb_per_s, r.ios as f64 * 1048576.0 / 1e6 / r.seconds);
}

/// ERL 2 with four connections and CRC32C digests, reading: the cut connection is logged
/// out for recovery through another, its reads are reassigned there and the target sends
/// again the Data-In they had not delivered.
#[test]
fn read_at_erl2_with_digests_survives_a_cut_connection() {
    let t = Target::with_args(&[]);
    let s = read_back_through_a_cut(
        &t,
        9,
        8 * MIB as usize,
        "connections=4",
        &["--header-digest", "--data-digest"],
    );
    assert!(s.sessions[0].header_digest && s.sessions[0].data_digest);
    assert_eq!(s.reinstatements, 0, "{s:?}");
    assert!(s.reassigned_tasks > 0, "nothing was reassigned: {s:?}");
}

/// With a pacing rate in force, every connection asks Reservoir's target to pace its
/// Data-In at that rate, and the session reports what the target answered.
#[test]
fn target_paces_each_connection_at_the_rate_asked() {
    let t = Target::with_args(&[]);
    let rt = rt();
    let url = IscsiUrl::parse(&t.url(0)).unwrap();
    let mut o = SessionOptions::default();
    o.set("connections", "3").unwrap();
    o.set("pacing_rate", "80mbit").unwrap();
    let s = rt.block_on(Session::connect(&url, &o)).unwrap();
    let info = s.info();
    assert_eq!(info.connections, 3);
    let p = &info.target_pacing;
    assert_eq!(p.requested, Some(10_000_000));
    assert_eq!(p.paced_connections, 3, "{p:?}");
    assert!(p
        .connections
        .iter()
        .all(|c| c.answer == "paced" && c.rate_bytes_per_s == Some(10_000_000)));
    // What `rsv cp --json` and `rsv bench --json` print.
    let j = serde_json::to_value(&info).unwrap();
    assert_eq!(j["target_pacing"]["paced_connections"], 3);
    assert_eq!(
        j["target_pacing"]["connections"][0]["rate_bytes_per_s"],
        10_000_000
    );
    let data = rt.block_on(s.read(0, 0, 2048)).unwrap();
    assert_eq!(data.len(), MIB as usize);
    rt.block_on(s.logout()).unwrap();

    // pacing_hint=no: nothing asked, nothing reported.
    o.set("pacing_hint", "no").unwrap();
    let s = rt.block_on(Session::connect(&url, &o)).unwrap();
    let p = s.info().target_pacing;
    assert_eq!((p.requested, p.paced_connections), (None, 0));
    assert!(p.connections.iter().all(|c| c.answer == "not asked"));
    rt.block_on(s.logout()).unwrap();
}

/// A target with `accept_pacing_hint = false` answers 0: the session logs in and runs,
/// reported as not paced by the target.
#[test]
fn target_with_pacing_hints_off_says_it_does_not_pace() {
    let t = Target::start(Some(&inproc::one_lun(
        "[session]\naccept_pacing_hint = false",
        "iqn.2026-11.org.reservoir:nohint",
        &inproc::ram("16MiB"),
    )));
    let rt = rt();
    let url = IscsiUrl::parse(&t.url(0)).unwrap();
    let mut o = SessionOptions::default();
    o.set("connections", "2").unwrap();
    o.set("pacing_rate", "80mbit").unwrap();
    let s = rt.block_on(Session::connect(&url, &o)).unwrap();
    let p = s.info().target_pacing;
    assert_eq!(p.requested, Some(10_000_000));
    assert_eq!(p.paced_connections, 0);
    assert_eq!(p.connections.len(), 2);
    assert!(
        p.connections.iter().all(|c| c.answer == "not paced"),
        "{p:?}"
    );
    let data = rt.block_on(s.read(0, 0, 64)).unwrap();
    assert_eq!(data.len(), 64 * 512);
    rt.block_on(s.logout()).unwrap();
}

/// With `rate_control=yes` and no rate the session finds the bottleneck itself: once
/// reads stop speeding up it
/// paces the session just above what they reached, and asks Reservoir's target, which
/// answered the login's "0", to pace each connection's Data-In at its share.
#[test]
fn rate_control_paces_the_session_and_the_target_once_the_pipe_is_full() {
    let t = Target::with_args(&[]);
    let rt = rt();
    let url = IscsiUrl::parse(&t.url(0)).unwrap();
    let mut o = SessionOptions::default();
    o.set("connections", "2").unwrap();
    o.set("rate_control", "yes").unwrap();
    let s = rt.block_on(Session::connect(&url, &o)).unwrap();
    let info = s.info();
    assert!(info.tuning.as_ref().unwrap().rate_control);
    // Asked at login with "0": understood, nothing paced yet.
    assert!(
        info.target_pacing
            .connections
            .iter()
            .all(|c| c.answer == "not paced"),
        "{:?}",
        info.target_pacing
    );
    let depth = s.queue_depth();
    let paced = rt.block_on(busy_until(
        &s,
        0,
        depth,
        std::time::Duration::from_secs(30),
        |s| s.info().target_pacing.paced_connections == 2,
    ));
    let info = s.info();
    assert!(paced, "{:?} {:?}", info.rate_control, info.target_pacing);
    let rc = info.rate_control.unwrap();
    assert_eq!(rc.phase, "cruise");
    assert!(rc.bottleneck_bytes_per_s > 0);
    let total = rc.pacing_bytes_per_s.unwrap();
    assert!(total >= rc.bottleneck_bytes_per_s, "{rc:?}");
    for c in &info.target_pacing.connections {
        // The target paces at the share it was last asked for (within the 2 % a change
        // needs, or its own clamp).
        let r = c.rate_bytes_per_s.unwrap();
        assert!(r.abs_diff(total / 2) * 20 <= total / 2, "{c:?} of {total}");
    }
    assert_eq!((s.reinstatements(), s.retries()), (0, 0));
    rt.block_on(s.logout()).unwrap();
}

fn rsv_target_check(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(rsv())
        .arg("target")
        .args(args)
        .arg("--check")
        .output()
        .unwrap();
    let text = said(&out);
    (out.status.success(), text)
}

/// `rsv target --stripe A,B --stripe C --stripe-unit 64K`: LUN 0 is a stripe over those
/// stores, and `--check` shows its layout (unit, capacity, members with their sizes), as
/// it does for the same stripe written in a TOML file.
#[test]
fn stripe_flag_makes_lun_0_a_stripe_and_check_shows_its_layout() {
    let disks = [Target::with_args(&[]), Target::with_args(&[])];
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (disks[0].url(0), disks[1].url(0));
    let data_dir = dir.path().to_str().unwrap();
    let (ok, text) = rsv_target_check(&[
        "--data-dir",
        data_dir,
        "--stripe",
        &format!("{a},{b}"),
        "--stripe",
        "ram:?size=512M",
        "--stripe-unit",
        "64K",
    ]);
    assert!(ok, "{text}");
    let layout = format!(
        "LUN 0: store stripe:?unit=64K&members=[{a},{b},ram:?size=512M]\n    \
         stripe in units of 64KiB over 3 members: 1536MiB, 512MiB on each \
         (1GiB of the members unused)\n      \
         member 0: 1GiB, iSCSI LUN {a} (logged in to on start)\n      \
         member 1: 1GiB, iSCSI LUN {b} (logged in to on start)\n      \
         member 2: 512MiB, ram, 512MiB (lost when the target stops)\n"
    );
    assert!(text.contains(&layout), "{text}\nwanted:\n{layout}");

    // The same stripe in a TOML file, with the default unit, and a member not reachable.
    let toml = dir.path().join("t.toml");
    std::fs::write(
        &toml,
        format!(
            "[[target]]\niqn = \"iqn.2026-11.org.reservoir:fs\"\n[[target.lun]]\nid = 0\n\
             store = \"stripe:?members=[{a},{b}]\"\n[[target.lun]]\nid = 1\n\
             store = \"stripe:?members=[{a},iscsi://127.0.0.1:1/iqn.2026-11.x:gone/0]\"\n"
        ),
    )
    .unwrap();
    let (ok, text) = rsv_target_check(&["--config", toml.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(
        text.contains("stripe in units of 1MiB over 2 members: 2GiB, 1GiB on each\n"),
        "{text}"
    );
    assert!(
        text.contains("stripe in units of 1MiB over 2 members: capacity known on start\n")
            && text.contains("member 1: size not known (iscsi://127.0.0.1:1/"),
        "{text}"
    );

    // Refused: with --config, a unit that is no size or not whole pages, a bad member list.
    let (ok, text) = rsv_target_check(&["--stripe", &a, "--config", toml.to_str().unwrap()]);
    assert!(!ok && text.contains("cannot be used with"), "{text}");
    let (ok, text) = rsv_target_check(&["--stripe", &a, "--stripe-unit", "lots"]);
    assert!(!ok && text.contains("--stripe-unit lots"), "{text}");
    let (ok, text) = rsv_target_check(&["--stripe", &a, "--stripe-unit", "6000"]);
    assert!(
        !ok && text.contains("not a whole number of 4 KiB pages"),
        "{text}"
    );
    let (ok, text) = rsv_target_check(&["--stripe", "ram:?size=1M]"]);
    assert!(!ok && text.contains("--stripe"), "{text}");
}

/// A file server whose disk server is gone stops on SIGTERM within its grace periods (the
/// flush of the remote member is given up on, exit status 1), not after the session's
/// minute-long recovery.
#[test]
fn a_file_server_whose_disk_server_is_gone_stops_within_its_grace() {
    let disk = Target::with_args(&[]);
    let mut server = Target::with_args(&["--grace", "2", "--stripe", &disk.url(0)]);
    drop(disk);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let start = std::time::Instant::now();
    let status = server.stop();
    assert_eq!(status.code(), Some(1), "{status}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

/// `rsv target` on a given portal and data directory.
fn target_at(portal: &str, data: &std::path::Path) -> Target {
    Target::spawn(Spawn {
        listen: Some(portal),
        data: Some(data),
        ..Spawn::default()
    })
}

/// A target that dies mid-copy and stays away past the session's recovery_timeout: `rsv
/// cp` stops issuing, waits for what is in flight and exits 4 with the prefix it copied
/// and the cause; started again on its store, `--resume-from` that prefix completes the
/// copy byte-identical. (The waiting commands share the one failed reinstatement instead
/// of each trying for another recovery_timeout.)
#[test]
fn cp_interrupted_by_a_dead_target_exits_4_and_resumes_to_identical() {
    let bin = rsv();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let portal = format!("127.0.0.1:{}", free_port());
    let target = target_at(&portal, &data);
    let iqn = target.iqn().to_owned();
    let size = 32 * MIB;
    let img = dir.path().join("image");
    random_file_with_holes(&img, size as usize, 21);
    let url = format!("iscsi://{portal}/{iqn}/0?recovery_timeout=1&command_timeout=3");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    // 16 Mbit/s: two megabytes a second, the copy is under way when the target dies.
    let mut cp = std::process::Command::new(&bin)
        .args(["cp", img.to_str().unwrap(), &url])
        .args([
            "--pacing-rate",
            "16mbit",
            "--queue-depth",
            "4",
            "--io-size",
            "256k",
        ])
        .args(["--json", "--progress", "json"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let progressed = |limit: u64| {
        for _ in 0..600 {
            let text = std::fs::read_to_string(&err).unwrap_or_default();
            if text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .any(|v| v["bytes"].as_u64().is_some_and(|b| b >= limit))
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!(
            "no progress: {text}",
            text = std::fs::read_to_string(&err).unwrap()
        );
    };
    progressed(2 * MIB);
    drop(target);
    // Bounded: the copy must end by itself (the test harness would otherwise hang here).
    let status = (0..1200)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            cp.try_wait().unwrap()
        })
        .unwrap_or_else(|| {
            let _ = cp.kill();
            panic!("rsv cp still running 2 minutes after its target died")
        });
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert_eq!(status.code(), Some(4), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(summary["complete"], false, "{summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(error.contains("could not be recovered"), "{error}");
    let prefix = summary["copied_prefix_bytes"].as_u64().unwrap();
    assert!(prefix >= 2 * MIB && prefix < size, "{summary}");
    assert!(
        stderr.contains(&format!("--resume-from {prefix}")),
        "the way to go on is printed: {stderr}"
    );

    let target = target_at(&portal, &data);
    let again = std::process::Command::new(&bin)
        .args(["cp", img.to_str().unwrap(), &url])
        .args(["--resume-from", &prefix.to_string(), "--json"])
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    let s: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(s["bytes"].as_u64().unwrap(), size - prefix, "{s}");
    drop(target);
    let lun = std::fs::read(data.join("lun0.img")).unwrap();
    assert!(lun[..size as usize] == std::fs::read(&img).unwrap()[..]);
}
