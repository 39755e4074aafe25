//! The iSCSI targets of the lab: Reservoir's `rsv target` and tgt, each in a namespace.

use crate::proc::{in_ns, rsv_bin, run_ok, sleep, Proc};
use anyhow::{bail, Result};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub const ISCSI_PORT: u16 = 3260;

/// What an iperf3 client's JSON report (`-J`) says the receiver got: bytes and seconds, 0
/// where the report has none.
pub fn iperf3_received(report: &serde_json::Value) -> (u64, f64) {
    let sum = &report["end"]["sum_received"];
    (
        sum["bytes"].as_u64().unwrap_or(0),
        sum["seconds"].as_f64().unwrap_or(0.0),
    )
}

/// `rsv target` in `ns` listening on `addr`, with the TOML `config` (written to `dir`).
pub fn rsv_target(ns: &str, addr: Ipv4Addr, config: &str, dir: &Path, tag: &str) -> Result<Proc> {
    rsv_target_on(ns, addr, ISCSI_PORT, config, dir, tag)
}

/// As [`rsv_target`], on another port (a second target beside the first).
pub fn rsv_target_on(
    ns: &str,
    addr: Ipv4Addr,
    port: u16,
    config: &str,
    dir: &Path,
    tag: &str,
) -> Result<Proc> {
    let mut p = rsv_target_spawn(ns, addr, port, config, dir, tag)?;
    target_ready(&mut p)?;
    Ok(p)
}

/// As [`rsv_target_on`] without waiting for it: several targets then start at once
/// ([`target_ready`] for each after).
pub fn rsv_target_spawn(
    ns: &str,
    addr: Ipv4Addr,
    port: u16,
    config: &str,
    dir: &Path,
    tag: &str,
) -> Result<Proc> {
    let cfg = dir.join(format!("target-{tag}.toml"));
    std::fs::write(&cfg, config)?;
    let mut cmd = in_ns(ns, rsv_bin());
    cmd.arg("target")
        .arg("--listen")
        .arg(format!("{addr}:{port}"))
        .arg("--data-dir")
        .arg(dir.join(format!("data-{tag}")))
        .arg("--config")
        .arg(&cfg)
        // RSV_LAB_TARGET_LOG=FILTER (e.g. `replicate=debug,initiator=debug`) for a look
        // at what the targets and their agents do; warnings only otherwise.
        .env(
            "RUST_LOG",
            std::env::var("RSV_LAB_TARGET_LOG").unwrap_or_else(|_| "warn".into()),
        );
    Proc::spawn(cmd, "rsv target", &dir.join(format!("target-{tag}.log")))
}

/// Waits until a target started by [`rsv_target_spawn`] says it is ready.
pub fn target_ready(p: &mut Proc) -> Result<()> {
    p.wait_log(Duration::from_secs(20), |l| {
        l.lines().any(|x| x.trim() == "ready")
    })
}

pub struct Tgt {
    pub proc: Proc,
    control: u16,
    pub iqn: String,
}

impl Tgt {
    /// tgtd in `ns` with target 1 / LUN 1 on `backing` (a sparse file of `size` bytes).
    pub fn start(ns: &str, addr: Ipv4Addr, backing: &Path, size: u64, log: &Path) -> Result<Tgt> {
        Self::start_at(ns, &format!("{addr}:{ISCSI_PORT}"), backing, size, log)
    }

    /// As [`Tgt::start`], listening on `portal` (ADDR:PORT).
    pub fn start_at(ns: &str, portal: &str, backing: &Path, size: u64, log: &Path) -> Result<Tgt> {
        // The control socket lives in the file system, shared by every namespace; a port
        // of our own keeps clear of other tgtd instances on the machine.
        let control = 20000 + (std::process::id() % 9000) as u16;
        std::fs::File::create(backing)?.set_len(size)?;
        let mut cmd = in_ns(ns, "tgtd");
        cmd.args(["-f", "--iscsi", &format!("portal={portal}")])
            .args(["-C", &control.to_string()]);
        let proc = Proc::spawn(cmd, "tgtd", log)?;
        let mut t = Tgt {
            proc,
            control,
            iqn: "iqn.2026-11.org.reservoir.lab:tgt".into(),
        };
        let mut up = false;
        for _ in 0..100 {
            if t.adm(&["--op", "show", "--mode", "target"]).is_ok() {
                up = true;
                break;
            }
            if !t.proc.alive() {
                break;
            }
            sleep(Duration::from_millis(50))?;
        }
        if !up {
            bail!("tgtd did not come up:\n{}", t.proc.log_text());
        }
        let iqn = t.iqn.clone();
        t.adm(&["--op", "new", "--mode", "target", "--tid", "1", "-T", &iqn])?;
        t.adm(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            &backing.to_string_lossy(),
        ])?;
        t.adm(&[
            "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
        ])?;
        Ok(t)
    }

    fn adm(&self, args: &[&str]) -> Result<()> {
        run_ok(
            Command::new("tgtadm")
                .args(["-C", &self.control.to_string(), "--lld", "iscsi"])
                .args(args),
        )
        .map(|_| ())
    }
}
