//! `rsv sync` end to end: two sites, each a file server whose LUN stripes over disk
//! servers, every one an `rsv target` process with its agent on its own loopback address
//! (127.0.0.K, as separate hosts would be); the volume is copied disk server to disk
//! server and read back through the destination's file server.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Output, Stdio};

use testkit::exposition::{promtool_check, scrape, series};
use testkit::site::{json_lines, key_file, read_lun, result_line, Hosts, Site, KEY};
use testkit::{random_file, rsv, run, run_ok};

const IQN: &str = "iqn.2026-11.org.reservoir:vol";

/// The hosts of a test: agents on one port, free on 127.0.0.1 (the hosts use other
/// loopback addresses, where it is free too unless something listens on all of them),
/// signing with a key in `tmp`.
fn hosts(tmp: &Path) -> Hosts {
    Hosts::new(IQN, testkit::free_port(), &key_file(&tmp.join("key"), KEY))
}

/// A site at 127.0.0.{base}..: `n` disk servers with `size` each (change tracking on
/// with `track`), and a file server striping over them in 64 KiB units.
fn site(hosts: &Hosts, base: u8, n: u8, size: &str, track: bool) -> Site {
    let track = if track { "track = true\n" } else { "" };
    hosts.site(None, base, n, &format!("file:disk.img?size={size}"), track)
}

