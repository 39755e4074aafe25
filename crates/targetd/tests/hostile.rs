//! Hostile input against a running target while another session does verified I/O: every
//! opcode with corrupt lengths, AHS, flags, sequence numbers and tags; malformed requests
//! at each login stage; endless text continuations; oversized negotiated values; floods of
//! half-open and slow connections. The target must not panic, must answer as RFC 7143
//! has it (Reject, a login status, or closing that one connection), must free what each
//! connection held (file descriptors back to where they were), and the verified session
//! must see every write read back and no error.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iscsi::pdu::*;
use testkit::raw::*;

/// A target whose half-open connections go after a second.
fn target() -> SocketAddr {
    start("login_timeout = 1")
}

/// Connections the target at `addr` holds open (its end ESTABLISHED or CLOSE_WAIT, the
/// latter a peer's close it has not noticed), from /proc/net/tcp: tests run in parallel in
/// this process, so counting the process's descriptors would count theirs too.
fn held(addr: SocketAddr) -> usize {
    let port = format!(":{:04X}", addr.port());
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    t.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&port) && matches!(f[3], "01" | "08")
        })
        .count()
}

/// Waits up to 5 s for the target to hold no connection; returns how many it still holds.
fn drained(addr: SocketAddr) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while held(addr) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    held(addr)
}

/// A session that writes a stamped block run and reads it back, over and over, until
/// told to stop; any error panics its thread. Returns the rounds done.
struct Verified {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU32>,
    thread: JoinHandle<()>,
}

impl Verified {
    fn start(addr: SocketAddr) -> Verified {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU32::new(0));
        let mut c = Raw::login(addr, [0x80, 0, 0, 0, 0xaa, 1], 0, 1, 1, prefs());
        clear_ua(&mut c, 1);
        let thread = std::thread::spawn({
            let (stop, rounds) = (stop.clone(), rounds.clone());
            move || {
                let mut itt = 0x1000;
                let mut n: u32 = 0;
                while !stop.load(Ordering::Acquire) {
                    let lba = (n % 64) * 16;
                    let data: Vec<u8> = (0..16 * 512)
                        .map(|i| (i as u32 ^ n.wrapping_mul(2654435761)) as u8)
                        .collect();
                    write_at(&mut c, itt, lba, &data);
                    let back = read_at(&mut c, itt + 1, lba, 16);
                    assert!(back == data, "round {n}: the data read back differs");
                    itt += 2;
                    n += 1;
                    rounds.store(n, Ordering::Release);
                }
            }
        });
        Verified {
            stop,
            rounds,
            thread,
        }
    }

    /// Stops it; panics if it failed. Returns the rounds it did.
    fn finish(self) -> u32 {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .expect("the verified session saw an error");
        self.rounds.load(Ordering::Acquire)
    }
}

/// What the target did with a PDU: what it sent back before going quiet, and whether it
/// closed the connection.
#[derive(Debug, Default)]
struct Answer {
    pdus: Vec<Pdu>,
    closed: bool,
}

/// Reads what comes back within `wait`.
fn answer(c: &mut Raw, wait: Duration) -> Answer {
    c.s.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
        .unwrap();
    let mut a = Answer::default();
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match c.dec.decode(&mut c.buf) {
            Ok(Some(p)) => {
                a.pdus.push(p);
                continue;
            }
            Ok(None) => {}
            Err(e) => panic!("the target sent a malformed PDU: {e}"),
        }
        let mut tmp = [0u8; 65536];
        match c.s.read(&mut tmp) {
            Ok(0) => {
                a.closed = true;
                break;
            }
            Ok(n) => c.buf.extend_from_slice(&tmp[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                break
            }
            Err(_) => {
                a.closed = true;
                break;
            }
        }
    }
    a
}

/// The ways a BHS is spoiled, each applied to every opcode.
const MUTATIONS: &[&str] = &[
    "data segment length beyond any limit",
    "AHS of 1020 garbage bytes",
    "every flag bit set",
    "CmdSN half the number space away",
    "ExpStatSN and tags all ones",
    "odd data segment length, padding of garbage",
    "every byte but the opcode all ones",
    "data segment length larger than what follows, then silence",
];

