//! `rsv media`: a media server over iSCSI storage. It finds storage in iSNS (and takes
//! `iscsi://` URLs), logs in to a target on the first request that needs it, reads the
//! file system on each LUN in-process (ext2/3/4 through `ext4-view`, FAT through
//! `fatfs`; no kernel mount, no root), lists the media as a page and as JSON, and serves
//! files over HTTP/1.1 with ranges. Storage idle for a while is logged out of; storage
//! that leaves iSNS leaves the listing (polled, and at once on the server's SCNs).
//!
//! Sans-IO: [`http`] (which requests are taken, ranges, answer heads, percent-encoding),
//! [`listing`] (the model, its JSON and HTML, routes), [`readahead`] (what to read ahead
//! of a stream), [`ext4layout`] (where an ext4 file system keeps no file data, for the
//! read-ahead to step over), [`mime`], [`volume::probe`]. I/O: [`server`] (hyper on the
//! HTTP sockets), [`storage`] (sessions, the LUN as a device), [`volume`] (a file system
//! reader on its own thread).

pub mod ext4layout;
pub mod http;
pub mod listing;
pub mod metrics;
pub mod mime;
pub mod readahead;
pub mod server;
pub mod storage;
pub mod volume;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

#[derive(Args, Debug, Clone)]
#[command(after_help = "\
Pages: /  (the media, HTML)   /api/media  (the same as JSON; ?refresh=1 lists again)
       /media/STORAGE/LUN/PATH  (a file, with Range)   /play/STORAGE/LUN/PATH  (a player)
STORAGE is the target's alias, or its IQN.

Examples:
  rsv media --isns 10.0.0.5 --listen 0.0.0.0:8080
  rsv media iscsi://nas.home/iqn.2026-11.org.reservoir:media/0")]
