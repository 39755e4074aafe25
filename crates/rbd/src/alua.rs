//! ALUA that follows health, for the targets exporting one image (a gateway group): each
//! keeps its liveness and the states SET TARGET PORT GROUPS chose in RADOS, on an object
//! beside the image, `reservoir.IMAGE.alua`, as extended attributes:
//! - `hb.GROUP`: the target of group GROUP's heartbeat, `INCARNATION.COUNTER`, written
//!   every [`BEAT`] by that target alone;
//! - `state.GROUP`: the state chosen for the group (`active/optimized`,
//!   `active/non-optimized`, `standby`, `unavailable`); none: active/optimized.
//!
//! Why a heartbeat counter and not a lease with a time in it, nor the object's watchers:
//! a counter compares nothing across machines' clocks (each target judges the others by
//! when *it* saw their counters move), and a dead target's watch lingers in the OSD for
//! its watch timeout (30 s by default), well beyond the bound wanted here.
//!
//! Every target reads the object every [`BEAT`] and judges ([`Judge`], sans-IO): a group
//! whose counter it has seen move within [`DOUBT`] is in its chosen state; one whose
//! counter stood still longer is transitioning, and beyond [`LEASE`] unavailable. A target
//! judges itself by its own last successful beat (written and read back): cut off from
//! the cluster it turns transitioning after [`DOUBT`] and unavailable after [`LEASE`], and
//! refuses I/O so, so that initiators move on to a target that still reaches the cluster.
//! A dead target is thus reported unavailable by the others at most [`LEASE`] + [`BEAT`]
//! (plus one read) after its last beat.
//!
//! SET TARGET PORT GROUPS writes the chosen states, then notifies the object's watchers
//! (RADOS watch/notify): each reads the object again before it acknowledges, so that when
//! the command completes every reachable target answers the new states and has raised
//! ASYMMETRIC ACCESS STATE CHANGED.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use backstore::groups::{AccessState, GroupState, PortGroups, Why};

use crate::{cstr, errno, ffi, Rados, RbdConfig};

/// How often a target writes its heartbeat and reads the others'.
pub const BEAT: Duration = Duration::from_secs(1);
/// A heartbeat that has not moved for longer: its group is in doubt (transitioning).
pub const DOUBT: Duration = Duration::from_secs(3);
/// A heartbeat that has not moved for longer: its group is unavailable.
pub const LEASE: Duration = Duration::from_secs(6);
/// Deadline of the heartbeat's cluster operations: shorter than [`DOUBT`], so that the
/// heartbeat thread judges again while the cluster does not answer.
const OP_TIMEOUT_S: &str = "2";
/// How long SET TARGET PORT GROUPS waits for the other targets' acknowledgements.
const NOTIFY_TIMEOUT_MS: u64 = 3000;
/// The payload of a change announcement: this prefix and the sender's incarnation.
const CHANGED: &[u8] = b"reservoir alua-changed ";

/// What one target has seen of a group's heartbeat.
#[derive(Debug, Clone)]
struct Seen {
    value: Vec<u8>,
    /// When this target saw the value (first, or changed).
    at: Instant,
    /// Whether this target has seen it change (a value only seen standing could be a
    /// dead target's last).
    moved: bool,
}

/// The sans-IO judge of a gateway group's states: fed what was read of the object and
/// when, it says each group's state. Time comes in as arguments; it reads no clock.
#[derive(Debug)]
pub struct Judge {
    own: u16,
    /// Every group, sorted.
    groups: Vec<u16>,
    seen: HashMap<u16, Seen>,
    explicit: HashMap<u16, AccessState>,
    /// This target's last beat written and read back.
    own_ok: Option<Instant>,
    /// The last judgement, for the changes and their reasons, and the chosen states it
    /// was made with.
    last: Vec<GroupState>,
    last_chosen: HashMap<u16, AccessState>,
    /// Groups this target has seen in their chosen state once: until then a change is
    /// their start, which alters nothing (no status), so that every target reports alike
    /// whichever started first.
    settled: std::collections::HashSet<u16>,
}

