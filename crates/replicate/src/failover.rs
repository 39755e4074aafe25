//! Failover and failback, the I/O around [`crate::role`]'s rules: the agent's part (each
//! LUN's role record, its fence, its change map read for a failback) and the
//! coordinator's (`rsv sync promote|demote|status|resync`, and the check every sync makes
//! before any data moves).
//!
//! Control requests, signed as every other (`docs/replicate.md`):
//!
//! | request | body | answer |
//! |---|---|---|
//! | `POST /v1/role` | `{iqn, lun}` | [`RoleState`] |
//! | `POST /v1/role/promote` | `{iqn, lun, force}` | [`RoleState`]; 409 with the refusal |
//! | `POST /v1/role/demote` | `{iqn, lun, writer}` | [`RoleState`] |
//! | `POST /v1/role/synced` | `{iqn, lun, record, forget_changes}` | [`RoleState`] |
//! | `POST /v1/changes` | `{iqn, lun}` | `{unit, units}`: the change map's units, unfrozen |

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::agent::{Agent, LocalLun};
use crate::api;
use crate::auth::Key;
use crate::coord::{Stream, VolumeRef};
use crate::role::{self, ImageMark, Role, RoleRecord, Transfer, VolumeRole};
use crate::wire::Client;

/// Where a LUN's role lives and how it reaches the logical unit.
#[derive(Clone)]
pub struct RolePoint {
    /// The `.role` record beside the LUN's data.
    pub file: PathBuf,
    /// Puts a fence in force on the logical unit (`None`: every initiator writes).
    pub fence: Arc<dyn Fn(Option<Vec<String>>) + Send + Sync>,
    /// Sessions of the fence's writers that wrote and are still logged in.
    pub writing: Arc<dyn Fn() -> usize + Send + Sync>,
    /// Sets the cycle the fence admits streams of ([`crate::cycle`]), returning once the
    /// writes it admitted before are made (blocking: call it off the runtime's threads).
    pub cycle: crate::cycle::CycleFence,
}

