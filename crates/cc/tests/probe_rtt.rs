//! PROBE_RTT by group, in the running kernel: connections of one group sending for more
//! than BBR's 10-s min-RTT window never hold PROBE_RTT two at once, and skip or defer their
//! probes; an ungrouped connection beside them probes as BBR does. Read from the program's
//! own counters (the `rsv_groups` and `rsv_state` maps), not from timing.
//!
//! The path is loopback in a network namespace of the test's own (unshared by one thread,
//! whose sockets stay in it), limited to 40 Mbit/s by a token bucket (`tbf`, which every
//! kernel config here has; netem is not built on the CI host) so that the connections share
//! a queue, as a session's do at a WAN bottleneck: their minimum RTT is taken while it is
//! still empty, and comes due for all of them together ten seconds later. Needs root (CI is
//! root) and `ip` and `tc` (iproute2); skips with the reason otherwise.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rsv_cc::{load, new_group, Settings};

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Loopback in a new network namespace, rate-limited; the listener and the
/// client sockets are made in it (sockets keep their namespace whichever thread uses
/// them). Runs on a thread of its own, which the namespace stays with.
fn limited_loopback(n: usize) -> Result<(TcpListener, Vec<TcpStream>), String> {
    std::thread::spawn(move || {
        // SAFETY: unshare affects this thread only (a new network namespace for it).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(format!("unshare: {}", std::io::Error::last_os_error()));
        }
        // Children forked from this thread run in its namespace.
        run(&["ip", "link", "set", "lo", "mtu", "1500", "up"])?;
        run(&[
            "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "40mbit", "burst", "16k",
            "limit", "300k",
        ])?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let clients = (0..n)
            .map(|_| TcpStream::connect(addr).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((listener, clients))
    })
    .join()
    .unwrap()
}

#[test]
fn a_group_probes_one_at_a_time_and_an_ungrouped_connection_still_probes() {
    if !root() {
        eprintln!("SKIP: loading BPF needs root");
        return;
    }
    let loaded = match load() {
        Ok(l) => l,
        Err(why) => panic!("rsv did not load: {why}"),
    };
    if !loaded.registered_here() && !loaded.shares_map() {
        eprintln!(
            "SKIP: another build's rsv (another map layout) holds the name; this one's \
             settings would not reach it"
        );
        return;
    }
    let (listener, clients) = match limited_loopback(5) {
        Ok(x) => x,
        Err(why) => {
            eprintln!("SKIP: no rate-limited loopback: {why}");
            return;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..clients.len())
        .map(|_| {
            let (mut s, _) = listener.accept().unwrap();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 256 * 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                }
            })
        })
        .collect();

    // Four connections of one session, and one without a group.
    let group = new_group();
    for (i, c) in clients.iter().enumerate() {
        loaded.select(c.as_fd()).unwrap();
        let settings = Settings {
            group: if i < 4 { group } else { 0 },
            ..Settings::default()
        };
        loaded.set(c.as_fd(), settings).unwrap();
    }
    let writers: Vec<_> = clients
        .iter()
        .map(|c| {
            let mut c = c.try_clone().unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let chunk = vec![0x5au8; 64 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    if c.write_all(&chunk).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();

    // BBR's window is 10 s: the members come due together after about ten seconds. The
    // run ends when what is checked has happened, or after 22 s.
    let start = Instant::now();
    let mut counts = None;
    let mut lone = None;
    while start.elapsed() < Duration::from_secs(22) {
        std::thread::sleep(Duration::from_millis(200));
        counts = loaded.group_counts(group).unwrap();
        lone = loaded.socket_counts(clients[4].as_fd()).unwrap();
        let g = counts.unwrap_or_default();
        let done = g.skipped + g.deferred > 0
            && lone.is_some_and(|l| l.probes > 0)
            && start.elapsed() > Duration::from_secs(12);
        if done {
            break;
        }
    }
    let per_socket: Vec<_> = clients
        .iter()
        .map(|c| loaded.socket_counts(c.as_fd()).unwrap().unwrap_or_default())
        .collect();
    eprintln!(
        "after {:.1} s: group {counts:?}; sockets {per_socket:?}",
        start.elapsed().as_secs_f64()
    );
    stop.store(true, Ordering::Relaxed);
    for c in &clients {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
    for w in writers {
        w.join().unwrap();
    }

    let g = counts.expect("the group's entry exists while its members run rsv");
    assert_eq!(g.members, 4, "four members joined");
    assert!(
        g.max_probing <= 1,
        "{} members of the group were in PROBE_RTT at once",
        g.max_probing
    );
    assert!(
        g.skipped + g.deferred > 0,
        "no probe of the group was skipped or deferred: {g:?}"
    );
    // The group's counters are the sum of its members'.
    let members = &per_socket[..4];
    assert!(members.iter().all(|s| s.group == group));
    assert_eq!(g.probes, members.iter().map(|s| s.probes).sum::<u64>());
    assert_eq!(g.skipped, members.iter().map(|s| s.skipped).sum::<u64>());
    let lone = lone.expect("rsv keeps state for the ungrouped socket");
    assert_eq!(lone.group, 0);
    assert!(
        lone.probes > 0,
        "the ungrouped connection never entered PROBE_RTT: {lone:?}"
    );
    assert_eq!(lone.skipped + lone.deferred, 0);

    // The entry goes with the last member.
    drop(clients);
    for r in readers {
        r.join().unwrap();
    }
    let gone = Instant::now();
    while loaded.group_counts(group).unwrap().is_some() && gone.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        loaded.group_counts(group).unwrap(),
        None,
        "the group's entry outlived its members"
    );
}
