//! Helpers for the end-to-end tests: real links made by the `rsv-wan` binary.
#![allow(dead_code)]

use std::net::{Ipv4Addr, UdpSocket};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wan::control::LinkStats;
use wan::link::LinkInfo;

pub const EXE: &str = env!("CARGO_BIN_EXE_rsv-wan");

/// The tests measure rates and times on a small machine: one link at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether links can be built here; prints why not.
pub fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP {test}: needs root for network namespaces and TUN");
        return false;
    }
    let ip_ok = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ip_ok || !std::path::Path::new("/dev/net/tun").exists() {
        println!("SKIP {test}: `ip netns` or /dev/net/tun unavailable");
        return false;
    }
    true
}

pub fn wan(args: &[&str]) -> Output {
    let out = Command::new(EXE)
        .arg("wan")
        .args(args)
        .output()
        .expect("running rsv-wan");
    assert!(
        out.status.success(),
        "rsv-wan wan {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A link that is torn down when dropped, even when the test fails.
pub struct Link {
    pub info: LinkInfo,
    children: Vec<Child>,
}

impl Link {
    pub fn up(name: &str, params: &[&str]) -> Link {
        let _ = Command::new(EXE)
            .args(["wan", "down", "--name", name])
            .output();
        let mut args = vec!["up", "--name", name, "--json"];
        args.extend_from_slice(params);
        let out = wan(&args);
        let info: LinkInfo = serde_json::from_slice(&out.stdout).expect("up --json output");
        Link {
            info,
            children: vec![],
        }
    }

    pub fn name(&self) -> &str {
        &self.info.name
    }

    pub fn set(&self, params: &[&str]) {
        let mut args = vec!["set", "--name", self.name()];
        args.extend_from_slice(params);
        wan(&args);
    }

    pub fn stats(&self) -> LinkStats {
        let out = wan(&["stats", "--name", self.name(), "--json"]);
        serde_json::from_slice(&out.stdout).expect("stats --json output")
    }

    /// Runs a command in a namespace; the link kills it when dropped.
    pub fn spawn_in(&mut self, ns: &str, cmd: &[&str]) {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning in namespace");
        self.children.push(child);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new(EXE)
            .args(["wan", "down", "--name", &self.info.name])
            .output();
    }
}

pub fn run_in(ns: &str, cmd: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?} in {ns}: {e}"))
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Average ping RTT in ms, from `count` pings.
pub fn ping_avg_ms(ns: &str, to: Ipv4Addr, count: u32, interval: &str) -> (u32, f64) {
    let out = run_in(
        ns,
        &[
            "ping",
            "-n",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            interval,
            &to.to_string(),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let received = text
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(" transmitted, ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0);
    let avg = text
        .lines()
        .find_map(|l| {
            let (_, vals) = l.split_once(" = ")?;
            vals.split('/').nth(1)?.parse().ok()
        })
        .unwrap_or(f64::NAN);
    (received, avg)
}

/// A bound UDP socket inside a namespace.
pub fn udp_in(ns: &str, addr: Ipv4Addr) -> UdpSocket {
    wan::sys::in_netns(ns, move || Ok(UdpSocket::bind((addr, 0))?)).expect("udp socket in netns")
}

/// Sends `n` datagrams from `from` to `to`, paced, and counts how many arrive.
pub fn udp_count(link: &Link, n: u32, gap: Duration) -> u32 {
    let a = &link.info.a;
    let b = &link.info.b;
    let tx = udp_in(&a.netns, a.addr);
    let rx = udp_in(&b.netns, b.addr);
    let port = rx.local_addr().unwrap().port();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let to = b.addr;
    let receiver = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut got = 0u32;
        while let Ok((len, _)) = rx.recv_from(&mut buf) {
            if len == 200 && buf[0] == 0xA5 {
                got += 1;
            }
        }
        got
    });
    let payload = [0xA5u8; 200];
    let start = Instant::now();
    for i in 0..n {
        tx.send_to(&payload, (to, port)).unwrap();
        let next = start + gap * (i + 1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    receiver.join().unwrap()
}

/// Starts an iperf3 server in site B and runs a client from site A; returns the receiver's
/// goodput in bit/s over `seconds`, after `omit` seconds of start-up left out.
pub fn iperf3_tcp(link: &mut Link, cc: &str, seconds: u32, omit: u32) -> f64 {
    assert!(
        have("iperf3"),
        "iperf3 is required: apt-get install -y iperf3"
    );
    let b_ns = link.info.b.netns.clone();
    let b_addr = link.info.b.addr.to_string();
    link.spawn_in(&b_ns, &["iperf3", "-s", "-p", "5201", "-B", &b_addr]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = run_in(
            &link.info.a.netns,
            &[
                "iperf3",
                "-c",
                &b_addr,
                "-p",
                "5201",
                "-t",
                &seconds.to_string(),
                "-O",
                &omit.to_string(),
                "-C",
                cc,
                "-J",
            ],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(bps) = v["end"]["sum_received"]["bits_per_second"].as_f64() {
            return bps;
        }
        let err = v["error"].as_str().unwrap_or("no JSON").to_string();
        assert!(
            err.contains("refused") && Instant::now() < deadline,
            "iperf3 failed: {err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
