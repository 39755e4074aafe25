//! Failover's rules, sans-IO: what a replicated volume's role allows, how epochs compare,
//! and what `promote`, `demote`, a sync and a resync may do from which state. The records
//! themselves are `backstore::role`'s (a `.role` file beside each LUN); the agent keeps
//! them ([`crate::failover`]) and the coordinator asks these rules before any data moves.
//!
//! - A *primary* is written by applications and is the source of syncs; a *replica* is
//!   read-only to applications and written only by its replication streams (its
//!   `writers`).
//! - The *epoch* grows at every promote, past any the site has seen; a replica takes its
//!   source's epoch at every completed sync. Data of a lower epoch is stale.
//! - The *image* is the last sync that completed between the two sites: what both hold.
//! - A LUN with no record was never replicated: as a source it counts as a primary of
//!   epoch 0, as a destination as a new replica. A first sync gives both their roles.

use std::fmt;

pub use backstore::role::{ImageMark, Role, RoleRecord};

/// A volume's role as its LUNs (the file server's and each stripe member's) hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeRole {
    /// No LUN has a record.
    Unset,
    /// Every LUN holds the same role and epoch (the image is kept only when all agree).
    Set(RoleRecord),
    /// The LUNs disagree (a promote or demote that reached only some of them).
    Mixed(String),
}

impl VolumeRole {
    /// Combines the records of a volume's LUNs.
    pub fn of(records: &[Option<RoleRecord>]) -> VolumeRole {
        let set: Vec<&RoleRecord> = records.iter().flatten().collect();
        let Some(first) = set.first() else {
            return VolumeRole::Unset;
        };
        if set.len() != records.len() {
            return VolumeRole::Mixed(format!(
                "{} of its {} LUNs have no role",
                records.len() - set.len(),
                records.len()
            ));
        }
        if let Some(other) = set
            .iter()
            .find(|r| r.role != first.role || r.epoch != first.epoch)
        {
            return VolumeRole::Mixed(format!(
                "{} at epoch {} beside {} at epoch {}",
                first.role.as_str(),
                first.epoch,
                other.role.as_str(),
                other.epoch
            ));
        }
        let mut r = (*first).clone();
        if set.iter().any(|o| o.image != r.image) {
            r.image = None;
        }
        if set.iter().any(|o| o.pending != r.pending) {
            r.pending = None;
        }
        VolumeRole::Set(r)
    }

    fn shown(&self) -> String {
        match self {
            VolumeRole::Unset => "no role".into(),
            VolumeRole::Set(r) => format!("{} at epoch {}", r.role.as_str(), r.epoch),
            VolumeRole::Mixed(why) => format!("mixed ({why})"),
        }
    }
}

/// Which kind of transfer is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// `rsv sync SRC DEST`: the source's changes (or everything, `full`).
    Sync { full: bool },
    /// `rsv sync resync NEW OLD`: the union of both sides' changes since their last
    /// common image.
    Resync,
}

/// Why a transfer, promote or demote is refused: one line for people, naming the stale
/// site and what to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// What a transfer allowed by [`check_transfer`] records when it completes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// The epoch both sides hold after it.
    pub epoch: u64,
    /// The destination's writers: its own, or `new_writer` for a LUN that had no role.
    pub writers: Vec<String>,
}

