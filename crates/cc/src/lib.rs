//! `rsv`: Reservoir's own TCP congestion control, and its loader.
//!
//! The congestion control is a BPF `struct_ops` `tcp_congestion_ops` (`bpf/rsv.bpf.c`)
//! built on the kernel's BBRv1, which it calls as kfuncs; what it changes is steered per
//! socket through [`Settings`] in a socket-storage map: a start near a known rate, exact
//! pacing to a share, no PROBE_RTT or PROBE_RTT coordinated across a session's connections
//! (a [`Settings::group`]), and no cwnd cut on loss without queue growth. The build
//! compiles it with clang when clang and libbpf-dev are there (else [`load`] says "not
//! built"); loading uses the system's libbpf (`libbpf.so.1`, opened at run time, so that
//! nothing links it and a machine without it still builds and runs Reservoir).
//!
//! Registration is a BPF link: the name `rsv` goes away when the [`Loaded`] drops or the
//! process ends, however it ends. One name exists per host, so when several Reservoir
//! processes load it, the first one's link holds the name and the others share its
//! settings map: before loading, a loader looks for a live map named `rsv_settings` (by
//! map id, which needs the same privileges as loading) and reuses it, so that every
//! process's [`Loaded::set`] reaches the registered program whichever process registered
//! it. When the holder exits, the next [`Loaded::select`] of another process finds the name
//! gone and registers its own (same map).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};

/// The name sockets select with TCP_CONGESTION: `rsv`, unless the build set `RSV_CC_NAME`
/// (a build measured beside another build's `rsv` on one host; `docs/congestion.md`).
pub const NAME: &str = env!("RSV_CC_NAME");
const SETTINGS_MAP: &str = "rsv_settings";
const GROUPS_MAP: &str = "rsv_groups";
const STATE_MAP: &str = "rsv_state";
const OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/rsv.bpf.o"));
const NOT_BUILT: &str = env!("RSV_CC_NOT_BUILT");

const FLAG_NO_PROBE_RTT: u32 = 1;
const FLAG_BBR_LOSS: u32 = 2;

/// What user space tells the congestion control about one socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Bytes per second to start at (pacing floor and cwnd of twice rate x RTT while BBR is
    /// in STARTUP) instead of ten packets; 0: BBR's own start.
    pub start_rate: u64,
    /// With a `start_rate` and no `share_rate`: bytes per second at which the start's first
    /// round of data (start_rate x RTT) is sent, so that its ACKs come back spaced at the
    /// bottleneck's rate; the rate they came at is then the start, while BBR is in STARTUP
    /// (the probed start, `bpf/rsv.bpf.c`). 0: none. At most `u32::MAX` (34 Gbit/s).
    pub probe_rate: u64,
    /// Bytes per second to pace at exactly, with a cwnd that never holds it back; 0: BBR's
    /// pacing.
    pub share_rate: u64,
    /// The path's minimum RTT when user space knows it (used until the socket has its
    /// own); 0: unknown.
    pub min_rtt_us: u32,
    /// Never enter PROBE_RTT: another connection of the session, or a known path, keeps
    /// the minimum RTT.
    pub no_probe_rtt: bool,
    /// Keep BBR's own cwnd response to loss (packet conservation) even when the RTT shows
    /// no queue.
    pub bbr_loss: bool,
    /// The session's group ([`new_group`], [`group_for`]): the connections of one group
    /// take turns at PROBE_RTT, and skip it while another's RTT samples keep the minimum
    /// fresh; 0: none (BBR's own PROBE_RTT).
    pub group: u32,
}

/// The map's value; must match `struct rsv_settings` in `bpf/rsv.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawSettings {
    start_rate: u64,
    share_rate: u64,
    min_rtt_us: u32,
    flags: u32,
    group: u32,
    probe_rate: u32,
}

/// Slots of a group where members leave their RTT samples for the others (`bpf/rsv.bpf.c`).
const GROUP_SLOTS: usize = 8;

/// A `rsv_groups` value; must match `struct rsv_group` in `bpf/rsv.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawGroup {
    lock: u32,
    members: u32,
    probing: u32,
    max_probing: u32,
    token: u32,
    next_slot: u32,
    token_until: u64,
    probes: u64,
    skipped: u64,
    deferred: u64,
    low_rtt_us: [u32; GROUP_SLOTS],
    low_ns: [u64; GROUP_SLOTS],
}

