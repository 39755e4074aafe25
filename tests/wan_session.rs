//! A copy across an emulated long path (`rsv-lab wan`): auto-tuning sizes the session for an
//! assumed 1 Gbit/s, measures the real rate, cuts the queue back while commands are in
//! flight, and the copy still arrives whole (`rsv cp --verify`). Needs root; elsewhere it
//! prints SKIP. Never asserts a speed.

use std::process::Stdio;
use std::time::Duration;

use testkit::wan::WanLink;
use testkit::{random_file, rsv_in, run_json, wait_for};

#[test]
fn long_path_copy_cuts_its_queue_back_and_arrives_whole() {
    // 20 ms and 60 Mbit/s: a long path (auto-tuning's two connections, bursts, queue
    // sized for 1 Gbit/s, that is 32 commands of 1 MiB) whose rate needs about six.
    let Some(mut lab) = WanLink::up("tqs", "20ms", "60mbit") else {
        return;
    };
    let addr = lab.addr.clone();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    lab.target = Some(
        rsv_in(&lab.ns_b())
            .args(["target", "--listen", &format!("{addr}:3260"), "--data-dir"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("iscsi://{addr}/iqn.2026-11.org.reservoir:target0/0");
    wait_for("the target answering", Duration::from_secs(10), || {
        let o = rsv_in(&lab.ns_a()).args(["inq", &url]).output().unwrap();
        o.status.success().then_some(())
    });

    // 96 MiB of random data: about 14 s at this rate, then as long to verify; the queue is
    // cut after 8 s of measuring.
    let src = dir.path().join("src.img");
    random_file(&src, 96 << 20, 0x9e37_79b9_7f4a_7c15);
    let summary = run_json(
        rsv_in(&lab.ns_a())
            .arg("cp")
            .arg(&src)
            .args([&url, "--verify", "--json"]),
    );
    assert_eq!(summary["complete"], true, "{summary}");
    assert_eq!(summary["verified"], true, "{summary}");
    let session = &summary["sessions"][0];
    let planned = session["tuning"]["queue_depth"].as_u64().unwrap();
    let at_end = session["queue_depth"].as_u64().unwrap();
    assert!(
        at_end < planned,
        "queue depth {planned} planned, {at_end} at the end: never cut back ({session})"
    );
}
