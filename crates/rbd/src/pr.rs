//! Persistent reservations of an image that several targets export, kept in RADOS
//! (`backstore::ClusterReservations`; the argument is in docs/gateway.md).
//!
//! - One object beside the image, `reservoir.IMAGE.pr`: a first line
//!   `reservoir-pr-seq N` and then the logical unit's state (opaque here), read whole with
//!   one `rados_read` (a read of one object is atomic, so the sequence and the state
//!   always match), and an xattr `reservoir.seq` holding N.
//! - A change is one compound write: `cmpxattr(reservoir.seq == N)`, the new content with
//!   N + 1, `setxattr(reservoir.seq, N + 1)`. The OSD applies it whole or, when another
//!   target wrote first, not at all (ECANCELED). An xattr guard rather than the object's
//!   own version: the sequence then lives in the content that readers see in the same
//!   read, and no racy `rados_get_last_version` on a shared I/O context is needed.
//! - Every target watches the object; a change is published with `rados_notify2`
//!   carrying the new state, and each target acknowledges only after taking it.
//! - The lease: a target trusts its copy only until [`LEASE`] after it *sent* the last
//!   read that found its copy current, and only while its watch works. A thread reads
//!   the object every [`RENEW`]. A publisher whose notification some target did not
//!   acknowledge completes only once [`FENCE_AFTER`] (> [`LEASE`]) has passed since its
//!   write, by which time that target's lease has run out and it refuses commands that
//!   depend on reservations until it has read the object again.
//!
//! The client is a librados connection of its own, not the image's: its watch, its
//! reads and its reconnection do not depend on the image's commands coming.

use std::ffi::CString;
use std::io;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::wire::{acked, parse, parse_event, Content, EVENT};
use crate::{cstr, errno, ffi, lost, rand_id, Errno, Rados, RbdConfig};

/// How often the state is read again to keep the lease.
pub(crate) const RENEW: Duration = Duration::from_millis(500);
/// How long a read that found the copy current lets it be trusted, from the read's start.
pub(crate) const LEASE: Duration = Duration::from_secs(2);
/// How long a publisher waits for acknowledgements.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after its write a publisher that missed an acknowledgement completes: every
/// lease taken before the write has run out by then (with room for clock rates).
pub(crate) const FENCE_AFTER: Duration = Duration::from_millis(3000);
/// The largest state read.
const MAX_STATE: usize = 1 << 20;
const SEQ_XATTR: &str = "reservoir.seq";

#[derive(Default)]
struct Cache {
    seq: u64,
    /// The targets that take part: each must acknowledge a change, or be waited out.
    members: Vec<u64>,
    state: Arc<[u8]>,
    /// Until when the copy may be trusted; `None`: not now.
    lease_until: Option<Instant>,
}

type Handler = Arc<dyn Fn(&[u8]) + Send + Sync>;

struct Inner {
    cfg: RbdConfig,
    shown: String,
    oid: CString,
    me: u64,
    cache: Mutex<Cache>,
    handler: Mutex<Option<Handler>>,
    client: Mutex<Option<Arc<Client>>>,
    /// Set by the watch's error callback; the renewing thread watches again.
    watch_broken: AtomicBool,
    stop: Mutex<bool>,
    wake: Condvar,
    /// When this target's last write completed: a publish that missed an
    /// acknowledgement waits until [`FENCE_AFTER`] after it.
    written_at: Mutex<Option<Instant>>,
    /// Members a publish found silent, removed once waited out.
    waited_out: Mutex<Vec<u64>>,
}

/// What the watch's callbacks get.
struct WatchArg {
    inner: Weak<Inner>,
    io: ffi::rados_ioctx_t,
    oid: CString,
}

struct Client {
    rados: Rados,
    watch: Mutex<Option<(u64, Box<WatchArg>)>>,
}

// SAFETY: the watch's argument holds the I/O context, which librados lets many threads
// use; the box is only freed after the watch is flushed (Drop).
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: a watch this client made; its box lives until after the flush. `rados`
        // closes the context and the client after.
        unsafe {
            if let Some((cookie, _)) = self.watch.get_mut().unwrap_or_else(|e| e.into_inner()) {
                ffi::rados_unwatch2(self.rados.io, *cookie);
                ffi::rados_watch_flush(self.rados.cluster);
            }
        }
    }
}

