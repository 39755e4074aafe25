//! The coordinator (`rsv sync`): finds the streams, starts them on the source disk
//! servers, paces them together ([`crate::pace`]), shows progress, verifies by checksums
//! taken on each side and, with change tracking, releases the synced epoch.
//!
//! A volume is named by its control endpoint and LUN: `[rsv://]HOST[:PORT]/IQN/LUN`. When
//! the LUN is a stripe over `iscsi://` members (a file server over disk servers), every
//! member is a stream from its disk server to the destination's member of the same rank,
//! whose agents listen on the same control port; otherwise the LUN itself is one stream.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use backstore::StoreSpec;
use serde::Serialize;

use crate::api::{self, JobState, JobStatus, LunInfo, What};
use crate::auth::Key;
use crate::pace::{Controller, Decision, Mode, StreamView};
use crate::wire::Client;

/// A volume as the user names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRef {
    pub host: String,
    pub port: u16,
    pub iqn: String,
    pub lun: u16,
}

impl std::str::FromStr for VolumeRef {
    type Err = String;
    fn from_str(s: &str) -> Result<VolumeRef, String> {
        let bad = |why: &str| format!("{s}: {why}; write [rsv://]HOST[:PORT]/IQN/LUN");
        let rest = s.strip_prefix("rsv://").unwrap_or(s);
        let mut parts = rest.splitn(3, '/');
        let hostport = parts
            .next()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        let iqn = parts
            .next()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no target name"))?;
        let lun = parts
            .next()
            .ok_or_else(|| bad("no LUN"))?
            .parse::<u16>()
            .map_err(|_| bad("the LUN is not a number"))?;
        let (host, port) = split_host_port(hostport, api::CONTROL_PORT).map_err(|e| bad(&e))?;
        Ok(VolumeRef {
            host,
            port,
            iqn: iqn.to_owned(),
            lun,
        })
    }
}

