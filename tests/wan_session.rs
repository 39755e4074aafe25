//! A copy across an emulated long path (`rsv-lab wan`): auto-tuning sizes the session for an
//! assumed 1 Gbit/s, measures the real rate, cuts the queue back while commands are in
//! flight, and the copy still arrives whole (`rsv cp --verify`). Needs root; elsewhere it
//! prints SKIP. Never asserts a speed.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{rsv, rsv_lab};

/// The link and the target in it, taken down however the test ends.
struct Lab {
    name: &'static str,
    /// `rsv-lab`, whose `wan` brings the link up and down.
    bench: PathBuf,
    target: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut t) = self.target.take() {
            let _ = t.kill();
            let _ = t.wait();
        }
        let _ = Command::new(&self.bench)
            .args(["wan", "down", "--name", self.name])
            .output();
    }
}

/// `rsv` in one of the link's namespaces.
fn rsv_in(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(rsv());
    c
}

/// Runs `cmd`, which must succeed, and parses what it printed as JSON.
fn run_json(cmd: &mut Command) -> serde_json::Value {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn long_path_copy_cuts_its_queue_back_and_arrives_whole() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("RESERVOIR_TEST_STRICT").is_none(),
            "needs root"
        );
        eprintln!("SKIP wan_session: needs root");
        return;
    }
    let Some(bench) = rsv_lab() else { return };
    let mut lab = Lab {
        name: "tqs",
        bench,
        target: None,
    };
    let _ = Command::new(&lab.bench)
        .args(["wan", "down", "--name", lab.name])
        .output();
    // 20 ms and 60 Mbit/s: a long path (auto-tuning's two connections, bursts, queue
    // sized for 1 Gbit/s, that is 32 commands of 1 MiB) whose rate needs about six.
    let link = run_json(Command::new(&lab.bench).args([
        "wan", "up", "--name", lab.name, "--rtt", "20ms", "--rate", "60mbit", "--json",
    ]));
    let addr = link["b"]["addr"].as_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    lab.target = Some(
        rsv_in(&format!("{}-b", lab.name))
            .args(["target", "--listen", &format!("{addr}:3260"), "--data-dir"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("iscsi://{addr}/iqn.2026-11.org.reservoir:target0/0");
    let ready = Instant::now() + Duration::from_secs(10);
    loop {
        let o = rsv_in(&format!("{}-a", lab.name))
            .args(["inq", &url])
            .output()
            .unwrap();
        if o.status.success() {
            break;
        }
        assert!(Instant::now() < ready, "the target never answered");
        std::thread::sleep(Duration::from_millis(200));
    }

    // 96 MiB of random data: about 14 s at this rate, then as long to verify; the queue is
    // cut after 8 s of measuring.
    let src = dir.path().join("src.img");
    let mut bytes = vec![0u8; 96 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&src, &bytes).unwrap();
    let summary = run_json(
        rsv_in(&format!("{}-a", lab.name))
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
