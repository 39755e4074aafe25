//! A session that follows a gateway group: several portals of one target (gateways
//! exporting the same logical unit), the ALUA state of each, which one carries the I/O,
//! and when to move. Sans-IO: the session (`session/recovery.rs`) feeds it what it saw
//! (a login, a lost connection, a login that failed, an ALUA sense, a REPORT TARGET PORT
//! GROUPS answer) and does what it answers.
//!
//! The rules, and why:
//! - A path carries I/O only if its target port group is active/optimized, then
//!   active/non-optimized (or LBA dependent), or not known yet; standby, unavailable and
//!   offline never do (SPC-5 5.16.2: those states refuse media access). Transitioning is
//!   tried last: the target says it will come back, but another group may serve now.
//! - A lost connection is first reconnected to the same portal: a short network blip, or
//!   a gateway restarted at once, should not move the session. A login that fails there
//!   moves it to the best other path.
//! - An ALUA sense (NOT READY, ASYMMETRIC ACCESS STATE TRANSITION or TARGET PORT IN
//!   STANDBY/UNAVAILABLE STATE) moves it at once when a better path is known or untried.
//! - At login the group is chosen by REPORT TARGET PORT GROUPS and the path's own group
//!   (VPD page 83h): a path whose group is not active/optimized gives way to a path whose
//!   group is known to be better, or to one not yet tried; each path is tried once, so the
//!   choice ends.

use serde::Serialize;

/// An ALUA asymmetric access state (SPC-5 6.37, REPORT TARGET PORT GROUPS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AluaState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    LbaDependent,
    Offline,
    Transitioning,
    /// A code SPC-5 reserves; taken as unable to carry I/O.
    Reserved(u8),
}

impl AluaState {
    pub fn from_code(code: u8) -> AluaState {
        match code & 0x0f {
            0 => AluaState::ActiveOptimized,
            1 => AluaState::ActiveNonOptimized,
            2 => AluaState::Standby,
            3 => AluaState::Unavailable,
            4 => AluaState::LbaDependent,
            0xe => AluaState::Offline,
            0xf => AluaState::Transitioning,
            c => AluaState::Reserved(c),
        }
    }

    /// SPC-5's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active/optimized",
            AluaState::ActiveNonOptimized => "active/non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
            AluaState::LbaDependent => "LBA dependent",
            AluaState::Offline => "offline",
            AluaState::Transitioning => "transitioning",
            AluaState::Reserved(_) => "reserved",
        }
    }

    /// Rank of a path in this state, lower is better; `None` for a state that never
    /// carries I/O.
    fn rank(self) -> Option<u8> {
        match self {
            AluaState::ActiveOptimized => Some(0),
            AluaState::ActiveNonOptimized | AluaState::LbaDependent => Some(1),
            AluaState::Transitioning => Some(3),
            AluaState::Standby
            | AluaState::Unavailable
            | AluaState::Offline
            | AluaState::Reserved(_) => None,
        }
    }

    /// Whether a path in this state may carry reads and writes.
    pub fn carries_io(self) -> bool {
        matches!(self.rank(), Some(r) if r < 3)
    }
}

/// Rank of a path whose group's state is not known (never logged in, or a target with
/// no ALUA): after active ones, before transitioning ones.
const UNKNOWN_RANK: u8 = 2;

/// One target port group of a REPORT TARGET PORT GROUPS answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortGroup {
    pub id: u16,
    pub state: AluaState,
    pub preferred: bool,
    /// Relative target port identifiers.
    pub ports: Vec<u16>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RtpgError {
    #[error("REPORT TARGET PORT GROUPS data shorter than its header")]
    Short,
    #[error("REPORT TARGET PORT GROUPS descriptor {0} runs past the data")]
    Truncated(usize),
}

/// Decodes REPORT TARGET PORT GROUPS parameter data, in the length-only format (0) or
/// the extended header format (1, byte 4 = 10h). A descriptor cut off by the allocation
/// length or the data's end is an error, never a panic: this is network input.
pub fn parse_rtpg(data: &[u8]) -> Result<Vec<PortGroup>, RtpgError> {
    if data.len() < 4 {
        return Err(RtpgError::Short);
    }
    let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
    let mut at = 4;
    if data.len() >= 8 && data[4] & 0x70 == 0x10 {
        at = 8;
    }
    let end = 4usize.saturating_add(len).min(data.len());
    let mut out = Vec::new();
    while at + 8 <= end {
        let d = &data[at..];
        let count = usize::from(d[7]);
        let next = at + 8 + 4 * count;
        if next > end {
            return Err(RtpgError::Truncated(out.len()));
        }
        let ports = (0..count)
            .map(|i| u16::from_be_bytes([d[8 + 4 * i + 2], d[8 + 4 * i + 3]]))
            .collect();
        out.push(PortGroup {
            id: u16::from_be_bytes([d[2], d[3]]),
            state: AluaState::from_code(d[0]),
            preferred: d[0] & 0x80 != 0,
            ports,
        });
        at = next;
    }
    Ok(out)
}

