//! DR: disaster recovery across the emulated link (issue 39). Two sites as R2's (N disk
//! servers and a file server striping over them, `sites`), an application at the primary
//! site writing dependent, sequence-stamped records (record n+1 only after n was
//! acknowledged) at a share of the link, and `rsv sync --every INTERVAL` replicating the
//! volume to the other site throughout. At random moments the primary site fails: the
//! link is cut and every process of the site (its targets and agents, the application,
//! the coordinator) is SIGKILLed. The far site is promoted (`rsv sync promote --force`) and
//! its copy read back: its records must be a prefix of the application's (every write up
//! to some k, none after) and hold every write acknowledged before the cut the far site
//! last committed; anything else is a violation, and a run with one fails. Then the link
//! comes back, the lost site restarts on its data, is demoted and resynced from the new
//! primary (`rsv sync resync`), and the next round runs the other way: the application
//! goes on at the promoted site from write k+1, as an application restarted on the copy
//! does. Roles swap rather than fail back because a failback is the same failover again,
//! planned: swapping exercises both directions and every round costs one resync, not two.
//!
//! Figures per configuration (the application's share of the link): the RPO at every
//! cycle's end (`rpo_seconds` of the `cycle` lines) and at every failure (the failure's
//! moment minus the cut the far site last committed), the application's write latency
//! without replication (the first seconds of every round, before the sync starts) and
//! with it, the barrier's longest hold per cut, and each resync's bytes against the units
//! that truly differ between the two sites (both volumes read before it).
//!
//! `RSV_DR_LIVE=1` passes `--live` to the sync (the live LUNs copied, no image), which
//! makes the far copy one of no single moment: the run then reports violations and fails
//! (the check of the check).

use crate::env::Environment;
use crate::peers::ISCSI_PORT;
use crate::proc::{self, check_interrupt, in_ns, lab_bin, rsv_bin, unix_now, Link, Proc};
use crate::sites::{Layout, Site, CONTROL_PORT, IQN};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use tools::crash::model::{self, Found, UNIT};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Params {
    /// Disk servers per site.
    pub disk_servers: usize,
    pub rtt_ms: u64,
    /// The bottleneck's rate, bits per second.
    pub rate_bps: u64,
    /// Failovers per configuration.
    pub failovers: usize,
    /// The application's write rate as shares of the link's payload capacity, one
    /// configuration each.
    pub app_shares: Vec<f64>,
    /// `rsv sync --every`.
    pub interval_ms: u64,
    /// Bytes of each disk server's member.
    pub member_bytes: u64,
    /// Bytes of one application write (and the change-tracking unit).
    pub record_bytes: u64,
    /// Seconds the application writes alone at the start of each round, before the sync
    /// starts (its latency without replication).
    pub baseline_s: f64,
    /// The failure comes at a uniformly random moment this long (at most) after the round's
    /// first committed cycle, in intervals.
    pub fail_within_intervals: f64,
    /// Seed of the failure moments.
    pub seed: u64,
    /// The link cut while the application writes, after the failovers, to time the
    /// catch-up (seconds; 0: none).
    #[serde(default)]
    pub outage_s: f64,
    /// `--live` given to the sync (RSV_DR_LIVE=1): the images are not used.
    pub live: bool,
    /// The application: stamped records on the raw volume, or ext4 through `rsv mount`.
    #[serde(default)]
    pub app: App,
}

/// What the application at the primary site is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum App {
    /// Dependent, sequence-stamped records on the raw volume; each far copy must hold a
    /// prefix of them.
    #[default]
    Stamps,
    /// An ext4 file system on the volume, through `rsv mount` and a loop device, with a
    /// writer replacing files (fsyncs, renames, unlinks); each far copy, its journal
    /// replayed by a mount, must pass `e2fsck -fn` and hold only the writer's content.
    Ext4,
}

impl Params {
    pub fn new(quick: bool) -> Params {
        let seed = (unix_now() * 1e6) as u64;
        if quick {
            Params {
                disk_servers: 2,
                rtt_ms: 20,
                rate_bps: 100_000_000,
                failovers: 2,
                app_shares: vec![0.3],
                interval_ms: 1000,
                member_bytes: 16 << 20,
                record_bytes: 64 << 10,
                baseline_s: 1.0,
                fail_within_intervals: 2.0,
                seed,
                // The catch-up waits for a cycle under the interval: minutes on a loaded
                // machine at a 1-s interval, too long for CI.
                outage_s: 0.0,
                live: false,
                app: App::Stamps,
            }
        } else {
            Params {
                disk_servers: 4,
                rtt_ms: 350,
                rate_bps: 800_000_000,
                failovers: 100,
                app_shares: vec![0.3, 0.7],
                interval_ms: 5000,
                // 64 MiB over 4 disk servers: at 30 % of 800 Mbit/s the application
                // rewrites it whole in about 2 s, so a bigger volume changes none of what
                // a round proves and only lengthens its reads and resyncs (256 MiB took
                // rounds of 62-103 s).
                member_bytes: 16 << 20,
                record_bytes: 256 << 10,
                // Enough for the latency without replication (hundreds of writes a
                // round), the rest of a round is replicated.
                baseline_s: 2.0,
                // Still past the first committed cycle and over at least one whole
                // interval: the failure falls anywhere in a running cycle.
                fail_within_intervals: 2.0,
                seed,
                outage_s: 60.0,
                live: false,
                app: App::Stamps,
            }
        }
    }
}

/// `rsv-lab run dr`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub flags: crate::cli::Documented,
    /// Round-trip time of the link in milliseconds (default 350; --quick 20).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub rtt: Option<u64>,
    /// The link's rate as tc writes it (default 800mbit; --quick 100mbit).
    #[arg(long, value_parser = units::parse_rate)]
    pub link_rate: Option<units::Rate>,
    /// Disk servers per site (default 4; --quick 2).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub disk_servers: Option<u64>,
    /// Failovers per configuration (default 100; --quick 2).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub failovers: Option<u64>,
    /// The application's write rate in percent of the link, one configuration each
    /// (default 30,70; --quick 30).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=100))]
    pub app_share: Vec<u64>,
    /// The sync's interval (`rsv sync --every`; default 5s, --quick 1s).
    #[arg(long, value_parser = units::parse_duration)]
    pub interval: Option<Duration>,
    /// Each disk server's member (default 16MiB; --quick 16MiB).
    #[arg(long, value_parser = units::parse_size)]
    pub member_size: Option<u64>,
    /// Seed of the failure moments (default: from the clock; in the results).
    #[arg(long)]
    pub seed: Option<u64>,
    /// After the failovers, the link cut this long while the application writes, then
    /// restored: the catch-up is timed (default 60s; --quick 0s: none).
    #[arg(long, value_parser = units::parse_duration)]
    pub outage: Option<Duration>,
    /// The application: `stamps` (sequence-stamped records on the raw volume, each far
    /// copy judged a prefix of them) or `ext4` (a file system through `rsv mount` and a
    /// loop device, files replaced and fsynced; each far copy mounted to replay its
    /// journal, its files read back, then `e2fsck -fn` must find it clean).
    #[arg(long, value_enum, default_value_t = App::Stamps)]
    pub app: App,
}

impl Args {
    pub fn params(&self) -> Result<Params> {
        let mut p = Params::new(self.flags.common.quick);
        if let Some(r) = self.rtt {
            p.rtt_ms = r;
        }
        if let Some(r) = self.link_rate {
            p.rate_bps = r.bits_per_sec();
        }
        if let Some(n) = self.disk_servers {
            p.disk_servers = usize::try_from(n)?;
        }
        if let Some(k) = self.failovers {
            p.failovers = usize::try_from(k)?;
        }
        if !self.app_share.is_empty() {
            p.app_shares = self.app_share.iter().map(|&s| s as f64 / 100.0).collect();
        }
        if let Some(i) = self.interval {
            anyhow::ensure!(!i.is_zero(), "--interval: give a duration above zero");
            p.interval_ms = i.as_millis().max(1) as u64;
        }
        if let Some(m) = self.member_size {
            anyhow::ensure!(
                m >= 1 << 20 && m.is_multiple_of(1 << 20),
                "--member-size: whole MiB, at least 1MiB (the stripe's unit)"
            );
            p.member_bytes = m;
        }
        if let Some(s) = self.seed {
            p.seed = s;
        }
        if let Some(o) = self.outage {
            p.outage_s = o.as_secs_f64();
        }
        p.live = std::env::var_os("RSV_DR_LIVE").is_some();
        p.app = self.app;
        Ok(p)
    }
}

/// Percentiles of a set of figures.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct Pcts {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Pcts {
    /// Nearest-rank percentiles; `None` for no finite figure.
    pub fn of(xs: impl IntoIterator<Item = f64>) -> Option<Pcts> {
        let mut v: Vec<f64> = xs.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        // Less a hair: 0.999 x 1000 is not exactly 999 in floating point.
        let at = |q: f64| v[((q * v.len() as f64 - 1e-9).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Pcts {
            n: v.len(),
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: v[v.len() - 1],
        })
    }
}