fn split_host_port(s: &str, default: u16) -> Result<(String, u16), String> {
    if let Some(v6) = s.strip_prefix('[') {
        let (h, rest) = v6.split_once(']').ok_or("unclosed [")?;
        let port = match rest.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| "bad port")?,
            None => default,
        };
        return Ok((h.to_owned(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Ok((h.to_owned(), p.parse().map_err(|_| "bad port")?)),
        None => Ok((s.to_owned(), default)),
    }
}

fn addr(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One stream: a source member and where it goes.
#[derive(Clone, Debug)]
pub struct Stream {
    pub source: Client,
    pub source_lun: LunInfo,
    pub dest: Client,
    pub dest_lun: LunInfo,
    /// The destination member's iSCSI URL as the source disk server dials it.
    pub dest_url: String,
    /// The initiator name its session logs in with: the destination replica's writer
    /// (`crate::failover`); `None`: the agent's own.
    pub writer: Option<String>,
    /// Units sent beside the source's changes (a resync: the destination's own).
    pub also: Vec<(u64, u64)>,
}

impl Stream {
    /// The options of this stream's iSCSI session: [`stream_session`]'s and its writer.
    pub fn session(&self, o: &SyncOptions) -> Vec<(String, String)> {
        let mut s = stream_session(o);
        if let Some(w) = &self.writer {
            s.retain(|(k, _)| k != "initiator_name");
            s.push(("initiator_name".into(), w.clone()));
        }
        s
    }
}

/// A volume's control endpoint, HOST:PORT.
pub fn control_addr(v: &VolumeRef) -> String {
    addr(&v.host, v.port)
}

/// A volume as messages name it: HOST:PORT/IQN/LUN.
pub fn shown_volume(v: &VolumeRef) -> String {
    format!("{}/{}/{}", addr(&v.host, v.port), v.iqn, v.lun)
}

/// The LUNs a volume's data lives on: its stripe members' (named by the file server,
/// not asked), or the volume's own LUN.
pub async fn member_luns(v: &VolumeRef, key: &Key) -> anyhow::Result<Vec<(Client, String, u16)>> {
    let (m, _, _) = members(v, key, false).await?;
    Ok(m.into_iter().map(|(c, i, _)| (c, i.iqn, i.lun)).collect())
}

/// What the coordinator does.
#[derive(Clone, Debug)]
pub struct SyncOptions {
    pub unit: u64,
    /// The bottleneck's rate in bits per second (absent: found by the streams).
    pub rate: Option<u64>,
    pub pacing: Mode,
    /// Send every unit even where change tracking could tell what changed.
    pub full: bool,
    pub verify: bool,
    pub interval: Duration,
    pub session: Vec<(String, String)>,
    /// Resume state for volumes without change tracking.
    pub state: Option<std::path::PathBuf>,
    /// Compression on the wire.
    pub compress: crate::squeeze::Mode,
    /// Copy a point-in-time image of the volume, cut across all its members at once
    /// ([`cut`]), holding write answers for this long at most; `None`: copy the live
    /// LUNs (a volume written meanwhile lands as a copy of no single moment).
    pub cut: Option<Duration>,
    /// A failback (`rsv sync resync`): the source's changes and the destination's own
    /// since the last image both hold.
    pub resync: bool,
    /// Set to abandon the sync cleanly (SIGTERM in continuous mode): the streams are
    /// cancelled and waited for, and the far site's cycle rolled back.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The options of the streams' iSCSI sessions: the user's, and CUBIC for paced streams
/// unless the user chose. Paced, a stream cannot fill a gap another leaves; BBR (v1)
/// drains each connection to four packets every ten seconds (PROBE_RTT), which at 350 ms
/// cost a paced stream a third of its rate for a second of every ten (seen in the lab),
/// while CUBIC under a pacing cap that holds the queue empty has no reason to back off.
pub fn stream_session(o: &SyncOptions) -> Vec<(String, String)> {
    let mut session = o.session.clone();
    if o.pacing != Mode::Unpaced && !session.iter().any(|(k, _)| k == "congestion") {
        session.push(("congestion".into(), PACED_CONGESTION.into()));
    }
    session
}

/// What paced streams run unless told: Reservoir's own congestion control where the
/// agent may load it (it starts at the share and paces exactly to it, with no PROBE_RTT
/// and no cut for a loss without a queue: `docs/congestion.md`), else CUBIC, which held a
/// paced share where BBR's PROBE_RTT cost a third of it for 2 s in 10 at 350 ms.
pub const PACED_CONGESTION: &str = "rsv,cubic";

/// Payload bytes per second a bottleneck of `bits` per second carries (TCP/IP headers of
/// 1500-byte packets with timestamps: 1448 of 1500).
pub fn payload_rate(bits: u64) -> u64 {
    (bits as u128 * 1448 / 1500 / 8) as u64
}

async fn find_lun(client: &Client, iqn: &str, lun: u16) -> anyhow::Result<(api::Luns, LunInfo)> {
    let luns: api::Luns = client.call("GET", "/v1/luns", &()).await?;
    let info = luns
        .luns
        .iter()
        .find(|l| l.iqn == iqn && l.lun == lun)
        .cloned()
        .ok_or_else(|| anyhow!("{}: serves no LUN {lun} of target {iqn}", client.addr))?;
    Ok((luns, info))
}

/// A member's LUN as its agent reports it, or, while its agent has not been asked yet
/// ([`members`] with `ask` false), as the file server's stripe names it: size 0 until
/// [`check_members`] has the answer.
type Member = (Client, LunInfo, String);

/// A member not asked yet: its position, and the words for an error about it.
type Unasked = (usize, String);

/// A volume's members: `(control client, LUN there, its iSCSI URL)`, and the stripe unit
/// when it is striped. With `ask` false, a striped volume's members are named from the
/// file server's answer alone and returned as unasked, for [`check_members`] to ask while
/// the transfer starts: over a long path each ask costs two round trips (a connection and
/// the request).
async fn members(
    v: &VolumeRef,
    key: &Key,
    ask: bool,
) -> anyhow::Result<(Vec<Member>, Option<u64>, Vec<Unasked>)> {
    let client = Client::new(addr(&v.host, v.port), key.clone());
    let (luns, info) = find_lun(&client, &v.iqn, v.lun).await?;
    let spec: Option<StoreSpec> = info.store.parse().ok();
    if let Some(spec) = spec.filter(|s| s.kind() == "stripe" && !s.members().is_empty()) {
        if spec.members().iter().all(|m| m.kind() == "iscsi") {
            let unit = match spec.param("unit") {
                Some(u) => units::parse_size(u)
                    .map_err(|e| anyhow!("{}: stripe unit: {e}", client.addr))?,
                None => 1 << 20,
            };
            let mut named = Vec::new();
            let mut unasked = Vec::new();
            for (i, m) in spec.members().iter().enumerate() {
                let text = m.to_string();
                let url =
                    initiator::IscsiUrl::parse(&text).map_err(|e| anyhow!("member {text}: {e}"))?;
                let (iqn, lun) = (url.target_required()?.to_owned(), url.lun_required()?);
                let c = Client::new(addr(&url.host, v.port), key.clone());
                // The member's URL without the file server's session options.
                let plain = format!("iscsi://{}/{iqn}/{lun}", addr(&url.host, url.port));
                let info = LunInfo {
                    iqn,
                    lun,
                    size: 0,
                    block_size: 0,
                    store: String::new(),
                    tracking: None,
                };
                named.push((c, info, plain));
                unasked.push((
                    i,
                    format!("member {text} (its agent on control port {})", v.port),
                ));
            }
            if ask {
                check_members(&mut named, &unasked).await?;
                unasked.clear();
            }
            return Ok((named, Some(unit), unasked));
        }
    }
    let portal_port = luns
        .portals
        .first()
        .and_then(|p| p.parse::<std::net::SocketAddr>().ok())
        .map_or(initiator::url::DEFAULT_PORT, |p| p.port());
    let url = format!("iscsi://{}/{}/{}", addr(&v.host, portal_port), v.iqn, v.lun);
    Ok((vec![(client, info, url)], None, Vec::new()))
}

/// Asks the unasked members' agents, every one at once, for their LUNs and fills them in.
async fn check_members(members: &mut [Member], unasked: &[Unasked]) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for (i, what) in unasked {
        let (c, info, _) = &members[*i];
        let (c, iqn, lun, what, i) = (c.clone(), info.iqn.clone(), info.lun, what.clone(), *i);
        set.spawn(async move {
            let found = find_lun(&c, &iqn, lun).await.with_context(|| what);
            (i, found.map(|(_, mi)| mi))
        });
    }
    while let Some(r) = set.join_next().await {
        let (i, r) = r?;
        members[i].1 = r?;
    }
    Ok(())
}

/// A destination member holds at least what its source sends.
fn check_fits(source: &LunInfo, dest: &LunInfo, dest_url: &str) -> anyhow::Result<()> {
    if dest.size < source.size {
        bail!(
            "destination member {dest_url} holds {} bytes, less than its source's {}",
            dest.size,
            source.size
        );
    }
    Ok(())
}

/// The destination members' agents, asked while the transfer starts ([`plan`]): each
/// must answer for its LUN, and hold what its source sends. (A source agent also refuses
/// to write to a smaller LUN before it sends anything.)
pub struct DestCheck {
    task: tokio::task::JoinHandle<anyhow::Result<Vec<LunInfo>>>,
}

impl DestCheck {
    fn start(streams: &[Stream], unasked: Vec<Unasked>) -> DestCheck {
        let mut dest: Vec<Member> = streams
            .iter()
            .map(|s| (s.dest.clone(), s.dest_lun.clone(), s.dest_url.clone()))
            .collect();
        let sources: Vec<LunInfo> = streams.iter().map(|s| s.source_lun.clone()).collect();
        DestCheck {
            task: tokio::spawn(async move {
                check_members(&mut dest, &unasked)
                    .await
                    .context("destination")?;
                for ((_, d, url), s) in dest.iter().zip(&sources) {
                    check_fits(s, d, url)?;
                }
                Ok(dest.into_iter().map(|(_, d, _)| d).collect())
            }),
        }
    }

    fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the answers and puts them into `streams`.
    async fn finish(self, streams: &mut [Stream]) -> anyhow::Result<()> {
        let infos = self.task.await??;
        for (s, d) in streams.iter_mut().zip(infos) {
            s.dest_lun = d;
        }
        Ok(())
    }
}

/// Pairs the source's members with the destination's, checking that the layouts match.
/// The destination's members (behind a long path) are asked by the returned check, which
/// runs while the streams start; the source's (near) are asked here.
pub async fn plan(
    src: &VolumeRef,
    dst: &VolumeRef,
    key: &Key,
) -> anyhow::Result<(Vec<Stream>, DestCheck)> {
    let (s, d) = tokio::join!(members(src, key, true), members(dst, key, false));
    let (s, s_unit, _) = s.context("source")?;
    let (d, d_unit, unasked) = d.context("destination")?;
    if s.len() != d.len() {
        bail!(
            "the source has {} member(s), the destination {}: the layouts must match disk server for disk server",
            s.len(),
            d.len()
        );
    }
    if s_unit != d_unit {
        bail!("the stripe units differ (source {s_unit:?}, destination {d_unit:?}): the same bytes would land on other disk servers");
    }
    let mut out = Vec::new();
    for (i, ((sc, sl, _), (dc, dl, durl))) in s.into_iter().zip(d).enumerate() {
        if !unasked.iter().any(|(u, _)| *u == i) {
            check_fits(&sl, &dl, &durl)?;
        }
        out.push(Stream {
            source: sc,
            source_lun: sl,
            dest: dc,
            dest_lun: dl,
            dest_url: durl,
            writer: None,
            also: Vec::new(),
        });
    }
    let check = DestCheck::start(&out, unasked);
    Ok((out, check))
}

/// One line of `--json` progress.
#[derive(Serialize)]
pub struct Tick<'a> {
    pub event: &'static str,
    /// Seconds since the streams started.
    pub t: f64,
    /// The same moment as Unix time, for lining up with other records.
    pub unix: f64,
    pub bytes: u64,
    pub done_bytes: u64,
    /// Bytes the streams have still to send.
    pub left_bytes: u64,
    /// Seconds until the last stream ends at the rates now (none while a running
    /// stream has no rate yet).
    pub eta_s: Option<f64>,
    pub rate_bytes_per_s: u64,
    pub phase: crate::pace::Phase,
    pub pacing_total: Option<u64>,
    pub streams: Vec<StreamTick<'a>>,
}

#[derive(Serialize)]
pub struct StreamTick<'a> {
    pub source: &'a str,
    pub dest: &'a str,
    pub state: JobState,
    pub bytes: u64,
    pub done_bytes: u64,
    /// Bytes still to send: 0 once the stream ended.
    pub left_bytes: u64,
    /// Seconds until the stream ends at its rate now: 0 once it ended, none while it
    /// has no rate.
    pub eta_s: Option<f64>,
    /// Bytes the destination has flushed in order from the start: what a resumed sync
    /// does not send again.
    pub durable_bytes: u64,
    pub rate_bytes_per_s: u64,
    pub pacing: Option<u64>,
    pub min_rtt_ms: f64,
    /// The connections' smoothed RTT: above `min_rtt_ms` by the time data waits in a
    /// queue on the path (the bottleneck's, when the streams overfill it).
    pub srtt_ms: f64,
    pub retransmits: u64,
    pub connections: usize,
    pub finished_at: Option<f64>,
}