/// The target port group designator (type 5) of a Device Identification VPD page (83h):
/// the group of the port the page came through.
pub fn vpd83_port_group(page: &[u8]) -> Option<u16> {
    let len = usize::from(u16::from_be_bytes([*page.get(2)?, *page.get(3)?]));
    let end = (4 + len).min(page.len());
    let mut at = 4;
    while at + 4 <= end {
        let d = &page[at..end];
        let dlen = usize::from(d[3]);
        // Association 01b (target port), type 5.
        if d[1] & 0x0f == 5 && (d[1] >> 4) & 3 == 1 && dlen >= 4 && d.len() >= 4 + dlen {
            return Some(u16::from_be_bytes([d[6], d[7]]));
        }
        at += 4 + dlen;
    }
    None
}

/// REPORT TARGET PORT GROUPS (MAINTENANCE IN, service action 0Ah), length-only format.
pub fn rtpg_cdb(alloc: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = 0xa3;
    c[1] = 0x0a;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// The ALUA sense conditions that move a session (SPC-5 table 28, NOT READY, ASC 04h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AluaSense {
    /// 04h/0Ah ASYMMETRIC ACCESS STATE TRANSITION.
    Transitioning,
    /// 04h/0Bh TARGET PORT IN STANDBY STATE.
    Standby,
    /// 04h/0Ch TARGET PORT IN UNAVAILABLE STATE.
    Unavailable,
}

impl AluaSense {
    pub fn of(key: u8, asc: u8, ascq: u8) -> Option<AluaSense> {
        match (key, asc, ascq) {
            (0x02, 0x04, 0x0a) => Some(AluaSense::Transitioning),
            (0x02, 0x04, 0x0b) => Some(AluaSense::Standby),
            (0x02, 0x04, 0x0c) => Some(AluaSense::Unavailable),
            _ => None,
        }
    }

    fn state(self) -> AluaState {
        match self {
            AluaSense::Transitioning => AluaState::Transitioning,
            AluaSense::Standby => AluaState::Standby,
            AluaSense::Unavailable => AluaState::Unavailable,
        }
    }
}

/// A registration the session made with PERSISTENT RESERVE OUT, to make again on the
/// I_T nexus of another gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Registration {
    pub key: u64,
    /// ALL_TG_PT: the registration holds on every target port, new nexuses included.
    pub all_target_ports: bool,
}

/// The registration a PERSISTENT RESERVE OUT that ended GOOD leaves: `Some(Some(r))`
/// registered, `Some(None)` unregistered, `None` no change (another service action).
pub fn registration_after(cdb: &[u8], params: &[u8]) -> Option<Option<Registration>> {
    if cdb.first() != Some(&0x5f) || params.len() < 24 {
        return None;
    }
    // REGISTER (0) and REGISTER AND IGNORE EXISTING KEY (6).
    if !matches!(cdb.get(1).map(|b| b & 0x1f), Some(0 | 6)) {
        return None;
    }
    let key = u64::from_be_bytes(params[8..16].try_into().ok()?);
    Some((key != 0).then_some(Registration {
        key,
        all_target_ports: params[20] & 0x04 != 0,
    }))
}

