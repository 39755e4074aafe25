//! The far copy is always whole (`backstore::undo`, `replicate::cycle`), and continuous
//! mode (`rsv sync --every`), with real `rsv target` processes on loopback: two sites,
//! each a file server striping a volume over two disk servers.
//!
//! - A sync cut off halfway (the source site SIGKILLed, then the coordinator) leaves the
//!   far copy equal to the image of the last sync, byte for byte, once the far disk
//!   servers restart (their start rolls the cycle back); a further sync completes it.
//!   With `RSV_DR_NO_UNDO=1` the far LUNs keep no undo log (`undo = false`) and this test
//!   fails: the far copy is then half one image, half the next.
//! - `rsv sync --every 1s` with a writer stamping sequence numbers: cycles commit, each
//!   reports its RPO (printed), `/metrics` carries `rsv_sync_rpo_seconds`, SIGTERM ends it
//!   with status 0, and the far copy holds a prefix of the writes (one moment).
//! - A cycle committed on one far member and still open on the other: `promote --force`
//!   rolls it forward on the other, and every member holds the cycle's image.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use std::time::{Duration, Instant};

use testkit::site::{key_file, read_lun, result_line, Hosts, Site, KEY};
use testkit::stamps::{holes, unix_now, writes_in, Writer};
use testkit::{random_file, rsv, run_ok};
use tools::crash::model::UNIT;

const IQN: &str = "iqn.2026-11.org.reservoir:drcycle";

