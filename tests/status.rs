//! `rsv target status` and `rsv target drop` over the target's local control socket: the
//! sessions of two initiators with their own LUNs and negotiated keys, `--json` as
//! `targetd::status::TargetStatus`; a drop that Reservoir's initiator and libiscsi each
//! answer with a logout; a user other than the target's refused (by the socket's mode,
//! and by its credentials where the mode lets it connect); a stale socket replaced, a
//! file that is not a socket left alone.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use targetd::status::TargetStatus;
use testkit::{build_libiscsi_client, have, rsv, run_json, Target};

const IQN: &str = "iqn.2026-11.org.reservoir:status";
const ALPHA: &str = "iqn.2026-11.org.example:alpha";
const BETA: &str = "iqn.2026-11.org.example:beta";

/// Two LUNs, each initiator masked to one of them, and the control socket in `dir`.
fn config(dir: &Path) -> String {
    format!(
        "[control]\nsocket = \"{}\"\n\
         [[target]]\niqn = \"{IQN}\"\n\
         [[target.initiator]]\nname = \"{ALPHA}\"\nluns = [0]\n\
         [[target.initiator]]\nname = \"{BETA}\"\nluns = [1]\n\
         [[target.lun]]\nid = 0\nstore = \"ram:?size=8MiB\"\n\
         [[target.lun]]\nid = 1\nstore = \"ram:?size=8MiB\"\n",
        dir.join("control.sock").display()
    )
}

fn start() -> Target {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let t = Target::start_in(dir, Some(&c));
    assert!(t.control_socket.is_some(), "no control-socket line");
    t
}

fn socket(t: &Target) -> &Path {
    t.control_socket.as_deref().unwrap()
}

fn rsv_target(args: &[&str]) -> Output {
    Command::new(rsv())
        .arg("target")
        .args(args)
        .output()
        .unwrap()
}