/// PERSISTENT RESERVE IN, READ KEYS.
pub fn read_keys_cdb(alloc: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x5e;
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// The keys of a READ KEYS answer (cut to what arrived).
pub fn parse_read_keys(data: &[u8]) -> Vec<u64> {
    let Some(len) = data.get(4..8) else {
        return Vec::new();
    };
    let len = u32::from_be_bytes(len.try_into().unwrap()) as usize;
    let end = 8usize.saturating_add(len).min(data.len());
    data.get(8..end)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect()
}

/// PERSISTENT RESERVE OUT, REGISTER AND IGNORE EXISTING KEY of `key` for this nexus, or
/// with `all_target_ports` (ALL_TG_PT) for this initiator port through every target port:
/// its CDB and parameter list (24 bytes, SPC-5 6.17.3).
pub fn reregister(key: u64, all_target_ports: bool) -> ([u8; 10], Vec<u8>) {
    let mut c = [0u8; 10];
    c[0] = 0x5f;
    c[1] = 0x06;
    c[5..9].copy_from_slice(&24u32.to_be_bytes());
    let mut p = vec![0u8; 24];
    p[8..16].copy_from_slice(&key.to_be_bytes());
    if all_target_ports {
        p[20] = 0x04;
    }
    (c, p)
}

/// PERSISTENT RESERVE OUT, RESERVE of `kind` (a type of SPC-5 table 182) by `key`, scope
/// LU_SCOPE: its CDB and parameter list.
pub fn reserve(key: u64, kind: u8) -> ([u8; 10], Vec<u8>) {
    let mut c = [0u8; 10];
    c[0] = 0x5f;
    c[1] = 0x01;
    c[2] = kind & 0x0f;
    c[5..9].copy_from_slice(&24u32.to_be_bytes());
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    (c, p)
}

/// PERSISTENT RESERVE IN, READ RESERVATION.
pub fn read_reservation_cdb(alloc: u16) -> [u8; 10] {
    let mut c = read_keys_cdb(alloc);
    c[1] = 0x01;
    c
}

/// PERSISTENT RESERVE IN, READ FULL STATUS.
pub fn read_full_status_cdb(alloc: u16) -> [u8; 10] {
    let mut c = read_keys_cdb(alloc);
    c[1] = 0x03;
    c
}

/// The reservation a READ RESERVATION answer shows: its key (0 for the all-registrants
/// types, SPC-5 6.16.3.3) and type; `None` when there is none or the answer is cut short.
pub fn parse_read_reservation(data: &[u8]) -> Option<(u64, u8)> {
    let len = u32::from_be_bytes(data.get(4..8)?.try_into().ok()?);
    if len < 16 {
        return None;
    }
    let key = u64::from_be_bytes(data.get(8..16)?.try_into().ok()?);
    let kind = data.get(21)? & 0x0f;
    Some((key, kind))
}

/// The persistent reservation types, by the names `pr_type=` takes (SPC-5 table 182).
pub const PR_TYPES: [(&str, u8); 6] = [
    ("we", 1),
    ("ea", 3),
    ("we_ro", 5),
    ("ea_ro", 6),
    ("we_ar", 7),
    ("ea_ar", 8),
];

/// A type by its name (`we_ro`) or number (`5`).
pub fn pr_type(name: &str) -> Option<u8> {
    let name = name.trim().to_ascii_lowercase();
    PR_TYPES
        .iter()
        .find(|(n, c)| *n == name || c.to_string() == name)
        .map(|(_, c)| *c)
}

/// Whether the type is one of the all-registrants types (the reservation is every
/// registrant's, and READ RESERVATION shows key 0).
pub fn all_registrants_type(kind: u8) -> bool {
    matches!(kind, 7 | 8)
}

/// One registration of a READ FULL STATUS answer (SPC-5 6.16.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullStatus {
    pub key: u64,
    /// ALL_TG_PT: the registration holds through every target port.
    pub all_target_ports: bool,
    /// R_HOLDER: this registration holds the reservation.
    pub holder: bool,
    pub kind: u8,
    pub relative_port: u16,
    /// The initiator port of an iSCSI transport ID (`name,i,0xISID`, or the name alone
    /// for format 00b); `None` for another protocol's or one that does not read.
    pub port: Option<String>,
}

/// The registrations of a READ FULL STATUS answer, as far as whole descriptors arrived
/// (an allocation length shorter than the list cuts it: the rest is not guessed at).
pub fn parse_full_status(data: &[u8]) -> Vec<FullStatus> {
    let Some(len) = data.get(4..8) else {
        return Vec::new();
    };
    let len = u32::from_be_bytes(len.try_into().unwrap()) as usize;
    let end = 8usize.saturating_add(len).min(data.len());
    let mut out = Vec::new();
    let mut at = 8;
    while at + 24 <= end {
        let d = &data[at..end];
        let tid_len = u32::from_be_bytes(d[20..24].try_into().unwrap()) as usize;
        let Some(tid) = d.get(24..24usize.saturating_add(tid_len)) else {
            break;
        };
        out.push(FullStatus {
            key: u64::from_be_bytes(d[..8].try_into().unwrap()),
            all_target_ports: d[12] & 0x02 != 0,
            holder: d[12] & 0x01 != 0,
            kind: d[13] & 0x0f,
            relative_port: u16::from_be_bytes([d[18], d[19]]),
            port: iscsi_transport_id(tid),
        });
        at += 24 + tid_len;
    }
    out
}

