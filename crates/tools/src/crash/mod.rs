//! `rsv crash`: the crash-consistency checker. It runs Reservoir targets as processes
//! (this binary's `rsv target`), writes sequence-stamped units through Reservoir's
//! initiator, kills a target with SIGKILL at a random moment, starts it again on the same
//! port, and reads every unit back: every write known durable must be there, and no unit
//! may hold bytes never written to it (`model` has the rules).
//!
//! Each round:
//! 1. log in to the front target; `--writers` tasks write 1..8 units at a time to units
//!    of their own (one command in flight per writer), a quarter with FUA, the others
//!    made durable by a SYNCHRONIZE CACHE every few writes;
//! 2. after a random time in `--min-run..--max-run`, SIGKILL the victim: the target, or
//!    with `--stripe N` either the file server or one of its N disk servers (`rsv target`
//!    whose LUN stripes over the disk servers' LUNs);
//! 3. a killed front target takes its session with it (the writers are stopped); a killed
//!    disk server is started again while the writers wait, and their commands finish
//!    through the file server's recovery of its member;
//! 4. the victim is started again on its port, the checker logs in anew, reads the whole
//!    LUN and judges every unit, then SYNCHRONIZE CACHE: what it read is the new baseline.
//!
//! With `--url`, no target is run: the writers write to that LUN (a gateway group's, its
//! `?portal=` and `?pr_key=` options in the URL) until `--duration` or a signal, while
//! something else kills the gateways (scripts/bench-failover-rbd.sh), and the whole
//! region is then read back through the same session and judged once. There a writer's
//! error counts: the application must see none across a failover.
//!
//! A SIGKILL leaves the page cache alone, so a file store keeps every write that reached
//! it: the rounds find data lost in the target's own hands (a write acknowledged before
//! it reached the store, a member's write the file server acknowledged too early, a
//! reissued write landing over a newer one). `--store ram:?size=...` is the control: a
//! RAM store loses everything at a kill, and the checker must say so.

pub mod model;

