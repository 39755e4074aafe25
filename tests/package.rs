//! The Debian package (`debian/`), built by `dpkg-buildpackage` around the `rsv` of this
//! build and installed on this machine (as root; PID 1 need not be systemd): its
//! contents, user and data directory; the target unit's command line run as the
//! reservoir user, READY=1 on a test NOTIFY_SOCKET and a login; an upgrade keeping a
//! locally edited conffile; remove keeping configuration and data; purge removing the
//! configuration and keeping the data; a reinstall; `systemd-analyze verify` of the
//! installed units. The machine is left as found: the package purged and, when the test
//! made them, the reservoir user and /var/lib/reservoir removed, even when it fails.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use testkit::notify::until;
use testkit::output::said;
use testkit::{have, rsv, run, run_ok};

const PACKAGE: &str = "reservoir";
const DATA: &str = "/var/lib/reservoir";
const CONFFILE: &str = "/etc/reservoir/target.toml";
/// The target the packaged configuration serves (packaging/target.toml).
const IQN: &str = "iqn.2026-11.org.reservoir:target0";
const UNITS: [&str; 5] = [
    "reservoir-target.service",
    "reservoir-isns.service",
    "reservoir-media.service",
    "reservoir-sync@.service",
    "reservoir-sync@.timer",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The version of the newest entry in debian/changelog.
fn changelog_version(changelog: &str) -> String {
    let first = changelog.lines().next().unwrap_or_default();
    let v = first.split(['(', ')']).nth(1);
    v.unwrap_or_else(|| panic!("no version in {first:?}"))
        .to_owned()
}

/// The package's version is the workspace's (a native package: no Debian revision).
#[test]
fn the_package_version_is_the_workspace_version() {
    let changelog = std::fs::read_to_string(workspace().join("debian/changelog")).unwrap();
    assert_eq!(changelog_version(&changelog), env!("CARGO_PKG_VERSION"));
}

/// `rsv man` writes rsv(1) and a page per subcommand that `rsv --help` lists, each of
/// which man(1) formats without a warning (lintian's check).
#[test]
fn man_pages_cover_every_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    run_ok(
        rsv().to_str().unwrap(),
        &["man", dir.path().to_str().unwrap()],
    );
    let help = run_ok(rsv().to_str().unwrap(), &["--help"]);
    let subcommands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&c| c != "help")
        .collect();
    assert!(subcommands.contains(&"target"), "{help}");
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    let mut want: Vec<String> = subcommands.iter().map(|c| format!("rsv-{c}.1")).collect();
    // A subcommand's own subcommands (`rsv sync promote`) have pages of their own.
    for c in &subcommands {
        let help = run_ok(rsv().to_str().unwrap(), &[c, "--help"]);
        let Some(list) = help.split("Commands:").nth(1) else {
            continue;
        };
        want.extend(
            list.split("Arguments:")
                .next()
                .unwrap()
                .split("Options:")
                .next()
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|&s| s != "help")
                .map(|s| format!("rsv-{c}-{s}.1")),
        );
    }
    want.push("rsv.1".into());
    want.sort();
    assert_eq!(pages, want);
    if !have("man") {
        return;
    }
    for page in pages {
        let out = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z"])
            .arg(dir.path().join(&page))
            .env("MANROFFSEQ", "")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{page}: {said}"
        );
    }
    let target = std::fs::read_to_string(dir.path().join("rsv-target.1")).unwrap();
    assert!(
        target.contains("\\-\\-config"),
        "rsv-target.1 has no --config"
    );
}

/// What this machine had before the test, so that it can be put back.
struct Machine {
    user_existed: bool,
    data_existed: bool,
    config_existed: bool,
    _lock: std::fs::File,
}