/// The name in an iSCSI transport ID (protocol 5, SPC-5 7.6.4.6), up to its first NUL.
fn iscsi_transport_id(t: &[u8]) -> Option<String> {
    if t.len() < 4 || t[0] & 0x0f != 0x05 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([t[2], t[3]]));
    let raw = t.get(4..4 + len)?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let name = std::str::from_utf8(&raw[..end]).ok()?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// Whether two iSCSI initiator port names (`name,i,0xISID`) are the same port: names
/// compare without case (RFC 3722 folds them to lower case), ISIDs as numbers.
pub fn same_initiator_port(a: &str, b: &str) -> bool {
    let split = |p: &str| {
        let (name, isid) = p.split_once(",i,0x").or_else(|| p.split_once(",I,0X"))?;
        Some((
            name.to_ascii_lowercase(),
            u64::from_str_radix(isid, 16).ok()?,
        ))
    };
    match (split(a), split(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// What a session that moved to another gateway does about its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNewNexus {
    /// The registration already holds on the new I_T nexus: its initiator port is
    /// registered with ALL_TG_PT (a gateway group keeps registrations per initiator port,
    /// across its gateways). Nothing to send: a PERSISTENT RESERVE OUT right after a
    /// gateway died would wait in the cluster for the dead gateway's acknowledgement.
    Holds,
    /// The key is registered through some other nexus but not this one: register again
    /// (REGISTER AND IGNORE EXISTING KEY).
    Register,
    /// The key is registered nowhere (preempted or cleared meanwhile): stay away.
    Gone,
}

/// The decision on a READ FULL STATUS answer, for `key` and this session's initiator port
/// `me` (`name,i,0xISID`).
pub fn on_new_nexus(status: &[FullStatus], key: u64, me: &str) -> OnNewNexus {
    let ours = |s: &&FullStatus| s.key == key;
    if status.iter().filter(ours).any(|s| {
        s.all_target_ports
            && s.port
                .as_deref()
                .is_some_and(|p| same_initiator_port(p, me))
    }) {
        OnNewNexus::Holds
    } else if status.iter().any(|s| s.key == key) {
        OnNewNexus::Register
    } else {
        OnNewNexus::Gone
    }
}

/// What the session should do about its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Go on where it is.
    Stay,
    /// Log in again on the current path.
    Reconnect,
    /// Log in on path `to` (an index into the group's portals).
    MoveTo(usize),
}

/// One portal of the group, as the session knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Path {
    pub portal: String,
    /// Its target port group, once a login through it read VPD page 83h.
    pub group: Option<u16>,
    /// Its group's state, from the last REPORT TARGET PORT GROUPS or ALUA sense.
    pub state: Option<AluaState>,
    /// Logins that failed since its last good one.
    pub failed_logins: u32,
    /// Whether a login through it was tried.
    pub tried: bool,
}

impl Path {
    /// Lower is better; `None` never carries I/O.
    fn rank(&self) -> Option<u8> {
        match self.state {
            Some(s) => s.rank(),
            None => Some(UNKNOWN_RANK),
        }
    }
}

/// The gateway group: its portals and the one in use.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    paths: Vec<Path>,
    current: usize,
    failovers: u64,
}

/// The group as `rsv tune` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct GroupReport {
    pub paths: Vec<Path>,
    /// The portal in use.
    pub current: String,
    /// Moves from one portal to another since the session began (the choice at login
    /// not counted).
    pub failovers: u64,
}

impl Group {
    /// A group of `portals` (at least one), the first in use.
    pub fn new(portals: Vec<String>) -> Group {
        assert!(!portals.is_empty(), "a group has at least one portal");
        Group {
            paths: portals
                .into_iter()
                .map(|portal| Path {
                    portal,
                    group: None,
                    state: None,
                    failed_logins: 0,
                    tried: false,
                })
                .collect(),
            current: 0,
            failovers: 0,
        }
    }

    pub fn current(&self) -> usize {
        self.current
    }

    pub fn portal(&self) -> &str {
        &self.paths[self.current].portal
    }

    pub fn paths(&self) -> &[Path] {
        &self.paths
    }

    pub fn failovers(&self) -> u64 {
        self.failovers
    }

    pub fn report(&self) -> GroupReport {
        GroupReport {
            paths: self.paths.clone(),
            current: self.portal().to_owned(),
            failovers: self.failovers,
        }
    }

    /// Makes path `to` the one in use (what the session does on [`Action::MoveTo`]).
    /// `during_io`: a move while the session ran, counted as a failover.
    pub fn move_to(&mut self, to: usize, during_io: bool) {
        if to != self.current && to < self.paths.len() {
            self.current = to;
            if during_io {
                self.failovers += 1;
            }
        }
    }