/// A LUN named in a request.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LunAsk {
    pub iqn: String,
    pub lun: u16,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PromoteAsk {
    pub iqn: String,
    pub lun: u16,
    #[serde(default)]
    pub force: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DemoteAsk {
    pub iqn: String,
    pub lun: u16,
    /// The initiator name the replica's streams will log in with.
    pub writer: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SyncedAsk {
    pub iqn: String,
    pub lun: u16,
    pub record: RoleRecord,
    /// The LUN now equals the image (a replica): its change map starts over from it.
    #[serde(default)]
    pub forget_changes: bool,
}

/// A LUN's role as its agent keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RoleState {
    pub iqn: String,
    pub lun: u16,
    /// Its record (`None`: never replicated).
    pub record: Option<RoleRecord>,
    pub tracking: Option<api::Tracking>,
    /// What is writing it as a replica now ([`open_cycle`]).
    pub busy: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Changes {
    pub unit: u64,
    pub units: Vec<(u64, u64)>,
}

type Answer = (u16, Vec<u8>);

fn answer<T: Serialize>(v: &T) -> Answer {
    (200, serde_json::to_vec(v).unwrap_or_default())
}

fn refuse(status: u16, message: impl std::fmt::Display) -> Answer {
    (status, crate::wire::error_body(&message.to_string()))
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Answer> {
    serde_json::from_slice(body).map_err(|e| refuse(400, format!("bad request body: {e}")))
}

/// Role changes on this agent, one at a time (a record is read, decided on and written).
static ROLES: Mutex<()> = Mutex::new(());

/// The one place a promote asks whether the LUN is in the middle of receiving an image:
/// today, whether a replication stream is writing it (a session of its writers that
/// wrote and is still logged in). A far-site cycle with an undo log answers here too
/// once it exists (an open cycle: promote then rolls it back to the last complete
/// image instead of refusing).
pub fn open_cycle(lun: &LocalLun) -> Option<String> {
    // A cycle open in the undo log: the far copy is between two images until it commits.
    if let Some(u) = &lun.undo {
        let st = u.state();
        if let Some(id) = st.open {
            return Some(if st.prepared == Some(id) {
                format!("cycle {id} is open here, prepared (whole here, not committed)")
            } else {
                format!("cycle {id} is open here (a sync's next image, not committed)")
            });
        }
    }
    let point = lun.role.as_ref()?;
    match (point.writing)() {
        0 => None,
        n => Some(format!(
            "a sync is writing it ({n} replication session(s) logged in)"
        )),
    }
}

fn point(lun: &LocalLun) -> Result<&RolePoint, Answer> {
    lun.role.as_ref().ok_or_else(|| {
        refuse(
            409,
            format!(
                "LUN {} of {}: its store has no place beside its data for a role record",
                lun.lun, lun.iqn
            ),
        )
    })
}

fn load(p: &RolePoint) -> Result<Option<RoleRecord>, Answer> {
    RoleRecord::load(&p.file).map_err(|e| refuse(500, e))
}

fn state(lun: &LocalLun, record: Option<RoleRecord>) -> RoleState {
    RoleState {
        iqn: lun.iqn.clone(),
        lun: lun.lun,
        record,
        tracking: lun.changes.as_ref().map(|c| api::Tracking {
            unit: c.unit(),
            dirty_bytes: c.dirty_bytes(),
        }),
        busy: open_cycle(lun),
    }
}

fn put(p: &RolePoint, r: &RoleRecord) -> Result<(), Answer> {
    r.store(&p.file).map_err(|e| refuse(500, e))?;
    (p.fence)(r.fence());
    Ok(())
}

/// 409 for a request of a transfer at `epoch` (`what`) that `role::late_refusal` refuses
/// on a LUN whose record is `old`.
fn refuse_late(
    lun: &LocalLun,
    old: Option<&RoleRecord>,
    epoch: u64,
    what: &str,
) -> Result<(), Answer> {
    let name = format!("LUN {} of {}", lun.lun, lun.iqn);
    match role::late_refusal(old, epoch, what, &name) {
        Some(why) => {
            tracing::warn!("{why}");
            Err(refuse(409, why))
        }
        None => Ok(()),
    }
}

/// Refuses (409) a cycle's open at `epoch` on a LUN promoted since (`role::late_refusal`).
pub(crate) fn refuse_late_open(lun: &LocalLun, epoch: u64) -> Result<(), Answer> {
    let Some(p) = &lun.role else {
        return Ok(());
    };
    let _one = ROLES.lock().unwrap_or_else(|e| e.into_inner());
    refuse_late(lun, load(p)?.as_ref(), epoch, "a cycle's open")
}

/// Answers the failover requests of [`Agent::handle`]; `None` for any other path.
pub(crate) async fn serve(
    agent: &Arc<Agent>,
    method: &str,
    parts: &[&str],
    body: &[u8],
) -> Option<Answer> {
    let r = match (method, parts) {
        ("POST", ["v1", "role"]) => (|| {
            let ask: LunAsk = parse(body)?;
            let lun = agent.find(&ask.iqn, ask.lun)?;
            let record = match &lun.role {
                Some(p) => load(p)?,
                None => None,
            };
            Ok(answer(&state(&lun, record)))
        })(),
        ("POST", ["v1", "role", "promote"]) => (|| {
            let ask: PromoteAsk = parse(body)?;
            let lun = agent.find(&ask.iqn, ask.lun)?;
            let p = point(&lun)?;
            let _one = ROLES.lock().unwrap_or_else(|e| e.into_inner());
            let old = load(p)?;
            let busy = open_cycle(&lun);
            let name = format!("LUN {} of {}", lun.lun, lun.iqn);
            let new = role::promote(old.as_ref(), busy.as_deref(), ask.force, &name)
                .map_err(|e| refuse(409, e))?;
            if old.as_ref() != Some(&new) {
                if let (Some(what), true) = (&busy, ask.force) {
                    tracing::warn!(
                        "{name}: promoted with --force, abandoning what was writing it: {what}"
                    );
                }
                // The copy promoted is the last complete image: an open cycle's changes
                // are undone first, once no stream of it may write any more.
                if let Some(u) = &lun.undo {
                    if let Err(e) = (p.cycle)(None) {
                        tracing::warn!("{name}: closing the fence's cycle: {e}");
                    }
                    if let Some(id) = u.roll_back().map_err(|e| {
                        refuse(500, format!("{name}: rolling back the open cycle: {e}"))
                    })? {
                        tracing::warn!("{name}: cycle {id} rolled back before the promotion");
                    }
                }
                put(p, &new)?;
                tracing::info!("{name}: promoted to primary at epoch {}", new.epoch);
            }
            Ok(answer(&state(&lun, Some(new))))
        })(),
        ("POST", ["v1", "role", "demote"]) => {
            let ask: DemoteAsk = match parse(body) {
                Ok(a) => a,
                Err(e) => return Some(e),
            };
            let lun = match agent.find(&ask.iqn, ask.lun) {
                Ok(l) => l,
                Err(e) => return Some(e),
            };
            // A replica is no sync's source: a send of it still running stops.
            if let Err(e) = agent.stop_sends_of(&ask.iqn, ask.lun).await {
                return Some(e);
            }
            (|| {
                let p = point(&lun)?;
                let _one = ROLES.lock().unwrap_or_else(|e| e.into_inner());
                let old = load(p)?;
                let name = format!("LUN {} of {}", lun.lun, lun.iqn);
                let new =
                    role::demote(old.as_ref(), &ask.writer, &name).map_err(|e| refuse(409, e))?;
                if old.as_ref() != Some(&new) {
                    put(p, &new)?;
                    tracing::info!("{name}: demoted to replica at epoch {}", new.epoch);
                }
                Ok(answer(&state(&lun, Some(new))))
            })()
        }
        ("POST", ["v1", "role", "synced"]) => {
            let ask: SyncedAsk = match parse(body) {
                Ok(a) => a,
                Err(e) => return Some(e),
            };
            let lun = match agent.find(&ask.iqn, ask.lun) {
                Ok(l) => l,
                Err(e) => return Some(e),
            };
            // A record from before a promote (a late request of the lost site's
            // coordinator) changes nothing: neither the role nor the change map.
            let late = (|| {
                let p = point(&lun)?;
                let _one = ROLES.lock().unwrap_or_else(|e| e.into_inner());
                refuse_late(
                    &lun,
                    load(p)?.as_ref(),
                    ask.record.epoch,
                    "a completed sync's record",
                )
            })();
            if let Err(e) = late {
                return Some(e);
            }
            // The map first: a crash between leaves the old image in the record, and a
            // resync then asks for a full copy rather than trust a map that forgot.
            if let (true, Some(c)) = (ask.forget_changes, lun.changes.clone()) {
                let r = tokio::task::spawn_blocking(move || c.forget()).await;
                match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        return Some(refuse(500, format!("forgetting the change map: {e}")))
                    }
                    Err(e) => return Some(refuse(500, e)),
                }
            }
            (|| {
                let p = point(&lun)?;
                let _one = ROLES.lock().unwrap_or_else(|e| e.into_inner());
                // Again under the lock: a promote may have come since the first look.
                refuse_late(
                    &lun,
                    load(p)?.as_ref(),
                    ask.record.epoch,
                    "a completed sync's record",
                )?;
                put(p, &ask.record)?;
                Ok(answer(&state(&lun, Some(ask.record.clone()))))
            })()
        }
        ("POST", ["v1", "changes"]) => (|| {
            let ask: LunAsk = parse(body)?;
            let lun = agent.find(&ask.iqn, ask.lun)?;
            let c = lun.changes.as_ref().ok_or_else(|| {
                refuse(
                    409,
                    format!(
                        "LUN {} of {} keeps no change tracking (track = true)",
                        ask.lun, ask.iqn
                    ),
                )
            })?;
            Ok(answer(&Changes {
                unit: c.unit(),
                units: c.dirty_units(),
            }))
        })(),
        _ => return None,
    };
    Some(r.unwrap_or_else(|e| e))
}

/// Merges unit ranges into sorted, disjoint ones.
pub fn union(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = a.iter().chain(b).copied().filter(|(s, e)| s < e).collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in all {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

// ---- the coordinator's side ----

/// One LUN of a volume, at its agent.
#[derive(Clone, Debug)]
pub struct LunAt {
    pub agent: Client,
    pub iqn: String,
    pub lun: u16,
}

impl LunAt {
    fn ask(&self) -> LunAsk {
        LunAsk {
            iqn: self.iqn.clone(),
            lun: self.lun,
        }
    }

    fn shown(&self) -> String {
        format!("{}/{}/{}", self.agent.addr, self.iqn, self.lun)
    }
}

fn push_unique(out: &mut Vec<LunAt>, l: LunAt) {
    if !out
        .iter()
        .any(|o| o.agent.addr == l.agent.addr && o.iqn == l.iqn && o.lun == l.lun)
    {
        out.push(l);
    }
}

fn top(v: &VolumeRef, key: &Key) -> LunAt {
    LunAt {
        agent: Client::new(crate::coord::control_addr(v), key.clone()),
        iqn: v.iqn.clone(),
        lun: v.lun,
    }
}

/// A volume's LUNs: its own (the file server's) and its stripe members'.
pub async fn volume_luns(v: &VolumeRef, key: &Key) -> anyhow::Result<Vec<LunAt>> {
    let members = crate::coord::member_luns(v, key).await?;
    let mut out = vec![top(v, key)];
    for (agent, iqn, lun) in members {
        push_unique(&mut out, LunAt { agent, iqn, lun });
    }
    Ok(out)
}

async fn each<
    T: Serialize + Send + Sync + 'static,
    R: serde::de::DeserializeOwned + Send + 'static,
>(
    luns: &[LunAt],
    path: &'static str,
    body: impl Fn(&LunAt) -> T,
) -> Vec<anyhow::Result<R>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, l) in luns.iter().enumerate() {
        let (c, b, shown) = (l.agent.clone(), body(l), l.shown());
        set.spawn(async move {
            (
                i,
                c.call::<R>("POST", path, &b).await.with_context(|| shown),
            )
        });
    }
    let mut out: Vec<Option<anyhow::Result<R>>> = (0..luns.len()).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        match r {
            Ok((i, r)) => out[i] = Some(r),
            Err(e) => tracing::warn!("a role request's task: {e}"),
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow!("no answer"))))
        .collect()
}