/// A `rsv_state` value; must match `struct rsv_sock` in `bpf/rsv.bpf.c`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawSockState {
    stamp_ns: u64,
    probes: u64,
    skipped: u64,
    deferred: u64,
    seen_stamp: u32,
    group: u32,
    id: u32,
    slot: u32,
    mode: u8,
    holds_token: u8,
    deferring: u8,
    probe: u8,
    pad: [u8; 4],
    probe_t1_ns: u64,
    found_rate: u64,
    probe_d1: u32,
    probe_rest: u32,
    probe_pkts: u32,
    probe_us: u32,
    hold_until_ns: u64,
    hold_delivered: u32,
    holds: u32,
}

/// What a group's PROBE_RTT coordination did, from the `rsv_groups` map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupCounts {
    /// The group's connections that run `rsv` now.
    pub members: u32,
    /// PROBE_RTTs its members entered.
    pub probes: u64,
    /// Probes skipped: another member's RTT samples kept the minimum fresh.
    pub skipped: u64,
    /// Probes put off while another member probed.
    pub deferred: u64,
    /// Members in PROBE_RTT now.
    pub probing: u32,
    /// The most members in PROBE_RTT at once.
    pub max_probing: u32,
}

impl From<RawGroup> for GroupCounts {
    fn from(g: RawGroup) -> Self {
        GroupCounts {
            members: g.members,
            probes: g.probes,
            skipped: g.skipped,
            deferred: g.deferred,
            probing: g.probing,
            max_probing: g.max_probing,
        }
    }
}

/// One socket's PROBE_RTTs, from the `rsv_state` map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SocketCounts {
    /// The group it is in; 0: none.
    pub group: u32,
    /// PROBE_RTTs it entered.
    pub probes: u64,
    pub skipped: u64,
    pub deferred: u64,
    /// It is in PROBE_RTT now.
    pub probing: bool,
    /// The probed start (a `probe_rate`): where it is.
    pub start_probe: StartProbe,
    /// Bytes per second the probed flight's ACKs came at (its start from then on, while
    /// BBR is in STARTUP); 0: none found.
    pub found_rate: u64,
    /// Packets of the probed flight timed, and over how many microseconds.
    pub probe_packets: u32,
    pub probe_us: u32,
    /// PROBE_RTTs held at half a BDP (the hold begun by the program, not BBR's four
    /// packets).
    pub half_bdp_holds: u32,
}

/// The phases of the probed start (`bpf/rsv.bpf.c`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StartProbe {
    /// Not armed: no probe rate, or waiting for the first data after idle.
    #[default]
    None,
    /// The first round's data leaves at the probe rate.
    Sending,
    /// Its ACKs are being timed.
    Timing,
    /// Over: `found_rate` says what it found (0: nothing to time).
    Done,
}

impl From<u8> for StartProbe {
    fn from(v: u8) -> Self {
        match v {
            1 => StartProbe::Sending,
            2 => StartProbe::Timing,
            3 => StartProbe::Done,
            _ => StartProbe::None,
        }
    }
}

const BBR_PROBE_RTT: u8 = 3;

impl From<RawSockState> for SocketCounts {
    fn from(r: RawSockState) -> Self {
        SocketCounts {
            group: r.group,
            probes: r.probes,
            skipped: r.skipped,
            deferred: r.deferred,
            probing: r.mode == BBR_PROBE_RTT,
            start_probe: r.probe.into(),
            found_rate: r.found_rate,
            probe_packets: r.probe_pkts,
            probe_us: r.probe_us,
            half_bdp_holds: r.holds,
        }
    }
}

/// A new group id for a session (random, never 0). The group map is one per host, shared
/// by every process that runs `rsv`: ids are random so that sessions of different
/// processes do not meet.
pub fn new_group() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: b is writable for its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        group_for(&std::process::id().to_ne_bytes())
    };
    v.max(1)
}

/// The group id for a session known by `key` (e.g. a target's ISID, TSIH and initiator
/// name): the same key gives the same id within this process, never 0; other processes
/// give other ids (the hash is keyed per process).
pub fn group_for(key: &[u8]) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let mut h = KEYS.get_or_init(Default::default).build_hasher();
    h.write(key);
    let v = h.finish();
    ((v ^ (v >> 32)) as u32).max(1)
}

impl From<Settings> for RawSettings {
    fn from(s: Settings) -> Self {
        let mut flags = 0;
        if s.no_probe_rtt {
            flags |= FLAG_NO_PROBE_RTT;
        }
        if s.bbr_loss {
            flags |= FLAG_BBR_LOSS;
        }
        RawSettings {
            start_rate: s.start_rate,
            share_rate: s.share_rate,
            min_rtt_us: s.min_rtt_us,
            flags,
            group: s.group,
            probe_rate: s.probe_rate.min(u64::from(u32::MAX)) as u32,
        }
    }
}