/// The hosts of a test: every portal on one port and every agent on another, both free on
/// 127.0.0.`base` (each host has its own address), so that a host restarted comes back
/// where the file server finds its members; the key in `tmp`.
fn hosts(tmp: &Path, base: u8) -> Hosts {
    let free = || {
        std::net::TcpListener::bind(format!("127.0.0.{base}:0"))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (iscsi, control) = (free(), free());
    Hosts::new(IQN, control, &key_file(&tmp.join("key"), KEY)).with_iscsi_port(iscsi)
}

/// A site under `dir` (kept across restarts): two disk servers of 16 MiB at
/// 127.0.0.{base+1} and {base+2} with the LUN keys `extra`, and a file server at
/// 127.0.0.{base} striping over them in 64 KiB units.
fn site(hosts: &Hosts, dir: &Path, base: u8, extra: &str) -> Site {
    hosts.site(Some(dir), base, 2, "file:disk.img?size=16M", extra)
}

/// Disk server `i`'s member, read whole.
fn member(site: &Site, i: usize, tmp: &Path) -> Vec<u8> {
    let to = tmp.join(format!("member-{}-{i}", site.file_server.addr));
    read_lun(&site.disks[i].url(0), &to)
}

/// The volume, read whole through the file server.
fn volume_bytes(site: &Site, tmp: &Path) -> Vec<u8> {
    read_lun(
        &site.url(),
        &tmp.join(format!("volume-{}", site.file_server.addr)),
    )
}

/// The cycle states of a site's disk servers, asked of their agents.
fn far_states(hosts: &Hosts, site: &Site) -> Vec<replicate::api::CycleAnswer> {
    let k = replicate::auth::Key::from_file(&hosts.key).unwrap();
    let members: Vec<replicate::cycle::FarMember> = site
        .disks
        .iter()
        .map(|d| replicate::cycle::FarMember {
            agent: replicate::wire::Client::new(d.control.clone(), k.clone()),
            iqn: IQN.into(),
            lun: 0,
        })
        .collect();
    testkit::rt()
        .block_on(replicate::cycle::states(&members))
        .unwrap()
}

/// `rsv sync --json ARGS SRC DST`, which must succeed: its result line.
fn sync_ok(hosts: &Hosts, args: &[&str], src: &str, dst: &str) -> serde_json::Value {
    result_line(&hosts.sync_ok(&[&["--json"], args, &[src, dst]].concat()))
}

/// An unpaced sync whose coordinator exits (status 86) at the fault point `fault` names
/// (`RSV_SYNC_FAULT_EXIT_AFTER_COMMITS=1`, `RSV_SYNC_FAULT_EXIT_AFTER_FAR_RECORD`).
fn sync_to_fault_point(hosts: &Hosts, fault: &str, src: &str, dst: &str) {
    let out = hosts
        .sync(&["--json", "--pacing", "unpaced", src, dst])
        .env(fault, "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(86),
        "the coordinator exits at the fault point {fault}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn a_sync_cut_off_halfway_leaves_the_far_copy_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 71);
    let no_undo = std::env::var_os("RSV_DR_NO_UNDO").is_some();
    let mut a = site(&hosts, &tmp.path().join("a"), 71, "track = true\n");
    let mut b = site(
        &hosts,
        &tmp.path().join("b"),
        75,
        if no_undo { "undo = false\n" } else { "" },
    );
    let (src, dst) = (a.volume(), b.volume());
    let rsv_s = rsv();
    let rsv_s = rsv_s.to_str().unwrap();

    // The first image, synced whole.
    let image1 = tmp.path().join("image1");
    random_file(&image1, 32 << 20, 1);
    run_ok(rsv_s, &["cp", image1.to_str().unwrap(), &a.url()]);
    let first = sync_ok(&hosts, &["--pacing", "unpaced"], &src, &dst);
    eprintln!("first sync: {first}");
    assert_eq!(first["cycle"]["whole"], !no_undo, "{first}");
    let far1: Vec<Vec<u8>> = (0..2).map(|i| member(&b, i, tmp.path())).collect();
    assert!(volume_bytes(&b, tmp.path()) == std::fs::read(&image1).unwrap());

    // The second, cut off halfway: the source site is lost (SIGKILL), then the
    // coordinator.
    let image2 = tmp.path().join("image2");
    random_file(&image2, 32 << 20, 2);
    run_ok(rsv_s, &["cp", image2.to_str().unwrap(), &a.url()]);
    let args = [
        "--json",
        "--interval",
        "100ms",
        "--rate",
        "40mbit",
        &src,
        &dst,
    ];
    let (mut slow, done_at_cut) = hosts.sync_until(&args, "a quarter was sent", |tick| {
        let done = tick["done_bytes"].as_u64().unwrap();
        (done * 4 >= tick["bytes"].as_u64().unwrap()).then_some(done)
    });
    a.kill();
    std::thread::sleep(Duration::from_millis(300));
    let _ = slow.kill();
    slow.wait().unwrap();
    eprintln!("cut off with {done_at_cut} bytes acknowledged at the far site");

    // The far disk servers still run with the cycle open, the medium half new.
    let states = far_states(&hosts, &b);
    eprintln!("far site after the cut-off: {states:?}");
    if !no_undo {
        assert!(
            states.iter().all(|s| s.open.is_some() && s.saved_bytes > 0),
            "the cycle is open on every far member and saved what it overwrote: {states:?}"
        );
    }
    let mixed: Vec<Vec<u8>> = (0..2).map(|i| member(&b, i, tmp.path())).collect();
    assert!(
        mixed != far1,
        "the cut-off sync wrote nothing to the far site: the test proves nothing"
    );

    // The far disk servers crash and start again: each rolls its cycle back before it
    // serves, and holds the first image byte for byte.
    for d in &mut b.disks {
        d.restart();
    }
    for (i, d) in b.disks.iter().enumerate() {
        let got = member(&b, i, tmp.path());
        if let Some(at) = first_difference(&got, &far1[i]) {
            panic!(
                "far member {i} differs from the first image at byte {at} after its restart\n{}",
                d.log()
            );
        }
    }
    let states = far_states(&hosts, &b);
    if !no_undo {
        assert!(
            states
                .iter()
                .all(|s| s.open.is_none() && s.rolled_back.is_some()),
            "{states:?}"
        );
    }
    b.file_server.restart();
    assert!(volume_bytes(&b, tmp.path()) == std::fs::read(&image1).unwrap());

    // The source site comes back; a further sync completes the second image (every unit:
    // the far site rolled back what the source had counted as sent).
    a.restart();
    let third = sync_ok(&hosts, &["--pacing", "unpaced"], &src, &dst);
    eprintln!("the sync after: {third}");
    assert!(volume_bytes(&b, tmp.path()) == std::fs::read(&image2).unwrap());
    let states = far_states(&hosts, &b);
    assert!(
        states
            .iter()
            .all(|s| s.open.is_none() && s.committed == third["cycle"]["cycle"].as_u64()),
        "{states:?} {third}"
    );
}

#[test]
fn continuous_mode_commits_whole_images_and_stops_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 81);
    let a = site(&hosts, &tmp.path().join("a"), 81, "track = true\n");
    let b = site(&hosts, &tmp.path().join("b"), 85, "");
    let units = (32u64 << 20) / UNIT as u64;
    let w = Writer::start(&a.url(), units, Duration::from_millis(2));
    w.wait_for(50);
    let metrics = format!("127.0.0.1:{}", testkit::free_port());
    let t0 = unix_now();
    let (src, dst) = (a.volume(), b.volume());
    let mut sync = hosts
        .sync(&[
            "--json",
            "--every",
            "1s",
            "--pacing",
            "unpaced",
            "--interval",
            "100ms",
            "--metrics",
            &metrics,
            &src,
            &dst,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(tmp.path().join("sync.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(sync.stdout.take().unwrap()).lines();
    let mut cycles = Vec::new();
    let mut scraped = None;
    let started = Instant::now();
    while cycles.len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "three cycles never came"
        );
        let Some(line) = lines.next() else {
            panic!(
                "rsv sync --every exited:\n{}",
                std::fs::read_to_string(tmp.path().join("sync.log")).unwrap_or_default()
            );
        };
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["event"] != "cycle" {
            continue;
        }
        let now = unix_now();
        eprintln!("{v}");
        assert_eq!(v["committed"], true, "{v}");
        assert_eq!(v["whole"], true, "{v}");
        let cut = v["cut_unix"].as_f64().unwrap();
        let rpo = v["rpo_seconds"].as_f64().unwrap();
        // The lag is from the cut of the image just committed: no less than the cycle
        // after the cut took, no more than now minus the cut.
        assert!(cut >= t0 && cut <= now, "cut {cut} outside [{t0}, {now}]");
        assert!(
            rpo >= 0.0 && rpo <= now - cut + 0.001,
            "rpo {rpo} > {} (now - cut)",
            now - cut
        );
        // Where its seconds went: every phase from the cut through the commit is one
        // span of the cut-to-commit time, itself within the cycle (spans of one clock
        // compared with each other, never with a bound).
        let ph = &v["phases"];
        let secs = |k: &str| {
            ph[k]
                .as_f64()
                .unwrap_or_else(|| panic!("no phases.{k} in {v}"))
        };
        let to_commit = secs("cut_to_commit_s");
        // (`open_s` comes before the cut: the cycle opens, and the streams log in, first.)
        let parts: f64 = [
            "cut_s",
            "start_s",
            "streams_s",
            "verify_s",
            "prepare_s",
            "commit_s",
        ]
        .iter()
        .map(|k| secs(k))
        .sum();
        assert!(
            secs("open_s") > 0.0 && secs("streams_s") > 0.0 && secs("commit_s") > 0.0,
            "{v}"
        );
        assert!(
            parts <= to_commit + 1e-3,
            "phases {parts} > cut to commit {to_commit}: {v}"
        );
        assert!(to_commit <= v["seconds"].as_f64().unwrap() + 1e-3, "{v}");
        for k in [
            "plan_s",
            "roles_s",
            "release_s",
            "drop_s",
            "record_s",
            "login_s",
            "first_ack_s",
        ] {
            assert!(secs(k) >= 0.0, "{v}");
        }
        if scraped.is_none() {
            let text = run_ok("curl", &["-sf", &format!("http://{metrics}/metrics")]);
            let at = unix_now();
            let rpo: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("rsv_sync_rpo_seconds "))
                .unwrap_or_else(|| panic!("no rsv_sync_rpo_seconds in\n{text}"))
                .parse()
                .unwrap();
            assert!(rpo >= 0.0 && rpo <= at - cut + 0.001, "scraped rpo {rpo}");
            assert!(text.contains("rsv_sync_last_complete_timestamp_seconds "));
            scraped = Some(rpo);
        }
        cycles.push(v);
    }
    // SIGTERM while the writer writes: the cycle running finishes, the command exits 0.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(sync.id() as i32, libc::SIGTERM);
    }
    let status = sync.wait().unwrap();
    let rest: Vec<serde_json::Value> = lines
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .filter(|v: &serde_json::Value| v["event"] == "cycle")
        .collect();
    let acks = w.stop();
    assert!(
        status.success(),
        "exit status {status} after SIGTERM:\n{}",
        std::fs::read_to_string(tmp.path().join("sync.log")).unwrap_or_default()
    );
    let last = rest.last().unwrap_or(cycles.last().unwrap()).clone();
    eprintln!("after SIGTERM: {rest:?}");
    let rpos: Vec<f64> = cycles
        .iter()
        .chain(&rest)
        .filter_map(|c| c["rpo_seconds"].as_f64())
        .collect();
    eprintln!(
        "RPO at each cycle's end (s): {rpos:?}; scraped after the first: {:?}",
        scraped
    );

    // The far copy: one moment, the last committed cycle's cut.
    let states = far_states(&hosts, &b);
    assert!(states.iter().all(|s| s.open.is_none()), "{states:?}");
    let id = last["id"].as_u64();
    assert!(
        states.iter().all(|s| s.committed == id),
        "{states:?} {last}"
    );
    let copy = volume_bytes(&b, tmp.path());
    let found = writes_in(&copy, units);
    let k = found.len() as u64;
    let holes = holes(&found);
    assert!(
        holes.is_empty(),
        "the far copy is no single moment: holes {holes:?} below {k}"
    );
    let cut = last["cut_unix"].as_f64().unwrap();
    let before_cut = acks.iter().filter(|&&t| t <= cut).count() as u64;
    eprintln!(
        "far copy: writes 1..={k}; {before_cut} acknowledged before the last cut, {} in all",
        acks.len()
    );
    assert!(
        k >= before_cut,
        "a write acknowledged before the cut is missing ({k} < {before_cut})"
    );
    assert!(k <= acks.len() as u64);
}

