//! The far copy kept whole: each sync is a *cycle* at the destination. Before the streams
//! write, the coordinator opens the cycle on every destination member
//! (`POST /v1/cycle/open`): from then on each member's undo layer (`backstore::undo`)
//! saves what the streams overwrite. Once every stream is done and verified, the
//! coordinator commits the cycle on every member (`POST /v1/cycle/commit`), and only then
//! releases the source's change-tracking epochs. A cycle cut off (link lost, source site
//! lost, coordinator killed) is rolled back when the far target starts: the far LUNs hold
//! the last committed image. If the far target stays up, the next cycle's open continues
//! it instead (the source sends what it had not: a cut-off sync resumes), and ends it
//! with the next image. After a roll back the source's count of what it sent is wrong
//! (the far site lost it), so the next cycle sends every unit ([`Opened::full`]).
//!
//! # Two phases: prepare, then commit
//! Once every member's stream is verified, the coordinator first *prepares* the cycle on
//! every member (`POST /v1/cycle/prepare`: the member shuts the cycle's streams out,
//! flushes its LUN, and marks the cycle prepared in its undo log, one durable write), and
//! only once all are prepared does it commit on each. A prepared cycle is whole on its
//! member and survives a restart (the undo layer keeps it open instead of rolling it
//! back), so a coordinator killed between two members' commits leaves every member either
//! committed or prepared: the cycle can be finished (rolled forward) everywhere. Who
//! finishes it: the next open, or a promote of the far site, both from every member's
//! state through one rule, [`settle`]:
//! - some member committed cycle N: every other must be prepared for N, and commits it;
//! - no member committed the open cycle: it is rolled back on every member (a promote) or
//!   goes on as the next (an open);
//! - a member neither prepared nor committed N while another committed it: the members
//!   cannot be brought to one image, and a promote is refused naming them. With prepare
//!   before every commit this cannot happen (a member commits only once all prepared, and
//!   a prepared member keeps N until told); it is checked all the same, since the states
//!   come over the network from agents of any age.
//!
//! The decisions ([`settle`], [`roll_forward`], [`far_image`]) are sans-IO; the requests
//! are below.
//!
//! **A fault point, for tests only**: with `RSV_SYNC_FAULT_EXIT_AFTER_COMMITS=K` in its
//! environment, the coordinator commits the members one at a time and exits at once
//! (status 86, no clean-up) after the K-th commit, as a coordinator killed there would.
//! Unset (always, in production), nothing changes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use backstore::Undo;

use crate::api::{CycleAnswer, CycleRequest};
use crate::wire::Client;

/// Ms since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A member's state as its undo layer says it.
pub fn answer(undo: Option<&Undo>) -> CycleAnswer {
    let Some(u) = undo else {
        return CycleAnswer::default();
    };
    let s = u.state();
    CycleAnswer {
        undo: true,
        open: s.open,
        committed: s.committed.map(|c| c.0),
        committed_cut_ms: s.committed.map(|c| c.1),
        saved_bytes: s.saved_bytes,
        rolled_back: s.rolled_back,
        prepared: s.prepared,
        saved_units: s.saved_units,
        log_syncs: s.log_syncs,
    }
}

/// Sets the cycle a replica's fence admits streams of (`scsi::Fence::set_cycle`), once
/// the writes it admitted before are made; an error says what still runs.
pub type CycleFence = Arc<dyn Fn(Option<u64>) -> Result<(), String> + Send + Sync>;

