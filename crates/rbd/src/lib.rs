//! A Ceph RBD image as a store: the `rbd` kind, `rbd:POOL/[NAMESPACE/]IMAGE?conf=...`,
//! through a thin FFI over librbd's C API ([`ffi`]; Debian's librbd-dev).
//!
//! Reads, writes and flushes may be asynchronous ([`aio`]): started by the caller (the
//! connection's task), completed by librbd's callback on its own thread, with no thread
//! parked per command; a write to be made durable (FUA, or the write cache off) is
//! answered after an `rbd_aio_flush` queued from its completion. The other `Backstore`
//! calls (and these when the store has no connection, or a command is not a plain one)
//! are synchronous and come from the target's blocking workers, so each is librbd's
//! synchronous call, which is its asynchronous one and a wait on the completion; librbd's
//! own threads do the network I/O. Mapping:
//! - flush (SYNCHRONIZE CACHE, FUA writes, and every write while the LU's write cache is
//!   off) is `rbd_flush`; librbd's own cache is off unless `cache=yes` (see
//!   [`RbdFactory`]'s reason: with it, a failed durable write was acknowledged);
//! - discard and write_zeroes are both `rbd_write_zeroes`: `rbd_discard` silently ignores
//!   ranges smaller than `rbd_discard_granularity_bytes` (64 KiB) and the store's contract
//!   is that a discarded range reads as zeros; librbd's zeroing removes whole objects and
//!   zeroes partial ones, so space is freed where it can be;
//! - the allocation status is `rbd_diff_iterate2` from the beginning of time;
//! - compare-and-write is `rbd_compare_and_write`, one OSD operation, for a range inside
//!   one 512-byte sector (all librbd 16.2 takes; [`caw`] says why longer ones are refused);
//! - the size is the image's as librbd last saw it: an update watch on the image's header
//!   (`rbd_update_watch`) wakes a thread of the store's, which reads the size again (and
//!   does so every few seconds besides), so an image resized with `rbd resize` while it is
//!   exported changes the store's size and the logical unit raises CAPACITY DATA HAS
//!   CHANGED.
//!
//! librados delivers completions on one thread (`librados_thread_count = 1`, the `threads`
//! parameter) rather than its default two: the wake-ups between librados' and librbd's
//! threads are most of a 4 KiB read's cost, and with one thread the target spent a third less
//! CPU per read (docs/bench-rbd.md). A store shared with other targets keeps librados' count.
//!
//! Every operation has a deadline (`timeout`, 30 s by default: librados' OSD and monitor
//! operation timeouts and its mount timeout), so an unreachable or stalled cluster fails
//! commands with a clear error instead of holding them forever. A command that finds the
//! client cut off (timed out, blocklisted, not connected) drops the connection, and the
//! next command connects again, so the store comes back without restarting the target.

pub mod wire;