/// What a running `rsv sync --json` prints, kept open so that it never writes to a
/// closed pipe.
type Printed = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// Starts `rsv sync --rate 40mbit SRC DST` and returns once the far site has
/// acknowledged a `1/part` of it: the child (still running), its output, and how much
/// was done.
// The child is returned running: its caller kills and waits for it (a panic here fails
// the test, and the child's own run ends with the sync).
#[allow(clippy::zombie_processes)]
fn sync_until(key: &Path, src: &str, dst: &str, part: u64) -> (Child, Printed, u64) {
    let mut slow = Command::new(rsv())
        .arg("sync")
        .arg("--key-file")
        .arg(key)
        .args(["--json", "--interval", "100ms", "--rate", "40mbit"])
        .args([src, dst])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(slow.stdout.take().unwrap()).lines();
    loop {
        let line = lines
            .next()
            .expect("the slow sync ended before its part was sent")
            .unwrap();
        let tick: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(tick["event"], "progress", "{tick}");
        let (done, bytes) = (
            tick["done_bytes"].as_u64().unwrap(),
            tick["bytes"].as_u64().unwrap(),
        );
        if done * part >= bytes {
            return (slow, lines, done);
        }
    }
}

/// `rsv sync ARGS --key-file KEY` (a failover command): exit status, stdout, stderr.
fn sync_cmd(key: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(rsv())
        .arg("sync")
        .args(args)
        .arg("--key-file")
        .arg(key)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn sync_cmd_ok(key: &Path, args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = sync_cmd(key, args);
    assert!(ok, "rsv sync {args:?} failed:\n{out}\n{err}");
    // One JSON object (status, promote, demote), or JSON lines ending with the report.
    serde_json::from_str(out.trim()).unwrap_or_else(|_| {
        out.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .next_back()
            .unwrap_or_else(|| panic!("no JSON from rsv sync {args:?}:\n{out}"))
    })
}

/// Writes `data` at `offset` of the LUN at `url`, logged in as `name` (`None`: the
/// initiator's own name, an application's); the SCSI error if refused.
fn write_as(
    url: &str,
    name: Option<&str>,
    offset: u64,
    data: Vec<u8>,
) -> Result<(), initiator::Error> {
    testkit::rt().block_on(async {
        let url = initiator::IscsiUrl::parse(url).unwrap();
        let mut opts = initiator::SessionOptions::default();
        if let Some(n) = name {
            opts.set("initiator_name", n).unwrap();
        }
        let lun = initiator::Lun::open_url(&url, &opts).await.unwrap();
        let mut r = lun.write_at(offset, Bytes::from(data)).await;
        if r.is_ok() {
            r = lun.flush().await;
        }
        let _ = lun.session().logout().await;
        r
    })
}

fn write_protected(e: &initiator::Error) -> bool {
    matches!(e, initiator::Error::Scsi { sense: Some(s), .. } if s.key == 0x07 && s.asc == 0x27)
}

/// Disk server `i`'s agent at site `base`.
fn member_agent(base: u8, i: u8, port: u16, key: &Path) -> replicate::wire::Client {
    replicate::wire::Client::new(
        format!("127.0.0.{}:{port}", base + 1 + i),
        replicate::auth::Key::from_file(key).unwrap(),
    )
}

/// The newest send on disk server `i`'s agent at site `base`.
fn newest_send(base: u8, i: u8, port: u16, key: &Path) -> replicate::api::JobStatus {
    let agent = member_agent(base, i, port, key);
    testkit::rt().block_on(async {
        let mut last = None;
        for id in 1..20 {
            match agent
                .call::<replicate::api::JobStatus>("GET", &format!("/v1/jobs/{id}"), &())
                .await
            {
                Ok(s) => last = Some(s),
                Err(_) => break,
            }
        }
        last.expect("a send on the source agent")
    })
}

#[test]
fn promote_force_rolls_a_cut_off_cycle_back_then_the_old_source_fails_back() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 91);
    let key = hosts.key.clone();
    let mut a = site(&hosts, &tmp.path().join("a"), 91, "track = true\n");
    // B keeps change tracking too: the resync after the failback sends its changes.
    let b = site(&hosts, &tmp.path().join("b"), 95, "track = true\n");
    let (src, dst) = (a.volume(), b.volume());
    let rsv_s = rsv();
    let rsv_s = rsv_s.to_str().unwrap();

    let image1 = tmp.path().join("image1");
    random_file(&image1, 32 << 20, 11);
    run_ok(rsv_s, &["cp", image1.to_str().unwrap(), &a.url()]);
    sync_ok(&hosts, &["--pacing", "unpaced"], &src, &dst);
    let image1 = std::fs::read(&image1).unwrap();

    // The next sync is cut off at a quarter: site A lost, then its coordinator.
    let image2 = tmp.path().join("image2");
    random_file(&image2, 32 << 20, 12);
    run_ok(rsv_s, &["cp", image2.to_str().unwrap(), &a.url()]);
    let (mut slow, _printed, done) = sync_until(&key, &src, &dst, 4);
    for d in &mut a.disks {
        d.kill();
    }
    a.file_server.kill();
    std::thread::sleep(Duration::from_millis(300));
    let _ = slow.kill();
    slow.wait().unwrap();
    eprintln!("cut off with {done} bytes acknowledged at the far site");
    let open: Vec<u64> = far_states(&hosts, &b)
        .iter()
        .map(|s| s.open.expect("the cycle is open on every far member"))
        .collect();
    assert!(
        volume_bytes(&b, tmp.path()) != image1,
        "the cut-off sync wrote nothing to B: the test proves nothing"
    );

    // A plain promote is refused, naming the open cycle and the way out.
    let (ok, out, err) = sync_cmd(&key, &["promote", &dst, "--json"]);
    assert!(!ok, "promote with a cycle open succeeded:\n{out}");
    assert!(
        open.iter()
            .any(|c| err.contains(&format!("cycle {c} is open"))),
        "the refusal names the open cycle ({open:?}): {err}"
    );
    assert!(err.contains("--force"), "{err}");
    let st = sync_cmd_ok(&key, &["status", &dst, "--json"]);
    assert_eq!(st["role"], "replica", "a refused promote changed B: {st}");

    // --force rolls the cycle back and promotes: B holds the first image, byte for byte.
    let p = sync_cmd_ok(&key, &["promote", &dst, "--force", "--json"]);
    assert_eq!(
        (p["role"].as_str(), p["epoch"].as_u64()),
        (Some("primary"), Some(2)),
        "{p}"
    );
    assert!(
        far_states(&hosts, &b)
            .iter()
            .all(|s| s.open.is_none() && s.rolled_back.is_some()),
        "the cycle is rolled back on every member"
    );
    let mut promoted = volume_bytes(&b, tmp.path());
    if let Some(at) = first_difference(&promoted, &image1) {
        panic!("the promoted volume differs from the last committed image at byte {at}");
    }

    // An application writes B.
    let written = (4u64 << 20) + 12_288;
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    write_as(&b.url(), None, written, data.clone()).unwrap();
    promoted[written as usize..written as usize + data.len()].copy_from_slice(&data);
    assert!(volume_bytes(&b, tmp.path()) == promoted, "B lost the write");

    // Site A comes back, still a primary at epoch 1 as it knows: demoted, then resynced
    // from B, it holds B's data.
    for d in &mut a.disks {
        d.restart();
    }
    a.file_server.restart();
    let d = sync_cmd_ok(&key, &["demote", &src, "--json"]);
    assert_eq!(d["role"], "replica", "{d}");
    let r = sync_cmd_ok(&key, &["resync", &dst, &src, "--json"]);
    eprintln!("resync: {r}");
    let back = volume_bytes(&a, tmp.path());
    if let Some(at) = first_difference(&back, &promoted) {
        panic!("A differs from B after the resync at byte {at}");
    }
    let sa = sync_cmd_ok(&key, &["status", &src, "--json"]);
    assert_eq!(
        (sa["role"].as_str(), sa["epoch"].as_u64()),
        (Some("replica"), Some(2)),
        "{sa}"
    );
}