impl From<RawSettings> for Settings {
    fn from(r: RawSettings) -> Self {
        Settings {
            start_rate: r.start_rate,
            share_rate: r.share_rate,
            min_rtt_us: r.min_rtt_us,
            no_probe_rtt: r.flags & FLAG_NO_PROBE_RTT != 0,
            bbr_loss: r.flags & FLAG_BBR_LOSS != 0,
            group: r.group,
            probe_rate: u64::from(r.probe_rate),
        }
    }
}

/// Why `rsv` could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// The build had no clang or libbpf-dev (the reason as the build saw it).
    NotBuilt(String),
    /// The system's libbpf (`libbpf.so.1`, Debian: libbpf1) could not be opened.
    NoLibbpf(String),
    /// Loading BPF needs root (CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN).
    NotPermitted(String),
    /// The kernel has no BTF (`/sys/kernel/btf/vmlinux`), which struct_ops needs.
    NoBtf,
    /// The kernel has BTF but no `tcp_congestion_ops` struct_ops (too old, or built
    /// without BPF_JIT): libbpf's words.
    NoStructOps(String),
    /// The kernel's verifier refused a program: the last lines of its log.
    Verifier(String),
    /// Anything else, with libbpf's last lines.
    Failed(String),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::NotBuilt(w) => write!(f, "not built ({w})"),
            Why::NoLibbpf(w) => write!(f, "no libbpf: {w}"),
            Why::NotPermitted(w) => write!(
                f,
                "not permitted: loading BPF needs root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN): {w}"
            ),
            Why::NoBtf => write!(f, "the kernel has no BTF (/sys/kernel/btf/vmlinux)"),
            Why::NoStructOps(w) => write!(f, "the kernel has no struct_ops for it: {w}"),
            Why::Verifier(w) => write!(f, "the verifier refused it: {w}"),
            Why::Failed(w) => write!(f, "{w}"),
        }
    }
}

impl std::error::Error for Why {}

type PrintFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_void) -> c_int;

/// The libbpf 1.x functions the loader uses, from `libbpf.so.1`.
struct Lib {
    open_mem: unsafe extern "C" fn(*const c_void, usize, *const c_void) -> *mut c_void,
    load: unsafe extern "C" fn(*mut c_void) -> c_int,
    close: unsafe extern "C" fn(*mut c_void),
    find_map: unsafe extern "C" fn(*const c_void, *const c_char) -> *mut c_void,
    map_fd: unsafe extern "C" fn(*const c_void) -> c_int,
    map_flags: unsafe extern "C" fn(*const c_void) -> u32,
    set_map_flags: unsafe extern "C" fn(*mut c_void, u32) -> c_int,
    reuse_fd: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    attach_struct_ops: unsafe extern "C" fn(*const c_void) -> *mut c_void,
    link_disconnect: unsafe extern "C" fn(*mut c_void),
    link_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    set_print: unsafe extern "C" fn(Option<PrintFn>) -> Option<PrintFn>,
}

fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(open_lib).as_ref().map_err(Clone::clone)
}

fn open_lib() -> Result<Lib, String> {
    // SAFETY: dlopen with a constant name; the handle is kept for the process's life.
    let h = unsafe { libc::dlopen(c"libbpf.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a message owned by libc or null.
        let e = unsafe { libc::dlerror() };
        let msg = if e.is_null() {
            "dlopen failed".to_owned()
        } else {
            // SAFETY: non-null dlerror strings are NUL-terminated.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        return Err(format!("{msg} (Debian: libbpf1)"));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: h is a live handle, name NUL-terminated.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        if p.is_null() {
            Err(format!("libbpf.so.1 has no {}", name.to_string_lossy()))
        } else {
            Ok(p)
        }
    };
    /// A function pointer of type F at p.
    ///
    /// # Safety
    /// p must be a function whose C prototype F restates.
    unsafe fn func<F: Copy>(p: *mut c_void) -> F {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: sizes checked; the caller vouches for the type.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }
    // SAFETY (every func): each symbol is the libbpf 1.x function of that name, whose C
    // prototype the field's type restates.
    unsafe {
        Ok(Lib {
            open_mem: func(sym(c"bpf_object__open_mem")?),
            load: func(sym(c"bpf_object__load")?),
            close: func(sym(c"bpf_object__close")?),
            find_map: func(sym(c"bpf_object__find_map_by_name")?),
            map_fd: func(sym(c"bpf_map__fd")?),
            map_flags: func(sym(c"bpf_map__map_flags")?),
            set_map_flags: func(sym(c"bpf_map__set_map_flags")?),
            reuse_fd: func(sym(c"bpf_map__reuse_fd")?),
            attach_struct_ops: func(sym(c"bpf_map__attach_struct_ops")?),
            link_disconnect: func(sym(c"bpf_link__disconnect")?),
            link_destroy: func(sym(c"bpf_link__destroy")?),
            set_print: func(sym(c"libbpf_set_print")?),
        })
    }
}

// --- libbpf's messages, kept while loading ------------------------------------------------

static LOAD_LOCK: Mutex<()> = Mutex::new(());

/// Where processes of this host take turns at loading: the first of these that opens.
/// Loading needs root, so /run is writable where it matters.
const HOST_LOCKS: [&str; 2] = ["/run/rsv-cc.lock", "/tmp/rsv-cc.lock"];

/// A host-wide turn at loading (`flock` on a file every namespace sees); released when
/// dropped. When no lock file can be opened, loading goes on without a turn (and the race
/// it guards against is logged by [`get`] as an unshared map).
struct HostLock {
    _fd: Option<OwnedFd>,
}

impl HostLock {
    fn take() -> HostLock {
        for path in HOST_LOCKS {
            let Ok(c) = std::ffi::CString::new(path) else {
                continue;
            };
            // SAFETY: c is a NUL-terminated path; the fd returned is owned below.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd < 0 {
                continue;
            }
            // SAFETY: fd was just opened and is owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            loop {
                // SAFETY: a valid fd; flock blocks until the turn is ours.
                if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
                    return HostLock { _fd: Some(fd) };
                }
                if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break;
                }
            }
        }
        HostLock { _fd: None }
    }
}
static LOG: Mutex<String> = Mutex::new(String::new());