/// Serves `POST /v1/cycle/WHAT` for a LUN with undo layer `undo` (none: `undo = false`)
/// and, on a replica, its fence (`fence`). The fence admits the streams of cycle `c`
/// (their initiator names carry it: `backstore::role::cycle_writer`) from the moment `c`
/// is open in the undo log until it is committed or rolled back, and it is closed (its
/// admitted writes waited for) before either: a stream that outlives its cycle changes
/// nothing. Errors: (HTTP status, message).
pub async fn serve(
    undo: Option<Arc<Undo>>,
    fence: Option<CycleFence>,
    what: &str,
    req: CycleRequest,
) -> Result<CycleAnswer, (u16, String)> {
    if what == "state" {
        return Ok(answer(undo.as_deref()));
    }
    let Some(undo) = undo else {
        return Err((
            409,
            format!(
                "LUN {} of {} keeps no undo log (undo = false): its copy is not kept whole",
                req.lun, req.iqn
            ),
        ));
    };
    if matches!(what, "open" | "prepare" | "commit") && req.cycle == 0 {
        return Err((400, "a cycle's id is not 0".into()));
    }
    let what = what.to_owned();
    let u = undo.clone();
    // Roll back and commit write and flush the store, and closing the fence waits for
    // writes: off the runtime's threads.
    let r = tokio::task::spawn_blocking(move || {
        let close = || match &fence {
            Some(f) => f(None).map_err(std::io::Error::other),
            None => Ok(()),
        };
        match what.as_str() {
            "open" => {
                // The streams of an earlier cycle (cut off, going on as this one) are
                // shut out first; this cycle's are admitted once its log is open.
                close()?;
                u.open_cycle(req.cycle, req.cut_ms)?;
                match &fence {
                    Some(f) => f(Some(req.cycle)).map_err(std::io::Error::other),
                    None => Ok(()),
                }
            }
            "prepare" => {
                // What is prepared is all the cycle's streams will ever write here.
                if u.cycle_open() == Some(req.cycle) {
                    close()?;
                }
                u.prepare(req.cycle)
            }
            "commit" => {
                // The image committed is what the streams wrote until now: none after.
                if u.cycle_open() == Some(req.cycle) {
                    close()?;
                }
                u.commit(req.cycle)
            }
            "rollback" => {
                if let Err(e) = close() {
                    // The undo layer still waits for each write that reached it.
                    tracing::warn!("rolling back the cycle: {e}");
                }
                u.roll_back().map(|_| ())
            }
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no such cycle request: {what}"),
            )),
        }
    })
    .await
    .map_err(|e| (500, e.to_string()))?;
    match r {
        Ok(()) => Ok(answer(Some(&undo))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err((404, e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Err((409, e.to_string())),
        Err(e) => Err((500, e.to_string())),
    }
}

/// What brings the far site's members to one image ([`settle`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settle {
    /// Cycle N, committed on some members and prepared on these: commit it on them.
    pub forward: Option<(u64, Vec<usize>)>,
    /// Members whose open cycle no member committed: roll it back on them (a promote; the
    /// next open continues it instead).
    pub back: Vec<usize>,
}

impl Settle {
    /// Nothing to do: no cycle open on any member.
    pub fn is_nothing(&self) -> bool {
        self.forward.is_none() && self.back.is_empty()
    }
}

/// Why the members cannot be brought to one image ([`settle`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unsettled {
    /// Cycle `cycle` was committed on `committed`, while `lost` neither prepared nor
    /// committed it (each with its state, for people): rolling those forward would commit
    /// an image that may lack units, rolling the others back is impossible.
    Lost {
        cycle: u64,
        committed: Vec<usize>,
        lost: Vec<(usize, String)>,
    },
    /// The members hold different committed images and no open cycle joins them.
    Mixed { images: Vec<(usize, Option<u64>)> },
}

/// A member's cycle state in words (in a refusal).
fn shown_state(s: &CycleAnswer) -> String {
    let holds = s.committed.map_or("no committed image".to_string(), |c| {
        format!("holds cycle {c}")
    });
    match (s.open, s.prepared, s.rolled_back) {
        (Some(o), Some(p), _) if o == p => format!("{holds}, cycle {o} open and prepared"),
        (Some(o), _, _) => format!("{holds}, cycle {o} open and not prepared"),
        (None, _, Some(r)) => format!("{holds}, cycle {r} rolled back"),
        (None, _, None) => holds,
    }
}