/// A resync after a failover.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Resync {
    /// The change-tracking unit the two volumes were compared in.
    pub unit_bytes: u64,
    /// Units in which the two sites' volumes differed before the resync, and their bytes.
    pub differ_units: u64,
    pub differ_bytes: u64,
    /// What the resync sent: units as data plus units made zeros.
    pub sent_bytes: u64,
    pub data_bytes: u64,
    /// sent / differ.
    pub ratio: Option<f64>,
    pub seconds: f64,
    /// The two volumes equal after it (read back).
    pub equal_after: Option<bool>,
    /// The resync was refused (why) and `rsv sync --full` ran instead, as the refusal says.
    #[serde(default)]
    pub full_instead: Option<String>,
}

/// One failover.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Round {
    pub round: usize,
    /// The site that failed ("a" or "b").
    pub failed_site: String,
    /// The round's first write.
    pub from: u64,
    /// The last write the application saw acknowledged.
    pub acked: u64,
    pub sync_started_unix: f64,
    pub failed_unix: f64,
    pub cycles_committed: usize,
    /// The cut of the last cycle the coordinator reported committed.
    pub committed_cut_unix: Option<f64>,
    /// failed - committed cut.
    pub rpo_at_failure_s: Option<f64>,
    /// The last write acknowledged before that cut (must be in the far copy).
    pub acked_before_cut: u64,
    /// The far copy after the promote: the prefix it holds (writes 1..=far_last)...
    pub far_last: u64,
    /// ...with write far_last+1 partly landed (it was in flight at the cut).
    pub far_torn: bool,
    pub consistent: bool,
    pub violation: String,
    /// With a violation: what each stripe member held, when its writes were acknowledged
    /// and the coordinator's last cycles (`dr_explain`).
    #[serde(default)]
    pub violation_detail: String,
    pub promote_s: f64,
    pub resync: Option<Resync>,
    pub round_s: f64,
    pub error: String,
    /// Where the round's time went, phase by phase, in order.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// `--app ext4`: what the check of the far copy's file system found.
    #[serde(default)]
    pub fs: Option<crate::drfs::FsCheck>,
}

/// One phase of a round and its seconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Phase {
    pub phase: String,
    pub s: f64,
}

/// A round's phases as they pass: each mark closes the phase since the last one.
struct Phases {
    last: Instant,
    done: Vec<Phase>,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            last: Instant::now(),
            done: Vec::new(),
        }
    }

    fn mark(&mut self, phase: &str) {
        let now = Instant::now();
        self.done.push(Phase {
            phase: phase.into(),
            s: (now - self.last).as_secs_f64(),
        });
        self.last = now;
    }
}

/// One phase's seconds over a configuration's rounds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PhaseStat {
    pub phase: String,
    pub s: Pcts,
}

/// Each phase's seconds over `rounds`, phases in the order they first came.
fn phase_stats(rounds: &[Round]) -> Vec<PhaseStat> {
    let mut names: Vec<&str> = Vec::new();
    for r in rounds {
        for p in &r.phases {
            if !names.contains(&p.phase.as_str()) {
                names.push(&p.phase);
            }
        }
    }
    names
        .into_iter()
        .filter_map(|n| {
            let s = Pcts::of(
                rounds
                    .iter()
                    .flat_map(|r| &r.phases)
                    .filter(|p| p.phase == n)
                    .map(|p| p.s),
            )?;
            Some(PhaseStat { phase: n.into(), s })
        })
        .collect()
}

/// The catch-up after an outage: the link cut while the application writes, then restored.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct CatchUp {
    pub outage_s: f64,
    pub cut_unix: f64,
    pub restored_unix: f64,
    /// Bytes the application wrote while the link was cut.
    pub written_during_outage_bytes: u64,
    /// From the link's return until a cycle committed with its RPO back at what it was
    /// before the outage (`steady_rpo_s`: 1.25 x the largest committed before it, at least
    /// the interval).
    pub recovered_after_s: Option<f64>,
    #[serde(default)]
    pub steady_rpo_s: f64,
    /// From the link's return until the first cycle cut after it committed.
    #[serde(default)]
    pub caught_up_after_s: Option<f64>,
    /// The cycle that carried the most after the return: its bytes and seconds (after the
    /// return), and their rate as a share of the link's payload capacity (%).
    pub backlog_bytes: u64,
    pub backlog_s: f64,
    pub backlog_payload_pct: Option<f64>,
    /// From the return: when the link first ran at 90 % of its rate, and its wire use from
    /// then to that cycle's end (% of the rate, headers included).
    pub full_after_s: Option<f64>,
    pub from_full_wire_pct: Option<f64>,
    /// Every cycle line of the phase.
    pub cycles: Vec<Value>,
    pub error: String,
}

/// One configuration: the application at one share of the link.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Config {
    pub app_share: f64,
    pub app_target_bytes_s: f64,
    /// What the application wrote while replicated, bytes per second over those spans.
    pub app_achieved_bytes_s: f64,
    pub rounds: Vec<Round>,
    pub violations: usize,
    /// `rpo_seconds` of every committed cycle.
    pub rpo_cycles_s: Option<Pcts>,
    /// At every failure: its moment minus the far site's last committed cut.
    pub rpo_failure_s: Option<Pcts>,
    /// The RPO goal: interval + 2 x (time to send one interval's writes) + 1 s.
    pub rpo_goal_s: f64,
    /// The application's write latency (µs) alone and while replicated.
    pub latency_alone_us: Option<Pcts>,
    pub latency_replicated_us: Option<Pcts>,
    /// The barrier's longest hold of write answers per cut (µs).
    pub hold_us: Option<Pcts>,
    /// The resyncs' sent / differing bytes.
    pub resync_ratio: Option<Pcts>,
    /// Seconds per round (failure, promote, check, restart, resync included).
    pub round_s: Option<Pcts>,
    #[serde(default)]
    pub catch_up: Option<CatchUp>,
    /// Each phase of a round: its seconds over the rounds (p50, p99, max).
    #[serde(default)]
    pub phases: Vec<PhaseStat>,
    /// Committed cycles' seconds (`rsv sync --every`'s `cycle` lines).
    #[serde(default)]
    pub cycle_s: Option<Pcts>,
    /// Each phase of a committed cycle (its `phases`), over the cycles; empty from an
    /// `rsv sync` that does not report them.
    #[serde(default)]
    pub cycle_phases: Vec<PhaseStat>,
    pub loadavg_before: String,
    pub loadavg_after: String,
}

#[derive(Serialize, Deserialize)]
pub struct Results {
    #[serde(flatten)]
    pub run: crate::results::Run<Params>,
    pub volume_bytes: u64,
    pub environment: Environment,
    pub configs: Vec<Config>,
}

impl Results {
    pub fn violations(&self) -> usize {
        self.configs.iter().map(|c| c.violations).sum()
    }
}

