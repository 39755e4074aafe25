//! `rsv-lab run r0 --quick`, `r1 --quick`, `r2 --quick`, `r3 --quick` and `r4 --quick` through real
//! emulated links: the outputs exist and are sane. Needs root and the peers; elsewhere it prints SKIP. Never asserts a speed.
//! The lab runs the `rsv` beside it, which this package does not build:
//! `cargo test -p rsv -p rsv-lab --test lab_quick` builds both.

use std::path::{Path, PathBuf};
use std::process::Command;

fn rsv_lab() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rsv-lab"))
}

fn tool_missing(tools: &[&str]) -> Option<String> {
    tools
        .iter()
        .find(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        })
        .map(|t| t.to_string())
}

fn is_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: needs root");
        return false;
    }
    true
}

/// Whether `tools` are all installed: when one is not, the test is skipped, or fails under
/// CI or RESERVOIR_TEST_STRICT (there scripts/setup.sh should have installed it).
fn tools_ready(test: &str, tools: &[&str]) -> bool {
    let Some(t) = tool_missing(tools) else {
        return true;
    };
    if std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some() {
        panic!("{t} is not installed; scripts/setup.sh should have installed it");
    }
    eprintln!("SKIP {test}: {t} not installed");
    false
}

/// Root and the peers every scenario uses.
fn can_run() -> bool {
    is_root("lab_quick")
        && tools_ready("lab_quick", &["ip", "iperf3", "qemu-img", "tgtd", "tgtadm"])
}

fn lab(scenario: &str, out: &Path) {
    lab_with(scenario, out, &[]);
}

/// Runs `scenario`, checks that it wrote `files`, and returns the rows of its CSV.
fn lab_files(
    scenario: &str,
    out: &Path,
    files: &[&str],
) -> Vec<std::collections::HashMap<String, String>> {
    lab(scenario, out);
    for f in files {
        assert!(out.join(f).exists(), "{f} missing");
    }
    csv(&out.join(format!("{scenario}.csv")))
}

fn lab_with(scenario: &str, out: &Path, extra: &[&str]) {
    run_quick(scenario, out, &[&["--no-doc"], extra].concat());
}

/// `rsv-lab run SCENARIO --quick --out OUT EXTRA...`, which must succeed.
fn run_quick(scenario: &str, out: &Path, extra: &[&str]) {
    let o = Command::new(rsv_lab())
        .args(["run", scenario, "--quick", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .expect("running rsv-lab");
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{err}");
    assert!(
        o.status.success(),
        "rsv-lab run {scenario} --quick failed:\n{err}"
    );
}

/// Checks that `rsv-lab doc DOCUMENT`, drawn from the results in `out`, says each of `says`.
fn doc_has(document: &str, out: &Path, says: &[&str]) {
    let d = doc(document, out);
    for s in says {
        assert!(d.contains(s), "no {s:?} in\n{d}");
    }
}

/// `rsv-lab doc DOCUMENT` drawn from the results in `out`: the run's JSON reads back.
fn doc(document: &str, out: &Path) -> String {
    let path = out.join(format!("{document}.md"));
    let o = Command::new(rsv_lab())
        .args(["doc", document, "--results"])
        .arg(out)
        .arg("--out")
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read_to_string(&path).unwrap()
}

/// The CSV's rows as maps from its header's column names.
fn csv(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let head: Vec<String> = lines
        .next()
        .expect("header")
        .split(',')
        .map(String::from)
        .collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), head.len(), "row {l:?} against header {head:?}");
            head.iter()
                .cloned()
                .zip(cells.iter().map(|c| c.to_string()))
                .collect()
        })
        .collect()
}

fn num(row: &std::collections::HashMap<String, String>, col: &str) -> f64 {
    row[col]
        .parse()
        .unwrap_or_else(|_| panic!("{col} = {:?} in {row:?}", row[col]))
}

/// The string value of the first `"key": "..."` in pretty-printed JSON.
fn json_str<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{key}\": \""))? + key.len() + 5;
    json[at..].split('"').next()
}

fn links_left(prefix: &str) -> bool {
    let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.starts_with(prefix))
}

