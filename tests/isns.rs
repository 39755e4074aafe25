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
    fn create() -> Option<Netns> {
        let name = format!("rsv-isns-{}", std::process::id());
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

#[test]
fn target_registers_and_rsv_finds_it_through_isnsd() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("needs root for a network namespace");
    }
    if !have("isnsd") || !have("isnsadm") {
        return skip("open-isns (isnsd, isnsadm) not installed; scripts/setup.sh installs it");
    }
    let Some(mut ns) = Netns::create() else {
        return skip("ip netns add failed");
    };
    let dir = tempfile::tempdir().unwrap();
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
    let isnsd = ns
        .cmd("isnsd")
        .arg("-f")
        .arg("-c")
        .arg(d.join("isnsd.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(d.join("isnsd.log")).unwrap(),
        ))
        .spawn()
        .unwrap();
    ns.children.push(isnsd);
    let query = |ns: &Netns| {
        let o = ns
            .cmd("isnsadm")
            .arg("-c")
            .arg(d.join("isnsadm.conf"))
            .args(["--query", "iscsi-name"])
            .output()
            .unwrap();
        o.status.success().then(|| text(&o))
    };
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
}
