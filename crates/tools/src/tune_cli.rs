//! `rsv tune URL`: what auto-tuning measures and chooses for a LUN's path, and why —
//! before a copy. With `--probe SECS` it also reads for that long and shows what the
//! connections measured meanwhile (rate, RTT, retransmits) and how the queue depth grew.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use units::{Rate, Size};

use crate::cli::SessionFlags;
use initiator::{Lun, PathReport, Session, SessionInfo};

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// iscsi://host/TARGET-IQN/LUN or isns://SERVER/ALIAS-or-IQN/LUN
    pub url: String,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Bytes per command the copy will use (sizes bursts and the queue depth): 256k, 1M.
    #[arg(long, default_value = "1m", value_parser = units::parse_size)]
    pub io_size: u64,
    /// Read sequentially for this many seconds and report what the connections measured.
    #[arg(long, default_value_t = 0.0)]
    pub probe: f64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug)]
pub struct TuneReport {
    pub session: SessionInfo,
    /// Bytes read by the probe and its rate (absent without --probe).
    pub probe_bytes: Option<u64>,
    pub probe_mb_per_s: Option<f64>,
    pub path: Option<PathReport>,
}

pub async fn run_tune(args: &TuneArgs) -> anyhow::Result<TuneReport> {
    let url = crate::cli::target_url(&args.url, &args.session).await?;
    let lun = url.lun_required()?;
    let mut opts = args.session.options(&url)?;
    opts.io_size_hint = Some(args.io_size);
    let s = Session::connect(&url, &opts).await?;
    let (mut probe_bytes, mut probe_rate) = (None, None);
    if args.probe > 0.0 {
        let l = Lun::open(s.clone(), lun).await?;
        let bs = u64::from(l.block_size());
        let io = (args.io_size.max(bs) / bs * bs).min(l.size());
        let slots = (l.size() / io).max(1);
        let deadline = Instant::now() + Duration::from_secs_f64(args.probe);
        let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        // One worker per allowed command; workers added as auto-tuning grows the depth.
        let mut workers = 0;
        loop {
            while workers < s.queue_depth() && Instant::now() < deadline {
                let (l, next, done) = (l.clone(), next.clone(), done.clone());
                set.spawn(async move {
                    while Instant::now() < deadline {
                        use std::sync::atomic::Ordering::Relaxed;
                        let slot = next.fetch_add(1, Relaxed) % slots;
                        l.read_at(slot * io, io as usize).await?;
                        done.fetch_add(io, Relaxed);
                    }
                    Ok::<_, initiator::Error>(())
                });
                workers += 1;
            }
            tokio::select! {
                r = set.join_next() => match r {
                    Some(r) => r??,
                    None => break,
                },
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        let b = done.load(std::sync::atomic::Ordering::Relaxed);
        probe_bytes = Some(b);
        probe_rate = Some(b as f64 / 1e6 / start.elapsed().as_secs_f64());
    }
    let session = s.info();
    let path = session.path.clone();
    let _ = s.logout().await;
    Ok(TuneReport {
        session,
        probe_bytes,
        probe_mb_per_s: probe_rate,
        path,
    })
}

pub fn tune(args: TuneArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(run_tune(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let i = &r.session;
    match &i.tuning {
        Some(p) => {
            println!(
                "measured: RTT {:.1} ms; sized for {} ({}), BDP {}",
                p.rtt_ms,
                Rate::from_bytes_per_sec(p.rate_bytes_per_s).approx(),
                p.rate_source,
                Size(p.bdp_bytes).approx()
            );
            println!("chosen, and why:");
            for reason in &p.reasons {
                println!("  - {reason}");
            }
        }
        None => println!("auto-tuning off: options as given"),
    }
    println!(
        "negotiated with {}: {} of {} connections, queue depth {}, InitialR2T={}, \
         ImmediateData={}, FirstBurstLength {}, MaxBurstLength {}, MaxRecvDataSegmentLength \
         {}/{}, digests {}/{}, ERL {}",
        i.target,
        i.connections,
        i.max_connections,
        i.queue_depth,
        yes(i.initial_r2t),
        yes(i.immediate_data),
        i.first_burst_length,
        i.max_burst_length,
        i.max_recv_data_segment_length,
        i.max_send_data_segment_length,
        if i.header_digest { "CRC32C" } else { "None" },
        if i.data_digest { "CRC32C" } else { "None" },
        i.error_recovery_level
    );
    if let Some(c) = &i.congestion_choice {
        println!(
            "congestion control ({}): {}",
            if c.by == "default" {
                "the default"
            } else {
                "given"
            },
            c.why
        );
    }
    println!(
        "socket: congestion {}, send buffer {}, receive buffer {}",
        i.congestion.as_deref().unwrap_or("default"),
        i.send_buffer,
        i.recv_buffer
    );
    if i.congestion_by_connection
        .iter()
        .any(|c| Some(c) != i.congestion.as_ref())
    {
        println!(
            "congestion by connection: {}",
            i.congestion_by_connection.join(", ")
        );
    }
    println!(
        "rsv (Reservoir's congestion control): {}",
        match (&i.rsv.why_not, i.rsv.registered_here, i.rsv.available) {
            (None, true, _) => "loaded and registered by this process".to_owned(),
            (None, false, _) => "loaded; the name is held by another process".to_owned(),
            (Some(w), _, true) => format!("not loaded here ({w}); registered by another process"),
            (Some(w), _, false) => format!("not loaded ({w})"),
        }
    );
    if let Some(p) = &i.rsv.probe_rtt {
        println!(
            "rsv PROBE_RTT, this session's {} connections in turn: {} entered, {} skipped \
             (another's samples kept the minimum), {} deferred, at most {} at once",
            p.members, p.probes, p.skipped, p.deferred, p.max_probing
        );
    }
    println!("target pacing: {}", i.target_pacing.summary());
    if let Some(g) = &i.multipath {
        println!(
            "gateway group: in use {}, {} failovers so far",
            g.current, g.failovers
        );
        for p in &g.paths {
            println!(
                "  {} group {} ALUA {}{}",
                p.portal,
                p.group.map_or("?".to_owned(), |g| g.to_string()),
                p.state.map_or("not known yet", |s| s.name()),
                if p.portal == g.current {
                    " (in use)"
                } else {
                    ""
                }
            );
        }
    }
    println!(
        "transport: {}",
        i.tls.as_deref().map_or("plain TCP".to_owned(), |t| format!(
            "TLS ({t}), every connection"
        ))
    );
    if let (Some(b), Some(rate)) = (r.probe_bytes, r.probe_mb_per_s) {
        let rate = Rate::from_bytes_per_sec((rate * 1e6) as u64).approx();
        println!("probe: read {} at {rate}", Size(b).approx());
    }
    if let Some(p) = &r.path {
        println!(
            "path as measured by {} connections: min RTT {:.1} ms, smoothed RTT {:.1} ms, \
             {}, {} retransmits",
            p.connections_sampled,
            p.min_rtt_ms,
            p.srtt_ms,
            Rate::from_bytes_per_sec(p.rate_bytes_per_s).approx(),
            p.retransmits
        );
    }
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}