/// Everything but [`wire`] needs librbd and librados: only with the `ceph` feature (on by
/// default; the fuzz targets build without it, so without Ceph's libraries).
macro_rules! with_ceph {
    ($($item:item)*) => { $(#[cfg(feature = "ceph")] $item)* };
}

with_ceph! {
use std::ffi::{CStr, CString, NulError};
use std::io;
use std::os::raw::{c_int, c_void};
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use backstore::buffers::Buf;
use backstore::{
    Backstore, FlushDone, LentDone, OpenContext, OpenError, Param, ReadDone, Registry,
    StoreFactory, StoreSpec, WriteDone,
};

mod aio;
pub mod alua;
mod caw;
pub mod ffi;
mod pr;

/// Registers the `rbd` kind.
pub fn register(registry: &mut Registry) {
    registry.register(RbdFactory);
}

/// Where an image is and how to reach its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdConfig {
    pub pool: String,
    pub namespace: Option<String>,
    pub image: String,
    /// ceph.conf; librados' default search (`/etc/ceph/ceph.conf`, ...) when `None`.
    pub conf: Option<PathBuf>,
    /// Monitor addresses, overriding the configuration file's.
    pub mon_host: Option<String>,
    /// The client's id: `admin` for `client.admin`.
    pub id: String,
    pub keyring: Option<PathBuf>,
    /// Deadline of every cluster operation, and of connecting.
    pub timeout: Duration,
    /// librbd's cache: its own default (on) when `None`.
    pub cache: Option<bool>,
    /// librados' completion threads (`librados_thread_count`, `io_context_pool`): the
    /// configuration file's (or librados' default, 2) when `None`.
    pub threads: Option<u32>,
    /// Other targets export the image too: resets are announced to them and theirs taken
    /// (see [`PeerEvents`]).
    pub shared: bool,
    /// Large reads lend librbd's own buffers (through the C++ shim, `aio::read_lent`)
    /// rather than have librbd copy them into ours; only with the cache off.
    pub lend: bool,
}

impl RbdConfig {
    /// `POOL/IMAGE` or `POOL/NAMESPACE/IMAGE`, as `rbd` writes it.
    pub fn new(path: &str) -> Result<RbdConfig, String> {
        let parts: Vec<&str> = path.split('/').collect();
        let (pool, namespace, image) = match parts[..] {
            [p, i] => (p, None, i),
            [p, n, i] => (p, Some(n.to_owned()), i),
            _ => {
                return Err(format!(
                    "{path:?} is not POOL/IMAGE or POOL/NAMESPACE/IMAGE"
                ))
            }
        };
        if pool.is_empty() || image.is_empty() || namespace.as_deref() == Some("") {
            return Err(format!("{path:?}: empty pool, namespace or image name"));
        }
        Ok(RbdConfig {
            pool: pool.to_owned(),
            namespace,
            image: image.to_owned(),
            conf: None,
            mon_host: None,
            id: "admin".into(),
            keyring: None,
            timeout: DEFAULT_TIMEOUT,
            cache: None,
            threads: None,
            shared: false,
            lend: true,
        })
    }

    /// `pool/[namespace/]image`.
    pub fn name(&self) -> String {
        match &self.namespace {
            Some(n) => format!("{}/{n}/{}", self.pool, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }

    /// The image and the cluster, for messages.
    fn shown(&self) -> String {
        let conf = match (&self.mon_host, &self.conf) {
            (Some(m), _) => format!("monitors {m}"),
            (None, Some(c)) => format!("cluster of {}", c.display()),
            (None, None) => "the default cluster".into(),
        };
        format!("RBD image {} ({conf}, client.{})", self.name(), self.id)
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// After a failed connection, commands fail at once for this long before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often the size is read again without a notification from the update watch.
const SIZE_POLL: Duration = Duration::from_secs(5);

/// The image's size as last read, and the wake-up of the thread that reads it.
#[derive(Debug, Default)]
struct SizeWatch {
    size: AtomicU64,
    /// Set by the update watch's callback (or by the store's drop, with `stop`).
    poked: Mutex<bool>,
    cv: Condvar,
    stop: AtomicBool,
}

impl SizeWatch {
    fn poke(&self) {
        *self.poked.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_one();
    }

    /// Waits for a poke or `timeout`; false once the store is being dropped.
    fn wait(&self, timeout: Duration) -> bool {
        let mut poked = self.poked.lock().unwrap_or_else(|e| e.into_inner());
        if !*poked && !self.stop.load(Ordering::Acquire) {
            poked = self
                .cv
                .wait_timeout(poked, timeout)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *poked = false;
        !self.stop.load(Ordering::Acquire)
    }
}

/// What the targets that export one image tell each other (multipath across targets),
/// through RADOS watch/notify on an object of their own beside the image,
/// `reservoir.IMAGE` (empty; made by the first target that opens the image shared): a
/// logical unit reset, so that every nexus of every target gets its unit attention.
struct PeerEvents {
    /// This store's id in the payload, so that it ignores its own notifications.
    me: u64,
    /// What the logical unit does when a peer announces a reset.
    on_reset: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

/// The payload of a reset announcement: this prefix and the sender's id.
const RESET_EVENT: &[u8] = b"reservoir lun-reset ";
/// How long an announcement waits for the other targets' acknowledgements.
const NOTIFY_TIMEOUT_MS: u64 = 5000;

/// A watch on the events object: what its callbacks need.
struct PeerWatch {
    io: ffi::rados_ioctx_t,
    oid: CString,
    events: Arc<PeerEvents>,
}

extern "C" fn peer_event(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: `arg` is the boxed `PeerWatch` its `Conn` keeps until after rados_unwatch2 and
    // rados_watch_flush; `data` holds `len` bytes for the call.
    let w = unsafe { &*(arg as *const PeerWatch) };
    let payload: &[u8] = if data.is_null() {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }
    };
    if let Some(sender) = payload.strip_prefix(RESET_EVENT) {
        let mine = sender == w.events.me.to_string().as_bytes();
        let handler = w
            .events
            .on_reset
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let (false, Some(h)) = (mine, handler) {
            h();
        }
    }
    // Acknowledged after the handler ran: the announcing target's reset completes once
    // every target has queued its unit attentions.
    // SAFETY: a valid context and the watched object's name; no reply payload.
    unsafe { ffi::rados_notify_ack(w.io, w.oid.as_ptr(), notify_id, cookie, ptr::null(), 0) };
}

extern "C" fn peer_watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in `peer_event`.
    let w = unsafe { &*(arg as *const PeerWatch) };
    tracing::warn!(
        "{}: the watch for other targets' resets failed ({}); resets they announce are \
         missed until the store connects again",
        w.oid.to_string_lossy(),
        io::Error::from_raw_os_error(-err)
    );
}

/// librbd's update watch callback: the header changed (a resize among other things).
extern "C" fn header_changed(arg: *mut c_void) {
    // SAFETY: `arg` is the `SizeWatch` a `Conn` keeps alive (its `Arc`) until after
    // `rbd_update_unwatch` has returned, after which librbd calls no more.
    let watch = unsafe { &*(arg as *const SizeWatch) };
    watch.poke();
}

/// A client option's value as librados has it (after the configuration file), or `None`.
fn conf_get(cluster: ffi::rados_t, option: &str) -> Option<String> {
    let opt = cstr(option).ok()?;
    let mut buf = [0u8; 256];
    // SAFETY: a created handle; `buf` holds `len` bytes, NUL-terminated by librados.
    let r =
        unsafe { ffi::rados_conf_get(cluster, opt.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// An id for this store among the targets sharing an image: the process and the time.
fn rand_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (std::process::id() as u64) << 32 ^ t.as_nanos() as u64
}

/// The I/O context of `cfg`'s pool, in its namespace if it names one, on a connected
/// `cluster`: what the image, the reservations and the ALUA states each open.
pub(crate) fn open_ioctx(
    cluster: ffi::rados_t,
    cfg: &RbdConfig,
    shown: &str,
) -> io::Result<ffi::rados_ioctx_t> {
    // Both names first, so that nothing is left open when one is refused.
    let pool = cstr(&cfg.pool)?;
    let ns = cfg.namespace.as_deref().map(cstr).transpose()?;
    let mut io = ptr::null_mut();
    // SAFETY: a connected handle; out-pointer to the context.
    let r = unsafe { ffi::rados_ioctx_create(cluster, pool.as_ptr(), &mut io) };
    if r < 0 {
        return Err(errno(
            r.into(),
            format!("{shown}: opening pool {:?}", cfg.pool),
        ));
    }
    if let Some(ns) = &ns {
        // SAFETY: a valid context; librados copies the name.
        unsafe { ffi::rados_ioctx_set_namespace(io, ns.as_ptr()) };
    }
    Ok(io)
}

/// A librados client connected to `cfg`'s cluster, with the I/O context of its pool: the
/// image's connection, the reservations and the ALUA states each hold one of their own, so
/// that one's watches, deadlines and reconnections leave the others alone. Closed when
/// dropped, context before client (a holder closes what it opened on them first).
pub(crate) struct Rados {
    pub(crate) cluster: ffi::rados_t,
    pub(crate) io: ffi::rados_ioctx_t,
}

// SAFETY: librados clients and I/O contexts may be used from many threads at once; the
// handles are only closed in `drop`.
unsafe impl Send for Rados {}
unsafe impl Sync for Rados {}

impl Rados {
    /// Creates a client as `cfg` says (its configuration file or librados' default search,
    /// its `timeout` as the deadline of every operation and of the mount, its monitors and
    /// keyring), sets the options `more` gives over those (it is handed the client, to read
    /// what the file said), connects and opens the pool. `purpose` ("reservations: ", or
    /// "" for the image's client) says in an error which client failed.
    pub(crate) fn connect(
        cfg: &RbdConfig,
        purpose: &str,
        more: impl FnOnce(ffi::rados_t) -> Vec<(&'static str, String)>,
    ) -> io::Result<Rados> {
        let shown = cfg.shown();
        let id = cstr(&cfg.id)?;
        let mut cluster: ffi::rados_t = ptr::null_mut();
        // SAFETY: out-pointer to a handle; `id` outlives the call.
        let r = unsafe { ffi::rados_create(&mut cluster, id.as_ptr()) };
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("{shown}: {purpose}creating a client"),
            ));
        }
        // From here the partial client is closed by Drop.
        let mut rados = Rados {
            cluster,
            io: ptr::null_mut(),
        };
        let path = cfg
            .conf
            .as_ref()
            .map(|p| cstr(&p.to_string_lossy()))
            .transpose()?;
        // SAFETY: a handle not yet connected; NULL asks for the default search.
        let r = unsafe {
            ffi::rados_conf_read_file(cluster, path.as_ref().map_or(ptr::null(), |p| p.as_ptr()))
        };
        if r < 0 && (cfg.conf.is_some() || cfg.mon_host.is_none()) {
            let which = cfg
                .conf
                .as_ref()
                .map_or("the default ceph.conf".into(), |p| p.display().to_string());
            return Err(errno(r.into(), format!("{shown}: reading {which}")));
        }
        let secs = cfg.timeout.as_secs().max(1).to_string();
        let mut set: Vec<(&str, String)> = vec![
            ("rados_osd_op_timeout", secs.clone()),
            ("rados_mon_op_timeout", secs.clone()),
            ("client_mount_timeout", secs),
        ];
        if let Some(m) = &cfg.mon_host {
            set.push(("mon_host", m.clone()));
        }
        if let Some(k) = &cfg.keyring {
            set.push(("keyring", k.to_string_lossy().into_owned()));
        }
        set.extend(more(cluster));
        for (k, v) in set {
            let (ck, cv) = (cstr(k)?, cstr(&v)?);
            // SAFETY: a handle not yet connected; both strings outlive the call.
            let r = unsafe { ffi::rados_conf_set(cluster, ck.as_ptr(), cv.as_ptr()) };
            if r < 0 {
                return Err(errno(r.into(), format!("{shown}: setting {k}={v}")));
            }
        }
        let started = Instant::now();
        // SAFETY: a configured handle; blocks at most client_mount_timeout.
        let r = unsafe { ffi::rados_connect(cluster) };
        if r < 0 {
            let waited = started.elapsed().as_secs_f32();
            return Err(errno(
                r.into(),
                format!(
                    "{shown}: {purpose}cannot reach the cluster's monitors (gave up after \
                     {waited:.1} s)"
                ),
            ));
        }
        rados.io = open_ioctx(cluster, cfg, &shown)?;
        Ok(rados)
    }

    /// Makes the object `oid` by an empty write (called where it was found missing).
    pub(crate) fn create(&self, oid: &CStr) -> io::Result<()> {
        // SAFETY: a valid context; an empty write creates the object.
        let r = unsafe { ffi::rados_write_full(self.io, oid.as_ptr(), ptr::null(), 0) };
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("creating {}", oid.to_string_lossy()),
            ));
        }
        Ok(())
    }

    /// Tells the watchers of `oid` `payload`; returns once they have acknowledged or
    /// `timeout_ms` passed. `what` names the announcement in an error.
    pub(crate) fn notify(
        &self,
        oid: &CStr,
        payload: &[u8],
        timeout_ms: u64,
        what: &str,
    ) -> io::Result<()> {
        let mut reply: *mut std::os::raw::c_char = ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: a valid context; the payload outlives the call; the reply is freed below.
        let r = unsafe {
            ffi::rados_notify2(
                self.io,
                oid.as_ptr(),
                payload.as_ptr().cast(),
                payload.len() as c_int,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        if !reply.is_null() {
            // SAFETY: librados allocated it for us.
            unsafe { ffi::rados_buffer_free(reply) };
        }
        if r < 0 {
            return Err(errno(
                r.into(),
                format!("{}: {what}", oid.to_string_lossy()),
            ));
        }
        Ok(())
    }
}

impl Drop for Rados {
    fn drop(&mut self) {
        // SAFETY: each handle closed once, context before client; a null context was
        // never opened.
        unsafe {
            if !self.io.is_null() {
                ffi::rados_ioctx_destroy(self.io);
            }
            ffi::rados_shutdown(self.cluster);
        }
    }
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|e: NulError| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// A failed librados/librbd call: its errno and what was being done.
#[derive(Debug)]
struct Errno {
    errno: i32,
    what: String,
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let os = io::Error::from_raw_os_error(self.errno);
        write!(f, "{}: {os}", self.what)
    }
}

impl std::error::Error for Errno {}

/// librados/librbd's negative errno as an error saying what was being done.
fn errno(r: i64, what: impl std::fmt::Display) -> io::Error {
    let errno = (-r) as i32;
    let kind = io::Error::from_raw_os_error(errno).kind();
    io::Error::new(
        kind,
        Errno {
            errno,
            what: what.to_string(),
        },
    )
}

/// Whether an error means the client lost the cluster (timed out, blocklisted, not
/// connected), not that the cluster refused one request.
fn lost(e: &io::Error) -> bool {
    let code = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<Errno>())
        .map(|x| x.errno)
        .or(e.raw_os_error());
    matches!(
        code,
        Some(libc::ETIMEDOUT | libc::ESHUTDOWN | libc::ENOTCONN | libc::ECONNREFUSED)
    ) || e.kind() == io::ErrorKind::TimedOut
}

/// One connected client with the image open.
struct Conn {
    rados: Rados,
    image: ffi::rbd_image_t,
    /// The update watch on the image's header and what its callback wakes.
    watch: Option<(u64, Arc<SizeWatch>)>,
    /// The watch on the events object shared with other targets (shared stores only).
    peers: Option<(u64, Box<PeerWatch>)>,
}

// SAFETY: librados clients, I/O contexts and librbd image handles may be used from many
// threads at once (librbd serialises internally); the handles are only closed in `drop`.
unsafe impl Send for Conn {}
unsafe impl Sync for Conn {}

impl Conn {
    fn open(
        cfg: &RbdConfig,
        read_only: bool,
        sizes: &Arc<SizeWatch>,
        peers: Option<&Arc<PeerEvents>>,
    ) -> io::Result<Conn> {
        let shown = cfg.shown();
        let rados = Rados::connect(cfg, "", |cluster| {
            let mut set = Vec::new();
            // One completion thread rather than librados' two unless the LUN or the
            // configuration file says otherwise (a file that says 2, the default, is not
            // told from one that says nothing): each hop through librados'
            // `io_context_pool` costs a wake-up, and one thread does the completions of a
            // single client. Not for a store shared with other targets: see the `threads`
            // parameter.
            let threads = cfg.threads.or_else(|| {
                let file = conf_get(cluster, "librados_thread_count");
                (!cfg.shared && file.as_deref() == Some("2")).then_some(1)
            });
            if let Some(n) = threads {
                set.push(("librados_thread_count", n.to_string()));
            }
            if let Some(c) = cfg.cache {
                set.push(("rbd_cache", c.to_string()));
            }
            set
        })?;
        // From here the partial connection is closed by Drop.
        let mut conn = Conn {
            rados,
            image: ptr::null_mut(),
            watch: None,
            peers: None,
        };
        let name = cstr(&cfg.image)?;
        // SAFETY: a valid context; out-pointer to the image handle; no snapshot.
        let r = unsafe {
            if read_only {
                ffi::rbd_open_read_only(conn.rados.io, name.as_ptr(), &mut conn.image, ptr::null())
            } else {
                ffi::rbd_open(conn.rados.io, name.as_ptr(), &mut conn.image, ptr::null())
            }
        };
        if r < 0 {
            conn.image = ptr::null_mut();
            let what = if r == -libc::ENOENT {
                format!("{shown}: no such image")
            } else {
                format!("{shown}: opening the image")
            };
            return Err(errno(r.into(), what));
        }
        let arg = sizes.clone();
        let mut handle = 0u64;
        // SAFETY: an open image; the callback's argument is the Arc's target, which
        // `conn` keeps until after rbd_update_unwatch (Drop).
        let r = unsafe {
            ffi::rbd_update_watch(
                conn.image,
                &mut handle,
                header_changed,
                Arc::as_ptr(&arg) as *mut c_void,
            )
        };
        if r < 0 {
            // Without the watch a resize is still seen by the poll, only later.
            tracing::warn!(
                "{}",
                errno(r.into(), format!("{shown}: watching the image's header"))
            );
        } else {
            conn.watch = Some((handle, arg));
        }
        if let Some(events) = peers {
            conn.watch_peers(cfg, events)?;
        }
        Ok(conn)
    }

    /// The name of the object the targets sharing the image notify each other on.
    fn events_object(cfg: &RbdConfig) -> io::Result<CString> {
        cstr(&format!("reservoir.{}", cfg.image))
    }

    /// Watches the events object (made if missing) for other targets' announcements.
    fn watch_peers(&mut self, cfg: &RbdConfig, events: &Arc<PeerEvents>) -> io::Result<()> {
        let shown = cfg.shown();
        let oid = Self::events_object(cfg)?;
        let mut cookie = 0u64;
        let w = Box::new(PeerWatch {
            io: self.rados.io,
            oid: oid.clone(),
            events: events.clone(),
        });
        let watch = |cookie: &mut u64| {
            // SAFETY: a valid context; the callbacks' argument is the box, which `self`
            // keeps until after rados_unwatch2 and rados_watch_flush (Drop).
            unsafe {
                ffi::rados_watch2(
                    self.rados.io,
                    oid.as_ptr(),
                    cookie,
                    peer_event,
                    peer_watch_error,
                    &*w as *const PeerWatch as *mut c_void,
                )
            }
        };
        let mut r = watch(&mut cookie);
        if r == -libc::ENOENT {
            self.rados
                .create(&oid)
                .map_err(|e| io::Error::new(e.kind(), format!("{shown}: {e}")))?;
            r = watch(&mut cookie);
        }
        if r < 0 {
            return Err(errno(
                r.into(),
                format!(
                    "{shown}: watching {} for the other targets' resets",
                    oid.to_string_lossy()
                ),
            ));
        }
        self.peers = Some((cookie, w));
        Ok(())
    }

    /// Tells the other targets watching the image's events object of a reset, and waits
    /// until each has taken it (or [`NOTIFY_TIMEOUT_MS`]).
    fn announce_reset(&self, cfg: &RbdConfig, me: u64) -> io::Result<()> {
        let oid = Self::events_object(cfg)?;
        let mut payload = RESET_EVENT.to_vec();
        payload.extend_from_slice(me.to_string().as_bytes());
        self.rados
            .notify(&oid, &payload, NOTIFY_TIMEOUT_MS, "announcing a reset")
    }

    fn size(&self) -> io::Result<u64> {
        let mut size = 0u64;
        // SAFETY: an open image; out-pointer.
        let r = unsafe { ffi::rbd_get_size(self.image, &mut size) };
        if r < 0 {
            return Err(errno(r.into(), "rbd_get_size"));
        }
        Ok(size)
    }

    fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // SAFETY: `buf` is valid for `buf.len()` bytes for the whole (synchronous) call.
        let r =
            unsafe { ffi::rbd_read2(self.image, offset, buf.len(), buf.as_mut_ptr().cast(), 0) };
        if r < 0 {
            return Err(errno(
                r as i64,
                format!("read of {} at {offset}", buf.len()),
            ));
        }
        if r as usize != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read of {} at {offset}: only {r} bytes", buf.len()),
            ));
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // SAFETY: `buf` is valid for `buf.len()` bytes for the whole (synchronous) call.
        let r = unsafe { ffi::rbd_write2(self.image, offset, buf.len(), buf.as_ptr().cast(), 0) };
        if r < 0 {
            return Err(errno(
                r as i64,
                format!("write of {} at {offset}", buf.len()),
            ));
        }
        if r as usize != buf.len() {
            return Err(io::Error::other(format!(
                "write of {} at {offset}: only {r} bytes",
                buf.len()
            )));
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // SAFETY: an open image.
        let r = unsafe { ffi::rbd_flush(self.image) };
        if r < 0 {
            return Err(errno(r.into(), "flush"));
        }
        Ok(())
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        // Pieces librbd's size_t and ssize_t take whole.
        const PIECE: u64 = 1 << 30;
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(PIECE);
            // SAFETY: an open image; no buffers.
            let r = unsafe { ffi::rbd_write_zeroes(self.image, at, n as usize, 0, 0) };
            if r < 0 {
                return Err(errno(r as i64, format!("zeroing {n} at {at}")));
            }
            at += n;
        }
        Ok(())
    }

    fn allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64)>> {
        extern "C" fn each(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the Vec handed to rbd_diff_iterate2 below, alive and not
            // otherwise borrowed while it runs; librbd calls back on the calling thread's
            // behalf, one call at a time.
            let out = unsafe { &mut *(arg as *mut Vec<(u64, u64)>) };
            if exists != 0 {
                out.push((off, len as u64));
            }
            0
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        // SAFETY: an open image; the callback's argument outlives the synchronous call.
        let r = unsafe {
            ffi::rbd_diff_iterate2(
                self.image,
                ptr::null(),
                offset,
                len,
                1,
                0,
                each,
                (&mut out as *mut Vec<(u64, u64)>).cast(),
            )
        };
        if r < 0 {
            return Err(errno(r.into(), "rbd_diff_iterate2"));
        }
        out.sort_unstable();
        Ok(out)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // SAFETY: each handle is closed once, image before context before client; null
        // handles were never opened.
        unsafe {
            if let Some((handle, _)) = &self.watch {
                ffi::rbd_update_unwatch(self.image, *handle);
            }
            if let Some((cookie, _)) = &self.peers {
                ffi::rados_unwatch2(self.rados.io, *cookie);
                ffi::rados_watch_flush(self.rados.cluster);
            }
            if !self.image.is_null() {
                ffi::rbd_close(self.image);
            }
        }
        // `rados` closes the context, then the client.
    }
}

/// A failed operation on `conn`, named for the log and the sense data's reader; a failure
/// that means the connection is lost empties `slot` (if it still holds `conn`), so that
/// the next command connects again.
fn failed(
    slot: &Mutex<Option<Arc<Conn>>>,
    conn: &Arc<Conn>,
    shown: &str,
    e: io::Error,
) -> io::Error {
    let was_lost = lost(&e);
    let e = io::Error::new(e.kind(), format!("{shown}: {e}"));
    if was_lost {
        tracing::warn!("{e}; the next command connects again");
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }
    e
}

/// An RBD image as a [`Backstore`].
pub struct RbdImage {
    cfg: RbdConfig,
    /// `cfg.shown()`, made once: error messages of reads completed on librbd's threads.
    shown: Arc<str>,
    read_only: bool,
    /// The size now (see [`SizeWatch`]).
    sizes: Arc<SizeWatch>,
    /// The thread that reads the size again when the header changes.
    sizer: Option<std::thread::JoinHandle<()>>,
    conn: Arc<Mutex<Option<Arc<Conn>>>>,
    /// Shared stores: the events other targets send, and where a reset goes.
    peers: Option<Arc<PeerEvents>>,
    /// When connecting last failed, and why: commands within [`RETRY_AFTER`] fail so.
    failed: Mutex<Option<(Instant, String)>>,
    /// Shared stores: the persistent reservations, kept in RADOS (`pr`).
    reservations: Option<Arc<pr::ClusterPr>>,
}

impl std::fmt::Debug for RbdImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RbdImage({})", self.cfg.name())
    }
}

