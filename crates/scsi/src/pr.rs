//! Reservations: SPC-2 RESERVE/RELEASE and persistent reservations (SPC-5 5.14,
//! PERSISTENT RESERVE IN/OUT), with the access rules both impose on other commands.
//!
//! Registrations are kept per I_T nexus and named by the initiator port (the iSCSI name
//! plus ",i,0x" and the ISID), so that a registration made with APTPL survives a restart
//! of the target, when the nexus numbers are new.

use std::collections::HashMap;
use std::fmt::Write as _;

use scsi_proto::opcodes::service_action::persistent_reserve_in::{
    READ_FULL_STATUS as SA_READ_FULL_STATUS, READ_KEYS as SA_READ_KEYS,
    READ_RESERVATION as SA_READ_RESERVATION, REPORT_CAPABILITIES as SA_REPORT_CAPABILITIES,
};
use scsi_proto::opcodes::service_action::persistent_reserve_out::{
    CLEAR as SA_CLEAR, PREEMPT as SA_PREEMPT, PREEMPT_AND_ABORT as SA_PREEMPT_AND_ABORT,
    REGISTER as SA_REGISTER, REGISTER_AND_IGNORE_EXISTING_KEY as SA_REGISTER_AND_IGNORE,
    REGISTER_AND_MOVE as SA_REGISTER_AND_MOVE, RELEASE as SA_RELEASE, RESERVE as SA_RESERVE,
};

use crate::cdb::{be16, be32, be64, truncate};
use crate::sense::{self, Sense};
use crate::Nexus;

/// Persistent reservation types (SPC-5 table 182).
pub(crate) mod kind {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_RO: u8 = 5;
    pub const EXCLUSIVE_ACCESS_RO: u8 = 6;
    pub const WRITE_EXCLUSIVE_AR: u8 = 7;
    pub const EXCLUSIVE_ACCESS_AR: u8 = 8;
}

/// iSCSI's protocol identifier in transport IDs (SPC-5 table 444).
const PROTOCOL_ISCSI: u8 = 0x05;

/// Why a command may not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fail {
    Check(Sense),
    Conflict,
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Self {
        Fail::Check(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Registrant {
    /// Initiator port name, `iqn...,i,0x<isid>`.
    port: String,
    key: u64,
    /// The relative identifier of the target port it registered through, and whether it
    /// registered with ALL_TG_PT; `None` for a registration kept by an older version,
    /// which recorded neither (reported with ALL_TG_PT set, as that version did).
    via: Option<Via>,
}

/// Where a registration was made (READ FULL STATUS, SPC-5 6.16.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Via {
    relative_port: u16,
    all_tg_pt: bool,
}

/// Everything reservations keep for one logical unit.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    /// SPC-2 reservation holder.
    legacy: Option<Nexus>,
    generation: u32,
    registrants: Vec<Registrant>,
    /// Persistent reservation: holder port (empty for all-registrants types) and type.
    reservation: Option<(String, u8)>,
    aptpl: bool,
    /// Initiator port names of the nexuses seen, as the transport told them.
    names: HashMap<Nexus, String>,
    /// The relative identifier of the target port every nexus here arrives through, and
    /// those of the other targets' ports that export the logical unit too (a gateway
    /// group): where registrations are recorded as made.
    relative_port: u16,
    peer_ports: Vec<u16>,
}

/// Unit attentions a reservation change raises, by initiator port.
pub type Notices = Vec<(String, Sense)>;

/// What a PERSISTENT RESERVE OUT changed beyond the state itself, for every target that
/// exports the logical unit: the unit attentions it raises, and the initiator ports whose
/// tasks are to be aborted (PREEMPT AND ABORT: SPC-5 5.14.11.2.6, the preempted I_T
/// nexuses' task sets aborted as by ABORT TASK SET). The rules only name them; the
/// transport aborts the tasks (`LogicalUnit::on_abort_tasks`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Event {
    pub notices: Notices,
    pub abort: Vec<String>,
}

/// How a command meets reservations that another I_T nexus holds: SPC-2's RESERVE, and
/// persistent reservations (SPC-5 5.14.3, table 70; SBC-4 4.17.3, table 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Never blocked: INQUIRY, REPORT LUNS, REQUEST SENSE, MAINTENANCE IN and PERSISTENT
    /// RESERVE IN.
    Always,
    /// Blocked by an SPC-2 reservation, never by a persistent one: TEST UNIT READY, READ
    /// CAPACITY, RECEIVE COPY RESULTS, and PERSISTENT RESERVE OUT, whose service actions
    /// settle persistent reservations among themselves.
    Unreserved,
    /// Reads: blocked by an SPC-2 reservation and by persistent exclusive-access types.
    Read,
    /// Blocked by any reservation.
    Write,
    /// RESERVE: blocked by another's SPC-2 reservation and wherever persistent
    /// reservations or registrations exist.
    Reserve,
    /// RELEASE: runs (doing nothing) under another's SPC-2 reservation; blocked wherever
    /// persistent reservations or registrations exist.
    Release,
}

fn all_registrants(kind: u8) -> bool {
    matches!(kind, kind::WRITE_EXCLUSIVE_AR | kind::EXCLUSIVE_ACCESS_AR)
}

fn registrants_only(kind: u8) -> bool {
    matches!(
        kind,
        kind::WRITE_EXCLUSIVE_RO
            | kind::EXCLUSIVE_ACCESS_RO
            | kind::WRITE_EXCLUSIVE_AR
            | kind::EXCLUSIVE_ACCESS_AR
    )
}

fn valid_kind(kind: u8) -> bool {
    matches!(kind, kind::WRITE_EXCLUSIVE | kind::EXCLUSIVE_ACCESS | 5..=8)
}

/// The initiator port name a nexus is known by when the transport never named it.
fn fallback_name(n: Nexus) -> String {
    format!("nexus.{}", n.0)
}

impl Reservations {
    /// Sets the target port the nexuses arrive through (its relative identifier), and
    /// those of the other targets that export the logical unit (see
    /// `LuConfig::peer_port_groups`).
    pub fn set_ports(&mut self, relative_port: u16, peer_ports: &[u16]) {
        self.relative_port = relative_port;
        self.peer_ports = peer_ports.to_vec();
    }

    fn here(&self, all_tg_pt: bool) -> Option<Via> {
        Some(Via {
            relative_port: self.relative_port,
            all_tg_pt,
        })
    }