fn payload_capacity(rate_bps: u64) -> f64 {
    rate_bps as f64 * 1448.0 / 1500.0 / 8.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The application's records and the check of a copy (sans-IO).

/// Where the application's write n goes: `slots` records over the volume, write n to slot
/// (n x step) mod slots with step prime to slots, so that consecutive writes land on
/// different members and every slot is rewritten once per `slots` writes.
#[derive(Clone, Copy, Debug)]
pub struct Ring {
    pub slots: u64,
    step: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Ring {
    pub fn new(slots: u64) -> Ring {
        let slots = slots.max(1);
        let step = (2473..).find(|s| gcd(*s, slots) == 1).unwrap_or(1);
        Ring { slots, step }
    }

    pub fn slot(&self, n: u64) -> u64 {
        ((n as u128 * self.step as u128) % self.slots as u128) as u64
    }

    /// What each slot holds after writes 1..=k: the last write to it, 0 for none.
    pub(crate) fn after(&self, k: u64) -> Vec<u64> {
        let mut e = vec![0; self.slots as usize];
        for n in k.saturating_sub(self.slots - 1).max(1)..=k {
            e[self.slot(n) as usize] = n;
        }
        e
    }
}

/// Record n at slot `slot`: each 4 KiB block stamped with (run, its block number, n).
pub fn record(run: u64, slot: u64, n: u64, record_bytes: usize) -> Vec<u8> {
    let blocks = record_bytes / UNIT;
    let mut buf = vec![0u8; record_bytes];
    for (i, b) in buf.chunks_mut(UNIT).enumerate() {
        model::stamp(b, run, slot * blocks as u64 + i as u64, n);
    }
    buf
}

/// What a copy of the volume holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Exactly writes 1..=last (and, with `torn`, part of write last+1: it was in flight).
    Prefix { last: u64, torn: bool },
    /// Of no single moment: why.
    Violation(String),
}

/// Judges `copy` (the whole volume) against the writes of run `run` in `ring`.
pub fn judge(copy: &[u8], ring: &Ring, run: u64, record_bytes: usize) -> Verdict {
    let blocks = record_bytes / UNIT;
    let total = ring.slots as usize * blocks;
    if copy.len() < total * UNIT {
        return Verdict::Violation(format!(
            "the copy is {} bytes, less than the {} the records take",
            copy.len(),
            total * UNIT
        ));
    }
    let mut gens = vec![0u64; total];
    for (b, g) in gens.iter_mut().enumerate() {
        *g = match model::parse(&copy[b * UNIT..(b + 1) * UNIT]) {
            Found::Empty => 0,
            Found::Stamp { run: r, unit, gen } if r == run && unit == b as u64 => gen,
            other => {
                return Verdict::Violation(format!(
                    "block {b} (slot {}) holds {other:?}: torn or foreign",
                    b / blocks
                ))
            }
        };
    }
    let m = gens.iter().copied().max().unwrap_or(0);
    // The first block that differs from the state after writes 1..=k, blocks of slot
    // `may` being allowed to hold write k+1 as well.
    let mismatch = |k: u64, may: Option<u64>| -> Option<(usize, u64, u64)> {
        let want = ring.after(k);
        gens.iter().enumerate().find_map(|(b, &g)| {
            let s = (b / blocks) as u64;
            let w = want[s as usize];
            let ok = g == w || (may == Some(s) && g == k + 1);
            (!ok).then_some((b, w, g))
        })
    };
    match mismatch(m, None) {
        None => Verdict::Prefix {
            last: m,
            torn: false,
        },
        Some((b, want, got)) => {
            if m >= 1 && mismatch(m - 1, Some(ring.slot(m))).is_none() {
                return Verdict::Prefix {
                    last: m - 1,
                    torn: true,
                };
            }
            Verdict::Violation(format!(
                "it holds write {m} but block {b} (slot {}) holds write {got} where every write up to {m} leaves write {want}",
                b / blocks
            ))
        }
    }
}

/// Units of `unit` bytes in which `a` and `b` differ.
fn differing(a: &[u8], b: &[u8], unit: usize) -> u64 {
    a.chunks(unit)
        .zip(b.chunks(unit))
        .filter(|(x, y)| x != y)
        .count() as u64
}

// ---------------------------------------------------------------------------------------
// The application: `rsv-lab dr-writer` (hidden), run in the primary site's namespace.

/// `rsv-lab dr-writer`: the DR scenario's application.
#[derive(clap::Args, Debug)]
pub struct WriterArgs {
    /// The volume: iscsi://HOST[:PORT]/IQN/LUN.
    pub url: String,
    /// The first write's sequence number.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Bytes of a write (whole 4 KiB blocks).
    #[arg(long, value_parser = units::parse_size)]
    pub record: u64,
    /// Records in the volume.
    #[arg(long)]
    pub slots: u64,
    /// Bytes per second to write at (the writes stay one at a time).
    #[arg(long)]
    pub rate: f64,
    /// The run's stamp.
    #[arg(long, default_value_t = 1)]
    pub run: u64,
}

/// Writes records n, n+1, ... each after the last was acknowledged, paced to `rate`, and
/// prints `n ACK_UNIX LATENCY_US` per acknowledgment (stdout is line-buffered: a line is
/// out before the next write, so a SIGKILL loses none that was acknowledged but the last).
pub fn writer(a: WriterArgs) -> Result<()> {
    anyhow::ensure!(
        a.record >= UNIT as u64 && a.record.is_multiple_of(UNIT as u64),
        "--record: whole 4 KiB blocks"
    );
    anyhow::ensure!(a.rate > 0.0 && a.slots > 0, "--rate and --slots above zero");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(write_records(a))
}

async fn write_records(a: WriterArgs) -> Result<()> {
    use std::io::Write;
    let url = initiator::IscsiUrl::parse(&a.url)?;
    let lun = initiator::Lun::open_url(&url, &initiator::SessionOptions::default())
        .await
        .with_context(|| format!("opening {}", a.url))?;
    let ring = Ring::new(a.slots);
    let gap = Duration::from_secs_f64(a.record as f64 / a.rate);
    let mut due = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut n = a.from;
    loop {
        let now = Instant::now();
        if due > now {
            tokio::time::sleep(due - now).await;
        } else if now - due > Duration::from_secs(1) {
            // A second behind (a stall): go on at the rate from here, no burst.
            due = now;
        }
        let slot = ring.slot(n);
        let buf = record(a.run, slot, n, a.record as usize);
        let t = Instant::now();
        lun.write_at(slot * a.record, bytes::Bytes::from(buf))
            .await
            .with_context(|| format!("write {n}"))?;
        let lat = t.elapsed();
        writeln!(out, "{n} {:.6} {}", unix_now(), lat.as_micros())?;
        n += 1;
        due += gap;
    }
}

/// The writer's acknowledgments: (n, Unix time, latency µs).
fn acks(log: &str) -> Vec<(u64, f64, f64)> {
    log.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let n = w.next()?.parse().ok()?;
            let t = w.next()?.parse().ok()?;
            let lat = w.next()?.parse().ok()?;
            w.next().is_none().then_some((n, t, lat))
        })
        .collect()
}

/// The sync's `cycle` lines.
fn cycles(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "cycle")
        .collect()
}

// ---------------------------------------------------------------------------------------
// The run.

/// xorshift64*: the failure moments, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A command of `rsv sync` in `ns`, run to its end; its stdout, or an error with its stderr.
fn rsv_sync(ns: &str, args: &[&str], key: &Path, dir: &Path, timeout: Duration) -> Result<String> {
    let mut cmd = in_ns(ns, rsv_bin());
    cmd.arg("sync").args(args).arg("--key-file").arg(key);
    let out = proc::run(cmd, timeout, dir)?;
    if !out.ok() {
        bail!("rsv sync {}: {}", args.join(" "), out.describe());
    }
    Ok(out.stdout)
}

/// The volume read whole through the file server at `host` (in its namespace).
fn read_volume(host: &proc::Host, dir: &Path, name: &str) -> Result<Vec<u8>> {
    let path = dir.join(name);
    let mut cmd = in_ns(&host.ns, rsv_bin());
    cmd.arg("cp")
        .arg(format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", host.addr))
        .arg(&path);
    let out = proc::run(cmd, Duration::from_secs(600), dir)?;
    if !out.ok() {
        bail!("rsv cp of {}'s volume: {}", host.addr, out.describe());
    }
    let data = std::fs::read(&path)?;
    std::fs::remove_file(&path)?;
    Ok(data)
}

/// Site `s`'s hosts: 0 the link's side a, 1 its side b.
fn side(link: &Link, s: usize) -> &[proc::Host] {
    if s == 0 {
        &link.a
    } else {
        &link.b
    }
}

/// What a configuration's run needs from the run around it.
struct Bench<'a> {
    p: &'a Params,
    link: &'a Link,
    key: &'a Path,
    dir: &'a Path,
    ring: Ring,
    rng: Rng,
}

/// Writes, latencies and cycles of one round, for the configuration's figures.
#[derive(Default)]
struct Seen {
    alone_us: Vec<f64>,
    replicated_us: Vec<f64>,
    replicated_bytes: f64,
    replicated_s: f64,
    rpo_cycles: Vec<f64>,
    holds: Vec<f64>,
    /// Committed cycles' seconds, and their phases' (`rsv sync`'s `phases`).
    cycle_s: Vec<f64>,
    cycle_phases: Vec<(&'static str, f64)>,
}

/// The phases of a cycle as `rsv sync --json` reports them (`phases`), in their order.
const CYCLE_PHASES: [&str; 15] = [
    "plan_s",
    "roles_s",
    "cut_s",
    "open_s",
    "start_s",
    "login_s",
    "first_ack_s",
    "streams_s",
    "verify_s",
    "prepare_s",
    "commit_s",
    "release_s",
    "drop_s",
    "record_s",
    "cut_to_commit_s",
];

/// The application as one round runs it: the writer and, with `--app ext4`, the file
/// system's stack under it.
struct Running {
    writer: Proc,
    stack: Option<crate::drfs::Stack>,
}

impl Running {
    /// The application's host lost with its site: the writer SIGKILLed, then `rsv mount`
    /// (nothing it had not sent reaches the LUN).
    fn crash(&mut self) {
        self.writer.sigkill();
        if let Some(s) = &mut self.stack {
            s.crash();
        }
    }
}

/// The sites' stripe unit (`sites::Site`'s file server).
const STRIPE_UNIT: u64 = 1 << 20;

impl Bench<'_> {
    /// What each member of `copy` holds, for a violation's report (`dr_explain`).
    fn explain(
        &self,
        copy: &[u8],
        site: usize,
        acked: &[(u64, f64, f64)],
        cycles: &[Value],
    ) -> String {
        let n = self.p.disk_servers;
        let views = crate::dr_explain::per_member(
            copy,
            &self.ring,
            1,
            self.p.record_bytes as usize,
            STRIPE_UNIT,
            n,
        );
        // A site's disk servers are hosts 1..=n of its side.
        let hosts: Vec<String> = side(self.link, site)[1..]
            .iter()
            .map(|h| format!("site {}'s disk server {}", ["a", "b"][site], h.addr))
            .collect();
        crate::dr_explain::describe(&views, &hosts, acked, cycles)
    }