impl Judge {
    pub fn new(own: u16, peers: &[u16]) -> Judge {
        let mut groups: Vec<u16> = peers.iter().copied().chain([own]).collect();
        groups.sort_unstable();
        groups.dedup();
        let last = groups
            .iter()
            .map(|&group| GroupState {
                group,
                // Until this target has beaten once, and seen the others, it is in doubt.
                state: AccessState::Transitioning,
                why: Why::None,
            })
            .collect();
        Judge {
            own,
            groups,
            seen: HashMap::new(),
            explicit: HashMap::new(),
            own_ok: None,
            last,
            last_chosen: HashMap::new(),
            settled: Default::default(),
        }
    }

    /// A read of the object at `now`: the heartbeats and the chosen states, by group.
    /// `own_beat`: this target's heartbeat was written just before the read.
    pub fn observe(
        &mut self,
        beats: &HashMap<u16, Vec<u8>>,
        explicit: HashMap<u16, AccessState>,
        own_beat: bool,
        now: Instant,
    ) {
        for (&g, value) in beats {
            match self.seen.get_mut(&g) {
                Some(s) if s.value == *value => {}
                Some(s) => {
                    s.value = value.clone();
                    s.at = now;
                    s.moved = true;
                }
                None => {
                    self.seen.insert(
                        g,
                        Seen {
                            value: value.clone(),
                            at: now,
                            moved: false,
                        },
                    );
                }
            }
        }
        self.explicit = explicit;
        if own_beat {
            self.own_ok = Some(now);
        }
    }

    fn chosen(&self, group: u16) -> AccessState {
        self.explicit
            .get(&group)
            .copied()
            .unwrap_or(AccessState::ActiveOptimized)
    }

    /// A state by the age of what proves the group alive.
    fn by_age(&self, group: u16, age: Duration) -> AccessState {
        if age <= DOUBT {
            self.chosen(group)
        } else if age <= LEASE {
            AccessState::Transitioning
        } else {
            AccessState::Unavailable
        }
    }

    /// This target's own group's state at `now`.
    pub fn own_state(&self, now: Instant) -> AccessState {
        match self.own_ok {
            Some(at) => self.by_age(self.own, now.saturating_duration_since(at)),
            None => AccessState::Transitioning,
        }
    }

    /// Another group's state: judged up to this target's last good read, so that a target
    /// cut off from the cluster does not take its own blindness for the others' death.
    fn peer_state(&self, group: u16) -> AccessState {
        let (Some(s), Some(read)) = (self.seen.get(&group), self.own_ok) else {
            return AccessState::Unavailable;
        };
        let age = read.saturating_duration_since(s.at);
        if !s.moved && age <= LEASE {
            // Only ever seen standing: a live target's, or a dead one's last word.
            return AccessState::Transitioning;
        }
        self.by_age(group, age)
    }

    /// Every group's state at `now`, in the order of their ids, and whether any changed
    /// since the last call. A change follows SET TARGET PORT GROUPS (status: altered
    /// explicitly) when the chosen state is what changed, and the targets' health
    /// (altered implicitly) otherwise.
    pub fn judge(&mut self, now: Instant) -> (Vec<GroupState>, bool) {
        let mut changed = false;
        let mut out = Vec::with_capacity(self.groups.len());
        for (i, &group) in self.groups.iter().enumerate() {
            let state = if group == self.own {
                self.own_state(now)
            } else {
                self.peer_state(group)
            };
            let old = self.last[i];
            let why = if state == old.state {
                old.why
            } else {
                changed = true;
                let before = self
                    .last_chosen
                    .get(&group)
                    .copied()
                    .unwrap_or(AccessState::ActiveOptimized);
                if !self.settled.contains(&group) {
                    Why::None
                } else if state == self.chosen(group) && before != state {
                    Why::Explicit
                } else {
                    Why::Implicit
                }
            };
            if state == self.chosen(group) {
                self.settled.insert(group);
            }
            out.push(GroupState { group, state, why });
        }
        self.last = out.clone();
        self.last_chosen = self.explicit.clone();
        (out, changed)
    }