impl RbdImage {
    /// Connects to the cluster and opens the image (blocks up to `cfg.timeout`).
    pub fn open(cfg: RbdConfig, read_only: bool) -> io::Result<RbdImage> {
        let sizes = Arc::new(SizeWatch::default());
        let peers = cfg.shared.then(|| {
            Arc::new(PeerEvents {
                me: rand_id(),
                on_reset: Mutex::new(None),
            })
        });
        let conn = Conn::open(&cfg, read_only, &sizes, peers.as_ref())?;
        let reservations = match cfg.shared {
            true => Some(Arc::new(pr::ClusterPr::open(&cfg)?)),
            false => None,
        };
        sizes.size.store(conn.size()?, Ordering::Release);
        let conn = Arc::new(Mutex::new(Some(Arc::new(conn))));
        let sizer = {
            let (sizes, conn, shown) = (sizes.clone(), Arc::downgrade(&conn), cfg.shown());
            std::thread::Builder::new()
                .name("rbd-size".into())
                .spawn(move || watch_size(&sizes, &conn, &shown))?
        };
        Ok(RbdImage {
            shown: cfg.shown().into(),
            cfg,
            read_only,
            sizes,
            sizer: Some(sizer),
            conn,
            peers,
            failed: Mutex::new(None),
            reservations,
        })
    }