    fn volume(&self, site: usize) -> String {
        format!("{}:{CONTROL_PORT}/{IQN}/0", side(self.link, site)[0].addr)
    }

    /// Bytes of the application's write (or file operation) `n`.
    fn op_bytes(&self, n: u64) -> u64 {
        match self.p.app {
            App::Stamps => self.p.record_bytes,
            App::Ext4 => crate::drfs::op_len(n, self.p.record_bytes),
        }
    }

    fn volume_bytes(&self) -> u64 {
        self.p.member_bytes * self.p.disk_servers as u64
    }

    /// The application at site `x` from write (or file operation) `from`; with `--app
    /// ext4`, `fresh` makes the file system first.
    fn start_app(
        &self,
        x: usize,
        from: u64,
        app_rate: f64,
        log: &Path,
        fresh: bool,
    ) -> Result<Running> {
        let p = self.p;
        let xh = &side(self.link, x)[0];
        let url = format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", xh.addr);
        match p.app {
            App::Stamps => {
                let mut w = in_ns(&xh.ns, lab_bin());
                w.arg("dr-writer")
                    .arg(&url)
                    .args(["--from", &from.to_string()])
                    .args(["--record", &p.record_bytes.to_string()])
                    .args(["--slots", &self.ring.slots.to_string()])
                    .args(["--rate", &format!("{app_rate:.0}")]);
                Ok(Running {
                    writer: Proc::spawn(w, "the application (rsv-lab dr-writer)", log)?,
                    stack: None,
                })
            }
            App::Ext4 => {
                let mut stack =
                    crate::drfs::Stack::attach(&xh.ns, &url, self.volume_bytes(), self.dir, "app")?;
                if fresh {
                    stack.mkfs()?;
                }
                stack.mount()?;
                // About 30 % of the file system in files of 4 KiB to one record (at most
                // 60 % were every file its largest: no ENOSPC).
                let files = (self.volume_bytes() * 3 / 10 / (p.record_bytes / 2)).max(1);
                let mut w = std::process::Command::new(lab_bin());
                w.arg("dr-fs-writer")
                    .arg(stack.mnt())
                    .args(["--from", &from.to_string()])
                    .args(["--files", &files.to_string()])
                    .args(["--max-file", &p.record_bytes.to_string()])
                    .args(["--rate", &format!("{app_rate:.0}")]);
                let writer = Proc::spawn(w, "the application (rsv-lab dr-fs-writer)", log)?;
                Ok(Running {
                    writer,
                    stack: Some(stack),
                })
            }
        }
    }

    /// The far copy at site `y` judged after its promote, and read whole (the bytes the
    /// failback compares). With `--app ext4` the check mounts it first (the journal
    /// replayed, as a failover's first mount does), so it is read after that.
    fn judge_far(&self, y: usize, r: &mut Round, ph: &mut Phases) -> Result<(Vec<u8>, u64)> {
        let p = self.p;
        let yh = &side(self.link, y)[0];
        match p.app {
            App::Stamps => {
                let far = read_volume(yh, self.dir, "far.img")?;
                let next = match judge(&far, &self.ring, 1, p.record_bytes as usize) {
                    Verdict::Prefix { last, torn } => {
                        r.far_last = last;
                        r.far_torn = torn;
                        if last < r.acked_before_cut {
                            r.violation = format!(
                                "write {} was acknowledged before the committed cut and the far copy ends at {last}",
                                r.acked_before_cut
                            );
                        } else if last > r.acked + 1 {
                            // Only the one in flight may be there unacknowledged.
                            r.violation = format!(
                                "the far copy holds writes up to {last}, the application saw {} acknowledged",
                                r.acked
                            );
                        }
                        last + 1
                    }
                    Verdict::Violation(why) => {
                        r.violation = why;
                        r.acked + 2
                    }
                };
                ph.mark("read and judge the far copy");
                Ok((far, next))
            }
            App::Ext4 => {
                let url = format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", yh.addr);
                let mut stack =
                    crate::drfs::Stack::attach(&yh.ns, &url, self.volume_bytes(), self.dir, "far")?;
                let corrupt = std::env::var_os("RSV_DR_FS_CORRUPT").is_some();
                let c = crate::drfs::check(&mut stack, corrupt)?;
                stack.close()?;
                if let Some(why) = c.violation() {
                    r.violation = why;
                }
                r.fs = Some(c);
                ph.mark("fs check (mount, files, e2fsck)");
                let far = read_volume(yh, self.dir, "far.img")?;
                ph.mark("read the far copy");
                // Operations go on numbered after the last the application saw done.
                Ok((far, r.acked + 1))
            }
        }
    }