use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use initiator::{IscsiUrl, Lun, SessionOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use model::{Model, Verdict, UNIT};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Exits 0 when every round verified with no loss and no phantom, 1 otherwise (or on an
error). The README names the long run:
  rsv crash --rounds 100
  rsv crash --rounds 100 --stripe 2
Against a gateway group that something else fails over (no target run here):
  rsv crash --url 'iscsi://GW1/IQN/0?portal=GW2&pr_key=0xabc&pr_type=we_ro' --duration 10m")]
pub struct CrashArgs {
    /// Rounds of write, kill, restart, verify.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Size of the LUN written (with --stripe: of the volume).
    #[arg(long, default_value = "64MiB")]
    pub size: String,
    /// Writers, each with units of its own and one command in flight.
    #[arg(long, default_value_t = 8)]
    pub writers: u32,
    /// A file server striping over this many disk servers; each round kills one of them
    /// or the file server.
    #[arg(long, default_value_t = 0)]
    pub stripe: u32,
    /// The LUN's store without --stripe, as a store spec relative to its data directory
    /// (default `file:lun.img?size=SIZE`); `ram:?size=SIZE` must lose data.
    #[arg(long, conflicts_with = "stripe")]
    pub store: Option<String>,
    /// Writing time before the kill, at least...
    #[arg(long, default_value = "20ms")]
    pub min_run: String,
    /// ...and at most.
    #[arg(long, default_value = "500ms")]
    pub max_run: String,
    /// Seed of the random choices (default: from the clock); printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where the targets keep their data and logs (default: a new directory under the
    /// system's temporary directory, removed after a clean run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The `rsv` that runs the targets (default: this one).
    #[arg(long)]
    pub rsv: Option<PathBuf>,
    /// Write to this LUN instead of running targets (iscsi://HOST[:PORT]/IQN/LUN with its
    /// options: `portal=` for a gateway group, `pr_key=`/`pr_type=` for a reservation);
    /// the first --size of it is read as the baseline, written until --duration or
    /// SIGINT/SIGTERM, then read back and judged. Writers' errors count as failures.
    #[arg(long, conflicts_with_all = ["stripe", "store", "rounds", "rsv", "dir"])]
    pub url: Option<String>,
    /// With --url: how long the writers run (SIGINT or SIGTERM ends it sooner).
    #[arg(long, default_value = "60s", requires = "url")]
    pub duration: String,
    /// With --url: list every write or flush that took at least this long in the JSON
    /// summary's `slow_commands` (a failover bench finds each kill's stall there).
    #[arg(long, requires = "url")]
    pub slow: Option<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What a run found, printed at the end.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub seed: u64,
    pub rounds: u32,
    pub units: u64,
    /// Kills by victim: "target", "file server", "disk server N".
    pub kills: std::collections::BTreeMap<String, u32>,
    pub writes_issued: u64,
    pub writes_acknowledged: u64,
    pub fua_writes: u64,
    pub flushes_acknowledged: u64,
    /// Units whose durable generation was checked (not zero), summed over rounds.
    pub durable_units_checked: u64,
    pub losses: u64,
    pub phantoms: u64,
    /// The first findings, one line each.
    pub findings: Vec<String>,
    /// Rounds whose writers did not finish within a minute of a disk server's return.
    pub stuck_rounds: u32,
    /// With --url: errors the writers saw (each ends its writer).
    pub errors: u64,
    /// With --url and --slow: the slow writes and flushes, in the order they ended.
    pub slow_commands: Vec<crate::load::SlowCommand>,
    pub seconds: f64,
}

impl Summary {
    /// Prints the summary: as JSON, or as one line of counts (`head`: the run's length,
    /// `tail`: what only that mode counts) and the findings, one a line.
    fn print(&self, json: bool, head: &str, tail: &str) -> anyhow::Result<()> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
            return Ok(());
        }
        println!(
            "{head}: {} writes issued, {} acknowledged ({} FUA), {} flushes; {} durable units \
             checked; {} lost, {} phantom, {tail}",
            self.writes_issued,
            self.writes_acknowledged,
            self.fua_writes,
            self.flushes_acknowledged,
            self.durable_units_checked,
            self.losses,
            self.phantoms,
        );
        for f in &self.findings {
            println!("  {f}");
        }
        Ok(())
    }
}

#[derive(Default)]
struct Counters {
    issued: AtomicU64,
    acked: AtomicU64,
    fua: AtomicU64,
    flushes: AtomicU64,
    /// --slow, and the commands found so (at most 100,000).
    slow_from: Option<Duration>,
    slow: Mutex<Vec<crate::load::SlowCommand>>,
}

impl Counters {
    /// A write (or flush) begun at `t` has its answer.
    fn took(&self, t: Instant, write: bool) {
        let took = t.elapsed();
        if self.slow_from.is_some_and(|s| took >= s) {
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_sub(took);
            let mut slow = self.slow.lock().unwrap();
            if slow.len() < 100_000 {
                slow.push(crate::load::SlowCommand {
                    start_unix_s: start.as_secs_f64(),
                    seconds: took.as_secs_f64(),
                    write,
                });
            }
        }
    }
}