    fn size_now(&self) -> u64 {
        self.sizes.size.load(Ordering::Acquire)
    }

    pub fn config(&self) -> &RbdConfig {
        &self.cfg
    }

    /// The image's size now, asked of librbd (which reads the header again if it has
    /// changed); the store's size follows.
    pub fn current_size(&self) -> io::Result<u64> {
        let size = self.run(|c| c.size())?;
        self.sizes.size.store(size, Ordering::Release);
        Ok(size)
    }

    fn connection(&self) -> io::Result<Arc<Conn>> {
        if let Some(c) = self.conn.lock().unwrap().as_ref() {
            return Ok(c.clone());
        }
        if let Some((at, why)) = self.failed.lock().unwrap().as_ref() {
            if at.elapsed() < RETRY_AFTER {
                return Err(io::Error::new(io::ErrorKind::NotConnected, why.clone()));
            }
        }
        let fresh = Conn::open(&self.cfg, self.read_only, &self.sizes, self.peers.as_ref())
            .and_then(|c| {
                // The image may have been resized while the store was cut off.
                self.sizes.size.store(c.size()?, Ordering::Release);
                Ok(c)
            });
        match fresh {
            Ok(c) => {
                tracing::info!("{}: connected again", self.cfg.shown());
                *self.failed.lock().unwrap() = None;
                let c = Arc::new(c);
                let mut slot = self.conn.lock().unwrap();
                // Another command may have connected meanwhile: use its connection.
                Ok(slot.get_or_insert(c).clone())
            }
            Err(e) => {
                *self.failed.lock().unwrap() = Some((Instant::now(), e.to_string()));
                Err(e)
            }
        }
    }