    /// One failover of site `x` to site `1 - x`, and the failback's resync; the round's
    /// record and the next write's number.
    fn round(
        &mut self,
        sites: &mut [Site; 2],
        x: usize,
        from: u64,
        index: usize,
        app_rate: f64,
        seen: &mut Seen,
    ) -> Result<(Round, u64)> {
        let p = self.p;
        let y = 1 - x;
        let started = Instant::now();
        let mut ph = Phases::new();
        let link = self.link;
        let (xh, yh) = (&side(link, x)[0], &side(link, y)[0]);
        let (xvol, yvol) = (self.volume(x), self.volume(y));
        let interval = Duration::from_millis(p.interval_ms);
        let mut r = Round {
            round: index,
            failed_site: ["a", "b"][x].into(),
            from,
            ..Round::default()
        };
        let rate_arg = format!("{}bit", p.rate_bps);

        // The application, alone for a while, then replicated.
        let wlog = self.dir.join(format!("writer-{index}.log"));
        let mut app = self.start_app(x, from, app_rate, &wlog, index == 1)?;
        ph.mark("start the application");
        proc::sleep(Duration::from_secs_f64(p.baseline_s))?;
        ph.mark("application alone");
        let mut s = in_ns(&xh.ns, rsv_bin());
        s.arg("sync")
            .args(["--every", &units::format_duration(interval)])
            .args(["--json", "--rate", &rate_arg, "--key-file"])
            .arg(self.key);
        if p.live {
            s.arg("--live");
        }
        s.args([&xvol, &yvol]);
        let slog = self.dir.join(format!("sync-{index}.log"));
        r.sync_started_unix = unix_now();
        let mut sync = Proc::spawn(s, "rsv sync --every", &slog)?;

        // The failure: at a random moment after the round's first committed cycle (before
        // it the far site may hold no image of this pair yet: nothing to fail over to).
        let wait_first = interval * 10 + Duration::from_secs(120);
        let t0 = Instant::now();
        while !cycles(&sync.log_text())
            .iter()
            .any(|c| c["committed"] == true)
        {
            if !app.writer.alive() {
                bail!(
                    "the application stopped:\n{}",
                    proc::tail(&app.writer.log_text(), 1500)
                );
            }
            if !sync.alive() || t0.elapsed() > wait_first {
                bail!(
                    "no cycle committed in {:?}:\n{}",
                    t0.elapsed(),
                    proc::tail(&sync.log_text(), 1500)
                );
            }
            proc::sleep(Duration::from_millis(50))?;
        }
        ph.mark("sync to its first commit");
        let delay = interval.mul_f64(p.fail_within_intervals * self.rng.unit());
        proc::sleep(delay)?;
        if !app.writer.alive() {
            bail!(
                "the application stopped:\n{}",
                proc::tail(&app.writer.log_text(), 1500)
            );
        }
        ph.mark("to the failure (random)");
        r.failed_unix = unix_now();
        self.link.set(&["--loss".into(), "100%".into()])?;
        app.crash();
        sync.sigkill();
        sites[x].kill();
        drop(app);
        ph.mark("failure (link cut, site killed)");

        // What the application and the coordinator saw.
        let acked = acks(&std::fs::read_to_string(&wlog).unwrap_or_default());
        let lines = cycles(&sync.log_text());
        r.acked = acked.last().map_or(from.saturating_sub(1), |a| a.0);
        for &(_, t, lat) in &acked {
            if t < r.sync_started_unix {
                seen.alone_us.push(lat);
            } else {
                seen.replicated_us.push(lat);
            }
        }
        let repl: Vec<&(u64, f64, f64)> = acked
            .iter()
            .filter(|a| a.1 >= r.sync_started_unix)
            .collect();
        if let (Some(first), Some(last)) = (repl.first(), repl.last()) {
            // The first acknowledgment opens the span, so its bytes are not counted in it.
            seen.replicated_bytes +=
                repl[1..].iter().map(|a| self.op_bytes(a.0)).sum::<u64>() as f64;
            seen.replicated_s += last.1 - first.1;
        }
        let committed: Vec<&Value> = lines.iter().filter(|c| c["committed"] == true).collect();
        r.cycles_committed = committed.len();
        seen.rpo_cycles
            .extend(committed.iter().filter_map(|c| c["rpo_seconds"].as_f64()));
        seen.holds
            .extend(committed.iter().filter_map(|c| c["held_us"].as_f64()));
        seen.cycle_s
            .extend(committed.iter().filter_map(|c| c["seconds"].as_f64()));
        for c in &committed {
            for name in CYCLE_PHASES {
                if let Some(x) = c["phases"][name].as_f64() {
                    seen.cycle_phases.push((name, x));
                }
            }
        }
        r.committed_cut_unix = committed
            .iter()
            .filter_map(|c| c["cut_unix"].as_f64())
            .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.max(c))));
        r.rpo_at_failure_s = r.committed_cut_unix.map(|c| r.failed_unix - c);
        if let Some(cut) = r.committed_cut_unix {
            r.acked_before_cut = acked
                .iter()
                .filter(|a| a.1 <= cut)
                .map(|a| a.0)
                .max()
                .unwrap_or(from.saturating_sub(1));
        }

        // Failover: the far site promoted, its copy judged.
        let t = Instant::now();
        rsv_sync(
            &yh.ns,
            &["promote", "--force", "--json", &yvol],
            self.key,
            self.dir,
            Duration::from_secs(120),
        )?;
        r.promote_s = t.elapsed().as_secs_f64();
        ph.mark("promote");
        let (far, next) = self.judge_far(y, &mut r, &mut ph)?;
        r.consistent = r.violation.is_empty();
        if !r.consistent {
            r.violation_detail = self.explain(&far, y, &acked, &lines);
        }

        // Failback: the lost site back on its data, demoted, resynced from the new primary.
        self.link.set(&["--loss".into(), "0".into()])?;
        sites[x].restart()?;
        ph.mark("link back, lost site restarted");
        rsv_sync(
            &xh.ns,
            &["demote", "--json", &xvol],
            self.key,
            self.dir,
            Duration::from_secs(120),
        )?;
        ph.mark("demote");
        let old = read_volume(xh, self.dir, "old.img")?;
        let unit = p.record_bytes;
        let differ_units = differing(&far, &old, unit as usize);
        drop(old);
        ph.mark("read the old primary");
        let t = Instant::now();
        let mut full_instead = None;
        let out = match rsv_sync(
            &yh.ns,
            &["resync", &yvol, &xvol, "--json", "--rate", &rate_arg],
            self.key,
            self.dir,
            Duration::from_secs(600),
        ) {
            Ok(out) => out,
            // Refused (a member rolled a cycle back since its last commit, so the units the
            // source counted as sent are gone there): a full copy, as the refusal says.
            Err(e) => {
                full_instead = Some(format!("{e:#}"));
                ph.mark("resync (refused)");
                rsv_sync(
                    &yh.ns,
                    &[&yvol, &xvol, "--full", "--json", "--rate", &rate_arg],
                    self.key,
                    self.dir,
                    Duration::from_secs(600),
                )?
            }
        };
        let seconds = t.elapsed().as_secs_f64();
        ph.mark(if full_instead.is_some() {
            "sync --full"
        } else {
            "resync"
        });
        let done = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["event"] == "done")
            .ok_or_else(|| anyhow!("rsv sync resync printed no done line:\n{out}"))?;
        let data = done["data_bytes"].as_u64().unwrap_or(0);
        let sent = data + done["zero_bytes"].as_u64().unwrap_or(0);
        let differ_bytes = differ_units * unit;
        let after = read_volume(xh, self.dir, "after.img")?;
        ph.mark("read the old primary after");
        r.resync = Some(Resync {
            unit_bytes: unit,
            differ_units,
            differ_bytes,
            sent_bytes: sent,
            data_bytes: data,
            ratio: (differ_bytes > 0).then(|| sent as f64 / differ_bytes as f64),
            seconds,
            equal_after: Some(after == far),
            full_instead,
        });
        // A failback that leaves the sites different is a consistency failure too: the old
        // primary, a replica now, holds what the new one never wrote.
        if after != far && r.violation.is_empty() {
            r.violation = format!(
                "after the resync the old primary differs from the new one in {} of {} units",
                differing(&far, &after, unit as usize),
                far.len() as u64 / unit
            );
            r.consistent = false;
            r.violation_detail = format!(
                "{}the old primary after the resync:\n{}",
                crate::dr_explain::slots_differing(
                    &far,
                    &after,
                    &self.ring,
                    1,
                    unit as usize,
                    (STRIPE_UNIT, p.disk_servers),
                    8
                ),
                self.explain(&after, x, &acked, &lines)
            );
        }
        r.round_s = started.elapsed().as_secs_f64();
        r.phases = ph.done;
        Ok((r, next))
    }
}

impl Bench<'_> {
    /// The application and the sync at site `x`; once a cycle committed and an interval
    /// passed, the link cut for `outage_s`, then restored; timed until a cycle commits
    /// with its RPO under the interval.
    fn catch_up(&mut self, x: usize, from: u64, app_rate: f64) -> Result<CatchUp> {
        let p = self.p;
        let link = self.link;
        let xh = &side(link, x)[0];
        let interval = Duration::from_millis(p.interval_ms);
        let mut c = CatchUp {
            outage_s: p.outage_s,
            ..CatchUp::default()
        };
        let wlog = self.dir.join("writer-catch-up.log");
        let mut app = self.start_app(x, from, app_rate, &wlog, false)?;
        let mut s = in_ns(&xh.ns, rsv_bin());
        s.arg("sync")
            .args(["--every", &units::format_duration(interval)])
            .args([
                "--json",
                "--rate",
                &format!("{}bit", p.rate_bps),
                "--key-file",
            ])
            .arg(self.key);
        if p.live {
            s.arg("--live");
        }
        s.args([self.volume(x), self.volume(1 - x)]);
        let mut sync = Proc::spawn(s, "rsv sync --every", &self.dir.join("sync-catch-up.log"))?;
        let t0 = Instant::now();
        while !cycles(&sync.log_text())
            .iter()
            .any(|c| c["committed"] == true)
        {
            if !sync.alive()
                || !app.writer.alive()
                || t0.elapsed() > interval * 10 + Duration::from_secs(120)
            {
                bail!(
                    "catch-up: no cycle committed before the outage:\n{}",
                    proc::tail(&sync.log_text(), 1500)
                );
            }
            proc::sleep(Duration::from_millis(50))?;
        }
        proc::sleep(interval)?;
        let ended = |v: &Value| -> Option<f64> {
            Some(v["cut_unix"].as_f64()? + v["rpo_seconds"].as_f64()?)
        };
        // The RPO the sync held before the outage, a quarter more for the spread of one
        // cycle to the next: back under it (or under the interval) is recovered. A cycle
        // may take longer than the interval here (a debug build on a loaded machine), and
        // then no RPO is ever under the interval.
        c.steady_rpo_s = 1.25
            * cycles(&sync.log_text())
                .iter()
                .filter(|v| v["committed"] == true)
                .filter_map(|v| v["rpo_seconds"].as_f64())
                .fold(interval.as_secs_f64(), f64::max);
        c.cut_unix = unix_now();
        link.set(&["--loss".into(), "100%".into()])?;
        proc::sleep(Duration::from_secs_f64(p.outage_s))?;
        let watch = link.watch(Duration::from_millis(200));
        link.set(&["--loss".into(), "0".into()])?;
        c.restored_unix = unix_now();
        let limit = Duration::from_secs(120) + interval * 20;
        let t1 = Instant::now();
        let done = loop {
            let lines = cycles(&sync.log_text());
            let after: Vec<&Value> = lines
                .iter()
                .filter(|v| v["committed"] == true && ended(v).is_some_and(|e| e > c.restored_unix))
                .collect();
            // The first cycle cut after the return: the far site holds a moment after the
            // outage.
            c.caught_up_after_s = after
                .iter()
                .find(|v| v["cut_unix"].as_f64().is_some_and(|t| t > c.restored_unix))
                .and_then(|v| ended(v))
                .map(|e| e - c.restored_unix);
            let hit = after.iter().find(|v| {
                v["rpo_seconds"]
                    .as_f64()
                    .is_some_and(|r| r <= c.steady_rpo_s)
            });
            if let (Some(v), Some(_)) = (hit, c.caught_up_after_s) {
                break ended(v);
            }
            if !sync.alive() || t1.elapsed() > limit {
                c.error = format!(
                    "no cycle back at the RPO before the outage ({:.1} s) within {:.0} s of the link's return",
                    c.steady_rpo_s,
                    t1.elapsed().as_secs_f64()
                );
                break None;
            }
            proc::sleep(Duration::from_millis(100))?;
        };
        let end = unix_now();
        let (ab, _) = watch.finish();
        sync.sigkill();
        // The application stopped as a crash would: the sites go after this phase.
        app.crash();
        drop(app);
        let acked = acks(&std::fs::read_to_string(&wlog).unwrap_or_default());
        c.written_during_outage_bytes = acked
            .iter()
            .filter(|a| a.1 >= c.cut_unix && a.1 < c.restored_unix)
            .map(|a| self.op_bytes(a.0))
            .sum();
        c.recovered_after_s = done.map(|d| d - c.restored_unix);
        c.cycles = cycles(&sync.log_text());
        // The backlog's cycle: the committed one that carried the most after the return.
        let backlog = c
            .cycles
            .iter()
            .filter(|v| v["committed"] == true && ended(v).is_some_and(|e| e > c.restored_unix))
            .max_by_key(|v| v["bytes"].as_u64().unwrap_or(0));
        if let Some(v) = backlog {
            let cut = v["cut_unix"].as_f64().unwrap_or(c.restored_unix);
            let from = cut.max(c.restored_unix);
            let to = ended(v).unwrap_or(end).min(end);
            c.backlog_bytes = v["bytes"].as_u64().unwrap_or(0);
            c.backlog_s = to - from;
            if c.backlog_s > 0.0 {
                c.backlog_payload_pct = Some(
                    100.0 * c.backlog_bytes as f64 / c.backlog_s / payload_capacity(p.rate_bps),
                );
            }
            if let Some(u) = crate::busy::link_use(&ab, from, to, None, p.rate_bps) {
                if u.start_s < to - from {
                    let full = from + u.start_s;
                    c.full_after_s = Some(full - c.restored_unix);
                    if let (Some(a), Some(b)) = (
                        crate::busy::bytes_at(&ab, full),
                        crate::busy::bytes_at(&ab, to),
                    ) {
                        c.from_full_wire_pct =
                            Some(100.0 * (b - a) * 8.0 / p.rate_bps as f64 / (to - full));
                    }
                }
            }
        }
        Ok(c)
    }
}