#[test]
fn a_stream_that_outlives_its_cycle_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 101);
    let (key, control) = (hosts.key.clone(), hosts.control_port);
    let a = site(&hosts, &tmp.path().join("a"), 101, "track = true\n");
    let b = site(&hosts, &tmp.path().join("b"), 105, "");
    let (src, dst) = (a.volume(), b.volume());
    let rsv_s = rsv();
    let rsv_s = rsv_s.to_str().unwrap();

    let image1 = tmp.path().join("image1");
    random_file(&image1, 32 << 20, 21);
    run_ok(rsv_s, &["cp", image1.to_str().unwrap(), &a.url()]);
    sync_ok(&hosts, &["--pacing", "unpaced"], &src, &dst);
    let far1: Vec<Vec<u8>> = (0..2).map(|i| member(&b, i, tmp.path())).collect();

    // The next sync's coordinator dies at a tenth; its streams (in the source disk
    // servers' agents) go on writing. The far site rolls the cycle back meanwhile.
    let image2 = tmp.path().join("image2");
    random_file(&image2, 32 << 20, 22);
    run_ok(rsv_s, &["cp", image2.to_str().unwrap(), &a.url()]);
    let (mut slow, _printed, done) = sync_until(&key, &src, &dst, 10);
    let _ = slow.kill();
    slow.wait().unwrap();
    let states = far_states(&hosts, &b);
    let cycle = states[0].open.expect("the cycle is open at the far site");
    let running: Vec<replicate::api::JobStatus> =
        (0..2).map(|i| newest_send(101, i, control, &key)).collect();
    let writer = {
        let st = sync_cmd_ok(&key, &["status", &dst, "--json"]);
        st["luns"][1]["record"]["writers"][0]
            .as_str()
            .expect("the far member's writer")
            .to_owned()
    };
    testkit::rt().block_on(async {
        for i in 0..2u8 {
            let req = replicate::api::CycleRequest {
                iqn: IQN.into(),
                lun: 0,
                ..Default::default()
            };
            member_agent(105, i, control, &key)
                .call::<replicate::api::CycleAnswer>("POST", "/v1/cycle/rollback", &req)
                .await
                .unwrap();
        }
    });
    eprintln!("coordinator killed at {done} bytes; cycle {cycle} rolled back with the sends at {running:?}");
    assert!(
        running
            .iter()
            .any(|s| s.state == replicate::api::JobState::Running && s.done_bytes < s.bytes),
        "no stream was still writing after the roll back: the test proves nothing"
    );

    // A stream of the cycle that logs in again is refused too.
    let member0 = b.disks[0].url(0);
    let tagged = backstore::role::cycle_writer(&writer, cycle);
    let e = write_as(&member0, Some(&tagged), 0, vec![0x5a; 65536]).unwrap_err();
    assert!(
        write_protected(&e),
        "a write of the rolled-back cycle: {e:?}"
    );

    // Once the streams have ended, the far members hold the last committed image.
    let until = Instant::now() + Duration::from_secs(90);
    let ended: Vec<replicate::api::JobStatus> = loop {
        let s: Vec<_> = (0..2).map(|i| newest_send(101, i, control, &key)).collect();
        if s.iter().all(|s| {
            !matches!(
                s.state,
                replicate::api::JobState::Running | replicate::api::JobState::Connecting
            )
        }) {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the orphaned sends never ended: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("the orphaned sends ended: {ended:?}");
    for (i, want) in far1.iter().enumerate() {
        let got = member(&b, i, tmp.path());
        if let Some(at) = first_difference(&got, want) {
            panic!(
                "far member {i} changed after its cycle was rolled back (byte {at})\n{}",
                b.disks[i].log()
            );
        }
    }

    // The next sync goes through the fence, in its own cycle.
    sync_ok(&hosts, &["--pacing", "unpaced"], &src, &dst);
    assert!(volume_bytes(&b, tmp.path()) == std::fs::read(&image2).unwrap());
}

/// A site of two 8 MiB disk servers whose LUNs track changes in 64 KiB units (the stripe
/// unit), so that a unit of the volume is a unit of one member's map.
fn small_site(hosts: &Hosts, dir: &Path, base: u8) -> Site {
    hosts.site(
        Some(dir),
        base,
        2,
        "file:disk.img?size=8M",
        "track = true\ntrack_unit = \"64KiB\"\n",
    )
}

/// Writes `len` bytes of noise (from `seed`) at `offset` of the volume, as an application
/// does, and into `model`.
fn app_writes(site: &Site, model: &mut [u8], offset: usize, len: usize, seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    write_as(&site.url(), None, offset as u64, data.clone()).unwrap();
    model[offset..offset + len].copy_from_slice(&data);
}

/// Starts `rsv sync --rate 16mbit SRC DST` and SIGKILLs the source site, then the
/// coordinator, once every stream has units durable at the far site (made durable by a
/// periodic flush, so counted as sent at the source: `ChangeMap::sent`) and before it
/// ends. Returns the far cycle left open on each member.
fn cut_off_with_units_sent(hosts: &Hosts, src: &mut Site, dst: &Site) -> Vec<u64> {
    let args = [
        "--json",
        "--interval",
        "100ms",
        "--rate",
        "16mbit",
        &src.volume(),
        &dst.volume(),
    ];
    let (mut slow, durable) = hosts.sync_until(&args, "units durable on every stream", |t| {
        let streams = t["streams"].as_array()?;
        let durable: Vec<u64> = streams
            .iter()
            .map(|s| s["durable_bytes"].as_u64().unwrap_or(0))
            .collect();
        durable.iter().all(|&d| d > 0).then_some(durable)
    });
    src.kill();
    std::thread::sleep(Duration::from_millis(300));
    let _ = slow.kill();
    slow.wait().unwrap();
    eprintln!("cut off with {durable:?} bytes durable at the far members");
    far_states(hosts, dst)
        .iter()
        .map(|s| {
            s.open
                .expect("the cut-off cycle is open on every far member")
        })
        .collect()
}

/// Units of 64 KiB in which `a` and `b` differ, and their bytes.
fn differing(a: &[u8], b: &[u8]) -> (u64, u64) {
    let n = a
        .chunks(64 << 10)
        .zip(b.chunks(64 << 10))
        .filter(|(x, y)| x != y)
        .count() as u64;
    (n, n << 16)
}

/// Issue 39: a commit cut off between two members (the coordinator killed by the fault
/// point after the first member's commit) leaves one member committed and the other
/// prepared; the prepared cycle survives the far disk servers' restart, a plain promote is
/// refused saying --force rolls it forward, and `promote --force` commits it there: the
/// far site equals the source's image of that cycle byte for byte.
#[test]
fn promote_rolls_forward_a_cycle_its_coordinator_committed_on_one_member() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 131);
    let key = hosts.key.clone();
    let a = small_site(&hosts, &tmp.path().join("a"), 131);
    let mut b = small_site(&hosts, &tmp.path().join("b"), 135);
    let (src, dst) = (a.volume(), b.volume());
    let mut image = vec![0u8; 16 << 20];
    app_writes(&a, &mut image, 0, 16 << 20, 1);
    sync_ok(&hosts, &["--pacing", "unpaced"], &src, &dst);

    // The next image, half the volume rewritten; its sync's coordinator exits right after
    // the first member's commit.
    app_writes(&a, &mut image, 4 << 20, 8 << 20, 2);
    sync_to_fault_point(&hosts, "RSV_SYNC_FAULT_EXIT_AFTER_COMMITS", &src, &dst);
    let states = far_states(&hosts, &b);
    eprintln!("far members after the coordinator's exit: {states:?}");
    let n = states
        .iter()
        .find_map(|s| {
            s.committed
                .filter(|_| s.open.is_none() && s.rolled_back.is_none())
        })
        .filter(|&c| states.iter().any(|s| s.open == Some(c)))
        .unwrap_or_else(|| panic!("one member committed the cycle, one has it open: {states:?}"));
    assert_eq!(
        states.iter().filter(|s| s.prepared == Some(n)).count(),
        1,
        "the other member holds cycle {n} prepared: {states:?}"
    );

    // The far site's disk servers crash and come back: a prepared cycle is kept.
    b.kill();
    b.restart();
    // The log's sync count is the running process's (a restart starts it again).
    let durable = |v: &[replicate::api::CycleAnswer]| -> Vec<replicate::api::CycleAnswer> {
        v.iter()
            .map(|s| replicate::api::CycleAnswer {
                log_syncs: 0,
                ..s.clone()
            })
            .collect()
    };
    let after = far_states(&hosts, &b);
    assert_eq!(
        durable(&after),
        durable(&states),
        "the restart changed the members' cycle states"
    );

    // A plain promote is refused, saying what --force does.
    let (ok, out, err) = sync_cmd(&key, &["promote", &dst, "--json"]);
    assert!(!ok, "promote with a cycle open succeeded:\n{out}");
    assert!(err.contains(&format!("cycle {n} is open")), "{err}");
    assert!(
        err.contains(&format!("--force commits cycle {n}")),
        "the refusal says --force rolls the cycle forward: {err}"
    );
    let p = sync_cmd_ok(&key, &["promote", &dst, "--force", "--json"]);
    assert_eq!(p["role"], "primary", "{p}");
    assert_eq!(p["rolled_forward"], n, "{p}");
    let states = far_states(&hosts, &b);
    assert!(
        states
            .iter()
            .all(|s| s.open.is_none() && s.committed == Some(n)),
        "every member committed cycle {n}: {states:?}"
    );
    let got = volume_bytes(&b, tmp.path());
    if let Some(at) = first_difference(&got, &image) {
        panic!("the promoted far site differs from the source's image of cycle {n} at byte {at}");
    }
}

