//! R3: what securing the transport costs. Sequential 1 MiB reads and writes with `rsv
//! bench` (one connection, QD 16) on loopback and over an emulated 1 Gbit/s, 1 ms link:
//! Reservoir in plaintext and over TLS 1.3 (each suite rustls offers), tgt in plaintext
//! and tgt behind an stunnel server. Throughput, CPU seconds per GB on each side, and the
//! bursts the sender makes, from a short capture of each (tcpdump in the sender's
//! namespace, analysed by `rsv-lab timing`'s library); the timeline of plaintext and TLS reads
//! side by side, as R3's figures draw them.
//!
//! The initiator is Reservoir's own `rsv bench` on every row, TLS included (it speaks TLS
//! itself, so tgt behind stunnel is reached without a second, client-side tunnel whose CPU
//! would land on the initiator's side): only the target side changes between rows.

use crate::env::Environment;
use crate::peers::Tgt;
use crate::proc::{self, check_interrupt, in_ns, rsv_bin, run_ok, Link, Proc};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const IQN: &str = "iqn.2026-11.org.reservoir:lab-r3";
const RSV_PLAIN: u16 = 3260;
const RSV_TLS: u16 = 3261;
const TGT: u16 = 3262;
const STUNNEL: u16 = 3263;
/// The emulator's name: namespaces r3-a and r3-b, apart from the other scenarios'.
const LINK: &str = "r3";

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct PathSpec {
    pub key: String,
    pub label: String,
    /// `rsv-lab wan` parameters; none: loopback inside site b.
    pub wan: Vec<String>,
    pub rate_bps: Option<u64>,
    /// Seconds per measurement on this path.
    pub seconds: u64,
    /// Only Reservoir in plaintext and with the first suite (the long R0 path).
    pub reservoir_only: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    pub paths: Vec<PathSpec>,
    pub directions: Vec<String>,
    pub suites: Vec<String>,
    pub block_size: String,
    pub queue_depth: u32,
    pub capture_seconds: u64,
    pub lun_bytes: u64,
}

/// `rsv-lab run r3`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Documented,
    /// Seconds per measurement on every path instead of each path's own (8, R0's link 20;
    /// --quick 1).
    #[arg(long)]
    pub seconds: Option<u64>,
}

impl Args {
    pub fn params(&self) -> Params {
        let mut p = Params::new(self.flags.common.quick);
        if let Some(s) = self.seconds {
            for path in &mut p.paths {
                path.seconds = s;
            }
        }
        p
    }
}