/// What a sync did.
#[derive(Serialize, Debug)]
pub struct Report {
    pub event: &'static str,
    /// Unix time the streams started.
    pub started_unix: f64,
    pub streams: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub rate_bytes_per_s: u64,
    pub bottleneck_bytes_per_s: Option<u64>,
    pub finish_spread: f64,
    pub finished_at: Vec<f64>,
    /// Bytes each stream sent.
    pub stream_bytes: Vec<u64>,
    pub verified_units: u64,
    pub repaired_units: u64,
    pub incremental: bool,
    /// Bytes of the units sent as data, before compression (repairs not counted).
    pub data_bytes: u64,
    /// Bytes those units took in the writes' Data-Out (compressed or as they are).
    pub wire_bytes: u64,
    /// Bytes made zeros on the destination without data.
    pub zero_bytes: u64,
    /// Units sent compressed.
    pub compressed_units: u64,
    /// The point-in-time cut the copy is of, and its holds (absent: the live LUNs).
    pub cut: Option<CutReport>,
    /// The cycle at the far site (`crate::cycle`): committed when the report is made.
    pub cycle: Option<CycleReport>,
    /// Where the sync's seconds went.
    pub phases: Phases,
}

/// Where a sync's seconds went, phase by phase, on the coordinator's clock (`--json`'s
/// `phases`, in the `done` line and in continuous mode's `cycle` lines). The phases run
/// one after the other unless said; a phase the sync did not go through is 0.
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// Both volumes' layouts: the source's members asked, the destination's file server.
    pub plan_s: f64,
    /// Both sides' roles and epochs checked, and, at once, the far members' cycle states.
    pub roles_s: f64,
    /// The point-in-time cut at the source: holds, images, releases.
    pub cut_s: f64,
    /// The cycle opened on every far member (after a roll forward, if one was due). A
    /// sync of a cut that is not a resync opens it before the cut, and its streams'
    /// sessions log in meanwhile (`POST /v1/connect`): this ends when both are done.
    pub open_s: f64,
    /// The sends started on the source agents (their answers).
    pub start_s: f64,
    /// From the sends' start to the slowest stream's session logged in and its LUN
    /// opened (by its agent's clock; 0 for a session logged in ahead).
    pub login_s: f64,
    /// From the sends' start to the slowest stream's first unit acknowledged (by its
    /// agent's clock).
    pub first_ack_s: f64,
    /// From the sends' start to the poll that saw the last stream end (its units
    /// durable).
    pub streams_s: f64,
    /// Checksums compared, every stream at once, and repairs.
    pub verify_s: f64,
    /// The cycle prepared on every far member.
    pub prepare_s: f64,
    /// The cycle committed on every far member.
    pub commit_s: f64,
    /// The source's change-tracking epochs released.
    pub release_s: f64,
    /// The cut's images dropped at the source.
    pub drop_s: f64,
    /// The completed sync's roles and image recorded on both sides.
    pub record_s: f64,
    /// From the start of the cut (a live copy: of the open) to the end of the commit:
    /// the replica's lag (RPO) is at most the time between two cuts plus this. (The
    /// phases in it: `cut_s`, `start_s` to `commit_s`, and `open_s` for a resync or a
    /// live copy, which open after the cut.)
    pub cut_to_commit_s: f64,
    /// When the commit ended (the transfer's; not shown).
    #[serde(skip)]
    committed_at: Option<Instant>,
}

/// Seconds since `t`, and `t` moved to now.
fn lap(t: &mut Instant) -> f64 {
    let now = Instant::now();
    let s = now.duration_since(*t).as_secs_f64();
    *t = now;
    s
}

/// A sync's cycle at the far site.
#[derive(Serialize, Debug, Clone)]
pub struct CycleReport {
    pub cycle: u64,
    /// When the image was cut at the source, ms since the Unix epoch (the start of the
    /// cut: every write acknowledged before it is in the image).
    pub cut_unix_ms: u64,
    /// Whether every destination member keeps the copy whole (an undo log).
    pub whole: bool,
}

/// Why a sync ended without an error of its own: it was asked to stop.
#[derive(Debug, thiserror::Error)]
#[error("abandoned: asked to stop")]
pub struct Abandoned {
    /// Whether every stream was seen ended (none writes to the far site any more).
    pub ended: bool,
}

#[derive(Serialize, serde::Deserialize, Default, Clone)]
struct ResumeState {
    source: String,
    dest: String,
    unit: u64,
    skip: Vec<u64>,
}

/// How long to wait before asking the streams again: the interval, or less once every
/// stream still running should end sooner (its bytes left at its last rate), so that the
/// command ends soon after its last stream, not up to an interval later.
fn next_poll(interval: Duration, views: &[StreamView], rates: &[u64]) -> Duration {
    const SOONEST: Duration = Duration::from_millis(50);
    let mut longest = Duration::ZERO;
    for (i, v) in views.iter().enumerate() {
        if v.finished {
            continue;
        }
        let rate = rates.get(i).copied().unwrap_or(0);
        if v.remaining > 0 && rate == 0 {
            return interval;
        }
        longest = longest.max(Duration::from_secs_f64(
            v.remaining as f64 / rate.max(1) as f64,
        ));
    }
    longest.clamp(SOONEST, interval.max(SOONEST))
}

/// Each stream's bytes left (0 once it ended) and seconds to its end at its rate now
/// (none while a running stream has no rate).
fn left_and_eta(views: &[StreamView], rates: &[u64]) -> (Vec<u64>, Vec<Option<f64>>) {
    views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let rate = rates.get(i).copied().unwrap_or(0);
            match (v.finished, rate) {
                (true, _) => (0, Some(0.0)),
                (false, 0) => (v.remaining, None),
                (false, r) => (v.remaining, Some(v.remaining as f64 / r as f64)),
            }
        })
        .unzip()
}