    /// The best path other than the current one: by rank, then fewer failed logins,
    /// then the next in order after the current (so that equal paths take turns).
    fn best_other(&self) -> Option<usize> {
        let n = self.paths.len();
        (1..n)
            .map(|k| (self.current + k) % n)
            .filter_map(|i| Some((self.paths[i].rank()?, self.paths[i].failed_logins, i)))
            .min_by_key(|&(r, f, i)| (r, f, (i + n - self.current) % n))
            .map(|(_, _, i)| i)
    }

    /// The connection (all of the session's) to the current path was lost.
    pub fn connection_lost(&mut self) -> Action {
        Action::Reconnect
    }

    /// A login through the current path failed.
    pub fn login_failed(&mut self) -> Action {
        let p = &mut self.paths[self.current];
        p.failed_logins = p.failed_logins.saturating_add(1);
        p.tried = true;
        match self.best_other() {
            Some(i) => Action::MoveTo(i),
            // No other path could carry I/O: keep trying this one (the caller's
            // recovery timeout decides when to give up).
            None => Action::Reconnect,
        }
    }

    /// A command through the current path ended in an ALUA sense.
    pub fn sense(&mut self, s: AluaSense) -> Action {
        self.set_current_state(s.state());
        let here = self.paths[self.current].rank();
        match self.best_other() {
            Some(i) if here.is_none_or(|h| self.paths[i].rank().is_some_and(|r| r <= h)) => {
                Action::MoveTo(i)
            }
            // Nowhere better: a transition here ends soon; standby or unavailable
            // everywhere leaves the caller retrying until its recovery timeout.
            _ => Action::Stay,
        }
    }

    fn set_current_state(&mut self, state: AluaState) {
        let cur = &self.paths[self.current];
        match cur.group {
            // The group's state, on every path known to be in it.
            Some(g) => {
                for p in self.paths.iter_mut().filter(|p| p.group == Some(g)) {
                    p.state = Some(state);
                }
            }
            None => self.paths[self.current].state = Some(state),
        }
    }

    /// A login through the current path succeeded; `group` is its target port group
    /// (VPD 83h), `groups` the REPORT TARGET PORT GROUPS answer (empty when the LU has no
    /// ALUA). Answers where the session should be.
    pub fn logged_in(&mut self, group: Option<u16>, groups: &[PortGroup]) -> Action {
        {
            let cur = &mut self.paths[self.current];
            cur.tried = true;
            cur.failed_logins = 0;
            if group.is_some() {
                cur.group = group;
            }
        }
        for p in &mut self.paths {
            if let Some(g) = p.group.and_then(|g| groups.iter().find(|x| x.id == g)) {
                p.state = Some(g.state);
            }
        }
        if groups.is_empty() {
            // No ALUA: every path is as good as the next; stay.
            return Action::Stay;
        }
        let here = self.paths[self.current].rank();
        if here == Some(0) {
            return Action::Stay;
        }
        // A path whose group is known to be better, else one not tried yet (it may be
        // in an active/optimized group), so that each is tried at most once.
        let better = (0..self.paths.len())
            .filter(|&i| i != self.current)
            .filter_map(|i| {
                let p = &self.paths[i];
                let r = p.rank()?;
                let known_better = p.state.is_some() && here.is_none_or(|h| r < h);
                let untried = !p.tried && p.group.is_none();
                (known_better || untried).then_some((if known_better { r } else { 9 }, i))
            })
            .min();
        match better {
            Some((_, i)) => Action::MoveTo(i),
            None => Action::Stay,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rtpg(groups: &[(u16, u8)]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(id, st) in groups {
            body.extend_from_slice(&[st, 0x01]);
            body.extend_from_slice(&id.to_be_bytes());
            body.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
            body.extend_from_slice(&id.to_be_bytes());
        }
        let mut d = (body.len() as u32).to_be_bytes().to_vec();
        d.extend(body);
        d
    }

    fn pg(id: u16, state: AluaState) -> PortGroup {
        PortGroup {
            id,
            state,
            preferred: false,
            ports: vec![id],
        }
    }

    #[test]
    fn rtpg_decodes_both_formats_and_refuses_cut_data() {
        let d = rtpg(&[(1, 0), (2, 0x82)]);
        let g = parse_rtpg(&d).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].id, 2);
        assert_eq!(g[1].state, AluaState::Standby);
        assert!(g[1].preferred);
        assert_eq!(g[0].ports, vec![1]);
        let mut ext = ((d.len() - 4 + 4) as u32).to_be_bytes().to_vec();
        ext.extend_from_slice(&[0x10, 0, 0, 0]);
        ext.extend_from_slice(&d[4..]);
        assert_eq!(parse_rtpg(&ext).unwrap(), g);
        assert_eq!(parse_rtpg(&[0, 0]), Err(RtpgError::Short));
        // A descriptor promising four ports, with one.
        let mut bad = rtpg(&[(1, 0)]);
        bad[4 + 7] = 4;
        assert_eq!(parse_rtpg(&bad), Err(RtpgError::Truncated(0)));
        // A length past the data is cut to the data.
        let mut long = rtpg(&[(3, 1)]);
        long[3] = 200;
        assert_eq!(parse_rtpg(&long).unwrap()[0].id, 3);
    }

