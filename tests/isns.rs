//! iSNS against a real server: open-isns `isnsd` in a network namespace of its own (it
//! binds 0.0.0.0:3205 whatever its configuration says). `rsv target` registers its
//! portals, targets, aliases and portal groups there, `isnsadm --query` sees them, the
//! registration outlives several of the server's short periods, `rsv ls isns://` lists
//! the targets and `isns://SERVER/ALIAS/LUN` reaches a LUN for `inq` and `cp`; SIGTERM
//! deregisters. Needs root and `ip netns`, and open-isns; elsewhere it prints SKIP (a
//! failure under RESERVOIR_TEST_STRICT or CI).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use testkit::exposition::series;
use testkit::ready::{spawn_ready, RsvIsns};

fn rsv() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rsv"))
}

fn strict() -> bool {
    std::env::var_os("RESERVOIR_TEST_STRICT").is_some() || std::env::var_os("CI").is_some()
}

fn skip(why: &str) {
    assert!(!strict(), "{why}");
    eprintln!("SKIP isns: {why}");
}

fn have(tool: &str) -> bool {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join(tool).exists())
}

/// The namespace and what runs in it, taken down however the test ends.
struct Netns {
    name: String,
    children: Vec<Child>,
}

impl Netns {
    /// `tag` tells apart the namespaces of tests running at once in one process.
    fn create(tag: &str) -> Option<Netns> {
        let name = format!("rsv-isns{tag}-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return None;
        }
        let ns = Netns {
            name,
            children: Vec::new(),
        };
        ns.cmd("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .unwrap();
        Some(ns)
    }

    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn ok(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Polls `f` until it returns true, for at most `secs` seconds.
fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

const PERIOD: u64 = 4;

/// What a test here needs: root, the `tools` (open-isns's, openssl), a namespace of its own
/// (`tag` tells apart those of tests running at once) and a scratch directory; `None`
/// when one is missing (the test is skipped with a note, failed when strict).
fn setup(tag: &str, tools: &[&str]) -> Option<(Netns, tempfile::TempDir)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("needs root for a network namespace");
        return None;
    }
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    if !missing.is_empty() {
        skip(&format!(
            "{} not installed; scripts/setup.sh installs it",
            missing.join(", ")
        ));
        return None;
    }
    let Some(ns) = Netns::create(tag) else {
        skip("ip netns add failed");
        return None;
    };
    Some((ns, tempfile::tempdir().unwrap()))
}

/// open-isns `isnsd` in the foreground in `ns`, on `dir`'s isnsd.conf, its log in
/// isnsd.log there.
fn spawn_isnsd(ns: &Netns, dir: &Path) -> Child {
    ns.cmd("isnsd")
        .arg("-f")
        .arg("-c")
        .arg(dir.join("isnsd.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("isnsd.log")).unwrap(),
        ))
        .spawn()
        .unwrap()
}

/// What `isnsadm --query iscsi-name` (on `dir`'s isnsadm.conf) prints in `ns`; `None`
/// while the server does not answer.
fn isnsadm_query(ns: &Netns, dir: &Path) -> Option<String> {
    let o = ns
        .cmd("isnsadm")
        .arg("-c")
        .arg(dir.join("isnsadm.conf"))
        .args(["--query", "iscsi-name"])
        .output()
        .unwrap();
    o.status.success().then(|| text(&o))
}

#[test]
fn target_registers_and_rsv_finds_it_through_isnsd() {
    let Some((mut ns, dir)) = setup("d", &["isnsd", "isnsadm"]) else {
        return;
    };
    let d = dir.path();
    // A short period: the target must refresh its registration to stay listed.
    std::fs::write(
        d.join("isnsd.conf"),
        format!(
            "SourceName = isns.reservoir.test\nRegistrationPeriod = {PERIOD}s\n\
             DefaultDiscoveryDomain = 1\nSLPRegister = 0\nSecurity = 0\nESIRetries = 0\n\
             PIDFile = {0}/isnsd.pid\nControlSocket = {0}/isnsctl\n",
            d.display()
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("isnsadm.conf"),
        "SourceName = iqn.2026-11.org.reservoir:isnsadm\nServerAddress = 127.0.0.1\nSecurity = 0\n",
    )
    .unwrap();
    let isnsd = spawn_isnsd(&ns, d);
    ns.children.push(isnsd);
    let query = |ns: &Netns| isnsadm_query(ns, d);
    wait_until(10, "isnsd to answer", || query(&ns).is_some());
    assert!(query(&ns).unwrap().contains("empty"));

    std::fs::write(
        d.join("target.toml"),
        format!(
            r#"portals = ["0.0.0.0:3260"]
data_dir = "{}"
[[target]]
iqn = "iqn.2026-11.org.reservoir:home"
alias = "home-media"
[[target.lun]]
id = 0
store = "ram:?size=8MiB"
[[target]]
iqn = "iqn.2026-11.org.reservoir:spare"
[[target.lun]]
id = 0
store = "ram:?size=4MiB"
[isns]
server = "127.0.0.1"
"#,
            d.display()
        ),
    )
    .unwrap();
    let mut target = ns
        .cmd(rsv())
        .arg("target")
        .arg("-c")
        .arg(d.join("target.toml"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(d.join("target.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    let mut out = BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim() != "ready" {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!(
                "rsv target exited before ready:\n{}",
                std::fs::read_to_string(d.join("target.log")).unwrap_or_default()
            );
        }
    }
    let target_pid = target.id();
    ns.children.push(target);
    let log = || std::fs::read_to_string(d.join("target.log")).unwrap_or_default();

    // The server has the entity, both nodes with the alias, the wildcard portal as the
    // address the server was reached from, and a portal group per node.
    wait_until(10, "the target's registration", || {
        query(&ns).is_some_and(|q| q.contains("iqn.2026-11.org.reservoir:spare"))
    });
    let q = query(&ns).unwrap();
    for want in [
        "Entity identifier = \"rsv:iqn.2026-11.org.reservoir:home\"",
        "iSCSI name = \"iqn.2026-11.org.reservoir:home\"",
        "iSCSI alias = \"home-media\"",
        "iSCSI node type = Target",
        "Portal IP address = 127.0.0.1",
        "Portal TCP/UDP port = 3260/tcp",
        "Portal group name = \"iqn.2026-11.org.reservoir:spare\"",
        "Portal group tag = 1",
    ] {
        assert!(q.contains(want), "isnsadm does not show {want:?}:\n{q}");
    }

    // Three periods later it is still there: refreshed, not expired.
    std::thread::sleep(Duration::from_secs(3 * PERIOD));
    let q = query(&ns).unwrap();
    assert!(
        q.contains("iqn.2026-11.org.reservoir:home"),
        "expired:\n{q}\n{}",
        log()
    );

    // rsv ls isns:// lists both targets with portals, aliases and LUNs.
    let ls = ok(ns.cmd(rsv()).args(["ls", "--json", "isns://127.0.0.1/"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    let targets = v.as_array().unwrap();
    assert_eq!(targets.len(), 2, "{ls}");
    let home = targets
        .iter()
        .find(|t| t["target"] == "iqn.2026-11.org.reservoir:home")
        .unwrap_or_else(|| panic!("{ls}"));
    assert_eq!(home["alias"], "home-media", "{ls}");
    assert_eq!(home["portals"][0], "127.0.0.1:3260,1", "{ls}");
    assert_eq!(home["luns"][0]["size_bytes"], 8 << 20, "{ls}");
    let one = ok(ns
        .cmd(rsv())
        .args(["ls", "--json", "isns://127.0.0.1/home-media"]));
    let v: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(v[0]["target"], "iqn.2026-11.org.reservoir:home", "{one}");
    assert_eq!(v[0]["alias"], "home-media", "{one}");
    assert_eq!(v[0]["portals"][0], "127.0.0.1:3260,1", "{one}");
    let plain = ok(ns.cmd(rsv()).args(["ls", "isns://127.0.0.1:3205"]));
    assert!(
        plain.contains("Target: iqn.2026-11.org.reservoir:home (alias home-media)"),
        "{plain}"
    );
    // The initiator deregistered after asking.
    let q = query(&ns).unwrap();
    assert!(
        !q.contains("Initiator"),
        "the initiator is still registered:\n{q}"
    );

    // isns://SERVER/ALIAS/LUN for inq and cp; by IQN too.
    let inq = ok(ns
        .cmd(rsv())
        .args(["inq", "--json", "isns://127.0.0.1/home-media/0"]));
    assert!(
        inq.contains("\"target\": \"iqn.2026-11.org.reservoir:home\""),
        "{inq}"
    );
    let src = d.join("src.bin");
    let back = d.join("back.bin");
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    ok(ns
        .cmd(rsv())
        .arg("cp")
        .arg(&src)
        .arg("isns://127.0.0.1/iqn.2026-11.org.reservoir:spare/0"));
    ok(ns
        .cmd(rsv())
        .arg("cp")
        .arg("isns://127.0.0.1/iqn.2026-11.org.reservoir:spare/0")
        .arg(&back));
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..]);
    let missing = ns
        .cmd(rsv())
        .args(["inq", "isns://127.0.0.1/no-such-alias/0"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        text(&missing).contains("no target named or aliased \"no-such-alias\""),
        "{}",
        text(&missing)
    );

    // rsv media finds the targets too. open-isns refuses its SCN registration (it sends
    // SCNs only to a registered SCN port): the watcher says so, and the poll finds them.
    let media_log = d.join("media.log");
    let media = have("curl").then(|| {
        let mut c = ns.cmd(rsv());
        c.args([
            "media",
            "--isns",
            "127.0.0.1",
            "--listen",
            "127.0.0.1:18080",
            "--poll",
            "1s",
        ]);
        spawn_ready(&mut c, &media_log).0
    });
    let media_targets = |ns: &Netns| -> Vec<String> {
        let o = ns
            .cmd("curl")
            .args(["-s", "--max-time", "20", "http://127.0.0.1:18080/api/media"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let mut t: Vec<String> = v["storages"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["target"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        t.sort();
        t
    };
    if let Some(m) = media {
        ns.children.insert(0, m);
        assert_eq!(
            media_targets(&ns),
            [
                "iqn.2026-11.org.reservoir:home",
                "iqn.2026-11.org.reservoir:spare"
            ]
        );
        let mlog = || std::fs::read_to_string(&media_log).unwrap_or_default();
        wait_until(10, "the watcher to be refused", || {
            mlog().contains("SCN Registration Rejected")
        });
    }

    // SIGTERM: deregistered before the target exits.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(target_pid as i32, libc::SIGTERM);
    }
    let status = ns.children.pop().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", log());
    assert!(log().contains("iSNS: deregistered entity"), "{}", log());
    let q = query(&ns).unwrap();
    assert!(
        !q.contains("reservoir:home"),
        "still registered after SIGTERM:\n{q}"
    );
    let ls = ok(ns.cmd(rsv()).args(["ls", "--json", "isns://127.0.0.1/"]));
    assert_eq!(ls.trim(), "[]");
    if have("curl") {
        // The media server's poll drops them; stopped, it leaves no node behind.
        wait_until(20, "rsv media to drop the targets", || {
            media_targets(&ns).is_empty()
        });
        let mut m = ns.children.remove(0);
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(m.id() as i32, libc::SIGTERM);
        }
        assert!(m.wait().unwrap().success());
        let q = query(&ns).unwrap();
        assert!(!q.contains("Initiator"), "left registered:\n{q}");
    }
}

/// A node that registered for SCNs, on a thread inside the namespace: the changes it was
/// told about (name, bitmap), answering each SCN and keeping its entity alive with a
/// query a second. Returns once the server has accepted the SCN registration (a change
/// made before that would, rightly, not be told to the watcher; on a loaded machine the
/// thread can start late).
fn scn_watcher(
    ns: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::sync::mpsc::Receiver<(String, u32)> {
    use isns::attr::{node_type, scn};
    use isns::objects::{self, Entity, Node};
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on this thread only, with a namespace file we opened.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        let me = "iqn.2026-11.org.reservoir:watcher";
        let mut s = std::net::TcpStream::connect("127.0.0.1:3205").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let reg = objects::dev_attr_reg(
            1,
            me,
            &Entity {
                eid: "watcher".into(),
                period: None,
                portals: Vec::new(),
                nodes: vec![Node {
                    name: me.into(),
                    alias: None,
                    node_type: node_type::INITIATOR,
                }],
                portal_group_tag: None,
            },
            false,
        );
        s.write_all(&reg.encode(65532)).unwrap();
        let bits = scn::OBJECT_ADDED | scn::OBJECT_REMOVED;
        s.write_all(&objects::scn_reg(2, me, bits).encode(65532))
            .unwrap();
        let mut dec = isns::Reassembler::new();
        let mut buf = [0u8; 4096];
        let mut last = Instant::now();
        let mut xid = 2u16;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if last.elapsed() > Duration::from_secs(1) {
                xid += 1;
                s.write_all(&objects::query_targets(xid, me).encode(65532))
                    .unwrap();
                last = Instant::now();
            }
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => dec.push(&buf[..n]),
                Err(_) => continue,
            }
            while let Ok(Some(m)) = dec.next_message() {
                if m.function == isns::FunctionId::SCN_REG.response() {
                    let ok = m.status == Some(isns::Status::SUCCESS);
                    let _ = ready_tx.send(ok);
                }
                if m.function == isns::FunctionId::SCN {
                    s.write_all(&objects::scn_response(&m).encode(65532))
                        .unwrap();
                    for c in objects::scn_changes(&m) {
                        let _ = tx.send(c);
                    }
                }
            }
        }
    });
    match ready_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(true) => {}
        Ok(false) => panic!("the server refused the watcher's SCN registration"),
        Err(_) => panic!("no answer to the watcher's SCN registration in 30 s"),
    }
    rx
}

#[test]
fn rsv_isns_serves_isnsadm_target_and_initiator() {
    use isns::attr::scn;
    let Some((mut ns, dir)) = setup("s", &["isnsadm"]) else {
        return;
    };
    let d = dir.path();
    std::fs::write(
        d.join("isnsadm.conf"),
        "SourceName = iqn.2026-11.org.reservoir:isnsadm\nServerAddress = 127.0.0.1\nSecurity = 0\n",
    )
    .unwrap();
    let db = d.join("isns.db");
    let server = |ns: &Netns| {
        let mut c = ns.cmd(rsv());
        c.args([
            "isns",
            "--listen",
            "127.0.0.1:3205",
            "--period",
            "6",
            "--db",
        ])
        .arg(&db);
        spawn_ready(&mut c, &d.join("isns.log")).0
    };
    let s = server(&ns);
    ns.children.push(s);
    let adm = |ns: &Netns, args: &[&str]| {
        ok(ns
            .cmd("isnsadm")
            .arg("-c")
            .arg(d.join("isnsadm.conf"))
            .args(args))
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scns = scn_watcher(&ns.name, stop.clone());
    let expect_scn = |name: &str, bits: u32| {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match scns.recv_timeout(left) {
                Ok((n, b)) if n == name && b & bits != 0 => return,
                Ok(_) => continue,
                Err(_) => panic!("no SCN 0x{bits:x} for {name}"),
            }
        }
    };

    // isnsadm registers a target; the watcher is told.
    adm(
        &ns,
        &[
            "--register",
            "entity=adm.ent",
            "portal=127.0.0.1:3270",
            "target=iqn.2026-11.org.reservoir:by-isnsadm",
        ],
    );
    expect_scn("iqn.2026-11.org.reservoir:by-isnsadm", scn::OBJECT_ADDED);

    // rsv target registers; isnsadm and rsv ls see it.
    std::fs::write(
        d.join("target.toml"),
        format!(
            "portals = [\"127.0.0.1:3260\"]\ndata_dir = \"{}\"\n[[target]]\n\
             iqn = \"iqn.2026-11.org.reservoir:home\"\nalias = \"home-media\"\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=4MiB\"\n\
             [isns]\nserver = \"127.0.0.1\"\n",
            d.display()
        ),
    )
    .unwrap();
    let mut tc = ns.cmd(rsv());
    tc.arg("target").arg("-c").arg(d.join("target.toml"));
    let target = spawn_ready(&mut tc, &d.join("target.log")).0;
    let target_pid = target.id();
    ns.children.push(target);
    expect_scn("iqn.2026-11.org.reservoir:home", scn::OBJECT_ADDED);
    let q = adm(&ns, &["--query", "iscsi-name"]);
    assert!(
        q.contains("iSCSI name = \"iqn.2026-11.org.reservoir:home\""),
        "{q}"
    );
    assert!(q.contains("Portal TCP/UDP port = 3260/tcp"), "{q}");
    let ls = ok(ns.cmd(rsv()).args(["ls", "--json", "isns://127.0.0.1/"]));
    assert!(ls.contains("\"alias\": \"home-media\""), "{ls}");
    assert!(ls.contains("\"size_bytes\": 4194304"), "{ls}");
    assert!(ls.contains("iqn.2026-11.org.reservoir:by-isnsadm"), "{ls}");
    let inq = ok(ns.cmd(rsv()).args(["inq", "isns://127.0.0.1/home-media/0"]));
    assert!(inq.contains("iqn.2026-11.org.reservoir:home"), "{inq}");

    // isnsadm's target is never refreshed: it expires; the target's registration stays.
    expect_scn("iqn.2026-11.org.reservoir:by-isnsadm", scn::OBJECT_REMOVED);
    let q = adm(&ns, &["--query", "iscsi-name"]);
    assert!(
        !q.contains("by-isnsadm") && q.contains("reservoir:home"),
        "{q}"
    );

    // SIGTERM: the target deregisters, the watcher is told.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(target_pid as i32, libc::SIGTERM);
    }
    assert!(ns.children.pop().unwrap().wait().unwrap().success());
    expect_scn("iqn.2026-11.org.reservoir:home", scn::OBJECT_REMOVED);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    // A registration survives a restart of the server (the file).
    adm(
        &ns,
        &[
            "--register",
            "entity=kept.ent",
            "portal=127.0.0.1:3271",
            "target=iqn.2026-11.org.reservoir:kept",
        ],
    );
    let mut s = ns.children.pop().unwrap();
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(s.id() as i32, libc::SIGTERM);
    }
    assert!(s.wait().unwrap().success());
    let s = server(&ns);
    ns.children.push(s);
    let q = adm(&ns, &["--query", "iscsi-name"]);
    assert!(
        q.contains("iqn.2026-11.org.reservoir:kept"),
        "lost in the restart:\n{q}"
    );
    assert!(q.contains("Portal TCP/UDP port = 3271/tcp"), "{q}");
}

/// Which iSNS server a test runs in its namespace.
#[derive(Clone, Copy, Debug)]
enum IsnsServer {
    /// open-isns `isnsd`.
    OpenIsns,
    /// `rsv isns`.
    Reservoir,
}

/// A configuration reload (SIGHUP) updates the target's registration at once: a target
/// removed is deregistered, one added registered, a changed alias replaced; `isnsadm
/// --query` and `rsv ls isns://` see it long before the registration's period is up.
fn reload_updates_the_registration(server: IsnsServer) {
    let (tag, tools): (&str, &[&str]) = match server {
        IsnsServer::OpenIsns => ("rd", &["isnsd", "isnsadm"]),
        IsnsServer::Reservoir => ("rs", &["isnsadm"]),
    };
    let Some((mut ns, dir)) = setup(tag, tools) else {
        return;
    };
    let d = dir.path();
    std::fs::write(
        d.join("isnsadm.conf"),
        "SourceName = iqn.2026-11.org.reservoir:isnsadm\nServerAddress = 127.0.0.1\nSecurity = 0\n",
    )
    .unwrap();
    // A long period: what changes comes from the reload, not from a refresh.
    let server_process = match server {
        IsnsServer::OpenIsns => {
            std::fs::write(
                d.join("isnsd.conf"),
                format!(
                    "SourceName = isns.reservoir.test\nRegistrationPeriod = 120s\n\
                     DefaultDiscoveryDomain = 1\nSLPRegister = 0\nSecurity = 0\n\
                     ESIRetries = 0\nPIDFile = {0}/isnsd.pid\nControlSocket = {0}/isnsctl\n",
                    d.display()
                ),
            )
            .unwrap();
            spawn_isnsd(&ns, d)
        }
        IsnsServer::Reservoir => {
            let mut c = ns.cmd(rsv());
            c.args(["isns", "--listen", "127.0.0.1:3205", "--period", "120"]);
            spawn_ready(&mut c, &d.join("isns.log")).0
        }
    };
    ns.children.push(server_process);
    let query = |ns: &Netns| isnsadm_query(ns, d);
    wait_until(10, "the iSNS server to answer", || query(&ns).is_some());

    let config = |targets: &str| {
        format!(
            "portals = [\"127.0.0.1:3260\"]\ndata_dir = \"{}\"\n{targets}\
             [isns]\nserver = \"127.0.0.1\"\n",
            d.display()
        )
    };
    let target = |iqn: &str, alias: &str| {
        format!(
            "[[target]]\niqn = \"iqn.2026-11.org.reservoir:{iqn}\"\nalias = \"{alias}\"\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=4MiB\"\n"
        )
    };
    std::fs::write(
        d.join("target.toml"),
        config(&(target("home", "home-media") + &target("spare", "spare-disk"))),
    )
    .unwrap();
    let mut tc = ns.cmd(rsv());
    tc.arg("target").arg("-c").arg(d.join("target.toml"));
    let t = spawn_ready(&mut tc, &d.join("target.log")).0;
    let target_pid = t.id() as i32;
    ns.children.push(t);
    let log = || std::fs::read_to_string(d.join("target.log")).unwrap_or_default();
    wait_until(10, "the target's registration", || {
        query(&ns).is_some_and(|q| q.contains("iqn.2026-11.org.reservoir:spare"))
    });
    let q = query(&ns).unwrap();
    assert!(q.contains("iSCSI alias = \"home-media\""), "{q}");

    // spare removed, home realiased, extra added.
    std::fs::write(
        d.join("target.toml"),
        config(&(target("home", "renamed") + &target("extra", "extra-disk"))),
    )
    .unwrap();
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(target_pid, libc::SIGHUP);
    }
    wait_until(15, "the registration to follow the reload", || {
        query(&ns).is_some_and(|q| {
            q.contains("iqn.2026-11.org.reservoir:extra")
                && q.contains("iSCSI alias = \"renamed\"")
                && !q.contains("iqn.2026-11.org.reservoir:spare")
                && !q.contains("home-media")
        })
    });
    let q = query(&ns).unwrap();
    for want in [
        "iSCSI alias = \"extra-disk\"",
        "Portal group name = \"iqn.2026-11.org.reservoir:extra\"",
        "Portal TCP/UDP port = 3260/tcp",
    ] {
        assert!(q.contains(want), "isnsadm does not show {want:?}:\n{q}");
    }
    assert!(log().contains("iSNS: registration of entity"), "{}", log());
    // An initiator finds the new target through the server, and reaches its LUN.
    let ls = ok(ns.cmd(rsv()).args(["ls", "--json", "isns://127.0.0.1/"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    let mut found: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["target"].as_str())
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            "iqn.2026-11.org.reservoir:extra",
            "iqn.2026-11.org.reservoir:home"
        ],
        "{ls}"
    );
    let inq = ok(ns.cmd(rsv()).args(["inq", "isns://127.0.0.1/extra-disk/0"]));
    assert!(inq.contains("iqn.2026-11.org.reservoir:extra"), "{inq}");