#[test]
fn lab_quick_r0_and_r1() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();

    let rows = lab_files(
        "r0",
        out,
        &["r0.csv", "r0.json", "r0-write.png", "r0-read.png"],
    );
    for col in [
        "loss_pct",
        "direction",
        "config",
        "tool",
        "bytes",
        "seconds",
        "mbit_per_s",
        "error",
    ] {
        assert!(rows[0].contains_key(col), "r0.csv has no {col} column");
    }
    let iperf: Vec<_> = rows
        .iter()
        .filter(|r| r["config"].starts_with("iperf3"))
        .collect();
    assert_eq!(iperf.len(), 2, "iperf3 CUBIC and BBR references");
    for r in &rows {
        if r["config"].starts_with("iperf3")
            || r["config"].starts_with("R0")
            || r["config"].starts_with("Reservoir")
        {
            assert!(r["error"].is_empty(), "{r:?}");
        }
        if r["error"].is_empty() {
            assert!(num(r, "mbit_per_s") > 0.0 && num(r, "bytes") > 0.0, "{r:?}");
            assert!(num(r, "mbit_per_s") < 1000.0, "faster than the link: {r:?}");
        }
    }
    for cfg in [
        "R0 before",
        "R0 tuned (2b)",
        "Reservoir default",
        "qemu-img → tgt",
        "qemu-img → Reservoir",
    ] {
        assert!(rows.iter().any(|r| r["config"] == cfg), "no {cfg} row");
    }
    let json = std::fs::read_to_string(out.join("r0.json")).unwrap();
    for k in [
        "rsv", "tgtd", "qemu_img", "iperf3", "kernel", "nproc", "memory",
    ] {
        let v = json_str(&json, k);
        assert!(
            v.is_some_and(|s| !s.is_empty()),
            "environment.{k} in r0.json"
        );
    }

    let rows = lab_files("r1", out, &["r1.csv", "r1.json", "r1.png"]);
    let totals: Vec<_> = rows.iter().filter(|r| r["stream"] == "total").collect();
    assert_eq!(
        totals.len(),
        5,
        "iperf3 reference plus four backup modes (Reservoir default among them)"
    );
    for t in &totals {
        let jain = num(t, "jain");
        assert!(jain > 0.0 && jain <= 1.0 + 1e-9, "{t:?}");
        assert!(num(t, "total_mb_per_s") > 0.0, "{t:?}");
        assert!(num(t, "link_use_pct") > 0.0, "{t:?}");
    }
    let streams = rows.iter().filter(|r| r["stream"] != "total");
    for s in streams {
        assert!(s["error"].is_empty(), "{s:?}");
        assert!(num(s, "mb_per_s") > 0.0, "{s:?}");
    }
    assert!(
        !links_left("lr0-") && !links_left("lr1-"),
        "the lab left namespaces behind"
    );
}

/// `--repeat 2`: each of Reservoir's rows twice with its repetition number, the peers once,
/// and the JSON's and the document's medians over both.
#[test]
fn lab_quick_repeat() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    lab_with("r0", out, &["--repeat", "2", "--rows", "reservoir"]);
    let rows = csv(&out.join("r0.csv"));
    let mine: Vec<_> = rows
        .iter()
        .filter(|r| r["config"] == "Reservoir default")
        .collect();
    let reps: Vec<&str> = mine.iter().map(|r| r["repeat"].as_str()).collect();
    assert_eq!(reps, ["1", "2"], "{rows:?}");
    for r in &mine {
        assert!(r["error"].is_empty() && num(r, "mbit_per_s") > 0.0, "{r:?}");
    }
    assert_eq!(
        rows.iter()
            .filter(|r| r["config"].starts_with("iperf3"))
            .count(),
        2,
        "iperf3 CUBIC and BBR once: {rows:?}"
    );
    assert!(
        !rows.iter().any(|r| r["config"].starts_with("R0")),
        "--rows reservoir ran other configurations: {rows:?}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("r0.json")).unwrap()).unwrap();
    let sum = v["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["config"] == "Reservoir default" && s["direction"] == "write")
        .unwrap_or_else(|| panic!("no summary of Reservoir's writes: {}", v["summary"]));
    let figures: Vec<f64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["config"] == "Reservoir default" && r["direction"] == "write")
        .map(|r| r["mbit_per_s"].as_f64().unwrap())
        .collect();
    assert_eq!(figures.len(), 2, "{}", v["rows"]);
    let m = &sum["mbit_per_s"];
    assert_eq!(m["n"], 2, "{sum}");
    let (lo, hi) = (figures[0].min(figures[1]), figures[0].max(figures[1]));
    let near = |a: &serde_json::Value, b: f64| (a.as_f64().unwrap() - b).abs() < 1e-9;
    assert!(
        near(&m["min"], lo) && near(&m["max"], hi),
        "{sum} against {figures:?}"
    );
    assert!(
        near(&m["median"], (lo + hi) / 2.0),
        "{sum} against {figures:?}"
    );
    let doc = doc("r0-r1", out);
    assert!(doc.contains("the median of the 2"), "{doc}");
    let cell = format!("{:.2} ({lo:.2}–{hi:.2})", (lo + hi) / 2.0);
    assert!(doc.contains(&cell), "no {cell:?} in\n{doc}");
}