impl Client {
    fn connect(cfg: &RbdConfig) -> io::Result<Client> {
        Ok(Client {
            rados: Rados::connect(cfg, "reservations: ", |_| Vec::new())?,
            watch: Mutex::new(None),
        })
    }

    /// Makes the object with sequence 0 and no state, unless it exists.
    fn create(&self, oid: &CString) -> io::Result<()> {
        let content = Content {
            seq: 0,
            members: Vec::new(),
            state: Vec::new(),
        };
        let r = self.write_op(oid, None, &content.bytes(), "0");
        match r {
            Err(e) if code(&e) == Some(libc::EEXIST) => Ok(()),
            other => other,
        }
    }

    /// One compound write: guard (`Some(seq)`: cmpxattr; `None`: exclusive create), the
    /// content, the xattr.
    fn write_op(
        &self,
        oid: &CString,
        guard: Option<u64>,
        content: &[u8],
        new_seq: &str,
    ) -> io::Result<()> {
        let name = cstr(SEQ_XATTR)?;
        let old = guard.map(|s| s.to_string());
        // SAFETY: the op is released below; every buffer outlives `operate`.
        let r = unsafe {
            let op = ffi::rados_create_write_op();
            if op.is_null() {
                return Err(io::Error::other("rados_create_write_op failed"));
            }
            match &old {
                Some(s) => ffi::rados_write_op_cmpxattr(
                    op,
                    name.as_ptr(),
                    ffi::LIBRADOS_CMPXATTR_OP_EQ,
                    s.as_ptr().cast(),
                    s.len(),
                ),
                None => ffi::rados_write_op_create(op, ffi::LIBRADOS_CREATE_EXCLUSIVE, ptr::null()),
            }
            ffi::rados_write_op_write_full(op, content.as_ptr().cast(), content.len());
            ffi::rados_write_op_setxattr(op, name.as_ptr(), new_seq.as_ptr().cast(), new_seq.len());
            let r =
                ffi::rados_write_op_operate(op, self.rados.io, oid.as_ptr(), ptr::null_mut(), 0);
            ffi::rados_release_write_op(op);
            r
        };
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("writing {}", oid.to_string_lossy()),
            ));
        }
        Ok(())
    }

    fn read(&self, oid: &CString) -> io::Result<Content> {
        let mut buf = vec![0u8; MAX_STATE];
        // SAFETY: a valid context; `buf` holds `len` bytes.
        let r = unsafe {
            ffi::rados_read(
                self.rados.io,
                oid.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
            )
        };
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("reading {}", oid.to_string_lossy()),
            ));
        }
        let n = r as usize;
        if n >= buf.len() {
            return Err(io::Error::other(format!(
                "{} is larger than {MAX_STATE} bytes",
                oid.to_string_lossy()
            )));
        }
        buf.truncate(n);
        parse(&buf).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a reservation state", oid.to_string_lossy()),
            )
        })
    }

    fn watch(&self, inner: &Arc<Inner>) -> io::Result<()> {
        let mut slot = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cookie, _)) = slot.take() {
            // SAFETY: a watch of this context; its box is dropped after the flush.
            unsafe {
                ffi::rados_unwatch2(self.rados.io, cookie);
                ffi::rados_watch_flush(self.rados.cluster);
            }
        }
        let arg = Box::new(WatchArg {
            inner: Arc::downgrade(inner),
            io: self.rados.io,
            oid: inner.oid.clone(),
        });
        let mut cookie = 0u64;
        // SAFETY: a valid context; the callbacks' argument is the box, kept in `slot`
        // until after rados_unwatch2 and rados_watch_flush.
        let r = unsafe {
            ffi::rados_watch2(
                self.rados.io,
                inner.oid.as_ptr(),
                &mut cookie,
                on_notify,
                on_watch_error,
                &*arg as *const WatchArg as *mut c_void,
            )
        };
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("watching {}", inner.oid.to_string_lossy()),
            ));
        }
        *slot = Some((cookie, arg));
        Ok(())
    }

    /// Whether the watch is established and was confirmed within the lease.
    fn watch_healthy(&self) -> bool {
        let slot = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        let Some((cookie, _)) = slot.as_ref() else {
            return false;
        };
        // SAFETY: a watch of this context.
        let r = unsafe { ffi::rados_watch_check(self.rados.io, *cookie) };
        r >= 0 && (r as u128) < LEASE.as_millis()
    }
}