pub struct MediaArgs {
    /// Storage given directly: iscsi://HOST[:PORT]/IQN[/LUN] (every LUN without one).
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,
    /// iSNS server to find storage in, HOST[:PORT] (repeatable).
    #[arg(long, value_name = "SERVER")]
    pub isns: Vec<String>,
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// How often to ask the iSNS servers what storage there is (and at once when one
    /// sends a state-change notification).
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub poll: Duration,
    /// Log out of storage with no request for this long (reopened on the next one).
    #[arg(long, default_value = "60s", value_parser = units::parse_duration)]
    pub idle: Duration,
    /// The path's rate, for read-ahead (four times RTT × rate) and the sessions' tuning;
    /// default: what auto-tuning assumes.
    #[arg(long, value_parser = units::parse_rate)]
    pub rate: Option<units::Rate>,
    /// Read-ahead per stream, overriding RTT × rate (e.g. 4M).
    #[arg(long, value_parser = units::parse_size)]
    pub readahead: Option<u64>,
    /// How long a session keeps trying to recover a lost target before requests fail.
    #[arg(long, default_value = "10s", value_parser = units::parse_duration)]
    pub recovery_timeout: Duration,
    /// iSCSI initiator name (default: Reservoir's, per host).
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// Serve nothing: read this file of the one URL's volume from start to end in calls of
    /// --call-size, as an application on the media server would, and print what it took
    /// as JSON (login, first byte, rate). The lab's R4 reader.
    #[arg(long, value_name = "PATH")]
    pub read: Option<String>,
    /// Bytes per read call with --read.
    #[arg(long, default_value = "32K", value_parser = units::parse_size)]
    pub call_size: u64,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics (off unless
    /// given): requests by route and status, bytes sent, streams, iSNS lookups, logins and
    /// sessions, each storage LUN's reads (docs/media.md).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// The most series of storage LUNs one scrape carries (17 each); those past it are
    /// left out, and the log says so once.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub metrics_max_series: u64,
}

/// What `--read` measured.
#[derive(serde::Serialize, Debug)]
pub struct ReadReport {
    pub path: String,
    pub bytes: u64,
    pub call_size: u64,
    pub calls: u64,
    /// Session login, LUN and file system opened.
    pub open_ms: f64,
    /// From asking for the file to its first call's bytes (session already open).
    pub first_byte_ms: f64,
    /// The whole read, first call to last.
    pub seconds: f64,
    pub mbit_per_s: f64,
    pub readahead_bytes: u64,
    pub rtt_ms: Option<f64>,
    /// The session's connections.
    pub connections: usize,
    /// Pacing per connection, bytes per second (auto-tuning's, with a given rate).
    pub pacing_rate: Option<u64>,
    /// Units of the device asked for, and small reads of their own.
    pub units: u64,
    pub small_reads: u64,
    /// Units read-ahead stepped over (the file system's metadata and journal).
    pub skipped_units: u64,
    /// How often, and for how long in all, a call waited for a unit still on its way.
    pub waits: u64,
    pub waited_s: f64,
    /// Per wait on average: units beyond the awaited one already arrived, and still on
    /// their way (the awaited unit late behind later ones says its connection lagged).
    pub ready_ahead_at_waits: f64,
    pub pending_ahead_at_waits: f64,
}

fn read_file(
    args: &MediaArgs,
    opts: &initiator::SessionOptions,
    path: &str,
) -> anyhow::Result<ReadReport> {
    use std::time::Instant;
    let [url] = &args.urls[..] else {
        anyhow::bail!("--read needs exactly one iscsi://HOST/IQN/LUN URL");
    };
    let src = storage::from_url(url).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let lun = src
        .lun
        .ok_or_else(|| anyhow::anyhow!("{url}: name the LUN (iscsi://HOST/IQN/LUN)"))?;
    let call = usize::try_from(args.call_size.clamp(1, 64 << 20)).unwrap_or(1 << 20);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let t0 = Instant::now();
        let opened = storage::open_volume(&src, lun, opts, args.readahead)
            .await
            .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
        let vol = &opened.volume;
        let open_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let len = vol
            .stat(path)
            .await
            .map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
        let mut off = 0u64;
        let mut calls = 0u64;
        let mut first_byte_ms = 0.0;
        while off < len {
            let b = vol
                .read(path, off, call)
                .await
                .map_err(|e| anyhow::anyhow!("{path} at {off}: {e}"))?;
            if calls == 0 {
                first_byte_ms = t1.elapsed().as_secs_f64() * 1e3;
            }
            if b.is_empty() {
                anyhow::bail!("{path}: ended at {off} of {len} bytes");
            }
            off += b.len() as u64;
            calls += 1;
        }
        let seconds = t1.elapsed().as_secs_f64();
        let info = opened.session.info();
        let st = &opened.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let waits = get(&st.waits);
        let per_wait = |a| get(a) as f64 / waits.max(1) as f64;
        Ok(ReadReport {
            path: path.to_owned(),
            bytes: off,
            call_size: call as u64,
            calls,
            open_ms,
            first_byte_ms,
            seconds,
            mbit_per_s: off as f64 * 8.0 / seconds.max(1e-9) / 1e6,
            readahead_bytes: opened.window,
            rtt_ms: opened.rtt_ms,
            connections: info.connections,
            pacing_rate: info.tuning.as_ref().and_then(|p| p.pacing_rate),
            units: get(&st.units),
            small_reads: get(&st.small_reads),
            skipped_units: get(&st.skipped),
            waits,
            waited_s: get(&st.wait_ns) as f64 / 1e9,
            ready_ahead_at_waits: per_wait(&st.ready_ahead_at_waits),
            pending_ahead_at_waits: per_wait(&st.pending_ahead_at_waits),
        })
    })
}