/// Copies the logs in `dirs` (the application's, the coordinators', every target's start)
/// to `to`: a failed round's evidence, kept beside the results when the scratch goes.
fn keep_logs(dirs: &[&Path], to: &Path) {
    let copied = std::fs::create_dir_all(to).and_then(|()| {
        for d in dirs {
            for e in std::fs::read_dir(d)?.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().contains(".log") {
                    std::fs::copy(e.path(), to.join(&name))?;
                }
            }
        }
        Ok(())
    });
    match copied {
        Ok(()) => eprintln!("dr: a round failed; the run's logs are in {}", to.display()),
        Err(e) => eprintln!("dr: keeping the logs in {}: {e}", to.display()),
    }
}

fn report(r: &Round) {
    let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.2}"));
    let rs = r.resync.as_ref();
    eprintln!(
        "dr: round {:>3}: site {} lost; writes {}..={} acknowledged, far copy 1..={}{} (acked before its cut: {}); {} cycles; RPO at failure {} s; resync {} of {} differing bytes ({}x) in {:.1} s; round {:.1} s{}",
        r.round,
        r.failed_site,
        r.from,
        r.acked,
        r.far_last,
        if r.far_torn { " + part of the next" } else { "" },
        r.acked_before_cut,
        r.cycles_committed,
        f(r.rpo_at_failure_s),
        rs.map_or(0, |s| s.sent_bytes),
        rs.map_or(0, |s| s.differ_bytes),
        f(rs.and_then(|s| s.ratio)),
        rs.map_or(0.0, |s| s.seconds),
        r.round_s,
        if r.consistent {
            String::new()
        } else {
            format!("  VIOLATION: {}", r.violation)
        }
    );
    if let Some(f) = &r.fs {
        eprintln!(
            "dr:        far file system: {}; {} files read back, {} not the writer's; e2fsck -fn exit {}{}",
            if f.mounted { "mounted (journal replayed)" } else { "WOULD NOT MOUNT" },
            f.files,
            f.bad_files.len(),
            f.fsck_exit.map_or("-".into(), |c| c.to_string()),
            if f.corrupted { " (RSV_DR_FS_CORRUPT: an inode cleared first)" } else { "" }
        );
    }
    eprintln!(
        "dr:        phases s: {}",
        r.phases
            .iter()
            .map(|p| format!("{} {:.1}", p.phase, p.s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for l in r.violation_detail.lines() {
        eprintln!("dr: round {:>3}:   {l}", r.round);
    }
}

pub fn run(p: Params, quick: bool, out: &Path, command: String) -> Result<Results> {
    let environment = crate::env::collect();
    if p.app == App::Ext4 {
        proc::require("dr --app ext4", crate::drfs::TOOLS)?;
        anyhow::ensure!(
            Path::new("/dev/fuse").exists() && Path::new("/dev/loop-control").exists(),
            "dr --app ext4 needs /dev/fuse and loop devices (/dev/loop-control)"
        );
        crate::drfs::own_mount_namespace()?;
    }
    let _cc = proc::AllowedCc::ensure(&["cubic", "bbr"])?;
    let n = p.disk_servers;
    let scratch = proc::Scratch::new(Path::new("/dev/shm"), "dr")?;
    let dir = &scratch.0;
    let key = crate::sites::control_key(dir)?;
    // The same WAN and TCP buffers as R2's.
    // A link of its own for the ext4 application, so that a run of each can go at once
    // (the quick tests of both run side by side): `Link::up` takes down a link of its name.
    let name = match p.app {
        App::Stamps => "ldr",
        App::Ext4 => "ldrfs",
    };
    let (link, _buffers) = crate::r2::wan_up(name, p.rtt_ms, p.rate_bps, n)?;
    let volume = p.member_bytes * n as u64;
    let ring = Ring::new(volume / p.record_bytes);
    let cap = payload_capacity(p.rate_bps);
    eprintln!(
        "dr: {} ms, {} Mbit/s; volume {} MiB over {n} disk servers per site, {}; sync every {} ms; {} failovers per configuration{}",
        p.rtt_ms,
        p.rate_bps / 1_000_000,
        volume >> 20,
        match p.app {
            App::Stamps => format!("{} records of {} KiB", ring.slots, p.record_bytes >> 10),
            App::Ext4 => format!(
                "ext4 through rsv mount, files of 4 to {} KiB",
                p.record_bytes >> 10
            ),
        },
        p.interval_ms,
        p.failovers,
        if p.live { "; RSV_DR_LIVE: --live, no images" } else { "" }
    );
    let mut bench = Bench {
        p: &p,
        link: &link,
        key: &key,
        dir,
        ring,
        rng: Rng(p.seed | 1),
    };
    let lun_options = format!(
        "track = true\ntrack_unit = \"{}KiB\"\n",
        p.record_bytes >> 10
    );
    let mut configs = Vec::new();
    for &share in &p.app_shares {
        check_interrupt()?;
        let pct = (share * 100.0).round() as u64;
        let layout = Layout {
            member: p.member_bytes,
            one: None,
            fill: false,
            disk_lun_options: &lun_options,
        };
        let site_dir = dir.join(format!("app{pct}"));
        std::fs::create_dir_all(&site_dir)?;
        let mut sites = [
            Site::start(&link.a, "a", &key, &site_dir, &layout)?,
            Site::start(&link.b, "b", &key, &site_dir, &layout)?,
        ];
        let app_rate = share * cap;
        let mut c = Config {
            app_share: share,
            app_target_bytes_s: app_rate,
            loadavg_before: loadavg(),
            ..Config::default()
        };
        let mut seen = Seen::default();
        let (mut x, mut next) = (0, 1);
        for i in 1..=p.failovers {
            check_interrupt()?;
            let (r, after) = match bench.round(&mut sites, x, next, i, app_rate, &mut seen) {
                Ok(v) => v,
                Err(e) => {
                    // A round that could not finish leaves the sites in no known state:
                    // the configuration stops there, its rounds so far kept.
                    let r = Round {
                        round: i,
                        failed_site: ["a", "b"][x].into(),
                        from: next,
                        error: format!("{e:#}"),
                        ..Round::default()
                    };
                    eprintln!("dr: round {i} failed: {e:#}");
                    c.rounds.push(r);
                    break;
                }
            };
            report(&r);
            c.rounds.push(r);
            next = after;
            x = 1 - x;
        }
        if p.outage_s > 0.0 && c.rounds.iter().all(|r| r.error.is_empty()) {
            check_interrupt()?;
            match bench.catch_up(x, next, app_rate) {
                Ok(k) => {
                    eprintln!(
                        "dr: catch-up after {:.0} s cut: the first cycle cut after the link's return committed {} s after it, the RPO back at {:.1} s {} s after it; backlog {} MiB at {} % of the payload capacity, {} % on the wire from full{}",
                        k.outage_s,
                        k.caught_up_after_s.map_or("-".into(), |x| format!("{x:.1}")),
                        k.steady_rpo_s,
                        k.recovered_after_s.map_or("-".into(), |x| format!("{x:.1}")),
                        k.backlog_bytes >> 20,
                        k.backlog_payload_pct.map_or("-".into(), |x| format!("{x:.1}")),
                        k.from_full_wire_pct.map_or("-".into(), |x| format!("{x:.1}")),
                        if k.error.is_empty() { String::new() } else { format!("  ERROR {}", k.error) }
                    );
                    c.catch_up = Some(k);
                }
                Err(e) => {
                    eprintln!("dr: catch-up failed: {e:#}");
                    c.catch_up = Some(CatchUp {
                        outage_s: p.outage_s,
                        error: format!("{e:#}"),
                        ..CatchUp::default()
                    });
                }
            }
        }
        drop(sites);
        if c.rounds.iter().any(|r| !r.consistent) {
            keep_logs(
                &[dir.as_path(), site_dir.as_path()],
                &out.join(format!("dr-logs-app{pct}")),
            );
        }
        let _ = std::fs::remove_dir_all(&site_dir);
        c.loadavg_after = loadavg();
        c.violations = c.rounds.iter().filter(|r| !r.violation.is_empty()).count();
        c.rpo_cycles_s = Pcts::of(seen.rpo_cycles.iter().copied());
        c.rpo_failure_s = Pcts::of(c.rounds.iter().filter_map(|r| r.rpo_at_failure_s));
        c.latency_alone_us = Pcts::of(seen.alone_us.iter().copied());
        c.latency_replicated_us = Pcts::of(seen.replicated_us.iter().copied());
        c.hold_us = Pcts::of(seen.holds.iter().copied());
        c.cycle_s = Pcts::of(seen.cycle_s.iter().copied());
        c.cycle_phases = CYCLE_PHASES
            .iter()
            .filter_map(|&name| {
                let s = Pcts::of(
                    seen.cycle_phases
                        .iter()
                        .filter(|(n, _)| *n == name)
                        .map(|(_, x)| *x),
                )?;
                Some(PhaseStat {
                    phase: name.into(),
                    s,
                })
            })
            .collect();
        c.resync_ratio = Pcts::of(
            c.rounds
                .iter()
                .filter_map(|r| r.resync.as_ref().and_then(|s| s.ratio)),
        );
        c.phases = phase_stats(&c.rounds);
        c.round_s = Pcts::of(
            c.rounds
                .iter()
                .filter(|r| r.error.is_empty())
                .map(|r| r.round_s),
        );
        c.app_achieved_bytes_s = if seen.replicated_s > 0.0 {
            seen.replicated_bytes / seen.replicated_s
        } else {
            0.0
        };
        let interval = p.interval_ms as f64 / 1e3;
        let written = c.app_achieved_bytes_s.max(app_rate) * interval;
        c.rpo_goal_s = interval + 2.0 * written / cap + 1.0;
        configs.push(c);
    }
    drop(link);
    let results = Results {
        run: crate::results::Run::new("dr", quick, command, p),
        volume_bytes: volume,
        environment,
        configs,
    };
    crate::results::save(out, "dr.json", &results)?;
    for c in &results.configs {
        summary(c);
    }
    Ok(results)
}

fn summary(c: &Config) {
    let p = |x: &Option<Pcts>, scale: f64| {
        x.map_or("-".into(), |x| {
            format!(
                "p50 {:.2} p99 {:.2} max {:.2} (n {})",
                x.p50 * scale,
                x.p99 * scale,
                x.max * scale,
                x.n
            )
        })
    };
    eprintln!(
        "dr: application at {:.0} % of the link ({:.1} MB/s asked, {:.1} MB/s written): {} rounds, {} violations\n  RPO at cycle ends s: {}\n  RPO at failures s: {} (goal p99 <= {:.1})\n  latency alone ms: {}\n  latency replicated ms: {}\n  barrier hold ms: {}\n  resync sent/differing: {}",
        c.app_share * 100.0,
        c.app_target_bytes_s / 1e6,
        c.app_achieved_bytes_s / 1e6,
        c.rounds.len(),
        c.violations,
        p(&c.rpo_cycles_s, 1.0),
        p(&c.rpo_failure_s, 1.0),
        c.rpo_goal_s,
        p(&c.latency_alone_us, 1e-3),
        p(&c.latency_replicated_us, 1e-3),
        p(&c.hold_us, 1e-3),
        p(&c.resync_ratio, 1.0),
    );
    eprintln!(
        "  round s: {}\n  phases p50 / max s: {}\n  cycle s: {}\n  cycle phases p50 / max s: {}",
        p(&c.round_s, 1.0),
        c.phases
            .iter()
            .map(|x| format!("{} {:.1} / {:.1}", x.phase, x.s.p50, x.s.max))
            .collect::<Vec<_>>()
            .join(", "),
        p(&c.cycle_s, 1.0),
        c.cycle_phases
            .iter()
            .map(|x| format!("{} {:.2} / {:.2}", x.phase, x.s.p50, x.s.max))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

pub fn load(out: &Path) -> Result<Results> {
    crate::results::load(out, "dr.json")
}

/// Writes `docs/lab-dr.md` from `dr.json` under `results`.
pub fn write_doc(results: &Path, doc: &Path) -> Result<()> {
    let v = load(results)?;
    let p = &v.run.params;
    let mut d = v.run.doc_head(
        match p.app {
            App::Stamps => {
                "Lab DR: failover and failback of a striped volume across the emulated link"
            }
            App::Ext4 => "Lab DR with ext4: failover and failback of a file system on a striped volume across the emulated link",
        },
        ": a small volume, a short link, two failovers",
    );
    d += &format!(
        "- Two sites of {} disk servers each and a file server striping over them (1 MiB units), as R2's; link {} ms RTT at {} Mbit/s (`rsv-lab wan`); volume {} MiB, change tracking on every disk server in {} KiB units.\n",
        p.disk_servers,
        p.rtt_ms,
        p.rate_bps / 1_000_000,
        v.volume_bytes >> 20,
        p.record_bytes >> 10
    );
    d += &format!(
        "- The application writes {} KiB records one at a time (record n+1 only after n was acknowledged), each stamped with its sequence number, paced to a share of the link's payload capacity; `rsv sync --every {} ms --rate` runs from the primary site throughout{}.\n",
        p.record_bytes >> 10,
        p.interval_ms,
        if p.live { " **with `--live` (RSV_DR_LIVE=1): no images, a run made to fail**" } else { "" }
    );
    if p.app == App::Ext4 {
        d += "- **The application is an ext4 file system** (`--app ext4`): made on the volume at the first primary, mounted at the primary site through `rsv mount` (the LUN as a FUSE file, in the site's network namespace) and a loop device; a writer replaces files of 4 KiB to one record (written to a temporary name, fsynced every other time, renamed over the old name; a directory fsync every 8th, an unlink every 29th), each 4 KiB block tagged with its file, generation and index. After each promote the far copy is attached the same way, mounted (the kernel replays its journal, as a failover's first mount does) and unmounted, every file read back (each must be empty or a prefix of one generation's content, blocks never written reading as zeros), then `e2fsck -fn` must exit 0; anything else is a violation, its output kept in the JSON. The latencies are of a file operation (write, the fsync when there is one, the rename). `RSV_DR_FS_CORRUPT=1` clears an inode on every far copy before the check: the check of the check.\n";
    }
    d += &format!(
        "- Each round: {:.0} s of the application alone (latency without replication), the sync started, and at a uniformly random moment within {} intervals of the round's first committed cycle the primary site fails (link cut, its targets, the application and the coordinator SIGKILLed). The far site is promoted (`rsv sync promote --force`) and read back: its records must be exactly writes 1..k (the write in flight may be partly there) and k at least the last write acknowledged before the cut it last committed. Then the link is restored, the lost site restarted on its data, demoted and resynced (`rsv sync resync`), both volumes compared before (the differing units) and after (equal); the roles swap and the application goes on at the promoted site from write k+1. Seed {}.\n",
        p.baseline_s, p.fail_within_intervals, p.seed
    );
    d += &crate::doc::machine(&v.environment, 400)?;
    let ms = |x: &Option<Pcts>| {
        x.map_or("–".into(), |x| {
            format!(
                "{:.1} / {:.1} / {:.1}",
                x.p50 / 1e3,
                x.p99 / 1e3,
                x.p999 / 1e3
            )
        })
    };
    let s3 = |x: &Option<Pcts>| {
        x.map_or("–".into(), |x| {
            format!("{:.2} / {:.2} / {:.2}", x.p50, x.p99, x.max)
        })
    };
    d += "| application | rounds | violations | written MB/s (asked) | RPO at cycle ends p50 / p99 / max s | RPO at failures p50 / p99 / max s | RPO goal s | latency alone p50 / p99 / p99.9 ms | replicated | barrier hold p50 / p99 / p99.9 ms | resync sent ÷ differing p50 / p99 / max | load before → after |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for c in &v.configs {
        d += &format!(
            "| {:.0} % | {} | **{}** | {:.1} ({:.1}) | {} | {} | {:.1} | {} | {} | {} | {} | {} → {} |\n",
            c.app_share * 100.0,
            c.rounds.iter().filter(|r| r.error.is_empty()).count(),
            c.violations,
            c.app_achieved_bytes_s / 1e6,
            c.app_target_bytes_s / 1e6,
            s3(&c.rpo_cycles_s),
            s3(&c.rpo_failure_s),
            c.rpo_goal_s,
            ms(&c.latency_alone_us),
            ms(&c.latency_replicated_us),
            ms(&c.hold_us),
            s3(&c.resync_ratio),
            c.loadavg_before,
            c.loadavg_after
        );
    }
    d += "\n";
    for c in &v.configs {
        if let Some(k) = &c.catch_up {
            let o = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.1}"));
            d += &format!(
                "- Catch-up, application at {:.0} %: link cut {:.0} s while it wrote ({} MiB); the first cycle cut after the link's return committed **{} s** after it, and a cycle with its RPO back under the run's threshold ({:.1} s: the largest before the outage, at least the interval, 1.25 × that since the run of 30 Nov) **{} s** after it; the backlog's cycle carried {} MiB in {:.1} s after the return: {} % of the payload capacity over that span, the link {} % busy (wire) from first full ({} s after the return){}.\n",
                c.app_share * 100.0,
                k.outage_s,
                k.written_during_outage_bytes >> 20,
                o(k.caught_up_after_s),
                k.steady_rpo_s,
                o(k.recovered_after_s),
                k.backlog_bytes >> 20,
                k.backlog_s,
                o(k.backlog_payload_pct),
                o(k.from_full_wire_pct),
                o(k.full_after_s),
                if k.error.is_empty() { String::new() } else { format!("; **error**: {}", k.error.lines().next().unwrap_or("")) }
            );
        }
    }
    if v.configs.iter().any(|c| !c.phases.is_empty()) {
        d += "\nWhere a round's time goes (seconds, p50 / p99 / max over the rounds):\n\n| phase |";
        for c in &v.configs {
            d += &format!(" {:.0} % |", c.app_share * 100.0);
        }
        d += "\n|---|";
        d += &"---|".repeat(v.configs.len());
        d += "\n";
        let mut names: Vec<&str> = Vec::new();
        for c in &v.configs {
            for x in &c.phases {
                if !names.contains(&x.phase.as_str()) {
                    names.push(&x.phase);
                }
            }
        }
        for n in names.iter().copied().chain(["whole round"]) {
            d += &format!("| {n} |");
            for c in &v.configs {
                let x = if n == "whole round" {
                    c.round_s
                } else {
                    c.phases.iter().find(|x| x.phase == n).map(|x| x.s)
                };
                d += &format!(
                    " {} |",
                    x.map_or("–".into(), |x| format!(
                        "{:.1} / {:.1} / {:.1}",
                        x.p50, x.p99, x.max
                    ))
                );
            }
            d += "\n";
        }
    }
    d += "\nRPO goal: interval + 2 × (the time the link takes to send one interval's writes) + 1 s. The latencies are the application's, acknowledgment of each record; \"alone\" is the first seconds of every round, before its sync started. The barrier's hold is the longest any member held write answers in a cut.\n\n";
    for c in &v.configs {
        d += &format!(
            "## Application at {:.0} % of the link\n\n",
            c.app_share * 100.0
        );
        d += "| round | lost | writes | far copy | acked before its cut | cycles | RPO at failure s | promote s | differing units | resync sent MiB | sent ÷ differing | resync s | equal after | round s | |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        for r in &c.rounds {
            let rs = r.resync.as_ref();
            let note = if !r.error.is_empty() {
                format!(
                    "error: {}",
                    r.error.lines().next().unwrap_or("").replace('|', "/")
                )
            } else if !r.violation.is_empty() {
                format!("**violation**: {}", r.violation.replace('|', "/"))
            } else if let Some(f) = &r.fs {
                format!(
                    "file system clean: journal replayed, {} files the writer's, e2fsck -fn exit 0",
                    f.files
                )
            } else {
                String::new()
            };
            d += &format!(
                "| {} | {} | {}..={} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {:.1} | {} |\n",
                r.round,
                r.failed_site,
                r.from,
                r.acked,
                if r.fs.is_some() {
                    // A file system's copy is judged by its check, not as a prefix.
                    "–".to_owned()
                } else {
                    format!(
                        "1..={}{}",
                        r.far_last,
                        if r.far_torn { " (+ part of the next)" } else { "" }
                    )
                },
                r.acked_before_cut,
                r.cycles_committed,
                r.rpo_at_failure_s.map_or("–".into(), |x| format!("{x:.2}")),
                r.promote_s,
                rs.map_or("–".into(), |s| s.differ_units.to_string()),
                rs.map_or("–".into(), |s| format!("{:.1}", s.sent_bytes as f64 / 1048576.0)),
                rs.and_then(|s| s.ratio).map_or("–".into(), |x| format!(
                    "{x:.3}{}",
                    if rs.is_some_and(|s| s.full_instead.is_some()) { " (resync refused: `--full`)" } else { "" }
                )),
                rs.map_or("–".into(), |s| format!("{:.1}", s.seconds)),
                rs.and_then(|s| s.equal_after).map_or("–".into(), |e| String::from(if e { "yes" } else { "**no**" })),
                r.round_s,
                note
            );
        }
        d += "\n";
    }
    std::fs::write(doc, d)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The volume after writes `from..=to` over a ring of `slots` records of 8 KiB.
    fn volume(ring: &Ring, writes: impl IntoIterator<Item = u64>) -> Vec<u8> {
        let rec = 2 * UNIT;
        let mut v = vec![0u8; ring.slots as usize * rec];
        for n in writes {
            let s = ring.slot(n) as usize;
            v[s * rec..(s + 1) * rec].copy_from_slice(&record(1, s as u64, n, rec));
        }
        v
    }

    #[test]
    fn a_prefix_is_judged_one_moment() {
        let ring = Ring::new(16);
        assert_eq!(
            judge(&volume(&ring, []), &ring, 1, 2 * UNIT),
            Verdict::Prefix {
                last: 0,
                torn: false
            }
        );
        // Past one turn of the ring: every slot rewritten.
        let v = volume(&ring, 1..=40);
        assert_eq!(
            judge(&v, &ring, 1, 2 * UNIT),
            Verdict::Prefix {
                last: 40,
                torn: false
            }
        );
        // Write 41 in flight at the cut: its first block landed, not its second.
        let mut torn = v.clone();
        let s = ring.slot(41) as usize;
        let rec41 = record(1, s as u64, 41, 2 * UNIT);
        torn[s * 2 * UNIT..s * 2 * UNIT + UNIT].copy_from_slice(&rec41[..UNIT]);
        assert_eq!(
            judge(&torn, &ring, 1, 2 * UNIT),
            Verdict::Prefix {
                last: 40,
                torn: true
            }
        );
    }

    #[test]
    fn a_copy_of_no_single_moment_is_a_violation() {
        let ring = Ring::new(16);
        // Write 30 is there, write 29 (acknowledged before 30 was issued) is not.
        let v = volume(&ring, (1..=28).chain([30]));
        assert!(matches!(
            judge(&v, &ring, 1, 2 * UNIT),
            Verdict::Violation(_)
        ));
        // An older write where a newer one should be (a unit copied before it was rewritten).
        let v = volume(&ring, (1..=40).filter(|&n| n != 33).chain([17]));
        assert!(matches!(
            judge(&v, &ring, 1, 2 * UNIT),
            Verdict::Violation(_)
        ));
        // A torn record that is not the last write.
        let mut v = volume(&ring, 1..=40);
        let s = ring.slot(35) as usize;
        v[s * 2 * UNIT + 100] ^= 1;
        assert!(matches!(
            judge(&v, &ring, 1, 2 * UNIT),
            Verdict::Violation(_)
        ));
        // Another run's records.
        let mut v = volume(&ring, 1..=5);
        let s = ring.slot(3) as usize;
        v[s * 2 * UNIT..(s + 1) * 2 * UNIT].copy_from_slice(&record(2, s as u64, 3, 2 * UNIT));
        assert!(matches!(
            judge(&v, &ring, 1, 2 * UNIT),
            Verdict::Violation(_)
        ));
    }

    #[test]
    fn the_ring_visits_every_slot_once_per_turn() {
        for slots in [1, 2, 16, 1024, 2473 * 2, 1000] {
            let ring = Ring::new(slots);
            let mut seen: Vec<u64> = (1..=slots).map(|n| ring.slot(n)).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len() as u64, slots);
        }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let p = Pcts::of((1..=1000).map(f64::from)).unwrap();
        assert_eq!(
            (p.n, p.p50, p.p99, p.p999, p.max),
            (1000, 500.0, 990.0, 999.0, 1000.0)
        );
        assert_eq!(Pcts::of([]), None);
    }
}