extern "C" {
    // va_list travels as a pointer on x86_64 and aarch64 (an array type, or a composite
    // passed by reference), which is how libbpf's callback receives it.
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

unsafe extern "C" fn capture(_level: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: libbpf passes a format and its arguments; buf is writable for its length.
    let n = unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, ap) };
    if n > 0 {
        // SAFETY: vsnprintf NUL-terminates within buf.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        if let Ok(mut log) = LOG.lock() {
            // The end of a verifier log is what explains a refusal; keep the last 64 KiB.
            if log.len() > 64 * 1024 {
                let cut = log.len() - 32 * 1024;
                let cut = (cut..log.len())
                    .find(|&i| log.is_char_boundary(i))
                    .unwrap_or(0);
                log.drain(..cut);
            }
            log.push_str(&s);
        }
    }
    n
}

fn last_lines(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

// --- the bpf(2) calls libbpf need not make -----------------------------------------------

const BPF_MAP_LOOKUP_ELEM: c_int = 1;
const BPF_MAP_UPDATE_ELEM: c_int = 2;
const BPF_MAP_GET_NEXT_ID: c_int = 12;
const BPF_MAP_GET_FD_BY_ID: c_int = 14;
const BPF_OBJ_GET_INFO_BY_FD: c_int = 15;
const BPF_LINK_CREATE: c_int = 28;
const BPF_STRUCT_OPS: u32 = 44;
const BPF_F_LINK: u32 = 1 << 13;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_SK_STORAGE: u32 = 24;

/// `union bpf_attr`, as the few u32/u64 fields the calls here use; the rest stays zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn u32(mut self, off: usize, v: u32) -> Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, off: usize, v: u64) -> Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn get_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap())
    }
}

fn bpf(cmd: c_int, attr: &mut Attr) -> io::Result<c_int> {
    // SAFETY: attr is a zero-filled bpf_attr of 128 bytes whose used fields are set; the
    // kernel reads (and for GET_NEXT_ID writes) within it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<Attr>() as u32,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as c_int)
    }
}

fn link_create(map_fd: RawFd) -> io::Result<OwnedFd> {
    let mut a = Attr::new().u32(0, map_fd as u32).u32(8, BPF_STRUCT_OPS);
    let fd = bpf(BPF_LINK_CREATE, &mut a)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A live map of another loader, to share: the oldest one (lowest id) of this name, type
/// and layout.
fn find_map(want: &str, kind: u32, value_size: usize) -> Option<OwnedFd> {
    let mut id = 0u32;
    loop {
        let mut a = Attr::new().u32(0, id);
        bpf(BPF_MAP_GET_NEXT_ID, &mut a).ok()?;
        id = a.get_u32(4);
        let mut a = Attr::new().u32(0, id);
        let Ok(fd) = bpf(BPF_MAP_GET_FD_BY_ID, &mut a) else {
            continue;
        };
        // SAFETY: a new fd from the kernel.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut info = [0u8; 96];
        let mut a = Attr::new()
            .u32(0, fd.as_raw_fd() as u32)
            .u32(4, info.len() as u32)
            .u64(8, info.as_mut_ptr() as u64);
        if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a).is_err() {
            continue;
        }
        let u = |o: usize| u32::from_ne_bytes(info[o..o + 4].try_into().unwrap());
        let name = &info[24..40];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(16)];
        if u(0) == kind && u(8) == 4 && u(12) as usize == value_size && name == want.as_bytes() {
            return Some(fd);
        }
    }
}