#[test]
fn lab_quick_r2() {
    if !can_run()
        || !tools_ready(
            "lab_quick_r2",
            &["globus-url-copy", "globus-gridftp-server"],
        )
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let rows = lab_files(
        "r2",
        out,
        &[
            "r2.csv",
            "r2.json",
            "r2-50ms-reservoir.png",
            "r2-50ms-iperf3.png",
        ],
    );
    let keys: Vec<&str> = rows.iter().map(|r| r["row"].as_str()).collect();
    assert_eq!(
        keys.join(" "),
        "one unpaced static reservoir reservoir-rate iperf3 gridftp qemu-img",
        "every row of the scenario, in order"
    );
    for r in &rows {
        // Every row, peers included, ran to its end.
        assert!(r["error"].is_empty(), "{r:?}");
        let whole = num(r, "whole_pct");
        assert!(whole > 0.0 && whole <= 101.0, "share of the link: {r:?}");
        assert!(num(r, "payload_bytes") > 0.0, "{r:?}");
        if r["row"] != "one" && !r["row"].starts_with("iperf3") && !r["jain"].is_empty() {
            let jain = num(r, "jain");
            assert!(jain > 0.0 && jain <= 1.0 + 1e-9, "{r:?}");
        }
    }
    // The streams of a sync row moved the whole volume between them.
    let volume = num(&rows[1], "payload_bytes");
    for r in &rows[1..5] {
        assert_eq!(num(r, "streams"), 2.0, "{r:?}");
        assert_eq!(num(r, "payload_bytes"), volume, "{r:?}");
    }
    assert!(!links_left("lr2-"), "the lab left namespaces behind");
    let netns_files = std::fs::read_dir("/etc/netns")
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("lr2-"))
        })
        .unwrap_or(false);
    assert!(!netns_files, "the lab left /etc/netns files behind");
    doc_has("r2", out, &["## RTT 50 ms", "the **quick** variant"]);
}