/// One member of a consistency group: its agent and its LUN there.
#[derive(Clone, Debug)]
pub struct GroupMember {
    pub agent: Client,
    pub iqn: String,
    pub lun: u16,
}

/// A cut taken: its id (what the sends name) and how long each member held its write
/// answers.
#[derive(Clone, Debug, Serialize)]
pub struct CutReport {
    pub cut: u64,
    /// Per member, µs (absent: it did not say).
    pub held_us: Vec<Option<u64>>,
    /// From the first hold asked to the last release answered, ms.
    pub took_ms: f64,
}

impl CutReport {
    /// The longest hold of any member, µs.
    pub fn max_held_us(&self) -> u64 {
        self.held_us.iter().flatten().copied().max().unwrap_or(0)
    }
}

/// Takes one point-in-time cut across `members` (`crate::cut`'s barrier): each holds its
/// write answers, then each takes its image, then all release. Holds last `hold` at most:
/// past it, the cut aborts (holds released, images dropped) and this fails.
pub async fn cut(members: &[GroupMember], hold: Duration) -> anyhow::Result<CutReport> {
    cut_as(members, hold, new_cut_id()).await
}

/// A new cut's id: odd and non-zero, so that no two coordinators pick the same one by
/// chance.
pub fn new_cut_id() -> u64 {
    rand::random::<u64>() | 1
}

/// [`cut`], its id `id` chosen beforehand (the far cycle, opened before it, carries it).
pub async fn cut_as(members: &[GroupMember], hold: Duration, id: u64) -> anyhow::Result<CutReport> {
    use crate::cut::{Action, Barrier, Phase};
    let t0 = Instant::now();
    let mut barrier = Barrier::new(members.len(), hold);
    type Pending = tokio::task::JoinSet<(Action, anyhow::Result<api::CutAnswer>)>;
    let mut pending: Pending = tokio::task::JoinSet::new();
    let ask = |pending: &mut Pending, a: Action| {
        let (i, path) = match a {
            Action::Hold(i) => (i, "/v1/cut/hold"),
            Action::Image(i) => (i, "/v1/cut/image"),
            Action::Release(i) => (i, "/v1/cut/release"),
            Action::Drop(i) => (i, "/v1/cut/drop"),
        };
        let m = members[i].clone();
        let req = api::CutRequest {
            iqn: m.iqn,
            lun: m.lun,
            cut: id,
            hold_ms: hold.as_millis() as u64,
            lease_ms: 0,
        };
        pending.spawn(async move { (a, m.agent.call("POST", path, &req).await) });
    };
    for a in barrier.start(t0.elapsed()) {
        ask(&mut pending, a);
    }
    let deadline = tokio::time::Instant::from_std(t0) + hold;
    loop {
        let open = matches!(barrier.phase(), Phase::Holding | Phase::Imaging);
        if pending.is_empty() && !open {
            break;
        }
        let actions = tokio::select! {
            r = pending.join_next(), if !pending.is_empty() => {
                let (a, r) = r.expect("not empty")?;
                let now = t0.elapsed();
                let r = r.map_err(|e| format!("{:#}", e));
                match a {
                    Action::Hold(i) => barrier.on_held(i, r.map(|_| ()), now),
                    Action::Image(i) => barrier.on_imaged(i, r.map(|_| ()), now),
                    Action::Release(i) => {
                        let held = r.ok().and_then(|a| a.held_us).map(Duration::from_micros);
                        barrier.on_released(i, held)
                    }
                    Action::Drop(_) => Vec::new(),
                }
            }
            _ = tokio::time::sleep_until(deadline), if open => barrier.tick(t0.elapsed() + Duration::from_millis(1)),
        };
        for a in actions {
            ask(&mut pending, a);
        }
    }
    match barrier.phase() {
        Phase::Done => Ok(CutReport {
            cut: id,
            held_us: barrier
                .held_for()
                .iter()
                .map(|h| h.map(|d| d.as_micros() as u64))
                .collect(),
            took_ms: t0.elapsed().as_secs_f64() * 1e3,
        }),
        Phase::Aborted(why) => bail!("the cut across {} member(s) aborted: {why}", members.len()),
        p => bail!("the cut ended in phase {p:?}"),
    }
}

/// Drops the images of cut `id` on every member (the sync is over); failures are logged
/// (each agent drops its image by itself when its lease runs out).
pub async fn drop_cut(members: &[GroupMember], id: u64) {
    let mut set = tokio::task::JoinSet::new();
    for m in members.iter().cloned() {
        set.spawn(async move {
            let req = api::CutRequest {
                iqn: m.iqn.clone(),
                lun: m.lun,
                cut: id,
                hold_ms: 0,
                lease_ms: 0,
            };
            if let Err(e) = m
                .agent
                .call::<api::CutAnswer>("POST", "/v1/cut/drop", &req)
                .await
            {
                tracing::warn!("dropping the image of cut {id} on {}: {e:#}", m.agent.addr);
            }
        });
    }
    while set.join_next().await.is_some() {}
}