impl Machine {
    /// Takes the machine for the test: one package test at a time (dpkg has one
    /// database), and never over a reservoir package someone installed.
    fn take() -> Machine {
        let lock = std::fs::File::create("/tmp/reservoir-package-test.lock").unwrap();
        // SAFETY: flock on a descriptor we own; it is released when the file closes.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
            0
        );
        let status = package_status();
        assert!(
            status.is_empty() || status == "unknown ok not-installed",
            "{PACKAGE} is on this machine ({status}): the test installs and purges its own; \
             purge it first (dpkg --purge {PACKAGE})"
        );
        Machine {
            user_existed: user_exists(),
            data_existed: Path::new(DATA).exists(),
            config_existed: Path::new("/etc/reservoir").exists(),
            _lock: lock,
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", PACKAGE]);
        if !self.data_existed {
            let _ = std::fs::remove_dir_all(DATA);
        }
        // Purge removes it, unless the package under test is wrong.
        if !self.config_existed {
            let _ = std::fs::remove_dir_all("/etc/reservoir");
        }
        if !self.user_existed && user_exists() {
            let _ = run("userdel", &[PACKAGE]);
            let _ = run("groupdel", &[PACKAGE]);
        }
    }
}

fn package_status() -> String {
    let out = run("dpkg-query", &["-W", "-f=${Status}", PACKAGE]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn user_exists() -> bool {
    run("getent", &["passwd", PACKAGE]).status.success()
}

/// Builds the package around `binary` at `version` in `out`, from a copy of what
/// debian/rules reads (the workspace is left untouched: dpkg-buildpackage writes into
/// its source tree and beside it). Returns the .deb.
fn build(binary: &Path, version: &str, out: &Path) -> PathBuf {
    let src = out.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let ws = workspace();
    for part in ["debian", "packaging", "docs", "README.md"] {
        run_ok(
            "cp",
            &["-a", ws.join(part).to_str().unwrap(), src.to_str().unwrap()],
        );
    }
    let changelog = src.join("debian/changelog");
    let text = std::fs::read_to_string(&changelog).unwrap();
    if changelog_version(&text) != version {
        // A new version is a new changelog entry, as a maintainer makes one.
        let entry = format!(
            "{PACKAGE} ({version}) unstable; urgency=medium\n\n  * Test build.\n\n -- \
             Reservoir tests <tests@localhost>  Sun, 29 Nov 2026 12:00:00 +0000\n\n"
        );
        std::fs::write(&changelog, entry + &text).unwrap();
    }
    let started = Instant::now();
    let log = std::fs::File::create(out.join("build.log")).unwrap();
    let status = Command::new("dpkg-buildpackage")
        .args(["-b", "-us", "-uc"])
        .current_dir(&src)
        .env("RSV_BINARY", binary)
        // dpkg-deb's default xz took 145 of a build's 170 s here under load; gzip packs
        // the same files (what is installed does not change) at a fraction of the CPU.
        .env("DPKG_DEB_COMPRESSOR_TYPE", "gzip")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    let log = std::fs::read_to_string(out.join("build.log")).unwrap();
    assert!(status.success(), "dpkg-buildpackage failed:\n{log}");
    eprintln!(
        "built {version} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let arch = run_ok("dpkg", &["--print-architecture"]);
    let deb = out.join(format!("{PACKAGE}_{version}_{}.deb", arch.trim()));
    assert!(deb.exists(), "no {}:\n{log}", deb.display());
    deb
}

fn dpkg(args: &[&str]) -> String {
    let out = Command::new("dpkg")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed = said(&out);
    assert!(out.status.success(), "dpkg {args:?} failed:\n{printed}");
    printed
}

fn field(name: &str) -> String {
    run_ok("dpkg-query", &["-W", &format!("-f=${{{name}}}"), PACKAGE])
}

/// The installed reservoir-target.service's ExecStart, split into words.
fn unit_command_line() -> Vec<String> {
    let unit = std::fs::read_to_string("/lib/systemd/system/reservoir-target.service").unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("reservoir-target.service has an ExecStart");
    line.split_whitespace().map(str::to_owned).collect()
}

/// A unit setting's value (the first), as systemd reads a simple `Key=value` line.
fn unit_setting(unit: &str, key: &str) -> String {
    let text = std::fs::read_to_string(Path::new("/lib/systemd/system").join(unit)).unwrap();
    let prefix = format!("{key}=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{unit} has no {key}="))
        .to_owned()
}

/// Runs the installed target as its unit would: the unit's command line, as its User=
/// and Group=, with its ambient capabilities, a notify socket of the test's own. In a
/// network namespace of its own, so that the configuration's 127.0.0.1:3260 is free
/// whatever this machine runs; a login through `rsv inq` in the same namespace.
fn serve_as_the_unit_would() {
    let dir = tempfile::tempdir().unwrap();
    // The reservoir user must reach the socket.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let user = unit_setting("reservoir-target.service", "User");
    let group = unit_setting("reservoir-target.service", "Group");
    let caps: Vec<String> = unit_setting("reservoir-target.service", "AmbientCapabilities")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let caps = caps.join(",");
    let command_line = unit_command_line();
    assert_eq!(command_line[0], "/usr/bin/rsv");
    let log = dir.path().join("target.log");
    let mut child = Command::new("unshare")
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            "ip link set lo up && exec \"$@\"",
            "sh",
        ])
        .arg("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={group}"),
            "--init-groups",
            &format!("--inh-caps={caps}"),
            &format!("--ambient-caps={caps}"),
        ])
        .args(&command_line)
        .env("NOTIFY_SOCKET", &path)
        .env("RUST_LOG", "info")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id().to_string();
    let child = Kill(&mut child);
    let mut pings = 0;
    let ready = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        until(&sock, "READY=1", &mut pings)
    }))
    .unwrap_or_else(|_| {
        panic!(
            "no READY=1 from the unit's command line:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert!(
        ready.contains("STATUS=serving 1 target(s), 1 LUN(s)"),
        "{ready}"
    );
    // A login to the packaged target, from inside its namespace.
    let url = format!("iscsi://127.0.0.1:3260/{IQN}/0");
    let out = run_ok("nsenter", &["-t", &pid, "-n", "/usr/bin/rsv", "inq", &url]);
    assert!(out.contains(IQN) && out.contains("1GiB"), "{out}");
    // Its data went where the configuration says, as the unit's user.
    let lun = std::fs::metadata(Path::new(DATA).join("lun0.img")).unwrap();
    let uid = run_ok("id", &["-u", &user]);
    assert_eq!(lun.uid().to_string(), uid.trim());
    // SAFETY: a plain kill(2) of our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    until(&sock, "STOPPING=1", &mut pings);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "rsv target exited {status}");
}

/// `systemd-analyze verify` of the installed units, templates as an instance.
fn verify_installed_units() {
    let names: Vec<String> = UNITS.iter().map(|u| u.replace("@.", "@check.")).collect();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&names)
        .output()
        .unwrap();
    let printed = said(&out);
    assert!(
        out.status.success() && printed.trim().is_empty(),
        "{printed}"
    );
}