    pub fn last(&self) -> &[GroupState] {
        &self.last
    }
}

/// One RADOS client of the heartbeat's own, so that its deadlines are its own (short)
/// and the data path's reconnections leave it alone.
struct Client {
    rados: Rados,
    oid: CString,
}

impl Client {
    fn connect(cfg: &RbdConfig) -> io::Result<Client> {
        let oid = cstr(&format!("reservoir.{}.alua", cfg.image))?;
        // The operations' deadline shorter than the store's (the mount keeps the store's).
        let rados = Rados::connect(cfg, "ALUA: ", |_| {
            vec![
                ("rados_osd_op_timeout", OP_TIMEOUT_S.into()),
                ("rados_mon_op_timeout", OP_TIMEOUT_S.into()),
            ]
        })?;
        Ok(Client { rados, oid })
    }

    fn object(&self) -> String {
        self.oid.to_string_lossy().into_owned()
    }

    fn set_xattr(&self, name: &str, value: &[u8]) -> io::Result<()> {
        let n = cstr(name)?;
        let put = || {
            // SAFETY: a valid context; the name and value outlive the call.
            unsafe {
                ffi::rados_setxattr(
                    self.rados.io,
                    self.oid.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                )
            }
        };
        let mut r = put();
        if r == -libc::ENOENT {
            self.rados.create(&self.oid)?;
            r = put();
        }
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("{}: setting {name}", self.object()),
            ));
        }
        Ok(())
    }

    /// Every extended attribute of the object (none if it does not exist yet).
    fn xattrs(&self) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut iter: ffi::rados_xattrs_iter_t = ptr::null_mut();
        // SAFETY: a valid context; out-pointer to the iterator, ended below.
        let r = unsafe { ffi::rados_getxattrs(self.rados.io, self.oid.as_ptr(), &mut iter) };
        if r == -libc::ENOENT {
            return Ok(Vec::new());
        }
        if r < 0 {
            return Err(errno(r.into(), format!("{}: reading", self.object())));
        }
        let mut out = Vec::new();
        loop {
            let (mut name, mut val, mut len) = (ptr::null(), ptr::null(), 0usize);
            // SAFETY: a live iterator; the out-pointers are valid; what they point to lives
            // until the next call or the end.
            let r = unsafe { ffi::rados_getxattrs_next(iter, &mut name, &mut val, &mut len) };
            if r < 0 || name.is_null() {
                break;
            }
            // SAFETY: a NUL-terminated name and `len` bytes of value, as librados says.
            let (n, v) = unsafe {
                (
                    CStr::from_ptr(name).to_string_lossy().into_owned(),
                    if val.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(val as *const u8, len).to_vec()
                    },
                )
            };
            out.push((n, v));
        }
        // SAFETY: ended once.
        unsafe { ffi::rados_getxattrs_end(iter) };
        Ok(out)
    }

    /// Tells the object's watchers that the chosen states changed; returns once they have
    /// acknowledged (or the deadline passed).
    fn notify(&self, payload: &[u8]) -> io::Result<()> {
        self.rados
            .notify(&self.oid, payload, NOTIFY_TIMEOUT_MS, "notifying")
    }
}

/// What the heartbeat thread, the watch's callbacks and the logical unit share.
struct Shared {
    client: Client,
    own: u16,
    /// This target's heartbeat: `INCARNATION.`, then a counter.
    incarnation: u64,
    counter: Mutex<u64>,
    judge: Mutex<Judge>,
    /// One refresh at a time (the thread, a notification, SET TARGET PORT GROUPS).
    refreshing: Mutex<()>,
    on_change: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// Refreshes asked (by a notification) and done, for the callback to wait on.
    wake: Mutex<(u64, u64)>,
    woken: Condvar,
    done: Condvar,
    stop: AtomicBool,
    /// The watch failed (the cluster was lost): the thread watches again.
    watch_broken: AtomicBool,
    shown: String,
}