/// The errno of a failed librados call.
fn code(e: &io::Error) -> Option<i32> {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<Errno>())
        .map(|x| x.errno)
        .or(e.raw_os_error())
}

extern "C" fn on_notify(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the boxed `WatchArg` its client keeps until after rados_unwatch2 and
    // rados_watch_flush; `data` holds `len` bytes for the call.
    let w = unsafe { &*(arg as *const WatchArg) };
    let payload: &[u8] = if data.is_null() {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }
    };
    if let (Some(inner), Some((sender, seq, state, event))) =
        (w.inner.upgrade(), parse_event(payload))
    {
        if sender != inner.me {
            if let Some(c) = parse(state).filter(|c| c.seq == seq) {
                inner.take(c);
            }
            let handler = inner
                .handler
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(h) = handler {
                h(event);
            }
        }
    }
    // Acknowledged only now, with this target's id: the publisher's change has been
    // taken here, and the publisher tells who has taken it.
    let me = w
        .inner
        .upgrade()
        .map(|i| i.me.to_string())
        .unwrap_or_default();
    // SAFETY: a valid context and the watched object's name; `me` outlives the call.
    unsafe {
        ffi::rados_notify_ack(
            w.io,
            w.oid.as_ptr(),
            notify_id,
            cookie,
            me.as_ptr().cast(),
            me.len() as c_int,
        )
    };
}

extern "C" fn on_watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in `on_notify`.
    let w = unsafe { &*(arg as *const WatchArg) };
    if let Some(inner) = w.inner.upgrade() {
        // Changes may be missed from now on: stop trusting the copy at once.
        inner
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lease_until = None;
        inner.watch_broken.store(true, Ordering::Release);
        tracing::warn!(
            "{}: the watch on the reservations failed ({}); commands that depend on them \
             are refused until the state is read again",
            inner.shown,
            io::Error::from_raw_os_error(-err)
        );
        inner.wake.notify_all();
    }
}

impl Inner {
    /// Takes a content at least as new as the copy's.
    fn take(&self, new: Content) {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if new.seq >= c.seq {
            c.seq = new.seq;
            c.members = new.members;
            c.state = new.state.into();
        }
    }

