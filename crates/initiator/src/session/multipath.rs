//! The session's side of a gateway group: it asks the target what `crate::multipath`
//! needs (REPORT TARGET PORT GROUPS, VPD page 83h, READ KEYS) and does what it decides.
//! The decisions themselves are there, sans-IO.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{DataDir, ScsiResult, Session, Shared};
use crate::multipath::{self, Action, AluaSense, OnNewNexus, PortGroup};
use crate::{Error, Result};
use scsi_proto::status;

impl Shared {
    /// Whether the session was given more than one portal.
    pub(super) fn multipath(&self) -> bool {
        self.group.lock().unwrap().paths().len() > 1
    }

    /// One command of the session's own, past the hold of a move (see
    /// `ConnSet::held`); `None` when it did not end GOOD.
    async fn own_command(&self, cdb: &[u8], dir: DataDir) -> Option<ScsiResult> {
        match self.attempt(self.alua_lun, cdb, &dir, None, true).await {
            Ok(r) if r.is_good() => Some(r),
            // A unit attention of the new nexus, once.
            Ok(r) if r.status == status::CHECK_CONDITION => self
                .attempt(self.alua_lun, cdb, &dir, None, true)
                .await
                .ok()
                .filter(|r| r.is_good()),
            _ => None,
        }
    }

    /// The target port group of the path in use and every group's state, as the LU
    /// answers; nothing when it has no ALUA.
    async fn probe(&self) -> (Option<u16>, Vec<PortGroup>) {
        let vpd = self
            .own_command(
                &scsi_proto::cdb::inquiry(Some(0x83), 1024),
                DataDir::Read(1024),
            )
            .await;
        let rtpg = self
            .own_command(&multipath::rtpg_cdb(4096), DataDir::Read(4096))
            .await;
        let group = vpd.and_then(|r| multipath::vpd83_port_group(&r.data));
        let groups = rtpg
            .and_then(|r| multipath::parse_rtpg(&r.data).ok())
            .unwrap_or_default();
        (group, groups)
    }

    /// At login: moves to the active/optimized group's portal if the first one is not
    /// in it (each portal tried once; see `multipath::Group::logged_in`).
    pub(super) async fn choose_path(self: &Arc<Self>) {
        let n = self.group.lock().unwrap().paths().len();
        for _ in 0..2 * n {
            let (group, groups) = self.probe().await;
            let (from, action) = {
                let mut g = self.group.lock().unwrap();
                (g.current(), g.logged_in(group, &groups))
            };
            let Action::MoveTo(to) = action else {
                break;
            };
            self.group.lock().unwrap().move_to(to, false);
            self.moves.fetch_add(1, Ordering::AcqRel);
            match self.establish().await {
                Ok(()) => tracing::info!(
                    "multipath: logged in through {} (its ALUA group is better than {}'s)",
                    self.portal(),
                    self.group.lock().unwrap().paths()[from].portal
                ),
                Err(e) => {
                    // The first portal's session is still up: go back to it.
                    let mut g = self.group.lock().unwrap();
                    tracing::info!("multipath: {} refused the login: {e}", g.portal());
                    g.login_failed();
                    g.move_to(from, false);
                    self.moves.fetch_add(1, Ordering::AcqRel);
                    break;
                }
            }
        }
    }

    /// This session's initiator port as targets name it in transport IDs
    /// (`name,i,0xISID`, RFC 7143 / SPC-5 7.6.4.6).
    pub(super) fn initiator_port(&self) -> String {
        let isid: String = self.isid.iter().map(|b| format!("{b:02x}")).collect();
        format!("{},i,0x{isid}", self.opts.initiator_name)
    }