    /// Runs `op` on the connection, connecting first if there is none; a connection that
    /// fails as lost is dropped, so that the next command connects afresh.
    fn run<T>(&self, op: impl FnOnce(&Conn) -> io::Result<T>) -> io::Result<T> {
        let conn = self.connection()?;
        op(&conn).map_err(|e| failed(&self.conn, &conn, &self.shown, e))
    }

    /// The connection, for an asynchronous operation: an error if there is none (lost
    /// since `reads_async` said yes), as connecting could block the caller.
    fn connected(&self) -> io::Result<Arc<Conn>> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        conn.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "{}: not connected (the connection was lost; the next command connects \
                     again)",
                    self.shown
                ),
            )
        })
    }

    /// What an asynchronous operation on `conn` carries besides its own arguments.
    fn on(&self, conn: Arc<Conn>) -> aio::On {
        aio::On {
            conn,
            slot: self.conn.clone(),
            shown: self.shown.clone(),
        }
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        let size = self.size_now();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("range {offset}+{len} is beyond the end of the store ({size} bytes)"),
            )),
        }
    }

    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the store is read-only",
            ));
        }
        Ok(())
    }
}

impl Drop for RbdImage {
    fn drop(&mut self) {
        self.sizes.stop.store(true, Ordering::Release);
        self.sizes.poke();
        if let Some(t) = self.sizer.take() {
            let _ = t.join();
        }
    }
}

