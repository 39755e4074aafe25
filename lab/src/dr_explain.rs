//! DR's failure output, sans-IO: what a far copy that is no prefix holds, stripe member by
//! stripe member, set beside the application's acknowledgments and the coordinator's
//! cycles, so that a failed run says by itself which member holds which writes and which
//! cycle each member's content is from (the run's logs are not always kept).
//!
//! Each member's records are judged on their own: a member whose records are exactly the
//! state after some write k (every write up to k that went to its slots, none after)
//! holds one moment; two members of one moment each but of different moments is the mark
//! of a cycle committed (or rolled back) on some members only; a member of no moment on
//! its own is something else (a late or foreign write).

use crate::dr::Ring;
use serde_json::Value;
use tools::crash::model::{self, Found, UNIT};

/// One stripe member's part of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member: usize,
    /// The newest write any of its blocks holds (0: none).
    pub newest: u64,
    /// Its records are exactly those after writes 1..=k, write k+1 perhaps partly there
    /// (`torn`); `None`: of no single moment on their own.
    pub moment: Option<(u64, bool)>,
    /// With a moment k: the next write to its slots after k. It holds the state after
    /// every write from k to the one before that one: members of one copy agree when
    /// those spans meet.
    pub next: Option<u64>,
    /// The first of its slots that does not match the state after `newest`: (slot, the
    /// write its blocks hold, the write expected).
    pub first_off: Option<(u64, u64, u64)>,
    /// Blocks that hold no stamp of this run (torn or foreign).
    pub garbled: usize,
}

/// The member of a stripe over `members` in units of `stripe_unit` bytes that holds the
/// record of `slot` (records of `record_bytes`, which divide the unit).
pub fn member_of(slot: u64, record_bytes: u64, stripe_unit: u64, members: usize) -> usize {
    ((slot * record_bytes / stripe_unit) % members.max(1) as u64) as usize
}

/// Each member's view of `copy` (the whole volume) against the writes of run `run`.
pub fn per_member(
    copy: &[u8],
    ring: &Ring,
    run: u64,
    record_bytes: usize,
    stripe_unit: u64,
    members: usize,
) -> Vec<MemberView> {
    let blocks = record_bytes / UNIT;
    // Each slot's blocks: the write each holds (u64::MAX for no stamp of this run).
    let slot_gens = |s: u64| -> Vec<u64> {
        (0..blocks)
            .map(|i| {
                let b = s as usize * blocks + i;
                match copy.get(b * UNIT..(b + 1) * UNIT).map(model::parse) {
                    Some(Found::Empty) => 0,
                    Some(Found::Stamp { run: r, unit, gen }) if r == run && unit == b as u64 => gen,
                    _ => u64::MAX,
                }
            })
            .collect()
    };
    let gens: Vec<Vec<u64>> = (0..ring.slots).map(slot_gens).collect();
    (0..members)
        .map(|m| {
            let mine: Vec<u64> = (0..ring.slots)
                .filter(|&s| member_of(s, record_bytes as u64, stripe_unit, members) == m)
                .collect();
            let garbled = mine
                .iter()
                .map(|&s| gens[s as usize].iter().filter(|&&g| g == u64::MAX).count())
                .sum();
            let newest = mine
                .iter()
                .flat_map(|&s| gens[s as usize].iter().copied())
                .filter(|&g| g != u64::MAX)
                .max()
                .unwrap_or(0);
            // The first of its slots off the state after k (blocks of slot `may` may hold
            // write k+1 as well).
            let off = |k: u64, may: Option<u64>| -> Option<(u64, u64, u64)> {
                let want = ring.after(k);
                mine.iter().find_map(|&s| {
                    let w = want[s as usize];
                    gens[s as usize]
                        .iter()
                        .find(|&&g| !(g == w || (may == Some(s) && g == k + 1)))
                        .map(|&g| (s, g, w))
                })
            };
            let first_off = off(newest, None);
            let moment = if first_off.is_none() {
                Some((newest, false))
            } else if newest >= 1 && off(newest - 1, Some(ring.slot(newest))).is_none() {
                Some((newest - 1, true))
            } else {
                None
            };
            let next = moment.and_then(|(k, _)| {
                (k + 1..=k + ring.slots).find(|&n| {
                    member_of(ring.slot(n), record_bytes as u64, stripe_unit, members) == m
                })
            });
            MemberView {
                member: m,
                newest,
                moment,
                next,
                first_off,
                garbled,
            }
        })
        .collect()
}