    /// Tells which initiator port a nexus belongs to.
    pub fn name(&mut self, nexus: Nexus, port: &str) {
        self.names.insert(nexus, port.to_owned());
    }

    /// The initiator port a nexus was named with, if it was.
    pub fn named(&self, n: Nexus) -> Option<&str> {
        self.names.get(&n).map(String::as_str)
    }

    fn port(&self, n: Nexus) -> String {
        self.names
            .get(&n)
            .cloned()
            .unwrap_or_else(|| fallback_name(n))
    }

    /// Nexuses currently known for an initiator port.
    pub fn nexuses_of(&self, port: &str) -> Vec<Nexus> {
        let mut v: Vec<Nexus> = self
            .names
            .iter()
            .filter(|(_, p)| p.eq_ignore_ascii_case(port))
            .map(|(n, _)| *n)
            .collect();
        if let Some(id) = port
            .strip_prefix("nexus.")
            .and_then(|s| s.parse::<u64>().ok())
        {
            v.push(Nexus(id));
        }
        v
    }

    fn registration(&self, port: &str) -> Option<&Registrant> {
        self.registrants
            .iter()
            .find(|r| r.port.eq_ignore_ascii_case(port))
    }

    fn is_holder(&self, port: &str) -> bool {
        match &self.reservation {
            Some((_, k)) if all_registrants(*k) => self.registration(port).is_some(),
            Some((h, _)) => h.eq_ignore_ascii_case(port),
            None => false,
        }
    }

    /// Whether any persistent reservation state exists.
    fn persistent_active(&self) -> bool {
        !self.registrants.is_empty() || self.reservation.is_some()
    }

    /// Releases an SPC-2 reservation on I_T nexus loss or a reset.
    pub fn nexus_lost(&mut self, nexus: Nexus) {
        if self.legacy == Some(nexus) {
            self.legacy = None;
        }
    }

    /// LOGICAL UNIT RESET and target resets: SPC-2 reservations go, persistent ones stay.
    pub fn reset(&mut self) {
        self.legacy = None;
    }

    /// Whether a command from `nexus` that meets reservations as `access` says must end
    /// in RESERVATION CONFLICT.
    pub fn check(&self, nexus: Nexus, access: Access) -> Result<(), Fail> {
        if let Some(holder) = self.legacy {
            if holder != nexus {
                return match access {
                    Access::Always | Access::Release => Ok(()),
                    _ => Err(Fail::Conflict),
                };
            }
        }
        match access {
            Access::Always | Access::Unreserved => return Ok(()),
            Access::Reserve | Access::Release => {
                return if self.persistent_active() {
                    Err(Fail::Conflict)
                } else {
                    Ok(())
                };
            }
            Access::Read | Access::Write => {}
        }
        let Some((_, kind)) = &self.reservation else {
            return Ok(());
        };
        let port = self.port(nexus);
        if self.is_holder(&port) || (registrants_only(*kind) && self.registration(&port).is_some())
        {
            return Ok(());
        }
        let exclusive_access = matches!(
            *kind,
            kind::EXCLUSIVE_ACCESS | kind::EXCLUSIVE_ACCESS_RO | kind::EXCLUSIVE_ACCESS_AR
        );
        match access {
            Access::Read if !exclusive_access => Ok(()),
            _ => Err(Fail::Conflict),
        }
    }