    #[test]
    fn vpd83_finds_the_target_port_group() {
        // NAA designator, then relative port (type 4), then port group (type 5).
        let mut p = vec![0, 0x83, 0, 0];
        p.extend_from_slice(&[1, 3, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]);
        p.extend_from_slice(&[1, 0x14, 0, 4, 0, 0, 0, 7]);
        p.extend_from_slice(&[1, 0x15, 0, 4, 0, 0, 0, 2]);
        let n = (p.len() - 4) as u16;
        p[2..4].copy_from_slice(&n.to_be_bytes());
        assert_eq!(vpd83_port_group(&p), Some(2));
        assert_eq!(vpd83_port_group(&p[..20]), None);
        assert_eq!(vpd83_port_group(&[]), None);
    }

    #[test]
    fn alua_sense_is_recognised() {
        assert_eq!(AluaSense::of(2, 4, 0x0a), Some(AluaSense::Transitioning));
        assert_eq!(AluaSense::of(2, 4, 0x0b), Some(AluaSense::Standby));
        assert_eq!(AluaSense::of(2, 4, 0x0c), Some(AluaSense::Unavailable));
        assert_eq!(AluaSense::of(2, 4, 0x01), None);
        assert_eq!(AluaSense::of(6, 0x29, 0), None);
    }

    #[test]
    fn registrations_are_followed() {
        let (cdb, mut p) = reregister(0xabc, false);
        assert_eq!(
            registration_after(&cdb, &p),
            Some(Some(Registration {
                key: 0xabc,
                all_target_ports: false
            }))
        );
        p[20] = 0x04;
        assert!(
            registration_after(&cdb, &p)
                .unwrap()
                .unwrap()
                .all_target_ports
        );
        p[8..16].fill(0);
        assert_eq!(registration_after(&cdb, &p), Some(None));
        // RESERVE (1) changes no registration.
        let mut reserve = cdb;
        reserve[1] = 1;
        assert_eq!(registration_after(&reserve, &p), None);
        let mut keys = vec![0, 0, 0, 1, 0, 0, 0, 16];
        keys.extend_from_slice(&5u64.to_be_bytes());
        keys.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(parse_read_keys(&keys), vec![5, 7]);
        assert_eq!(parse_read_keys(&keys[..12]), Vec::<u64>::new());
        assert_eq!(read_keys_cdb(100)[0], 0x5e);
    }

    fn full_status_entry(key: u64, flags: u8, port: &str) -> Vec<u8> {
        let mut e = key.to_be_bytes().to_vec();
        e.extend_from_slice(&[0, 0, 0, 0, flags, 5, 0, 0, 0, 0, 0, 1]);
        let mut name = port.as_bytes().to_vec();
        name.push(0);
        name.resize(name.len().div_ceil(4) * 4, 0);
        let mut tid = vec![0x45, 0];
        tid.extend_from_slice(&(name.len() as u16).to_be_bytes());
        tid.extend(name);
        e.extend_from_slice(&(tid.len() as u32).to_be_bytes());
        e.extend(tid);
        e
    }

    fn full_status(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut d = vec![0, 0, 0, 9];
        d.extend_from_slice(&(body.len() as u32).to_be_bytes());
        d.extend(body);
        d
    }

