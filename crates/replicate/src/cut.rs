//! A consistency group's cut, sans-IO: the two-phase barrier the coordinator runs across
//! the members of a volume (a stripe's disk servers) or any set of LUNs.
//!
//! 1. Every member holds new write completions (`Hold`): a write's data may still land,
//!    but its acknowledgment waits.
//! 2. Once every member holds, each takes its image (`Image`): its content at that moment.
//! 3. Every member releases its hold (`Release`).
//!
//! Why that is consistent: a write acknowledged before the cut completed before its
//! member held, so before any image; and if an image holds a write issued after another
//! write was acknowledged, that acknowledgment came before the second member's hold (else
//! it would have been held), so before every image was taken, since images are taken only
//! once all hold. The images of one cut are a moment the writers could have seen.
//!
//! The hold is bounded: if the images are not all taken within `timeout` of the start,
//! or a member fails to hold or to take its image, the cut aborts: every member asked to
//! hold is released, and every image taken is dropped. Answers that come late (after the
//! abort) or twice change nothing but what they must undo. The agents bound their holds
//! themselves too (the deadline goes with the request), so a coordinator that dies
//! mid-cut holds nothing up for longer than that.

use std::time::Duration;

/// What the coordinator must send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ask member `i` to hold write completions.
    Hold(usize),
    /// Ask member `i` to take its image.
    Image(usize),
    /// Ask member `i` to release its hold.
    Release(usize),
    /// Ask member `i` to drop its image (an aborted cut).
    Drop(usize),
}

/// Where the cut is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Holding,
    Imaging,
    /// Images all taken; the holds are being released.
    Releasing,
    /// Every image taken and every hold released.
    Done,
    Aborted(String),
}

#[derive(Clone, Debug, Default)]
struct Member {
    held: bool,
    imaged: bool,
    released: bool,
    /// How long the member reports it held.
    held_for: Option<Duration>,
}

/// The barrier's state. Time is given by the caller (`now`: any monotonic origin).
#[derive(Clone, Debug)]
pub struct Barrier {
    timeout: Duration,
    started: Duration,
    phase: Phase,
    members: Vec<Member>,
}