/// Whether data may move from `src` to `dst` (named `src_name`, `dst_name` in the
/// refusal); `new_writer` names the replication streams of a destination that has no
/// writers yet.
pub fn check_transfer(
    src: &VolumeRole,
    dst: &VolumeRole,
    kind: Transfer,
    src_name: &str,
    dst_name: &str,
    new_writer: &str,
) -> Result<Allowed, Refusal> {
    let no = |s: String| Err(Refusal(s));
    for (v, name) in [(src, src_name), (dst, dst_name)] {
        if let VolumeRole::Mixed(why) = v {
            return no(format!(
                "the LUNs of {name} disagree on their role ({why}): run `rsv sync promote {name}` or `rsv sync demote {name}` again"
            ));
        }
    }
    let src_epoch = match src {
        VolumeRole::Set(r) if r.role == Role::Replica => {
            return no(format!(
                "{src_name} is a replica (epoch {}): it is no sync's source; run `rsv sync promote {src_name}` first, or sync the other way",
                r.epoch
            ))
        }
        VolumeRole::Set(r) => r.epoch,
        _ => 0,
    };
    let (dst_epoch, writers) = match dst {
        VolumeRole::Set(r) if r.role == Role::Primary => {
            let (stale, keep, stale_epoch, keep_epoch) = if r.epoch > src_epoch {
                (src_name, dst_name, src_epoch, r.epoch)
            } else {
                (dst_name, src_name, r.epoch, src_epoch)
            };
            let which = if stale_epoch == keep_epoch {
                format!("both hold epoch {keep_epoch}: choose which to keep; to keep {keep}'s data")
            } else {
                format!("{stale} is stale (epoch {stale_epoch} < {keep_epoch})")
            };
            return no(format!(
                "two primaries: {src_name} ({}) and {dst_name} ({}) both claim primary; {which}, run `rsv sync demote {stale}` then `rsv sync resync {keep} {stale}`",
                src.shown(),
                dst.shown()
            ));
        }
        VolumeRole::Set(r) => (r.epoch, r.writers.clone()),
        _ => (0, Vec::new()),
    };
    if src_epoch < dst_epoch {
        return no(format!(
            "{src_name} is stale: its epoch {src_epoch} is lower than {dst_name}'s {dst_epoch} (a later primary wrote {dst_name}); run `rsv sync demote {src_name}` and resync it from the primary"
        ));
    }
    let writers = if writers.is_empty() {
        vec![new_writer.to_owned()]
    } else {
        writers
    };
    let epoch = src_epoch.max(1);
    match kind {
        Transfer::Sync { full } => {
            if src_epoch > dst_epoch && dst_epoch > 0 && !full {
                return no(format!(
                    "{dst_name} was primary at epoch {dst_epoch} and may hold writes {src_name} never had: send what differs with `rsv sync resync {src_name} {dst_name}` (or everything with `rsv sync --full`)"
                ));
            }
        }
        Transfer::Resync => {
            let (VolumeRole::Set(s), VolumeRole::Set(d)) = (src, dst) else {
                return no(format!(
                    "a resync goes from a primary to a demoted replica; {src_name} is {}, {dst_name} {}",
                    src.shown(),
                    dst.shown()
                ));
            };
            // The image both hold: the same one recorded on both, or the one a completed
            // transfer recorded on one side and was about to record on the other (its
            // `pending`) when it was cut off. Both sides' maps then cover what changed
            // since it: the far side forgot its map as it recorded the image, and the
            // source's map holds everything since that transfer's cut (what the cut froze
            // stays until released).
            let same = |a: Option<ImageMark>, b: Option<ImageMark>| matches!((a, b), (Some(a), Some(b)) if a.id == b.id);
            match () {
                _ if same(s.image, d.image)
                    || same(s.image, d.pending)
                    || same(s.pending, d.image) => {}
                _ => {
                    return no(format!(
                        "{src_name} and {dst_name} hold no common image (theirs: {} and {}): only a full copy can make them equal, `rsv sync --full {src_name} {dst_name}`",
                        shown_image(s.image),
                        shown_image(d.image)
                    ))
                }
            }
        }
    }
    Ok(Allowed { epoch, writers })
}

fn shown_image(i: Option<ImageMark>) -> String {
    i.map_or("none".into(), |i| format!("{:x}", i.id))
}