// --- the loaded program ------------------------------------------------------------------

/// `rsv` loaded by this process: registered (its link holds the name) or, when another
/// process holds the name, sharing that one's settings map.
pub struct Loaded {
    lib: &'static Lib,
    obj: *mut c_void,
    ops_link: *mut c_void,
    ops_fd: RawFd,
    settings_fd: RawFd,
    groups_fd: RawFd,
    state_fd: RawFd,
    link: Mutex<Option<OwnedFd>>,
    shared_map: bool,
    shared_state: bool,
}

// SAFETY: after load the object and libbpf's link are only touched by Drop; everything
// else works on fds through bpf(2) and setsockopt, which are thread-safe.
unsafe impl Send for Loaded {}
// SAFETY: as above; the link is behind a mutex.
unsafe impl Sync for Loaded {}

/// Loads, verifies and registers `rsv`. Needs root. When the name is already registered by
/// another process, this one shares its settings map and registers later if that one
/// goes (see the module documentation).
pub fn load() -> Result<Loaded, Why> {
    if OBJECT.is_empty() {
        return Err(Why::NotBuilt(NOT_BUILT.to_owned()));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(Why::NoBtf);
    }
    let lib = lib().map_err(Why::NoLibbpf)?;
    let _guard = LOAD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Processes that load at the same moment (the lab starts sixteen disk servers' agents
    // at once) must take turns: the first registers, and each after it finds the first's
    // settings map and reuses it *before* loading, so that its settings reach the
    // registered program. Without the turn each loaded its own map and only one process's
    // settings reached `rsv`.
    let _host = HostLock::take();
    LOG.lock().unwrap_or_else(|e| e.into_inner()).clear();
    // SAFETY: capture is a valid callback for the whole load; the previous one is put back.
    let previous = unsafe { (lib.set_print)(Some(capture)) };
    let r = load_locked(lib);
    // SAFETY: restoring what libbpf had.
    unsafe { (lib.set_print)(previous) };
    r
}

fn load_locked(lib: &'static Lib) -> Result<Loaded, Why> {
    let log_tail = || last_lines(&LOG.lock().unwrap_or_else(|e| e.into_inner()), 6);
    // SAFETY: OBJECT is a BPF ELF object that lives for the program; libbpf copies it.
    let obj = unsafe { (lib.open_mem)(OBJECT.as_ptr().cast(), OBJECT.len(), std::ptr::null()) };
    if obj.is_null() {
        return Err(Why::Failed(format!(
            "libbpf could not open the object: {} {}",
            io::Error::last_os_error(),
            log_tail()
        )));
    }
    let mut loaded = Loaded {
        lib,
        obj,
        ops_link: std::ptr::null_mut(),
        ops_fd: -1,
        settings_fd: -1,
        groups_fd: -1,
        state_fd: -1,
        link: Mutex::new(None),
        shared_map: false,
        shared_state: false,
    };
    // SAFETY: obj is a live object; the names are NUL-terminated.
    let ops = unsafe { (lib.find_map)(obj, c"rsv".as_ptr()) };
    // SAFETY: as above.
    let settings = unsafe { (lib.find_map)(obj, c"rsv_settings".as_ptr()) };
    // SAFETY: as above.
    let groups = unsafe { (lib.find_map)(obj, c"rsv_groups".as_ptr()) };
    // SAFETY: as above.
    let state = unsafe { (lib.find_map)(obj, c"rsv_state".as_ptr()) };
    if ops.is_null() || settings.is_null() || groups.is_null() || state.is_null() {
        return Err(Why::Failed("the object lacks its maps".into()));
    }
    // libbpf 1.1 knows no `.struct_ops.link` section: the flag makes the map a link's.
    // SAFETY: ops is a map of obj, not yet loaded.
    let rc = unsafe { (lib.set_map_flags)(ops, (lib.map_flags)(ops) | BPF_F_LINK) };
    if rc != 0 {
        return Err(Why::Failed(format!("bpf_map__set_map_flags: {rc}")));
    }
    if let Some(fd) = find_map(
        SETTINGS_MAP,
        BPF_MAP_TYPE_SK_STORAGE,
        std::mem::size_of::<RawSettings>(),
    ) {
        // SAFETY: settings is a map of obj, fd a live map of the same definition; libbpf
        // duplicates the fd.
        if unsafe { (lib.reuse_fd)(settings, fd.as_raw_fd()) } == 0 {
            loaded.shared_map = true;
        }
    }
    // The groups (and the program's socket state) are shared the same way, so that the
    // members of a group meet whichever program runs, and counters are read where it
    // writes them.
    for (map, name, kind, size) in [
        (
            groups,
            GROUPS_MAP,
            BPF_MAP_TYPE_HASH,
            std::mem::size_of::<RawGroup>(),
        ),
        (
            state,
            STATE_MAP,
            BPF_MAP_TYPE_SK_STORAGE,
            std::mem::size_of::<RawSockState>(),
        ),
    ] {
        if let Some(fd) = find_map(name, kind, size) {
            // SAFETY: as above.
            let reused = unsafe { (lib.reuse_fd)(map, fd.as_raw_fd()) } == 0;
            if name == STATE_MAP {
                loaded.shared_state = reused;
            }
        }
    }
    // SAFETY: obj is open and not loaded.
    let rc = unsafe { (lib.load)(obj) };
    if rc != 0 {
        let err = io::Error::from_raw_os_error(-rc);
        let log = LOG.lock().unwrap_or_else(|e| e.into_inner()).clone();
        return Err(match -rc {
            _ if log.contains("not found in kernel BTF")
                || log.contains("struct_ops init_kern") =>
            {
                Why::NoStructOps(last_lines(&log, 2))
            }
            libc::EPERM | libc::EACCES if !log.contains("processed ") => {
                Why::NotPermitted(format!("{err}"))
            }
            _ if log.contains("processed ") || log.contains("R0") || log.contains("verifier") => {
                Why::Verifier(last_lines(&log, 8))
            }
            _ => Why::Failed(format!("bpf_object__load: {err}: {}", last_lines(&log, 6))),
        });
    }
    // SAFETY: maps of a loaded object.
    loaded.ops_fd = unsafe { (lib.map_fd)(ops) };
    // SAFETY: as above.
    loaded.settings_fd = unsafe { (lib.map_fd)(settings) };
    // SAFETY: as above.
    loaded.groups_fd = unsafe { (lib.map_fd)(groups) };
    // SAFETY: as above.
    loaded.state_fd = unsafe { (lib.map_fd)(state) };
    // With BPF_F_LINK this stores the programs in the map without registering them.
    // SAFETY: ops is a loaded struct_ops map.
    let l = unsafe { (lib.attach_struct_ops)(ops) };
    if l.is_null() {
        return Err(Why::Failed(format!(
            "bpf_map__attach_struct_ops: {} {}",
            io::Error::last_os_error(),
            log_tail()
        )));
    }
    loaded.ops_link = l;
    loaded
        .register()
        .map_err(|e| Why::Failed(format!("registering {NAME}: {e}")))?;
    Ok(loaded)
}

impl Loaded {
    pub fn name(&self) -> &'static str {
        NAME
    }

    /// Whether this process's link holds the name now.
    pub fn registered_here(&self) -> bool {
        self.link.lock().map(|l| l.is_some()).unwrap_or(false)
    }

    /// Whether this process writes its settings into another process's map (and so reaches
    /// that one's registered program).
    pub fn shares_map(&self) -> bool {
        self.shared_map
    }

    /// Whether this process reads the program's per-socket state where the registered
    /// program writes it: registered here, or sharing a live state map of this layout
    /// (another process of this build). False when another build's program (another
    /// layout) holds the name: then [`Loaded::socket_counts`] finds nothing.
    pub fn reads_state(&self) -> bool {
        self.registered_here() || self.shared_state
    }

    /// Registers the name with this process's link unless it is; `Ok(false)` when another
    /// process holds it.
    pub fn register(&self) -> io::Result<bool> {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if link.is_some() {
            return Ok(true);
        }
        match link_create(self.ops_fd) {
            Ok(fd) => {
                *link = Some(fd);
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Selects `rsv` on a socket (TCP_CONGESTION); registers this process's copy first when
    /// the name has gone with the process that held it.
    pub fn select(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        match set_congestion(fd, NAME) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                self.register()?;
                set_congestion(fd, NAME)
            }
            r => r,
        }
    }

    /// Sets a socket's settings (the socket's own storage; gone with the socket).
    pub fn set(&self, fd: BorrowedFd<'_>, s: Settings) -> io::Result<()> {
        let key: i32 = fd.as_raw_fd();
        let value = RawSettings::from(s);
        let mut a = Attr::new()
            .u32(0, self.settings_fd as u32)
            .u64(8, &key as *const i32 as u64)
            .u64(16, &value as *const RawSettings as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
    }

    /// A group's PROBE_RTT counters; `None` when no member runs `rsv` (any more).
    pub fn group_counts(&self, group: u32) -> io::Result<Option<GroupCounts>> {
        let mut value = RawGroup::default();
        lookup(self.groups_fd, &group, &mut value).map(|found| found.then(|| value.into()))
    }

    /// A socket's PROBE_RTT counters; `None` when `rsv` has not run on it.
    pub fn socket_counts(&self, fd: BorrowedFd<'_>) -> io::Result<Option<SocketCounts>> {
        let key: i32 = fd.as_raw_fd();
        let mut value = RawSockState::default();
        lookup(self.state_fd, &key, &mut value).map(|found| found.then(|| value.into()))
    }

    /// A socket's settings; `None` when it has none.
    pub fn get(&self, fd: BorrowedFd<'_>) -> io::Result<Option<Settings>> {
        let key: i32 = fd.as_raw_fd();
        let mut value = RawSettings::default();
        let mut a = Attr::new()
            .u32(0, self.settings_fd as u32)
            .u64(8, &key as *const i32 as u64)
            .u64(16, &mut value as *mut RawSettings as u64);
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
            Ok(_) => Ok(Some(value.into())),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // Closing the link unregisters the name (sockets that run rsv keep it until they
        // close).
        if let Ok(mut l) = self.link.lock() {
            l.take();
        }
        // SAFETY: libbpf's link and object, made by load and used by nothing else now; the
        // link is disconnected first so that destroying it asks nothing of the kernel.
        unsafe {
            if !self.ops_link.is_null() {
                (self.lib.link_disconnect)(self.ops_link);
                (self.lib.link_destroy)(self.ops_link);
            }
            (self.lib.close)(self.obj);
        }
    }
}

/// Looks `key` up in the map `map_fd` into `value`; whether it was there.
fn lookup<K, V>(map_fd: RawFd, key: &K, value: &mut V) -> io::Result<bool> {
    let mut a = Attr::new()
        .u32(0, map_fd as u32)
        .u64(8, key as *const K as u64)
        .u64(16, value as *mut V as u64);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sets the socket's congestion control by name (`TCP_CONGESTION`).
pub fn set_congestion(fd: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    // SAFETY: the buffer is valid for its length; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether a congestion control named `rsv` is registered on this host (by any process).
pub fn available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .map(|s| s.split_whitespace().any(|n| n == NAME))
        .unwrap_or(false)
}

/// Whether this build carries the program.
pub fn built() -> Result<(), String> {
    if OBJECT.is_empty() {
        Err(NOT_BUILT.to_owned())
    } else {
        Ok(())
    }
}

// --- the process's copy ------------------------------------------------------------------

static GLOBAL: OnceLock<Result<Loaded, Why>> = OnceLock::new();

/// Whether the outcome of the process's load has been logged (by [`get`], or by the caller
/// of [`get_unlogged`], which logs its own line): once per process.
static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn loaded() -> &'static Result<Loaded, Why> {
    GLOBAL.get_or_init(load)
}

/// The process's `rsv`, loaded at the first call (when a connection asks for it); the
/// outcome is logged once. The link closes when the process exits.
pub fn get() -> Result<&'static Loaded, &'static Why> {
    let r = loaded();
    if !LOGGED.swap(true, std::sync::atomic::Ordering::AcqRel) {
        match r {
            Ok(l) if l.registered_here() => tracing::info!(
                "congestion control {NAME} loaded and registered (BPF struct_ops on BBR)"
            ),
            Ok(l) => tracing::info!(
                "congestion control {NAME} loaded; the name is held by another process{}",
                if l.shares_map() {
                    ", whose settings map this one shares"
                } else {
                    " and its settings map was not found: per-socket settings may not \
                     reach it"
                }
            ),
            Err(why) => tracing::warn!(
                "congestion control {NAME} not loaded: {why}; connections that ask for it \
                 run {} instead",
                if available() {
                    "the rsv another process registered, without per-socket settings"
                } else {
                    "the kernel's BBR (or CUBIC)"
                }
            ),
        }
    }
    r.as_ref()
}

/// As [`get`], for a caller that logs the outcome itself (the process's default choice):
/// [`get`] will not log it again.
pub fn get_unlogged() -> Result<&'static Loaded, &'static Why> {
    let r = loaded();
    LOGGED.store(true, std::sync::atomic::Ordering::Release);
    r.as_ref()
}

/// The process's `rsv` if an earlier [`get`] loaded it; never loads.
pub fn current() -> Option<&'static Loaded> {
    GLOBAL.get().and_then(|r| r.as_ref().ok())
}

/// What `rsv tune` and `--json` show.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// Loaded by this process.
    pub loaded: bool,
    /// This process's link holds the name.
    pub registered_here: bool,
    /// The name is registered on this host (by this or another process).
    pub available: bool,
    /// Why this process has not loaded it (not asked yet, or the load's failure).
    pub why_not: Option<String>,
    /// The session's PROBE_RTT coordination (its group's counters), where a session asks
    /// with [`group_status`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_rtt: Option<GroupCounts>,
}