impl Barrier {
    pub fn new(members: usize, timeout: Duration) -> Barrier {
        Barrier {
            timeout,
            started: Duration::ZERO,
            phase: Phase::Idle,
            members: vec![Member::default(); members],
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The cut is over, one way or the other, and nothing is left to undo.
    pub fn is_over(&self) -> bool {
        matches!(self.phase, Phase::Done)
            || matches!(self.phase, Phase::Aborted(_)) && self.members.iter().all(|m| !m.held)
    }

    /// When the cut must be done by (for the caller's timer).
    pub fn deadline(&self) -> Duration {
        self.started + self.timeout
    }

    /// Each member's hold, as it reported it on release.
    pub fn held_for(&self) -> Vec<Option<Duration>> {
        self.members.iter().map(|m| m.held_for).collect()
    }

    /// Starts the cut: every member is asked to hold.
    pub fn start(&mut self, now: Duration) -> Vec<Action> {
        if self.phase != Phase::Idle {
            return Vec::new();
        }
        self.started = now;
        if self.members.is_empty() {
            self.phase = Phase::Done;
            return Vec::new();
        }
        self.phase = Phase::Holding;
        (0..self.members.len()).map(Action::Hold).collect()
    }

    fn abort(&mut self, why: String) -> Vec<Action> {
        if matches!(self.phase, Phase::Aborted(_) | Phase::Done) {
            return Vec::new();
        }
        self.phase = Phase::Aborted(why);
        let mut out = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            // Released whether it said it held or not: its answer may be on the way.
            out.push(Action::Release(i));
            if m.imaged {
                out.push(Action::Drop(i));
            }
        }
        out
    }

    /// Member `i` answered the hold: `Err` if it could not.
    pub fn on_held(&mut self, i: usize, r: Result<(), String>, now: Duration) -> Vec<Action> {
        let Some(m) = self.members.get_mut(i) else {
            return Vec::new();
        };
        match (&self.phase, r) {
            (Phase::Holding, Ok(())) => {
                if m.held {
                    return Vec::new();
                }
                m.held = true;
                if now > self.deadline() {
                    return self.abort("the members did not all hold in time".into());
                }
                if self.members.iter().all(|m| m.held) {
                    self.phase = Phase::Imaging;
                    return (0..self.members.len()).map(Action::Image).collect();
                }
                Vec::new()
            }
            (Phase::Holding, Err(e)) => self.abort(format!("member {i} could not hold: {e}")),
            // A hold that answers after the abort: it holds, so it is released.
            (Phase::Aborted(_), Ok(())) if !m.released => {
                m.held = true;
                vec![Action::Release(i)]
            }
            _ => Vec::new(),
        }
    }

    /// Member `i` answered the image request.
    pub fn on_imaged(&mut self, i: usize, r: Result<(), String>, now: Duration) -> Vec<Action> {
        let Some(m) = self.members.get_mut(i) else {
            return Vec::new();
        };
        match (&self.phase, r) {
            (Phase::Imaging, Ok(())) => {
                if m.imaged {
                    return Vec::new();
                }
                m.imaged = true;
                if now > self.deadline() {
                    return self.abort("the images were not all taken in time".into());
                }
                if self.members.iter().all(|m| m.imaged) {
                    self.phase = Phase::Releasing;
                    return (0..self.members.len()).map(Action::Release).collect();
                }
                Vec::new()
            }
            (Phase::Imaging, Err(e)) => {
                self.abort(format!("member {i} could not take its image: {e}"))
            }
            (Phase::Aborted(_), Ok(())) if !m.imaged => {
                m.imaged = true;
                vec![Action::Drop(i)]
            }
            _ => Vec::new(),
        }
    }

    /// Member `i` released its hold (how long it held, if it said). A failed release is
    /// left to the member's own deadline: the images were taken, and the cut stands.
    pub fn on_released(&mut self, i: usize, held_for: Option<Duration>) -> Vec<Action> {
        let Some(m) = self.members.get_mut(i) else {
            return Vec::new();
        };
        if m.released {
            return Vec::new();
        }
        m.released = true;
        m.held = false;
        m.held_for = held_for;
        if self.phase == Phase::Releasing && self.members.iter().all(|m| m.released) {
            self.phase = Phase::Done;
        }
        Vec::new()
    }

    /// The clock moved: a cut not past its images by the deadline aborts.
    pub fn tick(&mut self, now: Duration) -> Vec<Action> {
        match self.phase {
            Phase::Holding | Phase::Imaging if now > self.deadline() => self.abort(format!(
                "not every member held and took its image within {:?}",
                self.timeout
            )),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);
    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn images_wait_for_every_hold_and_releases_for_every_image() {
        let mut b = Barrier::new(3, T);
        assert_eq!(
            b.start(ms(0)),
            vec![Action::Hold(0), Action::Hold(1), Action::Hold(2)]
        );
        assert!(b.on_held(0, Ok(()), ms(1)).is_empty());
        assert!(b.on_held(2, Ok(()), ms(2)).is_empty());
        assert!(b.on_held(2, Ok(()), ms(2)).is_empty(), "a duplicate answer");
        assert_eq!(
            b.on_held(1, Ok(()), ms(3)),
            vec![Action::Image(0), Action::Image(1), Action::Image(2)]
        );
        assert!(b.on_imaged(1, Ok(()), ms(4)).is_empty());
        assert!(b.on_imaged(0, Ok(()), ms(4)).is_empty());
        assert_eq!(
            b.on_imaged(2, Ok(()), ms(5)),
            vec![Action::Release(0), Action::Release(1), Action::Release(2)]
        );
        assert_eq!(b.phase(), &Phase::Releasing);
        b.on_released(0, Some(ms(4)));
        b.on_released(1, Some(ms(3)));
        assert!(!b.is_over());
        b.on_released(2, Some(ms(2)));
        assert_eq!(b.phase(), &Phase::Done);
        assert!(b.is_over());
        assert_eq!(b.held_for(), vec![Some(ms(4)), Some(ms(3)), Some(ms(2))]);
    }

    #[test]
    fn a_member_that_cannot_hold_aborts_and_releases_the_others() {
        let mut b = Barrier::new(3, T);
        b.start(ms(0));
        b.on_held(0, Ok(()), ms(1));
        let a = b.on_held(1, Err("no such LUN".into()), ms(1));
        assert_eq!(
            a,
            vec![Action::Release(0), Action::Release(1), Action::Release(2)]
        );
        assert!(matches!(b.phase(), Phase::Aborted(w) if w.contains("member 1")));
        // Member 2's hold answers late: released again; no image is ever asked for.
        assert_eq!(b.on_held(2, Ok(()), ms(2)), vec![Action::Release(2)]);
        assert!(!b.is_over());
        b.on_released(0, None);
        b.on_released(2, None);
        assert!(b.is_over());
    }

    #[test]
    fn the_deadline_aborts_while_holding_and_while_imaging() {
        let mut b = Barrier::new(2, T);
        b.start(ms(100));
        b.on_held(0, Ok(()), ms(200));
        assert!(b.tick(ms(5100)).is_empty(), "not past the deadline yet");
        assert_eq!(
            b.tick(ms(5101)),
            vec![Action::Release(0), Action::Release(1)]
        );
        assert!(b.tick(ms(9000)).is_empty(), "aborted once");

        let mut b = Barrier::new(2, T);
        b.start(ms(0));
        b.on_held(0, Ok(()), ms(1));
        b.on_held(1, Ok(()), ms(1));
        b.on_imaged(0, Ok(()), ms(2));
        assert_eq!(
            b.tick(ms(6000)),
            vec![Action::Release(0), Action::Drop(0), Action::Release(1)]
        );
        // The other image lands after the abort: dropped.
        assert_eq!(b.on_imaged(1, Ok(()), ms(6001)), vec![Action::Drop(1)]);
        assert!(b.on_imaged(1, Ok(()), ms(6002)).is_empty());
    }

    #[test]
    fn an_answer_after_the_deadline_aborts_rather_than_completing() {
        let mut b = Barrier::new(1, T);
        b.start(ms(0));
        assert_eq!(b.on_held(0, Ok(()), ms(5001)), vec![Action::Release(0)]);
        assert!(matches!(b.phase(), Phase::Aborted(_)));
    }

    #[test]
    fn a_failed_image_drops_those_taken() {
        let mut b = Barrier::new(2, T);
        b.start(ms(0));
        b.on_held(0, Ok(()), ms(1));
        b.on_held(1, Ok(()), ms(1));
        b.on_imaged(1, Ok(()), ms(2));
        assert_eq!(
            b.on_imaged(0, Err("overrun".into()), ms(2)),
            vec![Action::Release(0), Action::Release(1), Action::Drop(1)]
        );
    }

    #[test]
    fn stray_answers_and_members_change_nothing() {
        let mut b = Barrier::new(2, T);
        assert!(b.on_held(0, Ok(()), ms(0)).is_empty(), "before the start");
        assert_eq!(b.phase(), &Phase::Idle);
        b.start(ms(0));
        assert!(b.start(ms(1)).is_empty(), "started once");
        assert!(b.on_held(7, Ok(()), ms(1)).is_empty());
        assert!(
            b.on_imaged(0, Ok(()), ms(1)).is_empty(),
            "an image before all hold"
        );
        assert_eq!(b.phase(), &Phase::Holding);
        let mut empty = Barrier::new(0, T);
        assert!(empty.start(ms(0)).is_empty());
        assert!(empty.is_over());
    }
}
