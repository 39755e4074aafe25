//! Loads `rsv` into the running kernel and drives it on a loopback connection: selected by
//! TCP_CONGESTION, settings reach the socket, share pacing shows in TCP_INFO, the name goes
//! with the loader. Needs root (CI is root); skips with the reason otherwise. The start
//! rate's cwnd needs a path with a real RTT and is checked over the WAN emulator in the
//! workspace's `tests/cc_wan.rs`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rsv_cc::{load, Settings, NAME};

/// The name is one per host: the tests of this file take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn congestion(s: &impl AsRawFd) -> String {
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a writable buffer.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let b = &buf[..len as usize];
    String::from_utf8_lossy(&b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]).into()
}

/// (snd_cwnd, pacing_rate) from TCP_INFO.
fn info(s: &impl AsRawFd) -> (u32, u64) {
    let mut buf = [0u8; 232];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a writable buffer.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    (
        u32::from_ne_bytes(buf[80..84].try_into().unwrap()),
        u64::from_ne_bytes(buf[104..112].try_into().unwrap()),
    )
}

#[test]
fn rsv_is_selected_paces_a_share_and_goes_with_its_loader() {
    if !root() {
        eprintln!("SKIP: loading BPF needs root");
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = match load() {
        Ok(l) => l,
        Err(why) => panic!("rsv did not load: {why}"),
    };
    assert_eq!(loaded.name(), NAME);
    assert!(
        rsv_cc::available(),
        "rsv not in tcp_available_congestion_control"
    );

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n as u64,
            }
        }
        total
    });
    let mut s = TcpStream::connect(addr).unwrap();
    loaded.select(s.as_fd()).unwrap();
    assert_eq!(congestion(&s), NAME);

    // 4 MB/s: far below what loopback carries, so only the pacing can hold it there.
    let share = 4_000_000u64;
    let settings = Settings {
        share_rate: share,
        start_rate: share,
        no_probe_rtt: true,
        ..Settings::default()
    };
    loaded.set(s.as_fd(), settings).unwrap();
    assert_eq!(loaded.get(s.as_fd()).unwrap(), Some(settings));

    let chunk = vec![0x5au8; 64 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_millis(1500) {
        s.write_all(&chunk).unwrap();
        sent += chunk.len() as u64;
    }
    let (cwnd, pacing) = info(&s);
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "loopback: cwnd {cwnd}, tcpi_pacing_rate {pacing} B/s, {:.2} MB/s written over {secs:.2} s",
        sent as f64 / secs / 1e6
    );
    assert_eq!(pacing, share, "the socket's pacing rate is the share");
    // Paced, the connection carries about the share, not loopback's gigabytes a second
    // (writes end once the send buffer is full, so the written rate runs a buffer ahead).
    let rate = sent as f64 / secs;
    assert!(rate < share as f64 * 4.0, "{rate} B/s written: not paced");

    // Lifting the share hands the pacing back to BBR.
    loaded.set(s.as_fd(), Settings::default()).unwrap();
    let start = Instant::now();
    let mut pacing = share;
    while start.elapsed() < Duration::from_secs(3) && pacing == share {
        s.write_all(&chunk).unwrap();
        pacing = info(&s).1;
    }
    eprintln!(
        "share lifted: tcpi_pacing_rate {pacing} B/s after {:?}",
        start.elapsed()
    );
    assert_ne!(pacing, share, "BBR paces again once the share is lifted");
    drop(s);
    assert!(reader.join().unwrap() > 0);

    let held = loaded.registered_here();
    drop(loaded);
    if held {
        assert!(
            !rsv_cc::available(),
            "rsv still registered after its loader dropped"
        );
    } else {
        eprintln!("another process holds the name rsv: its removal is not checked here");
    }
}

#[test]
fn a_second_loader_shares_the_name_and_the_settings() {
    if !root() {
        eprintln!("SKIP: loading BPF needs root");
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let first = load().expect("first load");
    let second = load().expect("a second load must not fail when the name is taken");
    assert!(first.registered_here() || second.registered_here() || rsv_cc::available());
    assert!(!(first.registered_here() && second.registered_here()));
    assert!(
        second.shares_map(),
        "the second loader reuses the live settings map"
    );

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    second.select(s.as_fd()).unwrap();
    let settings = Settings {
        share_rate: 1_000_000,
        ..Settings::default()
    };
    second.set(s.as_fd(), settings).unwrap();
    // The same socket storage, whichever loader reads it.
    assert_eq!(first.get(s.as_fd()).unwrap(), Some(settings));

    // The holder goes; the other registers on its next select.
    let first_held = first.registered_here();
    drop(first);
    if first_held {
        let s2 = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        second.select(s2.as_fd()).unwrap();
        assert_eq!(congestion(&s2), NAME);
        assert!(second.registered_here());
    }
}

/// Run as a child by [`loaders_that_start_together_all_reach_the_registered_program`]:
/// loads, says what it got, and holds it a moment so that the others load while it does.
#[test]
fn child_loader() {
    if std::env::var_os("RSV_CC_LOAD_CHILD").is_none() {
        return;
    }
    match load() {
        Ok(l) => {
            println!(
                "LOADED registered={} shared={}",
                l.registered_here(),
                l.shares_map()
            );
            std::thread::sleep(Duration::from_millis(1500));
        }
        Err(e) => println!("FAILED {e}"),
    }
}

/// Processes that load at the same moment (the R2 lab starts sixteen agents at once) take
/// turns: each one either holds the name or writes into the map of the program that does.
/// Before they took turns, all but one loaded a map of their own that no registered
/// program read, and their sockets' settings were lost.
#[test]
fn loaders_that_start_together_all_reach_the_registered_program() {
    if !root() {
        eprintln!("SKIP: loading BPF needs root");
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..6)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_loader", "--nocapture", "--test-threads=1"])
                .env("RSV_CC_LOAD_CHILD", "1")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut registered = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // The harness may print its "test child_loader ... " before the child's line.
        let line = text
            .lines()
            .find_map(|l| {
                l.find("LOADED")
                    .or_else(|| l.find("FAILED"))
                    .map(|at| &l[at..])
            })
            .unwrap_or_else(|| panic!("a child said nothing: {text}"));
        assert!(line.starts_with("LOADED"), "{line}");
        let held = line.contains("registered=true");
        let shared = line.contains("shared=true");
        assert!(
            held || shared,
            "a loader neither holds the name nor shares the holder's map: {line}"
        );
        registered += usize::from(held);
    }
    assert!(registered <= 1, "the name is one per host");
}
