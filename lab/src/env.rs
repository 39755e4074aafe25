//! What a result was measured with: tool versions and the machine.

use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Environment {
    pub date_utc: String,
    pub rsv: String,
    /// Which build of `rsv` ran (debug or release), by path: the one beside `rsv-lab`.
    pub rsv_binary: String,
    /// The commit `rsv-lab` was built from (`-dirty`: with changes to tracked files); the
    /// `rsv` beside it comes from the same build when both are built together.
    pub git_commit: String,
    pub tgtd: String,
    pub qemu_img: String,
    pub iperf3: String,
    pub kernel: String,
    pub nproc: String,
    pub cpu: String,
    pub memory: String,
    pub load_average: String,
}

/// First non-empty line of a command's output (stdout, else stderr), or "unavailable".
fn first_line(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unavailable".into())
}

fn proc_field(file: &str, key: &str) -> String {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// /proc/loadavg as it reads (the three averages, running/all tasks, the last PID), for
/// a run's before and after.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

pub fn collect() -> Environment {
    let rsv = crate::proc::rsv_bin();
    let rsv = first_line(&rsv.to_string_lossy(), &["--version"]);
    // dpkg knows tgt's version; tgtd itself only prints usage.
    let tgtd = first_line("dpkg-query", &["-W", "-f=${Version}", "tgt"]);
    Environment {
        date_utc: first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        rsv,
        rsv_binary: crate::proc::rsv_bin().display().to_string(),
        git_commit: env!("RSV_BUILD_COMMIT").to_owned(),
        tgtd: format!("tgt {tgtd}"),
        qemu_img: first_line("qemu-img", &["--version"]),
        iperf3: first_line("iperf3", &["--version"]),
        kernel: first_line("uname", &["-sr"]),
        nproc: first_line("nproc", &[]),
        cpu: proc_field("/proc/cpuinfo", "model name"),
        memory: proc_field("/proc/meminfo", "MemTotal"),
        load_average: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
    }
}
