//! `rsv ls`, `rsv inq`, `rsv cp`, `rsv bench`, `rsv mount`: argument structs and their
//! logic. The `rsv` binary only dispatches here.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio::task::JoinSet;
use units::{Rate, Size};

pub use crate::mount::{mount, MountArgs};
pub use crate::tune_cli::{tune, TuneArgs};
use initiator::copy::{CopyOptions, Endpoint};
use initiator::isns::IsnsUrl;
use initiator::scsi::{self, Capacity};
use initiator::Lun;
use initiator::{discover, IscsiUrl, Session, SessionInfo, SessionOptions};

/// Session flags shared by the commands. A flag overrides the same key in the URL's query
/// string, which overrides the default.
#[derive(Args, Clone, Debug, Default)]
pub struct SessionFlags {
    /// TCP connections per session (MC/S); the target may grant fewer.
    #[arg(long)]
    pub connections: Option<u16>,
    /// Commands in flight per session.
    #[arg(long)]
    pub queue_depth: Option<usize>,
    /// Pace each connection at this rate: bits as tc writes them (100mbit) or bytes per
    /// second (12.5MB/s); a bare number is refused.
    #[arg(long, value_parser = units::parse_rate)]
    pub pacing_rate: Option<Rate>,
    /// The bottleneck's rate (100mbit, 12.5MB/s): auto-tuning sizes for it and paces the
    /// connections to share it.
    #[arg(long, value_parser = units::parse_rate)]
    pub rate: Option<Rate>,
    /// Take connections, queue depth, bursts and buffers as given instead of choosing
    /// them from the measured path.
    #[arg(long)]
    pub no_auto_tune: bool,
    /// Ask for CRC32C header digests.
    #[arg(long)]
    pub header_digest: bool,
    /// Ask for CRC32C data digests.
    #[arg(long)]
    pub data_digest: bool,
    /// Our iSCSI name (default iqn.2026-01.org.reservoir:initiator.HOSTNAME).
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// The target's CHAP secret: asks the target to authenticate itself (mutual CHAP).
    #[arg(long, env = "RSV_TARGET_PASSWORD")]
    pub target_password: Option<String>,
    /// ErrorRecoveryLevel to propose: 2 (default) recovers a lost connection by task
    /// reassignment where the target grants it; 0 reissues lost commands (what targets
    /// granting only 0, such as tgt, get anyway).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub erl: Option<u8>,
    /// Every connection over TLS 1.3 (as ?tls=1); the target's certificate is checked
    /// against the system's CAs unless --tls-ca or --tls-pin says otherwise.
    #[arg(long)]
    pub tls: bool,
    /// Trust the target's certificate if this CA (PEM file) signed it; implies --tls.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<String>,
    /// Trust exactly the certificate with this SHA-256 fingerprint (as `rsv target` logs
    /// it), whoever signed it and whatever names it carries; implies --tls.
    #[arg(long, value_name = "SHA256")]
    pub tls_pin: Option<String>,
    /// Client certificate (PEM) for targets that require one (mutual TLS), with --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<String>,
    /// The client certificate's private key (PEM, readable by its owner only).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<String>,
    /// The name the target's certificate must carry (default: the URL's host).
    #[arg(long, value_name = "NAME")]
    pub tls_name: Option<String>,
    /// Offer only this TLS 1.3 cipher suite: aes128, aes256 or chacha20 (or its IANA
    /// name, e.g. TLS13_AES_128_GCM_SHA256); default all three, the target choosing.
    #[arg(long, value_name = "SUITE")]
    pub tls_suite: Option<String>,
    /// Extra session options as key=value (same keys as the URL query string).
    #[arg(long = "opt", value_name = "KEY=VALUE")]
    pub opts: Vec<String>,
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim_end_matches('s');
    t.parse::<f64>()
        .ok()
        .filter(|x| *x > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{s}: expected seconds like 10 or 2.5s"))
}

impl SessionFlags {
    pub fn options(&self, url: &IscsiUrl) -> initiator::Result<SessionOptions> {
        let mut o = url.options(&SessionOptions::default())?;
        if let Some(n) = self.connections {
            o.connections = n.max(1);
            o.pin("connections");
        }
        if let Some(q) = self.queue_depth {
            o.queue_depth = q.max(1);
            o.pin("queue_depth");
        }
        if let Some(r) = self.pacing_rate {
            o.pacing_rate = Some(r.bytes_per_sec());
            o.pin("pacing_rate");
        }
        if let Some(r) = self.rate {
            o.rate = Some(r.bytes_per_sec());
        }
        if self.no_auto_tune {
            o.auto_tune = false;
        }
        if self.header_digest {
            o.header_digest = true;
        }
        if self.data_digest {
            o.data_digest = true;
        }
        if let Some(n) = &self.initiator_name {
            o.initiator_name = n.clone();
        }
        if self.target_password.is_some() {
            o.target_secret = self.target_password.clone();
        }
        if let Some(erl) = self.erl {
            o.error_recovery_level = erl;
        }
        if self.tls {
            o.tls = true;
        }
        for (key, value) in [
            ("ca", &self.tls_ca),
            ("pin", &self.tls_pin),
            ("cert", &self.tls_cert),
            ("key", &self.tls_key),
            ("tls_name", &self.tls_name),
            ("tls_suite", &self.tls_suite),
        ] {
            if let Some(v) = value {
                o.set(key, v)?;
            }
        }
        for kv in &self.opts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| initiator::Error::Option(format!("{kv}: expected KEY=VALUE")))?;
            o.set(k, v)?;
        }
        Ok(o)
    }
}

