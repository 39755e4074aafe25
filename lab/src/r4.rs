//! R4: a media server reading from home storage over 100 Mbit/s with 0–24 ms of added
//! delay each way: a file read start to end in 32 KiB calls, through Reservoir's initiator
//! (the file system on the LUN read in-process by `rsv media --read`, with its read-ahead)
//! and from Samba (`smbd` in site b, `smbclient` in site a: `iosize 32768` for 32 KiB
//! reads, and its own `get` as it comes), at receive windows of 64 KiB, 128 KiB and the
//! kernel's default; and the start of a stream (request to first byte) through `rsv media`
//! with the session closed (log in, open the file system, find the file) and open.
//!
//! A window W is the socket receive buffer in site a: `net.ipv4.tcp_rmem` there tops out
//! at W (Samba's client), and Reservoir's initiator asks `SO_RCVBUF` W/2, which the kernel
//! doubles to W: the same buffer for both readers.

use crate::env::Environment;
use crate::peers::{rsv_target, ISCSI_PORT};
use crate::proc::{self, check_interrupt, in_ns, rsv_bin, run_ok, sysctl, Link, Proc};
use crate::r0;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub const IQN: &str = "iqn.2026-11.org.reservoir:lab-media";
const SMB_PORT: u16 = 445;
const MEDIA_PORT: u16 = 8080;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    pub rate: String,
    pub rate_bps: u64,
    /// One-way delay added each way; the RTT is twice this.
    pub delays_ms: Vec<u32>,
    /// Receive buffers in site a; `None`: the kernel's default autotuning.
    pub windows: Vec<Option<u64>>,
    pub file_bytes: u64,
    pub call_size: u64,
    /// A reader still going after this long is stopped; its rate is then the bytes that
    /// crossed the link toward site a over the time (headers included).
    pub timeout_s: u64,
}

/// `rsv-lab run r4`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Documented,
    /// Only these delays added each way, in milliseconds (e.g. 0,12,24).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub delay: Vec<u32>,
    /// Only these receive windows (64K, 128K, default).
    #[arg(long, value_delimiter = ',')]
    pub window: Vec<String>,
    /// The time limit of each reader, in seconds (default 90; --quick 20).
    #[arg(long)]
    pub seconds: Option<u64>,
}

impl Args {
    pub fn params(&self) -> Result<Params> {
        let mut p = Params::new(self.flags.common.quick);
        p.delays_ms = crate::cli::given_or(&self.delay, p.delays_ms);
        if !self.window.is_empty() {
            p.windows = self
                .window
                .iter()
                .map(|w| parse_window(w))
                .collect::<Result<_>>()?;
        }
        p.timeout_s = self.seconds.unwrap_or(p.timeout_s);
        Ok(p)
    }
}

