//! `rsv-lab timing` against Wireshark's iSCSI dissector: a real Reservoir session on loopback
//! (a write and a read-back through `rsv cp`) captured by tcpdump on the test's own port,
//! then the same capture through `tshark -Y iscsi` and through `rsv-lab timing --json`; both
//! must find the same PDUs (direction, opcode, ITT, buffer offset, data segment length) in
//! the same order. Needs root (tcpdump on `lo`), tcpdump and tshark; elsewhere SKIP.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::*;

type Pdu = (String, u8, u32, Option<u32>, u32);

fn hex(s: &str) -> u32 {
    let s = s.trim();
    s.strip_prefix("0x")
        .map_or_else(|| s.parse::<u32>(), |h| u32::from_str_radix(h, 16))
        .unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// The PDUs tshark finds, in capture order. Fields of one frame holding several PDUs come
/// as comma-separated lists; the buffer offset is present only on Data-In, Data-Out and
/// R2T, so it is handed out to those in order.
fn tshark_pdus(cap: &std::path::Path, port: u16) -> Vec<Pdu> {
    let out = run_ok(
        "tshark",
        &[
            "-r",
            &cap.display().to_string(),
            // Loopback captures can list a connection's segments out of order (two CPUs
            // sending at the same instant); tshark reassembles across such a gap only with
            // this preference, as `rsv-lab timing` always does.
            "-o",
            "tcp.reassemble_out_of_order:TRUE",
            "-o",
            &format!("iscsi.target_ports:{port}"),
            "-o",
            "iscsi.bogus_pdu_max_data_len:16777215",
            "-Y",
            "iscsi",
            "-T",
            "fields",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=,",
            "-e",
            "tcp.srcport",
            "-e",
            "iscsi.opcode",
            "-e",
            "iscsi.initiatortasktag",
            "-e",
            "iscsi.bufferOffset",
            "-e",
            "iscsi.datasegmentlength",
        ],
    );
    let mut pdus = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "{line:?}");
        let list =
            |s: &str| -> Vec<u32> { s.split(',').filter(|x| !x.is_empty()).map(hex).collect() };
        let (ops, itts, offs, lens) = (list(f[1]), list(f[2]), list(f[3]), list(f[4]));
        assert_eq!(ops.len(), itts.len(), "{line:?}");
        assert_eq!(ops.len(), lens.len(), "{line:?}");
        let dir = if hex(f[0]) == u32::from(port) {
            "t>i"
        } else {
            "i>t"
        };
        let mut offs = offs.into_iter();
        for i in 0..ops.len() {
            let op = ops[i] as u8;
            let off = matches!(op, 0x05 | 0x25 | 0x31).then(|| offs.next().expect("an offset"));
            pdus.push((dir.to_owned(), op, itts[i], off, lens[i]));
        }
        assert!(offs.next().is_none(), "offsets left over in {line:?}");
    }
    pdus
}