    /// After a login on another gateway (the session moved), before any command is
    /// reissued: read the ALUA states there, then make sure the session's registration
    /// holds on the new I_T nexus (SPC-5 5.14.7: a registration belongs to one I_T nexus
    /// unless it was made with ALL_TG_PT). READ FULL STATUS says whether this initiator
    /// port is registered through every target port already (a gateway group keeps
    /// registrations per initiator port, across its gateways): then nothing is sent,
    /// which matters because a PERSISTENT RESERVE OUT right after a gateway died waits
    /// in the cluster for that gateway's acknowledgement (up to 5 s). Otherwise the
    /// registration is made again, but only if the key is still registered through
    /// another nexus: a key that another initiator preempted meanwhile (fenced) stays
    /// away, and the writes reissued here meet their RESERVATION CONFLICT as they would
    /// have on the lost gateway. A target without READ FULL STATUS is asked READ KEYS.
    pub(super) async fn after_move(self: &Arc<Self>) -> Result<()> {
        let (group, groups) = self.probe().await;
        self.group.lock().unwrap().logged_in(group, &groups);
        let reg = *self.registration.lock().unwrap();
        let Some(reg) = reg.filter(|r| !r.all_target_ports) else {
            return Ok(());
        };
        let me = self.initiator_port();
        let full = self
            .own_command(
                &multipath::read_full_status_cdb(32768),
                DataDir::Read(32768),
            )
            .await
            .map(|r| multipath::on_new_nexus(&multipath::parse_full_status(&r.data), reg.key, &me));
        let decision = match full {
            Some(d) => Some(d),
            None => self
                .own_command(&multipath::read_keys_cdb(8192), DataDir::Read(8192))
                .await
                .map(|r| {
                    if multipath::parse_read_keys(&r.data).contains(&reg.key) {
                        OnNewNexus::Register
                    } else {
                        OnNewNexus::Gone
                    }
                }),
        };
        match decision {
            Some(OnNewNexus::Holds) => {
                tracing::info!(
                    "multipath: registration 0x{:x} holds through {} (registered through \
                     every target port)",
                    reg.key,
                    self.portal()
                );
                Ok(())
            }
            Some(OnNewNexus::Register) => {
                let (cdb, params) = multipath::reregister(reg.key, reg.all_target_ports);
                match self.own_command(&cdb, DataDir::Write(params.into())).await {
                    Some(_) => {
                        tracing::info!(
                            "multipath: registration 0x{:x} made again through {}",
                            reg.key,
                            self.portal()
                        );
                        Ok(())
                    }
                    None => Err(Error::Protocol(format!(
                        "the registration 0x{:x} could not be made again through {}",
                        reg.key,
                        self.portal()
                    ))),
                }
            }
            Some(OnNewNexus::Gone) => {
                tracing::warn!(
                    "multipath: registration 0x{:x} is gone (preempted or cleared): not \
                     made again through {}",
                    reg.key,
                    self.portal()
                );
                *self.registration.lock().unwrap() = None;
                Ok(())
            }
            None => Err(Error::Protocol(format!(
                "READ FULL STATUS and READ KEYS through {} failed: the registration 0x{:x} \
                 cannot be checked",
                self.portal(),
                reg.key
            ))),
        }
    }