fn spoiled(c: &Raw, opcode: u8, m: usize, itt: u32) -> Vec<u8> {
    let mut b = vec![0u8; BHS_LEN];
    b[0] = 0x40 | opcode; // immediate, as most hostile input would be
    b[1] = 0x80;
    b[16..20].copy_from_slice(&itt.to_be_bytes());
    b[20..24].copy_from_slice(&0xffff_ffffu32.to_be_bytes());
    b[24..28].copy_from_slice(&c.cmdsn.to_be_bytes());
    b[28..32].copy_from_slice(&c.statsn.to_be_bytes());
    let mut tail = Vec::new();
    match m {
        0 => b[5..8].copy_from_slice(&[0xff, 0xff, 0xff]),
        1 => {
            b[4] = 255;
            tail = vec![0xa5; 1020];
        }
        2 => {
            b[1] = 0xff;
            b[2] = 0xff;
            b[3] = 0xff;
        }
        3 => b[24..28].copy_from_slice(&c.cmdsn.wrapping_add(1 << 31).to_be_bytes()),
        4 => b[8..48].fill(0xff),
        5 => {
            b[7] = 3;
            tail = vec![1, 2, 3, 0xee];
        }
        6 => b[1..].fill(0xff),
        _ => {
            b[6] = 0x10; // 4096 bytes announced, 100 sent
            tail = vec![0x5a; 100];
        }
    }
    b.extend(tail);
    b
}

