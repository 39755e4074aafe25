//! `rsv version`: what the build is and has, as people and scripts read it.

use testkit::{rsv, run_ok};

#[test]
fn version_names_the_build_and_its_kinds() {
    let bin = rsv();
    let bin = bin.to_str().unwrap();
    let json = run_ok(bin, &["version", "--json"]);
    assert_eq!(json.lines().count(), 1, "one object, one line: {json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    // The registry as main.rs builds it: the built-in kinds and the remote one, the
    // librbd one only in a build with the feature.
    let kinds: Vec<&str> = v["store_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    for kind in ["file", "iscsi", "null", "ram", "stripe"] {
        assert!(kinds.contains(&kind), "{kind} missing: {v}");
    }
    assert_eq!(kinds.contains(&"rbd"), cfg!(feature = "rbd"), "{v}");
    let features: Vec<&str> = v["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(features.contains(&"rbd"), cfg!(feature = "rbd"), "{v}");
    assert_eq!(features.contains(&"bpf"), cfg!(feature = "bpf"), "{v}");
    assert_eq!(features.contains(&"man"), cfg!(feature = "man"), "{v}");
    // Built or not, with the reason when not; the kernel's list as the kernel gives it.
    let cc = &v["congestion"];
    assert_eq!(
        cc["rsv_built"].as_bool().unwrap(),
        cc["rsv_not_built"].is_null(),
        "{v}"
    );
    let kernel = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    let listed: Vec<&str> = cc["kernel"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(listed, kernel.split_whitespace().collect::<Vec<_>>(), "{v}");
    // The commit this tree is at, as git says, when built inside the repository (and no
    // RSV_BUILD_COMMIT given); none outside one.
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_owned());
    let commit = v["commit"].as_str();
    // (Not `env!`: the build script's value reaches this test's build too, and would
    // check the binary against itself.)
    match std::env::var("RSV_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        Some(given) => assert_eq!(commit, Some(given.as_str()), "{v}"),
        None => assert_eq!(commit, head.as_deref(), "{v}"),
    }

    // For people: the same facts, one per line.
    let text = run_ok(bin, &["version"]);
    assert!(
        text.starts_with(&format!("rsv {}\n", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(
        text.contains(&format!("commit: {}\n", commit.unwrap_or("unknown"))),
        "{text}"
    );
    assert!(
        text.contains(&format!("store kinds: {}\n", kinds.join(", "))),
        "{text}"
    );
    assert!(text.contains("congestion control rsv: "), "{text}");
    let help = run_ok(bin, &["version", "--help"]);
    assert!(help.contains("--json"), "{help}");
}

/// A reader that stops reading (`rsv version | grep -q rsv`) is no failure of rsv's: it
/// exits 0 and prints no error (it printed "Error: Broken pipe" and exited 1, which broke
/// a script that asked `rsv version | grep -q rbd`).
#[test]
fn version_into_a_closed_pipe_is_quiet() {
    use std::process::{Command, Stdio};
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader); // closed before rsv writes a byte
    let out = Command::new(rsv())
        .arg("version")
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