/// A LUN's record after a completed transfer: `Primary` on the source, `Replica` with the
/// writers on the destination, both at the transfer's epoch and image.
pub fn after_transfer(side: Role, a: &Allowed, image: ImageMark) -> RoleRecord {
    RoleRecord {
        role: side,
        epoch: a.epoch,
        image: Some(image),
        pending: None,
        writers: match side {
            Role::Primary => Vec::new(),
            Role::Replica => a.writers.clone(),
        },
    }
}

/// A source LUN's record while a completed transfer records its image: as before (`old`,
/// the source's record, at the transfer's epoch) with `image` pending, written before the
/// far side records it (see [`backstore::role::RoleRecord::pending`]).
pub fn pending_transfer(old: Option<&RoleRecord>, a: &Allowed, image: ImageMark) -> RoleRecord {
    RoleRecord {
        role: Role::Primary,
        epoch: a.epoch,
        image: old.and_then(|r| r.image),
        pending: Some(image),
        writers: Vec::new(),
    }
}

/// `promote`: a replica becomes primary at a new epoch, past any it has seen. `busy`
/// says what is writing it now (a sync's stream, an open cycle), which refuses the
/// promote unless `force`. A primary stays as it is.
pub fn promote(
    rec: Option<&RoleRecord>,
    busy: Option<&str>,
    force: bool,
    name: &str,
) -> Result<RoleRecord, Refusal> {
    let Some(r) = rec else {
        return Err(Refusal(format!(
            "{name} has no role (it was never a sync's destination): it is writable already"
        )));
    };
    if r.role == Role::Primary {
        return Ok(r.clone());
    }
    if let (Some(what), false) = (busy, force) {
        return Err(Refusal(format!(
            "{name}: {what}; promoting now would make a half-written image primary: wait for it to end, or give --force to abandon it"
        )));
    }
    Ok(RoleRecord {
        role: Role::Primary,
        epoch: r.epoch + 1,
        image: r.image,
        pending: r.pending,
        writers: Vec::new(),
    })
}

/// `demote`: a primary becomes a replica written only by `writer` (the next resync's
/// streams), keeping its epoch and image, so that a resync knows what it held.
pub fn demote(rec: Option<&RoleRecord>, writer: &str, name: &str) -> Result<RoleRecord, Refusal> {
    match rec {
        None => Err(Refusal(format!(
            "{name} has no role: a LUN becomes a replica as a sync's destination"
        ))),
        Some(r) if r.role == Role::Replica => Ok(r.clone()),
        Some(r) => Ok(RoleRecord {
            role: Role::Replica,
            epoch: r.epoch,
            image: r.image,
            pending: r.pending,
            writers: vec![writer.to_owned()],
        }),
    }
}