    /// A command ended in an ALUA sense (standby, unavailable, transitioning) on a
    /// session with other portals: moves the session where the group says, and answers
    /// whether the command should be issued again. Sessions of one portal see the
    /// sense as before.
    pub(super) async fn alua_moved(
        self: &Arc<Self>,
        r: &ScsiResult,
        gen: u64,
        moves: u64,
        began: Instant,
    ) -> Result<bool> {
        if r.status != status::CHECK_CONDITION || !self.multipath() {
            return Ok(false);
        }
        let Some(s) = r
            .sense
            .as_ref()
            .and_then(|s| AluaSense::of(s.key, s.asc, s.ascq))
        else {
            return Ok(false);
        };
        // The sense is news of the portal the command went to (`moves`); if another
        // command's sense moved the session since, this one only waits for that move.
        let action = {
            let mut g = self.group.lock().unwrap();
            (self.moves.load(Ordering::Acquire) == moves).then(|| g.sense(s))
        };
        let Some(action) = action else {
            self.recover(gen, "ALUA state", began).await?;
            return Ok(true);
        };
        match action {
            Action::MoveTo(to) => {
                let from = self.portal();
                self.group.lock().unwrap().move_to(to, true);
                self.moves.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(
                    "multipath: {from} answered {s:?}; moving to {}",
                    self.portal()
                );
                self.recover(gen, "ALUA state", began).await?;
                Ok(true)
            }
            // Nowhere better: a transition ends soon, so wait a little and try again
            // (the caller counts the tries); standby or unavailable is the answer.
            _ if s == AluaSense::Transitioning => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl Session {
    /// At login with `pr_key`: registers the key for this session's I_T nexus (REGISTER
    /// AND IGNORE EXISTING KEY, so that a key left by an earlier session of the same
    /// initiator port is no obstacle) and, with `pr_type`, makes sure a reservation of
    /// that type is held by the key: taken when there is none, accepted when the key
    /// holds it already (another session of the same application took it), refused when
    /// another key holds one. Registrations are per I_T nexus, so every session of an
    /// application registers; under a registrants-only or all-registrants type all of
    /// them may write, whichever holds it.
    pub(super) async fn hold_reservation(&self, key: u64, kind: Option<u8>) -> Result<()> {
        let lun = self.shared.alua_lun;
        let refused = |what: &str, r: &ScsiResult| {
            Error::Reservation(format!(
                "{what} with key 0x{key:x} answered status 0x{:02x}{}",
                r.status,
                r.sense
                    .as_ref()
                    .map(|s| format!(", sense {:02x}/{:02x}/{:02x}", s.key, s.asc, s.ascq))
                    .unwrap_or_default()
            ))
        };
        // With ALL_TG_PT: the registration is to hold through every gateway the session may
        // move to, so that a move needs no PERSISTENT RESERVE OUT (which, right after a
        // gateway died, waits in the cluster for the dead one's acknowledgement). A target
        // that does not offer ALL_TG_PT (ATP_C 0) refuses it with INVALID FIELD IN
        // PARAMETER LIST: then this nexus alone, and a move registers again.
        // `command` records the registration (`registration_after`) for `after_move`.
        let (cdb, params) = multipath::reregister(key, true);
        let mut r = self
            .command(lun, &cdb, DataDir::Write(params.into()))
            .await?;
        if r.sense
            .as_ref()
            .is_some_and(|s| s.key == 0x05 && s.asc == 0x26)
        {
            let (cdb, params) = multipath::reregister(key, false);
            r = self
                .command(lun, &cdb, DataDir::Write(params.into()))
                .await?;
        }
        if !r.is_good() {
            return Err(refused("REGISTER", &r));
        }
        let Some(kind) = kind else {
            tracing::info!("registered key 0x{key:x} through {}", self.shared.portal());
            return Ok(());
        };
        // Twice: a RESERVE that lost a race with another session of ours meets a
        // RESERVATION CONFLICT, and the second READ RESERVATION shows it ours.
        for _ in 0..2 {
            let r = self
                .command(lun, &multipath::read_reservation_cdb(64), DataDir::Read(64))
                .await?;
            if !r.is_good() {
                return Err(refused("READ RESERVATION", &r));
            }
            match multipath::parse_read_reservation(&r.data) {
                Some((k, t))
                    if t == kind && (k == key || multipath::all_registrants_type(kind)) =>
                {
                    return Ok(());
                }
                Some((k, t)) => {
                    return Err(Error::Reservation(format!(
                        "the LU is reserved (type {t}) by key 0x{k:x}, not 0x{key:x} with type {kind}"
                    )));
                }
                None => {}
            }
            let (cdb, params) = multipath::reserve(key, kind);
            let r = self
                .command(lun, &cdb, DataDir::Write(params.into()))
                .await?;
            if r.is_good() {
                tracing::info!(
                    "reservation of type {kind} taken with key 0x{key:x} through {}",
                    self.shared.portal()
                );
                return Ok(());
            }
            if r.status != status::RESERVATION_CONFLICT {
                return Err(refused("RESERVE", &r));
            }
        }
        Err(Error::Reservation(format!(
            "no reservation of type {kind} could be taken or found with key 0x{key:x}"
        )))
    }
}