fn status(t: &Target) -> TargetStatus {
    let out = rsv_target(&["status", "--json", "--control", socket(t).to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json is a TargetStatus")
}

fn opts(connections: u16, header_digest: bool) -> initiator::SessionOptions {
    initiator::SessionOptions {
        connections,
        header_digest,
        auto_tune: false,
        ..Default::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    // Multi-threaded: the sessions' readers answer the target while the test waits on
    // the command line.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn login(
    rt: &tokio::runtime::Runtime,
    t: &Target,
    name: &str,
    o: initiator::SessionOptions,
) -> initiator::Session {
    let url = initiator::IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", t.portal)).unwrap();
    let o = initiator::SessionOptions {
        initiator_name: name.into(),
        ..o
    };
    rt.block_on(initiator::Session::connect(&url, &o)).unwrap()
}

/// READ(10) of `blocks` blocks from LUN `lun`.
fn read(rt: &tokio::runtime::Runtime, s: &initiator::Session, lun: u16, blocks: u16) {
    let [hi, lo] = blocks.to_be_bytes();
    let cdb = [0x28, 0, 0, 0, 0, 0, 0, hi, lo, 0];
    let r = rt
        .block_on(s.command(lun, &cdb, initiator::DataDir::Read(u32::from(blocks) * 512)))
        .unwrap();
    assert_eq!(r.status, 0);
}

#[test]
fn status_lists_each_initiators_session_with_its_luns_and_keys() {
    let t = start();
    let rt = runtime();
    let alpha = login(&rt, &t, ALPHA, opts(2, true));
    let beta = login(&rt, &t, BETA, opts(1, false));
    read(&rt, &alpha, 0, 2048);
    let s = status(&t);
    assert_eq!(s.sessions.len(), 2, "{s:#?}");
    for (session, name, lun, conns) in [(&alpha, ALPHA, 0u16, 2usize), (&beta, BETA, 1, 1)] {
        let info = session.info();
        let x = s
            .sessions
            .iter()
            .find(|x| x.initiator == name)
            .unwrap_or_else(|| panic!("no session of {name}: {s:#?}"));
        assert_eq!(x.tsih, info.tsih);
        assert_eq!(x.isid, info.isid.to_lowercase());
        assert_eq!(x.target.as_deref(), Some(IQN));
        assert_eq!(x.luns, vec![lun], "{name} sees only its LUN");
        assert_eq!(x.keys.max_burst_length, info.max_burst_length);
        assert_eq!(x.keys.first_burst_length, info.first_burst_length);
        assert_eq!(x.keys.immediate_data, info.immediate_data);
        assert_eq!(x.keys.initial_r2t, info.initial_r2t);
        assert_eq!(x.keys.error_recovery_level, info.error_recovery_level);
        assert_eq!(x.keys.max_connections, info.max_connections);
        assert_eq!(x.connections.len(), conns, "{name}: {x:#?}");
        for c in &x.connections {
            assert_eq!(c.header_digest, info.header_digest);
            assert_eq!(c.data_digest, info.data_digest);
            assert_eq!(
                c.initiator_max_recv_data_segment_length,
                info.max_recv_data_segment_length
            );
            assert_eq!(c.local.to_string(), t.portal);
            assert!(c.tls.is_none());
            let path = c.path.as_ref().expect("TCP_INFO of a TCP connection");
            assert!(path.mss > 0 && path.cwnd > 0, "{path:?}");
        }
    }
    let a = s.sessions.iter().find(|x| x.initiator == ALPHA).unwrap();
    assert!(a.connections[0].header_digest);
    assert!(
        a.bytes_sent >= 2048 * 512,
        "alpha read 1 MiB; sent {}",
        a.bytes_sent
    );
    assert_eq!(
        a.bytes_sent,
        a.connections.iter().map(|c| c.bytes_sent).sum::<u64>()
    );
    // The table names both, one row each.
    let out = rsv_target(&["status", "--control", socket(&t).to_str().unwrap()]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(table.contains(ALPHA) && table.contains(BETA), "{table}");
    rt.block_on(alpha.logout()).unwrap();
    rt.block_on(beta.logout()).unwrap();
    let s = status(&t);
    assert!(s.sessions.is_empty(), "{s:#?}");
}

/// `rsv target drop` with `--json`: its outcome.
fn drop_session(t: &Target, tsih: u16, extra: &[&str]) -> serde_json::Value {
    let tsih = tsih.to_string();
    let mut args = vec![
        "drop",
        &tsih,
        "--json",
        "--control",
        socket(t).to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = rsv_target(&args);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        t.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tsihs(t: &Target) -> Vec<u16> {
    status(t).sessions.iter().map(|s| s.tsih).collect()
}

#[test]
fn reservoirs_initiator_logs_out_when_asked_and_comes_back_as_a_new_session() {
    let t = start();
    let rt = runtime();
    let alpha = login(&rt, &t, ALPHA, opts(2, false));
    let tsih = alpha.info().tsih;
    assert_eq!(tsih, tsihs(&t)[0]);
    let d = drop_session(&t, tsih, &["--wait", "30"]);
    assert_eq!(d["tsih"], tsih);
    assert_eq!(d["outcome"], "logged_out", "{d}\n{}", t.log());
    assert!(!tsihs(&t).contains(&tsih));
    // The initiator goes on, on a session of its own making.
    read(&rt, &alpha, 0, 8);
    let now = tsihs(&t);
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], tsih);
    // At once: the target closes it, no logout asked for.
    let d = drop_session(&t, now[0], &["--now"]);
    assert_eq!(d["outcome"], "dropped", "{d}");
    assert!(!tsihs(&t).contains(&now[0]));
    let out = rsv_target(&["drop", "999", "--control", socket(&t).to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session 999"));
}

#[test]
fn libiscsi_logs_out_when_asked() {
    if !have("cc") {
        return;
    }
    let t = start();
    let build = tempfile::tempdir().unwrap();
    let bin = build_libiscsi_client(build.path());
    let mut child = Command::new(&bin)
        .args([BETA, &t.portal, IQN, "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let s = status(&t);
    let x = s.sessions.iter().find(|x| x.initiator == BETA).unwrap();
    assert_eq!(x.luns, vec![1]);
    let tsih = x.tsih;
    let control = socket(&t).to_owned();
    let dropping = std::thread::spawn(move || {
        run_json(
            Command::new(rsv())
                .args([
                    "target",
                    "drop",
                    &tsih.to_string(),
                    "--json",
                    "--wait",
                    "30",
                ])
                .arg("--control")
                .arg(&control),
        )
    });
    // libiscsi reads the Async Message while it waits for an answer: a TEST UNIT READY
    // now and then lets it.
    let end = Instant::now() + Duration::from_secs(30);
    while !dropping.is_finished() && Instant::now() < end {
        writeln!(stdin, "1 n 0 000000000000 -").unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let d = dropping.join().unwrap();
    assert_eq!(d["outcome"], "logged_out", "{d}\n{}", t.log());
    assert!(!tsihs(&t).contains(&tsih));
    drop(stdin);
    let _ = child.wait();
}

/// `setpriv` as `nobody`, no groups: the command line run as a user who is not the
/// target's.
fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(rsv())
        .arg("target")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_user_other_than_the_targets_is_refused() {
    if !have("setpriv") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test switches to nobody with setpriv: run it as root");
    }
    let t = start();
    let sock = socket(&t).to_str().unwrap().to_owned();
    // nobody may reach the directory: only the socket's mode stands in the way.
    std::fs::set_permissions(t.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = as_nobody(&["status", "--control", &sock]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ermission denied"), "{err}");
    // A mode opened by mistake: the target still checks who connected.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&["status", "--control", &sock]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused: uid 65534"), "{err}");
    let out = as_nobody(&["drop", "1", "--now", "--control", &sock]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused: uid 65534"));
    assert!(t.log().contains("control socket: refused uid 65534"));
    // Root still may.
    status(&t);
}

/// Runs `rsv target` on `config` until it says ready or exits; (ready, its stderr).
fn try_start(dir: &Path, config: &str) -> (bool, String) {
    let p = dir.join("try.toml");
    std::fs::write(&p, config).unwrap();
    let mut child = Command::new(rsv())
        .args(["target", "--listen", "127.0.0.1:0", "--config"])
        .arg(&p)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let ready = out.lines().any(|l| l.is_ok_and(|l| l == "ready"));
    if ready {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    }
    let out = child.wait_with_output().unwrap();
    (ready, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_stale_socket_is_replaced_and_anything_else_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("control.sock");
    let c = config(dir.path()).replace("ram:?size=8MiB", "ram:?size=1MiB");
    // Left by a target that was killed: a socket file nobody serves.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let (ready, err) = try_start(dir.path(), &c);
    assert!(ready, "{err}");
    assert!(err.contains("stale; replacing it"), "{err}");
    // Removed at a clean stop.
    assert!(!sock.exists());
    // A file that is not a socket stays as it is, and the target does not start.
    std::fs::write(&sock, "precious").unwrap();
    let (ready, err) = try_start(dir.path(), &c);
    assert!(!ready);
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&sock).unwrap(), "precious");
    std::fs::remove_file(&sock).unwrap();
    // A socket another target serves is not taken over.
    let t = Target::start_in(tempfile::tempdir().unwrap(), Some(&c));
    let (ready, err) = try_start(dir.path(), &c);
    assert!(!ready);
    assert!(err.contains("another process serves it"), "{err}");
    assert!(status(&t).sessions.is_empty());
}

/// `[control] group`: mode 0660 and the group's; a member by a supplementary group gets
/// in (the kernel's group list at connect, SO_PEERGROUPS), a non-member does not.
#[test]
fn a_member_of_the_configured_group_may_use_the_socket() {
    use std::os::unix::fs::MetadataExt;
    if !have("setpriv") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test switches to nobody with setpriv: run it as root");
    }
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path()).replace("[control]\n", "[control]\ngroup = \"4242\"\n");
    let t = Target::start_in(dir, Some(&c));
    std::fs::set_permissions(t.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = socket(&t).to_str().unwrap().to_owned();
    let m = std::fs::metadata(&sock).unwrap();
    assert_eq!((m.permissions().mode() & 0o777, m.gid()), (0o660, 4242));
    let member = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--groups=4242"])
        .arg(rsv())
        .args(["target", "status", "--json", "--control", &sock])
        .output()
        .unwrap();
    assert!(
        member.status.success(),
        "{}",
        String::from_utf8_lossy(&member.stderr)
    );
    let s: TargetStatus = serde_json::from_slice(&member.stdout).unwrap();
    assert!(s.sessions.is_empty());
    let out = as_nobody(&["status", "--control", &sock]);
    assert!(!out.status.success());
}
