//! Reading and checking a Prometheus text exposition as the tests of `/metrics` do: a
//! series' value, the sum of the series that match, a scrape with curl, and promtool's lint.

use std::io::Write;
use std::process::{Command, Stdio};

/// The value of the series `name` (with its labels, as written) in a text exposition; 0
/// when absent.
pub fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .sum()
}

/// The series of a text exposition whose name and labels contain every one of `parts`,
/// summed.
pub fn sum(text: &str, parts: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// `http://ADDR/metrics` fetched by curl, which must succeed (`-f`: an HTTP error fails).
pub fn scrape(addr: &str) -> String {
    crate::run_ok("curl", &["-sf", &format!("http://{addr}/metrics")])
}

/// `promtool check metrics` must pass `text` (it lints the Prometheus text format).
pub fn promtool_check(text: &str) {
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