#[test]
fn lab_quick_r4() {
    if !can_run() || !tools_ready("lab_quick_r4", &["smbd", "smbclient", "mkfs.ext4", "curl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let rows = lab_files("r4", out, &["r4.csv", "r4.json", "r4-start.csv", "r4.png"]);
    // One delay, two windows, three readers; each read the whole file.
    assert_eq!(rows.len(), 6, "{rows:?}");
    for client in ["reservoir", "smb-32k", "smb-get"] {
        for window in ["64K", "default"] {
            let r = rows
                .iter()
                .find(|r| r["client"] == client && r["window"] == window)
                .unwrap_or_else(|| panic!("no {client} row at {window}"));
            assert_eq!(r["complete"], "true", "{r:?}");
            assert!(r["error"].is_empty(), "{r:?}");
            assert_eq!(num(r, "bytes"), (16u64 << 20) as f64, "{r:?}");
            let m = num(r, "mbit_per_s");
            assert!(
                m > 0.0 && m < 101.0,
                "not within the 100 Mbit/s link: {r:?}"
            );
        }
    }
    let starts = csv(&out.join("r4-start.csv"));
    assert_eq!(starts.len(), 1, "{starts:?}");
    let (cold, warm) = (num(&starts[0], "cold_ms"), num(&starts[0], "warm_ms"));
    // The RTT is 8 ms: a first byte cannot come sooner than one.
    assert!(
        warm >= 8.0 && cold >= warm,
        "cold {cold} ms, warm {warm} ms"
    );
    assert!(!links_left("lr4-"), "the lab left namespaces behind");
    doc_has("r4", out, &["| 4 | 64K | ", "| 4 | 8 | "]);
}

#[test]
fn lab_quick_r3() {
    if !can_run() || !tools_ready("lab_quick_r3", &["tcpdump", "stunnel", "openssl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let rows = lab_files("r3", out, &["r3.csv", "r3.json", "r3-timeline.png"]);
    // Two paths, reads, four configurations (one TLS suite).
    assert_eq!(rows.len(), 8, "{rows:?}");
    for path in ["loopback", "1gbit-1ms"] {
        for config in [
            "reservoir-plain",
            "reservoir-tls",
            "tgt-plain",
            "tgt-stunnel",
        ] {
            let r = rows
                .iter()
                .find(|r| r["path"] == path && r["config"] == config)
                .unwrap_or_else(|| panic!("no {config} row on {path}"));
            assert!(r["error"].is_empty(), "{r:?}");
            assert!(num(r, "bytes") > 0.0 && num(r, "mb_per_s") > 0.0, "{r:?}");
            assert!(num(r, "target_cpu_s_per_gb") > 0.0, "{r:?}");
            assert!(num(r, "initiator_cpu_s_per_gb") > 0.0, "{r:?}");
            // The sender's bursts were captured and measured.
            assert!(num(r, "burst_median_segments") >= 1.0, "{r:?}");
            if config.ends_with("tls") || config.ends_with("stunnel") {
                assert_eq!(r["suite"], "TLS13_AES_128_GCM_SHA256", "{r:?}");
            }
            if config == "tgt-stunnel" {
                assert!(num(r, "tunnel_cpu_s_per_gb") > 0.0, "{r:?}");
            }
            if path == "1gbit-1ms" {
                assert!(num(r, "mb_per_s") < 126.0, "faster than the link: {r:?}");
            }
        }
    }
    assert!(!links_left("r3-"), "the lab left namespaces behind");
    doc_has("r3", out, &["## loopback", "| read | "]);
}

#[test]
fn lab_quick_login() {
    if !is_root("lab_quick_login") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    // No document, so no --no-doc (which `lab` passes).
    run_quick("login", out, &[]);
    for f in ["login.csv", "login.json"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let rows = csv(&out.join("login.csv"));
    // Two RTTs, three steps, three tries each, every one through.
    assert_eq!(rows.len(), 2 * 3 * 3, "{rows:?}");
    for r in &rows {
        assert_eq!(r["ok"], "true", "{r:?}");
        assert!(r["error"].is_empty(), "{r:?}");
    }
    for rtt in [10.0, 50.0] {
        for step in ["inq", "read4k"] {
            // A TCP handshake and a login exchange before anything else: two round trips
            // at least, whatever the machine's speed.
            for r in rows
                .iter()
                .filter(|r| num(r, "rtt_ms") == rtt && r["step"] == step)
            {
                assert!(num(r, "ms") >= 2.0 * rtt, "{r:?}");
            }
        }
    }
    let json = std::fs::read_to_string(out.join("login.json")).unwrap();
    assert_eq!(json_str(&json, "scenario"), Some("login"));
    assert!(!links_left("llogin-"), "the lab left namespaces behind");
}

/// `rsv-lab run dr --quick`: two failovers of a striped volume replicated continuously;
/// each far copy promoted holds a prefix of the application's writes (the run fails
/// otherwise: with `RSV_DR_LIVE=1`, which copies the live LUNs instead of images, it
/// does), and each resync leaves the old primary equal to the new one. Before the cycle
/// fence (a stream's writes admitted only while its cycle is open there) one of three
/// quick runs left the sites different after a resync; with it, nine of ten runs were
/// clean, but one run of this test beside the others under load (load ~20) failed, its
/// cause not captured; most likely two runs sharing the emulated link's name (a run now
/// holds it with a lock), after which 24 of 24 loaded quick runs were clean. Ignored for
/// CI's time, 47-88 s a run under load (`cargo test -p rsv -p rsv-lab --test lab_quick
/// lab_quick_dr -- --ignored`).
#[test]
#[ignore = "47-88 s a run under load, too long for CI; its one failure most likely two runs sharing a link name, fixed: docs/replicate.md, What the lab found"]
fn lab_quick_dr() {
    if !is_root("lab_quick_dr") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    lab("dr", out);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("dr.json")).unwrap()).unwrap();
    assert_eq!(v["scenario"], "dr");
    let configs = v["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 1, "{v}");
    let c = &configs[0];
    assert_eq!(c["violations"], 0, "{c}");
    let rounds = c["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{c}");
    let mut from = 1;
    for (i, r) in rounds.iter().enumerate() {
        assert_eq!(r["error"], "", "{r}");
        assert_eq!(r["consistent"], true, "{r}");
        // Sites alternate: a fails, then b (the promoted one, primary since).
        assert_eq!(r["failed_site"], ["a", "b"][i % 2], "{r}");
        // The round goes on from the write after the copy the last one promoted.
        assert_eq!(r["from"], from, "{r}");
        let (acked, far) = (
            r["acked"].as_u64().unwrap(),
            r["far_last"].as_u64().unwrap(),
        );
        assert!(
            far >= r["acked_before_cut"].as_u64().unwrap() && far <= acked + 1,
            "{r}"
        );
        assert!(r["cycles_committed"].as_u64().unwrap() >= 1, "{r}");
        assert!(r["rpo_at_failure_s"].as_f64().unwrap() >= 0.0, "{r}");
        let rs = &r["resync"];
        assert_eq!(rs["equal_after"], true, "{r}");
        assert!(
            rs["sent_bytes"].as_u64().unwrap() >= rs["differ_bytes"].as_u64().unwrap(),
            "the resync sent less than differed and still ended equal? {r}"
        );
        from = far + 1;
    }
    for k in [
        "rpo_cycles_s",
        "rpo_failure_s",
        "latency_alone_us",
        "latency_replicated_us",
        "hold_us",
    ] {
        assert!(c[k]["n"].as_u64().unwrap_or(0) > 0, "{k} in {c}");
    }
    // RSV_LAB_PREFIX keeps this run's link apart from another run's on the machine.
    let prefix = std::env::var("RSV_LAB_PREFIX").unwrap_or_default();
    assert!(
        !links_left(&format!("{prefix}ldr-")),
        "the lab left namespaces behind"
    );
    doc_has(
        "dr",
        out,
        &[
            "## Application at 30 % of the link",
            "the **quick** variant",
        ],
    );
}

/// `rsv-lab run dr --quick --app ext4 --failovers 1`: the DR scenario with an ext4 file
/// system on the striped volume, written through `rsv mount` and a loop device at the
/// primary site (files replaced, fsynced, renamed, unlinked) under `rsv sync --every 1s`;
/// the far copy, promoted, mounted (its journal replayed) and unmounted, holds only the
/// writer's content and `e2fsck -fn` finds it clean; the failback's resync leaves the
/// sites equal. The check can fail: with `RSV_DR_FS_CORRUPT=1` (an inode cleared on the
/// far copy before e2fsck) the same run exits 1 with the round's violation naming
/// e2fsck's exit 4.
#[test]
fn lab_quick_dr_ext4() {
    if !is_root("lab_quick_dr_ext4")
        || !tools_ready(
            "lab_quick_dr_ext4",
            &["ip", "nsenter", "losetup", "mkfs.ext4", "e2fsck", "debugfs"],
        )
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    lab_with("dr", out, &["--app", "ext4", "--failovers", "1"]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("dr.json")).unwrap()).unwrap();
    assert_eq!(v["params"]["app"], "ext4", "{v}");
    let c = &v["configs"][0];
    assert_eq!(c["violations"], 0, "{c}");
    let rounds = c["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 1, "{c}");
    let r = &rounds[0];
    assert_eq!(r["error"], "", "{r}");
    let fs = &r["fs"];
    assert_eq!(fs["mounted"], true, "{r}");
    assert_eq!(fs["fsck_exit"], 0, "{r}");
    assert_eq!(fs["bad_files"].as_array().map(Vec::len), Some(0), "{r}");
    assert!(
        fs["files"].as_u64().unwrap() > 0,
        "no file reached the far copy: {r}"
    );
    assert!(r["cycles_committed"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(r["resync"]["equal_after"], true, "{r}");
    // Every phase of the round timed, the round's whole among them.
    let phases: Vec<&str> = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    for want in ["promote", "fs check (mount, files, e2fsck)", "demote"] {
        assert!(phases.contains(&want), "no phase {want:?} in {phases:?}");
    }
    let prefix = std::env::var("RSV_LAB_PREFIX").unwrap_or_default();
    assert!(
        !links_left(&format!("{prefix}ldrfs-")),
        "the lab left namespaces behind"
    );
    // Nor a loop device on one of its LUN files (the scratch is /dev/shm/rsv-lab-dr-*).
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout);
    assert!(
        !loops.lines().any(|l| l.contains("rsv-lab-dr-")),
        "the lab left a loop device behind:\n{loops}"
    );
    doc_has(
        "dr",
        out,
        &[
            "**The application is an ext4 file system**",
            "e2fsck -fn exit 0",
        ],
    );
}
