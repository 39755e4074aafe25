//! SCSI conformance: libiscsi's `iscsi-test-cu` with data loss and SANITIZE allowed
//! (`-d -S`), given the multipath URL pair (the same LU through two portals, logged in
//! as the suite's two initiator names, which the target's ACL lists), against Reservoir's
//! LUN variants; zero failures. tgt, run the same way on a file LUN, is printed beside
//! it so that the skip counts can be compared.
//!
//! The suite runs its tests once per family (ALL, then SCSI, iSCSI and LINUX again); the
//! ALL family holds every test once, so that is what runs here. Reruns in one process are
//! not independent: iscsi-test-cu keeps its PDU hooks in globals, and after a first pass
//! through Sanitize.BlockEraseReserved the hook calls itself forever (see
//! `scripts/conformance-vs-tgt.sh`, which runs the families separately).
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{have, rsv};

const IQN: &str = "iqn.2026-11.org.reservoir:conformance";
const INITIATOR_1: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test";
const INITIATOR_2: &str = "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2";

/// Outcome of each test, by "Suite.Test".
#[derive(Debug, Default)]
struct Tally {
    results: BTreeMap<String, Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Passed,
    Failed,
    Skipped,
}

impl Tally {
    /// Reads iscsi-test-cu's verbose output: "Suite: X", "  Test: Y ...", the test's
    /// messages, then "passed" or "FAILED". A test that passed after printing
    /// "[SKIPPED]" did not run.
    fn parse(out: &str) -> Tally {
        let mut t = Tally::default();
        let mut suite = String::new();
        let mut current: Option<(String, String)> = None;
        let finish = |t: &mut Tally, name: String, body: &str, failed: bool| {
            let o = if failed {
                Outcome::Failed
            } else if body.contains("[SKIPPED]") {
                Outcome::Skipped
            } else {
                Outcome::Passed
            };
            // A test run again in a later family keeps its worst outcome.
            let e = t.results.entry(name).or_insert(o);
            if o == Outcome::Failed {
                *e = o;
            }
        };
        for line in out.lines() {
            if let Some(s) = line.strip_prefix("Suite: ") {
                suite = s.trim().to_owned();
                continue;
            }
            if let Some(rest) = line.trim_start().strip_prefix("Test: ") {
                if let Some((name, tail)) = rest.split_once(" ...") {
                    let name = format!("{suite}.{name}");
                    let tail = tail.trim_start();
                    if tail.starts_with("passed") || tail.starts_with("FAILED") {
                        finish(&mut t, name, "", tail.starts_with("FAILED"));
                    } else {
                        current = Some((name, tail.to_owned()));
                    }
                    continue;
                }
            }
            if let Some((name, mut body)) = current.take() {
                if line.starts_with("passed") || line.starts_with("FAILED") {
                    finish(&mut t, name, &body, line.starts_with("FAILED"));
                } else {
                    body.push_str(line);
                    body.push('\n');
                    current = Some((name, body));
                }
            }
        }
        t
    }

    fn count(&self, o: Outcome) -> usize {
        self.results.values().filter(|&&x| x == o).count()
    }