/// `rsv sync ARGS`, run to its end.
fn sync(hosts: &Hosts, args: &[&str]) -> Output {
    hosts.sync(args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_striped_volume_goes_disk_server_to_disk_server() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let a = site(&hosts, 10, 2, "8M", false);
    let b = site(&hosts, 20, 2, "8M", false);
    // 16 MiB of data written through site A's file server, so it lands striped.
    let image = tmp.path().join("image");
    random_file(&image, 16 << 20, 7);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", image.to_str().unwrap(), &a.url()],
    );

    let out = sync(&hosts, &["--json", &a.volume(), &b.volume()]);
    assert!(
        out.status.success(),
        "rsv sync failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&stdout(&out));
    let done = lines.last().expect("a result line");
    assert_eq!(done["event"], "done", "{done}");
    assert_eq!(done["streams"], 2);
    assert_eq!(done["bytes"], 16 << 20);
    assert_eq!(done["verified_units"], 16, "{done}");
    let progress = lines.iter().filter(|l| l["event"] == "progress").count();
    assert!(progress >= 1, "no progress lines");
    for l in &lines[..lines.len() - 1] {
        assert_eq!(l["streams"].as_array().unwrap().len(), 2);
    }

    // Each destination disk server holds exactly its source's member.
    for (s, d) in a.disks.iter().zip(&b.disks) {
        let sb = std::fs::read(s.dir.join("disk.img")).unwrap();
        let db = std::fs::read(d.dir.join("disk.img")).unwrap();
        assert!(sb == db, "member {} differs from {}", s.portal, d.portal);
    }
    // And site B's file server reads back the image.
    let back = read_lun(&b.url(), &tmp.path().join("back"));
    assert!(back == std::fs::read(&image).unwrap());
}

#[test]
fn a_wrong_key_or_mismatched_layout_is_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let a = site(&hosts, 30, 2, "4M", false);
    let b = site(&hosts, 40, 1, "8M", false);

    let wrong = Hosts {
        key: key_file(&tmp.path().join("wrong"), "another key, also long enough!!"),
        ..hosts.clone()
    };
    let out = sync(&wrong, &[&a.volume(), &b.volume()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication refused: wrong key"), "{err}");
    assert!(
        a.file_server.log().contains("refused: wrong key"),
        "the agent logs the refusal"
    );

    let out = sync(&hosts, &[&a.volume(), &b.volume()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the source has 2 member(s), the destination 1"),
        "{err}"
    );

    // Destination members smaller than their sources: their agents are asked while the
    // streams start (two round trips saved on a long path), and the sync still fails with
    // the sizes, before any source writes (each source agent refuses a smaller LUN too).
    let c = site(&hosts, 50, 2, "1M", false);
    let out = sync(&hosts, &[&a.volume(), &c.volume()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("less than"), "{err}");
    assert!(
        err.contains("1048576"),
        "the destination's size is said: {err}"
    );
    drop(c);

    // A key file others may read is refused before anything is sent.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hosts.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = sync(&hosts, &[&a.volume(), &b.volume()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600"), "{err}");

    let out = run(
        rsv().to_str().unwrap(),
        &["sync", "--key-file", "/dev/null", "nohost", "x/y/0"],
    );
    assert_eq!(out.status.code(), Some(2), "usage error");
    drop(b);
}

/// With change tracking on the source's disk servers: the first sync sends everything
/// (the maps are new), the next only the units written since, one with nothing written
/// sends nothing, and a sync interrupted midway resumes without sending again what arrived.
#[test]
fn change_tracking_makes_syncs_incremental_and_resumable() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let a = site(&hosts, 50, 2, "8M", true);
    let b = site(&hosts, 60, 2, "8M", false);
    let image = tmp.path().join("image");
    random_file(&image, 16 << 20, 11);
    let (a_url, b_url) = (a.url(), b.url());
    let rsv_path = rsv();
    let rsv_s = rsv_path.to_str().unwrap();
    run_ok(rsv_s, &["cp", image.to_str().unwrap(), &a_url]);
    let (src, dst) = (a.volume(), b.volume());
    let synced = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        args.extend([src.as_str(), dst.as_str()]);
        result_line(&hosts.sync_ok(&args))
    };
    let first = synced(&[]);
    assert_eq!(first["incremental"], true);
    assert_eq!(first["bytes"], 16 << 20, "{first}");

    // 64 KiB at volume offset 0 and 64 KiB at 64 KiB: one stripe unit on each member, so
    // one 1 MiB tracking unit on each disk server.
    let patch = tmp.path().join("patch");
    random_file(&patch, 128 << 10, 99);
    run_ok(rsv_s, &["cp", patch.to_str().unwrap(), &a_url]);
    let second = synced(&[]);
    assert_eq!(second["bytes"], 2 << 20, "only the written units: {second}");
    assert_eq!(second["verified_units"], 2);
    let third = synced(&[]);
    assert_eq!(third["bytes"], 0, "nothing written since: {third}");

    // Everything written again, then a sync paced to 8 Mbit/s a connection, stopped
    // once a destination has made some of it durable; the next one sends only what
    // had not arrived.
    let image2 = tmp.path().join("image2");
    random_file(&image2, 16 << 20, 12);
    run_ok(rsv_s, &["cp", image2.to_str().unwrap(), &a_url]);
    let args = [
        "--json",
        "--interval",
        "200ms",
        "--pacing",
        "unpaced",
        "--session",
        "connections=1",
        "--session",
        "pacing_rate=8mbit",
        // Two units in flight a stream, so that flushes come while it runs.
        "--session",
        "queue_depth=4",
        &src,
        &dst,
    ];
    let (mut slow, durable) = hosts.sync_until(&args, "anything was durable", |tick| {
        let d: Vec<u64> = tick["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["durable_bytes"].as_u64().unwrap())
            .collect();
        d.iter().any(|&b| b > 0).then(|| d.iter().sum::<u64>())
    });
    slow.kill().unwrap();
    slow.wait().unwrap();
    let resumed = synced(&[]);
    let sent = resumed["bytes"].as_u64().unwrap();
    assert!(
        sent > 0 && sent <= (16 << 20) - durable,
        "the resumed sync sends what had not arrived ({durable} bytes were durable): {resumed}"
    );
    let back = read_lun(&b_url, &tmp.path().join("back"));
    assert!(back == std::fs::read(&image2).unwrap());
}

/// `rsv sync --metrics`: while a paced sync of two streams runs, its exposition names
/// each stream with bytes left and passes promtool; `--json` progress carries each
/// stream's rate, bytes left and ETA; once it is done (held open by --metrics-hold),
/// every stream's bytes left are 0, its bytes sent its size, and the completion time is
/// set; SIGTERM ends the hold.
#[test]
fn sync_metrics_follow_the_streams_to_the_end() {
    if !testkit::have("curl") || !testkit::have("promtool") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let a = site(&hosts, 70, 2, "8M", false);
    let b = site(&hosts, 80, 2, "8M", false);
    let image = tmp.path().join("image");
    random_file(&image, 16 << 20, 5);
    run_ok(
        rsv().to_str().unwrap(),
        &["cp", image.to_str().unwrap(), &a.url()],
    );
    // 40 Mbit/s over the two streams: a few seconds for 16 MiB.
    let (src, dst) = (a.volume(), b.volume());
    let mut child = hosts
        .sync(&[
            "--json",
            "--rate",
            "40mbit",
            "--interval",
            "200ms",
            "--metrics",
            "127.0.0.1:0",
            "--metrics-hold",
            "120s",
            &src,
            &dst,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(tmp.path().join("sync.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let next = || {
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "rsv sync said nothing more:\n{}",
                    std::fs::read_to_string(tmp.path().join("sync.log")).unwrap_or_default()
                )
            })
    };
    let first = next();
    assert_eq!(first["event"], "metrics", "{first}");
    let metrics = first["listen"].as_str().unwrap().to_owned();

    // While it runs: a scrape with bytes left on a stream, and every progress line's
    // streams with their rate, bytes left and ETA.
    let mut during = None;
    let done = loop {
        let line = next();
        if line["event"] == "done" {
            break line;
        }
        assert_eq!(line["event"], "progress", "{line}");
        for s in line["streams"].as_array().unwrap() {
            assert!(s["rate_bytes_per_s"].is_u64(), "{s}");
            assert!(s["left_bytes"].is_u64(), "{s}");
            assert!(s.get("eta_s").is_some(), "{s}");
        }
        let left: u64 = line["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["left_bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(line["left_bytes"].as_u64(), Some(left), "{line}");
        if during.is_none() && left > 0 {
            let text = scrape(&metrics);
            let stream_left = series(&text, "rsv_sync_stream_left_bytes{stream=\"0\"}")
                + series(&text, "rsv_sync_stream_left_bytes{stream=\"1\"}");
            if series(&text, "rsv_sync_running") == 1.0 && stream_left > 0.0 {
                during = Some(text);
            }
        }
    };
    let during = during.expect("no scrape while the streams ran");
    assert_eq!(series(&during, "rsv_sync_streams"), 2.0, "{during}");
    assert_eq!(
        series(&during, "rsv_sync_size_bytes"),
        (16 << 20) as f64,
        "{during}"
    );
    assert!(
        during.contains("rsv_sync_stream_info{stream=\"1\",source=\"127.0.0.72:"),
        "{during}"
    );
    assert!(!during.contains("rsv_sync_last_complete_timestamp_seconds"));
    promtool_check(&during);
    assert_eq!(done["bytes"], 16 << 20, "{done}");

    // Done, and held: nothing left, everything sent, the completion time set.
    let end = scrape(&metrics);
    assert_eq!(series(&end, "rsv_sync_running"), 0.0, "{end}");
    assert_eq!(series(&end, "rsv_sync_left_bytes"), 0.0, "{end}");
    for i in 0..2 {
        let size = series(
            &end,
            &format!("rsv_sync_stream_size_bytes{{stream=\"{i}\"}}"),
        );
        assert_eq!(size, (8 << 20) as f64, "{end}");
        let left = format!("rsv_sync_stream_left_bytes{{stream=\"{i}\"}}");
        assert!(end.contains(&format!("{left} ")), "{end}");
        assert_eq!(series(&end, &left), 0.0, "{end}");
        let sent = format!("rsv_sync_stream_sent_bytes_total{{stream=\"{i}\"}}");
        assert_eq!(series(&end, &sent), size, "{end}");
    }
    let started = series(&end, "rsv_sync_started_timestamp_seconds");
    let completed = series(&end, "rsv_sync_last_complete_timestamp_seconds");
    assert!(started > 0.0 && completed >= started, "{end}");
    promtool_check(&end);
    // SIGTERM ends the hold, and the sync's exit is its own: success.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());
}

/// Compares two images, 1 MiB at a time (holes read as zeros); the first MiB that differs.
fn first_difference(a: &Path, b: &Path, len: u64) -> Option<u64> {
    use std::io::Read;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for mib in 0..len >> 20 {
        fa.read_exact(&mut ba).unwrap();
        fb.read_exact(&mut bb).unwrap();
        if ba != bb {
            return Some(mib);
        }
    }
    None
}

/// Text-like bytes that zstd shrinks about 3:1 or more.
fn text(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 100);
    let mut n = seed;
    while out.len() < len {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.extend_from_slice(
            format!(
                "line {} of the volume: checksum {:08x}, block {}\n",
                out.len(),
                n >> 40,
                n % 977
            )
            .as_bytes(),
        );
    }
    out.truncate(len);
    out
}

/// A sparse volume sends what it holds, not its size: a 1 GiB LUN with 64 MiB of data
/// (random and text) and 8 MiB of written zeros, onto a far LUN that held old data
/// everywhere. The sync's report counts at most 1.05 × 64 MiB sent as data, the rest made
/// zeros, and the far image then reads back identical, holes as zeros; a compressed sync
/// of a smaller LUN lands identical too, in fewer bytes on the wire.
#[test]
fn a_sparse_volume_sends_what_it_holds_and_compresses() {
    use std::io::{Seek, SeekFrom, Write};
    const MIB: u64 = 1 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path());
    let luns = "[[target.lun]]\nid = 0\nstore = \"file:big.img?size=1G\"\n\
                [[target.lun]]\nid = 1\nstore = \"file:small.img?size=64M\"\n";
    // The images are made before the targets open them.
    let a_dir = tempfile::tempdir().unwrap();
    let b_dir = tempfile::tempdir().unwrap();
    let write_at = |path: &Path, size: u64, parts: &[(u64, Vec<u8>)]| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap();
        f.set_len(size).unwrap();
        for (at, data) in parts {
            f.seek(SeekFrom::Start(*at)).unwrap();
            f.write_all(data).unwrap();
        }
    };
    let random = |len: usize, seed: u64| {
        let p = tmp.path().join(format!("r{seed}"));
        random_file(&p, len, seed);
        let d = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        d
    };
    write_at(
        &a_dir.path().join("big.img"),
        1024 * MIB,
        &[
            (0, random(32 << 20, 1)),
            (300 * MIB, text(16 << 20, 2)),
            (500 * MIB, vec![0u8; 8 << 20]),
            (1008 * MIB, random(16 << 20, 3)),
        ],
    );
    write_at(
        &a_dir.path().join("small.img"),
        64 * MIB,
        &[(0, text(40 << 20, 4)), (40 * MIB, random(8 << 20, 5))],
    );
    // Old data everywhere on the far LUNs.
    let old: Vec<(u64, Vec<u8>)> = (0..1024)
        .map(|i| (i * MIB, vec![0xa5u8; MIB as usize]))
        .collect();
    write_at(&b_dir.path().join("big.img"), 1024 * MIB, &old);
    write_at(&b_dir.path().join("small.img"), 64 * MIB, &old[..64]);
    let start = |addr: &str, dir: &tempfile::TempDir| {
        let abs = format!("file:{}/", dir.path().display());
        hosts.host(None, addr, &luns.replace("file:", &abs))
    };
    let a = start("127.0.0.50", &a_dir);
    let b = start("127.0.0.60", &b_dir);

    let out = sync(&hosts, &["--json", &a.volume(0), &b.volume(0)]);
    assert!(
        out.status.success(),
        "rsv sync failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = result_line(&stdout(&out));
    assert_eq!(done["event"], "done", "{done}");
    let data = done["data_bytes"].as_u64().unwrap();
    let wire = done["wire_bytes"].as_u64().unwrap();
    let zero = done["zero_bytes"].as_u64().unwrap();
    assert!(
        data <= 64 * MIB * 105 / 100,
        "sent {data} bytes as data: {done}"
    );
    assert!(data >= 64 * MIB, "{done}");
    assert!(wire <= data, "{done}");
    assert_eq!(data + zero, 1024 * MIB, "{done}");
    assert_eq!(done["verified_units"], 1024, "{done}");
    assert_eq!(
        first_difference(
            &a_dir.path().join("big.img"),
            &b_dir.path().join("big.img"),
            1024 * MIB
        ),
        None
    );

    // Compressed, with every unit that shrinks sent so.
    let out = sync(
        &hosts,
        &["--json", "--compress", "on", &a.volume(1), &b.volume(1)],
    );
    assert!(
        out.status.success(),
        "rsv sync --compress on failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let done = result_line(&stdout(&out));
    let data = done["data_bytes"].as_u64().unwrap();
    let wire = done["wire_bytes"].as_u64().unwrap();
    // 40 MiB of text, 8 MiB random, 16 MiB never written.
    assert_eq!(data, 48 * MIB, "{done}");
    assert_eq!(done["zero_bytes"].as_u64().unwrap(), 16 * MIB, "{done}");
    // The text units compressed, the random ones not.
    assert_eq!(done["compressed_units"], 40, "{done}");
    assert!(wire < 8 * MIB + 40 * MIB / 2, "{done}");
    assert_eq!(
        first_difference(
            &a_dir.path().join("small.img"),
            &b_dir.path().join("small.img"),
            64 * MIB
        ),
        None
    );
}