    /// RESERVE(6) and RESERVE(10).
    pub fn reserve(&mut self, nexus: Nexus, cdb: &[u8]) -> Result<(), Fail> {
        // Third-party and extent reservations are gone from SPC; only the LU as a whole.
        if cdb[1] & 0x13 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, None).into());
        }
        match self.legacy {
            Some(h) if h != nexus => Err(Fail::Conflict),
            _ => {
                self.legacy = Some(nexus);
                Ok(())
            }
        }
    }

    /// RELEASE(6) and RELEASE(10): releasing what another nexus holds does nothing.
    pub fn release(&mut self, nexus: Nexus, cdb: &[u8]) -> Result<(), Fail> {
        if cdb[1] & 0x13 != 0 {
            return Err(Sense::invalid_field_in_cdb(1, None).into());
        }
        if self.legacy == Some(nexus) {
            self.legacy = None;
        }
        Ok(())
    }

    /// PERSISTENT RESERVE IN.
    pub fn persistent_in(&self, cdb: &[u8], ptpl_capable: bool) -> Result<Vec<u8>, Fail> {
        let sa = cdb[1] & 0x1f;
        let alloc = be16(&cdb[7..9]) as usize;
        let mut d = self.generation.to_be_bytes().to_vec();
        match sa {
            SA_READ_KEYS => {
                d.extend_from_slice(&((self.registrants.len() * 8) as u32).to_be_bytes());
                for r in &self.registrants {
                    d.extend_from_slice(&r.key.to_be_bytes());
                }
            }
            SA_READ_RESERVATION => match &self.reservation {
                None => d.extend_from_slice(&0u32.to_be_bytes()),
                Some((holder, kind)) => {
                    d.extend_from_slice(&16u32.to_be_bytes());
                    let key = if all_registrants(*kind) {
                        0
                    } else {
                        self.registration(holder).map_or(0, |r| r.key)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, *kind & 0x0f, 0, 0]);
                }
            },
            SA_REPORT_CAPABILITIES => {
                d = vec![0, 8];
                // CRH (RESERVE/RELEASE answered as SPC-5 5.14.3 says), ATP_C, PTPL_C.
                d.push(0x10 | 0x04 | if ptpl_capable { 0x01 } else { 0 });
                // TMV, ALLOW COMMANDS 001b, PTPL_A.
                d.push(0x80 | 0x10 | if self.aptpl { 0x01 } else { 0 });
                // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; EX_AC_AR.
                d.extend_from_slice(&[0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0, 0]);
            }
            SA_READ_FULL_STATUS => {
                let mut body = Vec::new();
                for r in &self.registrants {
                    body.extend_from_slice(&r.key.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    let (holder, kind) = match &self.reservation {
                        Some((_, k)) if self.is_holder(&r.port) => (true, *k),
                        _ => (false, 0),
                    };
                    // Where it registered: ALL_TG_PT as it asked, and the relative
                    // identifier of the target port it came through (the gateway's, in a
                    // gateway group). A registration of an older version recorded
                    // neither: ALL_TG_PT set, as it reported then.
                    let (all, rtp) = match r.via {
                        Some(v) => (v.all_tg_pt, v.relative_port),
                        None => (true, self.relative_port),
                    };
                    body.push(if all { 0x02 } else { 0 } | u8::from(holder));
                    body.push(kind & 0x0f);
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&rtp.to_be_bytes());
                    let tid = transport_id(&r.port);
                    body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    body.extend(tid);
                }
                d.extend_from_slice(&(body.len() as u32).to_be_bytes());
                d.extend(body);
            }
            _ => return Err(Sense::invalid_field_in_cdb(1, Some(4)).into()),
        }
        Ok(truncate(d, alloc))
    }

    /// PERSISTENT RESERVE OUT. Returns the unit attentions to raise and, for PREEMPT AND
    /// ABORT, the initiator ports whose tasks are to be aborted: those whose
    /// registrations it removed. `admits` says whether an initiator (by iSCSI name) may
    /// reach this logical unit at all: a reservation is moved only to one that may
    /// (REGISTER AND MOVE).
    pub fn persistent_out(
        &mut self,
        nexus: Nexus,
        cdb: &[u8],
        data: &[u8],
        ptpl_capable: bool,
        admits: &dyn Fn(&str) -> bool,
    ) -> Result<Event, Fail> {
        let notices = self.persistent_out_notices(nexus, cdb, data, ptpl_capable, admits)?;
        let abort = if cdb[1] & 0x1f == SA_PREEMPT_AND_ABORT {
            notices
                .iter()
                .filter(|(_, s)| *s == sense::REGISTRATIONS_PREEMPTED)
                .map(|(p, _)| p.clone())
                .collect()
        } else {
            Vec::new()
        };
        Ok(Event { notices, abort })
    }

    fn persistent_out_notices(
        &mut self,
        nexus: Nexus,
        cdb: &[u8],
        data: &[u8],
        ptpl_capable: bool,
        admits: &dyn Fn(&str) -> bool,
    ) -> Result<Notices, Fail> {
        let sa = cdb[1] & 0x1f;
        let scope = cdb[2] >> 4;
        let kind = cdb[2] & 0x0f;
        let len = be32(&cdb[5..9]) as usize;
        if sa > SA_REGISTER_AND_MOVE {
            return Err(Sense::invalid_field_in_cdb(1, Some(4)).into());
        }
        if len < 24 || (sa != SA_REGISTER_AND_MOVE && len != 24) {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR.into());
        }
        let p = data.get(..len).ok_or(sense::PARAMETER_LIST_LENGTH_ERROR)?;
        let key = be64(&p[0..8]);
        let sa_key = be64(&p[8..16]);
        let port = self.port(nexus);
        if sa == SA_REGISTER_AND_MOVE {
            return self.register_and_move(
                &port,
                key,
                sa_key,
                kind,
                scope,
                p,
                ptpl_capable,
                admits,
            );
        }
        let flags = p[20];
        let spec_i_pt = flags & 0x08 != 0;
        let all_tg_pt = flags & 0x04 != 0;
        let aptpl = flags & 0x01 != 0;
        if spec_i_pt {
            // Registering other initiator ports in one go is not offered (SIP_C clear).
            return Err(Sense::invalid_field_in_parameter_list(20, Some(3)).into());
        }
        if aptpl && !ptpl_capable {
            return Err(Sense::invalid_field_in_parameter_list(20, Some(0)).into());
        }
        let mine = self.registration(&port).map(|r| r.key);
        match sa {
            SA_REGISTER | SA_REGISTER_AND_IGNORE => {
                if sa == SA_REGISTER && mine.unwrap_or(0) != key {
                    return Err(Fail::Conflict);
                }
                let mut notices = Vec::new();
                if sa_key == 0 {
                    if mine.is_some() {
                        notices = self.unregister(&port);
                        self.generation = self.generation.wrapping_add(1);
                    }
                } else {
                    match self
                        .registrants
                        .iter_mut()
                        .find(|r| r.port.eq_ignore_ascii_case(&port))
                    {
                        Some(r) => r.key = sa_key,
                        // A new key for a registration keeps where it was made (ALL_TG_PT
                        // is ignored then: the registration exists).
                        None => self.registrants.push(Registrant {
                            port: port.clone(),
                            key: sa_key,
                            via: self.here(all_tg_pt),
                        }),
                    }
                    self.generation = self.generation.wrapping_add(1);
                }
                self.aptpl = aptpl;
                Ok(notices)
            }
            _ => {
                if mine != Some(key) {
                    return Err(Fail::Conflict);
                }
                if matches!(sa, SA_RESERVE | SA_PREEMPT | SA_PREEMPT_AND_ABORT)
                    || (sa == SA_RELEASE && self.is_holder(&port))
                {
                    if scope != 0 {
                        return Err(Sense::invalid_field_in_cdb(2, Some(7)).into());
                    }
                    if !valid_kind(kind) {
                        return Err(Sense::invalid_field_in_cdb(2, Some(3)).into());
                    }
                }
                match sa {
                    SA_RESERVE => self.reserve_persistent(&port, kind),
                    SA_RELEASE => self.release_persistent(&port, kind),
                    SA_CLEAR => {
                        let notices = self
                            .registrants
                            .iter()
                            .filter(|r| !r.port.eq_ignore_ascii_case(&port))
                            .map(|r| (r.port.clone(), sense::RESERVATIONS_PREEMPTED))
                            .collect();
                        self.registrants.clear();
                        self.reservation = None;
                        self.generation = self.generation.wrapping_add(1);
                        Ok(notices)
                    }
                    _ => self.preempt(&port, sa_key, kind),
                }
            }
        }
    }

    /// Removes a registration, and the reservation with it where SPC-5 5.14.11.2.3 says.
    fn unregister(&mut self, port: &str) -> Notices {
        self.registrants
            .retain(|r| !r.port.eq_ignore_ascii_case(port));
        let mut notices = Vec::new();
        if let Some((holder, kind)) = self.reservation.clone() {
            let released = if all_registrants(kind) {
                self.registrants.is_empty()
            } else {
                holder.eq_ignore_ascii_case(port)
            };
            if released {
                self.reservation = None;
                if registrants_only(kind) {
                    notices = self
                        .registrants
                        .iter()
                        .map(|r| (r.port.clone(), sense::RESERVATIONS_RELEASED))
                        .collect();
                }
            }
        }
        notices
    }

    fn reserve_persistent(&mut self, port: &str, kind: u8) -> Result<Notices, Fail> {
        match &self.reservation {
            None => {
                let holder = if all_registrants(kind) {
                    String::new()
                } else {
                    port.to_owned()
                };
                self.reservation = Some((holder, kind));
                Ok(Vec::new())
            }
            Some((_, k)) if *k == kind && self.is_holder(port) => Ok(Vec::new()),
            Some(_) => Err(Fail::Conflict),
        }
    }

    fn release_persistent(&mut self, port: &str, kind: u8) -> Result<Notices, Fail> {
        let Some((_, held)) = self.reservation.clone() else {
            return Ok(Vec::new());
        };
        if !self.is_holder(port) {
            return Ok(Vec::new());
        }
        if held != kind {
            return Err(sense::INVALID_RELEASE_OF_PERSISTENT_RESERVATION.into());
        }
        self.reservation = None;
        if registrants_only(kind) {
            return Ok(self
                .registrants
                .iter()
                .filter(|r| !r.port.eq_ignore_ascii_case(port))
                .map(|r| (r.port.clone(), sense::RESERVATIONS_RELEASED))
                .collect());
        }
        Ok(Vec::new())
    }

    fn preempt(&mut self, port: &str, sa_key: u64, kind: u8) -> Result<Notices, Fail> {
        let mut notices = Vec::new();
        let mut remove = |regs: &mut Vec<Registrant>, pred: &dyn Fn(&Registrant) -> bool| {
            let before = regs.len();
            regs.retain(|r| {
                let gone = pred(r) && !r.port.eq_ignore_ascii_case(port);
                if gone {
                    notices.push((r.port.clone(), sense::REGISTRATIONS_PREEMPTED));
                }
                !gone
            });
            before != regs.len()
        };
        match self.reservation.clone() {
            Some((_, held)) if all_registrants(held) => {
                if sa_key == 0 {
                    remove(&mut self.registrants, &|_| true);
                    self.reservation = Some((port.to_owned(), kind));
                    if all_registrants(kind) {
                        self.reservation = Some((String::new(), kind));
                    }
                } else if !remove(&mut self.registrants, &|r| r.key == sa_key) {
                    return Err(Fail::Conflict);
                }
            }
            Some((holder, _)) => {
                let holder_key = self.registration(&holder).map(|r| r.key);
                if holder_key == Some(sa_key) {
                    remove(&mut self.registrants, &|r| r.key == sa_key);
                    let holder_name = if all_registrants(kind) {
                        String::new()
                    } else {
                        port.to_owned()
                    };
                    self.reservation = Some((holder_name, kind));
                } else if sa_key == 0 {
                    return Err(Sense::invalid_field_in_parameter_list(8, None).into());
                } else if !remove(&mut self.registrants, &|r| r.key == sa_key) {
                    return Err(Fail::Conflict);
                }
            }
            None => {
                if sa_key == 0 {
                    return Err(Sense::invalid_field_in_parameter_list(8, None).into());
                }
                if !remove(&mut self.registrants, &|r| r.key == sa_key) {
                    return Err(Fail::Conflict);
                }
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(notices)
    }

    #[allow(clippy::too_many_arguments)]
    fn register_and_move(
        &mut self,
        port: &str,
        key: u64,
        sa_key: u64,
        kind: u8,
        scope: u8,
        p: &[u8],
        ptpl_capable: bool,
        admits: &dyn Fn(&str) -> bool,
    ) -> Result<Notices, Fail> {
        let Some((holder, held)) = self.reservation.clone() else {
            return Err(Fail::Conflict);
        };
        if self.registration(port).map(|r| r.key) != Some(key) {
            return Err(Fail::Conflict);
        }
        if all_registrants(held) || !holder.eq_ignore_ascii_case(port) {
            return Err(Fail::Conflict);
        }
        if scope != 0 {
            return Err(Sense::invalid_field_in_cdb(2, Some(7)).into());
        }
        if !valid_kind(kind) {
            return Err(Sense::invalid_field_in_cdb(2, Some(3)).into());
        }
        if sa_key == 0 {
            return Err(Sense::invalid_field_in_parameter_list(8, None).into());
        }
        let unreg = p[17] & 0x02 != 0;
        let aptpl = p[17] & 0x01 != 0;
        if aptpl && !ptpl_capable {
            return Err(Sense::invalid_field_in_parameter_list(17, Some(0)).into());
        }
        // The destination I_T nexus's target port: one of this logical unit's (here or
        // another gateway's); any other value is taken as this one, where the command
        // came (initiators that leave the field zero mean the port they use).
        let asked = be16(&p[18..20]);
        let dest_port = if asked == self.relative_port || self.peer_ports.contains(&asked) {
            asked
        } else {
            self.relative_port
        };
        let tid_len = be32(&p[20..24]) as usize;
        let tid = p
            .get(24..24 + tid_len)
            .ok_or(sense::PARAMETER_LIST_LENGTH_ERROR)?;
        let dest = parse_transport_id(tid)
            .ok_or_else(|| Sense::invalid_field_in_parameter_list(24, None))?;
        // A destination that may not reach this LU (not admitted to the target, or masked
        // from the LU) could never use or release what it is given; it is refused as LIO
        // refuses a destination without an ACL mapping the LUN.
        if dest.eq_ignore_ascii_case(port) || !admits(initiator_name(&dest)) {
            return Err(Sense::invalid_field_in_parameter_list(24, None).into());
        }
        match self
            .registrants
            .iter_mut()
            .find(|r| r.port.eq_ignore_ascii_case(&dest))
        {
            Some(r) => r.key = sa_key,
            None => self.registrants.push(Registrant {
                port: dest.clone(),
                key: sa_key,
                via: Some(Via {
                    relative_port: dest_port,
                    all_tg_pt: false,
                }),
            }),
        }
        self.reservation = Some((dest, kind));
        if unreg {
            self.registrants
                .retain(|r| !r.port.eq_ignore_ascii_case(port));
        }
        self.aptpl = aptpl;
        self.generation = self.generation.wrapping_add(1);
        Ok(Vec::new())
    }

    /// Whether the state is to be kept across power loss.
    pub fn aptpl(&self) -> bool {
        self.aptpl
    }

    /// The persistent part of the state as text, one item a line.
    pub fn save(&self) -> String {
        let mut s = String::from("reservoir-pr 1\n");
        let _ = writeln!(s, "generation {}", self.generation);
        for r in &self.registrants {
            let _ = writeln!(s, "key {:016x} {}", r.key, r.port);
            if let Some(v) = r.via {
                // Its own line, after the key's: an older version refuses the state
                // (unknown line) rather than taking it wrong.
                let _ = writeln!(s, "via {} {}", v.relative_port, u8::from(v.all_tg_pt));
            }
        }
        if let Some((holder, kind)) = &self.reservation {
            let _ = writeln!(s, "reservation {kind} {holder}");
        }
        s
    }

    /// The whole persistent state, APTPL included, for a cluster that keeps it for every
    /// target exporting the logical unit (whatever APTPL says: the cluster's copy is the
    /// one every target works from). [`Reservations::load`] reads it back.
    pub fn save_shared(&self) -> String {
        let mut s = self.save();
        let _ = writeln!(s, "aptpl {}", u8::from(self.aptpl));
        s
    }

    /// Takes the persistent state another target wrote to the cluster
    /// ([`Reservations::save_shared`]; empty: none yet) as this one's, keeping what is
    /// this target's own: the names of its nexuses and SPC-2 reservations. False, and
    /// nothing changed, when the bytes are not such a state.
    pub fn adopt(&mut self, state: &[u8]) -> bool {
        let loaded = if state.is_empty() {
            Some(Reservations::default())
        } else {
            std::str::from_utf8(state).ok().and_then(Reservations::load)
        };
        let Some(l) = loaded else { return false };
        self.generation = l.generation;
        self.registrants = l.registrants;
        self.reservation = l.reservation;
        self.aptpl = l.aptpl;
        true
    }

    /// The state [`Reservations::save`] wrote; `None` if the text is not such a state.
    pub fn load(text: &str) -> Option<Reservations> {
        let mut lines = text.lines();
        if lines.next()? != "reservoir-pr 1" {
            return None;
        }
        let mut r = Reservations {
            aptpl: true,
            ..Default::default()
        };
        for line in lines {
            let mut f = line.splitn(3, ' ');
            match (f.next()?, f.next(), f.next()) {
                ("generation", Some(g), None) => r.generation = g.parse().ok()?,
                ("aptpl", Some(a), None) => r.aptpl = a == "1",
                ("key", Some(k), Some(port)) => r.registrants.push(Registrant {
                    key: u64::from_str_radix(k, 16).ok()?,
                    port: port.to_owned(),
                    via: None,
                }),
                ("via", Some(rtp), Some(all)) => {
                    let last = r.registrants.last_mut()?;
                    last.via = Some(Via {
                        relative_port: rtp.parse().ok()?,
                        all_tg_pt: match all {
                            "0" => false,
                            "1" => true,
                            _ => return None,
                        },
                    });
                }
                ("reservation", Some(k), holder) => {
                    let kind: u8 = k.parse().ok()?;
                    if !valid_kind(kind) {
                        return None;
                    }
                    r.reservation = Some((holder.unwrap_or("").to_owned(), kind));
                }
                _ => return None,
            }
        }
        Some(r)
    }
}

/// A change's [`Event`] for the other targets, one item a line: `ua KEY ASC ASCQ PORT`
/// (hex) for a unit attention, `abort PORT` for an initiator port whose tasks are to be
/// aborted. A target that does not know a kind of line skips it.
pub fn encode_notices(event: &Event) -> Vec<u8> {
    let mut s = String::new();
    for (port, sense) in &event.notices {
        let _ = writeln!(
            s,
            "ua {:02x} {:02x} {:02x} {port}",
            sense.key, sense.asc, sense.ascq
        );
    }
    for port in &event.abort {
        let _ = writeln!(s, "abort {port}");
    }
    s.into_bytes()
}

/// Whether `port` could be an initiator port name: an iSCSI name (at most 223 bytes, no
/// white space or control characters, RFC 3722) with ",i,0x" and the ISID, or a nexus's
/// fallback name.
fn plausible_port(port: &str) -> bool {
    !port.is_empty()
        && port.len() <= 256
        && !port.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// What [`encode_notices`] wrote. Only the unit attentions reservations raise are taken:
/// the bytes come from another target through the cluster, and a line that is not one of
/// them is skipped rather than queued for an initiator; so is a line whose port could not
/// be an initiator port's name.
pub fn decode_notices(bytes: &[u8]) -> Event {
    let text = String::from_utf8_lossy(bytes);
    let mut event = Event::default();
    for line in text.lines() {
        if let Some(port) = line.strip_prefix("abort ") {
            if plausible_port(port) {
                event.abort.push(port.to_owned());
            }
            continue;
        }
        let notice = (|| {
            let mut f = line.splitn(5, ' ');
            if f.next()? != "ua" {
                return None;
            }
            let mut byte = || u8::from_str_radix(f.next()?, 16).ok();
            let (key, asc, ascq) = (byte()?, byte()?, byte()?);
            let port = f.next().filter(|p| plausible_port(p))?.to_owned();
            let s = Sense::new(key, asc, ascq);
            [
                sense::RESERVATIONS_PREEMPTED,
                sense::RESERVATIONS_RELEASED,
                sense::REGISTRATIONS_PREEMPTED,
            ]
            .contains(&s)
            .then_some((port, s))
        })();
        event.notices.extend(notice);
    }
    event
}

/// The iSCSI name of an initiator port name ("name,i,0x<isid>", or the name alone).
fn initiator_name(port: &str) -> &str {
    port.split(",i,0x").next().unwrap_or(port)
}

/// iSCSI transport ID, format 01b: "name,i,0x<isid>" (SPC-5 7.6.4.6).
fn transport_id(port: &str) -> Vec<u8> {
    let mut name = port.as_bytes().to_vec();
    name.push(0);
    name.resize(name.len().div_ceil(4).max(5) * 4, 0);
    let format = if port.contains(",i,0x") { 0x40 } else { 0x00 };
    let mut t = vec![format | PROTOCOL_ISCSI, 0];
    t.extend_from_slice(&(name.len() as u16).to_be_bytes());
    t.extend(name);
    t
}

fn parse_transport_id(t: &[u8]) -> Option<String> {
    if t.len() < 4 || t[0] & 0x0f != PROTOCOL_ISCSI {
        return None;
    }
    let len = be16(&t[2..4]) as usize;
    let raw = t.get(4..4 + len)?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let name = std::str::from_utf8(&raw[..end]).ok()?;
    if name.is_empty() {
        return None;
    }
    Some(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opcodes::*;

    const A: Nexus = Nexus(1);
    const B: Nexus = Nexus(2);

    fn prout(sa: u8, kind: u8, key: u64, sa_key: u64, flags: u8) -> ([u8; 10], Vec<u8>) {
        let mut cdb = [0u8; 10];
        cdb[0] = PERSISTENT_RESERVE_OUT;
        cdb[1] = sa;
        cdb[2] = kind;
        cdb[5..9].copy_from_slice(&24u32.to_be_bytes());
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        p[20] = flags;
        (cdb, p)
    }

    fn out(
        r: &mut Reservations,
        n: Nexus,
        sa: u8,
        kind: u8,
        key: u64,
        sa_key: u64,
    ) -> Result<Notices, Fail> {
        let (cdb, p) = prout(sa, kind, key, sa_key, 0);
        r.persistent_out(n, &cdb, &p, true, &|_| true)
            .map(|e| e.notices)
    }

    fn keys(r: &Reservations) -> Vec<u64> {
        let cdb = [
            PERSISTENT_RESERVE_IN,
            SA_READ_KEYS,
            0,
            0,
            0,
            0,
            0,
            0x40,
            0,
            0,
        ];
        let d = r.persistent_in(&cdb, true).unwrap();
        d[8..].chunks(8).map(be64).collect()
    }

    fn setup() -> Reservations {
        let mut r = Reservations::default();
        r.set_ports(1, &[2]);
        r.name(A, "iqn.2000-01.a,i,0x000000000001");
        r.name(B, "iqn.2000-01.b,i,0x000000000001");
        r
    }

    #[test]
    fn register_needs_the_current_key() {
        let mut r = setup();
        assert_eq!(out(&mut r, A, SA_REGISTER, 0, 5, 10), Err(Fail::Conflict));
        out(&mut r, A, SA_REGISTER, 0, 0, 10).unwrap();
        assert_eq!(out(&mut r, A, SA_REGISTER, 0, 11, 12), Err(Fail::Conflict));
        out(&mut r, A, SA_REGISTER, 0, 10, 12).unwrap();
        out(&mut r, B, SA_REGISTER_AND_IGNORE, 0, 99, 20).unwrap();
        assert_eq!(keys(&r), vec![12, 20]);
        out(&mut r, A, SA_REGISTER, 0, 12, 0).unwrap();
        assert_eq!(keys(&r), vec![20]);
        assert_eq!(r.generation, 4);
    }

    #[test]
    fn access_by_type() {
        // (type, registered B reads, registered B writes, unregistered reads, writes)
        let table = [
            (kind::EXCLUSIVE_ACCESS, false, false, false, false),
            (kind::WRITE_EXCLUSIVE, true, false, true, false),
            (kind::EXCLUSIVE_ACCESS_RO, true, true, false, false),
            (kind::WRITE_EXCLUSIVE_RO, true, true, true, false),
            (kind::EXCLUSIVE_ACCESS_AR, true, true, false, false),
            (kind::WRITE_EXCLUSIVE_AR, true, true, true, false),
        ];
        for (k, rr, rw, ur, uw) in table {
            let mut r = setup();
            out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
            out(&mut r, B, SA_REGISTER, 0, 0, 2).unwrap();
            out(&mut r, A, SA_RESERVE, k, 1, 0).unwrap();
            assert!(r.check(A, Access::Read).is_ok() && r.check(A, Access::Write).is_ok());
            assert_eq!(r.check(B, Access::Read).is_ok(), rr, "type {k}");
            assert_eq!(r.check(B, Access::Write).is_ok(), rw, "type {k}");
            out(&mut r, B, SA_REGISTER, 0, 2, 0).unwrap();
            assert_eq!(r.check(B, Access::Read).is_ok(), ur, "type {k}");
            assert_eq!(r.check(B, Access::Write).is_ok(), uw, "type {k}");
            out(&mut r, A, SA_RELEASE, k, 1, 0).unwrap();
            assert!(r.check(B, Access::Write).is_ok());
        }
    }

    #[test]
    fn reserve_conflicts_and_release_type_mismatch() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, B, SA_REGISTER, 0, 0, 2).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        assert_eq!(
            out(&mut r, B, SA_RESERVE, kind::WRITE_EXCLUSIVE, 2, 0),
            Err(Fail::Conflict)
        );
        assert_eq!(
            out(&mut r, A, SA_RELEASE, kind::EXCLUSIVE_ACCESS, 1, 0),
            Err(Fail::Check(
                sense::INVALID_RELEASE_OF_PERSISTENT_RESERVATION
            ))
        );
        // A non-holder's release does nothing.
        out(&mut r, B, SA_RELEASE, kind::WRITE_EXCLUSIVE, 2, 0).unwrap();
        assert!(r.reservation.is_some());
        assert_eq!(
            out(&mut r, A, SA_RESERVE, 2, 1, 0),
            Err(Fail::Check(Sense::invalid_field_in_cdb(2, Some(3))))
        );
    }

    #[test]
    fn preempt_removes_registrations_and_takes_reservation() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, B, SA_REGISTER, 0, 0, 2).unwrap();
        let g = r.generation;
        // No reservation: only the registration goes.
        let n = out(&mut r, B, SA_PREEMPT, kind::EXCLUSIVE_ACCESS, 2, 1).unwrap();
        assert_eq!(keys(&r), vec![2]);
        assert_eq!(r.generation, g + 1);
        assert_eq!(n, vec![(r.port(A), sense::REGISTRATIONS_PREEMPTED)]);
        assert!(r.reservation.is_none());
        // Unknown key: conflict.
        assert_eq!(
            out(&mut r, B, SA_PREEMPT, kind::EXCLUSIVE_ACCESS, 2, 77),
            Err(Fail::Conflict)
        );
        // Preempting the holder moves the reservation.
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        out(
            &mut r,
            B,
            SA_PREEMPT_AND_ABORT,
            kind::EXCLUSIVE_ACCESS,
            2,
            1,
        )
        .unwrap();
        assert!(r.is_holder(&r.port(B)));
        assert_eq!(r.check(A, Access::Read), Err(Fail::Conflict));
    }

    #[test]
    fn preempt_and_abort_names_the_preempted_ports() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, B, SA_REGISTER, 0, 0, 2).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        // PREEMPT alone aborts nothing.
        let (cdb, p) = prout(SA_PREEMPT, kind::WRITE_EXCLUSIVE, 2, 1, 0);
        let e = r.persistent_out(B, &cdb, &p, true, &|_| true).unwrap();
        assert!(e.abort.is_empty());
        assert_eq!(e.notices, vec![(r.port(A), sense::REGISTRATIONS_PREEMPTED)]);
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        // PREEMPT AND ABORT: the preempted port's tasks, not the preempting one's.
        let (cdb, p) = prout(SA_PREEMPT_AND_ABORT, kind::EXCLUSIVE_ACCESS, 2, 1, 0);
        let e = r.persistent_out(B, &cdb, &p, true, &|_| true).unwrap();
        assert_eq!(e.abort, vec![r.port(A)]);
        assert_eq!(r.check(A, Access::Write), Err(Fail::Conflict));
        // A refused one aborts nothing (and changes nothing).
        let (cdb, p) = prout(SA_PREEMPT_AND_ABORT, kind::EXCLUSIVE_ACCESS, 2, 77, 0);
        assert_eq!(
            r.persistent_out(B, &cdb, &p, true, &|_| true),
            Err(Fail::Conflict)
        );
        // Its own key: nobody else is preempted, nothing aborted.
        let (cdb, p) = prout(SA_PREEMPT_AND_ABORT, kind::EXCLUSIVE_ACCESS, 2, 2, 0);
        let e = r.persistent_out(B, &cdb, &p, true, &|_| true).unwrap();
        assert!(e.abort.is_empty());
    }

    #[test]
    fn clear_and_all_registrants() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, B, SA_REGISTER, 0, 0, 2).unwrap();
        out(&mut r, A, SA_RESERVE, kind::EXCLUSIVE_ACCESS_AR, 1, 0).unwrap();
        assert!(r.is_holder(&r.port(B)));
        let cdb = [
            PERSISTENT_RESERVE_IN,
            SA_READ_RESERVATION,
            0,
            0,
            0,
            0,
            0,
            0,
            64,
            0,
        ];
        let d = r.persistent_in(&cdb, true).unwrap();
        assert_eq!((be64(&d[8..16]), d[21]), (0, kind::EXCLUSIVE_ACCESS_AR));
        let n = out(&mut r, B, SA_CLEAR, 0, 2, 0).unwrap();
        assert_eq!(n, vec![(r.port(A), sense::RESERVATIONS_PREEMPTED)]);
        assert!(keys(&r).is_empty());
        assert!(r.reservation.is_none());
    }

    #[test]
    fn spc2_reservations() {
        let mut r = setup();
        let res6 = [RESERVE_6, 0, 0, 0, 0, 0];
        let rel6 = [RELEASE_6, 0, 0, 0, 0, 0];
        r.reserve(A, &res6).unwrap();
        r.reserve(A, &res6).unwrap();
        assert_eq!(r.check(B, Access::Reserve), Err(Fail::Conflict));
        assert_eq!(r.reserve(B, &res6), Err(Fail::Conflict));
        r.check(B, Access::Release).unwrap();
        r.release(B, &rel6).unwrap();
        assert_eq!(r.check(B, Access::Read), Err(Fail::Conflict));
        r.nexus_lost(A);
        r.check(B, Access::Read).unwrap();
        r.reserve(B, &res6).unwrap();
        r.reset();
        r.check(A, Access::Write).unwrap();
        // With registrations present, RESERVE conflicts.
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        assert_eq!(r.check(B, Access::Reserve), Err(Fail::Conflict));
    }

    #[test]
    fn register_and_move() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        let tid = transport_id(&r.port(B));
        let mut cdb = [0u8; 10];
        cdb[0] = PERSISTENT_RESERVE_OUT;
        cdb[1] = SA_REGISTER_AND_MOVE;
        cdb[2] = kind::EXCLUSIVE_ACCESS;
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&1u64.to_be_bytes());
        p[8..16].copy_from_slice(&9u64.to_be_bytes());
        p[17] = 0x02; // UNREG
        p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
        p.extend(tid);
        cdb[5..9].copy_from_slice(&(p.len() as u32).to_be_bytes());
        // Not to an initiator the access rules keep from this LU: nothing changes.
        let b_name = r.port(B).split(",i,0x").next().unwrap().to_owned();
        let elsewhere = |name: &str| !name.eq_ignore_ascii_case(&b_name);
        assert!(matches!(
            r.persistent_out(A, &cdb, &p, true, &elsewhere),
            Err(Fail::Check(s)) if s == Sense::invalid_field_in_parameter_list(24, None)
        ));
        assert!(r.is_holder(&r.port(A)));
        r.persistent_out(A, &cdb, &p, true, &|_| true).unwrap();
        assert_eq!(keys(&r), vec![9]);
        assert!(r.is_holder(&r.port(B)));
        assert_eq!(r.check(A, Access::Read), Err(Fail::Conflict));
    }

    #[test]
    fn save_and_load() {
        let mut r = setup();
        let (cdb, p) = prout(SA_REGISTER, 0, 0, 0x1234, 0x01);
        r.persistent_out(A, &cdb, &p, true, &|_| true).unwrap();
        out(&mut r, A, SA_RESERVE, kind::EXCLUSIVE_ACCESS, 0x1234, 0).unwrap();
        assert!(r.aptpl());
        let mut back = Reservations::load(&r.save()).unwrap();
        assert_eq!(back.registrants, r.registrants);
        assert_eq!(back.reservation, r.reservation);
        assert_eq!(back.generation, r.generation);
        // After a restart the same initiator port arrives on a new nexus.
        back.name(Nexus(7), "iqn.2000-01.a,i,0x000000000001");
        back.check(Nexus(7), Access::Write).unwrap();
        assert_eq!(back.check(Nexus(8), Access::Read), Err(Fail::Conflict));
        assert!(Reservations::load("junk").is_none());
        // APTPL is refused where nothing can be kept.
        let (cdb, p) = prout(SA_REGISTER_AND_IGNORE, 0, 0, 1, 0x01);
        assert!(matches!(
            r.persistent_out(B, &cdb, &p, false, &|_| true),
            Err(Fail::Check(_))
        ));
    }

    #[test]
    fn shared_state_and_events() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        let (cdb, p) = prout(SA_REGISTER, 0, 1, 1, 0x00);
        r.persistent_out(A, &cdb, &p, true, &|_| true).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        // Another target: its own nexus numbers, the same initiator ports.
        let mut other = Reservations::default();
        other.name(Nexus(9), "iqn.2000-01.a,i,0x000000000001");
        other.name(Nexus(10), "iqn.2000-01.b,i,0x000000000001");
        assert!(other.adopt(r.save_shared().as_bytes()));
        assert!(!other.aptpl());
        other.check(Nexus(9), Access::Write).unwrap();
        assert_eq!(other.check(Nexus(10), Access::Write), Err(Fail::Conflict));
        assert_eq!(other.save_shared(), r.save_shared());
        // Empty: no state yet; junk changes nothing.
        assert!(!other.adopt(b"junk"));
        assert_eq!(other.check(Nexus(10), Access::Write), Err(Fail::Conflict));
        assert!(other.adopt(b""));
        other.check(Nexus(10), Access::Write).unwrap();
        let e = Event {
            notices: vec![
                (r.port(A), sense::REGISTRATIONS_PREEMPTED),
                (r.port(B), sense::RESERVATIONS_RELEASED),
            ],
            abort: vec![r.port(A)],
        };
        assert_eq!(decode_notices(&encode_notices(&e)), e);
        // Only reservations' unit attentions come through, and aborts of a port name.
        assert_eq!(
            decode_notices(b"ua 06 29 00 iqn.x\nua zz\n\xff\nabort \nabort a b\nabort"),
            Event::default()
        );
    }

    /// READ FULL STATUS per target port: where each registration was made, ALL_TG_PT as
    /// asked; the same from another gateway that adopted the state; kept across a save.
    #[test]
    fn full_status_names_the_port_registered_through() {
        let full = |r: &Reservations| {
            let cdb = [
                PERSISTENT_RESERVE_IN,
                SA_READ_FULL_STATUS,
                0,
                0,
                0,
                0,
                0,
                4,
                0,
                0,
            ];
            let d = r.persistent_in(&cdb, true).unwrap();
            let mut at = 8;
            let mut v = Vec::new();
            while at + 24 <= d.len() {
                let len = be32(&d[at + 20..at + 24]) as usize;
                let tid = parse_transport_id(&d[at + 24..at + 24 + len]).unwrap();
                v.push((tid, d[at + 12] & 0x02 != 0, be16(&d[at + 18..at + 20])));
                at += 24 + len;
            }
            v
        };
        // Gateway 1: A registers without ALL_TG_PT.
        let mut g1 = setup();
        out(&mut g1, A, SA_REGISTER, 0, 0, 1).unwrap();
        // Gateway 2 takes the state and B registers there, with ALL_TG_PT.
        let mut g2 = Reservations::default();
        g2.set_ports(2, &[1]);
        g2.name(B, "iqn.2000-01.b,i,0x000000000001");
        assert!(g2.adopt(g1.save_shared().as_bytes()));
        let (cdb, p) = prout(SA_REGISTER, 0, 0, 2, 0x04);
        g2.persistent_out(B, &cdb, &p, true, &|_| true).unwrap();
        assert!(g1.adopt(g2.save_shared().as_bytes()));
        let want = vec![
            ("iqn.2000-01.a,i,0x000000000001".to_owned(), false, 1),
            ("iqn.2000-01.b,i,0x000000000001".to_owned(), true, 2),
        ];
        assert_eq!(full(&g1), want);
        assert_eq!(full(&g2), want);
        // A new key keeps where the registration was made.
        let (cdb, p) = prout(SA_REGISTER, 0, 2, 3, 0x00);
        g2.persistent_out(B, &cdb, &p, true, &|_| true).unwrap();
        assert_eq!(full(&g2)[1], want[1]);
        // Kept by save and load (APTPL, a sidecar file), as by the cluster.
        assert_eq!(full(&Reservations::load(&g2.save()).unwrap())[..], want[..]);
        // A state from before: no `via` lines; reported with ALL_TG_PT as then.
        let old = "reservoir-pr 1\ngeneration 1\nkey 0000000000000001 iqn.x,i,0x000000000001\n";
        let mut o = Reservations::load(old).unwrap();
        o.set_ports(1, &[]);
        assert_eq!(
            full(&o),
            vec![("iqn.x,i,0x000000000001".to_owned(), true, 1)]
        );
        assert!(Reservations::load("reservoir-pr 1\nvia 1 1\n").is_none());
        assert!(Reservations::load(&format!("{old}via 1 2\n")).is_none());
    }

    #[test]
    fn report_capabilities_and_full_status() {
        let mut r = setup();
        out(&mut r, A, SA_REGISTER, 0, 0, 1).unwrap();
        out(&mut r, A, SA_RESERVE, kind::WRITE_EXCLUSIVE, 1, 0).unwrap();
        let cdb = [
            PERSISTENT_RESERVE_IN,
            SA_REPORT_CAPABILITIES,
            0,
            0,
            0,
            0,
            0,
            0,
            8,
            0,
        ];
        let d = r.persistent_in(&cdb, true).unwrap();
        assert_eq!(d.len(), 8);
        assert_eq!(be16(&d[0..2]), 8);
        assert_eq!(d[2] & 0x01, 1);
        assert_eq!(be16(&d[4..6]), 0xea01);
        let cdb = [
            PERSISTENT_RESERVE_IN,
            SA_READ_FULL_STATUS,
            0,
            0,
            0,
            0,
            0,
            1,
            0,
            0,
        ];
        let d = r.persistent_in(&cdb, true).unwrap();
        assert_eq!(be64(&d[8..16]), 1);
        // The holder, registered without ALL_TG_PT, through relative port 1.
        assert_eq!(d[20], 0x01);
        assert_eq!(d[21], kind::WRITE_EXCLUSIVE);
        assert_eq!(be16(&d[26..28]), 1);
        let tid = &d[32..];
        assert_eq!(parse_transport_id(tid).unwrap(), r.port(A));
        let bad = [PERSISTENT_RESERVE_IN, 9, 0, 0, 0, 0, 0, 1, 0, 0];
        assert!(r.persistent_in(&bad, true).is_err());
    }
}