    /// Changes the members by compare-and-set (`f` on the list read), until it holds.
    fn members(&self, client: &Client, f: impl Fn(&mut Vec<u64>)) -> io::Result<()> {
        for _ in 0..64 {
            let mut c = client.read(&self.oid)?;
            let before = c.members.clone();
            f(&mut c.members);
            if c.members == before {
                self.take(c);
                return Ok(());
            }
            let old = c.seq;
            c.seq += 1;
            match client.write_op(&self.oid, Some(old), &c.bytes(), &c.seq.to_string()) {
                Ok(()) => {
                    self.take(c);
                    return Ok(());
                }
                Err(e) if code(&e) == Some(libc::ECANCELED) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("the members kept changing"))
    }

    fn client(&self) -> io::Result<Arc<Client>> {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("{}: reservations: not connected to the cluster", self.shown),
                )
            })
    }

    /// Drops a client that failed as lost; the renewing thread connects again.
    fn failed(&self, client: &Arc<Client>, e: io::Error) -> io::Error {
        if lost(&e) {
            let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
                *slot = None;
            }
            self.cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lease_until = None;
        }
        io::Error::new(e.kind(), format!("{}: {e}", self.shown))
    }

    /// Connects (when not connected), watches, reads: the lease's one renewal.
    fn renew(self: &Arc<Self>) -> io::Result<()> {
        let client = match self.client() {
            Ok(c) => c,
            Err(_) => {
                let c = Arc::new(Client::connect(&self.cfg)?);
                c.create(&self.oid)?;
                self.watch_broken.store(true, Ordering::Release);
                *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
                tracing::info!("{}: reservations: connected", self.shown);
                c
            }
        };
        if self.watch_broken.swap(false, Ordering::AcqRel) || !client.watch_healthy() {
            if let Err(e) = client.watch(self) {
                self.watch_broken.store(true, Ordering::Release);
                return Err(self.failed(&client, e));
            }
        }
        let mut sent = Instant::now();
        let mut read = client
            .read(&self.oid)
            .map_err(|e| self.failed(&client, e))?;
        if !read.members.contains(&self.me) {
            // Not (or no longer: another target waited this one out) a member: others
            // would not wait for this target's acknowledgement, so it may trust nothing
            // until it is one again.
            let me = self.me;
            self.members(&client, |m| m.push(me))
                .map_err(|e| self.failed(&client, e))?;
            sent = Instant::now();
            read = client
                .read(&self.oid)
                .map_err(|e| self.failed(&client, e))?;
            if !read.members.contains(&self.me) {
                return Err(io::Error::other("joined, then removed at once"));
            }
        }
        self.take(read);
        // A copy newer than the read (taken from a notification meanwhile) is as current.
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if !self.watch_broken.load(Ordering::Acquire) && client.watch_healthy() {
            c.lease_until = Some(sent + LEASE);
        }
        Ok(())
    }

    fn run(self: Arc<Self>) {
        let mut logged = false;
        loop {
            match self.renew() {
                Ok(()) => {
                    if logged {
                        tracing::info!("{}: reservations: the state is current again", self.shown);
                    }
                    logged = false;
                }
                Err(e) if !logged => {
                    tracing::warn!("{}: reservations: {e}; retrying", self.shown);
                    logged = true;
                }
                Err(_) => {}
            }
            let stop = self.stop.lock().unwrap_or_else(|e| e.into_inner());
            let (stop, _) = self
                .wake
                .wait_timeout(stop, RENEW)
                .unwrap_or_else(|e| e.into_inner());
            if *stop {
                return;
            }
        }
    }
}

/// The reservations of one shared image in RADOS, and the thread that keeps the lease.
pub(crate) struct ClusterPr {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ClusterPr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterPr({})", self.inner.oid.to_string_lossy())
    }
}

impl ClusterPr {
    /// Connects, makes the object if missing, watches it and reads it: the store opens
    /// with a current copy and a lease, or not at all.
    pub(crate) fn open(cfg: &RbdConfig) -> io::Result<ClusterPr> {
        let inner = Arc::new(Inner {
            shown: cfg.shown(),
            oid: cstr(&format!("reservoir.{}.pr", cfg.image))?,
            cfg: cfg.clone(),
            me: rand_id(),
            cache: Mutex::default(),
            handler: Mutex::new(None),
            client: Mutex::new(None),
            watch_broken: AtomicBool::new(true),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            written_at: Mutex::new(None),
            waited_out: Mutex::new(Vec::new()),
        });
        inner.renew()?;
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("rbd-pr".into())
                .spawn(move || inner.run())?
        };
        Ok(ClusterPr {
            inner,
            thread: Some(thread),
        })
    }
}

impl Drop for ClusterPr {
    fn drop(&mut self) {
        *self.inner.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Leaving: the others need not wait for this target any more.
        let client = self
            .inner
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(c) = client {
            let me = self.inner.me;
            if let Err(e) = self.inner.members(&c, |m| m.retain(|x| *x != me)) {
                tracing::warn!("{}: reservations: leaving: {e}", self.inner.shown);
            }
        }
    }
}