/// One `rsv target` process, started again on the same port after a kill.
struct Daemon {
    name: String,
    rsv: PathBuf,
    config: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Daemon {
    fn new(rsv: &Path, dir: &Path, name: &str, config: &str) -> anyhow::Result<Daemon> {
        let home = dir.join(name.replace(' ', "-"));
        std::fs::create_dir_all(&home)?;
        let cfg = home.join("target.toml");
        std::fs::write(&cfg, config)?;
        Ok(Daemon {
            name: name.to_owned(),
            rsv: rsv.to_owned(),
            config: cfg,
            data_dir: home.join("data"),
            log: home.join("target.log"),
            port: 0,
            child: None,
        })
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut child = Command::new(&self.rsv)
                .arg("target")
                .arg("--listen")
                .arg(format!("127.0.0.1:{}", self.port))
                .arg("--data-dir")
                .arg(&self.data_dir)
                .arg("--config")
                .arg(&self.config)
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or("warn".into()),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log.try_clone()?)
                .spawn()
                .with_context(|| format!("starting {}", self.rsv.display()))?;
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            let mut port = None;
            let ready = loop {
                line.clear();
                if out.read_line(&mut line)? == 0 {
                    break false;
                }
                let l = line.trim();
                if let Some(p) = l.strip_prefix("portal ") {
                    port = p.rsplit(':').next().and_then(|p| p.parse().ok());
                }
                if l == "ready" {
                    break true;
                }
            };
            if ready {
                self.port = port.ok_or_else(|| anyhow!("{}: no portal line", self.name))?;
                self.child = Some(child);
                // Keep reading its stdout so that it never blocks on a full pipe.
                std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
                return Ok(());
            }
            let _ = child.wait();
            // The port of a process just killed may take a moment to be free again.
            if Instant::now() > deadline {
                bail!(
                    "{} did not start again on port {}; its log: {}",
                    self.name,
                    self.port,
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn url(&self, iqn: &str) -> String {
        format!("iscsi://127.0.0.1:{}/{iqn}/0", self.port)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

const FRONT_IQN: &str = "iqn.2026-11.org.reservoir:crash";

fn disk_iqn(i: u32) -> String {
    format!("iqn.2026-11.org.reservoir:crash-disk{i}")
}

fn lun_config(iqn: &str, store: &str) -> String {
    format!("[[target]]\niqn = \"{iqn}\"\n[[target.lun]]\nid = 0\nstore = \"{store}\"\n")
}

pub fn run(args: CrashArgs) -> anyhow::Result<bool> {
    if let Some(url) = args.url.clone() {
        return run_url(&url, &args);
    }
    let size = units::parse_size(&args.size).map_err(|e| anyhow!("--size: {e}"))?;
    let min_run = units::parse_duration(&args.min_run).map_err(|e| anyhow!("--min-run: {e}"))?;
    let max_run = units::parse_duration(&args.max_run).map_err(|e| anyhow!("--max-run: {e}"))?;
    if max_run < min_run {
        bail!("--max-run is shorter than --min-run");
    }
    if args.writers == 0 {
        bail!("--writers must be at least 1");
    }
    let stripe_unit: u64 = 64 << 10;
    let size = if args.stripe > 0 {
        size / (stripe_unit * args.stripe as u64) * stripe_unit * args.stripe as u64
    } else {
        size / UNIT as u64 * UNIT as u64
    };
    let units_n = size / UNIT as u64;
    if units_n < args.writers as u64 * 8 {
        bail!("--size is too small for {} writers", args.writers);
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let rsv = match &args.rsv {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let (dir, temp) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (d.clone(), None)
        }
        None => {
            let t = std::env::temp_dir().join(format!("rsv-crash-{}", std::process::id()));
            std::fs::create_dir_all(&t)?;
            (t.clone(), Some(t))
        }
    };
    if !args.json {
        println!(
            "rsv crash: seed {seed}, {} units of {UNIT} bytes, data in {}",
            units_n,
            dir.display()
        );
    }

    // The daemons: [front] or [front, disk 0, disk 1, ...].
    let mut daemons = Vec::new();
    if args.stripe == 0 {
        let store = args
            .store
            .clone()
            .unwrap_or_else(|| format!("file:lun.img?size={size}"));
        daemons.push(Daemon::new(
            &rsv,
            &dir,
            "target",
            &lun_config(FRONT_IQN, &store),
        )?);
        daemons[0].start()?;
    } else {
        let member = size / args.stripe as u64;
        let mut urls = Vec::new();
        for i in 0..args.stripe {
            let mut d = Daemon::new(
                &rsv,
                &dir,
                &format!("disk server {i}"),
                &lun_config(&disk_iqn(i), &format!("file:disk.img?size={member}")),
            )?;
            d.start()?;
            urls.push(d.url(&disk_iqn(i)));
            daemons.push(d);
        }
        let store = format!("stripe:?unit={stripe_unit}&members=[{}]", urls.join(","));
        let mut front = Daemon::new(&rsv, &dir, "file server", &lun_config(FRONT_IQN, &store))?;
        front.start()?;
        daemons.insert(0, front);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut summary = Summary {
        seed,
        units: units_n,
        ..Default::default()
    };
    let model = Arc::new(Mutex::new(Model::new(seed, units_n)));
    let gen = Arc::new(AtomicU64::new(1));
    let counters = Arc::new(Counters::default());
    let front_url = IscsiUrl::parse(&daemons[0].url(FRONT_IQN))?;

    for round in 1..=args.rounds {
        let victim = if args.stripe == 0 {
            0
        } else {
            rng.gen_range(0..daemons.len())
        };
        let run_for = min_run + (max_run - min_run).mul_f64(rng.gen::<f64>());
        let round_seed = rng.gen::<u64>();
        let stuck = rt.block_on(write_and_kill(
            &front_url,
            &mut daemons,
            victim,
            run_for,
            round_seed,
            args.writers,
            &model,
            &gen,
            &counters,
        ))?;
        if stuck {
            summary.stuck_rounds += 1;
        }
        *summary
            .kills
            .entry(daemons[victim].name.clone())
            .or_default() += 1;
        let (checked, lost, phantom, findings) = rt.block_on(verify(&front_url, &model))?;
        summary.rounds = round;
        summary.durable_units_checked += checked;
        summary.losses += lost;
        summary.phantoms += phantom;
        for f in findings {
            if summary.findings.len() < 20 {
                summary.findings.push(format!("round {round}: {f}"));
            }
        }
        if !args.json {
            println!(
                "round {round}: killed {} after {} ms; {checked} durable units checked, {lost} lost, {phantom} phantom{}",
                daemons[victim].name,
                run_for.as_millis(),
                if stuck { ", writers stuck" } else { "" }
            );
        }
    }
    summary.writes_issued = counters.issued.load(Ordering::Relaxed);
    summary.writes_acknowledged = counters.acked.load(Ordering::Relaxed);
    summary.fua_writes = counters.fua.load(Ordering::Relaxed);
    summary.flushes_acknowledged = counters.flushes.load(Ordering::Relaxed);
    summary.seconds = started.elapsed().as_secs_f64();
    let clean = summary.losses == 0 && summary.phantoms == 0 && summary.stuck_rounds == 0;
    summary.print(
        args.json,
        &format!("{} rounds in {:.1} s", summary.rounds, summary.seconds),
        &format!("{} rounds stuck", summary.stuck_rounds),
    )?;
    drop(daemons);
    if let (Some(t), true) = (temp, clean) {
        let _ = std::fs::remove_dir_all(t);
    }
    Ok(clean)
}

fn options() -> SessionOptions {
    SessionOptions {
        auto_tune: false,
        queue_depth: 64,
        // A session whose target is gone for good gives up within seconds; a disk
        // server's return is the file server's to wait for, not ours.
        recovery_timeout: Duration::from_secs(5),
        ..SessionOptions::default()
    }
}

/// Logs in, retrying while a target that was just started comes up.
async fn connect(url: &IscsiUrl) -> anyhow::Result<Arc<Lun>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tokio::time::timeout(Duration::from_secs(20), Lun::open_url(url, &options())).await {
            Ok(Ok(l)) => return Ok(Arc::new(l)),
            Ok(Err(e)) if Instant::now() > deadline => return Err(e.into()),
            Err(_) if Instant::now() > deadline => bail!("login to {:?} hangs", url.target),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One round's writing and the kill; true when the writers did not finish after a disk
/// server came back.
#[allow(clippy::too_many_arguments)]
async fn write_and_kill(
    url: &IscsiUrl,
    daemons: &mut [Daemon],
    victim: usize,
    run_for: Duration,
    seed: u64,
    writers: u32,
    model: &Arc<Mutex<Model>>,
    gen: &Arc<AtomicU64>,
    counters: &Arc<Counters>,
) -> anyhow::Result<bool> {
    let lun = connect(url).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let units_n = model.lock().unwrap().units();
    let per = units_n / writers as u64;
    let mut tasks = Vec::new();
    for w in 0..writers as u64 {
        tasks.push(tokio::spawn(writer(
            lun.clone(),
            model.clone(),
            gen.clone(),
            counters.clone(),
            w * per..(w + 1) * per,
            seed ^ w.wrapping_mul(0x9e37_79b9),
            stop.clone(),
        )));
    }
    tokio::time::sleep(run_for).await;
    let d = &mut daemons[victim];
    tokio::task::block_in_place(|| d.kill());
    let mut stuck = false;
    if victim == 0 {
        // The front target is gone and its session with it: nothing of it lands later.
        stop.store(true, Ordering::Release);
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        drop(lun);
        tokio::task::block_in_place(|| daemons[0].start())?;
    } else {
        // A disk server: back on its port while the writers' commands wait in the file
        // server, which finishes them through its member's recovery.
        stop.store(true, Ordering::Release);
        tokio::task::block_in_place(|| daemons[victim].start())?;
        let all = futures_join(tasks);
        if tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .is_err()
        {
            stuck = true;
        }
        drop(lun);
    }
    Ok(stuck)
}

async fn futures_join<T>(tasks: Vec<tokio::task::JoinHandle<T>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// One writer's loop until `stop`; the error that ended it, if one did (expected when
/// its target is killed, a failure with --url), as a line for people.
async fn writer(
    lun: Arc<Lun>,
    model: Arc<Mutex<Model>>,
    gen: Arc<AtomicU64>,
    counters: Arc<Counters>,
    units: Range<u64>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Option<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let run = model.lock().unwrap().run();
    let mut pending: Vec<(Range<u64>, u64)> = Vec::new();
    let mut flush_after = rng.gen_range(1..6);
    while !stop.load(Ordering::Acquire) {
        let n = rng.gen_range(1..=8u64).min(units.end - units.start);
        let first = rng.gen_range(units.start..=units.end - n);
        let span = first..first + n;
        let g = gen.fetch_add(1, Ordering::Relaxed);
        let mut buf = vec![0u8; n as usize * UNIT];
        for (i, chunk) in buf.chunks_mut(UNIT).enumerate() {
            model::stamp(chunk, run, first + i as u64, g);
        }
        let fua = rng.gen_ratio(1, 4);
        model.lock().unwrap().issue(span.clone(), g);
        counters.issued.fetch_add(1, Ordering::Relaxed);
        let offset = first * UNIT as u64;
        let t = Instant::now();
        let r = if fua {
            lun.write_fua(offset, Bytes::from(buf)).await
        } else {
            lun.write_at(offset, Bytes::from(buf)).await
        };
        counters.took(t, true);
        if let Err(e) = r {
            return Some(format!("write of units {span:?}: {e}"));
        }
        counters.acked.fetch_add(1, Ordering::Relaxed);
        if fua {
            counters.fua.fetch_add(1, Ordering::Relaxed);
            model.lock().unwrap().durable(span, g);
        } else {
            pending.push((span, g));
        }
        if pending.len() >= flush_after {
            // Everything acknowledged before the flush was issued is durable once it is.
            let before = std::mem::take(&mut pending);
            let t = Instant::now();
            let r = lun.flush().await;
            counters.took(t, false);
            if let Err(e) = r {
                return Some(format!("SYNCHRONIZE CACHE: {e}"));
            }
            counters.flushes.fetch_add(1, Ordering::Relaxed);
            let mut m = model.lock().unwrap();
            for (s, g) in before {
                m.durable(s, g);
            }
            flush_after = rng.gen_range(1..6);
        }
    }
    None
}

/// What reading every unit back showed against the model.
struct Tally {
    /// Units with a durable generation, i.e. that had something to lose.
    checked: u64,
    lost: u64,
    phantom: u64,
    /// The first `limit` losses and phantoms, in words.
    findings: Vec<String>,
}

/// Judges every unit read back; both modes (a LUN this process runs, `--url`) use the
/// same verdicts so that their reports mean the same.
fn tally(m: &Model, found: &[model::Found], limit: usize) -> Tally {
    let mut t = Tally {
        checked: 0,
        lost: 0,
        phantom: 0,
        findings: Vec::new(),
    };
    for (u, f) in found.iter().enumerate() {
        let u = u as u64;
        if m.durable_gen(u) != 0 {
            t.checked += 1;
        }
        let finding = match m.verdict(u, *f) {
            Verdict::Ok => continue,
            Verdict::Lost { durable, found } => {
                t.lost += 1;
                format!(
                    "unit {u}: lost durable generation {durable}, holds {}",
                    if found == 0 {
                        "nothing".to_owned()
                    } else {
                        format!("generation {found}")
                    }
                )
            }
            Verdict::Phantom(what) => {
                t.phantom += 1;
                format!("unit {u}: phantom {what:?}")
            }
        };
        if t.findings.len() < limit {
            t.findings.push(finding);
        }
    }
    t
}

/// Reads every unit back and judges it; then SYNCHRONIZE CACHE and what was read becomes
/// the baseline. Returns (durable units checked, lost, phantom, findings).
async fn verify(
    url: &IscsiUrl,
    model: &Arc<Mutex<Model>>,
) -> anyhow::Result<(u64, u64, u64, Vec<String>)> {
    let lun = connect(url).await?;
    let units_n = model.lock().unwrap().units();
    let per_read = (1 << 20) / UNIT as u64;
    let mut found = Vec::with_capacity(units_n as usize);
    let mut at = 0;
    while at < units_n {
        let n = per_read.min(units_n - at);
        let data = tokio::time::timeout(
            Duration::from_secs(60),
            lun.read_at(at * UNIT as u64, (n as usize) * UNIT),
        )
        .await
        .map_err(|_| anyhow!("reading back unit {at} hangs"))?
        .with_context(|| format!("reading back unit {at}"))?;
        found.extend(data.chunks(UNIT).map(model::parse));
        at += n;
    }
    let Tally {
        checked,
        lost,
        phantom,
        findings,
    } = tally(&model.lock().unwrap(), &found, 5);
    lun.flush()
        .await
        .context("SYNCHRONIZE CACHE after the check")?;
    let mut m = model.lock().unwrap();
    for (u, f) in found.into_iter().enumerate() {
        m.settle(u as u64, f);
    }
    Ok((checked, lost, phantom, findings))
}

/// `--url`: the writers against a LUN this process does not run (see the module's
/// documentation); true when no writer saw an error and nothing was lost or phantom.
fn run_url(url: &str, args: &CrashArgs) -> anyhow::Result<bool> {
    let size = units::parse_size(&args.size).map_err(|e| anyhow!("--size: {e}"))?;
    let duration = units::parse_duration(&args.duration).map_err(|e| anyhow!("--duration: {e}"))?;
    let slow_from = args
        .slow
        .as_deref()
        .map(|s| units::parse_duration(s).map_err(|e| anyhow!("--slow: {e}")))
        .transpose()?;
    if args.writers == 0 {
        bail!("--writers must be at least 1");
    }
    let url = IscsiUrl::parse(url)?;
    let opts = url.options(&options())?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    rt.block_on(async {
        let lun = Arc::new(
            Lun::open_url(&url, &opts)
                .await
                .with_context(|| format!("login to {url}"))?,
        );
        let units_n = size.min(lun.size()) / UNIT as u64;
        if units_n < args.writers as u64 * 8 {
            bail!(
                "--size (or the LUN) is too small for {} writers",
                args.writers
            );
        }
        if !args.json {
            println!(
                "rsv crash: seed {seed}, {units_n} units of {UNIT} bytes of {url}, {} writers \
                 for up to {}",
                args.writers, args.duration
            );
        }
        // The baseline: whatever the region holds now is where the run starts.
        let model = Arc::new(Mutex::new(Model::new(seed, units_n)));
        let found = read_all(&lun, units_n).await?;
        {
            let mut m = model.lock().unwrap();
            for (u, f) in found.into_iter().enumerate() {
                m.settle(u as u64, f);
            }
        }
        let counters = Arc::new(Counters {
            slow_from,
            ..Counters::default()
        });
        let gen = Arc::new(AtomicU64::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let per = units_n / args.writers as u64;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut tasks: Vec<_> = (0..args.writers as u64)
            .map(|w| {
                tokio::spawn(writer(
                    lun.clone(),
                    model.clone(),
                    gen.clone(),
                    counters.clone(),
                    w * per..(w + 1) * per,
                    rng.gen::<u64>(),
                    stop.clone(),
                ))
            })
            .collect();
        // Until the duration, a signal, or every writer ended (each only on an error).
        let mut ended = Vec::new();
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut int = signal(SignalKind::interrupt())?;
            let mut term = signal(SignalKind::terminate())?;
            let all = async {
                for t in tasks.iter_mut() {
                    ended.push(t.await.ok().flatten());
                }
            };
            tokio::pin!(all);
            let all_ended = tokio::select! {
                _ = tokio::time::sleep(duration) => false,
                _ = int.recv() => false,
                _ = term.recv() => false,
                _ = &mut all => true,
            };
            stop.store(true, Ordering::Release);
            if !all_ended {
                all.await;
            }
        }
        let errors: Vec<String> = ended.into_iter().flatten().collect();
        let found = read_all(&lun, units_n).await?;
        let Tally {
            checked,
            lost,
            phantom,
            mut findings,
        } = tally(&model.lock().unwrap(), &found, 10);
        let _ = lun.session().logout().await;
        for e in &errors {
            if findings.len() < 20 {
                findings.push(format!("writer error: {e}"));
            }
        }
        let summary = Summary {
            seed,
            units: units_n,
            writes_issued: counters.issued.load(Ordering::Relaxed),
            writes_acknowledged: counters.acked.load(Ordering::Relaxed),
            fua_writes: counters.fua.load(Ordering::Relaxed),
            flushes_acknowledged: counters.flushes.load(Ordering::Relaxed),
            durable_units_checked: checked,
            losses: lost,
            phantoms: phantom,
            findings,
            errors: errors.len() as u64,
            slow_commands: std::mem::take(&mut *counters.slow.lock().unwrap()),
            seconds: started.elapsed().as_secs_f64(),
            ..Default::default()
        };
        let clean = summary.errors == 0 && lost == 0 && phantom == 0;
        summary.print(
            args.json,
            &format!("{:.1} s", summary.seconds),
            &format!("{} writer errors", summary.errors),
        )?;
        Ok(clean)
    })
}

/// Every unit of the first `units_n`, read in 1 MiB commands.
async fn read_all(lun: &Lun, units_n: u64) -> anyhow::Result<Vec<model::Found>> {
    let per_read = (1 << 20) / UNIT as u64;
    let mut found = Vec::with_capacity(units_n as usize);
    let mut at = 0;
    while at < units_n {
        let n = per_read.min(units_n - at);
        let data = lun
            .read_at(at * UNIT as u64, (n as usize) * UNIT)
            .await
            .with_context(|| format!("reading unit {at}"))?;
        found.extend(data.chunks(UNIT).map(model::parse));
        at += n;
    }
    Ok(found)
}
