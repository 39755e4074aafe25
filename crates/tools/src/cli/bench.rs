//! `rsv bench`: a load of reads or writes against a LUN, and its figures.

use super::*;

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