/// Issue 39: two failovers in a row, each abandoning a cycle cut off after units of it
/// were durable at the far site (so counted as sent at its source). A to B, cut off and
/// rolled back by `promote B --force`; B resynced onto A; B to A, cut off and rolled back
/// by `promote A --force`; then the resync A to B, onto a B that still carries the mark
/// of the first roll back. It stays incremental, sends at most 1.1 x the bytes of the
/// units that differ, and leaves both sites equal byte for byte: the units A's roll back
/// restored are in A's change map.
#[test]
fn a_resync_after_a_second_forced_failover_stays_incremental() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 141);
    let key = hosts.key.clone();
    let mut a = small_site(&hosts, &tmp.path().join("a"), 141);
    let mut b = small_site(&hosts, &tmp.path().join("b"), 145);
    let (va, vb) = (a.volume(), b.volume());
    let mut on_a = vec![0u8; 16 << 20];
    app_writes(&a, &mut on_a, 0, 16 << 20, 11);
    sync_ok(&hosts, &["--pacing", "unpaced"], &va, &vb);

    // First failover: A's next image cut off, B promoted by rolling it back.
    app_writes(&a, &mut on_a, 0, 8 << 20, 12);
    cut_off_with_units_sent(&hosts, &mut a, &b);
    let p = sync_cmd_ok(&key, &["promote", &vb, "--force", "--json"]);
    assert_eq!(
        (p["role"].as_str(), p["epoch"].as_u64()),
        (Some("primary"), Some(2))
    );
    let mut on_b = volume_bytes(&b, tmp.path());
    app_writes(&b, &mut on_b, 10 << 20, 1 << 20, 13);
    a.restart();
    sync_cmd_ok(&key, &["demote", &va, "--json"]);
    let r = sync_cmd_ok(&key, &["resync", &vb, &va, "--json"]);
    assert_eq!(r["incremental"], true, "{r}");
    assert!(
        volume_bytes(&a, tmp.path()) == on_b,
        "A equals B after the first resync"
    );
    assert!(
        far_states(&hosts, &b)
            .iter()
            .all(|s| s.rolled_back.is_some()),
        "B still carries the first roll back's mark"
    );

    // Second failover: B's next image cut off, A promoted by rolling it back.
    app_writes(&b, &mut on_b, 4 << 20, 8 << 20, 14);
    cut_off_with_units_sent(&hosts, &mut b, &a);
    let p = sync_cmd_ok(&key, &["promote", &va, "--force", "--json"]);
    assert_eq!(
        (p["role"].as_str(), p["epoch"].as_u64()),
        (Some("primary"), Some(3))
    );
    let mut on_a = volume_bytes(&a, tmp.path());
    app_writes(&a, &mut on_a, 14 << 20, 1 << 20, 15);

    // B comes back, is demoted, and resynced from A.
    b.restart();
    sync_cmd_ok(&key, &["demote", &vb, "--json"]);
    let before_b = volume_bytes(&b, tmp.path());
    let (units, differ) = differing(&on_a, &before_b);
    assert!(units > 0);
    let r = sync_cmd_ok(&key, &["resync", &va, &vb, "--json"]);
    let sent = r["data_bytes"].as_u64().unwrap() + r["zero_bytes"].as_u64().unwrap();
    println!(
        "second resync: {units} unit(s) of 64 KiB differed ({differ} bytes); sent {sent} bytes, {:.3}x; incremental {}",
        sent as f64 / differ as f64,
        r["incremental"]
    );
    assert_eq!(r["incremental"], true, "{r}");
    let got = volume_bytes(&b, tmp.path());
    if let Some(at) = first_difference(&got, &on_a) {
        panic!(
            "B differs from A after the resync at byte {at} (unit {}): a unit A's roll back \
             restored was not sent",
            at >> 16
        );
    }
    assert!(
        sent >= differ,
        "sent {sent} bytes, less than the {differ} that differ"
    );
    assert!(
        sent * 10 <= differ * 11,
        "sent {sent} bytes for {differ} that differ: more than 1.1x"
    );
    let st = sync_cmd_ok(&key, &["status", &vb, "--json"]);
    assert_eq!(
        (st["role"].as_str(), st["epoch"].as_u64()),
        (Some("replica"), Some(3)),
        "{st}"
    );
}