/// Runs a sync to its end. `out` gets progress: `Some(tick)` every interval.
pub async fn run(
    src: &VolumeRef,
    dst: &VolumeRef,
    key: &Key,
    o: &SyncOptions,
    out: impl FnMut(&Tick<'_>),
) -> anyhow::Result<Report> {
    let mut ph = Phases::default();
    let mut mark = Instant::now();
    let (mut streams, dest_check) = plan(src, dst, key).await?;
    ph.plan_s = lap(&mut mark);
    // The roles of both sides, before any data moves (two primaries, a stale source).
    let kind = if o.resync {
        crate::role::Transfer::Resync
    } else {
        crate::role::Transfer::Sync { full: o.full }
    };
    let far: Vec<crate::cycle::FarMember> = streams
        .iter()
        .map(|s| crate::cycle::FarMember {
            agent: s.dest.clone(),
            iqn: s.dest_lun.iqn.clone(),
            lun: s.dest_lun.lun,
        })
        .collect();
    // The far members' cycle states are read beside the roles (both only read, across
    // the long path): the open after the cut is then one request, not three.
    let (gate, found) = tokio::join!(
        crate::failover::before_transfer(src, dst, key, kind, &mut streams),
        crate::cycle::states(&far)
    );
    let gate = gate?;
    let found = found?;
    ph.roles_s = lap(&mut mark);
    let Some(hold) = o.cut else {
        // A live copy is of no single moment, but the image the far site held before it
        // is still kept until it completes.
        let id = rand::random::<u64>() | 1;
        let cut_at = Instant::now();
        let opened = crate::cycle::open_with(far, found, id, crate::cycle::now_ms(), gate.epoch())
            .await
            .context("opening the cycle at the far site")?;
        ph.open_s = lap(&mut mark);
        opened.tag_writers(&mut streams);
        if o.resync {
            crate::failover::far_changes(&mut streams, &shown_volume(src), &shown_volume(dst))
                .await?;
        }
        let r = transfer(src, dst, o, streams, dest_check, None, Some(&opened), out).await;
        let mut r = finish_cycle(r, &opened).await?;
        mark = Instant::now();
        crate::failover::after_transfer(&gate, id).await?;
        r.phases = Phases {
            record_s: lap(&mut mark),
            ..ph.with_transfer(&r.phases, cut_at)
        };
        return Ok(r);
    };
    let members: Vec<GroupMember> = streams
        .iter()
        .map(|s| GroupMember {
            agent: s.source.clone(),
            iqn: s.source_lun.iqn.clone(),
            lun: s.source_lun.lun,
        })
        .collect();
    let (taken, cut_at, opened) = if o.resync {
        // The destination's map is read once its cycle is open, and the sends carry it
        // (`failover::far_changes`): the cut, the open, the map, then the sends.
        let cut_ms = crate::cycle::now_ms();
        let cut_at = Instant::now();
        let taken = cut(&members, hold)
            .await
            .context("the point-in-time cut of the source")?;
        ph.cut_s = lap(&mut mark);
        let opened =
            match crate::cycle::open_with(far, found, taken.cut, cut_ms, gate.epoch()).await {
                Ok(c) => c,
                Err(e) => {
                    drop_cut(&members, taken.cut).await;
                    return Err(e.context("opening the cycle at the far site"));
                }
            };
        ph.open_s = lap(&mut mark);
        opened.tag_writers(&mut streams);
        // On a failure the cycle stays open, as any sync's that failed, for the next open.
        if let Err(e) =
            crate::failover::far_changes(&mut streams, &shown_volume(src), &shown_volume(dst)).await
        {
            drop_cut(&members, taken.cut).await;
            return Err(e);
        }
        (taken, cut_at, opened)
    } else {
        // The far cycle is opened before the cut, and the streams' sessions log in
        // (tagged with the cycle) at the same time: the cut is then followed at once by
        // data, not by an open and logins (several round trips over a long path), and
        // the replica's lag loses them. The open names the cut to come (its id, chosen
        // now) and a moment before it, which the far site keeps as its image's: every
        // write acknowledged before that moment is in the image, as it is of the cut's
        // own start (this sync's report gives the cut's own, later moment). A cut that
        // then fails leaves the cycle open, written by nothing, as a sync that failed
        // after its open: the next open continues it.
        let id = new_cut_id();
        crate::cycle::tag_writers(&mut streams, id, found.iter().all(|s| s.undo));
        let (opened, ()) = tokio::join!(
            crate::cycle::open_with(far, found, id, crate::cycle::now_ms(), gate.epoch()),
            connect_ahead(&streams, o)
        );
        let mut opened = opened.context("opening the cycle at the far site")?;
        ph.open_s = lap(&mut mark);
        let cut_ms = crate::cycle::now_ms();
        let cut_at = Instant::now();
        let taken = cut_as(&members, hold, id)
            .await
            .context("the point-in-time cut of the source")?;
        ph.cut_s = lap(&mut mark);
        // The image's moment as this sync reports it: the cut's start.
        opened.cut_ms = cut_ms;
        (taken, cut_at, opened)
    };
    tracing::info!(
        "cut {} across {} member(s) in {:.1} ms; longest hold {} µs",
        taken.cut,
        members.len(),
        taken.took_ms,
        taken.max_held_us()
    );
    let r = transfer(
        src,
        dst,
        o,
        streams,
        dest_check,
        Some(taken.clone()),
        Some(&opened),
        out,
    )
    .await;
    let r = finish_cycle(r, &opened).await;
    mark = Instant::now();
    drop_cut(&members, taken.cut).await;
    let drop_s = lap(&mut mark);
    let mut r = r?;
    crate::failover::after_transfer(&gate, taken.cut).await?;
    r.phases = Phases {
        drop_s,
        record_s: lap(&mut mark),
        ..ph.with_transfer(&r.phases, cut_at)
    };
    Ok(r)
}

impl Phases {
    /// These phases (before the transfer) with the transfer's own `t`; the cut (or the
    /// open, for a live copy) began at `cut_at`.
    fn with_transfer(&self, t: &Phases, cut_at: Instant) -> Phases {
        Phases {
            cut_to_commit_s: t
                .committed_at
                .map_or(0.0, |c| c.saturating_duration_since(cut_at).as_secs_f64()),
            committed_at: t.committed_at,
            start_s: t.start_s,
            login_s: t.login_s,
            first_ack_s: t.first_ack_s,
            streams_s: t.streams_s,
            verify_s: t.verify_s,
            prepare_s: t.prepare_s,
            commit_s: t.commit_s,
            release_s: t.release_s,
            ..self.clone()
        }
    }
}

/// After a transfer: a cycle abandoned on request (its streams ended) is rolled back at
/// once; one that failed otherwise is left to the next open (a stream may still write),
/// or to the far target's start.
async fn finish_cycle(
    r: anyhow::Result<Report>,
    opened: &crate::cycle::Opened,
) -> anyhow::Result<Report> {
    match r {
        Err(e) if e.downcast_ref::<Abandoned>().is_some_and(|a| a.ended) => {
            opened.roll_back().await;
            Err(e)
        }
        r => r,
    }
}

/// The sends of a transfer, started ([`launch`]).
struct Launched {
    ctl: Controller,
    /// The pacing each was started at.
    applied: Vec<Option<u64>>,
    jobs: Vec<api::SendStarted>,
    /// How long their start took.
    start_s: f64,
    incremental: bool,
    resume: ResumeState,
}

/// Starts every stream's send, all at once: the units changed since the last sync, or
/// every unit when `far_lost` (the far site rolled a cycle back since its last commit),
/// with `--full` or without change tracking.
async fn launch(
    src: &VolumeRef,
    dst: &VolumeRef,
    o: &SyncOptions,
    streams: &[Stream],
    cut_id: Option<u64>,
    far_lost: bool,
) -> anyhow::Result<Launched> {
    let n = streams.len();
    let label = |v: &VolumeRef| format!("{}/{}/{}", addr(&v.host, v.port), v.iqn, v.lun);
    let mut resume = ResumeState {
        source: label(src),
        dest: label(dst),
        unit: o.unit,
        skip: vec![0; n],
    };
    if let Some(path) = &o.state {
        if let Ok(text) = std::fs::read(path) {
            let old: ResumeState = serde_json::from_slice(&text)
                .with_context(|| format!("resume state {}", path.display()))?;
            if old.source == resume.source
                && old.dest == resume.dest
                && old.unit == o.unit
                && old.skip.len() == n
            {
                tracing::info!("resuming from {}", path.display());
                resume.skip = old.skip;
            }
        }
    }
    // A far site that rolled a cycle back lost units the source counted as sent: every
    // unit goes again, and a resume point is no good. Not for a resync: it sends the
    // destination's own change map beside the source's (`also`, read once the cycle was
    // open), and a roll back marks every unit it restores in the map of the side that
    // rolled back (`backstore::Undo::open_with`). So a resync onto a site that rolled a
    // cycle back (a promote --force of it, then a failover the other way) stays
    // incremental, and still sends the units the roll back restored.
    let far_lost = far_lost && !o.resync;
    if far_lost {
        resume.skip = vec![0; n];
    }
    let incremental =
        !o.full && !far_lost && streams.iter().all(|s| s.source_lun.tracking.is_some());
    anyhow::ensure!(
        incremental || !o.resync,
        "a resync sends what changed on both sides and needs change tracking on the source (track = true), without --full"
    );
    let given = o.rate.map(payload_rate);
    let mut ctl = Controller::new(o.pacing, given, n);
    let first = ctl.tick(
        Duration::ZERO,
        Duration::from_millis(100),
        &vec![StreamView::default(); n],
    );
    // Start every stream, all at once.
    let start_at = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, s) in streams.iter().enumerate() {
        let req = api::SendRequest {
            iqn: s.source_lun.iqn.clone(),
            lun: s.source_lun.lun,
            dest: s.dest_url.clone(),
            unit: o.unit,
            what: if incremental {
                What::Changed
            } else {
                What::All
            },
            skip_units: if incremental { 0 } else { resume.skip[i] },
            pacing: first.shares.get(i).copied().flatten(),
            session: s.session(o),
            compress: o.compress,
            cut: cut_id,
            also: s.also.clone(),
        };
        let c = s.source.clone();
        set.spawn(async move {
            (
                i,
                c.call::<api::SendStarted>("POST", "/v1/send", &req).await,
            )
        });
    }
    let mut started = vec![None; n];
    let mut error = None;
    while let Some(r) = set.join_next().await {
        let (i, r) = r?;
        match r {
            Ok(st) => started[i] = Some(st),
            Err(e) => {
                error.get_or_insert(e.context(format!("starting stream {i}")));
            }
        }
    }
    if let Some(e) = error {
        // Stop the streams that did start.
        let (ok_streams, ok_jobs): (Vec<_>, Vec<_>) = streams
            .iter()
            .zip(started)
            .filter_map(|(s, j)| Some((s.clone(), j?)))
            .unzip();
        cancel_all(&ok_streams, &ok_jobs).await;
        return Err(e);
    }
    Ok(Launched {
        ctl,
        applied: first.shares.clone(),
        jobs: started.into_iter().flatten().collect(),
        start_s: start_at.elapsed().as_secs_f64(),
        incremental,
        resume,
    })
}

