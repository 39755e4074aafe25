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
//! # A commit that reaches some members and not others
//! A commit is sent only once every member's stream is verified, so the cycle's data is
//! whole on every member before any commits: a member that committed proves the cycle
//! complete. The next open therefore first asks every member's state, and commits the
//! cycle on the members where it is still open when another member committed it (roll
//! forward, [`roll_forward`]); only then does it open the new cycle (which rolls back
//! what is still open: a cycle no member committed). A far target restarted between the
//! two steps has rolled its member back already: the members then hold different cycles
//! ([`far_image`] says no whole image) until the next cycle commits, which sends the
//! units again (the source released no epoch, since the commit did not complete).
//!
//! The decisions ([`roll_forward`], [`far_image`]) are sans-IO; the requests are below.

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
    if matches!(what, "open" | "commit") && req.cycle == 0 {
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

/// Which members must commit which cycle before a new one opens: those where cycle `c`
/// is open while another member committed `c` (it was verified whole everywhere before
/// any commit went out).
pub fn roll_forward(states: &[CycleAnswer]) -> Vec<(usize, u64)> {
    states
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let c = s.open?;
            states
                .iter()
                .any(|o| o.committed == Some(c))
                .then_some((i, c))
        })
        .collect()
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
) -> Vec<(usize, anyhow::Result<CycleAnswer>)> {
    let mut set = tokio::task::JoinSet::new();
    for &i in which {
        let m = members[i].clone();
        let req = CycleRequest {
            iqn: m.iqn.clone(),
            lun: m.lun,
            cycle: cycles.get(i).copied().unwrap_or(0),
            cut_ms,
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

/// Every member's state.
pub async fn states(members: &[FarMember]) -> anyhow::Result<Vec<CycleAnswer>> {
    let all: Vec<usize> = (0..members.len()).collect();
    let mut out = Vec::new();
    for (i, r) in ask(members, &all, "state", &[], 0).await {
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

/// Opens cycle `cycle` (cut at `cut_ms`) on every destination member, after rolling
/// forward a commit that reached only some of them. A member without an undo log makes
/// the copy not whole (said once in the log), and nothing is opened.
pub async fn open(members: Vec<FarMember>, cycle: u64, cut_ms: u64) -> anyhow::Result<Opened> {
    let found = states(&members).await?;
    if let Some(i) = found.iter().position(|s| !s.undo) {
        tracing::warn!(
            "destination member {} (LUN {} of {}) keeps no undo log: a sync cut off leaves the far copy holding no single image",
            members[i].agent.addr,
            members[i].lun,
            members[i].iqn
        );
        return Ok(Opened {
            ids: vec![cycle; members.len()],
            members,
            cycle,
            full: false,
            cut_ms,
            whole: false,
            before: FarImage::Unknown,
        });
    }
    for (i, c) in roll_forward(&found) {
        tracing::warn!(
            "cycle {c} was committed on part of the far site; committing it on {} too",
            members[i].agent.addr
        );
        for (_, r) in ask(&members, &[i], "commit", &vec![c; members.len()], 0).await {
            r.with_context(|| format!("rolling cycle {c} forward on {}", members[i].agent.addr))?;
        }
    }
    let before = far_image(&states(&members).await?);
    let all: Vec<usize> = (0..members.len()).collect();
    let mut ids = vec![cycle; members.len()];
    let mut full = false;
    for (i, r) in ask(&members, &all, "open", &vec![cycle; members.len()], cut_ms).await {
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
                "{}: cycle {r} was rolled back since the last commit; every unit is sent again",
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

impl Opened {
    /// The streams log in as writers of this cycle (`backstore::role::cycle_writer`): the
    /// far members admit their writes only while it is open there. A copy not kept whole
    /// opened no cycle, and its streams use the writer's name alone.
    pub fn tag_writers(&self, streams: &mut [crate::coord::Stream]) {
        if !self.whole {
            return;
        }
        for s in streams {
            if let Some(w) = &s.writer {
                s.writer = Some(backstore::role::cycle_writer(w, self.cycle));
            }
        }
    }

    /// Commits the cycle on every member; a member that fails is asked again (three
    /// times, a second apart). Fails when some member still has not committed: the
    /// next open rolls it forward if another did.
    pub async fn commit(&self) -> anyhow::Result<()> {
        if !self.whole {
            return Ok(());
        }
        let mut left: Vec<usize> = (0..self.members.len()).collect();
        let mut last = None;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let mut failed = Vec::new();
            for (i, r) in ask(&self.members, &left, "commit", &self.ids, 0).await {
                if let Err(e) = r {
                    tracing::warn!("committing cycle {} on member {i}: {e:#}", self.cycle);
                    failed.push(i);
                    last = Some(e);
                }
            }
            left = failed;
            if left.is_empty() {
                return Ok(());
            }
        }
        let e = last.map(|e| format!("{e:#}")).unwrap_or_default();
        bail!(
            "cycle {} committed on {} of {} destination member(s) ({e}); the next cycle \
             commits it on the others",
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
        for (i, r) in ask(&self.members, &all, "rollback", &[], 0).await {
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

    #[test]
    fn a_commit_that_reached_one_member_rolls_forward_on_the_others() {
        // Member 0 committed 5; 1 and 2 still have 5 open: they commit it.
        let s = [
            st(None, Some(5), 50),
            st(Some(5), Some(3), 30),
            st(Some(5), Some(3), 30),
        ];
        assert_eq!(roll_forward(&s), vec![(1, 5), (2, 5)]);
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