impl Shared {
    /// Writes this target's heartbeat (when `beat`), reads the object, judges, and tells
    /// the logical unit if a state changed.
    fn refresh(&self, beat: bool) {
        let _one = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        let wrote = !beat || {
            let n = {
                let mut c = self.counter.lock().unwrap_or_else(|e| e.into_inner());
                *c += 1;
                *c
            };
            let value = format!("{:x}.{n}", self.incarnation);
            match self
                .client
                .set_xattr(&format!("hb.{}", self.own), value.as_bytes())
            {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!("{}: ALUA heartbeat: {e}", self.shown);
                    false
                }
            }
        };
        let read = if wrote {
            self.client.xattrs()
        } else {
            Err(io::Error::other("heartbeat not written"))
        };
        let mut judge = self.judge.lock().unwrap_or_else(|e| e.into_inner());
        let before = judge.last().to_vec();
        match read {
            Ok(attrs) => {
                let (beats, explicit) = records(&attrs);
                judge.observe(&beats, explicit, beat, Instant::now());
            }
            Err(e) => tracing::debug!("{}: ALUA read: {e}", self.shown),
        }
        let (now, changed) = judge.judge(Instant::now());
        drop(judge);
        if changed {
            for (old, new) in before.iter().zip(&now) {
                if old.state != new.state {
                    tracing::warn!(
                        "{}: target port group {} is {} (was {})",
                        self.shown,
                        new.group,
                        new.state.name(),
                        old.state.name()
                    );
                }
            }
            let f = self
                .on_change
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(f) = f {
                f();
            }
        }
    }
}

/// The records among the object's attributes: heartbeats and chosen states, by group;
/// what is not one (or not readable) is left out.
fn records(attrs: &[(String, Vec<u8>)]) -> (HashMap<u16, Vec<u8>>, HashMap<u16, AccessState>) {
    let mut beats = HashMap::new();
    let mut explicit = HashMap::new();
    for (name, value) in attrs {
        if let Some(g) = name.strip_prefix("hb.").and_then(|g| g.parse().ok()) {
            beats.insert(g, value.clone());
        } else if let Some(g) = name.strip_prefix("state.").and_then(|g| g.parse().ok()) {
            if let Some(s) = std::str::from_utf8(value)
                .ok()
                .and_then(AccessState::from_name)
            {
                explicit.insert(g, s);
            }
        }
    }
    (beats, explicit)
}

/// The watch's argument: the shared state, kept alive by `ClusterGroups` until after
/// rados_unwatch2 and rados_watch_flush.
extern "C" fn changed_event(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the `Shared` of a live `ClusterGroups` (see above); `data` holds
    // `len` bytes for the call.
    let s = unsafe { &*(arg as *const Shared) };
    let payload: &[u8] = if data.is_null() {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }
    };
    let mine = payload.strip_prefix(CHANGED) == Some(format!("{:x}", s.incarnation).as_bytes());
    if payload.starts_with(CHANGED) && !mine {
        // The heartbeat thread reads the object again (librados calls are not made from
        // its callback thread); acknowledged once it has, or after a deadline.
        let mut w = s.wake.lock().unwrap_or_else(|e| e.into_inner());
        w.0 += 1;
        let asked = w.0;
        s.woken.notify_all();
        let deadline = Instant::now() + Duration::from_millis(NOTIFY_TIMEOUT_MS / 2);
        while w.1 < asked && !s.stop.load(Ordering::Acquire) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            w = s
                .done
                .wait_timeout(w, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
    // SAFETY: a valid context and the watched object's name; no reply payload.
    unsafe {
        ffi::rados_notify_ack(
            s.client.rados.io,
            s.client.oid.as_ptr(),
            notify_id,
            cookie,
            ptr::null(),
            0,
        )
    };
}

extern "C" fn watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in `changed_event`.
    let s = unsafe { &*(arg as *const Shared) };
    s.watch_broken.store(true, Ordering::Release);
    tracing::warn!(
        "{}: the ALUA watch failed ({}); watching again once the cluster answers",
        s.shown,
        io::Error::from_raw_os_error(-err)
    );
}