/// The lines of a violation's explanation: each member's view (with `hosts[m]`, the disk
/// server that holds member m), when the writes it ends at were acknowledged (`acks`: the
/// application's (write, Unix time, latency)), and the coordinator's last cycles (its
/// `cycle` lines) around them.
pub fn describe(
    views: &[MemberView],
    hosts: &[String],
    acks: &[(u64, f64, f64)],
    cycles: &[Value],
) -> String {
    let acked_at = |n: u64| {
        acks.iter()
            .find(|a| a.0 == n)
            .map_or("not acknowledged".to_owned(), |a| {
                format!("acknowledged at {:.3}", a.1)
            })
    };
    let mut d = String::new();
    for v in views {
        let host = hosts.get(v.member).map_or("?", String::as_str);
        d += &format!("member {} ({host}): newest write {}", v.member, v.newest);
        match v.moment {
            Some((k, torn)) => {
                d += &format!(
                    ", one moment on its own: writes 1..={k}{} (write {k} {})",
                    if torn { " and part of the next" } else { "" },
                    acked_at(k)
                )
            }
            None => {
                if let Some((s, got, want)) = v.first_off {
                    d += &format!(
                        ", of no moment on its own: slot {s} holds write {got} where every write up to {} leaves write {want}",
                        v.newest
                    )
                }
            }
        }
        if v.garbled > 0 {
            d += &format!(", {} block(s) with no stamp of this run", v.garbled);
        }
        d += "\n";
    }
    // Each member holds the state after any write from its k to its next one, less one:
    // one moment for all when the latest k comes before the earliest next.
    let ks: Vec<u64> = views.iter().filter_map(|v| v.moment.map(|m| m.0)).collect();
    let nexts: Vec<u64> = views.iter().filter_map(|v| v.next).collect();
    if ks.len() == views.len() && nexts.len() == views.len() {
        let (latest, earliest) = (ks.iter().max(), nexts.iter().min());
        if let (Some(&k), Some(&n)) = (latest, earliest) {
            if k >= n {
                d += &format!(
                    "the members hold different moments (one is past write {k}, another holds none of write {n}): a cycle committed or rolled back on some members only\n"
                );
            }
        }
    }
    // The coordinator's last cycles: which cut each member's moment falls after.
    let last: Vec<&Value> = cycles.iter().rev().take(4).collect();
    for c in last.iter().rev() {
        let cut = c["cut_unix"].as_f64();
        let before = cut.map(|t| {
            acks.iter()
                .filter(|a| a.1 <= t)
                .map(|a| a.0)
                .max()
                .unwrap_or(0)
        });
        d += &format!(
            "coordinator's cycle {} (id {}): cut {}, {}{}\n",
            c["cycle"],
            c["id"].as_u64().map_or("-".into(), |i| format!("{i:x}")),
            match (cut, before) {
                (Some(t), Some(b)) => format!("at {t:.3} (write {b} acknowledged before it)"),
                _ => "none".into(),
            },
            if c["committed"] == true {
                "committed"
            } else {
                "not committed"
            },
            c["error"]
                .as_str()
                .map(|e| format!(": {}", e.lines().next().unwrap_or("")))
                .unwrap_or_default()
        );
    }
    d
}

/// The write the first block of slot `s` holds (`None`: no stamp of this run).
fn slot_write(copy: &[u8], s: u64, run: u64, record_bytes: usize) -> Option<u64> {
    let b = s as usize * (record_bytes / UNIT);
    match copy.get(b * UNIT..(b + 1) * UNIT).map(model::parse)? {
        Found::Empty => Some(0),
        Found::Stamp { run: r, unit, gen } if r == run && unit == b as u64 => Some(gen),
        _ => None,
    }
}