/// Decides, from every far member's cycle state (by member index; members that keep no
/// undo log have no cycles and are passed over), how the far site comes to one image:
/// see the module documentation. Sans-IO.
pub fn settle(states: &[CycleAnswer]) -> Result<Settle, Unsettled> {
    let idx: Vec<usize> = (0..states.len()).filter(|&i| states[i].undo).collect();
    // The newest commit: a cycle committed on some member and open, or rolled back, on
    // another. Cycle ids are cut ids, in no order: only this tells which is newer.
    let mut newest: Vec<u64> = idx
        .iter()
        .filter_map(|&i| states[i].committed)
        .filter(|&c| {
            idx.iter().any(|&j| {
                states[j].committed != Some(c)
                    && (states[j].open == Some(c) || states[j].rolled_back == Some(c))
            })
        })
        .collect();
    newest.sort_unstable();
    newest.dedup();
    let images = || {
        idx.iter()
            .map(|&i| (i, states[i].committed))
            .collect::<Vec<_>>()
    };
    match newest[..] {
        [] => {
            let first = idx.first().map(|&i| states[i].committed);
            if idx.iter().any(|&i| Some(states[i].committed) != first) {
                return Err(Unsettled::Mixed { images: images() });
            }
            Ok(Settle {
                forward: None,
                back: idx
                    .iter()
                    .copied()
                    .filter(|&i| states[i].open.is_some())
                    .collect(),
            })
        }
        [n] => {
            let (mut forward, mut back, mut lost, mut committed) = (vec![], vec![], vec![], vec![]);
            for &i in &idx {
                let s = &states[i];
                if s.committed == Some(n) {
                    committed.push(i);
                    if s.open.is_some() {
                        back.push(i);
                    }
                } else if s.open == Some(n) && s.prepared == Some(n) {
                    forward.push(i);
                } else {
                    lost.push((i, shown_state(s)));
                }
            }
            if !lost.is_empty() {
                return Err(Unsettled::Lost {
                    cycle: n,
                    committed,
                    lost,
                });
            }
            Ok(Settle {
                forward: (!forward.is_empty()).then_some((n, forward)),
                back,
            })
        }
        _ => Err(Unsettled::Mixed { images: images() }),
    }
}

