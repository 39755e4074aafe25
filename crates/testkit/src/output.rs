//! What a finished command printed, for a test's assertions and its failure messages.

use std::process::{Command, Output};

/// A command's standard output then its standard error, as text.
pub fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, which must succeed (a failure shows all it printed), and returns its
/// standard output.
pub fn ok_stdout(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        said(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