/// The `iscsi://` URL a command was given, or for an `isns://SERVER/ALIAS-or-IQN/LUN` one
/// the `iscsi://` URL of that target's first portal, as the iSNS server knows it.
pub async fn target_url(spec: &str, flags: &SessionFlags) -> anyhow::Result<IscsiUrl> {
    if !IsnsUrl::is_isns(spec) {
        return Ok(IscsiUrl::parse(spec)?);
    }
    let u = IsnsUrl::parse(spec)?;
    let name = flags.options(&u.url)?.initiator_name;
    let url = initiator::isns::resolve(&u, &name).await?;
    tracing::info!("{} is {url}", u.shown());
    Ok(url)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

// ---------------------------------------------------------------------------------- ls

#[derive(Args, Debug)]
pub struct LsArgs {
    /// iscsi://[user[%password]@]host[:port]/ (all targets) or .../TARGET-IQN (one target);
    /// isns://SERVER[:PORT]/ (the targets an iSNS server knows) or .../ALIAS-or-IQN.
    pub url: String,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct LunListing {
    pub lun: u16,
    pub device_type: String,
    pub vendor: String,
    pub product: String,
    pub size_bytes: Option<u64>,
    pub blocks: Option<u64>,
    pub block_size: Option<u32>,
}

#[derive(Serialize, Debug, Clone)]
pub struct TargetListing {
    pub target: String,
    /// Known from iSNS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    pub portals: Vec<String>,
    pub luns: Vec<LunListing>,
    /// Why the LUNs could not be listed, if they could not.
    pub error: Option<String>,
}

pub async fn list(url: &IscsiUrl, flags: &SessionFlags) -> initiator::Result<Vec<TargetListing>> {
    let opts = flags.options(url)?;
    let targets = match &url.target {
        Some(t) => vec![initiator::DiscoveredTarget {
            name: t.clone(),
            alias: None,
            portals: vec![url.portal()],
        }],
        None => discover(url, &opts).await?,
    };
    let mut out = Vec::new();
    for t in targets {
        let mut turl = url.clone();
        turl.target = Some(t.name.clone());
        let mut listing = TargetListing {
            target: t.name.clone(),
            alias: t.alias.clone(),
            portals: t.portals.clone(),
            luns: Vec::new(),
            error: None,
        };
        let mut o = opts.clone();
        o.connections = 1;
        match lun_listing(&turl, &o).await {
            Ok(l) => listing.luns = l,
            Err(e) if url.target.is_some() => return Err(e),
            Err(e) => listing.error = Some(e.to_string()),
        }
        out.push(listing);
    }
    Ok(out)
}

async fn lun_listing(url: &IscsiUrl, opts: &SessionOptions) -> initiator::Result<Vec<LunListing>> {
    let s = Session::connect(url, opts).await?;
    let result = async {
        let mut luns = Vec::new();
        for lun in s.report_luns().await? {
            let inq = s.inquiry(lun).await?;
            let cap = if inq.device_type == 0 {
                s.read_capacity(lun).await.ok()
            } else {
                None
            };
            luns.push(LunListing {
                lun,
                device_type: inq.device_type_name.to_owned(),
                vendor: inq.vendor,
                product: inq.product,
                size_bytes: cap.as_ref().map(Capacity::bytes),
                blocks: cap.as_ref().map(|c| c.blocks),
                block_size: cap.as_ref().map(|c| c.block_size),
            });
        }
        Ok(luns)
    }
    .await;
    let _ = s.logout().await;
    result
}

/// [`list`] for an `iscsi://` or an `isns://` URL: the targets an iSNS server knows, or
/// the one it names.
pub async fn list_spec(spec: &str, flags: &SessionFlags) -> anyhow::Result<Vec<TargetListing>> {
    if !IsnsUrl::is_isns(spec) {
        return Ok(list(&IscsiUrl::parse(spec)?, flags).await?);
    }
    let u = IsnsUrl::parse(spec)?;
    if u.url.target.is_some() {
        let name = flags.options(&u.url)?.initiator_name;
        let (url, found) = initiator::isns::resolve_target(&u, &name).await?;
        let mut listing = list(&url, flags).await?;
        for l in &mut listing {
            l.alias = found.alias.clone();
            l.portals = found.portals.clone();
        }
        return Ok(listing);
    }
    let opts = flags.options(&u.url)?;
    let found = initiator::isns::lookup(&u, &opts.initiator_name).await?;
    let mut out = Vec::new();
    for t in found {
        let Some(portal) = t.portals.first() else {
            out.push(TargetListing {
                target: t.name,
                alias: t.alias,
                portals: Vec::new(),
                luns: Vec::new(),
                error: Some("no portal registered".into()),
            });
            continue;
        };
        let addr = portal.rsplit_once(',').map_or(portal.as_str(), |(a, _)| a);
        let mut url = IscsiUrl::parse(&format!("iscsi://{addr}/"))?;
        url.target = Some(t.name.clone());
        url.user = u.url.user.clone();
        url.password = u.url.password.clone();
        url.query = u.url.query.clone();
        let mut listing = TargetListing {
            target: t.name,
            alias: t.alias,
            portals: t.portals.clone(),
            luns: Vec::new(),
            error: None,
        };
        let mut o = opts.clone();
        o.connections = 1;
        match lun_listing(&url, &o).await {
            Ok(l) => listing.luns = l,
            Err(e) => listing.error = Some(e.to_string()),
        }
        out.push(listing);
    }
    Ok(out)
}

pub fn ls(args: LsArgs) -> anyhow::Result<()> {
    let listing = runtime()?.block_on(list_spec(&args.url, &args.session))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    for t in &listing {
        match &t.alias {
            Some(a) => println!("Target: {} (alias {a})", t.target),
            None => println!("Target: {}", t.target),
        }
        for p in &t.portals {
            println!("  Portal: {p}");
        }
        if let Some(e) = &t.error {
            println!("  (LUNs not listed: {e})");
        }
        for l in &t.luns {
            let size = match (l.size_bytes, l.blocks, l.block_size) {
                (Some(b), Some(n), Some(bs)) => {
                    format!("  {} ({n} blocks of {bs} bytes)", Size(b).approx())
                }
                _ => String::new(),
            };
            println!(
                "  LUN {}: {} [{} {}]{size}",
                l.lun, l.device_type, l.vendor, l.product
            );
        }
    }
    Ok(())
}

// --------------------------------------------------------------------------------- inq

#[derive(Args, Debug)]
pub struct InqArgs {
    /// iscsi://[user[%password]@]host[:port]/TARGET-IQN/LUN, or
    /// isns://SERVER[:PORT]/ALIAS-or-IQN/LUN (the target's portal from an iSNS server)
    pub url: String,
    #[command(flatten)]
    pub session: SessionFlags,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct InquiryReport {
    pub target: String,
    pub lun: u16,
    pub standard: scsi::Inquiry,
    pub supported_vpd_pages: Vec<u8>,
    pub serial: Option<String>,
    pub designators: Vec<scsi::Designator>,
    pub block_limits: Option<scsi::BlockLimits>,
    pub capacity: Option<Capacity>,
    pub session: SessionInfo,
}

pub async fn inquire(url: &IscsiUrl, flags: &SessionFlags) -> initiator::Result<InquiryReport> {
    let lun = url.lun_required()?;
    let mut opts = flags.options(url)?;
    opts.connections = 1;
    let s = Session::connect(url, &opts).await?;
    let result = async {
        let standard = s.inquiry(lun).await?;
        let pages = s
            .vpd(lun, 0)
            .await
            .map(|p| {
                let n = p.get(3).copied().unwrap_or(0) as usize;
                p.get(4..4 + n).unwrap_or(&p[p.len().min(4)..]).to_vec()
            })
            .unwrap_or_default();
        let has = |pg: u8| pages.contains(&pg);
        let serial = if has(0x80) {
            s.vpd(lun, 0x80)
                .await
                .ok()
                .and_then(|p| scsi::parse_vpd80(&p))
        } else {
            None
        };
        let designators = if has(0x83) {
            s.vpd(lun, 0x83)
                .await
                .map(|p| scsi::parse_vpd83(&p))
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let block_limits = if has(0xb0) {
            s.vpd(lun, 0xb0)
                .await
                .ok()
                .and_then(|p| scsi::parse_vpd_b0(&p))
        } else {
            None
        };
        let capacity = if standard.device_type == 0 {
            Some(s.read_capacity(lun).await?)
        } else {
            None
        };
        Ok(InquiryReport {
            target: url.target_required()?.to_owned(),
            lun,
            standard,
            supported_vpd_pages: pages.clone(),
            serial,
            designators,
            block_limits,
            capacity,
            session: s.info(),
        })
    }
    .await;
    let _ = s.logout().await;
    result
}

pub fn inq(args: InqArgs) -> anyhow::Result<()> {
    let r = runtime()?.block_on(async {
        let url = target_url(&args.url, &args.session).await?;
        anyhow::Ok(inquire(&url, &args.session).await?)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let i = &r.standard;
    println!("Target:  {}  LUN {}", r.target, r.lun);
    println!(
        "Device:  {} (type 0x{:02x}, qualifier {}){}",
        i.device_type_name,
        i.device_type,
        i.peripheral_qualifier,
        if i.removable { ", removable" } else { "" }
    );
    println!("Vendor:  {}", i.vendor);
    println!("Product: {}", i.product);
    println!("Rev:     {}", i.revision);
    println!("SPC:     version 0x{:02x}", i.version);
    let pages: Vec<String> = r
        .supported_vpd_pages
        .iter()
        .map(|p| format!("0x{p:02x}"))
        .collect();
    println!("VPD:     {}", pages.join(" "));
    if let Some(s) = &r.serial {
        println!("Serial:  {s}");
    }
    for d in &r.designators {
        println!("Id:      {} ({}) {}", d.kind, d.association, d.value);
    }
    if let Some(b) = &r.block_limits {
        println!(
            "Limits:  max transfer {} blocks, optimal {} blocks, granularity {}",
            b.max_transfer_blocks, b.optimal_transfer_blocks, b.optimal_granularity_blocks
        );
    }
    if let Some(c) = &r.capacity {
        println!(
            "Size:    {} ({} blocks of {} bytes)",
            Size(c.bytes()).approx(),
            c.blocks,
            c.block_size
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- cp

#[derive(Args, Debug, Clone)]
pub struct CpArgs {
    /// Source: a file, a block device, iscsi://host/TARGET/LUN or isns://SERVER/ALIAS/LUN.
    pub src: String,
    /// Destination: a file (created or truncated), a block device, an iscsi:// or isns:// URL.
    pub dst: String,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Bytes per SCSI command: 4096, 256k, 1M (powers of 1024; KB, MB are powers of 1000).
    #[arg(long, default_value = "1m", value_parser = units::parse_size)]
    pub io_size: u64,
    /// Skip all-zero chunks even when the destination is not known to be zero (it must
    /// be, or those regions keep their old contents).
    #[arg(long, conflicts_with = "no_sparse")]
    pub sparse: bool,
    /// Write every chunk, zeros included, even to a fresh file.
    #[arg(long)]
    pub no_sparse: bool,
    /// After the copy, re-read both sides and compare checksums (not after --max-time
    /// stopped it early).
    #[arg(long)]
    pub verify: bool,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress bar even on a terminal (same as --progress none).
    #[arg(long)]
    pub no_progress: bool,
    /// Progress report on stderr: a bar (on a terminal only), one JSON line per second
    /// (`{"seconds":..,"bytes":..,"total_bytes":..,"bytes_per_s":..,"eta_s":..}`), or
    /// none.
    #[arg(long, value_enum, default_value = "bar")]
    pub progress: ProgressMode,
    /// Stop after this many seconds: no new chunk is started, those in flight finish,
    /// the destination is flushed, and the summary says how far the copy got. Exit
    /// status 3 (not 0, not the failure status 1) tells that it stopped early.
    #[arg(long, value_name = "SECS", value_parser = parse_duration_arg)]
    pub max_time: Option<Duration>,
    /// Resume a copy that --max-time stopped: start at this offset (the summary's
    /// copied_prefix_bytes, a multiple of 4096) and keep the destination's contents (a
    /// file is not truncated, so zero chunks are written unless --sparse). The summary
    /// and progress count this run's bytes.
    #[arg(long, value_name = "BYTES", value_parser = units::parse_size)]
    pub resume_from: Option<u64>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    Bar,
    Json,
    None,
}

/// `rsv cp`'s exit status when --max-time stopped the copy before its end.
pub const EXIT_STOPPED_BY_MAX_TIME: u8 = 3;
/// `rsv cp`'s exit status when a failure (a session not recovered within its
/// recovery_timeout, a file error) interrupted the copy after some of it was done: the
/// summary's copied_prefix_bytes is where `--resume-from` goes on.
pub const EXIT_INTERRUPTED: u8 = 4;

/// A copy a failure interrupted: what it did, and how to go on. [`copy`] returns it as
/// its error; `rsv cp` prints it and exits with [`EXIT_INTERRUPTED`].
#[derive(Debug)]
pub struct CpInterrupted {
    /// `error` says what failed; `complete` is false.
    pub summary: CpSummary,
    pub source: initiator::copy::CopyError,
}

impl std::fmt::Display for CpInterrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.summary.error.as_deref().unwrap_or("copy interrupted"))
    }
}

impl std::error::Error for CpInterrupted {}

/// An error and its causes on one line, as anyhow's `{:#}` prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        s += ": ";
        s += &c.to_string();
        next = c.source();
    }
    s
}

#[derive(Serialize, Debug, Clone)]
pub struct CpSummary {
    pub src: String,
    pub dst: String,
    /// Bytes copied (all of the source unless --max-time stopped the copy).
    pub bytes: u64,
    /// Size of the source.
    pub total_bytes: u64,
    /// False when --max-time stopped the copy before the end.
    pub complete: bool,
    /// Every byte below this offset is copied: where a stopped copy can resume.
    pub copied_prefix_bytes: u64,
    /// All-zero bytes not written (sparse).
    pub skipped_zero_bytes: u64,
    pub seconds: f64,
    #[serde(rename = "MB_per_s")]
    pub mb_per_s: f64,
    /// Commands issued again after a connection failure or timeout (ERL 0 recovery, or
    /// commands the target never received).
    pub retries: u64,
    pub reinstatements: u64,
    /// Commands carried on by another connection through TASK REASSIGN (ERL 2).
    pub reassigned_tasks: u64,
    /// Connections logged in again while their session went on.
    pub reconnections: u64,
    pub verified: bool,
    /// CRC32C over the per-chunk CRC32Cs of the source, when verified.
    pub checksum: Option<String>,
    pub io_size: u64,
    pub queue_depth: usize,
    pub sparse: bool,
    pub sessions: Vec<SessionInfo>,
    /// What interrupted the copy (exit status 4): go on with --resume-from
    /// copied_prefix_bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Opens one side of a copy: an iscsi:// LUN, a file or a block device. `dst_size`:
/// the destination, sized to the source; `truncate` empties a destination file first.
async fn open_endpoint(
    spec: &str,
    flags: &SessionFlags,
    io_size: u64,
    dst_size: Option<u64>,
    truncate: bool,
) -> anyhow::Result<(Endpoint, bool)> {
    if spec.starts_with("iscsi://") || IsnsUrl::is_isns(spec) {
        let url = target_url(spec, flags).await?;
        let mut opts = flags.options(&url)?;
        opts.io_size_hint = Some(io_size);
        return Ok((Endpoint::Lun(Lun::open_url(&url, &opts).await?), false));
    }
    let path = Path::new(spec);
    match dst_size {
        None => Endpoint::open_file(path)
            .map(|e| (e, false))
            .with_context(|| format!("cannot open {spec} for reading")),
        Some(size) => Endpoint::create_file(path, size, truncate)
            .with_context(|| format!("cannot open {spec} for writing")),
    }
}

fn progress(total: u64, enabled: bool, msg: &'static str) -> indicatif::ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

/// Copies with `args`; the library entry point behind `rsv cp`.
pub async fn copy(args: &CpArgs) -> anyhow::Result<CpSummary> {
    let (src, _) = open_endpoint(&args.src, &args.session, args.io_size, None, false).await?;
    let size = src.size();
    let (dst, fresh) = open_endpoint(
        &args.dst,
        &args.session,
        args.io_size,
        Some(size),
        args.resume_from.is_none(),
    )
    .await?;
    if dst.size() < size {
        bail!(
            "destination {} holds {} but the source has {}; use a larger LUN",
            args.dst,
            Size(dst.size()),
            Size(size)
        );
    }
    // Skipping zeros is only safe where the destination already reads as zero.
    let sparse = !args.no_sparse && (args.sparse || fresh);
    let opts = CopyOptions {
        chunk_size: args.io_size,
        queue_depth: args.session.queue_depth,
        skip_zeros: sparse,
        verify: false,
        max_time: args.max_time,
        start_offset: args.resume_from.unwrap_or(0),
    };
    let mode = if args.no_progress {
        ProgressMode::None
    } else {
        args.progress
    };
    let todo = size.saturating_sub(opts.start_offset);
    let pb = progress(todo, mode == ProgressMode::Bar, "copy");
    let copied = Arc::new(AtomicU64::new(0));
    let reporter = (mode == ProgressMode::Json)
        .then(|| tokio::spawn(json_progress(copied.clone(), todo, Instant::now())));
    let r = initiator::copy::copy(&src, &dst, &opts, |p| {
        pb.set_position(p.bytes);
        copied.store(p.bytes, Ordering::Relaxed);
    })
    .await;
    if let Some(r) = reporter {
        r.abort();
    }
    let sessions: Vec<&Session> = [&src, &dst]
        .into_iter()
        .filter_map(|e| e.lun().map(Lun::session))
        .collect();
    let r = match r {
        Ok(r) => r,
        Err(
            e @ initiator::copy::CopyError::Interrupted {
                bytes,
                total_bytes,
                copied_prefix_bytes,
                ..
            },
        ) => {
            pb.finish_and_clear();
            let summary = CpSummary {
                src: redact(&args.src),
                dst: redact(&args.dst),
                bytes,
                total_bytes,
                complete: false,
                copied_prefix_bytes,
                skipped_zero_bytes: 0,
                seconds: 0.0,
                mb_per_s: 0.0,
                retries: sessions.iter().map(|s| s.retries()).sum(),
                reinstatements: sessions.iter().map(|s| s.reinstatements()).sum(),
                reassigned_tasks: sessions.iter().map(|s| s.reassigned_tasks()).sum(),
                reconnections: sessions.iter().map(|s| s.reconnections()).sum(),
                verified: false,
                checksum: None,
                io_size: opts.chunk_size,
                queue_depth: 0,
                sparse,
                sessions: Vec::new(),
                error: Some(chain(&e)),
            };
            for s in sessions {
                let _ = tokio::time::timeout(Duration::from_secs(5), s.logout()).await;
            }
            return Err(CpInterrupted { summary, source: e }.into());
        }
        Err(e) => return Err(e.into()),
    };
    pb.finish_and_clear();
    if mode == ProgressMode::Json {
        eprintln!(
            "{}",
            progress_line(
                r.bytes,
                todo,
                r.seconds,
                r.bytes as f64 / r.seconds.max(1e-9)
            )
        );
    }
    let checksum = if args.verify && r.complete {
        let pb = progress(size, true, "verify");
        let sum = initiator::copy::verify(&src, &dst, r.chunk_size, r.queue_depth, |p| {
            pb.set_position(p.bytes)
        })
        .await?;
        pb.finish_and_clear();
        Some(sum)
    } else {
        None
    };
    let summary = CpSummary {
        src: redact(&args.src),
        dst: redact(&args.dst),
        bytes: r.bytes,
        total_bytes: r.total_bytes,
        complete: r.complete,
        copied_prefix_bytes: r.copied_prefix_bytes,
        skipped_zero_bytes: r.skipped_zero_bytes,
        seconds: r.seconds,
        mb_per_s: r.bytes as f64 / 1e6 / r.seconds.max(1e-9),
        retries: sessions.iter().map(|s| s.retries()).sum(),
        reinstatements: sessions.iter().map(|s| s.reinstatements()).sum(),
        reassigned_tasks: sessions.iter().map(|s| s.reassigned_tasks()).sum(),
        reconnections: sessions.iter().map(|s| s.reconnections()).sum(),
        verified: checksum.is_some(),
        checksum: checksum.map(|c| format!("{c:08x}")),
        io_size: r.chunk_size,
        queue_depth: r.queue_depth,
        sparse,
        sessions: sessions.iter().map(|s| s.info()).collect(),
        error: None,
    };
    for s in sessions {
        let _ = s.logout().await;
    }
    Ok(summary)
}

/// One line of `--progress json`.
fn progress_line(bytes: u64, total: u64, seconds: f64, rate: f64) -> String {
    let avg = bytes as f64 / seconds.max(1e-9);
    let eta = (avg > 0.0).then(|| (total - bytes.min(total)) as f64 / avg);
    serde_json::json!({
        "seconds": (seconds * 1000.0).round() / 1000.0,
        "bytes": bytes,
        "total_bytes": total,
        "bytes_per_s": rate.round(),
        "eta_s": eta.map(|e| (e * 10.0).round() / 10.0),
    })
    .to_string()
}

/// `--progress json`: every second, bytes done, the rate over that second and the time
/// left at the average rate so far.
async fn json_progress(copied: Arc<AtomicU64>, total: u64, start: Instant) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut last = (0u64, start);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let bytes = copied.load(Ordering::Relaxed);
        let rate = (bytes - last.0) as f64 / now.duration_since(last.1).as_secs_f64().max(1e-9);
        last = (bytes, now);
        eprintln!(
            "{}",
            progress_line(bytes, total, now.duration_since(start).as_secs_f64(), rate)
        );
    }
}

/// A URL as the user gave it, without its password.
pub(crate) fn redact(spec: &str) -> String {
    if let Ok(u) = IsnsUrl::parse(spec) {
        return u.shown();
    }
    IscsiUrl::parse(spec)
        .map(|u| u.to_string())
        .unwrap_or_else(|_| spec.to_owned())
}

pub fn cp(args: CpArgs) -> anyhow::Result<std::process::ExitCode> {
    let s = match runtime()?.block_on(copy(&args)) {
        Ok(s) => s,
        Err(e) => match e.downcast::<CpInterrupted>() {
            Ok(i) => {
                let s = &i.summary;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(s)?);
                }
                eprintln!(
                    "rsv cp: {}\nrsv cp: to go on: rsv cp {} {} --resume-from {}{}",
                    s.error.as_deref().unwrap_or_default(),
                    s.src,
                    s.dst,
                    s.copied_prefix_bytes,
                    if args.sparse { " --sparse" } else { "" }
                );
                return Ok(std::process::ExitCode::from(EXIT_INTERRUPTED));
            }
            Err(e) => return Err(e),
        },
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        eprintln!(
            "{} {} in {:.2} s ({}){}{}{}{}",
            if s.complete {
                "copied"
            } else {
                "stopped by --max-time after"
            },
            if s.complete {
                Size(s.bytes).approx().to_string()
            } else {
                format!(
                    "{} of {} (all below offset {} done)",
                    Size(s.bytes).approx(),
                    Size(s.total_bytes).approx(),
                    s.copied_prefix_bytes
                )
            },
            s.seconds,
            Rate::measured(s.bytes, s.seconds).approx(),
            if s.skipped_zero_bytes > 0 {
                format!(", {} of zeros skipped", Size(s.skipped_zero_bytes).approx())
            } else {
                String::new()
            },
            if s.retries > 0 {
                format!(
                    ", {} retries, {} reinstatements",
                    s.retries, s.reinstatements
                )
            } else {
                String::new()
            },
            if s.reassigned_tasks > 0 || s.reconnections > 0 {
                format!(
                    ", {} commands reassigned, {} reconnections",
                    s.reassigned_tasks, s.reconnections
                )
            } else {
                String::new()
            },
            match &s.checksum {
                Some(c) => format!(", verified (crc32c {c})"),
                None => String::new(),
            }
        );
    }
    Ok(if s.complete {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(EXIT_STOPPED_BY_MAX_TIME)
    })
}

// ------------------------------------------------------------------------------- bench

#[derive(ValueEnum, Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Seq,
    Rand,
}

#[derive(ValueEnum, Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    Mixed,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// iscsi://host/TARGET-IQN/LUN or isns://SERVER/ALIAS-or-IQN/LUN
    pub url: String,
    #[command(flatten)]
    pub session: SessionFlags,
    #[arg(long, value_enum, default_value = "rand")]
    pub pattern: Pattern,
    #[arg(long, value_enum, default_value = "read")]
    pub rw: Rw,
    /// Percentage of reads with --rw mixed.
    #[arg(long, default_value_t = 70)]
    pub read_percent: u8,
    /// Bytes per command: 4096, 4k, 1M (powers of 1024; KB, MB are powers of 1000).
    #[arg(long, default_value = "4k", value_parser = units::parse_size)]
    pub block_size: u64,
    /// How long to issue I/O (seconds). Commands still in flight then are waited for (up
    /// to a quarter of this, at least a second) and counted, and the rate is over the time
    /// to the last completion: the figures are those of a transfer of everything issued,
    /// as a copy of that size would see. Commands not done by then are abandoned and the
    /// whole wait counts as time.
    #[arg(long, default_value = "10", value_parser = parse_duration_arg)]
    pub duration: Duration,
    /// Only touch the first SIZE bytes of the LUN (64M, 1G, ...).
    #[arg(long, value_parser = units::parse_size)]
    pub span: Option<u64>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct BenchReport {
    pub pattern: Pattern,
    pub rw: Rw,
    pub block_size: u64,
    pub queue_depth: usize,
    pub connections: usize,
    /// When the timed run began (after login), seconds since the Unix epoch: lines the
    /// run up with what others saw meanwhile (the lab's link counters).
    pub started_unix_s: f64,
    pub seconds: f64,
    pub ios: u64,
    pub iops: f64,
    #[serde(rename = "MB_per_s")]
    pub mb_per_s: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_max: u64,
    pub retries: u64,
    /// Commands that completed after the issuing window, counted (see `--duration`).
    pub drained_after_window: u64,
    /// MB completed in each second of the run, from its start (the last one may be part
    /// of a second, in the wait after the window). Completions lag the wire by the queue.
    pub per_second_mb: Vec<f64>,
    /// Commands not done when the wait after the window ran out: abandoned, not counted.
    pub abandoned_at_deadline: u64,
    /// The session as negotiated, with what auto-tuning chose and measured.
    pub session: SessionInfo,
}

pub async fn run_bench(args: &BenchArgs) -> anyhow::Result<BenchReport> {
    let url = target_url(&args.url, &args.session).await?;
    let mut opts = args.session.options(&url)?;
    opts.io_size_hint = Some(args.block_size);
    let lun = Lun::open_url(&url, &opts).await?;
    let s = lun.session().clone();
    let cap = lun.capacity().clone();
    // Workers: the session's queue depth, as given or as auto-tuning chose it.
    let queue_depth = s.queue_depth();
    let bs = u64::from(cap.block_size);
    let io = args.block_size.max(bs) / bs * bs;
    let span = args.span.unwrap_or(cap.bytes()).min(cap.bytes());
    let slots = span / io;
    if slots == 0 {
        bail!(
            "the LUN ({}) is smaller than one I/O of {io} bytes",
            Size(cap.bytes()).approx()
        );
    }
    let payload = {
        let mut b = vec![0u8; io as usize];
        rand::Rng::fill(&mut rand::thread_rng(), &mut b[..]);
        Bytes::from(b)
    };
    let seq = Arc::new(AtomicU64::new(0));
    let abandoned = Arc::new(AtomicU64::new(0));
    let drained = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let deadline = start + args.duration;
    // Commands in flight at the deadline hold data already on its way: a timed run that
    // dropped them would undercount a long fat pipe by up to its whole queue (32 commands
    // of 1 MiB are 2.7 s of a 100 Mbit/s link). They finish and count, up to a limit.
    let drain_end = deadline + (args.duration / 4).max(Duration::from_secs(1));
    let mut set = JoinSet::new();
    for worker in 0..queue_depth {
        let (s, lun, seq, payload, args, abandoned, drained) = (
            s.clone(),
            lun.clone(),
            seq.clone(),
            payload.clone(),
            args.clone(),
            abandoned.clone(),
            drained.clone(),
        );
        set.spawn(async move {
            let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut rng = rand::rngs::StdRng::from_entropy();
            use rand::{Rng, SeedableRng};
            // One timer for the worker's whole run rather than one per I/O; the clock is
            // read once per I/O, its end the next one's start.
            let end = tokio::time::sleep_until(drain_end.into());
            tokio::pin!(end);
            let mut t = Instant::now();
            let mut last = None;
            // Completed I/Os per second of the run.
            let mut per_second: Vec<u64> = Vec::new();
            while t < deadline {
                // A worker beyond the session's queue depth (auto-tuning cut it back on a
                // long path) sits out: its command would only wait for a slot, which is
                // not the command's latency, and at the deadline it would still be queued.
                if worker >= s.queue_depth() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    t = Instant::now();
                    continue;
                }
                let slot = match args.pattern {
                    Pattern::Seq => seq.fetch_add(1, Ordering::Relaxed) % slots,
                    Pattern::Rand => rng.gen_range(0..slots),
                };
                let read = match args.rw {
                    Rw::Read => true,
                    Rw::Write => false,
                    Rw::Mixed => rng.gen_range(0..100u8) < args.read_percent,
                };
                let one = async {
                    if read {
                        lun.read_at(slot * io, io as usize).await.map(drop)
                    } else {
                        lun.write_at(slot * io, payload.clone()).await
                    }
                };
                // A command stuck past the wait (many retransmission timeouts on a lossy
                // link) would keep the run going; it does not count.
                tokio::select! {
                    biased;
                    r = one => r?,
                    _ = &mut end => {
                        abandoned.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
                let done = Instant::now();
                h.saturating_record(done.duration_since(t).as_micros() as u64);
                if done >= deadline {
                    drained.fetch_add(1, Ordering::Relaxed);
                }
                let second = done.duration_since(start).as_secs() as usize;
                if per_second.len() <= second {
                    per_second.resize(second + 1, 0);
                }
                per_second[second] += 1;
                t = done;
                last = Some(done);
            }
            Ok::<_, initiator::Error>((h, last, per_second))
        });
    }
    let mut total = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut last = start;
    let mut per_second: Vec<u64> = Vec::new();
    while let Some(r) = set.join_next().await {
        let (h, l, ps) = r??;
        total.add(h).ok();
        last = last.max(l.unwrap_or(start));
        if per_second.len() < ps.len() {
            per_second.resize(ps.len(), 0);
        }
        for (a, b) in per_second.iter_mut().zip(ps) {
            *a += b;
        }
    }
    let abandoned = abandoned.load(Ordering::Relaxed);
    // To the last completion; with abandoned commands, the whole wait for them.
    let end = if abandoned > 0 {
        drain_end
    } else {
        last.max(deadline)
    };
    let seconds = end.duration_since(start).as_secs_f64();
    let per_second_mb = per_second.iter().map(|&n| (n * io) as f64 / 1e6).collect();
    let info = s.info();
    let report = BenchReport {
        pattern: args.pattern,
        rw: args.rw,
        block_size: io,
        queue_depth,
        connections: info.connections,
        started_unix_s,
        seconds,
        ios: total.len(),
        iops: total.len() as f64 / seconds,
        mb_per_s: total.len() as f64 * io as f64 / 1e6 / seconds,
        latency_us_p50: total.value_at_quantile(0.5),
        latency_us_p99: total.value_at_quantile(0.99),
        latency_us_p999: total.value_at_quantile(0.999),
        latency_us_max: total.max(),
        retries: s.retries(),
        drained_after_window: drained.load(Ordering::Relaxed),
        per_second_mb,
        abandoned_at_deadline: abandoned,
        session: info,
    };
    // Abandoned writes may leave data queued on the sockets, and the Logout would wait
    // behind it: give it a moment, then just close.
    let _ = tokio::time::timeout(Duration::from_secs(1), s.logout()).await;
    Ok(report)
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    // One thread: the reader task and the command tasks it wakes share a core, which
    // costs less than waking another thread per completion (measured on loopback, where
    // the target competes for the same cores, for 4 KiB and 1 MiB alike).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(run_bench(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{:?} {:?} bs={} qd={} conns={}: {:.0} IOPS, {}, latency p50 {} us, p99 {} us, p99.9 {} us ({} I/Os in {:.1} s)",
            r.pattern, r.rw, r.block_size, r.queue_depth, r.connections, r.iops,
            Rate::measured(r.ios * r.block_size, r.seconds).approx(),
            r.latency_us_p50, r.latency_us_p99, r.latency_us_p999, r.ios, r.seconds
        );
    }
    Ok(())
}