/// Every LUN's role, or the first error.
async fn roles(luns: &[LunAt]) -> anyhow::Result<Vec<RoleState>> {
    each::<_, RoleState>(luns, "/v1/role", LunAt::ask)
        .await
        .into_iter()
        .collect()
}

/// What `rsv sync status|promote|demote` print.
#[derive(Clone, Debug, Serialize)]
pub struct VolumeStatus {
    pub event: &'static str,
    pub volume: String,
    /// `primary`, `replica`, `none` or `mixed`.
    pub role: String,
    pub epoch: Option<u64>,
    /// The last image both sites hold: its id (hex) and when it completed.
    pub image: Option<String>,
    pub image_unix: Option<u64>,
    /// Bytes written since that image (change tracking), all LUNs together.
    pub dirty_bytes: Option<u64>,
    /// What is writing it as a replica now, if anything.
    pub busy: Option<String>,
    /// A promote only: the cycle it committed on the members where it was prepared (a
    /// commit the coordinator did not finish: rolled forward), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_forward: Option<u64>,
    /// A promote only: the members whose open cycle it rolled back (none had committed it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rolled_back: Vec<String>,
    pub luns: Vec<RoleState>,
}

fn summary(event: &'static str, v: &VolumeRef, luns: Vec<RoleState>) -> VolumeStatus {
    let records: Vec<Option<RoleRecord>> = luns.iter().map(|l| l.record.clone()).collect();
    let vr = VolumeRole::of(&records);
    let (role, epoch, image) = match &vr {
        VolumeRole::Unset => ("none".to_string(), None, None),
        VolumeRole::Set(r) => (r.role.as_str().to_string(), Some(r.epoch), r.image),
        VolumeRole::Mixed(why) => (format!("mixed ({why})"), None, None),
    };
    VolumeStatus {
        event,
        volume: crate::coord::shown_volume(v),
        role,
        epoch,
        image: image.map(|i| format!("{:x}", i.id)),
        image_unix: image.map(|i| i.unix),
        dirty_bytes: luns
            .iter()
            .map(|l| l.tracking.as_ref().map(|t| t.dirty_bytes))
            .sum(),
        busy: luns.iter().find_map(|l| l.busy.clone()),
        rolled_forward: None,
        rolled_back: Vec::new(),
        luns,
    }
}