impl backstore::ClusterReservations for ClusterPr {
    fn cached(&self) -> io::Result<(u64, Arc<[u8]>)> {
        let c = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        match c.lease_until {
            Some(t) if Instant::now() < t => Ok((c.seq, c.state.clone())),
            _ => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{}: the reservations are not known to be current (cut off from the \
                     cluster, or the watch broke)",
                    self.inner.shown
                ),
            )),
        }
    }

    fn load(&self) -> io::Result<(u64, Vec<u8>)> {
        let client = self.inner.client()?;
        let c = client
            .read(&self.inner.oid)
            .map_err(|e| self.inner.failed(&client, e))?;
        let (seq, state) = (c.seq, c.state.clone());
        self.inner.take(c);
        Ok((seq, state))
    }

    fn store(&self, seq: u64, state: &[u8]) -> io::Result<bool> {
        let client = self.inner.client()?;
        let members = {
            let c = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.seq != seq {
                // Newer than what the caller read: its write would fail the guard.
                return Ok(false);
            }
            c.members.clone()
        };
        let content = Content {
            seq: seq + 1,
            members,
            state: state.to_vec(),
        };
        let bytes = content.bytes();
        match client.write_op(&self.inner.oid, Some(seq), &bytes, &content.seq.to_string()) {
            Ok(()) => {
                *self
                    .inner
                    .written_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                self.inner.take(content);
                Ok(true)
            }
            Err(e) if code(&e) == Some(libc::ECANCELED) => Ok(false),
            Err(e) => Err(self.inner.failed(&client, e)),
        }
    }

    fn publish(&self, seq: u64, state: &[u8], event: &[u8]) -> io::Result<()> {
        let members = {
            let c = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
            c.members.clone()
        };
        let content = Content {
            seq,
            members: members.clone(),
            state: state.to_vec(),
        }
        .bytes();
        let mut payload = EVENT.to_vec();
        payload
            .extend_from_slice(format!("{} {seq} {}\n", self.inner.me, content.len()).as_bytes());
        payload.extend_from_slice(&content);
        payload.extend_from_slice(event);
        let client = self.inner.client();
        let result = client
            .as_ref()
            .map_err(|e| io::Error::new(e.kind(), e.to_string()))
            .and_then(|client| {
                let mut reply: *mut c_char = ptr::null_mut();
                let mut reply_len = 0usize;
                // SAFETY: a valid context; the payload outlives the call; the reply is freed.
                let r = unsafe {
                    ffi::rados_notify2(
                        client.rados.io,
                        self.inner.oid.as_ptr(),
                        payload.as_ptr().cast(),
                        payload.len() as c_int,
                        NOTIFY_TIMEOUT.as_millis() as u64,
                        &mut reply,
                        &mut reply_len,
                    )
                };
                let acks = if reply.is_null() {
                    None
                } else {
                    // SAFETY: librados allocated `reply_len` bytes for us; freed below.
                    let a =
                        acked(unsafe { std::slice::from_raw_parts(reply as *const u8, reply_len) });
                    unsafe { ffi::rados_buffer_free(reply) };
                    a
                };
                if r < 0 {
                    return Err(errno(r.into(), "notifying the other targets"));
                }
                let acks = acks.unwrap_or_default();
                let missing: Vec<u64> = members
                    .iter()
                    .copied()
                    .filter(|m| *m != self.inner.me && !acks.contains(m))
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
                // Waited out below; then they are members no more, so that the next change
                // does not wait for them (each joins again before trusting anything).
                let e = io::Error::other(format!(
                    "no acknowledgement from {} member(s)",
                    missing.len()
                ));
                *self
                    .inner
                    .waited_out
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = missing;
                Err(e)
            });
        if let Err(e) = result {
            // Some target may not have taken the change: complete only once its lease,
            // which began before the write, has certainly run out.
            let written = *self
                .inner
                .written_at
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let wait = written.map_or(FENCE_AFTER, |t| FENCE_AFTER.saturating_sub(t.elapsed()));
            tracing::warn!(
                "{}: reservations: {e}; completing in {} ms, once every target that missed \
                 the change has stopped trusting its older copy",
                self.inner.shown,
                wait.as_millis()
            );
            std::thread::sleep(wait);
            let gone = std::mem::take(
                &mut *self
                    .inner
                    .waited_out
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            if let (false, Ok(c)) = (gone.is_empty(), &client) {
                if let Err(e) = self.inner.members(c, |m| m.retain(|x| !gone.contains(x))) {
                    tracing::warn!("{}: reservations: removing members: {e}", self.inner.shown);
                }
            }
        }
        Ok(())
    }

    fn on_event(&self, f: Arc<dyn Fn(&[u8]) + Send + Sync>) {
        *self.inner.handler.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_the_fence() {
        assert!(FENCE_AFTER > LEASE && NOTIFY_TIMEOUT >= FENCE_AFTER);
    }
}