/// Logs every stream's session in ahead of its send (`POST /v1/connect` on its source
/// agent), so that the send writes at once. A stream whose agent could not (an older
/// agent, a failed login) logs in with its send, as before: said in the log, not fatal.
async fn connect_ahead(streams: &[Stream], o: &SyncOptions) {
    let mut set = tokio::task::JoinSet::new();
    for (i, s) in streams.iter().enumerate() {
        let req = api::ConnectRequest {
            dest: s.dest_url.clone(),
            session: s.session(o),
        };
        let c = s.source.clone();
        set.spawn(async move {
            (
                i,
                c.call::<serde_json::Value>("POST", "/v1/connect", &req)
                    .await,
            )
        });
    }
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, Err(e))) => {
                tracing::info!("stream {i}: not logged in ahead ({e:#}); its send logs in")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("logging in ahead: {e}"),
        }
    }
}

/// The transfer of a planned sync, from the live LUNs or from the images of `cut`.
// The plan, the cut and the far site's cycle are what a transfer is of; bundling them
// would only rename them.
#[allow(clippy::too_many_arguments)]
async fn transfer(
    src: &VolumeRef,
    dst: &VolumeRef,
    o: &SyncOptions,
    mut streams: Vec<Stream>,
    dest_check: DestCheck,
    taken: Option<CutReport>,
    cycle: Option<&crate::cycle::Opened>,
    mut out: impl FnMut(&Tick<'_>),
) -> anyhow::Result<Report> {
    let cut_id = taken.as_ref().map(|c| c.cut);
    let mut dest_check = Some(dest_check);
    let n = streams.len();
    let far_lost = cycle.is_some_and(|c| c.full);
    let Launched {
        mut ctl,
        mut applied,
        jobs,
        start_s,
        incremental,
        resume,
    } = launch(src, dst, o, &streams, cut_id, far_lost).await?;
    let total_bytes: u64 = jobs.iter().map(|j| j.bytes).sum();
    let t0 = Instant::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut finished_at: Vec<Option<f64>> = vec![None; n];
    let mut statuses: Vec<Option<JobStatus>> = vec![None; n];
    let mut pause = o.interval;
    loop {
        tokio::time::sleep(pause).await;
        let mut set = tokio::task::JoinSet::new();
        for (i, (s, j)) in streams.iter().zip(&jobs).enumerate() {
            let c = s.source.clone();
            let path = format!("/v1/jobs/{}", j.job);
            set.spawn(async move { (i, c.call::<JobStatus>("GET", &path, &()).await) });
        }
        while let Some(r) = set.join_next().await {
            let (i, r) = r?;
            match r {
                Ok(st) => statuses[i] = Some(st),
                Err(e) => tracing::warn!("stream {i}: {e:#}"),
            }
        }
        if dest_check.as_ref().is_some_and(DestCheck::is_finished) {
            let check = dest_check.take().expect("checked");
            if let Err(e) = check.finish(&mut streams).await {
                cancel_all(&streams, &jobs).await;
                return Err(e);
            }
        }
        let now = t0.elapsed();
        let mut failed = None;
        for (i, st) in statuses.iter().enumerate() {
            if let Some(st) = st {
                if matches!(st.state, JobState::Failed | JobState::Cancelled) && failed.is_none() {
                    failed = Some((i, st.error.clone().unwrap_or_else(|| "cancelled".into())));
                }
                if st.state == JobState::Done && finished_at[i].is_none() {
                    // When the agent saw it end, not when this poll heard of it.
                    let ago = st.ended_ms.map_or(0, |e| st.elapsed_ms.saturating_sub(e));
                    let at = now.saturating_sub(Duration::from_millis(ago));
                    finished_at[i] = Some(at.as_secs_f64());
                }
            }
        }
        if let (Some(path), false) = (&o.state, incremental) {
            // The jobs' plans start after the units skipped already.
            let save = ResumeState {
                skip: (0..n)
                    .map(|i| resume.skip[i] + statuses[i].as_ref().map_or(0, |s| s.durable_prefix))
                    .collect(),
                ..resume.clone()
            };
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, serde_json::to_vec(&save)?).is_ok() {
                let _ = std::fs::rename(&tmp, path);
            }
        }
        if o.stop.load(std::sync::atomic::Ordering::SeqCst) {
            cancel_all(&streams, &jobs).await;
            let ended = wait_ended(&streams, &jobs).await;
            return Err(Abandoned { ended }.into());
        }
        if let Some((i, e)) = failed {
            cancel_all(&streams, &jobs).await;
            bail!(
                "stream {i} ({} to {}) failed: {e}; run the same command again to resume",
                streams[i].source.addr,
                streams[i].dest_url
            );
        }
        let views: Vec<StreamView> = statuses
            .iter()
            .zip(&jobs)
            .map(|(st, j)| match st {
                Some(st) => StreamView {
                    done: st.done_bytes,
                    remaining: st.bytes - st.done_bytes.min(st.bytes),
                    finished: st.state == JobState::Done,
                    wire_rate: st.wire_rate,
                },
                None => StreamView {
                    done: 0,
                    remaining: j.bytes,
                    finished: false,
                    wire_rate: 0,
                },
            })
            .collect();
        let rtt = statuses
            .iter()
            .flatten()
            .map(|s| s.min_rtt_ms)
            .filter(|r| *r > 0.0)
            .fold(f64::INFINITY, f64::min);
        let rtt = if rtt.is_finite() {
            Duration::from_secs_f64(rtt / 1e3)
        } else {
            Duration::from_millis(100)
        };
        let decision: Decision = ctl.tick(now, rtt, &views);
        for (i, share) in decision.shares.iter().enumerate() {
            let old = applied[i];
            let changed = match (old, *share) {
                (None, None) => false,
                (Some(a), Some(b)) => a.abs_diff(b) * 50 > a,
                _ => true,
            };
            if changed && !views[i].finished {
                let path = format!("/v1/jobs/{}/pace", jobs[i].job);
                match streams[i]
                    .source
                    .call::<JobStatus>("POST", &path, &api::Pace { rate: *share })
                    .await
                {
                    Ok(_) => applied[i] = *share,
                    Err(e) => tracing::warn!("pacing stream {i}: {e:#}"),
                }
            }
        }
        let (rate, rates) = ctl.rates();
        let (lefts, etas) = left_and_eta(&views, rates);
        let tick = Tick {
            event: "progress",
            t: now.as_secs_f64(),
            unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            bytes: total_bytes,
            done_bytes: views.iter().map(|v| v.done).sum(),
            left_bytes: lefts.iter().sum(),
            eta_s: etas.iter().try_fold(0f64, |most, e| e.map(|e| most.max(e))),
            rate_bytes_per_s: rate,
            phase: ctl.phase(),
            pacing_total: decision.total,
            streams: streams
                .iter()
                .enumerate()
                .map(|(i, s)| StreamTick {
                    source: &s.source.addr,
                    dest: &s.dest_url,
                    state: statuses[i]
                        .as_ref()
                        .map_or(JobState::Connecting, |s| s.state),
                    bytes: jobs[i].bytes,
                    done_bytes: views[i].done,
                    left_bytes: lefts[i],
                    eta_s: etas[i],
                    durable_bytes: statuses[i].as_ref().map_or(0, |s| s.durable_bytes),
                    rate_bytes_per_s: rates.get(i).copied().unwrap_or(0),
                    pacing: applied[i],
                    min_rtt_ms: statuses[i].as_ref().map_or(0.0, |s| s.min_rtt_ms),
                    srtt_ms: statuses[i].as_ref().map_or(0.0, |s| s.srtt_ms),
                    retransmits: statuses[i].as_ref().map_or(0, |s| s.retransmits),
                    connections: statuses[i].as_ref().map_or(0, |s| s.connections),
                    finished_at: finished_at[i],
                })
                .collect(),
        };
        out(&tick);
        if finished_at.iter().all(Option::is_some) {
            break;
        }
        pause = next_poll(o.interval, &views, rates);
    }
    let seconds = t0.elapsed().as_secs_f64();
    // A transfer shorter than the destination's answers waits for them before verifying.
    if let Some(check) = dest_check.take() {
        check.finish(&mut streams).await?;
    }
    let ends: Vec<f64> = finished_at.iter().map(|f| f.unwrap_or(seconds)).collect();
    let (lo, hi) = ends
        .iter()
        .fold((f64::INFINITY, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
    let mut report = Report {
        event: "done",
        started_unix,
        streams: n,
        bytes: total_bytes,
        seconds,
        rate_bytes_per_s: (total_bytes as f64 / seconds.max(1e-9)) as u64,
        bottleneck_bytes_per_s: ctl.bottleneck(),
        finish_spread: if hi > 0.0 { (hi - lo) / hi } else { 0.0 },
        finished_at: ends,
        stream_bytes: jobs.iter().map(|j| j.bytes).collect(),
        verified_units: 0,
        repaired_units: 0,
        incremental,
        data_bytes: statuses.iter().flatten().map(|s| s.data_bytes).sum(),
        wire_bytes: statuses.iter().flatten().map(|s| s.wire_bytes).sum(),
        zero_bytes: statuses.iter().flatten().map(|s| s.zero_bytes).sum(),
        compressed_units: statuses.iter().flatten().map(|s| s.compressed_units).sum(),
        cut: taken,
        cycle: cycle.map(|c| CycleReport {
            cycle: c.ids.iter().copied().max().unwrap_or(c.cycle),
            cut_unix_ms: c.cut_ms,
            whole: c.whole,
        }),
        phases: Phases {
            start_s,
            // By the agents' clocks, from their jobs' starts.
            login_s: statuses
                .iter()
                .flatten()
                .filter_map(|s| s.login_ms)
                .max()
                .map_or(0.0, |ms| ms as f64 / 1e3),
            first_ack_s: statuses
                .iter()
                .flatten()
                .filter_map(|s| s.first_ack_ms)
                .max()
                .map_or(0.0, |ms| ms as f64 / 1e3),
            streams_s: seconds,
            ..Phases::default()
        },
    };
    let mut mark = Instant::now();
    if o.verify {
        let (verified, repaired) = verify(&streams, &jobs, o, cut_id).await?;
        report.verified_units = verified;
        report.repaired_units = repaired;
    }
    report.phases.verify_s = lap(&mut mark);
    // Committed before the source lets go of what it sent: a commit that fails leaves
    // the epochs frozen, and the next cycle sends their units again.
    if let Some(c) = cycle {
        let (prepare, commit) = c.commit().await?;
        report.phases.prepare_s = prepare.as_secs_f64();
        report.phases.commit_s = commit.as_secs_f64();
        report.phases.committed_at = Some(Instant::now());
    }
    mark = Instant::now();
    // Every member's epoch at once (a source agent may be a long path away too).
    let mut set = tokio::task::JoinSet::new();
    for (s, j) in streams.iter().zip(&jobs) {
        if let Some(epoch) = j.epoch {
            let r = api::Release {
                iqn: s.source_lun.iqn.clone(),
                lun: s.source_lun.lun,
                epoch,
            };
            let c = s.source.clone();
            set.spawn(async move {
                c.call::<serde_json::Value>("POST", "/v1/release", &r)
                    .await
                    .context("releasing the synced epoch")
            });
        }
    }
    let mut released = Ok(());
    while let Some(r) = set.join_next().await {
        if let Err(e) = r? {
            released = released.and(Err(e));
        }
    }
    released?;
    report.phases.release_s = lap(&mut mark);
    if let Some(path) = &o.state {
        let _ = std::fs::remove_file(path);
    }
    Ok(report)
}

/// Waits (10 s at most) until no stream runs: none writes to the far site any more.
/// Whether they all ended.
async fn wait_ended(streams: &[Stream], jobs: &[api::SendStarted]) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let mut running = false;
        for (s, j) in streams.iter().zip(jobs) {
            match s
                .source
                .call::<JobStatus>("GET", &format!("/v1/jobs/{}", j.job), &())
                .await
            {
                Ok(st) => running |= matches!(st.state, JobState::Connecting | JobState::Running),
                Err(_) => running = true,
            }
        }
        if !running {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!("streams still running 10 s after they were cancelled");
    false
}

async fn cancel_all(streams: &[Stream], jobs: &[api::SendStarted]) {
    for (s, j) in streams.iter().zip(jobs) {
        let _ = s
            .source
            .call::<JobStatus>("POST", &format!("/v1/jobs/{}/cancel", j.job), &())
            .await;
    }
}

fn ranges(indices: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for i in indices {
        match out.last_mut() {
            Some((_, end)) if *end == i => *end += 1,
            _ => out.push((i, i + 1)),
        }
    }
    out
}

/// Compares each stream's unit checksums, taken by the source as it sent and by the
/// destination from its store; units that differ are sent again (once) and compared
/// again. Every stream at once: each asks its destination across the long path, and one
/// after the other they cost a round trip or two each. Returns (units verified, units
/// repaired).
async fn verify(
    streams: &[Stream],
    jobs: &[api::SendStarted],
    o: &SyncOptions,
    cut: Option<u64>,
) -> anyhow::Result<(u64, u64)> {
    let mut set = tokio::task::JoinSet::new();
    for (i, (s, j)) in streams.iter().zip(jobs).enumerate() {
        let (s, j, o) = (s.clone(), j.clone(), o.clone());
        set.spawn(async move { (i, verify_stream(i, &s, &j, &o, cut).await) });
    }
    let mut results: Vec<Option<anyhow::Result<(u64, u64)>>> =
        (0..streams.len()).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        let (i, r) = r?;
        results[i] = Some(r);
    }
    let (mut verified, mut repaired) = (0, 0);
    // The first stream's error by rank, as when they were verified one by one.
    for r in results.into_iter().flatten() {
        let (v, rep) = r?;
        verified += v;
        repaired += rep;
    }
    Ok((verified, repaired))
}

/// [`verify`] of stream `i`.
async fn verify_stream(
    i: usize,
    s: &Stream,
    j: &api::SendStarted,
    o: &SyncOptions,
    cut: Option<u64>,
) -> anyhow::Result<(u64, u64)> {
    let mut verified = 0;
    let mut repaired = 0;
    let mut src: api::Sums = s
        .source
        .call("GET", &format!("/v1/jobs/{}/sums", j.job), &())
        .await
        .with_context(|| format!("stream {i}: the source's checksums"))?;
    for attempt in 0..2 {
        let req = api::SumsRequest {
            iqn: s.dest_lun.iqn.clone(),
            lun: s.dest_lun.lun,
            unit: src.unit,
            units: ranges(src.sums.iter().map(|(k, _)| *k)),
        };
        let dst: api::Sums = s
            .dest
            .call("POST", "/v1/sums", &req)
            .await
            .with_context(|| format!("stream {i}: the destination's checksums"))?;
        let theirs: std::collections::HashMap<u64, &str> =
            dst.sums.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let bad: Vec<u64> = src
            .sums
            .iter()
            .filter(|(k, v)| theirs.get(k) != Some(&v.as_str()))
            .map(|(k, _)| *k)
            .collect();
        if attempt == 0 {
            verified += src.sums.len() as u64;
        }
        if bad.is_empty() {
            break;
        }
        if attempt == 1 {
            bail!(
                "stream {i}: {} unit(s) still differ after a resend (first: unit {} of {} bytes)",
                bad.len(),
                bad[0],
                src.unit
            );
        }
        tracing::warn!(
            "stream {i}: {} unit(s) differ; sending them again",
            bad.len()
        );
        repaired += bad.len() as u64;
        let req = api::SendRequest {
            iqn: s.source_lun.iqn.clone(),
            lun: s.source_lun.lun,
            dest: s.dest_url.clone(),
            unit: src.unit,
            what: What::Units(ranges(bad.iter().copied())),
            skip_units: 0,
            pacing: None,
            session: s.session(o),
            compress: o.compress,
            cut,
            also: Vec::new(),
        };
        let job: api::SendStarted = s.source.call("POST", "/v1/send", &req).await?;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let st: JobStatus = s
                .source
                .call("GET", &format!("/v1/jobs/{}", job.job), &())
                .await?;
            match st.state {
                JobState::Done => break,
                JobState::Failed | JobState::Cancelled => {
                    bail!("stream {i}: resending: {}", st.error.unwrap_or_default())
                }
                _ => {}
            }
        }
        src = s
            .source
            .call("GET", &format!("/v1/jobs/{}/sums", job.job), &())
            .await?;
    }
    Ok((verified, repaired))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_refs() {
        let v: VolumeRef = "rsv://10.0.0.1/iqn.2026-11.org.x:vol/0".parse().unwrap();
        assert_eq!(
            v,
            VolumeRef {
                host: "10.0.0.1".into(),
                port: 3262,
                iqn: "iqn.2026-11.org.x:vol".into(),
                lun: 0
            }
        );
        let v: VolumeRef = "[::1]:4000/iqn.x/3".parse().unwrap();
        assert_eq!((v.host.as_str(), v.port, v.lun), ("::1", 4000, 3));
        assert!("host/iqn".parse::<VolumeRef>().is_err());
        assert!("host/iqn/x".parse::<VolumeRef>().is_err());
        assert!("/iqn/0".parse::<VolumeRef>().is_err());
    }

    #[test]
    fn polls_sooner_as_the_last_streams_end() {
        let s = Duration::from_millis(500);
        let v = |remaining, finished| StreamView {
            done: 0,
            remaining,
            finished,
            wire_rate: 0,
        };
        // Two seconds left at the last rate: the interval.
        assert_eq!(next_poll(s, &[v(2_000_000, false)], &[1_000_000]), s);
        // 0.2 s left on the slowest stream still running; a finished one does not count.
        assert_eq!(
            next_poll(
                s,
                &[v(100_000, false), v(200_000, false), v(9, true)],
                &[1_000_000, 1_000_000, 0]
            ),
            Duration::from_millis(200)
        );
        // Everything acknowledged, the last flush out: soon.
        assert_eq!(
            next_poll(s, &[v(0, false)], &[0]),
            Duration::from_millis(50)
        );
        // Bytes left and no rate known yet (still logging in): the interval.
        assert_eq!(next_poll(s, &[v(1, false)], &[0]), s);
    }

    #[test]
    fn bytes_left_and_eta_per_stream() {
        let v = |remaining, finished| StreamView {
            done: 0,
            remaining,
            finished,
            wire_rate: 0,
        };
        let (left, eta) = left_and_eta(
            &[v(1_000_000, false), v(5, true), v(300, false)],
            &[500_000, 0, 0],
        );
        assert_eq!(left, [1_000_000, 0, 300]);
        assert_eq!(eta, [Some(2.0), Some(0.0), None]);
    }

    #[test]
    fn unit_ranges() {
        assert_eq!(
            ranges([1, 2, 3, 7, 9, 10].into_iter()),
            vec![(1, 4), (7, 8), (9, 11)]
        );
        assert_eq!(ranges(std::iter::empty()), vec![]);
    }

    #[test]
    fn payload() {
        assert_eq!(payload_rate(1_500_000_000), 181_000_000);
    }
}