/// A gateway group's ALUA states kept in the cluster: [`PortGroups`] for a shared image.
pub struct ClusterGroups {
    shared: Arc<Shared>,
    /// The watch's cookie, which the heartbeat thread renews after a failure.
    watch: Arc<Mutex<Option<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterGroups({})", self.shared.client.object())
    }
}

impl ClusterGroups {
    /// Connects, beats once (so that a target that reaches the cluster starts active),
    /// watches the object and starts the heartbeat thread.
    pub fn start(cfg: &RbdConfig, own: u16, peers: &[u16]) -> io::Result<ClusterGroups> {
        let shared = Arc::new(Shared {
            client: Client::connect(cfg)?,
            own,
            incarnation: crate::rand_id(),
            counter: Mutex::new(0),
            judge: Mutex::new(Judge::new(own, peers)),
            refreshing: Mutex::new(()),
            on_change: Mutex::new(None),
            wake: Mutex::new((0, 0)),
            woken: Condvar::new(),
            done: Condvar::new(),
            stop: AtomicBool::new(false),
            watch_broken: AtomicBool::new(false),
            shown: cfg.shown(),
        });
        shared.refresh(true);
        let slot = Arc::new(Mutex::new(Some(watch(&shared)?)));
        let (s, w) = (shared.clone(), slot.clone());
        let thread = std::thread::Builder::new()
            .name("rbd-alua".into())
            .spawn(move || beat(&s, &w))?;
        Ok(ClusterGroups {
            shared,
            watch: slot,
            thread: Some(thread),
        })
    }
}

/// Watches the object (made by the first beat) for SET TARGET PORT GROUPS' announcements.
fn watch(s: &Arc<Shared>) -> io::Result<u64> {
    let mut cookie = 0u64;
    // SAFETY: a valid context; the callbacks' argument is the `Shared`, which outlives the
    // watch (ClusterGroups' Drop unwatches and flushes before its last reference goes).
    let r = unsafe {
        ffi::rados_watch2(
            s.client.rados.io,
            s.client.oid.as_ptr(),
            &mut cookie,
            changed_event,
            watch_error,
            Arc::as_ptr(s) as *mut c_void,
        )
    };
    if r < 0 {
        return Err(errno(
            r.into(),
            format!("{}: watching {}", s.shown, s.client.object()),
        ));
    }
    Ok(cookie)
}

