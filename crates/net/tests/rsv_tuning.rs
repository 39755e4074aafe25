//! Socket tuning with `congestion = "rsv"`: `net::apply` loads Reservoir's congestion
//! control once for the process and selects it, and every pacing rate set through
//! `net::set_pacing_rate` (the path of `--rate`, the rate control and `rsv sync`'s
//! `Session::set_pacing_rate`) becomes the socket's rsv share and start rate; lifting the
//! pacing lifts them. Needs root; skips with the reason otherwise.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;

#[test]
fn pacing_through_net_reaches_the_rsv_settings() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: loading BPF needs root");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let rate = 3_000_000u64;
    let applied = net::apply(
        s.as_fd(),
        &net::SocketTuning {
            congestion: Some("rsv".into()),
            pacing_rate: Some(rate),
            ..Default::default()
        },
    );
    let loaded = net::cc::current().unwrap_or_else(|| {
        panic!(
            "rsv not loaded: {:?}",
            net::cc::status().why_not.unwrap_or_default()
        )
    });
    assert_eq!(applied.congestion.as_deref(), Some("rsv"), "{applied:?}");
    assert!(net::cc::status().loaded);
    let got = loaded
        .get(s.as_fd())
        .unwrap()
        .expect("settings on the socket");
    assert_eq!(
        (got.share_rate, got.start_rate, got.no_probe_rtt),
        (rate, rate, true)
    );

    net::set_pacing_rate(s.as_fd(), 2 * rate).unwrap();
    assert_eq!(loaded.get(s.as_fd()).unwrap().unwrap().share_rate, 2 * rate);

    net::set_pacing_rate(s.as_fd(), u64::MAX).unwrap();
    let lifted = loaded.get(s.as_fd()).unwrap().unwrap();
    assert_eq!(
        (lifted.share_rate, lifted.start_rate, lifted.no_probe_rtt),
        (0, 0, false)
    );

    // A remembered rate is a start only: no share, PROBE_RTT as BBR has it.
    let started = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let applied = net::apply(
        started.as_fd(),
        &net::SocketTuning {
            congestion: Some("rsv".into()),
            start_rate: Some(rate),
            rsv_group: Some(42),
            ..Default::default()
        },
    );
    assert_eq!(applied.congestion.as_deref(), Some("rsv"), "{applied:?}");
    let got = loaded.get(started.as_fd()).unwrap().expect("settings");
    assert_eq!(
        (got.share_rate, got.start_rate, got.no_probe_rtt, got.group),
        (0, rate, false, 42)
    );
    assert_eq!(net::max_pacing_rate(started.as_fd()).unwrap(), u64::MAX);
    assert_eq!(got.probe_rate, 0, "a remembered start is not probed");

    // The unknown path's start: the first round sent at the probe rate.
    let probed = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    net::apply(
        probed.as_fd(),
        &net::SocketTuning {
            congestion: Some("rsv".into()),
            start_rate: Some(rate),
            probe_rate: Some(50 * rate),
            ..Default::default()
        },
    );
    let got = loaded.get(probed.as_fd()).unwrap().expect("settings");
    assert_eq!(
        (got.share_rate, got.start_rate, got.probe_rate),
        (0, rate, 50 * rate)
    );

    // A socket on another congestion control is left alone.
    assert!(!net::start_rsv_at(other_cubic(&listener).as_fd(), rate));
    let other = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    net::set_congestion(other.as_fd(), "cubic").unwrap();
    net::set_pacing_rate(other.as_fd(), rate).unwrap();
    assert_eq!(loaded.get(other.as_fd()).unwrap(), None);
}

fn other_cubic(listener: &TcpListener) -> TcpStream {
    let s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    net::set_congestion(s.as_fd(), "cubic").unwrap();
    s
}