pub async fn status(v: &VolumeRef, key: &Key) -> anyhow::Result<VolumeStatus> {
    let luns = volume_luns(v, key).await?;
    Ok(summary("status", v, roles(&luns).await?))
}

/// The far members of a volume's cycles: its stripe members, or the LUN itself when it
/// is no stripe of remote members (as a sync's streams go).
async fn cycle_members(v: &VolumeRef, key: &Key) -> anyhow::Result<Vec<LunAt>> {
    let members = crate::coord::member_luns(v, key).await?;
    if members.is_empty() {
        return Ok(vec![top(v, key)]);
    }
    Ok(members
        .into_iter()
        .map(|(agent, iqn, lun)| LunAt { agent, iqn, lun })
        .collect())
}

/// Makes every LUN of `v` primary at a new epoch. First the far site's cycles are brought
/// to one image, from every member's cycle state ([`crate::cycle::settle`]): a cycle
/// committed on some members and prepared on the others is committed on those (rolled
/// forward: the coordinator died between the members' commits); an open cycle no member
/// committed is rolled back everywhere; members that cannot be brought to one image refuse
/// the promote, named. Anything open (or a sync writing) refuses it unless `force`, which
/// says what it will do.
pub async fn promote(v: &VolumeRef, key: &Key, force: bool) -> anyhow::Result<VolumeStatus> {
    let luns = volume_luns(v, key).await?;
    let shown_v = crate::coord::shown_volume(v);
    let far = cycle_members(v, key).await?;
    let far_members: Vec<crate::cycle::FarMember> = far
        .iter()
        .map(|l| crate::cycle::FarMember {
            agent: l.agent.clone(),
            iqn: l.iqn.clone(),
            lun: l.lun,
        })
        .collect();
    let states = crate::cycle::states(&far_members)
        .await
        .context("the far members' cycle states")?;
    let plan = crate::cycle::settle(&states)
        .map_err(|u| anyhow!("{shown_v}: {}", u.shown(|i| far[i].shown())))?;
    let action = match &plan.forward {
        Some((c, m)) => format!(
            "--force commits cycle {c} on {} (prepared there, committed on the other members)",
            m.iter()
                .map(|&i| far[i].shown())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "give --force to abandon it".to_string(),
    };
    // Refused on every LUN or none: ask first, so that a busy member does not leave the
    // others promoted.
    if !force {
        for s in roles(&luns).await? {
            if let Some(busy) = s.busy {
                bail!(
                    "{shown_v}: LUN {} of {}: {busy}; promoting now would make a half-written image primary: wait for it to end, or {action}",
                    s.lun,
                    s.iqn
                );
            }
        }
    }
    let mut rolled_forward = None;
    let mut rolled_back = Vec::new();
    if force && !plan.is_nothing() {
        if let Some((c, members)) = &plan.forward {
            let which: Vec<usize> = members.clone();
            let ids = vec![*c; far_members.len()];
            for (i, r) in crate::cycle::ask_members(&far_members, &which, "commit", &ids).await {
                r.with_context(|| {
                    format!(
                        "{shown_v}: rolling cycle {c} forward on {}",
                        far.get(i).map_or("?".into(), LunAt::shown)
                    )
                })?;
                tracing::warn!(
                    "{}: cycle {c} rolled forward (committed here, as on the other members)",
                    far[i].shown()
                );
            }
            rolled_forward = Some(*c);
        }
        for (i, r) in crate::cycle::ask_members(&far_members, &plan.back, "rollback", &[]).await {
            let name = far.get(i).map_or("?".into(), LunAt::shown);
            r.with_context(|| format!("{shown_v}: rolling the open cycle back on {name}"))?;
            rolled_back.push(name);
        }
    }
    let done = each::<_, RoleState>(&luns, "/v1/role/promote", |l| PromoteAsk {
        iqn: l.iqn.clone(),
        lun: l.lun,
        force,
    })
    .await;
    let states = done.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = summary("promoted", v, states);
    out.rolled_forward = rolled_forward;
    out.rolled_back = rolled_back;
    Ok(out)
}

/// A replica's writer name: its streams log in with it, and no application does.
pub fn new_writer() -> String {
    format!(
        "iqn.2026-01.org.reservoir:sync.{:016x}",
        rand::random::<u64>()
    )
}

/// Makes every LUN of `v` a replica, written only by the next resync's streams.
pub async fn demote(v: &VolumeRef, key: &Key) -> anyhow::Result<VolumeStatus> {
    let luns = volume_luns(v, key).await?;
    let writer = new_writer();
    let done = each::<_, RoleState>(&luns, "/v1/role/demote", |l| DemoteAsk {
        iqn: l.iqn.clone(),
        lun: l.lun,
        writer: writer.clone(),
    })
    .await;
    let states = done.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(summary("demoted", v, states))
}

/// What a transfer allowed by the roles records when it completes.
pub struct Gate {
    allowed: role::Allowed,
    src: Vec<LunAt>,
    dst: Vec<LunAt>,
    /// The source volume's record before the transfer (its image kept beside the pending
    /// one while the transfer records the new image).
    src_record: Option<RoleRecord>,
}

impl Gate {
    /// The epoch the transfer gives both sides: the far members' cycle is opened with it,
    /// and a member promoted since refuses it.
    pub fn epoch(&self) -> u64 {
        self.allowed.epoch
    }
}

/// Before any data moves: the roles of both volumes, checked by [`role::check_transfer`];
/// each stream gets its destination's writer name, and for a resync the destination's
/// own changes since the last common image (its change map, read through its agent).
pub async fn before_transfer(
    src: &VolumeRef,
    dst: &VolumeRef,
    key: &Key,
    kind: Transfer,
    streams: &mut [Stream],
) -> anyhow::Result<Gate> {
    let mut src_luns = vec![top(src, key)];
    let mut dst_luns = vec![top(dst, key)];
    for s in streams.iter() {
        push_unique(
            &mut src_luns,
            LunAt {
                agent: s.source.clone(),
                iqn: s.source_lun.iqn.clone(),
                lun: s.source_lun.lun,
            },
        );
        push_unique(
            &mut dst_luns,
            LunAt {
                agent: s.dest.clone(),
                iqn: s.dest_lun.iqn.clone(),
                lun: s.dest_lun.lun,
            },
        );
    }
    let (a, b) = tokio::join!(roles(&src_luns), roles(&dst_luns));
    let (a, b) = (
        a.context("the source's roles")?,
        b.context("the destination's roles")?,
    );
    let vr =
        |s: &[RoleState]| VolumeRole::of(&s.iter().map(|l| l.record.clone()).collect::<Vec<_>>());
    let (src_name, dst_name) = (
        crate::coord::shown_volume(src),
        crate::coord::shown_volume(dst),
    );
    let allowed =
        role::check_transfer(&vr(&a), &vr(&b), kind, &src_name, &dst_name, &new_writer())?;
    if let Some(busy) = b.iter().find_map(|l| l.busy.clone()) {
        tracing::info!("{dst_name}: {busy} (a new sync replaces it)");
    }
    let writer = allowed.writers.first().cloned();
    for s in streams.iter_mut() {
        s.writer = writer.clone();
    }
    if kind == Transfer::Resync {
        // Checked here, before any cut or cycle; read again once the cycle is open
        // ([`far_changes`]).
        far_changes(streams, &src_name, &dst_name).await?;
    }
    let src_record = match vr(&a) {
        VolumeRole::Set(r) => Some(r),
        _ => None,
    };
    Ok(Gate {
        allowed,
        src: src_luns,
        dst: dst_luns,
        src_record,
    })
}

/// A resync's destination's own changes since the last common image, per stream (its
/// change map, read through its agent), into each stream's `also`. Read once the far
/// cycle is open: a roll back there (of a cycle cut off, at the far target's start, at a
/// promote, or by the open itself) has marked the units it restored in that map by then
/// (`backstore::Undo::open_with`), and no other roll back comes until this cycle ends.
pub async fn far_changes(
    streams: &mut [Stream],
    src_name: &str,
    dst_name: &str,
) -> anyhow::Result<()> {
    for (i, s) in streams.iter_mut().enumerate() {
        let Some(t) = &s.source_lun.tracking else {
            bail!("{src_name}: stream {i}'s LUN keeps no change tracking (track = true): a resync sends what changed on both sides, and knows it only from their change maps");
        };
        let ask = LunAsk {
            iqn: s.dest_lun.iqn.clone(),
            lun: s.dest_lun.lun,
        };
        let theirs: Changes = s
            .dest
            .call("POST", "/v1/changes", &ask)
            .await
            .with_context(|| format!("{dst_name}: stream {i}'s own changes since the last common image (a resync needs its change map: track = true)"))?;
        if theirs.unit != t.unit {
            bail!(
                "stream {i}: the change maps' units differ ({} on {src_name}, {} on {dst_name}): a resync needs the same unit on both sides",
                t.unit,
                theirs.unit
            );
        }
        s.also = theirs.units;
    }
    Ok(())
}

/// After a completed, verified transfer: both sides record the image and epoch; the
/// destination's change map starts over from the image it now holds.
pub async fn after_transfer(gate: &Gate, image: u64) -> anyhow::Result<()> {
    let mark = ImageMark {
        id: image,
        unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    // The source first says which image it is about to share (`pending`), then the far
    // side records it, then the source: a failure at any point leaves the two sides at
    // the same image, or one side at an image the other has pending, which a resync
    // takes as common (`role::check_transfer`) rather than asking for a full copy.
    let pending = role::pending_transfer(gate.src_record.as_ref(), &gate.allowed, mark);
    let done = each::<_, RoleState>(&gate.src, "/v1/role/synced", |l| SyncedAsk {
        iqn: l.iqn.clone(),
        lun: l.lun,
        record: pending.clone(),
        forget_changes: false,
    })
    .await;
    for r in done {
        r.context("recording the completed sync's image as pending at the source")?;
    }
    for (luns, side) in [(&gate.dst, Role::Replica), (&gate.src, Role::Primary)] {
        let record = role::after_transfer(side, &gate.allowed, mark);
        let done = each::<_, RoleState>(luns, "/v1/role/synced", |l| SyncedAsk {
            iqn: l.iqn.clone(),
            lun: l.lun,
            record: record.clone(),
            forget_changes: side == Role::Replica,
        })
        .await;
        for r in done {
            r.context("recording the completed sync's image")?;
        }
        // For tests only: exit between the two sides' records, as a source site lost
        // then would leave them (the destination at the new image, the source with it
        // pending).
        if side == Role::Replica
            && std::env::var_os("RSV_SYNC_FAULT_EXIT_AFTER_FAR_RECORD").is_some()
        {
            tracing::error!(
                "RSV_SYNC_FAULT_EXIT_AFTER_FAR_RECORD: exiting after the far side's record"
            );
            std::process::exit(86);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A promoted LUN, then the record of the sync that was running before the promote and
    /// its next cycle's open, arriving late (a lost site's coordinator's last requests,
    /// delivered once the link came back): refused, and the LUN stays primary at its new
    /// epoch, writable by all, no cycle open. Fails (the LUN is a replica at the old epoch
    /// again; a cycle opens) when the agent takes them.
    #[tokio::test]
    async fn late_requests_do_not_undo_a_promote() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lun.role");
        let writer = "iqn.2026-01.org.reservoir:sync.1".to_string();
        let replica = |epoch, image| RoleRecord {
            role: Role::Replica,
            epoch,
            image: Some(ImageMark { id: image, unix: 0 }),
            pending: None,
            writers: vec![writer.clone()],
        };
        replica(1, 5).store(&file).unwrap();
        let fence: Arc<Mutex<Option<Option<Vec<String>>>>> = Arc::new(Mutex::new(None));
        let f = fence.clone();
        let store: Arc<dyn backstore::Backstore> = Arc::new(backstore::RamBackstore::new(1 << 20));
        let undo = Arc::new(
            backstore::Undo::open_file(store.clone(), &dir.path().join("undo"), 65536).unwrap(),
        );
        let lun = LocalLun {
            iqn: "iqn.x".into(),
            lun: 0,
            store,
            spec: "ram:?size=1MiB".into(),
            block_size: 512,
            changes: None,
            cut: None,
            role: Some(RolePoint {
                file: file.clone(),
                fence: Arc::new(move |w| *f.lock().unwrap() = Some(w)),
                writing: Arc::new(|| 0),
                cycle: Arc::new(|_| Ok(())),
            }),
            undo: Some(undo.clone()),
        };
        let agent = Arc::new(Agent::new(
            Box::new(move || vec![lun.clone()]),
            Vec::new(),
            initiator::SessionOptions::default(),
        ));
        let call =
            |path: &str, body: Vec<u8>| agent.clone().handle("POST".into(), path.into(), body);

        let (status, _) = call(
            "/v1/role/promote",
            serde_json::to_vec(&PromoteAsk {
                iqn: "iqn.x".into(),
                lun: 0,
                force: true,
            })
            .unwrap(),
        )
        .await;
        assert_eq!(status, 200);
        let late = SyncedAsk {
            iqn: "iqn.x".into(),
            lun: 0,
            record: replica(1, 6),
            forget_changes: true,
        };
        let (status, answer) = call("/v1/role/synced", serde_json::to_vec(&late).unwrap()).await;
        assert_eq!(status, 409, "{}", String::from_utf8_lossy(&answer));
        let now = RoleRecord::load(&file).unwrap().unwrap();
        assert_eq!((now.role, now.epoch), (Role::Primary, 2), "{now:?}");
        assert_eq!(*fence.lock().unwrap(), Some(None), "the fence stays open");
        // That sync's next cycle, opened late, too: it would save the promoted LUN's
        // writes for a roll back at its next start.
        let open = |epoch| {
            serde_json::to_vec(&crate::api::CycleRequest {
                iqn: "iqn.x".into(),
                lun: 0,
                cycle: 9,
                cut_ms: 1,
                epoch,
            })
            .unwrap()
        };
        let (status, answer) = call("/v1/cycle/open", open(1)).await;
        assert_eq!(status, 409, "{}", String::from_utf8_lossy(&answer));
        assert!(
            String::from_utf8_lossy(&answer).contains("before its promote"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(undo.cycle_open(), None);
        // One of the promoted epoch opens (a sync onto it, `--full`).
        assert_eq!(call("/v1/cycle/open", open(2)).await.0, 200);
        assert_eq!(undo.cycle_open(), Some(9));
        // A record of the promoted epoch (a later sync onto it) is taken.
        let later = SyncedAsk {
            record: replica(2, 7),
            ..late
        };
        assert_eq!(
            call("/v1/role/synced", serde_json::to_vec(&later).unwrap())
                .await
                .0,
            200
        );
    }

    #[test]
    fn unions_of_unit_ranges() {
        assert_eq!(
            union(&[(0, 2), (5, 6)], &[(1, 3), (6, 8), (10, 10)]),
            vec![(0, 3), (5, 8)]
        );
        assert_eq!(union(&[], &[(4, 5)]), vec![(4, 5)]);
    }
}