    // SIGTERM: all of it deregistered.
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(target_pid, libc::SIGTERM);
    }
    let status = ns.children.pop().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", log());
    let q = query(&ns).unwrap();
    assert!(
        !q.contains("reservoir:home") && !q.contains("reservoir:extra"),
        "{q}"
    );
}

#[test]
fn reload_updates_the_registration_with_isnsd() {
    reload_updates_the_registration(IsnsServer::OpenIsns);
}

#[test]
fn reload_updates_the_registration_with_rsv_isns() {
    reload_updates_the_registration(IsnsServer::Reservoir);
}

/// A DSA key pair by `openssl` on the 1024-bit parameters open-isns makes: `NAME.key`
/// (PKCS #8) and `NAME.pub` in `dir`.
fn dsa_key(dir: &Path, params: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (key, public) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    ok(Command::new("openssl")
        .args(["genpkey", "-paramfile"])
        .arg(params)
        .arg("-out")
        .arg(&key));
    ok(Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public));
    (key, public)
}

fn dsa_params(dir: &Path) -> PathBuf {
    let params = dir.join("dsa.params");
    ok(Command::new("openssl")
        .args(["genpkey", "-genparam", "-algorithm", "DSA"])
        .args(["-pkeyopt", "dsa_paramgen_bits:1024", "-out"])
        .arg(&params));
    params
}