    #[test]
    fn a_registration_held_through_every_port_is_not_made_again() {
        let me = "iqn.2026-01.org.reservoir:initiator.h,i,0x80a1b2c30001";
        let other = "iqn.2026-01.org.reservoir:initiator.h,i,0x80a1b2c30003";
        // Our port, ALL_TG_PT and holder: nothing to do.
        let d = full_status(&[full_status_entry(0xabc, 0x03, me)]);
        let s = parse_full_status(&d);
        assert_eq!(s.len(), 1);
        assert!(s[0].all_target_ports && s[0].holder);
        assert_eq!(s[0].kind, 5);
        assert_eq!(s[0].port.as_deref(), Some(me));
        assert_eq!(on_new_nexus(&s, 0xabc, me), OnNewNexus::Holds);
        // The ISID written in capitals and the name in another case is the same port.
        assert_eq!(
            on_new_nexus(&s, 0xabc, &me.to_uppercase().replace(",I,0X", ",i,0x")),
            OnNewNexus::Holds
        );
        // Our port without ALL_TG_PT (a target that keeps registrations per nexus), or
        // only another port with the key: register again.
        let d = full_status(&[full_status_entry(0xabc, 0x00, me)]);
        assert_eq!(
            on_new_nexus(&parse_full_status(&d), 0xabc, me),
            OnNewNexus::Register
        );
        let d = full_status(&[full_status_entry(0xabc, 0x02, other)]);
        assert_eq!(
            on_new_nexus(&parse_full_status(&d), 0xabc, me),
            OnNewNexus::Register
        );
        // Our port registered with another key only: ours is gone.
        let d = full_status(&[full_status_entry(0xdef, 0x02, me)]);
        assert_eq!(
            on_new_nexus(&parse_full_status(&d), 0xabc, me),
            OnNewNexus::Gone
        );
        // An answer cut inside the second descriptor keeps the first only.
        let d = full_status(&[
            full_status_entry(0xdef, 0x02, other),
            full_status_entry(0xabc, 0x02, me),
        ]);
        assert_eq!(parse_full_status(&d[..d.len() - 3]).len(), 1);
        assert_eq!(
            on_new_nexus(&parse_full_status(&d[..d.len() - 3]), 0xabc, me),
            OnNewNexus::Gone
        );
        assert_eq!(read_full_status_cdb(100)[1], 3);
    }