/// The size thread: reads the image's size when the update watch says the header changed,
/// and every [`SIZE_POLL`] besides, on the store's connection when it has one (it does
/// not connect: the next command does).
fn watch_size(sizes: &SizeWatch, conn: &Weak<Mutex<Option<Arc<Conn>>>>, shown: &str) {
    while sizes.wait(SIZE_POLL) {
        let Some(slot) = conn.upgrade() else { return };
        let current = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        drop(slot);
        let Some(c) = current else { continue };
        match c.size() {
            Ok(size) => {
                let old = sizes.size.swap(size, Ordering::AcqRel);
                if old != size {
                    tracing::info!("{shown}: resized from {old} to {size} bytes");
                }
            }
            Err(e) => tracing::debug!("{shown}: reading the size: {e}"),
        }
    }
}

/// Smallest read that lends librbd's buffers (see [`RbdConfig::lend`]): below it librbd's
/// copy costs less than the bufferlist and the calls through the shim.
const LEND_MIN: usize = 64 * 1024;

impl Backstore for RbdImage {
    fn size(&self) -> u64 {
        self.size_now()
    }

    /// A shared image keeps its gateway group's ALUA states in the cluster
    /// ([`alua::ClusterGroups`]); an image one target exports has none to keep.
    fn port_groups(
        &self,
        own: u16,
        peers: &[u16],
    ) -> io::Result<Option<Arc<dyn backstore::groups::PortGroups>>> {
        if !self.cfg.shared {
            return Ok(None);
        }
        Ok(Some(Arc::new(alua::ClusterGroups::start(
            &self.cfg, own, peers,
        )?)))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.run(|c| c.read(buf, offset))
    }