impl Params {
    pub fn new(quick: bool) -> Params {
        Params {
            rate: "100mbit".into(),
            rate_bps: 100_000_000,
            delays_ms: if quick {
                vec![4]
            } else {
                (0..=24).step_by(4).collect()
            },
            windows: if quick {
                vec![Some(64 << 10), None]
            } else {
                vec![Some(64 << 10), Some(128 << 10), None]
            },
            file_bytes: if quick { 16 << 20 } else { 512 << 20 },
            call_size: 32 << 10,
            timeout_s: if quick { 20 } else { 90 },
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Row {
    pub delay_ms: u32,
    pub rtt_ms: u32,
    /// "64K", "128K" or "default".
    pub window: String,
    /// "reservoir", "smb-32k" or "smb-get".
    pub client: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mbit_per_s: f64,
    pub link_pct: f64,
    /// Read to the end (else stopped at the timeout, rated by the link's counters).
    pub complete: bool,
    pub error: String,
    /// The reader's own report (Reservoir's JSON, smbclient's line).
    pub detail: Value,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Start {
    pub delay_ms: u32,
    pub rtt_ms: u32,
    /// Request to first byte with no session open: log in, open the file system, find the
    /// file, read.
    pub cold_ms: f64,
    /// With the session open: 64 KiB from the file's middle, which nothing has read yet.
    pub warm_ms: f64,
    pub cold_rtts: Option<f64>,
    pub warm_rtts: Option<f64>,
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    pub environment: Environment,
    pub load_before: String,
    pub rows: Vec<Row>,
    pub starts: Vec<Start>,
}

/// A window as `--window` names it: `default`, or a size (64K, 128K).
pub fn parse_window(w: &str) -> Result<Option<u64>> {
    if w.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    units::parse_size(w)
        .map(Some)
        .map_err(|e| anyhow!("--window {w}: {e} (a size such as 64K, or default)"))
}

fn window_name(w: Option<u64>) -> String {
    match w {
        Some(b) => format!("{}K", b >> 10),
        None => "default".into(),
    }
}

fn smb_conf(dir: &Path, share: &Path) -> String {
    let st = dir.join("smb-state");
    format!(
        "[global]\n  server role = standalone server\n  map to guest = Bad User\n  guest account = root\n\
         \x20 lock directory = {s}\n  state directory = {s}\n  cache directory = {s}\n\
         \x20 private dir = {s}\n  pid directory = {s}\n  log file = {s}/log.%m\n\
         \x20 disable netbios = yes\n  smb ports = {SMB_PORT}\n  load printers = no\n  printing = bsd\n\
         \x20 printcap name = /dev/null\n[media]\n  path = {share}\n  read only = yes\n  guest ok = yes\n\
         \x20 guest only = yes\n",
        s = st.display(),
        share = share.display()
    )
}

pub fn run(params: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    proc::require("r4", &["smbd", "smbclient", "mkfs.ext4", "curl"])?;
    let environment = crate::env::collect();
    let load_before = crate::env::loadavg();
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "r4")?;
    let dir = &scratch.0;
    // The file, in a directory Samba shares and mkfs.ext4 copies into the LUN's image:
    // both servers read it from RAM.
    let share = dir.join("share");
    std::fs::create_dir_all(&share)?;
    std::fs::create_dir_all(dir.join("smb-state"))?;
    proc::random_file(&share.join("movie.mp4"), params.file_bytes)?;
    let img = dir.join("media.img");
    let img_size = params.file_bytes + params.file_bytes / 8 + (64 << 20);
    std::fs::File::create(&img)?.set_len(img_size)?;
    run_ok(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&share)
            .arg(&img),
    )
    .context("making the LUN's ext4 image")?;

    let link = Link::up(
        "lr4",
        &[
            "--rate".into(),
            params.rate.clone(),
            "--rtt".into(),
            "0ms".into(),
        ],
        1,
    )?;
    let (a, b) = (&link.a[0], &link.b[0]);
    r0::set_tcp(&link, &r0::linux_default_tcp())?;
    // The target on CUBIC, as smbd (the namespace's default): its own default, BBR, under
    // the pacing the initiator asks for loses BBR's drain phases and PROBE_RTT (92.0 % of
    // the link at 16 ms each way, where CUBIC gave 94.5 and one connection 95.4).
    let target_cfg = format!(
        "[session]\ncongestion = \"cubic\"\n[[target]]\niqn = \"{IQN}\"\nalias = \"home\"\n[[target.lun]]\nid = 0\nstore = \"file:{}\"\n",
        img.display()
    );
    let mut target = rsv_target(&b.ns, b.addr, &target_cfg, dir, "r4")?;
    let conf = dir.join("smb.conf");
    std::fs::write(&conf, smb_conf(dir, &share))?;
    let mut smbd_cmd = in_ns(&b.ns, "smbd");
    smbd_cmd
        .args(["--foreground", "--debug-stdout"])
        .arg(format!("--configfile={}", conf.display()));
    let mut smbd = Proc::spawn(smbd_cmd, "smbd", &dir.join("smbd.log"))?;
    proc::wait_listen(&b.ns, SMB_PORT, &mut smbd)?;
    let url = format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", b.addr);
    let timeout = Duration::from_secs(params.timeout_s);
    let mut rows = Vec::new();
    let mut starts = Vec::new();
    for &delay in &params.delays_ms {
        check_interrupt()?;
        link.set(&[
            "--delay-ab".into(),
            format!("{delay}ms"),
            "--delay-ba".into(),
            format!("{delay}ms"),
        ])?;
        eprintln!("r4: delay {delay} ms each way (RTT {} ms)", 2 * delay);
        for &w in &params.windows {
            let rmem = match w {
                Some(b) => format!("4096 {b} {b}"),
                None => "4096 131072 33554432".into(),
            };
            sysctl(&a.ns, &[("net.ipv4.tcp_rmem".into(), rmem)])?;
            for client in ["reservoir", "smb-32k", "smb-get"] {
                check_interrupt()?;
                let cmd = match client {
                    "reservoir" => {
                        let mut u = url.clone();
                        if let Some(b) = w {
                            u += &format!("?recv_buffer={}", b / 2);
                        }
                        let mut c = in_ns(&a.ns, rsv_bin());
                        c.args(["media", "--read", "/movie.mp4", "--call-size"])
                            .arg(params.call_size.to_string())
                            .args(["--rate", &params.rate])
                            .arg(u);
                        c
                    }
                    _ => {
                        let get = if client == "smb-32k" {
                            format!("iosize {}; get movie.mp4 /dev/null", params.call_size)
                        } else {
                            "get movie.mp4 /dev/null".to_owned()
                        };
                        let mut c = in_ns(&a.ns, "smbclient");
                        c.arg(format!("//{}/media", b.addr))
                            .args(["-N", "-s"])
                            .arg(&conf)
                            .args(["-c", &get]);
                        c
                    }
                };
                let before = link.tx_bytes("ba").unwrap_or(0);
                let o = proc::run(cmd, timeout, dir)?;
                let wire = link.tx_bytes("ba").unwrap_or(0).saturating_sub(before);
                let row = read_row(&params, delay, w, client, &o, wire);
                eprintln!(
                    "  {:>7} {:<9} {:>7.2} Mbit/s {:>5.1} %{}",
                    row.window,
                    row.client,
                    row.mbit_per_s,
                    row.link_pct,
                    if row.error.is_empty() {
                        String::new()
                    } else {
                        format!("  ({})", row.error)
                    }
                );
                rows.push(row);
            }
        }
        sysctl(
            &a.ns,
            &[("net.ipv4.tcp_rmem".into(), "4096 131072 33554432".into())],
        )?;
        starts.push(start_of_stream(&link, &url, delay, params.file_bytes, dir)?);
    }
    if !target.alive() {
        bail!(
            "rsv target died during the run:\n{}",
            proc::tail(&target.log_text(), 2000)
        );
    }
    target.stop();
    smbd.stop();
    drop(link);
    let results = Results {
        run: crate::results::Run::new("r4", quick, command, params),
        environment,
        load_before,
        rows,
        starts,
    };
    crate::results::save_with_csv(
        out,
        "r4",
        &results,
        "scenario,delay_ms,rtt_ms,window,client,bytes,seconds,mbit_per_s,link_pct,complete,error",
        results.rows.iter().map(|r| {
            format!(
                "r4,{},{},{},{},{},{:.3},{:.3},{:.1},{},{}",
                r.delay_ms,
                r.rtt_ms,
                r.window,
                r.client,
                r.bytes,
                r.seconds,
                r.mbit_per_s,
                r.link_pct,
                r.complete,
                r.error.replace(',', ";")
            )
        }),
    )?;
    let mut s = String::from("scenario,delay_ms,rtt_ms,cold_ms,warm_ms,cold_rtts,warm_rtts\n");
    for st in &results.starts {
        let f = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.1}"));
        s += &format!(
            "r4,{},{},{:.1},{:.1},{},{}\n",
            st.delay_ms,
            st.rtt_ms,
            st.cold_ms,
            st.warm_ms,
            f(st.cold_rtts),
            f(st.warm_rtts)
        );
    }
    std::fs::write(out.join("r4-start.csv"), s)?;
    plot(&results, &out.join("r4.png"))?;
    Ok(results)
}

fn read_row(
    p: &Params,
    delay: u32,
    w: Option<u64>,
    client: &str,
    o: &proc::Outcome,
    wire: u64,
) -> Row {
    let mut row = Row {
        delay_ms: delay,
        rtt_ms: 2 * delay,
        window: window_name(w),
        client: client.into(),
        bytes: 0,
        seconds: o.elapsed.as_secs_f64(),
        mbit_per_s: 0.0,
        link_pct: 0.0,
        complete: false,
        error: String::new(),
        detail: Value::Null,
    };
    if o.ok() && client == "reservoir" {
        match serde_json::from_str::<Value>(&o.stdout) {
            Ok(v) => {
                row.bytes = v["bytes"].as_u64().unwrap_or(0);
                row.seconds = v["seconds"].as_f64().unwrap_or(0.0);
                row.mbit_per_s = v["mbit_per_s"].as_f64().unwrap_or(0.0);
                row.complete = row.bytes == p.file_bytes;
                row.detail = v;
            }
            Err(e) => row.error = format!("unreadable report: {e}"),
        }
    } else if o.ok() {
        // "getting file \movie.mp4 of size N as /dev/null (X KiloBytes/sec) (average ...)"
        let text = format!("{}{}", o.stdout, o.stderr);
        let line = text
            .lines()
            .find(|l| l.contains("getting file"))
            .unwrap_or("");
        row.detail = Value::String(line.to_owned());
        let kbs = line
            .split('(')
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|x| x.parse::<f64>().ok());
        match kbs {
            Some(k) if k > 0.0 => {
                row.bytes = p.file_bytes;
                row.mbit_per_s = k * 1024.0 * 8.0 / 1e6;
                row.seconds = p.file_bytes as f64 / (k * 1024.0);
                row.complete = true;
            }
            _ => row.error = format!("no rate in smbclient's output: {}", proc::tail(&text, 200)),
        }
    } else if o.timed_out {
        row.bytes = wire;
        row.mbit_per_s = wire as f64 * 8.0 / o.elapsed.as_secs_f64().max(1e-9) / 1e6;
        row.error = format!(
            "stopped after {} s; rate from the link's bytes",
            p.timeout_s
        );
    } else {
        row.error = o.describe();
    }
    row.link_pct = row.mbit_per_s * 1e6 / p.rate_bps as f64 * 100.0;
    row
}