#[test]
fn every_opcode_spoiled_every_way_leaves_the_verified_session_alone() {
    let addr = target();
    let verified = Verified::start(addr);
    let (rejects, closes, quiet) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
    std::thread::scope(|s| {
        for (m, what) in MUTATIONS.iter().enumerate() {
            let (rejects, closes, quiet) = (&rejects, &closes, &quiet);
            s.spawn(move || {
                let isid = |n: u8| [0x80, 0, 0, m as u8, n, 2];
                let mut c = Raw::login(addr, isid(0), 0, 1, 1, prefs());
                let mut logins = 1;
                for opcode in 0..0x40u8 {
                    let bytes = spoiled(&c, opcode, m, 0x7000 + opcode as u32);
                    c.send_bytes(&bytes);
                    let a = answer(&mut c, Duration::from_millis(60));
                    for p in &a.pdus {
                        // Anything but these would be the target taking the garbage as a
                        // command and acting on it.
                        assert!(
                            matches!(
                                p,
                                Pdu::Reject(_)
                                    | Pdu::NopIn(_)
                                    | Pdu::ScsiResponse(_)
                                    | Pdu::TextResponse(_)
                                    | Pdu::LogoutResponse(_)
                                    | Pdu::TaskMgmtResponse(_)
                                    | Pdu::R2t(_)
                                    | Pdu::DataIn(_)
                                    | Pdu::AsyncMessage(_)
                            ),
                            "{what}: opcode {opcode:#04x}: {p:?}"
                        );
                        if matches!(p, Pdu::Reject(_)) {
                            rejects.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if a.closed {
                        closes.fetch_add(1, Ordering::Relaxed);
                    } else if a.pdus.is_empty() {
                        quiet.fetch_add(1, Ordering::Relaxed);
                    }
                    // Whatever state the connection is in now, start afresh.
                    c = Raw::login(addr, isid(logins), 0, 1, 1, prefs());
                    logins = logins.wrapping_add(1);
                }
            });
        }
    });
    let rounds = verified.finish();
    println!(
        "{} spoiled PDUs: {} Rejects, {} connections closed, {} answered nothing; \
         verified session: {rounds} write+read rounds",
        MUTATIONS.len() * 64,
        rejects.load(Ordering::Relaxed),
        closes.load(Ordering::Relaxed),
        quiet.load(Ordering::Relaxed)
    );
    assert!(rounds > 0);
    assert!(
        rejects.load(Ordering::Relaxed) > 64,
        "Reject is the usual answer"
    );
    // Every connection is gone from the target's side too: it let go of its sockets.
    assert_eq!(drained(addr), 0, "connections the target still holds");
}

/// A login request as the test wants it, sent raw.
fn login_pdu(csg: u8, nsg: u8, transit: bool, cont: bool, isid: [u8; 6], text: &[u8]) -> Pdu {
    Pdu::LoginRequest(LoginRequest {
        transit,
        cont,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid,
        tsih: 0,
        itt: 1,
        cid: 1,
        cmdsn: 1,
        expstatsn: 0,
        data: text.to_vec().into(),
    })
}

fn raw_conn(addr: SocketAddr) -> Raw {
    let s = TcpStream::connect(addr).unwrap();
    Raw {
        s,
        dec: iscsi::framing::PduDecoder::new(iscsi::framing::FrameLimits::default()),
        buf: Default::default(),
        cmdsn: 1,
        statsn: 0,
        tsih: 0,
        params: prefs(),
        conn: Default::default(),
        pacing: iscsi::negotiate::TargetPacing::NotAsked,
    }
}

const NAMES: &[u8] =
    b"InitiatorName=iqn.2026-11.org.reservoir:hostile\0SessionType=Normal\0TargetName=iqn.2026-11.org.reservoir:raw\0";

#[test]
fn malformed_logins_at_every_stage_are_refused_and_the_verified_session_goes_on() {
    let addr = target();
    let verified = Verified::start(addr);
    let big_value = format!("X-org.example.big={}\0", "v".repeat(60_000));
    let many_keys: String = (0..2000).map(|i| format!("X-k{i}=1\0")).collect();
    let long_name = format!("{}=1\0", "K".repeat(300));
    let oversized = b"MaxRecvDataSegmentLength=4294967295\0MaxBurstLength=99999999999999\0\
FirstBurstLength=4294967296\0MaxConnections=65536\0MaxOutstandingR2T=70000\0\
DefaultTime2Wait=99999\0DefaultTime2Retain=99999\0ErrorRecoveryLevel=9\0";
    let mut security_then_op = NAMES.to_vec();
    security_then_op.extend_from_slice(b"AuthMethod=None\0");
    // (what, requests); every one must end in a Login Response of a failure class, or a
    // close, never a session; oversized values are the exception, below.
    let cases: Vec<(&str, Vec<Pdu>)> = vec![
        (
            "text without a NUL",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 1],
                b"InitiatorName=x",
            )],
        ),
        (
            "key without =",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 2],
                b"InitiatorName\0",
            )],
        ),
        (
            "bytes that are no text",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 3],
                &[0xff; 300],
            )],
        ),
        (
            "no InitiatorName",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 4],
                b"SessionType=Normal\0",
            )],
        ),
        (
            "reserved stage 2",
            vec![login_pdu(2, 3, true, false, [0x80, 0, 0, 0, 9, 5], NAMES)],
        ),
        (
            "transit to stage 2",
            vec![login_pdu(1, 2, true, false, [0x80, 0, 0, 0, 9, 6], NAMES)],
        ),
        (
            "T and C both set",
            vec![login_pdu(1, 3, true, true, [0x80, 0, 0, 0, 9, 7], NAMES)],
        ),
        (
            "a key name of 300 bytes",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 8],
                &[NAMES, long_name.as_bytes()].concat(),
            )],
        ),
        (
            "a 60 KB value",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 9],
                &[NAMES, big_value.as_bytes()].concat(),
            )],
        ),
        (
            "2000 keys",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 10],
                &[NAMES, many_keys.as_bytes()].concat(),
            )],
        ),
        (
            "unknown target",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 11],
                b"InitiatorName=iqn.x:y\0SessionType=Normal\0TargetName=iqn.x:none\0",
            )],
        ),
        (
            "security stage, then operational stage going back",
            vec![
                login_pdu(0, 1, true, false, [0x80, 0, 0, 0, 9, 12], &security_then_op),
                login_pdu(1, 0, true, false, [0x80, 0, 0, 0, 9, 12], b""),
            ],
        ),
        (
            "the same key twice",
            vec![login_pdu(
                1,
                3,
                true,
                false,
                [0x80, 0, 0, 0, 9, 13],
                &[NAMES, b"MaxBurstLength=8192\0MaxBurstLength=16384\0"].concat(),
            )],
        ),
    ];
    for (what, pdus) in cases {
        let mut c = raw_conn(addr);
        let mut refused = false;
        for p in pdus {
            let mut v = Vec::new();
            p.encode(&mut v, Digests::default());
            if c.s.write_all(&v).is_err() {
                refused = true;
                break;
            }
            let a = answer(&mut c, Duration::from_millis(1500));
            match a.pdus.first() {
                Some(Pdu::LoginResponse(r)) if r.status_class != 0 => {
                    assert_eq!(r.status_class, 2, "{what}: an initiator error");
                    refused = true;
                }
                Some(Pdu::LoginResponse(r)) => {
                    assert!(
                        !r.transit || r.nsg != 3,
                        "{what}: full feature phase granted"
                    );
                }
                Some(Pdu::Reject(_)) | None => refused = a.closed || a.pdus.is_empty(),
                Some(other) => panic!("{what}: {other:?}"),
            }
            if refused {
                break;
            }
        }
        assert!(refused, "{what}: not refused");
    }
    // Oversized and out-of-range values: the login goes on, with values RFC 7143 allows.
    let mut c = raw_conn(addr);
    let pdu = login_pdu(
        1,
        3,
        true,
        false,
        [0x80, 0, 0, 0, 9, 20],
        &[NAMES, oversized].concat(),
    );
    c.send(&pdu);
    let a = answer(&mut c, Duration::from_millis(1500));
    match a.pdus.first() {
        Some(Pdu::LoginResponse(r)) if r.status_class == 0 => {
            let text = String::from_utf8_lossy(&r.data).into_owned();
            for kv in text.split('\0').filter(|s| !s.is_empty()) {
                let (k, v) = kv.split_once('=').unwrap();
                if let Ok(n) = v.parse::<u64>() {
                    let max = match k {
                        "MaxRecvDataSegmentLength" | "MaxBurstLength" | "FirstBurstLength" => {
                            (1 << 24) - 1
                        }
                        "MaxConnections" | "MaxOutstandingR2T" => 65535,
                        "DefaultTime2Wait" | "DefaultTime2Retain" => 3600,
                        "ErrorRecoveryLevel" => 2,
                        _ => u64::MAX,
                    };
                    assert!(n <= max, "{k}={n} answered to an oversized offer");
                }
            }
        }
        Some(Pdu::LoginResponse(r)) => assert_eq!(r.status_class, 2),
        other => panic!("oversized values: {other:?} (closed: {})", a.closed),
    }
    drop(c);
    let rounds = verified.finish();
    assert!(rounds > 0);
    assert_eq!(drained(addr), 0, "connections the target still holds");
}

