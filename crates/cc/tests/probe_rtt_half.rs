//! PROBE_RTT on a long path, in the running kernel: a session's lone connection (a group of
//! one) whose own ACKs show the minimum RTT skips PROBE_RTT; a connection without a group
//! still probes, holding half a BDP in flight instead of BBRv1's four packets. Read from the
//! program's counters and the socket's TCP_INFO (its window sampled through the probe),
//! not from timing.
//!
//! The path is the lab's emulated link (`rsv-lab wan`, built beside this test by `cargo
//! build --workspace`, or `$RSV_LAB`): 100 ms, 40 Mbit/s, a one-BDP queue (500 KB, half a
//! BDP some 170 packets). The two connections send one after the other, each alone on it,
//! for a little longer than BBR's 10-s min-RTT window. Needs root and a `bpf` build; skips
//! without `rsv-lab` (fails when `RESERVOIR_TEST_STRICT` or `CI` is set) or when another
//! process's program holds the name.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rsv_cc::{load, new_group, Loaded, Settings, SocketCounts};

const LINK: &str = "ccprth";

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn strict() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("RESERVOIR_TEST_STRICT").is_some()
}

/// `$RSV_LAB`, else `rsv-lab` beside this test's binary (`target/<profile>/deps/…`).
fn rsv_lab() -> Option<PathBuf> {
    if let Some(lab) = std::env::var_os("RSV_LAB") {
        return Some(PathBuf::from(lab));
    }
    let exe = std::env::current_exe().ok()?;
    let lab = exe.parent()?.parent()?.join("rsv-lab");
    lab.exists().then_some(lab)
}

/// The emulated link, taken down however the test ends.
struct Link {
    lab: PathBuf,
    a_ns: String,
    b_ns: String,
    b_addr: String,
}

impl Link {
    fn up(lab: PathBuf) -> Link {
        let _ = Command::new(&lab)
            .args(["wan", "down", "--name", LINK])
            .output();
        let out = Command::new(&lab)
            .args([
                "wan", "up", "--name", LINK, "--rtt", "100ms", "--rate", "40mbit", "--json",
            ])
            .output()
            .expect("rsv-lab wan up");
        assert!(
            out.status.success(),
            "rsv-lab wan up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("rsv-lab wan up --json");
        let s = |side: &str, key: &str| {
            v[side][key]
                .as_str()
                .unwrap_or_else(|| panic!("wan up: no {side}.{key} in {v}"))
                .to_owned()
        };
        Link {
            lab,
            a_ns: s("a", "netns"),
            b_ns: s("b", "netns"),
            b_addr: s("b", "addr"),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new(&self.lab)
            .args(["wan", "down", "--name", LINK])
            .output();
    }
}

/// Runs `f` on a thread that has entered network namespace `ns`; sockets made there stay
/// in it whichever thread uses them.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: a namespace fd; setns affects this thread only.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// The socket's cwnd (struct tcp_info's tcpi_snd_cwnd, include/uapi/linux/tcp.h).
fn cwnd(s: &TcpStream) -> u32 {
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a writable buffer; the kernel writes at most len bytes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    u32::from_ne_bytes(buf[80..84].try_into().unwrap())
}

/// What a connection did: its program counters at the end, and the smallest cwnd seen
/// while it was in PROBE_RTT (None: never seen there).
struct Outcome {
    counts: SocketCounts,
    probe_cwnd: Option<u32>,
}

/// Connects from side a with `settings`, sends until `done` says so (or 16 s), and closes.
fn send(
    loaded: &'static Loaded,
    link: &Link,
    listener: &TcpListener,
    settings: Settings,
    done: fn(&SocketCounts, Duration) -> bool,
) -> Outcome {
    let addr = listener.local_addr().unwrap();
    let c = in_ns(&link.a_ns, move || TcpStream::connect(addr).unwrap());
    let (mut server, _) = listener.accept().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        while let Ok(n) = server.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    loaded.select(c.as_fd()).unwrap();
    loaded.set(c.as_fd(), settings).unwrap();
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![0x5au8; 64 * 1024];
        while w.write_all(&chunk).is_ok() {}
    });
    let start = Instant::now();
    let mut probe_cwnd: Option<u32> = None;
    let mut counts = SocketCounts::default();
    while start.elapsed() < Duration::from_secs(16) {
        std::thread::sleep(Duration::from_millis(5));
        counts = loaded.socket_counts(c.as_fd()).unwrap().unwrap_or_default();
        if counts.probing {
            let w = cwnd(&c);
            probe_cwnd = Some(probe_cwnd.map_or(w, |p| p.min(w)));
        }
        if done(&counts, start.elapsed()) {
            break;
        }
    }
    let _ = c.shutdown(std::net::Shutdown::Both);
    writer.join().unwrap();
    reader.join().unwrap();
    eprintln!(
        "{settings:?}: after {:.1} s {counts:?}, smallest cwnd in PROBE_RTT {probe_cwnd:?}",
        start.elapsed().as_secs_f64()
    );
    Outcome { counts, probe_cwnd }
}

#[test]
fn a_lone_connection_skips_probe_rtt_on_its_own_samples_and_a_probe_holds_half_a_bdp() {
    if !root() {
        eprintln!("SKIP: loading BPF needs root");
        return;
    }
    let loaded: &'static Loaded = match load() {
        Ok(l) => Box::leak(Box::new(l)),
        Err(why) => panic!("rsv did not load: {why}"),
    };
    // Another process's program would run, its counters in a map of its own when its build
    // has another layout: what is checked here is this build's.
    if !loaded.registered_here() {
        eprintln!("SKIP: another process's {} holds the name", loaded.name());
        return;
    }
    let Some(lab) = rsv_lab() else {
        assert!(
            !strict(),
            "no rsv-lab beside the test (build the workspace, or set RSV_LAB)"
        );
        eprintln!("SKIP: no rsv-lab beside the test (RSV_LAB names one)");
        return;
    };
    let link = Link::up(lab);
    let b_addr = link.b_addr.clone();
    let listener = in_ns(&link.b_ns, move || {
        TcpListener::bind(format!("{b_addr}:0")).unwrap()
    });

    // A session's one connection: its group has no other member, so only its own samples
    // can keep the minimum fresh. BBR would probe about 10 s after its first samples.
    let lone = send(
        loaded,
        &link,
        &listener,
        Settings {
            group: new_group(),
            ..Settings::default()
        },
        |c, t| t > Duration::from_secs(12) || c.probes > 0,
    );
    assert!(
        lone.counts.skipped > 0 && lone.counts.probes == 0,
        "the lone member did not skip PROBE_RTT on its own samples: {:?}",
        lone.counts
    );

    // Without a group BBR's own PROBE_RTT runs, held at half a BDP.
    let ungrouped = send(loaded, &link, &listener, Settings::default(), |c, _| {
        c.probes > 0 && !c.probing
    });
    assert!(
        ungrouped.counts.probes > 0,
        "the ungrouped connection never entered PROBE_RTT: {:?}",
        ungrouped.counts
    );
    assert!(
        ungrouped.counts.half_bdp_holds > 0,
        "its PROBE_RTT was not held at half a BDP: {:?}",
        ungrouped.counts
    );
    // Half of 500 KB is some 170 packets; BBRv1 would show 4. The floor here leaves room
    // for a bandwidth estimate far below the link's.
    let w = ungrouped.probe_cwnd.expect("cwnd sampled in PROBE_RTT");
    assert!(w >= 32, "cwnd fell to {w} packets in PROBE_RTT");
}