/// A group's counters when this process loaded `rsv` and the group has members.
pub fn group_status(group: u32) -> Option<GroupCounts> {
    if group == 0 {
        return None;
    }
    current()?.group_counts(group).ok().flatten()
}

pub fn status() -> Status {
    match GLOBAL.get() {
        Some(Ok(l)) => Status {
            loaded: true,
            registered_here: l.registered_here(),
            available: available(),
            why_not: None,
            probe_rtt: None,
        },
        Some(Err(w)) => Status {
            available: available(),
            why_not: Some(w.to_string()),
            ..Status::default()
        },
        None => Status {
            available: available(),
            why_not: Some(match built() {
                Err(w) => format!("not built ({w})"),
                Ok(()) => "not asked for".into(),
            }),
            ..Status::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_through_the_map_value() {
        let s = Settings {
            start_rate: 50_000_000,
            probe_rate: 62_500_000,
            share_rate: 12_500_000,
            min_rtt_us: 100_000,
            no_probe_rtt: true,
            bbr_loss: false,
            group: 0xdead_beef,
        };
        let raw = RawSettings::from(s);
        assert_eq!(raw.flags, FLAG_NO_PROBE_RTT);
        assert_eq!(raw.group, 0xdead_beef);
        assert_eq!(raw.probe_rate, 62_500_000);
        assert_eq!(Settings::from(raw), s);
        // A probe rate past the field's u32 is held at its largest, not wrapped.
        let fast = RawSettings::from(Settings {
            probe_rate: 1 << 40,
            ..s
        });
        assert_eq!(fast.probe_rate, u32::MAX);
    }

    /// The map values' layouts as `bpf/rsv.bpf.c` has them (clang's BTF of the object
    /// says 32, 152 and 104 bytes); a field added on one side only changes a size or an
    /// offset here.
    #[test]
    fn map_values_match_the_programs_layout() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<RawSettings>(), 32);
        assert_eq!(offset_of!(RawSettings, flags), 20);
        assert_eq!(offset_of!(RawSettings, group), 24);
        assert_eq!(offset_of!(RawSettings, probe_rate), 28);
        assert_eq!(size_of::<RawGroup>(), 152);
        assert_eq!(offset_of!(RawGroup, token_until), 24);
        assert_eq!(offset_of!(RawGroup, deferred), 48);
        assert_eq!(offset_of!(RawGroup, low_rtt_us), 56);
        assert_eq!(offset_of!(RawGroup, low_ns), 88);
        assert_eq!(size_of::<RawSockState>(), 104);
        assert_eq!(offset_of!(RawSockState, seen_stamp), 32);
        assert_eq!(offset_of!(RawSockState, mode), 48);
        assert_eq!(offset_of!(RawSockState, probe), 51);
        assert_eq!(offset_of!(RawSockState, probe_t1_ns), 56);
        assert_eq!(offset_of!(RawSockState, found_rate), 64);
        assert_eq!(offset_of!(RawSockState, probe_us), 84);
        assert_eq!(offset_of!(RawSockState, hold_until_ns), 88);
        assert_eq!(offset_of!(RawSockState, holds), 100);
    }

    #[test]
    fn a_session_key_gives_one_group_and_never_none() {
        assert_eq!(group_for(b"isid 1"), group_for(b"isid 1"));
        assert_ne!(group_for(b"isid 1"), group_for(b"isid 2"));
        assert_ne!(new_group(), 0);
        let sock = RawSockState {
            mode: BBR_PROBE_RTT,
            probes: 3,
            ..Default::default()
        };
        let c = SocketCounts::from(sock);
        assert!(c.probing);
        assert_eq!(c.probes, 3);
        assert_eq!(c.start_probe, StartProbe::None);
        let probed = SocketCounts::from(RawSockState {
            probe: 3,
            found_rate: 12_000_000,
            ..Default::default()
        });
        assert_eq!(
            (probed.start_probe, probed.found_rate),
            (StartProbe::Done, 12_000_000)
        );
    }

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(last_lines("", 3), "");
    }
}