#[test]
fn endless_text_continuations_are_cut_off() {
    let addr = target();
    let verified = Verified::start(addr);
    let mut c = Raw::login(addr, [0x80, 0, 0, 0, 0xbb, 1], 0, 1, 1, prefs());
    let chunk = vec![b'a'; 8192];
    let mut ended = false;
    // 64 MiB announced as one request in 8 KiB parts: the target must stop it long before.
    for i in 0..8192u32 {
        let t = Pdu::TextRequest(TextRequest {
            immediate: true,
            final_: false,
            cont: true,
            lun: 0,
            itt: 0x500,
            ttt: 0xffff_ffff,
            cmdsn: c.cmdsn,
            expstatsn: c.statsn,
            data: chunk.clone().into(),
        });
        let mut v = Vec::new();
        t.encode(&mut v, Digests::default());
        if c.s.write_all(&v).is_err() {
            ended = true;
            break;
        }
        let a = answer(
            &mut c,
            Duration::from_millis(if i % 64 == 0 { 50 } else { 0 }),
        );
        if a.closed || a.pdus.iter().any(|p| matches!(p, Pdu::Reject(_))) {
            ended = true;
            println!("cut off after {} bytes", (i + 1) * 8192);
            break;
        }
    }
    assert!(ended, "64 MiB of one text request taken in");
    assert!(verified.finish() > 0);
}