/// `rsv media` in site a serving the LUN; curl asks for 64 KiB of the file twice: its start
/// with no session open, then from its middle (not read ahead, not cached) with the session
/// open. Time to first byte as curl measures it.
fn start_of_stream(
    link: &Link,
    url: &str,
    delay: u32,
    file_bytes: u64,
    dir: &Path,
) -> Result<Start> {
    let a = &link.a[0];
    let mut cmd = in_ns(&a.ns, rsv_bin());
    cmd.args([
        "media",
        "--listen",
        &format!("127.0.0.1:{MEDIA_PORT}"),
        "--idle",
        "600s",
    ])
    .arg(url)
    .env("RUST_LOG", "warn");
    let mut media = Proc::spawn(cmd, "rsv media", &dir.join(format!("media-{delay}.log")))?;
    media.wait_log(Duration::from_secs(20), |l| {
        l.lines().any(|x| x.trim() == "ready")
    })?;
    let file = format!("http://127.0.0.1:{MEDIA_PORT}/media/{IQN}/0/movie.mp4");
    let ttfb = |from: u64| -> Result<f64> {
        let t = Instant::now();
        let o = run_ok(
            in_ns(&a.ns, "curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-r",
                    &format!("{from}-{}", from + 65535),
                    "--max-time",
                    "60",
                    "-w",
                    "%{http_code} %{time_starttransfer}",
                ])
                .arg(&file),
        )?;
        let mut it = o.split_whitespace();
        let code = it.next().unwrap_or("");
        if code != "206" {
            bail!("curl {file}: HTTP {code} after {:?}", t.elapsed());
        }
        it.next()
            .and_then(|x| x.parse::<f64>().ok())
            .map(|s| s * 1e3)
            .ok_or_else(|| anyhow!("curl printed {o:?}"))
    };
    let cold_ms = ttfb(0)?;
    let warm_ms = ttfb(file_bytes / 2)?;
    media.stop();
    let rtt = 2 * delay;
    let per = |ms: f64| (rtt > 0).then(|| ms / f64::from(rtt));
    eprintln!("  start of stream: {cold_ms:.1} ms with no session, {warm_ms:.1} ms with one (RTT {rtt} ms)");
    Ok(Start {
        delay_ms: delay,
        rtt_ms: rtt,
        cold_ms,
        warm_ms,
        cold_rtts: per(cold_ms),
        warm_rtts: per(warm_ms),
    })
}

