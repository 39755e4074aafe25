//! The default congestion control: `rsv` wherever the process can load it (root, or the
//! packaged target unit's capabilities), else BBR or CUBIC with one log line naming what
//! was missing; an explicit `congestion=` wins. Checked on both ends as processes: the
//! target's status, its `/metrics` and its log; `rsv tune --json` run as root, as an
//! unprivileged user with the unit's capabilities (`setpriv`), and with none. Needs root
//! and a build with the BPF program; elsewhere it prints SKIP (fails when strict).

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::{have, rsv, run_json, run_ok, skip, Target};

const IQN: &str = "iqn.2026-11.org.reservoir:ccdefault";

/// The capabilities `packaging/systemd/reservoir-target.service` grants (ambient), less
/// CAP_NET_BIND_SERVICE, which the load does not use.
const UNIT_CAPS: &str = "+bpf,+perfmon,+net_admin";

fn config(dir: &Path) -> String {
    format!(
        "[control]\nsocket = \"{}\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nstore = \"ram:?size=8MiB\"\n",
        dir.join("control.sock").display()
    )
}

/// Whether the host can run the test: root, BTF, a build with the program.
fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("needs root (loads BPF)");
        return false;
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        skip("the kernel has no BTF");
        return false;
    }
    let v = run_json(Command::new(rsv()).args(["version", "--json"]));
    if v["congestion"]["rsv_built"] != true {
        skip(&format!(
            "rsv not built: {}",
            v["congestion"]["rsv_not_built"]
        ));
        return false;
    }
    have("setpriv") && have("curl")
}

/// A copy of the binary an unprivileged user may run (the build tree may be closed).
fn public_copy(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("rsv");
    std::fs::copy(rsv(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// `rsv tune URL --json` as `user` (None: this process's) with these ambient
/// capabilities; the session's JSON and the log lines that name the choice.
fn tune(
    bin: &Path,
    url: &str,
    user: Option<&str>,
    caps: &str,
    opts: &[&str],
) -> (serde_json::Value, Vec<String>) {
    let mut cmd = match user {
        None => Command::new(bin),
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", u, "--regid", "nogroup", "--clear-groups"]);
            if !caps.is_empty() {
                c.args(["--inh-caps", caps, "--ambient-caps", caps]);
            }
            c.arg(bin);
            c
        }
    };
    cmd.args(["tune", url, "--json"])
        .args(opts)
        .env("RSV_PATH_CACHE", "off")
        .env("RUST_LOG", "info");
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The plan's reasons (auto-tuning's lines) repeat the choice; the rest say it once.
    let lines = err
        .lines()
        .filter(|l| l.contains("congestion control") && !l.contains("auto-tuning"))
        .map(str::to_owned)
        .collect();
    (v["session"].clone(), lines)
}

/// `rsv target status --json` of `t`, through its control socket.
fn status(t: &Target) -> serde_json::Value {
    let socket = t.control_socket.as_deref().unwrap();
    run_json(
        Command::new(rsv())
            .args(["target", "status", "--json", "--control"])
            .arg(socket),
    )
}

fn by_connection(s: &serde_json::Value) -> Vec<String> {
    s["congestion_by_connection"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn rsv_is_the_default_where_it_loads_and_the_fallback_says_why() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let t = Target::start_in(dir, Some(&c));
    let url = t.url(0);

    // The target decided at start, once, and says so in its log, status and metrics.
    let log = t.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("congestion control"))
        .collect();
    assert_eq!(said.len(), 1, "one line: {log}");
    assert!(said[0].contains("congestion control: rsv"), "{log}");
    let status = status(&t);
    assert_eq!(status["congestion"]["name"], "rsv", "{status}");
    assert_eq!(status["congestion"]["by"], "default", "{status}");
    let metrics = run_ok(
        "curl",
        &[
            "-sf",
            &format!("http://{}/metrics", t.metrics.as_ref().unwrap()),
        ],
    );
    assert!(
        metrics.contains("rsv_target_congestion_info{congestion=\"rsv\",by=\"default\"} 1"),
        "{metrics}"
    );

    let bin_dir = tempfile::tempdir().unwrap();
    let bin = public_copy(bin_dir.path());

    // Root: rsv by default, on every connection; the choice said once.
    let (s, lines) = tune(&bin, &url, None, "", &["--opt", "connections=2"]);
    assert_eq!(s["congestion_choice"]["by"], "default", "{s}");
    assert_eq!(s["congestion_choice"]["name"], "rsv", "{s}");
    assert_eq!(by_connection(&s), ["rsv", "rsv"], "{s}");
    assert_eq!(lines.len(), 1, "{lines:?}");

    // An unprivileged user with the packaged unit's capabilities: rsv too.
    let (s, lines) = tune(&bin, &url, Some("nobody"), UNIT_CAPS, &[]);
    assert_eq!(s["congestion_choice"]["name"], "rsv", "{s}");
    assert_eq!(by_connection(&s), ["rsv"], "{s}");
    assert_eq!(lines.len(), 1, "{lines:?}");

    // Without them: the kernel's BBR (or CUBIC where BBR is not allowed to all), and the
    // one line names the capabilities missing.
    let (s, lines) = tune(&bin, &url, Some("nobody"), "", &[]);
    let name = s["congestion_choice"]["name"].as_str().unwrap().to_owned();
    assert!(name == "bbr" || name == "cubic", "{s}");
    assert_eq!(by_connection(&s), [name.as_str()], "{s}");
    assert_eq!(
        s["congestion_choice"]["rsv_missing"]["kind"], "no_rights",
        "{s}"
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("missing CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN"),
        "{lines:?}"
    );
    // One capability short of the unit's: named alone.
    let (s, lines) = tune(&bin, &url, Some("nobody"), "+bpf,+perfmon", &[]);
    assert_ne!(s["congestion_choice"]["name"], "rsv", "{s}");
    assert!(lines[0].contains("missing CAP_NET_ADMIN ("), "{lines:?}");

    // An explicit option wins, as root too.
    let (s, _) = tune(&bin, &url, None, "", &["--opt", "congestion=cubic"]);
    assert_eq!(s["congestion_choice"]["by"], "option", "{s}");
    assert_eq!(by_connection(&s), ["cubic"], "{s}");
}

/// The target configured with a congestion control runs it, says who chose it, and
/// loads nothing.
#[test]
fn a_configured_congestion_control_wins_on_the_target() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let c = format!("{}[session]\ncongestion = \"cubic\"\n", config(dir.path()));
    let t = Target::start_in(dir, Some(&c));
    let status = status(&t);
    assert_eq!(status["congestion"]["name"], "cubic", "{status}");
    assert_eq!(status["congestion"]["by"], "configured", "{status}");
    let log = t.log();
    assert!(!log.contains("congestion control: rsv"), "{log}");
}