/// An `isnsadm` configuration in `dir`: source `source`, signing as `spi` with `key` and
/// checking the server's `server_pub` (security off when `spi` is `None`).
fn isnsadm_conf(
    dir: &Path,
    file: &str,
    source: &str,
    auth: Option<(&str, &Path, &Path)>,
) -> PathBuf {
    let mut c = format!("SourceName = {source}\nServerAddress = 127.0.0.1\n");
    match auth {
        Some((spi, key, server_pub)) => {
            c += &format!(
                "Security = 1\nAuthName = {spi}\nAuthKeyFile = {}\nServerKeyFile = {}\n",
                key.display(),
                server_pub.display()
            )
        }
        None => c += "Security = 0\n",
    }
    let p = dir.join(file);
    std::fs::write(&p, c).unwrap();
    p
}

/// `isnsadm --local --enroll SPI POLICY…` against the `isnsd` whose control socket is in
/// `dir`: the client's private key, made by isnsadm, in `dir/SPI.key`; its public half
/// in `dir/SPI.pub`. The server keeps the policy (what the SPI may register).
fn enroll(ns: &Netns, dir: &Path, spi: &str, policy: &[&str]) -> (PathBuf, PathBuf) {
    let local = dir.join("local.conf");
    std::fs::write(
        &local,
        format!(
            "SourceName = isns.control\nControlSocket = {}/isnsctl\n",
            dir.display()
        ),
    )
    .unwrap();
    let key = dir.join(format!("{spi}.key"));
    let public = dir.join(format!("{spi}.pub"));
    let mut said = String::new();
    let end = Instant::now() + Duration::from_secs(15);
    while !key.exists() {
        assert!(Instant::now() < end, "isnsadm --enroll {spi}: {said}");
        let o = ns
            .cmd("isnsadm")
            .arg("-c")
            .arg(&local)
            .arg("--local")
            .arg("--keyfile")
            .arg(&key)
            .args(["--enroll", spi])
            .args(policy)
            .output()
            .unwrap();
        said = text(&o);
        if !o.status.success() {
            let _ = std::fs::remove_file(&key);
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    ok(Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public));
    (key, public)
}

fn isnsadm(ns: &Netns, conf: &Path, args: &[&str]) -> Output {
    ns.cmd("isnsadm")
        .arg("-c")
        .arg(conf)
        .args(args)
        .output()
        .unwrap()
}

/// A target whose `[isns]` section has `auth` (SPI, key, server key) in `dir`, started in
/// `ns` and ready.
fn target_with_isns(
    ns: &Netns,
    dir: &Path,
    iqn: &str,
    entity: &str,
    auth: Option<(&str, &Path, &Path)>,
) -> Child {
    let mut toml = format!(
        "portals = [\"127.0.0.1:3260\"]\ndata_dir = \"{}\"\n[[target]]\niqn = \"{iqn}\"\n\
         [[target.lun]]\nid = 0\nstore = \"ram:?size=4MiB\"\n[isns]\nserver = \"127.0.0.1\"\n\
         entity = \"{entity}\"\nregistration_period = 30\n",
        dir.display()
    );
    if let Some((spi, key, server_pub)) = auth {
        toml += &format!(
            "[isns.auth]\nname = \"{spi}\"\nkey = \"{}\"\nserver_key = \"{}\"\n",
            key.display(),
            server_pub.display()
        );
    }
    std::fs::write(dir.join("target.toml"), toml).unwrap();
    let mut c = ns.cmd(rsv());
    c.arg("target").arg("-c").arg(dir.join("target.toml"));
    spawn_ready(&mut c, &dir.join("target.log")).0
}

/// The issue's intruder: `isnsadm --replace --register` of the victim's entity with its
/// own portal and target, then a deregistration of it; each must fail.
fn intruder_refused(ns: &Netns, conf: &Path, victim_entity: &str) {
    let entity = format!("entity={victim_entity}");
    let reg = isnsadm(
        ns,
        conf,
        &[
            "--replace",
            "--register",
            &entity,
            "portal=127.0.0.9:3260",
            "target=iqn.2026-11.org.reservoir.evil:evil",
        ],
    );
    assert!(
        !reg.status.success(),
        "the intruder registered: {}",
        text(&reg)
    );
    let dereg = isnsadm(ns, conf, &["--deregister", &format!("eid={victim_entity}")]);
    assert!(
        !dereg.status.success(),
        "the intruder deregistered: {}",
        text(&dereg)
    );
}

/// The victim's registration as `conf` sees it: its node and portal there, nothing of
/// the intruder's.
/// Starts `rsv target` registering `iqn` under `entity` (signed with `auth`) and waits
/// until `admin`'s isnsadm finds it (`what` names the wait).
fn registered_target(
    ns: &mut Netns,
    dir: &Path,
    iqn: &str,
    entity: &str,
    auth: Option<(&str, &Path, &Path)>,
    admin: &Path,
    what: &str,
) {
    let t = target_with_isns(ns, dir, iqn, entity, auth);
    ns.children.push(t);
    wait_until(15, what, || {
        text(&isnsadm(ns, admin, &["--query", "iscsi-name"])).contains(iqn)
    });
}

fn victim_intact(ns: &Netns, conf: &Path, iqn: &str) {
    let q = isnsadm(ns, conf, &["--query", "iscsi-name"]);
    assert!(q.status.success(), "{}", text(&q));
    let q = text(&q);
    assert!(q.contains(iqn), "the victim is gone:\n{q}");
    assert!(q.contains("Portal IP address = 127.0.0.1"), "{q}");
    assert!(
        !q.contains("127.0.0.9") && !q.contains(":evil"),
        "the intruder got in:\n{q}"
    );
}

/// `rsv ls --json isns://127.0.0.1/` in `ns` with the client's keys in the environment.
fn ls_with(ns: &Netns, auth: Option<(&str, &Path, &Path)>) -> Output {
    let mut c = ns.cmd(rsv());
    c.args(["ls", "--json", "isns://127.0.0.1/"]);
    if let Some((spi, key, server_pub)) = auth {
        c.env("RSV_ISNS_AUTH_NAME", spi)
            .env("RSV_ISNS_AUTH_KEY", key)
            .env("RSV_ISNS_SERVER_KEY", server_pub);
    }
    c.output().unwrap()
}

fn auth_test_setup(tag: &str) -> Option<(Netns, tempfile::TempDir)> {
    setup(tag, &["isnsd", "isnsadm", "openssl"])
}

/// open-isns `isnsd` with `Security = 1`: the target's signed registration is taken, the
/// server's signed answers are checked, and `rsv ls isns://` with the initiator's keys
/// lists the target; a target whose key the server does not know registers nothing.
#[test]
fn isnsd_with_security_takes_our_signed_clients() {
    let Some((mut ns, dir)) = auth_test_setup("da") else {
        return;
    };
    let d = dir.path();
    let params = dsa_params(d);
    let (server_key, server_pub) = dsa_key(d, &params, "server");
    // Clients are enrolled in isnsd's database (ClientKeyStore = DB:, its default), with
    // the policy open-isns derives from the SPI: source names iqn.YYYY-MM.<SPI
    // reversed>…; a target's SPI must be let register target nodes.
    std::fs::write(
        d.join("isnsd.conf"),
        format!(
            "SourceName = isns.reservoir.test\nRegistrationPeriod = 60s\n\
             DefaultDiscoveryDomain = 1\nSLPRegister = 0\nESIRetries = 0\n\
             Security = 1\nAuthName = isns.reservoir.org\nAuthKeyFile = {}\n\
             PIDFile = {1}/isnsd.pid\nControlSocket = {1}/isnsctl\nDatabase = {1}/db\n",
            server_key.display(),
            d.display()
        ),
    )
    .unwrap();
    let isnsd = spawn_isnsd(&ns, d);
    ns.children.push(isnsd);
    let mut client = std::collections::HashMap::new();
    for (spi, policy) in [
        ("target.reservoir.org", "node-type=target"),
        ("admin.reservoir.org", "node-type=initiator"),
        ("ls.reservoir.org", "node-type=initiator"),
    ] {
        client.insert(spi, enroll(&ns, d, spi, &[policy]).0);
    }
    let admin = isnsadm_conf(
        d,
        "admin.conf",
        "iqn.2026-11.org.reservoir.admin:q",
        Some((
            "admin.reservoir.org",
            &client["admin.reservoir.org"],
            &server_pub,
        )),
    );
    wait_until(10, "isnsd to answer", || {
        isnsadm(&ns, &admin, &["--query", "iscsi-name"])
            .status
            .success()
    });

    let iqn = "iqn.2026-11.org.reservoir.target:home";
    let tdir = d.join("t");
    std::fs::create_dir(&tdir).unwrap();
    registered_target(
        &mut ns,
        &tdir,
        iqn,
        "target.reservoir.org",
        Some((
            "target.reservoir.org",
            &client["target.reservoir.org"],
            &server_pub,
        )),
        &admin,
        "the signed registration",
    );
    victim_intact(&ns, &admin, iqn);

    // The initiator signs as an enrolled SPI (its node name derived from it) and lists
    // the target; unsigned, it may not register its node and says why.
    let ls_auth = (
        "ls.reservoir.org",
        client["ls.reservoir.org"].as_path(),
        server_pub.as_path(),
    );
    let ls = ns
        .cmd(rsv())
        .args([
            "ls",
            "--json",
            "--initiator-name",
            "iqn.2026-11.org.reservoir.ls:x",
        ])
        .arg("isns://127.0.0.1/")
        .env("RSV_ISNS_AUTH_NAME", ls_auth.0)
        .env("RSV_ISNS_AUTH_KEY", ls_auth.1)
        .env("RSV_ISNS_SERVER_KEY", ls_auth.2)
        .output()
        .unwrap();
    assert!(ls.status.success(), "{}", text(&ls));
    assert!(text(&ls).contains(iqn), "{}", text(&ls));
    // With the wrong server key the answers do not check out.
    let (_, not_server) = dsa_key(d, &params, "not-server");
    let wrong = ls_with(&ns, Some((ls_auth.0, ls_auth.1, &not_server)));
    assert!(!wrong.status.success(), "{}", text(&wrong));
    assert!(text(&wrong).contains("bad signature"), "{}", text(&wrong));

    // A target signing with a key isnsd does not have for its SPI registers nothing.
    let (rogue_key, _) = dsa_key(d, &params, "rogue");
    let rdir = d.join("r");
    std::fs::create_dir(&rdir).unwrap();
    // The same portal is taken by the first target: this one listens elsewhere.
    let rogue_iqn = "iqn.2026-11.org.reservoir.target:rogue";
    let mut toml = format!(
        "portals = [\"127.0.0.1:3261\"]\ndata_dir = \"{}\"\n[[target]]\niqn = \"{rogue_iqn}\"\n\
         [[target.lun]]\nid = 0\nstore = \"ram:?size=4MiB\"\n[isns]\nserver = \"127.0.0.1\"\n\
         entity = \"target.reservoir.org\"\n",
        rdir.display()
    );
    toml += &format!(
        "[isns.auth]\nname = \"target.reservoir.org\"\nkey = \"{}\"\nserver_key = \"{}\"\n",
        rogue_key.display(),
        server_pub.display()
    );
    std::fs::write(rdir.join("target.toml"), toml).unwrap();
    let mut c = ns.cmd(rsv());
    c.arg("target").arg("-c").arg(rdir.join("target.toml"));
    let rogue = spawn_ready(&mut c, &rdir.join("target.log")).0;
    ns.children.push(rogue);
    wait_until(20, "the rogue target's failed registration", || {
        std::fs::read_to_string(rdir.join("target.log"))
            .unwrap_or_default()
            .contains("iSNS: registering with")
    });
    let q = text(&isnsadm(&ns, &admin, &["--query", "iscsi-name"]));
    assert!(!q.contains(rogue_iqn), "{q}");
    victim_intact(&ns, &admin, iqn);
}

/// `rsv isns --auth-key`: keys made by `isnsadm --enroll` (against an `isnsd` that
/// enrolls them), `isnsadm` signed and checking our signatures registers and queries; the
/// issue's intruder, signed by its own enrolled key or not signed at all, changes nothing
/// of the target's, and unsigned `rsv ls` is refused.
#[test]
fn rsv_isns_with_authentication_refuses_the_intruder() {
    let Some((mut ns, dir)) = auth_test_setup("ra") else {
        return;
    };
    let d = dir.path();
    let params = dsa_params(d);
    let (server_key, server_pub) = dsa_key(d, &params, "server");
    let keys = d.join("keys");
    std::fs::create_dir(&keys).unwrap();

    // isnsadm --enroll makes each client's key (and tells an isnsd of it, the only way
    // to run it); the public half goes into rsv isns's key store under the SPI.
    std::fs::write(
        d.join("isnsd.conf"),
        format!(
            "SourceName = isns.reservoir.test\nSLPRegister = 0\nESIRetries = 0\nSecurity = 1\n\
             AuthKeyFile = {}\nPIDFile = {1}/isnsd.pid\nControlSocket = {1}/isnsctl\n\
             Database = {1}/db\n",
            server_key.display(),
            d.display()
        ),
    )
    .unwrap();
    let mut enroller = spawn_isnsd(&ns, d);
    let mut client = std::collections::HashMap::new();
    for spi in [
        "target.reservoir.org",
        "admin.reservoir.org",
        "evil.reservoir.org",
        "ls.reservoir.org",
    ] {
        let (key, public) = enroll(&ns, d, spi, &[]);
        std::fs::copy(&public, keys.join(spi)).unwrap();
        client.insert(spi, key);
    }
    let _ = enroller.kill();
    let _ = enroller.wait();

    let mut c = ns.cmd(rsv());
    c.args(["isns", "--listen", "127.0.0.1:3205", "--auth-key"])
        .arg(&server_key)
        .arg("--key-store")
        .arg(&keys);
    let s = spawn_ready(&mut c, &d.join("isns.log")).0;
    ns.children.push(s);
    let log = || std::fs::read_to_string(d.join("isns.log")).unwrap_or_default();

    let admin = isnsadm_conf(
        d,
        "admin.conf",
        "iqn.2026-11.org.reservoir.admin:q",
        Some((
            "admin.reservoir.org",
            &client["admin.reservoir.org"],
            &server_pub,
        )),
    );
    let q = isnsadm(&ns, &admin, &["--query", "iscsi-name"]);
    assert!(
        q.status.success(),
        "a signed isnsadm query: {}\n{}",
        text(&q),
        log()
    );

    let iqn = "iqn.2026-11.org.reservoir.target:home";
    let tdir = d.join("t");
    std::fs::create_dir(&tdir).unwrap();
    registered_target(
        &mut ns,
        &tdir,
        iqn,
        "victim-ent",
        Some((
            "target.reservoir.org",
            &client["target.reservoir.org"],
            &server_pub,
        )),
        &admin,
        "the signed registration",
    );
    assert!(log().contains("(SPI target.reservoir.org)"), "{}", log());

    // The intruder, with its own enrolled key, and without any.
    let evil_signed = isnsadm_conf(
        d,
        "evil.conf",
        "iqn.2026-11.org.reservoir.evil:x",
        Some((
            "evil.reservoir.org",
            &client["evil.reservoir.org"],
            &server_pub,
        )),
    );
    intruder_refused(&ns, &evil_signed, "victim-ent");
    let evil_plain = isnsadm_conf(
        d,
        "evil-plain.conf",
        "iqn.2026-11.org.reservoir.evil:x",
        None,
    );
    intruder_refused(&ns, &evil_plain, "victim-ent");
    // Claiming the target's own node name as source changes nothing either.
    let forged = isnsadm_conf(
        d,
        "forged.conf",
        iqn,
        Some((
            "evil.reservoir.org",
            &client["evil.reservoir.org"],
            &server_pub,
        )),
    );
    intruder_refused(&ns, &forged, "victim-ent");
    victim_intact(&ns, &admin, iqn);
    assert!(log().contains("Source Unauthorized (8)"), "{}", log());

    // The intruder's own entity is its to register (an open-isns client registers in
    // this mode as it would anywhere).
    let own = isnsadm(
        &ns,
        &evil_signed,
        &[
            "--register",
            "entity=evil-ent",
            "portal=127.0.0.9:3260",
            "target=iqn.2026-11.org.reservoir.evil:own",
        ],
    );
    assert!(own.status.success(), "{}\n{}", text(&own), log());

    // rsv ls signed lists the target; unsigned it may only look, so it cannot register
    // its initiator node and says so.
    let ls_auth = (
        "ls.reservoir.org",
        client["ls.reservoir.org"].as_path(),
        server_pub.as_path(),
    );
    let ls = ls_with(&ns, Some(ls_auth));
    assert!(ls.status.success(), "{}\n{}", text(&ls), log());
    assert!(text(&ls).contains(iqn), "{}", text(&ls));
    let anon = ls_with(&ns, None);
    assert!(!anon.status.success(), "{}", text(&anon));
    assert!(
        text(&anon).contains("Source Unauthorized"),
        "{}",
        text(&anon)
    );
}

/// `rsv isns` without authentication: the intruder may change only what it registered;
/// open-isns's client still registers and queries.
#[test]
fn rsv_isns_without_authentication_limits_a_source_to_its_own() {
    let Some((mut ns, dir)) = auth_test_setup("rn") else {
        return;
    };
    let d = dir.path();
    let mut c = ns.cmd(rsv());
    c.args(["isns", "--listen", "127.0.0.1:3205"]);
    let s = spawn_ready(&mut c, &d.join("isns.log")).0;
    ns.children.push(s);
    let admin = isnsadm_conf(d, "admin.conf", "iqn.2026-11.org.reservoir.admin:q", None);
    let iqn = "iqn.2026-11.org.reservoir.target:home";
    registered_target(
        &mut ns,
        d,
        iqn,
        "victim-ent",
        None,
        &admin,
        "the registration",
    );
    let evil = isnsadm_conf(d, "evil.conf", "iqn.2026-11.org.reservoir.evil:x", None);
    intruder_refused(&ns, &evil, "victim-ent");
    victim_intact(&ns, &admin, iqn);
    let own = isnsadm(
        &ns,
        &evil,
        &[
            "--register",
            "entity=evil-ent",
            "portal=127.0.0.9:3260",
            "target=iqn.2026-11.org.reservoir.evil:own",
        ],
    );
    assert!(own.status.success(), "{}", text(&own));
    // isnsadm registers with the node it registers as the source, but deregisters as its
    // SourceName: another source, refused; as the node, its own entity goes.
    let gone = isnsadm(&ns, &evil, &["--deregister", "eid=evil-ent"]);
    assert!(!gone.status.success(), "{}", text(&gone));
    let as_node = isnsadm_conf(d, "own.conf", "iqn.2026-11.org.reservoir.evil:own", None);
    let gone = isnsadm(&ns, &as_node, &["--deregister", "eid=evil-ent"]);
    assert!(gone.status.success(), "{}", text(&gone));
    let q = text(&isnsadm(&ns, &admin, &["--query", "iscsi-name"]));
    assert!(!q.contains("evil:own"), "{q}");
    let ls = ls_with(&ns, None);
    assert!(ls.status.success(), "{}", text(&ls));
    assert!(text(&ls).contains(iqn), "{}", text(&ls));
}

/// `rsv isns --auth-key --metrics`: a registration signed as an enrolled SPI but by
/// another key is refused (no answer, the connection closed, nothing registered) and
/// counted once in `rsv_isns_auth_refused_total`; the same registration signed by the
/// SPI's own key is then taken, and counts nothing more there. No namespace: `rsv isns`
/// listens on a port of its own on loopback.
#[test]
fn rsv_isns_counts_and_refuses_a_badly_signed_registration() {
    use isns::auth::Identity;
    use isns::objects::{dev_attr_reg, Entity, Node};
    use std::io::{Read, Write};
    if !have("openssl") || !have("curl") {
        skip("openssl or curl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let params = dsa_params(d);
    let (server_key, _) = dsa_key(d, &params, "server");
    let (good_key, good_pub) = dsa_key(d, &params, "good");
    let (other_key, _) = dsa_key(d, &params, "other");
    let spi = "good.reservoir.org";
    let keys = d.join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::copy(&good_pub, keys.join(spi)).unwrap();

    let isns = RsvIsns::start(
        &[
            "--auth-key".as_ref(),
            server_key.as_os_str(),
            "--key-store".as_ref(),
            keys.as_os_str(),
        ],
        &d.join("isns.log"),
    );
    let (server, metrics) = (&isns.addr, &isns.metrics);
    let log = || std::fs::read_to_string(d.join("isns.log")).unwrap_or_default();
    let scrape = || ok(Command::new("curl").args(["-sf", &format!("http://{metrics}/metrics")]));
    let refused = "rsv_isns_auth_refused_total";
    let registered = "rsv_isns_requests_total{function=\"dev_attr_reg\",result=\"success\"}";

    let iqn = "iqn.2026-11.org.reservoir.signed:t";
    let entity = Entity {
        eid: "signed-ent".into(),
        period: Some(30),
        portals: vec!["127.0.0.1:3260".parse().unwrap()],
        nodes: vec![Node {
            name: iqn.into(),
            alias: None,
            node_type: isns::attr::node_type::TARGET,
        }],
        portal_group_tag: Some(1),
    };
    let wire = dev_attr_reg(1, iqn, &entity, false).encode(isns::pdu::MAX_PAYLOAD);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let pem = |p: &Path| std::fs::read_to_string(p).unwrap();
    // Sends `bytes` on a connection of its own; what the server answered before it closed
    // (or within 10 s).
    let exchange = |bytes: &[u8], until_close: bool| -> Vec<u8> {
        let mut s = std::net::TcpStream::connect(server).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if !until_close {
                        break;
                    }
                }
                Err(e) => {
                    assert!(!until_close, "the connection stayed open: {e}\n{}", log());
                    break;
                }
            }
        }
        got
    };

    let before = scrape();
    assert_eq!(series(&before, refused), 0.0, "{before}");
    // The enrolled SPI's name, another key's signature.
    let forged = Identity::from_pem(spi, &pem(&other_key)).unwrap();
    let answer = exchange(&forged.seal(&wire, now), true);
    assert!(
        answer.is_empty(),
        "an answer to a bad signature: {answer:?}"
    );
    let after = scrape();
    assert_eq!(series(&after, refused), 1.0, "{after}\n{}", log());
    assert_eq!(series(&after, registered), 0.0, "{after}");
    assert_eq!(series(&after, "rsv_isns_nodes"), 0.0, "{after}");
    assert!(log().contains("DevAttrReg refused"), "{}", log());

    // The same registration signed by the SPI's key: taken (so the refusal was the
    // signature's), and the refusals stay one.
    let signed = Identity::from_pem(spi, &pem(&good_key)).unwrap();
    let answer = exchange(&signed.seal(&wire, now + 1), false);
    assert!(
        !answer.is_empty(),
        "no answer to a good signature\n{}",
        log()
    );
    wait_until(10, "the registration to count", || {
        series(&scrape(), registered) == 1.0
    });
    let last = scrape();
    assert_eq!(series(&last, refused), 1.0, "{last}");
    assert_eq!(series(&last, "rsv_isns_nodes"), 1.0, "{last}");
}