/// The heartbeat thread: beats every [`BEAT`], and reads the object again at once when a
/// notification asks.
fn beat(s: &Arc<Shared>, watch_slot: &Arc<Mutex<Option<u64>>>) {
    let mut next = Instant::now() + BEAT;
    loop {
        let asked = {
            let mut w = s.wake.lock().unwrap_or_else(|e| e.into_inner());
            while w.0 == w.1 && !s.stop.load(Ordering::Acquire) {
                let left = next.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                w = s
                    .woken
                    .wait_timeout(w, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            w.0
        };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let due = Instant::now() >= next;
        s.refresh(due);
        if due {
            next = Instant::now() + BEAT;
        }
        {
            let mut w = s.wake.lock().unwrap_or_else(|e| e.into_inner());
            w.1 = w.1.max(asked);
            s.done.notify_all();
        }
        if s.watch_broken.load(Ordering::Acquire) && s.judge_own_active() {
            let old = watch_slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(c) = old {
                // SAFETY: a cookie of this context's, unwatched once.
                unsafe { ffi::rados_unwatch2(s.client.rados.io, c) };
            }
            match watch(s) {
                Ok(c) => {
                    *watch_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                    s.watch_broken.store(false, Ordering::Release);
                    tracing::info!("{}: ALUA watch established again", s.shown);
                }
                Err(e) => tracing::debug!("{e}"),
            }
        }
    }
}

impl Shared {
    fn judge_own_active(&self) -> bool {
        self.judge
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .own_state(Instant::now())
            .is_active()
    }
}

impl PortGroups for ClusterGroups {
    fn states(&self) -> Vec<GroupState> {
        let mut j = self.shared.judge.lock().unwrap_or_else(|e| e.into_inner());
        // Judged at the time of the question: a target cut off turns transitioning even
        // while its heartbeat thread waits on the cluster.
        let (states, changed) = j.judge(Instant::now());
        drop(j);
        if changed {
            let f = self
                .shared
                .on_change
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(f) = f {
                f();
            }
        }
        states
    }

    fn own(&self) -> AccessState {
        self.shared
            .judge
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .own_state(Instant::now())
    }

    fn transition_time(&self) -> u8 {
        LEASE.as_secs() as u8
    }

    fn set(&self, states: &[(u16, AccessState)]) -> io::Result<()> {
        let s = &self.shared;
        for (g, state) in states {
            s.client
                .set_xattr(&format!("state.{g}"), state.name().as_bytes())?;
        }
        // This target's own answers first, then the others'.
        s.refresh(false);
        let mut payload = CHANGED.to_vec();
        payload.extend_from_slice(format!("{:x}", s.incarnation).as_bytes());
        if let Err(e) = s.client.notify(&payload) {
            // Kept in the cluster all the same: a target that missed the notification
            // reads the new states at its next beat.
            tracing::warn!(
                "{}: not every target acknowledged the new ALUA states: {e}",
                s.shown
            );
        }
        Ok(())
    }

    fn on_change(&self, f: Arc<dyn Fn() + Send + Sync>) {
        *self
            .shared
            .on_change
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(f);
    }
}

impl Drop for ClusterGroups {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _w = self.shared.wake.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.woken.notify_all();
            self.shared.done.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(c) = self.watch.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // SAFETY: a cookie of this context's; flushed so that no callback still runs
            // on `shared` once it goes.
            unsafe {
                ffi::rados_unwatch2(self.shared.client.rados.io, c);
                ffi::rados_watch_flush(self.shared.client.rados.cluster);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beats(v: &[(u16, &str)]) -> HashMap<u16, Vec<u8>> {
        v.iter().map(|(g, b)| (*g, b.as_bytes().to_vec())).collect()
    }

    fn states(j: &mut Judge, now: Instant) -> Vec<(u16, AccessState, Why)> {
        j.judge(now)
            .0
            .into_iter()
            .map(|g| (g.group, g.state, g.why))
            .collect()
    }

    use AccessState::*;

    /// A judge of group 1 with peer 2 that saw both beat at `t0` and a second later.
    fn beating(t0: Instant) -> Judge {
        let mut j = Judge::new(1, &[2]);
        for (n, at) in [(1, t0), (2, t0 + Duration::from_secs(1))] {
            let (a, b) = (format!("a.{n}"), format!("b.{n}"));
            j.observe(&beats(&[(1, &a), (2, &b)]), HashMap::new(), true, at);
        }
        j
    }

    #[test]
    fn a_peer_is_judged_by_its_moving_heartbeat() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut j = Judge::new(1, &[2]);
        assert_eq!(j.own_state(t0), Transitioning, "before the first beat");
        j.observe(&beats(&[(1, "a.1"), (2, "b.7")]), HashMap::new(), true, t0);
        // A peer's counter only seen standing: in doubt.
        assert_eq!(
            states(&mut j, t0),
            [
                (1, ActiveOptimized, Why::None),
                (2, Transitioning, Why::None)
            ]
        );
        j.observe(
            &beats(&[(1, "a.2"), (2, "b.8")]),
            HashMap::new(),
            true,
            t0 + s(1),
        );
        assert_eq!(
            states(&mut j, t0 + s(1)),
            [
                (1, ActiveOptimized, Why::None),
                (2, ActiveOptimized, Why::None)
            ]
        );
        // B stops: transitioning after DOUBT, unavailable after LEASE, as A reads on.
        let mut at = t0 + s(1);
        let mut seen = Vec::new();
        for n in 3..12 {
            at += s(1);
            j.observe(
                &beats(&[(1, &format!("a.{n}")), (2, "b.8")]),
                HashMap::new(),
                true,
                at,
            );
            seen.push(j.judge(at).0[1].state);
        }
        assert_eq!(
            seen,
            [
                ActiveOptimized,
                ActiveOptimized,
                ActiveOptimized,
                Transitioning,
                Transitioning,
                Transitioning,
                Unavailable,
                Unavailable,
                Unavailable
            ],
            "standing for 1 to 9 s"
        );
        assert_eq!(
            (DOUBT, LEASE),
            (Duration::from_secs(3), Duration::from_secs(6)),
            "the figures above"
        );
        assert_eq!(j.last()[1].why, Why::Implicit);
        // B restarts (a new incarnation): active again at once.
        at += s(1);
        j.observe(&beats(&[(1, "a.20"), (2, "c.1")]), HashMap::new(), true, at);
        assert_eq!(states(&mut j, at)[1], (2, ActiveOptimized, Why::Implicit));
    }

    #[test]
    fn a_target_cut_off_judges_itself_not_the_others() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut j = beating(t0);
        states(&mut j, t0 + s(1));
        // No read succeeds any more.
        assert_eq!(j.own_state(t0 + s(4)), ActiveOptimized);
        assert_eq!(j.own_state(t0 + s(5)), Transitioning);
        assert_eq!(j.own_state(t0 + s(8)), Unavailable);
        let now = states(&mut j, t0 + s(60));
        assert_eq!(now[0], (1, Unavailable, Why::Implicit));
        assert_eq!(now[1].1, ActiveOptimized, "B as last seen");
    }

    #[test]
    fn chosen_states_apply_to_live_groups_explicitly() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut j = beating(t0);
        let (_, changed) = j.judge(t0 + s(1));
        assert!(changed);
        assert!(!j.judge(t0 + s(1)).1, "no change, no news");
        let chosen = HashMap::from([(1, ActiveNonOptimized), (2, Standby)]);
        j.observe(
            &beats(&[(1, "a.3"), (2, "b.3")]),
            chosen.clone(),
            true,
            t0 + s(2),
        );
        assert_eq!(
            states(&mut j, t0 + s(2)),
            [
                (1, ActiveNonOptimized, Why::Explicit),
                (2, Standby, Why::Explicit)
            ]
        );
        // A dead group is unavailable whatever was chosen for it.
        for n in 4..12 {
            j.observe(
                &beats(&[(1, &format!("a.{n}")), (2, "b.3")]),
                chosen.clone(),
                true,
                t0 + s(n),
            );
        }
        assert_eq!(
            states(&mut j, t0 + s(11))[1],
            (2, Unavailable, Why::Implicit)
        );
    }

    #[test]
    fn records_skip_what_is_not_theirs() {
        let attrs = vec![
            ("hb.1".to_string(), b"x.1".to_vec()),
            ("hb.nope".to_string(), b"x".to_vec()),
            ("state.2".to_string(), b"standby".to_vec()),
            ("state.3".to_string(), b"bogus".to_vec()),
            ("other".to_string(), b"1".to_vec()),
        ];
        let (b, e) = records(&attrs);
        assert_eq!(b.len(), 1);
        assert_eq!(e, HashMap::from([(2, Standby)]));
    }
}
