//! `rsv cp`: a copy between files, block devices and LUNs, with progress and resume.

use super::*;

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
    /// Where the wall-clock time went: logins (with the RTT probe and the congestion
    /// control's load), the copy (`seconds`), its final flush, and the logout.
    pub phases: CpPhases,
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
        // The copy starts once the leading connection is in; the others join a round trip
        // later (they need the session's TSIH), instead of holding the first chunk back.
        opts.join_late = true;
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

/// Seconds of a copy's phases, in order (`rsv cp --json`'s `.phases`).
#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct CpPhases {
    /// Opening both ends: discovery, the RTT probe, the congestion control's decision and
    /// every login.
    pub connect_s: f64,
    /// The copy, first chunk to the destination's flush (`seconds`).
    pub copy_s: f64,
    /// Of `copy_s`, the final flush (SYNCHRONIZE CACHE on a LUN).
    pub flush_s: f64,
    /// The sessions' logouts.
    pub logout_s: f64,
}

/// Copies with `args`; the library entry point behind `rsv cp`.
pub async fn copy(args: &CpArgs) -> anyhow::Result<CpSummary> {
    let opened = Instant::now();
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
    let connect_s = opened.elapsed().as_secs_f64();
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
                phases: CpPhases {
                    connect_s,
                    ..CpPhases::default()
                },
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
        phases: CpPhases {
            connect_s,
            copy_s: r.seconds,
            flush_s: r.flush_seconds,
            logout_s: 0.0,
        },
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
    let mut summary = summary;
    let logout = Instant::now();
    for s in sessions {
        let _ = s.logout().await;
    }
    summary.phases.logout_s = logout.elapsed().as_secs_f64();
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