    fn names(&self, o: Outcome) -> Vec<&str> {
        self.results
            .iter()
            .filter(|(_, &x)| x == o)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    fn summary(&self, who: &str) -> String {
        format!(
            "{who}: {} tests, passed {}, failed {}, skipped {}\n  failed: {}\n  skipped: {}",
            self.results.len(),
            self.count(Outcome::Passed),
            self.count(Outcome::Failed),
            self.count(Outcome::Skipped),
            self.names(Outcome::Failed).join(" "),
            self.names(Outcome::Skipped).join(" "),
        )
    }
}

/// Runs iscsi-test-cu, killing it if it outlives `limit`.
fn suite(args: &[&str], limit: Duration, log: &Path) -> String {
    let mut child = Command::new("iscsi-test-cu")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting iscsi-test-cu");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let deadline = Instant::now() + limit;
    let timed_out = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = reader.join().unwrap();
    std::fs::write(log, &out).unwrap();
    assert!(
        !timed_out,
        "iscsi-test-cu {args:?} ran longer than {limit:?}; output in {}:\n{}",
        log.display(),
        &out[out.len().saturating_sub(3000)..]
    );
    out
}

struct Reservoir {
    child: Child,
    portals: Vec<String>,
}

impl Drop for Reservoir {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rsv target` on two OS-chosen loopback ports.
fn start_reservoir(dir: &Path) -> Reservoir {
    let config = format!(
        r#"
[[target]]
iqn = "{IQN}"
allowed_initiators = ["{INITIATOR_1}", "{INITIATOR_2}"]

# Thin, removable, on a sparse file: the main LUN, with APTPL reservations beside it.
[[target.lun]]
id = 0
backstore = "file"
path = "lun0.img"
size = "64MiB"
removable = true

# Write-protected: the suite's read-only tests.
[[target.lun]]
id = 1
backstore = "ram"
size = "16MiB"
read_only = true
"#
    );
    let cfg = dir.join("target.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut child = Command::new(rsv())
        .args([
            "target",
            "--listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("target.log")).unwrap(),
        ))
        .spawn()
        .expect("starting rsv target");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut portals = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!(
                "rsv target exited before ready:\n{}",
                std::fs::read_to_string(dir.join("target.log")).unwrap_or_default()
            );
        }
        match line.trim() {
            "ready" => break,
            l => {
                if let Some(p) = l.strip_prefix("portal ") {
                    portals.push(p.to_owned());
                }
            }
        }
    }
    assert_eq!(portals.len(), 2, "two portals");
    Reservoir { child, portals }
}

#[test]
fn libiscsi_suite_has_no_failures() {
    if !have("iscsi-test-cu") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = start_reservoir(dir.path());
    let url = |portal: &str, lun: u16| format!("iscsi://{portal}/{IQN}/{lun}");
    let (a, b) = (url(&target.portals[0], 0), url(&target.portals[1], 0));

    let out = suite(
        &["-d", "-S", "-t", "ALL", &a, &b],
        Duration::from_secs(900),
        &dir.path().join("suite-lun0.txt"),
    );
    let main = Tally::parse(&out);
    println!(
        "{}",
        main.summary("Reservoir, thin removable file LUN, two portals")
    );

    // The tests that need a write-protected LU, against one.
    let ro = url(&target.portals[0], 1);
    let mut ro_out = String::new();
    for t in ["ALL.ReadOnly", "ALL.Sanitize.Readonly"] {
        ro_out += &suite(
            &["-d", "-S", "-t", t, &ro],
            Duration::from_secs(300),
            &dir.path().join("suite-lun1.txt"),
        );
    }
    let ro_tally = Tally::parse(&ro_out);
    println!("{}", ro_tally.summary("Reservoir, read-only LUN"));

    // A test skipped on the main LUN but run on the read-only one is not a gap.
    let still_skipped: Vec<&str> = main
        .names(Outcome::Skipped)
        .into_iter()
        .filter(|n| ro_tally.results.get(*n) != Some(&Outcome::Passed))
        .collect();
    println!(
        "Reservoir, all LUN variants: {} tests, failed {}, skipped {} ({})",
        main.results.len(),
        main.count(Outcome::Failed) + ro_tally.count(Outcome::Failed),
        still_skipped.len(),
        still_skipped.join(" ")
    );
    println!("tgt with the same flags: scripts/conformance-vs-tgt.sh");

    assert!(
        main.results.len() > 200,
        "suite output not understood:\n{out}"
    );
    assert_eq!(
        main.count(Outcome::Failed),
        0,
        "failures:\n{}",
        main.summary("Reservoir")
    );
    assert_eq!(
        ro_tally.count(Outcome::Failed),
        0,
        "{}",
        ro_tally.summary("read-only")
    );
    assert!(
        ro_tally.results.get("ReadOnly.ReadOnlySBC") == Some(&Outcome::Passed),
        "the read-only LUN must run ReadOnlySBC:\n{ro_out}"
    );
    drop(target);
}

#[test]
fn tally_reads_suite_output() {
    let out = "Suite: Read10\n  Test: Simple ...passed\n  Test: Odd ...    [SKIPPED] no\npassed\n\
               Suite: Write10\n  Test: Bad ...    [FAILED] x\nFAILED\n    1. a.c:1 - x\n";
    let t = Tally::parse(out);
    assert_eq!(t.results["Read10.Simple"], Outcome::Passed);
    assert_eq!(t.results["Read10.Odd"], Outcome::Skipped);
    assert_eq!(t.results["Write10.Bad"], Outcome::Failed);
}