    #[test]
    fn reservations_are_read_and_taken() {
        let (c, p) = reserve(0xabc, 5);
        assert_eq!((c[0], c[1], c[2]), (0x5f, 1, 5));
        assert_eq!(u64::from_be_bytes(p[..8].try_into().unwrap()), 0xabc);
        let mut d = vec![0, 0, 0, 3, 0, 0, 0, 16];
        d.extend_from_slice(&0xabcu64.to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0, 0, 5, 0, 0]);
        assert_eq!(parse_read_reservation(&d), Some((0xabc, 5)));
        assert_eq!(parse_read_reservation(&d[..8]), None);
        assert_eq!(parse_read_reservation(&[0, 0, 0, 3, 0, 0, 0, 0]), None);
        assert_eq!(read_reservation_cdb(64)[1], 1);
        assert_eq!(pr_type("WE_RO"), Some(5));
        assert_eq!(pr_type("3"), Some(3));
        assert_eq!(pr_type("2"), None);
        assert!(same_initiator_port("a,i,0x0001", "A,i,0x1"));
        assert!(!same_initiator_port("a,i,0x0001", "a,i,0x2"));
        assert!(!same_initiator_port("a", "a"));
    }

    #[test]
    fn login_prefers_the_active_optimized_group() {
        let mut g = Group::new(vec!["a:1".into(), "b:1".into(), "c:1".into()]);
        // Logged in on a, a standby group 1; 2 is active/optimized but not yet placed.
        let groups = [pg(1, AluaState::Standby), pg(2, AluaState::ActiveOptimized)];
        assert_eq!(g.logged_in(Some(1), &groups), Action::MoveTo(1));
        g.move_to(1, false);
        assert_eq!(g.failovers(), 0);
        // b is in group 2: stay.
        assert_eq!(g.logged_in(Some(2), &groups), Action::Stay);
        assert_eq!(g.portal(), "b:1");
    }

    #[test]
    fn non_optimized_gives_way_only_to_a_known_better_or_untried_path() {
        let mut g = Group::new(vec!["a:1".into(), "b:1".into()]);
        let groups = [
            pg(1, AluaState::ActiveNonOptimized),
            pg(2, AluaState::ActiveNonOptimized),
        ];
        assert_eq!(g.logged_in(Some(1), &groups), Action::MoveTo(1));
        g.move_to(1, false);
        // Both tried, both non-optimized: stay on b.
        assert_eq!(g.logged_in(Some(2), &groups), Action::Stay);
    }

    #[test]
    fn a_lost_gateway_moves_the_session_after_one_reconnect() {
        let mut g = Group::new(vec!["a:1".into(), "b:1".into()]);
        let groups = [
            pg(1, AluaState::ActiveOptimized),
            pg(2, AluaState::ActiveOptimized),
        ];
        assert_eq!(g.logged_in(Some(1), &groups), Action::Stay);
        assert_eq!(g.connection_lost(), Action::Reconnect);
        assert_eq!(g.login_failed(), Action::MoveTo(1));
        g.move_to(1, true);
        assert_eq!(g.failovers(), 1);
        assert_eq!(g.logged_in(Some(2), &groups), Action::Stay);
        // b fails too while a is still down: back to a, then b again.
        assert_eq!(g.login_failed(), Action::MoveTo(0));
        g.move_to(0, true);
        assert_eq!(g.login_failed(), Action::MoveTo(1));
    }

    #[test]
    fn a_single_portal_reconnects() {
        let mut g = Group::new(vec!["a:1".into()]);
        assert_eq!(g.connection_lost(), Action::Reconnect);
        assert_eq!(g.login_failed(), Action::Reconnect);
        assert_eq!(g.sense(AluaSense::Transitioning), Action::Stay);
    }

    #[test]
    fn standby_sense_moves_and_never_back_to_standby() {
        let mut g = Group::new(vec!["a:1".into(), "b:1".into()]);
        let groups = [
            pg(1, AluaState::ActiveOptimized),
            pg(2, AluaState::ActiveOptimized),
        ];
        g.logged_in(Some(1), &groups);
        assert_eq!(g.sense(AluaSense::Standby), Action::MoveTo(1));
        g.move_to(1, true);
        g.logged_in(Some(2), &groups[1..]);
        // a is standby: a lost b reconnects to b rather than move there.
        assert_eq!(g.login_failed(), Action::Reconnect);
        // Transitioning on b with a standby: stay and wait.
        assert_eq!(g.sense(AluaSense::Transitioning), Action::Stay);
    }

    /// Events as a property test draws them.
    #[derive(Clone, Debug)]
    enum Ev {
        Lost,
        LoginFailed,
        Sense(u8),
        LoggedIn(Vec<u8>),
    }

    fn ev(n: usize) -> impl Strategy<Value = Ev> {
        prop_oneof![
            Just(Ev::Lost),
            Just(Ev::LoginFailed),
            (0u8..3).prop_map(Ev::Sense),
            proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1), Just(2), Just(3), Just(0xf)],
                n
            )
            .prop_map(Ev::LoggedIn),
        ]
    }

    proptest! {
        /// Whatever happens: the current path is always a valid index; a move never goes
        /// to a path known not to carry I/O; a move goes to another path; failovers
        /// count the moves made during I/O; and the choice at login ends within as many
        /// moves as there are paths, on a path no other known path beats.
        #[test]
        fn the_state_machine_keeps_its_promises(
            n in 1usize..5,
            events in proptest::collection::vec(ev(4), 0..40),
        ) {
            let mut g = Group::new((0..n).map(|i| format!("h{i}:3260")).collect());
            let mut moves = 0;
            for e in events {
                let a = match e {
                    Ev::Lost => g.connection_lost(),
                    Ev::LoginFailed => g.login_failed(),
                    Ev::Sense(s) => g.sense([AluaSense::Transitioning, AluaSense::Standby, AluaSense::Unavailable][s as usize]),
                    Ev::LoggedIn(states) => {
                        // Path i is in group i; states drawn per group.
                        let groups: Vec<PortGroup> = (0..n).map(|i| pg(i as u16, AluaState::from_code(states[i]))).collect();
                        let mut a = g.logged_in(Some(g.current() as u16), &groups);
                        let mut steps = 0;
                        while let Action::MoveTo(to) = a {
                            prop_assert!(steps < 2 * n, "login choice did not end");
                            prop_assert!(g.paths()[to].rank().is_some());
                            g.move_to(to, false);
                            a = g.logged_in(Some(to as u16), &groups);
                            steps += 1;
                        }
                        // No known path is strictly better than the one chosen.
                        let here = g.paths()[g.current()].rank();
                        if here.is_some() {
                            for p in g.paths() {
                                if let (Some(_), Some(r)) = (p.state, p.rank()) {
                                    prop_assert!(here.unwrap() <= r || p.portal == g.portal() || !p.tried && p.group.is_none(),
                                        "{p:?} beats the current {:?}", g.paths()[g.current()]);
                                }
                            }
                        }
                        a
                    }
                };
                prop_assert!(g.current() < n);
                if let Action::MoveTo(to) = a {
                    prop_assert_ne!(to, g.current());
                    prop_assert!(g.paths()[to].rank().is_some(), "moved to {:?}", g.paths()[to]);
                    g.move_to(to, true);
                    moves += 1;
                }
                prop_assert_eq!(g.failovers(), moves);
            }
        }

        /// Network input: any bytes decode or fail, never panic.
        #[test]
        fn parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_rtpg(&data);
            let _ = vpd83_port_group(&data);
            let _ = parse_read_keys(&data);
            let _ = parse_read_reservation(&data);
            let s = parse_full_status(&data);
            let _ = on_new_nexus(&s, 1, "a,i,0x1");
        }
    }
}