/// The slots in which copies `a` and `b` differ, the first `max` of them named with their
/// member (of a stripe `(unit bytes, members)`) and the write each copy holds there.
pub fn slots_differing(
    a: &[u8],
    b: &[u8],
    ring: &Ring,
    run: u64,
    record_bytes: usize,
    stripe: (u64, usize),
    max: usize,
) -> String {
    let differ: Vec<u64> = (0..ring.slots)
        .filter(|&s| {
            let r = s as usize * record_bytes..(s as usize + 1) * record_bytes;
            a.get(r.clone()) != b.get(r)
        })
        .collect();
    let shown = |w: Option<u64>| w.map_or("no stamp".to_owned(), |w| format!("write {w}"));
    let mut d = format!("{} slot(s) differ", differ.len());
    for &s in differ.iter().take(max) {
        d += &format!(
            "; slot {s} (member {}): {} in the promoted copy, {} in the other",
            member_of(s, record_bytes as u64, stripe.0, stripe.1),
            shown(slot_write(a, s, run, record_bytes)),
            shown(slot_write(b, s, run, record_bytes))
        );
    }
    d + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dr::record;

    const REC: usize = 2 * UNIT;

    /// The volume after writes `writes`, a ring of `slots` records of 8 KiB.
    fn volume(ring: &Ring, writes: impl IntoIterator<Item = u64>) -> Vec<u8> {
        let mut v = vec![0u8; ring.slots as usize * REC];
        for n in writes {
            let s = ring.slot(n) as usize;
            v[s * REC..(s + 1) * REC].copy_from_slice(&record(1, s as u64, n, REC));
        }
        v
    }

    #[test]
    fn members_of_two_moments_are_told_apart() {
        // 32 slots of 8 KiB over two members in 64 KiB units: slots 0-7 on member 0,
        // 8-15 on member 1, and so on.
        let ring = Ring::new(32);
        assert_eq!(member_of(7, REC as u64, 64 << 10, 2), 0);
        assert_eq!(member_of(8, REC as u64, 64 << 10, 2), 1);
        assert_eq!(member_of(16, REC as u64, 64 << 10, 2), 0);
        // Member 1 left at write 50 while member 0 went on to 70.
        let late = volume(&ring, 1..=70);
        let early = volume(&ring, 1..=50);
        let mut v = late.clone();
        for s in 0..32u64 {
            if member_of(s, REC as u64, 64 << 10, 2) == 1 {
                let r = s as usize * REC..(s as usize + 1) * REC;
                v[r.clone()].copy_from_slice(&early[r]);
            }
        }
        let views = per_member(&v, &ring, 1, REC, 64 << 10, 2);
        let newest = |m: usize, k: u64| {
            (1..=k)
                .filter(|&n| member_of(ring.slot(n), REC as u64, 64 << 10, 2) == m)
                .max()
                .unwrap()
        };
        assert_eq!(views[0].moment, Some((newest(0, 70), false)));
        assert_eq!(views[1].moment, Some((newest(1, 50), false)));
        let d = describe(&views, &["a".into(), "b".into()], &[], &[]);
        assert!(d.contains("different moments"), "{d}");
        // One copy of one moment: every member agrees.
        let views = per_member(&late, &ring, 1, REC, 64 << 10, 2);
        assert!(views
            .iter()
            .all(|v| v.moment.is_some() && v.first_off.is_none()));
        let d = describe(&views, &[], &[(70, 1.5, 0.0)], &[]);
        assert!(!d.contains("different moments"), "{d}");
    }

    #[test]
    fn a_member_of_no_moment_names_its_slot() {
        let ring = Ring::new(32);
        // An old write (n - 32, its slot's write before n) where write n should be, on a
        // member that a later write reached too.
        let at = |n: u64| member_of(ring.slot(n), REC as u64, 64 << 10, 2);
        let n = (40..70u64)
            .find(|&n| (n + 1..=70).any(|l| at(l) == at(n)))
            .unwrap();
        let mut v = volume(&ring, 1..=70);
        let s = ring.slot(n) as usize;
        v[s * REC..(s + 1) * REC].copy_from_slice(&record(1, s as u64, n - 32, REC));
        let views = per_member(&v, &ring, 1, REC, 64 << 10, 2);
        let m = at(n);
        assert_eq!(views[m].moment, None);
        assert_eq!(views[m].first_off, Some((s as u64, n - 32, n)));
        assert!(views[1 - m].moment.is_some());
        let d = describe(&views, &[], &[], &[]);
        assert!(
            d.contains(&format!("slot {s} holds write {}", n - 32)),
            "{d}"
        );
    }
}