/// Issue 39: the source site lost after the far side recorded a completed sync's image and
/// before the source recorded it (a fault point exits the coordinator there). The far side
/// is promoted and written, the old source demoted, and the resync back onto it goes on
/// incrementally, at most 1.1 x the bytes of the units that differ, leaving both equal:
/// the source had the image pending. Refused ("hold no common image"; the lab then sent
/// everything) when only the recorded images are compared.
#[test]
fn a_resync_after_a_loss_between_the_two_sides_records_stays_incremental() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 151);
    let key = hosts.key.clone();
    let mut a = small_site(&hosts, &tmp.path().join("a"), 151);
    let b = small_site(&hosts, &tmp.path().join("b"), 155);
    let (va, vb) = (a.volume(), b.volume());
    let mut on_a = vec![0u8; 16 << 20];
    app_writes(&a, &mut on_a, 0, 16 << 20, 21);
    sync_ok(&hosts, &["--pacing", "unpaced"], &va, &vb);
    app_writes(&a, &mut on_a, 2 << 20, 6 << 20, 22);
    sync_to_fault_point(&hosts, "RSV_SYNC_FAULT_EXIT_AFTER_FAR_RECORD", &va, &vb);
    a.kill();
    let p = sync_cmd_ok(&key, &["promote", &vb, "--json"]);
    assert_eq!(p["role"], "primary", "{p}");
    let mut on_b = volume_bytes(&b, tmp.path());
    assert!(on_b == on_a, "B holds A's last image");
    app_writes(&b, &mut on_b, 12 << 20, 1 << 20, 23);
    a.restart();
    sync_cmd_ok(&key, &["demote", &va, "--json"]);
    let (units, differ) = differing(&on_b, &volume_bytes(&a, tmp.path()));
    assert!(units > 0);
    let r = sync_cmd_ok(&key, &["resync", &vb, &va, "--json"]);
    let sent = r["data_bytes"].as_u64().unwrap() + r["zero_bytes"].as_u64().unwrap();
    println!(
        "resync after a loss between the records: {units} unit(s) of 64 KiB differed ({differ} bytes); sent {sent} bytes, {:.3}x",
        sent as f64 / differ as f64
    );
    assert_eq!(r["incremental"], true, "{r}");
    if let Some(at) = first_difference(&volume_bytes(&a, tmp.path()), &on_b) {
        panic!("A differs from B after the resync at byte {at}");
    }
    assert!(
        sent >= differ && sent * 10 <= differ * 11,
        "sent {sent} bytes for {differ} that differ"
    );
}