    /// Yes while the store has a connection: without one, the blocking path connects.
    fn reads_async(&self) -> bool {
        self.conn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn read_async(&self, buf: Buf, offset: u64, done: ReadDone) {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return done(buf, Err(e));
        }
        let conn = match self.connected() {
            Ok(c) => c,
            Err(e) => return done(buf, Err(e)),
        };
        aio::read(self.on(conn), buf, offset, done);
    }

    /// Reads of [`LEND_MIN`] or more, while the store has a connection and lends
    /// (`lend=yes`, the default): librbd's own buffers, through the C++ shim.
    fn reads_lent_async(&self, len: usize) -> bool {
        self.cfg.lend && self.cfg.cache != Some(true) && len >= LEND_MIN && self.reads_async()
    }

    fn read_lent_async(&self, offset: u64, len: usize, done: LentDone) {
        if let Err(e) = self.check(offset, len as u64) {
            return done(Err(e));
        }
        match self.connected() {
            Ok(conn) => aio::read_lent(self.on(conn), len, offset, done),
            Err(e) => done(Err(e)),
        }
    }

    /// Yes while the store has a connection and takes writes.
    fn writes_async(&self) -> bool {
        !self.read_only && self.reads_async()
    }

    fn write_async(&self, buf: Buf, offset: u64, durable: bool, done: WriteDone) {
        if let Err(e) = self
            .writable()
            .and_then(|()| self.check(offset, buf.len() as u64))
        {
            return done(buf, Err(e));
        }
        match self.connected() {
            Ok(conn) => aio::write(self.on(conn), buf, offset, durable, done),
            Err(e) => done(buf, Err(e)),
        }
    }

    fn flush_async(&self, done: FlushDone) {
        if self.read_only {
            return done(Ok(()));
        }
        match self.connected() {
            Ok(conn) => aio::flush(self.on(conn), done),
            Err(e) => done(Err(e)),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writable()?;
        self.check(offset, buf.len() as u64)?;
        self.run(|c| c.write(buf, offset))
    }

    fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.run(|c| c.flush())
    }

    fn atomic_compare_and_write_unit(&self) -> Option<u64> {
        Some(caw::UNIT)
    }