/// The session options of `rsv media` (server and `--read`): auto-tuned, with the given
/// rate, the queue depth in the device's units; each storage's URL may add its own, and
/// [`storage::stream_connections`] then chooses the connections.
pub fn session_options(args: &MediaArgs) -> initiator::SessionOptions {
    let mut opts = initiator::SessionOptions::default();
    if let Some(n) = &args.initiator_name {
        opts.initiator_name = n.clone();
    }
    // A request waits for the leading connection's login only; others would join later.
    opts.join_late = true;
    // The queue depth in commands of the size the device reads in.
    opts.io_size_hint = Some(readahead::UNIT);
    opts.recovery_timeout = args.recovery_timeout;
    opts.command_timeout = args.recovery_timeout.max(Duration::from_secs(5));
    if let Some(r) = args.rate {
        opts.rate = Some(r.bytes_per_sec());
    }
    opts
}

pub fn run(args: MediaArgs) -> anyhow::Result<()> {
    if let Some(path) = args.read.clone() {
        let opts = session_options(&args);
        let r = read_file(&args, &opts, &path)?;
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if args.urls.is_empty() && args.isns.is_empty() {
        anyhow::bail!(
            "nothing to serve: give --isns SERVER or iscsi:// URLs (see rsv media --help)"
        );
    }
    let opts = session_options(&args);
    let mut direct = Vec::new();
    for u in &args.urls {
        direct.push(storage::from_url(u).map_err(|e| anyhow::anyhow!("{u}: {e}"))?);
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let catalog = storage::Catalog::new(opts.clone(), args.readahead);
        catalog.update("url", direct);
        if let Some(addr) = args.metrics {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for metrics on {addr}"))?;
            println!("metrics {}", l.local_addr()?);
            let max = usize::try_from(args.metrics_max_series).unwrap_or(usize::MAX);
            let registry = std::sync::Arc::new(metrics::registry(&catalog, max));
            tokio::spawn(rsv_metrics::serve(l, registry));
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        println!("listening {}", listener.local_addr()?);
        // The first look at iSNS before "ready", so that a listing right after finds it.
        for server in &args.isns {
            poll_once(&catalog, server, &opts.initiator_name).await;
        }
        // Told to the SCN watchers at shutdown: they deregister.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut watchers = Vec::new();
        for server in args.isns.clone() {
            let c = catalog.clone();
            let name = opts.initiator_name.clone();
            let every = args.poll.max(Duration::from_millis(200));
            // An SCN from the server (storage registered or gone) asks at once.
            let changed = std::sync::Arc::new(tokio::sync::Notify::new());
            watchers.push(tokio::spawn(watch_scn(
                server.clone(),
                name.clone(),
                changed.clone(),
                stop_rx.clone(),
            )));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = changed.notified() => {}
                    }
                    poll_once(&c, &server, &name).await;
                }
            });
        }
        tokio::spawn(catalog.clone().reap(args.idle));
        println!("ready");
        let serve = server::serve(listener, catalog);
        let r = tokio::select! {
            r = serve => r.context("serving"),
            _ = shutdown() => {
                tracing::info!("stopping");
                Ok(())
            }
        };
        let _ = stop_tx.send(true);
        for w in watchers {
            let _ = tokio::time::timeout(Duration::from_secs(3), w).await;
        }
        r
    })
}