#[test]
fn package_installs_upgrades_removes_purges_and_reinstalls() {
    if ![
        "dpkg-buildpackage",
        "dh",
        "systemd-analyze",
        "setpriv",
        "unshare",
        "nsenter",
    ]
    .iter()
    .all(|t| have(t))
    {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("RESERVOIR_TEST_STRICT").is_none(),
            "the package test installs a package: run it as root"
        );
        eprintln!("SKIP: not root");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let v1 = env!("CARGO_PKG_VERSION").to_owned();
    let v2 = format!("{v1}+1");
    let (d1, d2) = (out.path().join("1"), out.path().join("2"));
    // Side by side: each is mostly one process (strip, compress) on one core.
    let (deb1, deb2) = std::thread::scope(|s| {
        let second = s.spawn(|| build(&rsv(), &v2, &d2));
        (build(&rsv(), &v1, &d1), second.join().unwrap())
    });

    let machine = Machine::take();
    let started = Instant::now();
    dpkg(&["-i", deb1.to_str().unwrap()]);
    assert_eq!(package_status(), "install ok installed");
    assert_eq!(field("Version"), v1);
    let depends = field("Depends");
    assert!(
        depends.contains("libc6") && depends.contains("adduser"),
        "{depends}"
    );

    // Contents: the binary (not the bench's), the conffile, the units, pages and docs.
    let files = run_ok("dpkg", &["-L", PACKAGE]);
    for f in [
        "/usr/bin/rsv",
        CONFFILE,
        "/usr/share/man/man1/rsv.1.gz",
        "/usr/share/man/man1/rsv-target.1.gz",
        "/usr/share/doc/reservoir/copyright",
        "/usr/share/doc/reservoir/examples/sync.example",
    ] {
        assert!(
            files.lines().any(|l| l == f),
            "{f} is not in the package:\n{files}"
        );
    }
    for u in UNITS {
        let f = format!("/lib/systemd/system/{u}");
        assert!(files.lines().any(|l| l == f), "{f} is not in the package");
    }
    assert!(
        !files.contains("rsv-lab"),
        "the bench is in the package:\n{files}"
    );
    assert!(field("Conffiles").contains(CONFFILE));
    assert_eq!(
        std::fs::read_to_string(CONFFILE).unwrap(),
        std::fs::read_to_string(workspace().join("packaging/target.toml")).unwrap()
    );
    let version = run_ok("/usr/bin/rsv", &["--version"]);
    assert!(version.contains(&v1), "{version}");

    // The user: a system account without a login; its data directory 0750.
    let passwd = run_ok("getent", &["passwd", PACKAGE]);
    let fields: Vec<&str> = passwd.trim().split(':').collect();
    let uid: u32 = fields[2].parse().unwrap();
    assert!((100..1000).contains(&uid), "not a system uid: {passwd}");
    assert_eq!(fields[5], DATA, "{passwd}");
    assert!(fields[6].ends_with("nologin"), "{passwd}");
    run_ok("getent", &["group", PACKAGE]);
    let data = std::fs::metadata(DATA).unwrap();
    assert_eq!(data.uid(), uid);
    assert_eq!(data.mode() & 0o7777, 0o750, "{DATA}: {:o}", data.mode());

    // Enabled as Debian does (deb-systemd-helper works without systemd running): the
    // target; not the iSNS and media servers, which must be told what to serve first.
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants");
    assert!(wants.join("reservoir-target.service").exists());
    assert!(!wants.join("reservoir-isns.service").exists());
    assert!(!wants.join("reservoir-media.service").exists());
    verify_installed_units();
    serve_as_the_unit_would();

    // The administrator edits the configuration and adds a sync of their own.
    let mut edited = std::fs::read_to_string(CONFFILE).unwrap();
    edited.push_str("# edited here\n");
    std::fs::write(CONFFILE, &edited).unwrap();
    std::fs::write("/etc/reservoir/sync/site-b", "SOURCE=a/iqn.x:y/0\n").unwrap();

    // Upgrade: the edited conffile is kept (no prompt: standard input is closed).
    dpkg(&["-i", deb2.to_str().unwrap()]);
    assert_eq!(field("Version"), v2);
    assert_eq!(std::fs::read_to_string(CONFFILE).unwrap(), edited);
    assert!(Path::new(DATA).join("lun0.img").exists());

    // Remove: configuration and data stay, the binary goes, so does the enablement.
    dpkg(&["--remove", PACKAGE]);
    assert_eq!(package_status(), "deinstall ok config-files");
    assert!(!Path::new("/usr/bin/rsv").exists());
    assert_eq!(std::fs::read_to_string(CONFFILE).unwrap(), edited);
    assert!(Path::new("/etc/reservoir/sync/site-b").exists());
    assert!(Path::new(DATA).join("lun0.img").exists());

    // Purge: the configuration goes, all of it; the data and the user stay.
    dpkg(&["--purge", PACKAGE]);
    assert!(package_status().is_empty() || package_status().ends_with("not-installed"));
    assert!(
        !Path::new("/etc/reservoir").exists(),
        "/etc/reservoir survived purge"
    );
    assert!(!wants.join("reservoir-target.service").exists());
    assert!(
        Path::new(DATA).join("lun0.img").exists(),
        "purge removed the data"
    );
    assert!(user_exists(), "purge removed the reservoir user");

    // Reinstall: the same user, the kept data, a fresh conffile; it serves again.
    dpkg(&["-i", deb2.to_str().unwrap()]);
    assert_eq!(package_status(), "install ok installed");
    assert_eq!(
        std::fs::read_to_string(CONFFILE).unwrap(),
        std::fs::read_to_string(workspace().join("packaging/target.toml")).unwrap()
    );
    let again = run_ok("getent", &["passwd", PACKAGE]);
    assert_eq!(again, passwd);
    serve_as_the_unit_would();
    eprintln!(
        "install, serve, upgrade, remove, purge, reinstall, serve: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drop(machine);
    assert!(package_status().is_empty() || package_status().ends_with("not-installed"));
}