fn plot(r: &Results, path: &Path) -> Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for row in &r.rows {
        let name = format!(
            "{}, {} window",
            match row.client.as_str() {
                "reservoir" => "Reservoir iSCSI",
                "smb-32k" => "Samba 32 KiB reads",
                _ => "Samba smbclient get",
            },
            row.window
        );
        let pt = (f64::from(row.delay_ms), row.mbit_per_s);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(pt),
            None => series.push((name, vec![pt])),
        }
    }
    crate::plot::delay_chart(
        path,
        "R4: reading a file in 32 KiB calls over 100 Mbit/s",
        &series,
        r.run.params.rate_bps as f64 / 1e6,
    )
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "r4.json")
}

/// docs/lab-r4.md from the results on disk.
pub fn write_doc(results: &Path, doc: &Path) -> Result<()> {
    let v = load(results)?;
    let p = &v.run.params;
    let mut d = v.run.doc_head(
        "Lab R4: a media server reading home storage over iSCSI and SMB",
        ": one delay, a small file",
    );
    d += &format!(
        "- Link: {} through `rsv-lab wan`, delay added each way as listed (RTT twice that); the kernel's TCP defaults but CUBIC.\n",
        p.rate
    );
    d += &format!(
        "- The file: {} MiB of random data, read start to end in {} KiB calls. Reservoir: `rsv media --read` in site a reads it from the ext4 file system on a LUN of `rsv target` in site b (file store on tmpfs), in-process, with the media server's read-ahead (four times RTT × rate plus a 128 KiB unit per connection of the session, in 128 KiB units) and its session: one connection paced at the rate (`--rate`), or auto-tuning's count where the window is set by hand; the target on CUBIC, as smbd. Samba: `smbd` in site b shares the same file (tmpfs); `smbclient` in site a gets it to /dev/null, once with `iosize {}` (32 KiB reads) and once as it comes.\n",
        p.file_bytes >> 20,
        p.call_size >> 10,
        p.call_size
    );
    d += "- Window W: `net.ipv4.tcp_rmem` in site a tops out at W; Reservoir's initiator asks `SO_RCVBUF` W/2, which Linux doubles to W. `default`: autotuning up to 32 MiB (Reservoir's own buffer choice).\n";
    d += &format!(
        "- Load before the run (/proc/loadavg): `{}`\n",
        v.load_before
    );
    d += &crate::doc::machine(&v.environment, 300)?;
    d += &format!("![R4]({})\n\n", crate::doc::link(doc, results, "r4.png"));
    d += "## Throughput (Mbit/s; % of the link)\n\n| delay each way (ms) | window | Reservoir iSCSI | Samba 32 KiB reads | Samba get |\n|---|---|---|---|---|\n";
    let rows = &v.rows;
    let mut keys: Vec<(u32, &str)> = Vec::new();
    for r in rows {
        let k = (r.delay_ms, r.window.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (delay, w) in keys {
        let cell = |c: &str| {
            rows.iter()
                .find(|r| r.delay_ms == delay && r.window == w && r.client == c)
                .map_or("–".to_owned(), |r| {
                    format!(
                        "{:.1} ({:.0} %){}",
                        r.mbit_per_s,
                        r.link_pct,
                        if r.complete { "" } else { " *" }
                    )
                })
        };
        d += &format!(
            "| {delay} | {w} | {} | {} | {} |\n",
            cell("reservoir"),
            cell("smb-32k"),
            cell("smb-get")
        );
    }
    d += "\n`*`: not read to the end (stopped at the time limit, rated by the bytes that crossed the link, headers included) or failed; `r4.json` has the error.\n\n";
    d += "## Start of a stream (request to first byte, curl through `rsv media`)\n\n| delay each way (ms) | RTT (ms) | no session (ms) | in RTTs | session open (ms) | in RTTs |\n|---|---|---|---|---|---|\n";
    let f = |x: Option<f64>| x.map_or("–".to_owned(), |v| format!("{v:.1}"));
    for s in &v.starts {
        d += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            s.delay_ms,
            s.rtt_ms,
            f(Some(s.cold_ms)),
            f(s.cold_rtts),
            f(Some(s.warm_ms)),
            f(s.warm_rtts)
        );
    }
    d += "\nNo session: `rsv media` was given the target's URL (with its LUN) and has not logged in yet; the request makes it probe the path (TCP handshakes, the leading connection logging in on one of them without CHAP), open the LUN (TEST UNIT READY, READ CAPACITY and two VPD pages at once; the session's other connections join while that runs), read the ext4 superblock and group descriptors, the inode table block holding the journal's and the root's inodes, the journal's superblock and the root directory with the file's inode (each a small read of its own, not a 128 KiB unit), then the first 8 KiB (the answer's head goes out with its first chunk of data, so curl's first byte is data read). Session open: 64 KiB from the middle of the file, which nothing has read yet. Finding the target through iSNS is not in it (the server looks its iSNS servers up when it starts and every `--poll`). `scripts/media-start.sh` takes the same two measurements at 24 ms with a packet capture; `docs/media.md` counts the round trips in it.\n";
    std::fs::write(doc, d)?;
    Ok(())
}