/// Keeps a registration for SCNs with `server`, notifying `changed` when it is made and
/// on each SCN, until `stop`. A connection lost or a registration refused is tried again
/// after 1 s, doubling up to 5 minutes while it keeps failing (open-isns refuses every
/// time: it sends SCNs only to a registered SCN port); the poll goes on meanwhile.
async fn watch_scn(
    server: String,
    initiator_name: String,
    changed: std::sync::Arc<tokio::sync::Notify>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Ok(u) = initiator::isns::IsnsUrl::parse(&format!("isns://{server}/")) else {
        return;
    };
    const FIRST: Duration = Duration::from_secs(1);
    const MOST: Duration = Duration::from_secs(300);
    let mut wait = FIRST;
    loop {
        let n = changed.clone();
        let began = tokio::time::Instant::now();
        match initiator::isns::watch(&u, &initiator_name, move || n.notify_one(), stop.clone())
            .await
        {
            Ok(()) => return,
            Err(e) => {
                // A watch that held for a while starts the backoff again.
                if began.elapsed() > MOST {
                    wait = FIRST;
                }
                if wait == FIRST {
                    tracing::info!("iSNS {server}: no SCNs ({e}); polling, trying again");
                } else {
                    tracing::debug!("iSNS {server}: no SCNs: {e}; again in {wait:?}");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = initiator::isns::stopped(&mut stop) => return,
        }
        wait = (wait * 2).min(MOST);
    }
}

/// One look at an iSNS server; a server that does not answer changes nothing.
async fn poll_once(catalog: &storage::Catalog, server: &str, initiator_name: &str) {
    let found = storage::from_isns(server, initiator_name).await;
    catalog.stats().lookup(found.is_ok());
    match found {
        Ok(found) => catalog.update(&format!("isns {server}"), found),
        Err(e) => tracing::warn!("iSNS {server}: {e}"),
    }
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use storage::{stream_connections, STREAM_CONNECTIONS};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        media: MediaArgs,
    }

    /// The options a session of `rsv media --rate 100mbit URL` gets.
    fn opts_for(url: &str) -> initiator::SessionOptions {
        let a = Cli::parse_from(["media", "--rate", "100mbit", url]).media;
        let u = initiator::IscsiUrl::parse(url).unwrap();
        let mut o = u.options(&session_options(&a)).unwrap();
        stream_connections(&mut o);
        o
    }

    fn plan_for(opts: &initiator::SessionOptions, rtt_ms: u32) -> initiator::tune::Plan {
        let probe = initiator::tune::Probe {
            rtt_us: rtt_ms * 1000,
            mss: 1448,
            remembered: None,
            congestion_default: None,
        };
        // The lab's namespaces: the kernel's defaults, autotuning up to 4 and 32 MiB.
        let kernel = net::KernelLimits {
            tcp_wmem_max: 4 << 20,
            tcp_rmem_max: 32 << 20,
            wmem_max: 212_992,
            rmem_max: 212_992,
            can_force: false,
        };
        initiator::tune::plan(opts, &probe, &kernel).1
    }

    #[test]
    fn one_connection_at_the_whole_rate() {
        let opts = opts_for("iscsi://h/iqn.x:y/0");
        // A 48 ms path with a given rate: auto-tuning alone opens eight paced connections.
        let mut plain = opts.clone();
        plain.pinned.remove("connections");
        assert_eq!(plan_for(&plain, 48).connections, 8);
        // A media session: one, paced at the whole rate plus 5 %.
        for rtt in [1, 16, 32, 48] {
            let p = plan_for(&opts, rtt);
            assert_eq!(p.connections, STREAM_CONNECTIONS, "rtt {rtt} ms");
            assert_eq!(p.pacing_rate, Some(12_500_000 + 625_000), "rtt {rtt} ms");
        }
        // The read-ahead: four round trips and one unit on its connection.
        let w = readahead::window_bytes(Duration::from_millis(32), 12_500_000, 1);
        assert_eq!(w, 1_600_000 + readahead::UNIT);
    }

    #[test]
    fn a_small_receive_buffer_or_the_url_keeps_more() {
        // The URL's count wins.
        let o = opts_for("iscsi://h/iqn.x:y/0?connections=4");
        assert_eq!(plan_for(&o, 48).connections, 4);
        // A receive buffer set by hand (the study's 64 KB window) cannot hold a stream's
        // round trip on one connection: auto-tuning's count, as for any session.
        let o = opts_for("iscsi://h/iqn.x:y/0?recv_buffer=32768");
        assert!(!o.is_pinned("connections"));
        assert_eq!(plan_for(&o, 48).connections, 8);
        assert_eq!(plan_for(&o, 24).connections, 4);
    }
}