impl Unsettled {
    /// One line for people, `name(i)` naming member `i`.
    pub fn shown(&self, name: impl Fn(usize) -> String) -> String {
        match self {
            Unsettled::Lost {
                cycle,
                committed,
                lost,
            } => format!(
                "cycle {cycle} was committed on {} but {} neither prepared nor committed it: \
                 the members cannot be brought to one image (every member prepares before \
                 any commits, so this should not happen: an agent of another version, or a \
                 damaged undo log); no whole image is here to promote. If the source site \
                 is alive, sync it again (its next cycle commits a whole image on every \
                 member)",
                committed
                    .iter()
                    .map(|&i| name(i))
                    .collect::<Vec<_>>()
                    .join(", "),
                lost.iter()
                    .map(|(i, s)| format!("{} ({s})", name(*i)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Unsettled::Mixed { images } => format!(
                "the members hold different images and no open cycle joins them ({}): no \
                 whole image is here to promote. If the source site is alive, sync it again",
                images
                    .iter()
                    .map(|(i, c)| format!(
                        "{}: {}",
                        name(*i),
                        c.map_or("none".to_string(), |c| format!("cycle {c}"))
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Which members must commit which cycle before a new one opens: those where cycle `c`
/// is prepared while another member committed `c` ([`settle`]'s roll forward). Members
/// that cannot be settled are left as they are (the open then continues or rolls back
/// their cycle, and the rolled-back mark makes the next cycle send every unit).
pub fn roll_forward(states: &[CycleAnswer]) -> Vec<(usize, u64)> {
    match settle(states) {
        Ok(Settle {
            forward: Some((c, members)),
            ..
        }) => members.into_iter().map(|i| (i, c)).collect(),
        Ok(_) => Vec::new(),
        Err(u) => {
            tracing::warn!(
                "the far site's members are at different images: {}",
                u.shown(|i| format!("member {i}"))
            );
            Vec::new()
        }
    }
}

/// What the far site holds, from its members' states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FarImage {
    /// Every member holds cycle `cycle`'s image, cut at `cut_ms`.
    Whole { cycle: u64, cut_ms: u64 },
    /// A cycle is open on some member (a sync runs, or was cut off and is not rolled back
    /// yet): the last committed image comes back by roll back.
    Open,
    /// The members committed different cycles (a commit that reached some of them, and a
    /// restart that rolled the others back): no whole image until the next commit.
    Mixed,
    /// Nothing committed yet, or a member keeps no undo log.
    Unknown,
}

pub fn far_image(states: &[CycleAnswer]) -> FarImage {
    if states.is_empty() || states.iter().any(|s| !s.undo) {
        return FarImage::Unknown;
    }
    if states.iter().any(|s| s.open.is_some()) {
        return FarImage::Open;
    }
    let first = states[0].committed;
    if states.iter().any(|s| s.committed != first) {
        return FarImage::Mixed;
    }
    match first {
        None => FarImage::Unknown,
        Some(cycle) => FarImage::Whole {
            cycle,
            cut_ms: states
                .iter()
                .filter_map(|s| s.committed_cut_ms)
                .min()
                .unwrap_or(0),
        },
    }
}

/// A destination member: its agent and its LUN there.
#[derive(Clone, Debug)]
pub struct FarMember {
    pub agent: Client,
    pub iqn: String,
    pub lun: u16,
}

/// A cycle opened at the far site (or not kept whole: a member keeps no undo log).
#[derive(Clone, Debug)]
pub struct Opened {
    pub members: Vec<FarMember>,
    /// The cycle asked for (the cut's id).
    pub cycle: u64,
    /// The cycle open on each member: the one asked for, or one cut off that goes on.
    pub ids: Vec<u64>,
    /// A member rolled a cycle back since its last commit: send every unit.
    pub full: bool,
    pub cut_ms: u64,
    /// Whether every member keeps the copy whole (an undo log).
    pub whole: bool,
    /// What the far site held before (the cycle rolled forward or back included).
    pub before: FarImage,
}

async fn ask(
    members: &[FarMember],
    which: &[usize],
    what: &str,
    // By member index.
    cycles: &[u64],
    cut_ms: u64,
    epoch: u64,
) -> Vec<(usize, anyhow::Result<CycleAnswer>)> {
    let mut set = tokio::task::JoinSet::new();
    for &i in which {
        let m = members[i].clone();
        let req = CycleRequest {
            iqn: m.iqn.clone(),
            lun: m.lun,
            cycle: cycles.get(i).copied().unwrap_or(0),
            cut_ms,
            epoch,
        };
        let path = format!("/v1/cycle/{what}");
        set.spawn(async move { (i, m.agent.call::<CycleAnswer>("POST", &path, &req).await) });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(r) => out.push(r),
            Err(e) => out.push((usize::MAX, Err(e.into()))),
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out
}

/// Asks `POST /v1/cycle/WHAT` of the members `which` (indices into `members`), each of
/// cycle `cycles[i]` (0 when `cycles` is shorter); the answers by member index.
pub async fn ask_members(
    members: &[FarMember],
    which: &[usize],
    what: &str,
    cycles: &[u64],
) -> Vec<(usize, anyhow::Result<CycleAnswer>)> {
    ask(members, which, what, cycles, 0, 0).await
}

/// Every member's state.
pub async fn states(members: &[FarMember]) -> anyhow::Result<Vec<CycleAnswer>> {
    let all: Vec<usize> = (0..members.len()).collect();
    let mut out = Vec::new();
    for (i, r) in ask(members, &all, "state", &[], 0, 0).await {
        let m = members.get(i).map_or("?", |m| m.agent.addr.as_str());
        match r {
            Ok(a) => out.push(a),
            // An agent from before cycles: it keeps nothing whole.
            Err(e) if format!("{e:#}").contains("no such request") => {
                tracing::warn!(
                    "destination {m}: its agent knows no cycles; the copy is not kept whole"
                );
                out.push(CycleAnswer::default())
            }
            Err(e) => return Err(e.context(format!("destination {m}: cycle state"))),
        }
    }
    Ok(out)
}

/// Commits, on the members where it is still open, a cycle another member committed
/// (states `found`, as [`states`] gave them; [`roll_forward`] decides): the next sync's
/// open does it, and so does a promote (`crate::failover::promote`), which would
/// otherwise roll it back there and leave members of two different images. Returns how
/// many members it committed.
pub async fn commit_where_open(
    members: &[FarMember],
    found: &[CycleAnswer],
) -> anyhow::Result<usize> {
    let todo = roll_forward(found);
    for &(i, c) in &todo {
        tracing::warn!(
            "cycle {c} was committed on part of the far site; committing it on {} too",
            members[i].agent.addr
        );
        for (_, r) in ask(members, &[i], "commit", &vec![c; members.len()], 0, 0).await {
            r.with_context(|| format!("rolling cycle {c} forward on {}", members[i].agent.addr))?;
        }
    }
    Ok(todo.len())
}

/// Opens cycle `cycle` (cut at `cut_ms`) on every destination member, after rolling
/// forward a commit that reached only some of them; `epoch` is the one the transfer
/// gives both sides, which a member promoted since refuses (the request is then a late
/// one of a lost site's coordinator). A member without an undo log makes the copy not
/// whole (said once in the log), and nothing is opened.
///
/// The members' states are read already (`found`, by [`states`]): the coordinator reads
/// them beside the roles, before the cut, so that the open after the cut is one request
/// and not three. A state read a moment early weakens nothing: the open itself refuses a
/// request from before a promote (`epoch`), a roll forward commits only a cycle prepared
/// where it is not committed (and committed elsewhere), and the open continues or rolls
/// back whatever cycle it finds open.
pub async fn open_with(
    members: Vec<FarMember>,
    found: Vec<CycleAnswer>,
    cycle: u64,
    cut_ms: u64,
    epoch: u64,
) -> anyhow::Result<Opened> {
    anyhow::ensure!(
        found.len() == members.len(),
        "{} cycle state(s) for {} far member(s)",
        found.len(),
        members.len()
    );
    // Read again only when a roll forward changed them.
    let before = match commit_where_open(&members, &found).await? {
        0 => far_image(&found),
        _ => far_image(&states(&members).await?),
    };
    let all: Vec<usize> = (0..members.len()).collect();
    let mut ids = vec![cycle; members.len()];
    let mut full = false;
    for (i, r) in ask(
        &members,
        &all,
        "open",
        &vec![cycle; members.len()],
        cut_ms,
        epoch,
    )
    .await
    {
        let a = r.with_context(|| format!("opening cycle {cycle} on the far site"))?;
        let id = a.open.unwrap_or(cycle);
        if id != cycle {
            tracing::info!(
                "{}: cycle {id}, cut off, goes on with the image of cycle {cycle}",
                members[i].agent.addr
            );
        }
        if let Some(r) = a.rolled_back {
            tracing::warn!(
                "{}: cycle {r} was rolled back since the last commit: a sync sends every unit \
                 again, a resync the units it restored (in the destination's change map)",
                members[i].agent.addr
            );
            full = true;
        }
        if let Some(slot) = ids.get_mut(i) {
            *slot = id;
        }
    }
    Ok(Opened {
        members,
        cycle,
        ids,
        full,
        cut_ms,
        whole: true,
        before,
    })
}

/// The streams log in as writers of cycle `cycle` ([`Opened::tag_writers`]), when the
/// far site keeps its copy `whole` (every member an undo log); else with the writer's
/// name alone.
pub fn tag_writers(streams: &mut [crate::coord::Stream], cycle: u64, whole: bool) {
    if !whole {
        return;
    }
    for s in streams {
        if let Some(w) = &s.writer {
            s.writer = Some(backstore::role::cycle_writer(w, cycle));
        }
    }
}

impl Opened {
    /// The streams log in as writers of this cycle (`backstore::role::cycle_writer`): the
    /// far members admit their writes only while it is open there. A copy not kept whole
    /// opened no cycle, and its streams use the writer's name alone.
    pub fn tag_writers(&self, streams: &mut [crate::coord::Stream]) {
        tag_writers(streams, self.cycle, self.whole);
    }

    /// Asks `what` (`prepare` or `commit`) of every member; a member that fails is asked
    /// again (three times, a second apart). Returns the members that still failed, and
    /// the last error. `one_by_one`: each member's answer before the next is asked, and
    /// `after(done)` called after each success (the fault point).
    async fn each(
        &self,
        what: &str,
        one_by_one: bool,
        mut after: impl FnMut(usize),
    ) -> (Vec<usize>, Option<anyhow::Error>) {
        let mut left: Vec<usize> = (0..self.members.len()).collect();
        let mut last = None;
        let mut done = 0;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let mut failed = Vec::new();
            let batches: Vec<Vec<usize>> = if one_by_one {
                left.iter().map(|&i| vec![i]).collect()
            } else {
                vec![left.clone()]
            };
            for batch in batches {
                for (i, r) in ask(&self.members, &batch, what, &self.ids, 0, 0).await {
                    match r {
                        Ok(_) => {
                            done += 1;
                            after(done);
                        }
                        Err(e) => {
                            tracing::warn!("{what} of cycle {} on member {i}: {e:#}", self.cycle);
                            failed.push(i);
                            last = Some(e);
                        }
                    }
                }
            }
            left = failed;
            if left.is_empty() {
                break;
            }
        }
        (left, last)
    }

    /// Commits the cycle on every member, in two phases: prepared on every member first
    /// (each whole and durable, its streams shut out), then committed on each. A member
    /// that fails is asked again (three times, a second apart). A prepare that fails
    /// leaves nothing committed (the next open continues the cycle); a commit that fails
    /// on some members leaves them prepared, and the next open, or a promote, rolls the
    /// cycle forward there. Returns how long the prepare took, and the commit.
    pub async fn commit(&self) -> anyhow::Result<(Duration, Duration)> {
        if !self.whole {
            return Ok((Duration::ZERO, Duration::ZERO));
        }
        let t = std::time::Instant::now();
        let (left, last) = self.each("prepare", false, |_| {}).await;
        let prepared = t.elapsed();
        if !left.is_empty() {
            let e = last.map(|e| format!("{e:#}")).unwrap_or_default();
            bail!(
                "cycle {} prepared on {} of {} destination member(s) ({e}); committed on none, \
                 the next cycle goes on with it",
                self.cycle,
                self.members.len() - left.len(),
                self.members.len()
            );
        }
        // For tests only (module documentation): exit after the K-th commit.
        let exit_after: Option<usize> = std::env::var("RSV_SYNC_FAULT_EXIT_AFTER_COMMITS")
            .ok()
            .and_then(|v| v.parse().ok());
        let (left, last) = self
            .each("commit", exit_after.is_some(), |done| {
                if exit_after == Some(done) {
                    tracing::error!(
                        "RSV_SYNC_FAULT_EXIT_AFTER_COMMITS={done}: exiting after {done} commit(s)"
                    );
                    std::process::exit(86);
                }
            })
            .await;
        if left.is_empty() {
            return Ok((prepared, t.elapsed() - prepared));
        }
        let e = last.map(|e| format!("{e:#}")).unwrap_or_default();
        bail!(
            "cycle {} committed on {} of {} destination member(s) ({e}); the others hold it \
             prepared, and the next cycle (or a promote) commits it there",
            self.cycle,
            self.members.len() - left.len(),
            self.members.len()
        )
    }

    /// Rolls the cycle back on every member (a cycle abandoned cleanly: no stream writes
    /// any more). Failures are logged: the next open, or the far target's start, does it.
    pub async fn roll_back(&self) {
        if !self.whole {
            return;
        }
        let all: Vec<usize> = (0..self.members.len()).collect();
        for (i, r) in ask(&self.members, &all, "rollback", &[], 0, 0).await {
            if let Err(e) = r {
                tracing::warn!("rolling cycle {} back on member {i}: {e:#}", self.cycle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(open: Option<u64>, committed: Option<u64>, cut: u64) -> CycleAnswer {
        CycleAnswer {
            undo: true,
            open,
            committed,
            committed_cut_ms: committed.map(|_| cut),
            ..Default::default()
        }
    }

    /// Open and prepared.
    fn prep(c: u64, committed: Option<u64>) -> CycleAnswer {
        CycleAnswer {
            prepared: Some(c),
            ..st(Some(c), committed, 30)
        }
    }

    fn rolled(r: u64, committed: Option<u64>) -> CycleAnswer {
        CycleAnswer {
            rolled_back: Some(r),
            ..st(None, committed, 30)
        }
    }

    fn forward(c: u64, m: &[usize]) -> Settle {
        Settle {
            forward: Some((c, m.to_vec())),
            back: vec![],
        }
    }

    fn back(m: &[usize]) -> Settle {
        Settle {
            forward: None,
            back: m.to_vec(),
        }
    }

    #[test]
    fn settle_every_combination_of_two_members() {
        // Each member: committed 3 (the image before), open 5 not prepared, open 5
        // prepared, committed 5, rolled 5 back; and the decision for each pair.
        let states = [
            ("at 3", st(None, Some(3), 30)),
            ("open", st(Some(5), Some(3), 30)),
            ("prepared", prep(5, Some(3))),
            ("committed", st(None, Some(5), 50)),
            ("rolled back", rolled(5, Some(3))),
        ];
        type Want = Result<Settle, &'static str>;
        let want = |a: &str, b: &str| -> Want {
            match (a, b) {
                ("at 3", "at 3") => Ok(Settle::default()),
                ("at 3" | "rolled back", "open" | "prepared") => Ok(back(&[1])),
                ("open" | "prepared", "at 3" | "rolled back") => Ok(back(&[0])),
                ("open" | "prepared", "open" | "prepared") => Ok(back(&[0, 1])),
                ("at 3" | "rolled back", "at 3" | "rolled back") => Ok(Settle::default()),
                ("committed", "committed") => Ok(Settle::default()),
                // A commit that reached one member: the other must be prepared.
                ("committed", "prepared") => Ok(forward(5, &[1])),
                ("prepared", "committed") => Ok(forward(5, &[0])),
                ("committed", "open" | "rolled back") | ("open" | "rolled back", "committed") => {
                    Err("lost")
                }
                // Committed 5 beside a member at 3 that never saw 5: nothing joins them.
                ("committed", "at 3") | ("at 3", "committed") => Err("mixed"),
                _ => unreachable!("{a} {b}"),
            }
        };
        for (an, a) in &states {
            for (bn, b) in &states {
                let got = settle(&[a.clone(), b.clone()]);
                match (want(an, bn), &got) {
                    (Ok(w), Ok(g)) => assert_eq!(g, &w, "{an} + {bn}"),
                    (Err("lost"), Err(Unsettled::Lost { cycle: 5, .. })) => {}
                    (Err("mixed"), Err(Unsettled::Mixed { .. })) => {}
                    (w, g) => panic!("{an} + {bn}: wanted {w:?}, got {g:?}"),
                }
            }
        }
    }

    #[test]
    fn settle_names_the_members_that_lost_the_cycle() {
        let s = [
            st(None, Some(5), 50),
            prep(5, Some(3)),
            st(Some(5), Some(3), 30),
            rolled(5, Some(3)),
        ];
        let e = settle(&s).unwrap_err();
        assert_eq!(
            e,
            Unsettled::Lost {
                cycle: 5,
                committed: vec![0],
                lost: vec![
                    (2, "holds cycle 3, cycle 5 open and not prepared".into()),
                    (3, "holds cycle 3, cycle 5 rolled back".into())
                ],
            }
        );
        let line = e.shown(|i| format!("ds{i}"));
        assert!(
            line.contains("cycle 5 was committed on ds0 but ds2"),
            "{line}"
        );
        assert!(
            line.contains("ds3 (holds cycle 3, cycle 5 rolled back)"),
            "{line}"
        );
        assert!(!line.contains("ds1"), "the prepared member is fine: {line}");
    }

    #[test]
    fn settle_more_cases() {
        // Three members, one committed, two prepared; and a member that committed 5 and
        // opened the next cycle 7 (rolled back: no one committed 7).
        assert_eq!(
            settle(&[st(None, Some(5), 50), prep(5, Some(3)), prep(5, Some(3))]),
            Ok(forward(5, &[1, 2]))
        );
        assert_eq!(
            settle(&[st(Some(7), Some(5), 50), prep(5, Some(3))]),
            Ok(Settle {
                forward: Some((5, vec![1])),
                back: vec![0]
            })
        );
        // The first cycle ever: nothing committed before it.
        assert_eq!(
            settle(&[st(None, Some(5), 50), prep(5, None)]),
            Ok(forward(5, &[1]))
        );
        assert_eq!(settle(&[prep(5, None), prep(5, None)]), Ok(back(&[0, 1])));
        // A member that keeps no undo log has no cycles: passed over.
        let none = CycleAnswer::default();
        assert_eq!(
            settle(&[none.clone(), st(None, Some(5), 50), prep(5, Some(3))]),
            Ok(forward(5, &[2]))
        );
        assert_eq!(settle(&[]), Ok(Settle::default()));
        assert_eq!(settle(&[none]), Ok(Settle::default()));
        // Two different newest commits: nothing decides.
        assert!(matches!(
            settle(&[
                st(None, Some(5), 50),
                st(Some(5), Some(6), 60),
                st(Some(6), Some(5), 50)
            ]),
            Err(Unsettled::Mixed { .. })
        ));
    }

    #[test]
    fn a_commit_that_reached_one_member_rolls_forward_on_the_others() {
        // Member 0 committed 5; 1 and 2 still have 5 open and prepared: they commit it.
        let s = [st(None, Some(5), 50), prep(5, Some(3)), prep(5, Some(3))];
        assert_eq!(roll_forward(&s), vec![(1, 5), (2, 5)]);
        // Open but not prepared: not rolled forward.
        let s = [st(None, Some(5), 50), st(Some(5), Some(3), 30)];
        assert!(roll_forward(&s).is_empty());
        let s = [st(None, Some(5), 50), prep(5, Some(3)), prep(5, Some(3))];
        assert_eq!(far_image(&s), FarImage::Open);
        // No member committed 5: nothing rolls forward (the open rolls it back).
        let s = [st(Some(5), Some(3), 30), st(Some(5), Some(3), 30)];
        assert!(roll_forward(&s).is_empty());
        // After the roll back of a restart, the members differ.
        let s = [st(None, Some(5), 50), st(None, Some(3), 30)];
        assert!(roll_forward(&s).is_empty());
        assert_eq!(far_image(&s), FarImage::Mixed);
    }

    #[test]
    fn the_far_image_is_whole_only_when_every_member_agrees() {
        let s = [st(None, Some(7), 70), st(None, Some(7), 69)];
        assert_eq!(
            far_image(&s),
            FarImage::Whole {
                cycle: 7,
                cut_ms: 69
            }
        );
        assert_eq!(far_image(&[st(None, None, 0)]), FarImage::Unknown);
        let mut no_undo = st(None, Some(7), 70);
        no_undo.undo = false;
        assert_eq!(
            far_image(&[st(None, Some(7), 70), no_undo]),
            FarImage::Unknown
        );
        assert_eq!(far_image(&[]), FarImage::Unknown);
    }
}