/// A far disk server SIGKILLed mid-cycle with 32 writes in flight (`rsv bench` 4 KiB
/// random writes at queue depth 32: concurrent first writes of units, their saves grouped
/// into shared syncs of the undo log), then started again: its start rolls the cycle back
/// and the LUN equals the image before the cycle byte for byte. A kill of the process
/// keeps the page cache, so this proves that every unit a write reached was logged whole
/// (a save lost from a group fails it); what a power loss does to unsynced records is the
/// model test's part (`backstore::undo`'s `concurrent_first_writes_roll_back_exactly_after_a_crash_at_any_step`).
#[test]
fn a_far_target_killed_with_writes_in_flight_rolls_its_cycle_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 111);
    let dir = tmp.path().join("far");
    let mut far = hosts.host(
        Some(&dir),
        "127.0.0.111",
        "[[target.lun]]\nid = 0\nstore = \"file:lun.img?size=32M\"\n",
    );
    let rsv_s = rsv();
    let rsv_s = rsv_s.to_str().unwrap();
    let image = tmp.path().join("image");
    random_file(&image, 32 << 20, 5);
    run_ok(rsv_s, &["cp", image.to_str().unwrap(), &far.url(0)]);
    let before = std::fs::read(&image).unwrap();

    let agent = replicate::wire::Client::new(
        far.control.clone(),
        replicate::auth::Key::from_file(&hosts.key).unwrap(),
    );
    let cycle = |what: &str, id: u64| -> replicate::api::CycleAnswer {
        let req = replicate::api::CycleRequest {
            iqn: IQN.into(),
            lun: 0,
            cycle: id,
            cut_ms: 0,
            epoch: 0,
        };
        testkit::rt()
            .block_on(agent.call("POST", &format!("/v1/cycle/{what}"), &req))
            .unwrap_or_else(|e| panic!("cycle {what}: {e:#}"))
    };
    assert_eq!(cycle("open", 42).open, Some(42));

    let url = far.url(0);
    let mut bench = Command::new(rsv_s)
        .args(["bench", &url, "--rw", "write", "--pattern", "rand"])
        .args([
            "--block-size",
            "4k",
            "--queue-depth",
            "32",
            "--duration",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once a quarter of the LUN's 512 units were saved, most of them still not.
    let t0 = Instant::now();
    let st = loop {
        let st = cycle("state", 0);
        if st.saved_units >= 128 {
            break st;
        }
        assert!(
            bench.try_wait().unwrap().is_none(),
            "rsv bench ended before the kill: {st:?}\n{}",
            far.log()
        );
        assert!(t0.elapsed() < Duration::from_secs(60), "no saves: {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    };
    far.kill();
    let in_flight = bench.try_wait().unwrap().is_none();
    let _ = bench.kill();
    bench.wait().unwrap();
    eprintln!(
        "killed with {} units saved in {} syncs of the log, writes still in flight: {in_flight}",
        st.saved_units, st.log_syncs
    );
    assert!(in_flight, "the writer was running at the kill");
    let medium = std::fs::read(dir.join("lun.img")).unwrap();
    assert!(
        medium != before,
        "the cycle changed nothing on the medium: the test proves nothing"
    );

    far.restart();
    let got = read_lun(&far.url(0), &tmp.path().join("after"));
    if let Some(at) = first_difference(&got, &before) {
        panic!(
            "the far LUN differs from the image before the cycle at byte {at} (unit {}) after its restart\n{}",
            at / (64 << 10),
            far.log()
        );
    }
    let st = cycle("state", 0);
    assert_eq!((st.open, st.rolled_back), (None, Some(42)), "{st:?}");
}

/// A session logged in ahead (`POST /v1/connect`: a coordinator asks it while the far
/// cycle opens, before the cut) is what the next send to the same destination with the
/// same session options writes on: the send says so, and the destination then equals
/// the source. One logged in with other options (another initiator name: another cycle's
/// streams) is not taken. Fails when the agent ignores what it logged in ahead, or hands
/// it to a send of other options.
#[test]
fn a_send_writes_on_the_session_logged_in_ahead_for_it() {
    let tmp = tempfile::tempdir().unwrap();
    let hosts = hosts(tmp.path(), 151);
    let dir = tmp.path().join("host");
    std::fs::create_dir_all(&dir).unwrap();
    const SIZE: usize = 4 << 20;
    random_file(&dir.join("src.img"), SIZE, 39);
    let host = hosts.host(
        Some(&dir),
        "127.0.0.151",
        "[[target.lun]]\nid = 0\nstore = \"file:src.img\"\n\
         [[target.lun]]\nid = 1\nstore = \"file:dst.img?size=4M\"\n",
    );
    let agent = replicate::wire::Client::new(
        host.control.clone(),
        replicate::auth::Key::from_file(&hosts.key).unwrap(),
    );
    let rt = testkit::rt();
    let connect = |session: Vec<(String, String)>| {
        let req = replicate::api::ConnectRequest {
            dest: host.url(1),
            session,
        };
        let _: serde_json::Value = rt
            .block_on(agent.call("POST", "/v1/connect", &req))
            .unwrap();
    };
    let send = || -> replicate::api::JobStatus {
        let req = replicate::api::SendRequest {
            iqn: IQN.into(),
            lun: 0,
            dest: host.url(1),
            unit: 1 << 20,
            what: replicate::api::What::All,
            skip_units: 0,
            pacing: None,
            session: Vec::new(),
            compress: Default::default(),
            cut: None,
            also: Vec::new(),
        };
        let started: replicate::api::SendStarted =
            rt.block_on(agent.call("POST", "/v1/send", &req)).unwrap();
        let t0 = Instant::now();
        loop {
            let st: replicate::api::JobStatus = rt
                .block_on(agent.call("GET", &format!("/v1/jobs/{}", started.job), &()))
                .unwrap();
            if !matches!(
                st.state,
                replicate::api::JobState::Connecting | replicate::api::JobState::Running
            ) {
                assert_eq!(st.state, replicate::api::JobState::Done, "{st:?}");
                assert_eq!(st.done_bytes, SIZE as u64, "{st:?}");
                return st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "never ended: {st:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let source = std::fs::read(dir.join("src.img")).unwrap();

    // Logged in ahead with the send's own options: the send takes that session.
    connect(Vec::new());
    let st = send();
    assert!(st.connected_ahead, "the send logged in again: {st:?}");
    let far = read_lun(&host.url(1), &tmp.path().join("dst-ahead"));
    assert!(far == source, "the destination differs from the source");

    // Logged in ahead as another writer: not this send's session.
    connect(vec![(
        "initiator_name".into(),
        "iqn.2026-01.org.reservoir:sync.39.cycle-0000000000000027".into(),
    )]);
    let st = send();
    assert!(
        !st.connected_ahead,
        "another writer's session was taken: {st:?}"
    );

    // Logins ahead without end: the agent keeps MAX_PARKED sessions (the other writer's
    // above among them), then refuses with a message that says so; a send still logs in
    // itself and carries the data (what a coordinator does when refused). Fails without
    // the cap: every login ahead is kept.
    let other = || {
        vec![(
            "initiator_name".into(),
            "iqn.2026-01.org.reservoir:sync.39.cycle-0000000000000028".into(),
        )]
    };
    for _ in 1..replicate::agent::MAX_PARKED {
        connect(other());
    }
    let req = replicate::api::ConnectRequest {
        dest: host.url(1),
        session: other(),
    };
    let refused = rt
        .block_on(agent.call::<serde_json::Value>("POST", "/v1/connect", &req))
        .expect_err("a login ahead past the cap was kept");
    assert!(
        format!("{refused:#}").contains("logged in ahead here already"),
        "{refused:#}"
    );
    let st = send();
    assert!(!st.connected_ahead, "{st:?}");
}