/// Whether a LUN whose record is `old` refuses a request of a transfer at `epoch` (`what`:
/// a completed sync's record, a cycle's open): one below the LUN's epoch is refused. No
/// transfer lowers an epoch ([`check_transfer`] refuses a source whose epoch is below its
/// destination's), so such a request is a late one of a sync from before a promote: a
/// lost site's coordinator's last request, sent as the link failed and delivered by its
/// host's kernel once the link came back, after the far site was promoted. Taken, a record
/// would make the promoted LUN a replica again at the old epoch (and forget its change
/// map); an open would start saving its writes for a roll back that its next restart makes,
/// undoing them. Epoch 0: not said (an older coordinator's open), taken.
pub fn late_refusal(
    old: Option<&RoleRecord>,
    epoch: u64,
    what: &str,
    name: &str,
) -> Option<Refusal> {
    let old = old?;
    (epoch != 0 && epoch < old.epoch).then(|| {
        Refusal(format!(
            "{name} is {} at epoch {}: {what} at epoch {epoch} is from before its promote, and is refused",
            old.role.as_str(),
            old.epoch,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_request_from_before_a_promote_is_refused() {
        let replica = rec(Role::Replica, 3, 7);
        let promoted = promote(Some(&replica), None, false, "L").unwrap();
        // The sync that was running as the source site was lost, recording its image late.
        let why = late_refusal(Some(&promoted), 3, "a sync's record", "L").unwrap();
        assert!(
            why.0.contains("epoch 4") && why.0.contains("epoch 3"),
            "{why}"
        );
        // Every transfer keeps or raises the epoch: taken.
        assert!(late_refusal(Some(&replica), 3, "r", "L").is_none());
        assert!(late_refusal(Some(&promoted), 4, "r", "L").is_none());
        assert!(late_refusal(Some(&promoted), 5, "r", "L").is_none());
        assert!(late_refusal(None, 3, "r", "L").is_none(), "a first sync");
        assert!(
            late_refusal(Some(&promoted), 0, "r", "L").is_none(),
            "not said"
        );
    }

    /// A failure after the far side recorded a transfer's image and before the source
    /// did: the old source, demoted, holds that image as pending, and a resync from the
    /// promoted far side onto it goes on (both maps cover what changed since). Fails
    /// ("hold no common image") when only the recorded images are compared.
    #[test]
    fn a_resync_takes_an_image_one_side_recorded_and_the_other_had_pending() {
        let a = Allowed {
            epoch: 3,
            writers: vec!["w".into()],
        };
        let y = ImageMark { id: 8, unix: 0 };
        // The source before the far side records: image 7, 8 pending.
        let src = pending_transfer(Some(&rec(Role::Primary, 3, 7)), &a, y);
        assert_eq!(
            (src.image.map(|i| i.id), src.pending.map(|i| i.id)),
            (Some(7), Some(8))
        );
        // The far side recorded 8, the source died; the far side is promoted, the old
        // source demoted: the resync far -> old source.
        let far = after_transfer(Role::Replica, &a, y);
        let promoted = promote(Some(&far), None, true, "B").unwrap();
        let demoted = demote(Some(&src), "w2", "A").unwrap();
        assert_eq!(
            demoted.pending,
            Some(y),
            "the demote keeps what was pending"
        );
        let (pv, dv) = (
            VolumeRole::Set(promoted.clone()),
            VolumeRole::Set(demoted.clone()),
        );
        assert!(check_transfer(&pv, &dv, Transfer::Resync, "B", "A", "n").is_ok());
        // Either way round.
        let other = promote(Some(&demoted), None, true, "A").unwrap();
        let back = demote(Some(&promoted), "w3", "B").unwrap();
        assert!(check_transfer(
            &VolumeRole::Set(other),
            &VolumeRole::Set(back),
            Transfer::Resync,
            "A",
            "B",
            "n"
        )
        .is_ok());
        // An image neither recorded nor pending on the other side: still refused.
        let mut stranger = demoted.clone();
        stranger.pending = Some(ImageMark { id: 9, unix: 0 });
        let why = check_transfer(
            &pv,
            &VolumeRole::Set(stranger),
            Transfer::Resync,
            "B",
            "A",
            "n",
        )
        .unwrap_err();
        assert!(why.0.contains("no common image"), "{why}");
        // A member whose pending differs from the others' gives the volume none.
        let mut odd = demoted.clone();
        odd.pending = None;
        assert!(matches!(
            VolumeRole::of(&[Some(demoted), Some(odd)]),
            VolumeRole::Set(r) if r.pending.is_none()
        ));
        // The far side's record, then the source's, clear what was pending.
        assert_eq!(after_transfer(Role::Primary, &a, y).pending, None);
    }

    fn rec(role: Role, epoch: u64, image: u64) -> RoleRecord {
        RoleRecord {
            role,
            epoch,
            image: Some(ImageMark { id: image, unix: 0 }),
            pending: None,
            writers: match role {
                Role::Replica => vec!["w".into()],
                Role::Primary => vec![],
            },
        }
    }

    fn set(r: RoleRecord) -> VolumeRole {
        VolumeRole::Set(r)
    }

    const SYNC: Transfer = Transfer::Sync { full: false };

    #[test]
    fn a_first_sync_gives_both_their_roles() {
        let a =
            check_transfer(&VolumeRole::Unset, &VolumeRole::Unset, SYNC, "A", "B", "n").unwrap();
        assert_eq!(
            a,
            Allowed {
                epoch: 1,
                writers: vec!["n".into()]
            }
        );
        let img = ImageMark { id: 5, unix: 9 };
        assert_eq!(after_transfer(Role::Primary, &a, img).role, Role::Primary);
        assert_eq!(after_transfer(Role::Replica, &a, img).writers, ["n"]);
    }

    #[test]
    fn two_primaries_are_refused_naming_the_stale_one() {
        let e = check_transfer(
            &set(rec(Role::Primary, 2, 1)),
            &set(rec(Role::Primary, 3, 1)),
            SYNC,
            "A",
            "B",
            "n",
        )
        .unwrap_err();
        assert!(e.0.contains("two primaries"), "{e}");
        assert!(e.0.contains("A is stale"), "{e}");
        assert!(e.0.contains("rsv sync demote A"), "{e}");
        assert!(e.0.contains("rsv sync resync B A"), "{e}");
    }

    #[test]
    fn a_stale_source_and_a_replica_source_are_refused() {
        let e = check_transfer(
            &set(rec(Role::Primary, 1, 1)),
            &set(rec(Role::Replica, 2, 1)),
            SYNC,
            "A",
            "B",
            "n",
        )
        .unwrap_err();
        assert!(e.0.contains("A is stale"), "{e}");
        let e = check_transfer(
            &set(rec(Role::Replica, 1, 1)),
            &VolumeRole::Unset,
            SYNC,
            "A",
            "B",
            "n",
        )
        .unwrap_err();
        assert!(e.0.contains("A is a replica"), "{e}");
    }

    #[test]
    fn an_old_primary_takes_a_resync_not_a_plain_sync() {
        let (b, a) = (set(rec(Role::Primary, 2, 7)), set(rec(Role::Replica, 1, 7)));
        let e = check_transfer(&b, &a, SYNC, "B", "A", "n").unwrap_err();
        assert!(e.0.contains("rsv sync resync B A"), "{e}");
        assert!(check_transfer(&b, &a, Transfer::Sync { full: true }, "B", "A", "n").is_ok());
        let ok = check_transfer(&b, &a, Transfer::Resync, "B", "A", "n").unwrap();
        assert_eq!(
            ok,
            Allowed {
                epoch: 2,
                writers: vec!["w".into()]
            }
        );
        // No common image: only a full copy.
        let e = check_transfer(
            &b,
            &set(rec(Role::Replica, 1, 8)),
            Transfer::Resync,
            "B",
            "A",
            "n",
        )
        .unwrap_err();
        assert!(e.0.contains("--full"), "{e}");
    }

    #[test]
    fn promote_and_demote() {
        let r = rec(Role::Replica, 4, 1);
        let e = promote(Some(&r), Some("a sync is writing"), false, "B").unwrap_err();
        assert!(e.0.contains("--force"), "{e}");
        let p = promote(Some(&r), Some("a sync is writing"), true, "B").unwrap();
        assert_eq!((p.role, p.epoch, p.writers.len()), (Role::Primary, 5, 0));
        assert_eq!(
            promote(Some(&p), None, false, "B").unwrap(),
            p,
            "idempotent"
        );
        assert!(promote(None, None, false, "B").is_err());
        let d = demote(Some(&p), "w2", "B").unwrap();
        assert_eq!((d.role, d.epoch, d.image), (Role::Replica, 5, p.image));
        assert_eq!(d.writers, ["w2"]);
        assert_eq!(demote(Some(&d), "w3", "B").unwrap(), d, "idempotent");
    }

    #[test]
    fn a_volume_whose_luns_disagree_is_mixed_and_refused() {
        let v = VolumeRole::of(&[
            Some(rec(Role::Primary, 2, 1)),
            Some(rec(Role::Replica, 1, 1)),
        ]);
        assert!(matches!(v, VolumeRole::Mixed(_)));
        assert!(check_transfer(&v, &VolumeRole::Unset, SYNC, "A", "B", "n").is_err());
        assert!(matches!(
            VolumeRole::of(&[Some(rec(Role::Primary, 2, 1)), None]),
            VolumeRole::Mixed(_)
        ));
        assert_eq!(VolumeRole::of(&[None, None]), VolumeRole::Unset);
        let v = VolumeRole::of(&[
            Some(rec(Role::Primary, 2, 1)),
            Some(rec(Role::Primary, 2, 3)),
        ]);
        assert!(
            matches!(v, VolumeRole::Set(r) if r.image.is_none()),
            "images differ: none kept"
        );
    }

    /// One step of two sites' history.
    #[derive(Clone, Debug)]
    enum Step {
        Promote(usize, bool),
        Demote(usize),
        Sync(usize, bool),
        Resync(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..2usize, any::<bool>()).prop_map(|(s, f)| Step::Promote(s, f)),
            (0..2usize).prop_map(Step::Demote),
            (0..2usize, any::<bool>()).prop_map(|(s, f)| Step::Sync(s, f)),
            (0..2usize).prop_map(Step::Resync),
        ]
    }

    proptest! {
        /// Whatever the order of promotes, demotes and transfers between two sites: a
        /// transfer never leaves a primary as its destination or a stale source, never
        /// goes between two primaries, and every promote raises the epoch past any
        /// either site has held.
        #[test]
        fn epochs_never_let_stale_data_overwrite_newer(steps in proptest::collection::vec(step(), 1..40)) {
            let mut sites: [Option<RoleRecord>; 2] = [None, None];
            let mut image = 0u64;
            for s in steps {
                match s {
                    Step::Promote(i, force) => {
                        let before = sites[i].clone();
                        if let Ok(r) = promote(sites[i].as_ref(), None, force, "X") {
                            if let Some(b) = before.filter(|b| b.role == Role::Replica) {
                                prop_assert!(r.epoch > b.epoch, "a promote raised no epoch");
                            }
                            sites[i] = Some(r);
                        }
                    }
                    Step::Demote(i) => {
                        if let Ok(r) = demote(sites[i].as_ref(), "w", "X") {
                            sites[i] = Some(r);
                        }
                    }
                    Step::Sync(i, _) | Step::Resync(i) => {
                        let kind = match s {
                            Step::Sync(_, full) => Transfer::Sync { full },
                            _ => Transfer::Resync,
                        };
                        let (src, dst) = (VolumeRole::of(&[sites[i].clone()]), VolumeRole::of(&[sites[1 - i].clone()]));
                        if let Ok(a) = check_transfer(&src, &dst, kind, "S", "D", "n") {
                            let se = sites[i].as_ref().map_or(0, |r| r.epoch);
                            let de = sites[1 - i].as_ref().map_or(0, |r| r.epoch);
                            prop_assert!(se >= de, "a stale source sent");
                            prop_assert!(sites[i].as_ref().is_none_or(|r| r.role == Role::Primary));
                            prop_assert!(sites[1 - i].as_ref().is_none_or(|r| r.role == Role::Replica));
                            if se > de && de > 0 {
                                prop_assert!(!matches!(kind, Transfer::Sync { full: false }), "an old primary's own writes ignored");
                            }
                            image += 1;
                            let mark = ImageMark { id: image, unix: 0 };
                            sites[i] = Some(after_transfer(Role::Primary, &a, mark));
                            sites[1 - i] = Some(after_transfer(Role::Replica, &a, mark));
                        }
                    }
                }
            }
        }
    }
}