    fn compare_and_write(
        &self,
        offset: u64,
        verify: &[u8],
        write: &[u8],
    ) -> io::Result<backstore::Compared> {
        self.writable()?;
        caw::check(offset, verify, write)?;
        self.check(offset, verify.len() as u64)?;
        self.run(|c| c.compare_and_write(offset, verify, write))
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        self.check(offset, len)?;
        self.run(|c| c.zero(offset, len))
    }

    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        self.check(offset, len)?;
        let extents = self.run(|c| c.allocated(offset, len))?;
        let mut out: Vec<(u64, u64, bool)> = Vec::new();
        let mut push = |o: u64, l: u64, a: bool| {
            if l == 0 {
                return;
            }
            if let Some(last) = out.last_mut() {
                if last.2 == a && last.0 + last.1 == o {
                    last.1 += l;
                    return;
                }
            }
            out.push((o, l, a));
        };
        let end = offset + len;
        let mut at = offset;
        for (o, l) in extents {
            let (s, e) = (o.max(at), (o + l).min(end));
            if e <= s {
                continue;
            }
            push(at, s - at, false);
            push(s, e - s, true);
            at = e;
        }
        push(at, end - at, false);
        Ok(out)
    }

    fn supports_discard(&self) -> bool {
        true
    }

    fn announce_reset(&self) -> io::Result<()> {
        match &self.peers {
            Some(p) => self.run(|c| c.announce_reset(&self.cfg, p.me)),
            None => Ok(()),
        }
    }

    fn on_peer_reset(&self, f: Arc<dyn Fn() + Send + Sync>) {
        if let Some(p) = &self.peers {
            *p.on_reset.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn cluster_reservations(&self) -> Option<Arc<dyn backstore::ClusterReservations>> {
        self.reservations
            .clone()
            .map(|r| r as Arc<dyn backstore::ClusterReservations>)
    }

    fn description(&self) -> String {
        format!("{}, {} bytes", self.cfg.shown(), self.size_now())
    }
}

/// `rbd:POOL/[NAMESPACE/]IMAGE?conf=PATH&id=NAME&keyring=PATH&...`.
struct RbdFactory;

const PARAMS: &[Param] = &[
    Param {
        name: "path",
        required: true,
        help: "POOL/IMAGE or POOL/NAMESPACE/IMAGE; the image must exist (rbd create)",
    },
    Param {
        name: "conf",
        required: false,
        help: "the cluster's ceph.conf (librados' default search when not given)",
    },
    Param {
        name: "mon_host",
        required: false,
        help: "monitor addresses, instead of or over the ceph.conf's",
    },
    Param {
        name: "id",
        required: false,
        help: "the client's id, `admin` (client.admin) by default",
    },
    Param {
        name: "keyring",
        required: false,
        help: "the client's keyring, over the ceph.conf's",
    },
    Param {
        name: "timeout",
        required: false,
        help: "deadline of connecting and of every cluster operation, as 30s (default)",
    },
    Param {
        name: "cache",
        required: false,
        help: "librbd's cache: yes/no (default: no; with it, librbd acknowledged a durable write and its flush that failed: tests/rbd.rs)",
    },
    Param {
        name: "lend",
        required: false,
        help: "reads of 64 KiB or more sent from librbd's own buffers, without its copy: yes/no (default yes; only with cache=no)",
    },
    Param {
        name: "threads",
        required: false,
        help: "librados' completion threads (librados_thread_count; default 1, or the ceph.conf's; 2 or more when shared)",
    },
];

impl RbdFactory {
    fn config(spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<RbdConfig, OpenError> {
        let path = spec.require("path")?;
        let mut cfg = RbdConfig::new(path).map_err(|e| OpenError::invalid(spec, e))?;
        cfg.conf = spec.param("conf").map(|p| ctx.resolve(p));
        cfg.keyring = spec.param("keyring").map(|p| ctx.resolve(p));
        cfg.mon_host = spec.param("mon_host").map(str::to_owned);
        if let Some(id) = spec.param("id") {
            cfg.id = id.strip_prefix("client.").unwrap_or(id).to_owned();
        }
        if let Some(t) = spec.param("timeout") {
            cfg.timeout = units::parse_duration(t)
                .map_err(|e| OpenError::invalid(spec, format!("timeout={t:?}: {e}")))?;
        }
        // Off unless asked for: with librbd's cache on (write-around after the first
        // flush) a durable write sent while the OSD was down was acknowledged, and so was
        // its flush, although librbd logged the write's ETIMEDOUT (Ceph 16.2.15,
        // 2026-11-25); without it the write fails as it must. A FUA write or a SYNCHRONIZE
        // CACHE that succeeds must mean the data is on the OSDs.
        cfg.cache = Some(false);
        if let Some(c) = spec.param("cache") {
            cfg.cache = Some(match c {
                "yes" | "true" | "on" => true,
                "no" | "false" | "off" => false,
                _ => return Err(OpenError::invalid(spec, format!("cache={c:?}: yes or no"))),
            });
        }
        if ctx.is_shared() {
            // Other targets write the same image: what this process's librbd cache holds
            // could be older than what they wrote.
            if cfg.cache == Some(true) {
                return Err(OpenError::invalid(
                    spec,
                    "cache=yes on an image that other targets export too (peer_portal_groups): \
                     librbd's cache would not see their writes; leave cache out (off) or say no",
                ));
            }
            cfg.cache = Some(false);
            cfg.shared = true;
        }
        if let Some(l) = spec.param("lend") {
            cfg.lend = match l {
                "yes" | "true" | "on" => true,
                "no" | "false" | "off" => false,
                _ => return Err(OpenError::invalid(spec, format!("lend={l:?}: yes or no"))),
            };
        }
        if let Some(t) = spec.param("threads") {
            let n = t
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| OpenError::invalid(spec, format!("threads={t:?}: 1 to 64")))?;
            if n < 2 && cfg.shared {
                return Err(OpenError::invalid(
                    spec,
                    "threads=1 on an image that other targets export too: the watch for their \
                     resets acknowledges with a call that waits on librados' completion thread",
                ));
            }
            cfg.threads = Some(n);
        }
        Ok(cfg)
    }
}

impl StoreFactory for RbdFactory {
    fn kind(&self) -> &str {
        "rbd"
    }

    fn summary(&self) -> &str {
        "a Ceph RBD image through librbd; flushes reach the cluster, commands fail after \
         `timeout` when it is unreachable, and the store connects again after a failure"
    }

    fn params(&self) -> &[Param] {
        PARAMS
    }

    fn check(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let cfg = Self::config(spec, ctx)?;
        Ok(format!("{} (connected to on start)", cfg.shown()))
    }

    fn open(
        &self,
        spec: &StoreSpec,
        ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        let cfg = Self::config(spec, ctx)?;
        let read_only = ctx.is_read_only();
        // The factory may be called on an async runtime's worker: connect from a plain
        // thread, which may block for up to the timeout.
        let store = std::thread::scope(|s| {
            s.spawn(|| RbdImage::open(cfg, read_only))
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("rbd open thread panicked")))
        })
        .map_err(|e| OpenError::io(spec, e))?;
        Ok(Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let c = RbdConfig::new("rbd/img").unwrap();
        assert_eq!(
            (c.pool.as_str(), c.namespace, c.image.as_str()),
            ("rbd", None, "img")
        );
        let c = RbdConfig::new("p/ns/img").unwrap();
        assert_eq!(c.namespace.as_deref(), Some("ns"));
        assert_eq!(c.name(), "p/ns/img");
        for bad in ["img", "a/b/c/d", "/img", "p//i", "p/"] {
            assert!(RbdConfig::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lost_connection_errors() {
        assert!(lost(&io::Error::from_raw_os_error(libc::ETIMEDOUT)));
        assert!(lost(&io::Error::new(io::ErrorKind::TimedOut, "x")));
        assert!(lost(&errno(-(libc::ESHUTDOWN as i64), "blocklisted")));
        assert!(!lost(&errno(-(libc::EIO as i64), "io")));
        assert!(!lost(&errno(-(libc::EROFS as i64), "ro")));
    }
}

} // with_ceph!