#[test]
fn floods_of_half_open_and_slow_connections_are_closed_and_freed() {
    let addr = target();
    let verified = Verified::start(addr);
    // 200 connections that never send a byte, 30 that send a login header a byte at a time.
    let mut idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Each returns how long it lived and whether the target closed it (not our timeout).
    let slow: Vec<JoinHandle<(Duration, bool)>> = (0..30)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let started = Instant::now();
                let mut v = Vec::new();
                login_pdu(1, 3, true, false, [0x80, 0, 0, 0, 7, i], NAMES)
                    .encode(&mut v, Digests::default());
                for b in v {
                    if s.write_all(&[b]).is_err() {
                        return (started.elapsed(), true);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                // Closed by the target at its login timeout: the read ends with EOF or a
                // reset, not with our own read timeout.
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut sink = [0u8; 512];
                let closed = loop {
                    match s.read(&mut sink) {
                        Ok(0) => break true,
                        Ok(_) => continue,
                        Err(e) => {
                            break !matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            )
                        }
                    }
                };
                (started.elapsed(), closed)
            })
        })
        .collect();
    // The most the target held at once, sampled while it takes them in.
    let peak = (0..8)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(60));
            held(addr)
        })
        .max()
        .unwrap_or(0);
    // Each idle connection is closed by the target within its login timeout (1 s).
    let t0 = Instant::now();
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 16];
        assert!(
            matches!(s.read(&mut b), Ok(0) | Err(_)),
            "a half-open connection left open"
        );
    }
    let idle_closed = t0.elapsed();
    for h in slow {
        let (t, closed) = h.join().unwrap();
        assert!(closed, "a slow login was left open (lived {t:?})");
    }
    drop(idle);
    let rounds = verified.finish();
    let after = drained(addr);
    println!(
        "connections the target held: {peak} at the flood's peak, {after} after; idle \
         connections closed within {idle_closed:?}; verified session: {rounds} rounds"
    );
    assert!(peak >= 30, "the flood did not reach the target: {peak}");
    assert!(rounds > 0);
    assert_eq!(after, 0, "connections the target still holds");
}

#[test]
fn limits_on_sessions_and_connections_answer_the_peer_and_spare_the_others() {
    let addr = start("login_timeout = 2\nmax_sessions = 2\nmax_open_connections = 6");
    let verified = Verified::start(addr);
    let mut second = Raw::login(addr, [0x80, 0, 0, 0, 0xcc, 1], 0, 1, 1, prefs());
    clear_ua(&mut second, 1);
    // A third session: refused, out of resources (0302h).
    let mut c = raw_conn(addr);
    c.send(&login_pdu(
        1,
        3,
        true,
        false,
        [0x80, 0, 0, 0, 0xcc, 2],
        NAMES,
    ));
    let a = answer(&mut c, Duration::from_secs(2));
    let Some(Pdu::LoginResponse(r)) = a.pdus.first() else {
        panic!("expected a login response: {a:?}")
    };
    assert_eq!((r.status_class, r.status_detail), (3, 2));
    drop(c);
    // Reinstating a session is not a new one.
    let mut again = Raw::login(addr, [0x80, 0, 0, 0, 0xcc, 1], 0, 1, 1, prefs());
    clear_ua(&mut again, 1);
    // Connections beyond six open are closed as they come: two sessions hold two, so of
    // ten more four stay open (until the login timeout) and six are closed at once.
    std::thread::sleep(Duration::from_millis(200));
    let mut extra: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut closed_at_once = 0;
    for s in &mut extra {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        if matches!(s.read(&mut [0u8; 8]), Ok(0)) {
            closed_at_once += 1;
        }
    }
    assert_eq!(closed_at_once, 6, "connections beyond max_open_connections");
    // The sessions inside the limits go on.
    let p = again.scsi(0x60, again.cmdsn, &tur(), false, false, 0, &[]);
    again.cmdsn += 1;
    again.send(&p);
    let Pdu::ScsiResponse(r) = again.recv() else {
        panic!()
    };
    assert_eq!(r.status, 0);
    drop(extra);
    assert!(verified.finish() > 0);
}