#[test]
fn timing_finds_the_pdus_wiresharks_dissector_finds() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: capturing on lo needs root");
        return;
    }
    if !have("tcpdump") || !have("tshark") {
        return;
    }
    let Some(bench) = rsv_lab() else { return };
    let mut t = Target::start(Some(
        "[[target]]\niqn = \"iqn.2026-11.org.reservoir:timing\"\n[[target.lun]]\nid = 0\nstore = \"ram:?size=4MiB\"\n",
    ));
    let port: u16 = t.portal.rsplit(':').next().unwrap().parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("session.pcap");
    let mut dump = Command::new("tcpdump")
        // A large buffer: a loopback session outruns the default one and tcpdump drops.
        // (and immediate mode: packets in a ring block not yet handed over are lost at exit).
        .args([
            "-i",
            "lo",
            "-s",
            "0",
            "-B",
            "131072",
            "--immediate-mode",
            "-U",
            "-n",
            "-w",
        ])
        .arg(&cap)
        .arg(format!("tcp port {port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tcpdump");
    // tcpdump says "listening on" once capturing.
    let dump_log = {
        use std::io::Read;
        let mut err = dump.stderr.take().unwrap();
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        let mut b = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("listening on") {
            assert!(Instant::now() < until, "tcpdump did not start");
            let n = err.read(&mut b).unwrap();
            assert!(n > 0, "tcpdump exited: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&b[..n]);
        }
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = err.read_to_string(&mut rest);
            String::from_utf8_lossy(&seen).into_owned() + &rest
        })
    };
    let src = dir.path().join("src.img");
    random_file(&src, 4 << 20, 7);
    let url = t.url(0);
    run_ok(
        &rsv().display().to_string(),
        &["cp", &src.display().to_string(), &url],
    );
    let back = dir.path().join("back.img");
    run_ok(
        &rsv().display().to_string(),
        &["cp", &url, &back.display().to_string()],
    );
    assert!(std::fs::read(&src).unwrap() == std::fs::read(&back).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(dump.id() as i32, libc::SIGTERM);
    }
    dump.wait().unwrap();
    t.stop();
    let dump_log = dump_log.join().unwrap();
    assert!(
        dump_log
            .lines()
            .any(|l| l.trim() == "0 packets dropped by kernel"),
        "{dump_log}"
    );

    let theirs = tshark_pdus(&cap, port);
    let json = run_ok(
        &bench.display().to_string(),
        &[
            "timing",
            &cap.display().to_string(),
            "--port",
            &port.to_string(),
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut ours: Vec<(f64, Pdu)> = Vec::new();
    for c in v["connections"].as_array().unwrap() {
        // Connections that carried no iSCSI (the initiator's path probes) have none.
        let i = &c["iscsi"];
        if i.is_null() {
            assert_eq!(c["to_server"]["payload_bytes"], 0, "{c}");
            continue;
        }
        assert!(i["stopped"].as_array().is_none_or(|s| s.is_empty()), "{i}");
        assert_eq!(i["decode_errors"], 0);
        assert!(i["holes"].as_array().is_none_or(|s| s.is_empty()), "{i}");
        for p in i["pdus"].as_array().unwrap() {
            ours.push((
                p["t_end_ns"].as_f64().unwrap(),
                (
                    p["dir"].as_str().unwrap().to_owned(),
                    p["opcode"].as_u64().unwrap() as u8,
                    p["itt"].as_u64().unwrap() as u32,
                    p["buffer_offset"].as_u64().map(|x| x as u32),
                    p["data_len"].as_u64().unwrap() as u32,
                ),
            ));
        }
    }
    // tshark lists PDUs by the frame that completed them: so do we, across connections.
    ours.sort_by(|a, b| a.0.total_cmp(&b.0));
    let ours: Vec<Pdu> = ours.into_iter().map(|x| x.1).collect();
    // The session did login, SCSI commands with data both ways, and logout.
    for op in [0x03u8, 0x23, 0x01, 0x21, 0x25, 0x06, 0x26] {
        assert!(
            ours.iter().any(|p| p.1 == op),
            "no opcode 0x{op:02x} in {ours:?}"
        );
    }
    assert!(
        ours.iter().any(|p| p.1 == 0x05 || (p.1 == 0x01 && p.4 > 0)),
        "no write data"
    );
    if let Some(i) = (0..ours.len().max(theirs.len())).find(|&i| ours.get(i) != theirs.get(i)) {
        panic!(
            "PDU {i} differs ({} ours, {} Wireshark's):\nours   {:?}\ntheirs {:?}",
            ours.len(),
            theirs.len(),
            &ours[i.min(ours.len())..(i + 6).min(ours.len())],
            &theirs[i.min(theirs.len())..(i + 6).min(theirs.len())]
        );
    }
    // The summary names what it found.
    let text = run_ok(
        &bench.display().to_string(),
        &[
            "timing",
            &cap.display().to_string(),
            "--port",
            &port.to_string(),
        ],
    );
    assert!(
        text.contains("iSCSI:") && text.contains("command latency"),
        "{text}"
    );
}

#[test]
fn timing_refuses_what_is_not_a_capture_with_one_line() {
    let Some(bench) = rsv_lab() else { return };
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("not.pcap");
    std::fs::write(&f, b"hello, not a capture").unwrap();
    let o = run(
        &bench.display().to_string(),
        &["timing", &f.display().to_string()],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a pcap or pcapng file"), "{err}");
    let o = run(
        &bench.display().to_string(),
        &["timing", "/nonexistent.pcap"],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent.pcap"));
}