impl Params {
    pub fn new(quick: bool) -> Params {
        let gig = PathSpec {
            key: "1gbit-1ms".into(),
            label: "1 Gbit/s, 1 ms RTT (rsv-lab wan)".into(),
            wan: vec![
                "--rate".into(),
                "1gbit".into(),
                "--rtt".into(),
                "1ms".into(),
            ],
            rate_bps: Some(1_000_000_000),
            seconds: if quick { 1 } else { 8 },
            reservoir_only: false,
        };
        let lo = PathSpec {
            key: "loopback".into(),
            label: "loopback (both ends in one namespace)".into(),
            wan: Vec::new(),
            rate_bps: None,
            seconds: if quick { 1 } else { 8 },
            reservoir_only: false,
        };
        let mut paths = vec![lo, gig];
        if !quick {
            paths.push(PathSpec {
                key: "r0".into(),
                label: "R0's link: 100 Mbit/s, 100 ms RTT, 1 % loss".into(),
                wan: vec![
                    "--rate".into(),
                    "100mbit".into(),
                    "--rtt".into(),
                    "100ms".into(),
                    "--loss".into(),
                    "1%".into(),
                ],
                rate_bps: Some(100_000_000),
                seconds: 20,
                reservoir_only: true,
            });
        }
        Params {
            paths,
            // Writes first, so that the reads move data: a RAM LUN never written reads
            // as zeros, which the store lends from no buffer of its own, and a sparse
            // tgt file reads its holes from the kernel's zero page.
            directions: if quick {
                vec!["read".into()]
            } else {
                vec!["write".into(), "read".into()]
            },
            suites: if quick {
                vec!["aes128".into()]
            } else {
                vec!["aes128".into(), "aes256".into(), "chacha20".into()]
            },
            block_size: "1M".into(),
            queue_depth: 16,
            capture_seconds: 1,
            lun_bytes: if quick { 256 << 20 } else { 1 << 30 },
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct BurstSummary {
    pub packets: u64,
    pub bursts: usize,
    pub median_segments: f64,
    pub p90_segments: f64,
    pub median_gap_us: f64,
    pub single_packet_pct: f64,
    pub rule: String,
    /// What tcpdump said it dropped.
    pub dropped: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Row {
    pub path: String,
    pub direction: String,
    /// reservoir-plain, reservoir-tls, tgt-plain, tgt-stunnel.
    pub config: String,
    pub label: String,
    /// The TLS suite negotiated ("" in plaintext).
    pub suite: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    /// CPU seconds per GB (10^9 bytes) moved: the target (rsv target or tgtd), the TLS
    /// tunnel in front of it (stunnel), the initiator (rsv bench).
    pub target_cpu_s_per_gb: f64,
    pub tunnel_cpu_s_per_gb: f64,
    pub initiator_cpu_s_per_gb: f64,
    pub bursts: Option<BurstSummary>,
    pub error: String,
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    pub environment: Environment,
    pub load_before: String,
    pub load_after: String,
    pub rows: Vec<Row>,
}

/// utime + stime of a process, seconds.
fn cpu_of(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let f: Vec<&str> = s
        .rsplit_once(')')
        .map_or(vec![], |(_, r)| r.split_whitespace().collect());
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let n = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (n(11) + n(12)) / tick
}

/// CPU seconds of our waited-for children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Certs {
    cert: PathBuf,
    key: PathBuf,
    pin: String,
}

fn make_certs(dir: &Path, addr: Ipv4Addr) -> Result<Certs> {
    let cert = dir.join("r3.crt");
    let key = dir.join("r3.key");
    run_ok(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "2", "-subj", "/CN=reservoir-lab-r3"])
            .arg("-addext")
            .arg(format!("subjectAltName=IP:127.0.0.1,IP:{addr}"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
    )
    .context("making the TLS certificate (openssl)")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    let der = net::tls::read_certs(&cert).map_err(|e| anyhow!("{e}"))?;
    let pin = net::tls::fingerprint_text(&net::tls::fingerprint(&der[0]));
    Ok(Certs { cert, key, pin })
}

struct Site {
    ns: String,
    /// Where the initiator runs and the address it dials.
    client_ns: String,
    addr: Ipv4Addr,
}

pub fn run(params: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    proc::require("r3", &["tcpdump", "stunnel", "tgtd", "openssl"])?;
    let environment = crate::env::collect();
    let load_before = crate::env::loadavg();
    // Each namespace defaults to cubic (`r0::linux_default_tcp`), which a namespace may
    // only choose when the host allows it: added for the run, the list put back after.
    let _cc = proc::AllowedCc::ensure(&["cubic"])?;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "r3")?;
    let dir = &scratch.0;
    let mut rows = Vec::new();
    let mut timeline: Vec<(String, PathBuf)> = Vec::new();
    for path in &params.paths {
        check_interrupt()?;
        eprintln!("r3: {}", path.label);
        let wan: Vec<String> = if path.wan.is_empty() {
            // Loopback runs inside site b of a link too: its own namespace, its own ports.
            vec![
                "--rate".into(),
                "1gbit".into(),
                "--rtt".into(),
                "1ms".into(),
            ]
        } else {
            path.wan.clone()
        };
        let link = Link::up(LINK, &wan, 1)?;
        crate::r0::set_tcp(&link, &crate::r0::linux_default_tcp())?;
        let (b_ns, b_addr) = (link.b[0].ns.clone(), link.b[0].addr);
        let site = if path.wan.is_empty() {
            Site {
                ns: b_ns.clone(),
                client_ns: b_ns.clone(),
                addr: Ipv4Addr::LOCALHOST,
            }
        } else {
            Site {
                ns: b_ns.clone(),
                client_ns: link.a[0].ns.clone(),
                addr: b_addr,
            }
        };
        let certs = make_certs(dir, b_addr)?;
        rows.extend(run_path(&params, path, &site, &certs, dir, &mut timeline)?);
        drop(link);
    }
    let load_after = crate::env::loadavg();
    let results = Results {
        run: crate::results::Run::new("r3", quick, command, params),
        environment,
        load_before,
        load_after,
        rows,
    };
    crate::results::save_with_csv(
        out,
        "r3",
        &results,
        "scenario,path,direction,config,suite,bytes,seconds,mb_per_s,target_cpu_s_per_gb,tunnel_cpu_s_per_gb,initiator_cpu_s_per_gb,burst_median_segments,burst_p90_segments,error",
        results.rows.iter().map(|r| {
            let b = r.bursts.clone().unwrap_or_default();
            format!(
                "r3,{},{},{},{},{},{:.3},{:.1},{:.3},{:.3},{:.3},{},{},{}",
                r.path,
                r.direction,
                r.config,
                r.suite,
                r.bytes,
                r.seconds,
                r.mb_per_s,
                r.target_cpu_s_per_gb,
                r.tunnel_cpu_s_per_gb,
                r.initiator_cpu_s_per_gb,
                b.median_segments,
                b.p90_segments,
                r.error.replace(',', ";")
            )
        }),
    )?;
    // Plaintext and TLS reads over the emulated link, side by side.
    let opts = timing::Options {
        burst: timing::BurstRule::Link {
            rate_bps: 1_000_000_000,
        },
        no_iscsi: true,
        ..Default::default()
    };
    let mut reports = Vec::new();
    for (title, cap) in &timeline {
        if let Ok(r) = timing::analyse_file(cap, &opts, true) {
            reports.push((title.clone(), r));
        }
    }
    let panels: Vec<timing::plot::Panel<'_>> = reports
        .iter()
        .filter_map(|(t, r)| {
            r.connections
                .iter()
                .max_by_key(|c| c.to_client.payload_bytes)
                .map(|c| timing::plot::Panel {
                    title: t.clone(),
                    conn: c,
                })
        })
        .collect();
    if panels.len() == 2 {
        // 3 ms from the middle of the plaintext capture's data, the same stretch of the TLS one.
        let mid = |p: &timing::plot::Panel<'_>| {
            let pts = &timing::plot::busier(p.conn).0.points;
            pts.get(pts.len() / 2).map_or(0.0, |x| x.t_ns as f64 / 1e6)
        };
        let png = out.join("r3-timeline.png");
        // Each panel gets its own window: draw them one at a time into one picture.
        draw_side_by_side(&png, &panels, mid)?;
    }
    Ok(results)
}

fn draw_side_by_side(
    png: &Path,
    panels: &[timing::plot::Panel<'_>],
    mid: impl Fn(&timing::plot::Panel<'_>) -> f64,
) -> Result<()> {
    // The windows differ per panel, so each is drawn from its own middle: the plot
    // function takes one window for all; shift each connection's points instead.
    let shifted: Vec<timing::analysis::Connection> = panels
        .iter()
        .map(|p| {
            let mut c = p.conn.clone();
            let off = (mid(p) * 1e6) as u64;
            for d in [&mut c.to_client, &mut c.to_server] {
                d.points.retain(|x| x.t_ns >= off);
                for x in &mut d.points {
                    x.t_ns -= off;
                }
                d.acks.retain(|x| x.0 >= off);
                for a in &mut d.acks {
                    a.0 -= off;
                }
            }
            c
        })
        .collect();
    let ps: Vec<_> = panels
        .iter()
        .zip(&shifted)
        .map(|(p, c)| timing::plot::Panel {
            title: p.title.clone(),
            conn: c,
        })
        .collect();
    timing::plot::timeline(png, &ps, Some(0.0), Some(3.0))
}

struct Config {
    key: &'static str,
    label: String,
    suite: Option<String>,
    port: u16,
    url: String,
    tgt: bool,
}

fn run_path(
    p: &Params,
    path: &PathSpec,
    site: &Site,
    certs: &Certs,
    dir: &Path,
    timeline: &mut Vec<(String, PathBuf)>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let a = site.addr;
    // Reservoir: one target, a plaintext and a TLS portal on 127.0.0.1 and site b's address.
    let b_addr = if a == Ipv4Addr::LOCALHOST {
        None
    } else {
        Some(a)
    };
    let mut portals = vec![
        format!("\"127.0.0.1:{RSV_PLAIN}\""),
        format!(
            "{{ listen = \"127.0.0.1:{RSV_TLS}\", tls = {{ cert = \"{}\", key = \"{}\" }} }}",
            certs.cert.display(),
            certs.key.display()
        ),
    ];
    if let Some(b) = b_addr {
        portals.push(format!("\"{b}:{RSV_PLAIN}\""));
        portals.push(format!(
            "{{ listen = \"{b}:{RSV_TLS}\", tls = {{ cert = \"{}\", key = \"{}\" }} }}",
            certs.cert.display(),
            certs.key.display()
        ));
    }
    let cfg = format!(
        "portals = [{}]\n[[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nstore = \"ram:?size={}\"\n",
        portals.join(", "),
        p.lun_bytes
    );
    let cfg_path = dir.join(format!("target-{}.toml", path.key));
    std::fs::write(&cfg_path, cfg)?;
    let mut cmd = in_ns(&site.ns, rsv_bin());
    cmd.arg("target")
        .arg("--config")
        .arg(&cfg_path)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("RUST_LOG", "warn");
    let mut target = Proc::spawn(
        cmd,
        "rsv target",
        &dir.join(format!("target-{}.log", path.key)),
    )?;
    target.wait_log(Duration::from_secs(20), |l| {
        l.lines().any(|x| x.trim() == "ready")
    })?;

    let mut configs = vec![Config {
        key: "reservoir-plain",
        label: "Reservoir, plain TCP".into(),
        suite: None,
        port: RSV_PLAIN,
        url: format!("iscsi://{a}:{RSV_PLAIN}/{IQN}/0"),
        tgt: false,
    }];
    let suites = if path.reservoir_only {
        &p.suites[..p.suites.len().min(1)]
    } else {
        &p.suites[..]
    };
    for s in suites {
        configs.push(Config {
            key: "reservoir-tls",
            label: format!("Reservoir, TLS {s}"),
            suite: Some(s.clone()),
            port: RSV_TLS,
            url: format!(
                "iscsi://{a}:{RSV_TLS}/{IQN}/0?pin={}&tls_suite={s}",
                certs.pin
            ),
            tgt: false,
        });
    }
    let tgt_iqn = "iqn.2026-11.org.reservoir.lab:tgt";
    configs.push(Config {
        key: "tgt-plain",
        label: "tgt, plain TCP".into(),
        suite: None,
        port: TGT,
        url: format!("iscsi://{a}:{TGT}/{tgt_iqn}/1"),
        tgt: true,
    });
    // stunnel (OpenSSL, TLS 1.3) takes the suite the initiator offers, so tgt behind it
    // runs each suite as Reservoir does: on loopback, where each suite's "2 × tgt behind
    // stunnel" goal is computed, one row per suite (each suite against the same cipher);
    // elsewhere the first suite only.
    let tgt_suites = if path.key == "loopback" {
        &p.suites[..]
    } else {
        &p.suites[..p.suites.len().min(1)]
    };
    for s in tgt_suites {
        configs.push(Config {
            key: "tgt-stunnel",
            label: format!("tgt behind stunnel, TLS {s}"),
            suite: Some(s.clone()),
            port: STUNNEL,
            url: format!(
                "iscsi://{a}:{STUNNEL}/{tgt_iqn}/1?pin={}&tls_suite={s}",
                certs.pin
            ),
            tgt: true,
        });
    }

    if path.reservoir_only {
        configs.retain(|c| !c.tgt);
    }
    // tgt (file on tmpfs) and stunnel in front of it.
    let tgt = Tgt::start_at(
        &site.ns,
        &format!("0.0.0.0:{TGT}"),
        &dir.join("tgt.img"),
        p.lun_bytes,
        &dir.join(format!("tgtd-{}.log", path.key)),
    );
    let stunnel = match &tgt {
        Ok(_) => {
            let conf = dir.join("stunnel.conf");
            std::fs::write(
                &conf,
                format!(
                    "foreground = yes\npid =\n[iscsi]\naccept = 0.0.0.0:{STUNNEL}\nconnect = 127.0.0.1:{TGT}\n\
                     cert = {}\nkey = {}\nsslVersionMin = TLSv1.3\n",
                    certs.cert.display(),
                    certs.key.display()
                ),
            )?;
            let mut c = in_ns(&site.ns, "stunnel");
            c.arg(&conf);
            let mut s = Proc::spawn(c, "stunnel", &dir.join("stunnel.log"))?;
            proc::wait_listen(&site.ns, STUNNEL, &mut s).map(|()| s)
        }
        Err(e) => Err(anyhow!("tgtd: {e:#}")),
    };

    for rw in &p.directions {
        for c in &configs {
            check_interrupt()?;
            let mut row = Row {
                path: path.key.clone(),
                direction: rw.clone(),
                config: c.key.into(),
                label: c.label.clone(),
                suite: String::new(),
                bytes: 0,
                seconds: 0.0,
                mb_per_s: 0.0,
                target_cpu_s_per_gb: 0.0,
                tunnel_cpu_s_per_gb: 0.0,
                initiator_cpu_s_per_gb: 0.0,
                bursts: None,
                error: String::new(),
            };
            let (tpid, spid) = if c.tgt {
                match (&tgt, &stunnel) {
                    (Ok(t), Ok(s)) => (
                        t.proc.pid(),
                        if c.key == "tgt-stunnel" {
                            s.pid()
                        } else {
                            None
                        },
                    ),
                    (Err(e), _) | (_, Err(e)) => {
                        row.error = format!("{e:#}").replace('\n', " ");
                        rows.push(row);
                        continue;
                    }
                }
            } else {
                (target.pid(), None)
            };
            if let Err(e) = measure(p, path, site, c, rw, tpid, spid, dir, &mut row) {
                row.error = format!("{e:#}").replace('\n', " ");
            }
            if row.error.is_empty() {
                let cap = dir.join(format!(
                    "cap-{}-{}-{}-{}.pcap",
                    path.key,
                    rw,
                    c.key,
                    c.suite.as_deref().unwrap_or("plain")
                ));
                match capture(p, path, site, c, rw, &cap, dir) {
                    Ok(b) => row.bursts = Some(b),
                    Err(e) => row.error = format!("capture: {e:#}").replace('\n', " "),
                }
                let first_tls = c.key == "reservoir-tls"
                    && c.suite.as_deref() == p.suites.first().map(String::as_str);
                if path.key == "1gbit-1ms"
                    && rw == "read"
                    && (c.key == "reservoir-plain" || first_tls)
                {
                    timeline.push((format!("{} read, 1 Gbit/s 1 ms", c.label), cap));
                } else {
                    let _ = std::fs::remove_file(&cap);
                }
            }
            eprintln!(
                "  {:<6} {:<40} {:>8.1} MB/s  CPU s/GB target {:.3} tunnel {:.3} initiator {:.3}{}{}",
                rw,
                c.label,
                row.mb_per_s,
                row.target_cpu_s_per_gb,
                row.tunnel_cpu_s_per_gb,
                row.initiator_cpu_s_per_gb,
                row.bursts.as_ref().map_or(String::new(), |b| format!(
                    "  bursts median {:.0} p90 {:.0} segments",
                    b.median_segments, b.p90_segments
                )),
                if row.error.is_empty() { String::new() } else { format!("  ({})", row.error) }
            );
            rows.push(row);
        }
    }
    if !target.alive() {
        bail!(
            "rsv target died during the run:\n{}",
            proc::tail(&target.log_text(), 2000)
        );
    }
    target.stop();
    drop(stunnel);
    drop(tgt);
    let _ = std::fs::remove_file(dir.join("tgt.img"));
    Ok(rows)
}

fn bench_cmd(p: &Params, site: &Site, c: &Config, rw: &str, seconds: u64) -> Command {
    let mut b = in_ns(&site.client_ns, rsv_bin());
    b.args(["bench", &c.url, "--json", "--pattern", "seq", "--rw", rw])
        .args(["--block-size", &p.block_size])
        .args(["--queue-depth", &p.queue_depth.to_string()])
        .args(["--connections", "1", "--duration", &seconds.to_string()]);
    b
}

#[allow(clippy::too_many_arguments)]
fn measure(
    p: &Params,
    path: &PathSpec,
    site: &Site,
    c: &Config,
    rw: &str,
    target_pid: Option<u32>,
    tunnel_pid: Option<u32>,
    dir: &Path,
    row: &mut Row,
) -> Result<()> {
    let (t0, s0, i0) = (cpu_of(target_pid), cpu_of(tunnel_pid), children_cpu());
    let o = proc::run(
        bench_cmd(p, site, c, rw, path.seconds),
        Duration::from_secs(path.seconds + 60),
        dir,
    )?;
    let (t1, s1, i1) = (cpu_of(target_pid), cpu_of(tunnel_pid), children_cpu());
    let v: Value =
        serde_json::from_str(&o.stdout).map_err(|_| anyhow!("rsv bench: {}", o.describe()))?;
    let ios = v["ios"].as_u64().unwrap_or(0);
    let bs = v["block_size"].as_u64().unwrap_or(0);
    let secs = v["seconds"].as_f64().unwrap_or(0.0);
    row.bytes = ios * bs;
    row.seconds = secs;
    if secs <= 0.0 || row.bytes == 0 {
        bail!("rsv bench moved nothing: {}", o.describe());
    }
    row.mb_per_s = row.bytes as f64 / secs / 1e6;
    let gb = row.bytes as f64 / 1e9;
    row.target_cpu_s_per_gb = (t1 - t0) / gb;
    row.tunnel_cpu_s_per_gb = (s1 - s0) / gb;
    row.initiator_cpu_s_per_gb = (i1 - i0) / gb;
    row.suite = v["session"]["tls"]
        .as_str()
        .map(|t| t.trim_start_matches("TLSv1_3 ").to_owned())
        .filter(|t| t.starts_with("TLS13"))
        .unwrap_or_else(|| c.suite.clone().unwrap_or_default());
    Ok(())
}

/// A short run of the same configuration with tcpdump in the sender's namespace (reads:
/// the target's; writes: the initiator's), headers only; its bursts.
fn capture(
    p: &Params,
    path: &PathSpec,
    site: &Site,
    c: &Config,
    rw: &str,
    cap: &Path,
    dir: &Path,
) -> Result<BurstSummary> {
    let ns = if rw == "read" {
        &site.ns
    } else {
        &site.client_ns
    };
    let iface = if site.addr == Ipv4Addr::LOCALHOST {
        "lo"
    } else {
        "any"
    };
    let mut t = in_ns(ns, "tcpdump");
    t.args(["-i", iface, "-s", "128", "-B", "131072", "-n", "-w"])
        .arg(cap)
        .arg(format!("tcp port {}", c.port));
    let log = dir.join("tcpdump.log");
    let mut dump = Proc::spawn(t, "tcpdump", &log)?;
    dump.wait_log(Duration::from_secs(10), |l| l.contains("listening on"))?;
    let o = proc::run(
        bench_cmd(p, site, c, rw, p.capture_seconds),
        Duration::from_secs(p.capture_seconds + 60),
        dir,
    )?;
    dump.stop();
    if !o.ok() {
        bail!("rsv bench: {}", o.describe());
    }
    let text = dump.log_text();
    let dropped = text
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .unwrap_or("")
        .trim()
        .to_owned();
    let rule = match path.rate_bps {
        Some(r) => timing::BurstRule::Link { rate_bps: r },
        None => timing::BurstRule::Gap {
            ns: timing::BurstRule::DEFAULT_GAP_NS,
        },
    };
    let r = timing::analyse_file(
        cap,
        &timing::Options {
            port: Some(c.port),
            burst: rule,
            no_iscsi: true,
        },
        false,
    )?;
    // The data direction: target → initiator for reads, initiator → target for writes.
    let d = r
        .connections
        .iter()
        .map(|x| {
            if rw == "read" {
                &x.to_client
            } else {
                &x.to_server
            }
        })
        .max_by_key(|d| d.payload_bytes)
        .ok_or_else(|| anyhow!("no connection in the capture"))?;
    Ok(BurstSummary {
        packets: d.data_packets,
        bursts: d.bursts.count,
        median_segments: d.bursts.segments.median,
        p90_segments: d.bursts.segments.p90,
        median_gap_us: d.bursts.gaps_us.median,
        single_packet_pct: d.bursts.single_packet_pct,
        rule: r.burst_rule,
        dropped,
    })
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "r3.json")
}

/// docs/lab-r3.md from the results on disk.
pub fn write_doc(results: &Path, doc: &Path) -> Result<()> {
    let v = load(results)?;
    let rows = &v.rows;
    let p = &v.run.params;
    let env = &v.environment;
    let mut d = v
        .run
        .doc_head("Lab R3: what securing the transport costs", "");
    d += &format!(
        "- Load (/proc/loadavg) before the run: `{}`; after: `{}`. Both ends, the emulator and whatever else ran on the machine share its {} cores: on loopback the figures are CPU-bound and say how the cores were shared.\n",
        v.load_before, v.load_after, env.nproc
    );
    d += &format!(
        "- Workload: `rsv bench --pattern seq --block-size {} --queue-depth {} --connections 1` for the seconds given per path, writes then reads (so that reads find written data); the initiator is `rsv bench` on every row (TLS by `?pin=…&tls_suite=…`), so only the target side changes. Reservoir: `rsv target`, RAM LUN, a plaintext and a TLS 1.3 portal (self-signed P-256 certificate, pinned). tgt: `tgtd`, a file LUN on tmpfs; behind stunnel: an stunnel4 server (TLS 1.3) in front of it, `rsv bench` speaking TLS to stunnel directly.\n",
        p.block_size, p.queue_depth
    );
    d += "- CPU s/GB: CPU seconds per 10^9 bytes moved; target = `rsv target` or `tgtd` (/proc/PID/stat), tunnel = the stunnel server, initiator = `rsv bench` (rusage). The emulator's relay is in none of them.\n";
    d += &format!(
        "- Bursts: a second run of {} s of the same configuration with `tcpdump -s 128` in the sender's namespace (reads: the target's; writes: the initiator's), analysed by `rsv-lab timing`: a burst is a run of data packets each within 1.5 × its serialization time at the link's rate of the one before (loopback: within 100 µs); sizes in MSS-sized segments.\n",
        p.capture_seconds
    );
    d += &format!(
        "- Machine: {} ({} cores), {}; rsv {}, {}\n\n",
        env.cpu, env.nproc, env.kernel, env.git_commit, env.tgtd
    );
    let find = |path: &str, rw: &str, config: &str, suite: Option<&str>| {
        rows.iter().find(|r| {
            r.path == path
                && r.direction == rw
                && r.config == config
                && suite.is_none_or(|s| r.label.ends_with(s))
        })
    };
    for path in &p.paths {
        let key = &path.key;
        d += &format!("## {} ({} s per measurement)\n\n", path.label, path.seconds);
        d += "| direction | configuration | suite | MB/s | of plaintext | target CPU s/GB | tunnel CPU s/GB | initiator CPU s/GB | burst median / p90 (segments) | gap between bursts, median (µs) |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
        for r in rows.iter().filter(|r| r.path == *key) {
            let rw = &r.direction;
            let peer = if r.config.starts_with("tgt") {
                "tgt-plain"
            } else {
                "reservoir-plain"
            };
            let base = find(key, rw, peer, None).map_or(0.0, |b| b.mb_per_s);
            let (bursts, gap) = match &r.bursts {
                Some(b) => (
                    format!("{:.0} / {:.0}", b.median_segments, b.p90_segments),
                    format!("{:.1}", b.median_gap_us),
                ),
                None if r.error.is_empty() => ("–".into(), "–".into()),
                None => ("–".into(), format!("error: {}", r.error)),
            };
            d += &format!(
                "| {rw} | {} | {} | {:.0} | {} | {:.3} | {:.3} | {:.3} | {bursts} | {gap} |\n",
                r.label,
                r.suite,
                r.mb_per_s,
                if base > 0.0 {
                    format!("{:.2}", r.mb_per_s / base)
                } else {
                    "–".into()
                },
                r.target_cpu_s_per_gb,
                r.tunnel_cpu_s_per_gb,
                r.initiator_cpu_s_per_gb,
            );
        }
        d += "\n";
    }
    d += "\"of plaintext\": against Reservoir's plaintext row for Reservoir, against tgt's for tgt behind stunnel.\n\n";
    d += &format!(
        "![timeline]({})\n\n",
        crate::doc::link(doc, results, "r3-timeline.png")
    );
    d += "The timeline: 3 ms from the middle of the plaintext and the TLS (first suite) read captures over the 1 Gbit/s link, each data packet the target sent as a stroke over its sequence range, the initiator's ACKs as a line (as R3's figures).\n\n";
    // The goals, computed.
    d += "## Goals (issue 18)\n\n";
    let mut goal = |text: String, ok: Option<bool>| {
        d += &format!(
            "- {} — **{}**\n",
            text,
            match ok {
                Some(true) => "met",
                Some(false) => "missed",
                None => "not measured",
            }
        );
    };
    let suites = &p.suites;
    for rw in ["read", "write"] {
        let plain = find("loopback", rw, "reservoir-plain", None).map(|r| r.mb_per_s);
        for s in suites {
            // tgt behind stunnel with the same suite; results of runs that measured it
            // with the first suite only compare against that one row.
            let stun = find("loopback", rw, "tgt-stunnel", Some(s))
                .or_else(|| find("loopback", rw, "tgt-stunnel", None))
                .map(|r| (r.mb_per_s, &r.label));
            let tls = find("loopback", rw, "reservoir-tls", Some(s)).map(|r| r.mb_per_s);
            if let (Some(pl), Some(t)) = (plain, tls) {
                goal(format!("loopback {rw}s, TLS {s} ≥ 80 % of plaintext: {t:.0} / {pl:.0} MB/s = {:.0} %", t / pl * 100.0), Some(t >= 0.8 * pl));
            }
            if let (Some((st, label)), Some(t)) = (&stun, tls) {
                goal(
                    format!(
                        "loopback {rw}s, TLS {s} ≥ 2 × {label}: {t:.0} / {st:.0} MB/s = {:.2} ×",
                        t / st.max(1e-9)
                    ),
                    Some(t >= 2.0 * st),
                );
            }
        }
        let plain = find("1gbit-1ms", rw, "reservoir-plain", None).map(|r| r.mb_per_s);
        for s in suites {
            let tls = find("1gbit-1ms", rw, "reservoir-tls", Some(s)).map(|r| r.mb_per_s);
            if let (Some(pl), Some(t)) = (plain, tls) {
                goal(format!("1 Gbit/s 1 ms {rw}s, TLS {s} ≥ 95 % of plaintext: {t:.0} / {pl:.0} MB/s = {:.1} %", t / pl * 100.0), Some(t >= 0.95 * pl));
            }
        }
        let plain = find("r0", rw, "reservoir-plain", None).map(|r| r.mb_per_s);
        if let Some(s) = suites.first() {
            let tls = find("r0", rw, "reservoir-tls", Some(s)).map(|r| r.mb_per_s);
            match (plain, tls) {
                (Some(pl), Some(t)) => goal(format!("R0 link {rw}s, TLS {s} within 2 % of plaintext: {t:.2} / {pl:.2} MB/s = {:.1} %", t / pl * 100.0), Some((t / pl - 1.0).abs() <= 0.02)),
                _ => goal(format!("R0 link {rw}s, TLS within 2 % of plaintext"), None),
            }
        }
        let pb = find("1gbit-1ms", rw, "reservoir-plain", None)
            .and_then(|r| Some(r.bursts.as_ref()?.median_segments));
        for s in suites {
            let tb = find("1gbit-1ms", rw, "reservoir-tls", Some(s))
                .and_then(|r| Some(r.bursts.as_ref()?.median_segments));
            if let (Some(pm), Some(tm)) = (pb, tb) {
                goal(format!("1 Gbit/s 1 ms {rw}s, median burst under TLS {s} within 20 % of plaintext's: {tm:.0} vs {pm:.0} segments"), Some((tm - pm).abs() <= 0.2 * pm));
            }
        }
    }
    std::fs::write(doc, d)?;
    Ok(())
}
