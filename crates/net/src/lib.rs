//! The connection under both ends: the [`transport`] that carries an iSCSI connection's
//! bytes, and socket tuning: buffer sizes, congestion control, pacing, TCP_NOTSENT_LOWAT
//! and TCP_INFO sampling. Tuning works on a raw fd so that std and tokio sockets and every
//! transport alike can be tuned.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use serde::Serialize;
use socket2::SockRef;

/// Reservoir's own congestion control, `rsv` (a BPF struct_ops; see `docs/congestion.md`).
pub use rsv_cc as cc;

pub mod congestion;
pub mod paths;
pub mod record;
pub mod sealing;
#[cfg(feature = "test-certs")]
pub mod testcerts;
pub mod tls;
pub mod tlsconn;
pub mod transport;

/// What a connection should look like; `None` leaves the kernel's choice alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SocketTuning {
    pub send_buffer: Option<usize>,
    pub recv_buffer: Option<usize>,
    pub congestion: Option<String>,
    /// Bytes per second; the kernel paces this socket's packets (works without fq since 4.20).
    pub pacing_rate: Option<u64>,
    /// Bytes per second for `rsv` to start at (a rate remembered for the path, see
    /// [`paths`]) without pacing to it afterwards; ignored with `pacing_rate` (which is
    /// also the start) and on sockets that run another congestion control.
    pub start_rate: Option<u64>,
    /// Bytes per second at which `rsv` sends the start's first round (`start_rate` x RTT)
    /// to time its ACKs and start at the rate they came at (the probed start, for a path
    /// whose rate nobody knows; `docs/congestion.md`); used only with `start_rate`.
    pub probe_rate: Option<u64>,
    /// The session's group for `rsv` ([`cc::new_group`]): its connections take turns at
    /// PROBE_RTT; ignored on sockets that run another congestion control.
    pub rsv_group: Option<u32>,
    pub notsent_lowat: Option<u32>,
    pub nodelay: bool,
}

/// What was applied; a request the kernel refused is reported, not fatal, because a
/// missing congestion module must not stop a copy.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Applied {
    pub send_buffer: usize,
    pub recv_buffer: usize,
    pub congestion: Option<String>,
    pub warnings: Vec<String>,
}

pub fn apply(fd: BorrowedFd<'_>, tuning: &SocketTuning) -> Applied {
    let sock = SockRef::from(&fd);
    let mut applied = Applied::default();
    if tuning.nodelay {
        if let Err(e) = sock.set_nodelay(true) {
            applied.warnings.push(format!("TCP_NODELAY: {e}"));
        }
    }
    // The FORCE variants pass net.core.[rw]mem_max where the process may (CAP_NET_ADMIN);
    // elsewhere the plain option applies, silently capped by the kernel.
    if let Some(n) = tuning.send_buffer {
        let v = n.min(i32::MAX as usize) as u32;
        if setsockopt_u32(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v).is_err() {
            if let Err(e) = sock.set_send_buffer_size(n) {
                applied.warnings.push(format!("SO_SNDBUF {n}: {e}"));
            }
        }
    }
    if let Some(n) = tuning.recv_buffer {
        if let Err(e) = set_recv_buffer(fd, n) {
            applied.warnings.push(format!("SO_RCVBUF {n}: {e}"));
        }
    }
    if let Some(list) = &tuning.congestion {
        if let Err(why) = select_congestion(fd, list) {
            applied
                .warnings
                .push(format!("TCP_CONGESTION {list}: {why}"));
        }
    }
    if let Some(rate) = tuning.pacing_rate {
        if let Err(e) = set_pacing_rate(fd, rate) {
            applied
                .warnings
                .push(format!("SO_MAX_PACING_RATE {rate}: {e}"));
        }
    }
    if let (Some(rate), None) = (tuning.start_rate, tuning.pacing_rate) {
        match tuning.probe_rate {
            Some(probe) => {
                start_rsv_probed(fd, rate, probe);
            }
            None => {
                start_rsv_at(fd, rate);
            }
        }
    }
    if let Some(group) = tuning.rsv_group {
        group_rsv(fd, group);
    }
    if let Some(n) = tuning.notsent_lowat {
        if let Err(e) = setsockopt_u32(fd, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, n) {
            applied.warnings.push(format!("TCP_NOTSENT_LOWAT {n}: {e}"));
        }
    }
    applied.send_buffer = sock.send_buffer_size().unwrap_or(0);
    applied.recv_buffer = sock.recv_buffer_size().unwrap_or(0);
    applied.congestion = congestion(fd).ok();
    applied
}

/// `SO_RCVBUF` of `n` bytes (the kernel doubles it), past `net.core.rmem_max` where the
/// process may (`SO_RCVBUFFORCE`).
pub fn set_recv_buffer(fd: BorrowedFd<'_>, n: usize) -> io::Result<()> {
    let v = n.min(i32::MAX as usize) as u32;
    if setsockopt_u32(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v).is_err() {
        SockRef::from(&fd).set_recv_buffer_size(n)?;
    }
    Ok(())
}

fn setsockopt_u32(fd: BorrowedFd<'_>, level: i32, name: i32, v: u32) -> io::Result<()> {
    // SAFETY: fd is a live socket for the borrow's lifetime and the option value is a u32.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Selects the first congestion control of `list` (names separated by commas, e.g.
/// `rsv,cubic`) that the socket takes. Where none does and `rsv` was among them (not
/// root, not built: logged once by `cc::get`), the socket runs the kernel's preferred one
/// (BBR, else CUBIC) as without it, which is no error; otherwise the reasons are.
pub fn select_congestion(fd: BorrowedFd<'_>, list: &str) -> Result<(), String> {
    let mut why = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let r = if name == cc::NAME {
            select_rsv(fd)
        } else {
            set_congestion(fd, name)
        };
        match r {
            Ok(()) => return Ok(()),
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    if list.split(',').any(|n| n.trim() == cc::NAME) {
        tracing::debug!(
            "TCP_CONGESTION {list}: {}; the kernel's instead",
            why.join("; ")
        );
        if let Some(other) = preferred_congestion() {
            let _ = set_congestion(fd, &other);
        }
        return Ok(());
    }
    Err(why.join("; "))
}

/// Selects `rsv` on a socket, loading it into the kernel at the process's first ask, or
/// as another process registered it.
fn select_rsv(fd: BorrowedFd<'_>) -> io::Result<()> {
    match cc::get() {
        Ok(loaded) => loaded.select(fd),
        Err(_) => set_congestion(fd, cc::NAME),
    }
}

/// Tells `rsv` on this socket (when it runs it and this process loaded it) to start at and
/// pace exactly to `bytes_per_sec`, without PROBE_RTT; `None` lifts both.
fn share_to_rsv(fd: BorrowedFd<'_>, bytes_per_sec: Option<u64>) {
    let rate = bytes_per_sec.unwrap_or(0);
    update_rsv(fd, |s| {
        s.start_rate = rate;
        s.share_rate = rate;
        s.no_probe_rtt = rate > 0;
    });
}

/// Tells `rsv` on this socket (when it runs it and this process loaded it) to start at
/// `bytes_per_sec` instead of ten packets, leaving BBR's pacing and PROBE_RTT as they are
/// once it leaves STARTUP; returns whether it did.
pub fn start_rsv_at(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> bool {
    update_rsv(fd, |s| s.start_rate = bytes_per_sec)
}

/// As [`start_rsv_at`], with the first round's data (`start` x RTT) sent at `probe`
/// bytes per second so that its ACKs show the bottleneck's rate, which then becomes the
/// start (the probed start, for a path whose rate nobody knows); returns whether it did.
pub fn start_rsv_probed(fd: BorrowedFd<'_>, start: u64, probe: u64) -> bool {
    update_rsv(fd, |s| {
        s.start_rate = start;
        s.probe_rate = probe;
    })
}

/// Puts this socket in `group` for `rsv`'s PROBE_RTT (when it runs `rsv` and this process
/// loaded it): the group's connections take turns at PROBE_RTT, and skip it while another
/// one's RTT samples keep the minimum fresh; returns whether it did.
pub fn group_rsv(fd: BorrowedFd<'_>, group: u32) -> bool {
    update_rsv(fd, |s| s.group = group)
}

/// Changes this socket's `rsv` settings with `change`, when the socket runs `rsv` and this
/// process loaded it; returns whether they were set.
fn update_rsv(fd: BorrowedFd<'_>, change: impl FnOnce(&mut cc::Settings)) -> bool {
    let Some(loaded) = cc::current() else {
        return false;
    };
    if congestion(fd).ok().as_deref() != Some(cc::NAME) {
        return false;
    }
    let mut s = loaded.get(fd).ok().flatten().unwrap_or_default();
    change(&mut s);
    match loaded.set(fd, s) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!("rsv settings: {e}");
            false
        }
    }
}

pub use cc::set_congestion;

pub fn congestion(fd: BorrowedFd<'_>) -> io::Result<String> {
    let mut buf = [0u8; 32];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf and len describe a writable buffer the kernel fills.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let s = &buf[..len as usize];
    let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
    Ok(String::from_utf8_lossy(&s[..end]).into_owned())
}

/// Bytes per second (`u64::MAX`: no limit). The kernel takes a u64 since 4.13 but older
/// ones a u32; u64 is tried first. On a socket that runs `rsv`, the rate is also its
/// share: it starts there and paces exactly to it.
pub fn set_pacing_rate(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
    let r = set_max_pacing_rate(fd, bytes_per_sec);
    if r.is_ok() {
        share_to_rsv(fd, (bytes_per_sec != u64::MAX).then_some(bytes_per_sec));
    }
    r
}

fn set_max_pacing_rate(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
    // SAFETY: the option value is a u64 owned by this frame.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&bytes_per_sec as *const u64).cast(),
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    setsockopt_u32(
        fd,
        libc::SOL_SOCKET,
        libc::SO_MAX_PACING_RATE,
        bytes_per_sec.min(u32::MAX as u64) as u32,
    )
}

/// The socket's SO_MAX_PACING_RATE in bytes per second; `u64::MAX` when unlimited (the
/// kernel's default).
pub fn max_pacing_rate(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: v and len describe a writable u64; the kernel writes at most len bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&mut v as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(match len {
        // A kernel that answers with a u32 means unlimited by u32::MAX.
        4 => {
            let b = v.to_ne_bytes();
            let v32 = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            if v32 == u32::MAX {
                u64::MAX
            } else {
                u64::from(v32)
            }
        }
        _ => v,
    })
}

/// Congestion-control algorithms this kernel offers without loading modules.
pub fn available_congestion() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// What [`default_congestion`] decides from: the build, the process's capabilities and
/// the kernel's BTF and congestion controls, read now.
pub fn probe_host() -> congestion::Host {
    let list = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    };
    congestion::Host {
        built: cc::built(),
        cap_eff: std::fs::read_to_string("/proc/self/status")
            .map(|s| congestion::cap_eff(&s))
            .unwrap_or(0),
        btf: std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        available: list("/proc/sys/net/ipv4/tcp_available_congestion_control"),
        allowed: list("/proc/sys/net/ipv4/tcp_allowed_congestion_control"),
    }
}

static DEFAULT_CONGESTION: std::sync::OnceLock<congestion::Choice> = std::sync::OnceLock::new();

/// The congestion control of every connection given none (`congestion=` unset): `rsv`
/// where this process can load it (loaded here, once per process, and shared by all its
/// sockets), else BBR, else CUBIC, else the kernel's default (`congestion::choose`). The
/// first call probes, loads and logs the choice and what was missing, once; it may block
/// for the load (libbpf and the verifier, under the host-wide turn), so async callers run
/// it on a blocking thread.
pub fn default_congestion() -> &'static congestion::Choice {
    DEFAULT_CONGESTION.get_or_init(|| {
        let host = probe_host();
        let rsv = congestion::precheck(&host).and_then(|()| match cc::get_unlogged() {
            Ok(_) => Ok(()),
            Err(why) => Err(congestion::missing_from(why)),
        });
        let choice = congestion::choose(&host, rsv);
        match (&choice.rsv_missing, cc::current()) {
            (None, Some(l)) => tracing::info!(
                "congestion control: {}{}",
                choice.why,
                if l.registered_here() {
                    ""
                } else if l.shares_map() {
                    "; the name is held by another process, whose settings map this one shares"
                } else {
                    "; the name is held by another process, whose settings map was not found: \
                     per-socket settings may not reach it"
                }
            ),
            _ => tracing::warn!("congestion control: {}", choice.why),
        }
        choice
    })
}

/// The default once [`default_congestion`] has decided it; never probes or loads.
pub fn default_congestion_decided() -> Option<&'static congestion::Choice> {
    DEFAULT_CONGESTION.get()
}

/// The kernel's algorithm to prefer for long fat pipes: BBR where the kernel has it (what
/// a process that has not decided [`default_congestion`] falls back to, without loading).
pub fn preferred_congestion() -> Option<String> {
    let avail = available_congestion();
    ["bbr", "cubic"]
        .iter()
        .find(|c| avail.iter().any(|a| a == *c))
        .map(|c| (*c).to_owned())
}

/// The subset of `struct tcp_info` that auto-tuning reads.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct TcpInfo {
    /// Smoothed RTT in microseconds.
    pub rtt_us: u32,
    pub rtt_var_us: u32,
    pub min_rtt_us: u32,
    pub snd_cwnd: u32,
    pub snd_mss: u32,
    pub total_retrans: u32,
    /// Bytes per second.
    pub pacing_rate: u64,
    pub delivery_rate: u64,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// The receiver's estimate of the peer's segment size.
    pub rcv_mss: u32,
    /// Data segments received, duplicates and out-of-order ones included.
    pub data_segs_in: u32,
    /// Segments delivered to the peer (cumulatively or selectively acknowledged),
    /// retransmitted ones included once.
    pub delivered: u32,
    /// The most this end will advertise as its receive window now (bytes); it grows as
    /// data arrives, up to what the receive buffer allows.
    pub rcv_ssthresh: u32,
    /// Segments sent and not yet acknowledged cumulatively, of them selectively
    /// acknowledged, presumed lost, and retransmitted and unacknowledged
    /// (`tcpi_unacked`, `_sacked`, `_lost`, `_retrans`).
    pub unacked: u32,
    pub sacked: u32,
    pub lost: u32,
    pub retrans: u32,
}

impl TcpInfo {
    /// Segments in flight as the kernel's congestion control counts them
    /// (`tcp_packets_in_flight`): unacknowledged, less those the peer holds or that are
    /// presumed lost, plus their retransmissions.
    pub fn packets_in_flight(&self) -> u32 {
        self.unacked
            .saturating_sub(self.sacked.saturating_add(self.lost))
            .saturating_add(self.retrans)
    }

    /// Bytes in flight: [`TcpInfo::packets_in_flight`] segments of the sending MSS each
    /// (the last may be shorter; TCP_INFO keeps no byte count of it).
    pub fn bytes_in_flight(&self) -> u64 {
        u64::from(self.packets_in_flight()) * u64::from(self.snd_mss)
    }
}

// Offsets into struct tcp_info (include/uapi/linux/tcp.h), stable ABI since the fields were
// appended in order.
const OFF_SND_MSS: usize = 16;
const OFF_RCV_MSS: usize = 20;
const OFF_UNACKED: usize = 24;
const OFF_SACKED: usize = 28;
const OFF_LOST: usize = 32;
const OFF_RETRANS: usize = 36;
const OFF_RCV_SSTHRESH: usize = 64;
const OFF_RTT: usize = 68;
const OFF_RTTVAR: usize = 72;
const OFF_SND_CWND: usize = 80;
const OFF_TOTAL_RETRANS: usize = 100;
const OFF_PACING_RATE: usize = 104;
const OFF_BYTES_ACKED: usize = 120;
const OFF_BYTES_RECEIVED: usize = 128;
const OFF_MIN_RTT: usize = 148;
const OFF_DATA_SEGS_IN: usize = 152;
const OFF_DELIVERY_RATE: usize = 160;
const OFF_DELIVERED: usize = 192;

pub fn tcp_info(fd: impl AsFd) -> io::Result<TcpInfo> {
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a writable buffer; the kernel writes at most len bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = len as usize;
    let u32_at = |o: usize| {
        if o + 4 <= len {
            u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap())
        } else {
            0
        }
    };
    let u64_at = |o: usize| {
        if o + 8 <= len {
            u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap())
        } else {
            0
        }
    };
    Ok(TcpInfo {
        rtt_us: u32_at(OFF_RTT),
        rtt_var_us: u32_at(OFF_RTTVAR),
        min_rtt_us: u32_at(OFF_MIN_RTT),
        snd_cwnd: u32_at(OFF_SND_CWND),
        snd_mss: u32_at(OFF_SND_MSS),
        total_retrans: u32_at(OFF_TOTAL_RETRANS),
        pacing_rate: u64_at(OFF_PACING_RATE),
        delivery_rate: u64_at(OFF_DELIVERY_RATE),
        bytes_acked: u64_at(OFF_BYTES_ACKED),
        bytes_received: u64_at(OFF_BYTES_RECEIVED),
        rcv_mss: u32_at(OFF_RCV_MSS),
        data_segs_in: u32_at(OFF_DATA_SEGS_IN),
        delivered: u32_at(OFF_DELIVERED),
        rcv_ssthresh: u32_at(OFF_RCV_SSTHRESH),
        unacked: u32_at(OFF_UNACKED),
        sacked: u32_at(OFF_SACKED),
        lost: u32_at(OFF_LOST),
        retrans: u32_at(OFF_RETRANS),
    })
}

/// What the kernel lets a socket's buffers grow to: the autotuning ceilings
/// (`net.ipv4.tcp_wmem`/`tcp_rmem`, third field) and the ceilings of an explicit
/// `SO_SNDBUF`/`SO_RCVBUF` (`net.core.wmem_max`/`rmem_max`), which a process with
/// CAP_NET_ADMIN may pass with `SO_SNDBUFFORCE`/`SO_RCVBUFFORCE`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelLimits {
    pub tcp_wmem_max: usize,
    pub tcp_rmem_max: usize,
    pub wmem_max: usize,
    pub rmem_max: usize,
    /// The process may exceed `wmem_max`/`rmem_max` (root or CAP_NET_ADMIN).
    pub can_force: bool,
}

impl KernelLimits {
    /// Reads the limits of the calling thread's network namespace.
    pub fn read() -> KernelLimits {
        let third = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.split_whitespace().nth(2).and_then(|x| x.parse().ok()))
                .unwrap_or(4 << 20)
        };
        let one = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(212_992)
        };
        KernelLimits {
            tcp_wmem_max: third("/proc/sys/net/ipv4/tcp_wmem"),
            tcp_rmem_max: third("/proc/sys/net/ipv4/tcp_rmem"),
            wmem_max: one("/proc/sys/net/core/wmem_max"),
            rmem_max: one("/proc/sys/net/core/rmem_max"),
            can_force: has_net_admin(),
        }
    }
}

fn has_net_admin() -> bool {
    // CapEff in /proc/self/status; CAP_NET_ADMIN is bit 12.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 12) != 0)
}

/// The largest explicit buffer a socket may be given (bytes passed to setsockopt; the kernel
/// doubles them for its bookkeeping).
pub const MAX_EXPLICIT_BUFFER: usize = 64 << 20;

/// How to give one socket room for `window` bytes in flight in one direction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BufferChoice {
    /// `None`: leave the kernel's autotuning alone, it reaches the window.
    pub bytes: Option<usize>,
    pub why: String,
}

/// Chooses a buffer for `window` bytes in flight given the autotuning ceiling `auto_max`
/// and the explicit ceiling `explicit_max` of that direction. The kernel's accounting
/// (sk_buff overhead, `tcp_adv_win_scale`) makes roughly half of a buffer usable for
/// payload, so a window needs twice its size.
pub fn choose_buffer(
    window: usize,
    auto_max: usize,
    explicit_max: usize,
    can_force: bool,
) -> BufferChoice {
    let need = window.saturating_mul(2);
    if need <= auto_max {
        return BufferChoice {
            bytes: None,
            why: format!(
                "kernel autotuning reaches {} (needs {})",
                mib(auto_max),
                mib(need)
            ),
        };
    }
    // setsockopt takes half of what the socket ends up with.
    let want = window.min(MAX_EXPLICIT_BUFFER);
    let cap = if can_force {
        MAX_EXPLICIT_BUFFER
    } else {
        explicit_max
    };
    let bytes = want.min(cap).max(64 * 1024);
    let why = if bytes < want {
        format!(
            "{} set explicitly, capped by net.core.[rw]mem_max (needs {}; run with \
             CAP_NET_ADMIN or raise the sysctl)",
            mib(bytes * 2),
            mib(need)
        )
    } else {
        format!(
            "{} set explicitly: the autotuning ceiling {} is below the {} needed",
            mib(bytes * 2),
            mib(auto_max),
            mib(need)
        )
    };
    BufferChoice {
        bytes: Some(bytes),
        why,
    }
}

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20))
}

/// The receive buffer (bytes for `SO_RCVBUF`) to give a socket before its handshake, so
/// that its first window is the one autotuning would reach anyway: `None` where that is no
/// more than the kernel's default.
///
/// A TCP connection's first advertised window is what its receive buffer holds at the
/// handshake: 64 KB with the kernel's default 128 KB buffer (a listener's buffer passes
/// to the connections it accepts). Autotuning then opens it as data arrives, by a few
/// segments for each one received: about five round trips before a window of a few MB,
/// 1.75 s at 350 ms, during which a sender with the rate already known waits. Given the
/// buffer autotuning would grow to (`net.ipv4.tcp_rmem`'s maximum) before the handshake,
/// the window is open from the first round trip. The buffer is then fixed, as any
/// explicit buffer is: its memory is taken only by data waiting to be read, which a
/// target or an initiator bounds by what it has asked for.
pub fn first_window_buffer(limits: &KernelLimits) -> Option<usize> {
    // setsockopt takes half of what the socket ends up with.
    let half = limits.tcp_rmem_max / 2;
    let cap = if limits.can_force {
        MAX_EXPLICIT_BUFFER
    } else {
        limits.rmem_max
    };
    let bytes = half.min(cap);
    // The kernel's default buffer (net.ipv4.tcp_rmem's middle, 128 KB) is 64 KiB here.
    (bytes > 64 * 1024).then_some(bytes)
}

/// The receive buffer to listen or dial with: the configured one, else with auto-tuning
/// [`first_window_buffer`] of this network namespace's limits.
pub fn first_window(configured: Option<usize>, auto_tune: bool) -> Option<usize> {
    match configured {
        Some(n) => Some(n),
        None if auto_tune => first_window_buffer(&KernelLimits::read()),
        None => None,
    }
}

/// The rate both ends size their buffers for when no rate is known: a fast WAN.
pub const ASSUMED_RATE_BPS: u64 = 1_000_000_000;

/// Buffers for one connection of a path with round-trip time `rtt` whose rate is not
/// known (the target's side): room for twice the BDP at [`ASSUMED_RATE_BPS`], explicit only
/// where the kernel's autotuning would stop short. Returns (send, receive).
pub fn buffers_for_rtt(
    rtt: std::time::Duration,
    limits: &KernelLimits,
) -> (BufferChoice, BufferChoice) {
    let window = (bdp_bytes(ASSUMED_RATE_BPS, rtt) * 2) as usize;
    (
        choose_buffer(
            window,
            limits.tcp_wmem_max,
            limits.wmem_max,
            limits.can_force,
        ),
        choose_buffer(
            window,
            limits.tcp_rmem_max,
            limits.rmem_max,
            limits.can_force,
        ),
    )
}

/// Bandwidth-delay product in bytes for a rate in bits per second and an RTT.
pub fn bdp_bytes(rate_bps: u64, rtt: std::time::Duration) -> u64 {
    (rate_bps as u128 * rtt.as_micros() / 8 / 1_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    #[test]
    fn buffers_left_to_autotuning_when_it_reaches_the_window() {
        let c = choose_buffer(1 << 20, 4 << 20, 212_992, false);
        assert_eq!(c.bytes, None, "{}", c.why);
    }

    #[test]
    fn buffers_set_explicitly_beyond_autotuning() {
        // 25 MB in flight, 4 MiB autotuning ceiling: explicit, forced past wmem_max.
        let c = choose_buffer(25_000_000, 4 << 20, 212_992, true);
        assert_eq!(c.bytes, Some(25_000_000));
        // Without CAP_NET_ADMIN the sysctl caps it and the reason says so.
        let c = choose_buffer(25_000_000, 4 << 20, 8 << 20, false);
        assert_eq!(c.bytes, Some(8 << 20));
        assert!(c.why.contains("capped"), "{}", c.why);
        // Never more than the explicit maximum.
        let c = choose_buffer(usize::MAX / 4, 4 << 20, 8 << 20, true);
        assert_eq!(c.bytes, Some(MAX_EXPLICIT_BUFFER));
    }

    #[test]
    fn the_first_window_buffer_is_autotunings_ceiling() {
        let l = |tcp_rmem_max, rmem_max, can_force| KernelLimits {
            tcp_wmem_max: 4 << 20,
            tcp_rmem_max,
            wmem_max: 212_992,
            rmem_max,
            can_force,
        };
        // Half of the ceiling: the kernel doubles what setsockopt is given.
        assert_eq!(
            first_window_buffer(&l(32 << 20, 212_992, true)),
            Some(16 << 20)
        );
        assert_eq!(
            first_window_buffer(&l(6 << 20, 8 << 20, false)),
            Some(3 << 20)
        );
        // Without CAP_NET_ADMIN net.core.rmem_max caps it; at the default nothing is won.
        assert_eq!(
            first_window_buffer(&l(32 << 20, 1 << 20, false)),
            Some(1 << 20)
        );
        assert_eq!(first_window_buffer(&l(32 << 20, 65_536, false)), None);
        assert_eq!(first_window_buffer(&l(128 << 10, 8 << 20, true)), None);
    }

    #[test]
    fn a_listeners_buffer_is_the_first_window_of_what_it_accepts() {
        let first = |buffer: Option<usize>| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            if let Some(n) = buffer {
                set_recv_buffer(s.as_fd(), n).unwrap();
            }
            s.bind(
                &"127.0.0.1:0"
                    .parse::<std::net::SocketAddr>()
                    .unwrap()
                    .into(),
            )
            .unwrap();
            s.listen(1).unwrap();
            let l: TcpListener = s.into();
            let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (a, _) = l.accept().unwrap();
            tcp_info(&a).unwrap().rcv_ssthresh
        };
        let default = first(None);
        let opened = first(Some(4 << 20));
        // The kernel's default buffer opens at about 64 KB; 4 MiB opens at about 4 MiB.
        assert!(default < 1 << 20, "{default}");
        assert!(opened >= 3 << 20, "{opened} (default {default})");
    }

    #[test]
    fn a_congestion_list_takes_the_first_the_socket_takes() {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let fd = s.as_fd();
        // "reno" is built into every kernel; the first name is not.
        assert_eq!(select_congestion(fd, "no-such-cc, reno"), Ok(()));
        assert_eq!(congestion(fd).unwrap(), "reno");
        let e = select_congestion(fd, "no-such-cc").unwrap_err();
        assert!(e.starts_with("no-such-cc: "), "{e}");
        assert_eq!(congestion(fd).unwrap(), "reno");
    }

    #[test]
    fn kernel_limits_are_readable() {
        let l = KernelLimits::read();
        assert!(l.tcp_rmem_max > 0 && l.tcp_wmem_max > 0 && l.rmem_max > 0);
    }

    #[test]
    fn bdp_of_r0_link_is_1_25_mb() {
        assert_eq!(
            bdp_bytes(100_000_000, Duration::from_millis(100)),
            1_250_000
        );
    }

    #[test]
    fn tuning_applies_to_a_loopback_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let avail = available_congestion();
        let cc = preferred_congestion();
        let t = SocketTuning {
            send_buffer: Some(1 << 20),
            recv_buffer: Some(1 << 20),
            congestion: cc.clone(),
            pacing_rate: Some(10_000_000),
            start_rate: None,
            probe_rate: None,
            rsv_group: None,
            notsent_lowat: Some(128 * 1024),
            nodelay: true,
        };
        assert_eq!(max_pacing_rate(c.as_fd()).unwrap(), u64::MAX);
        let a = apply(c.as_fd(), &t);
        assert!(
            a.warnings.is_empty(),
            "{:?} (available: {avail:?})",
            a.warnings
        );
        assert_eq!(max_pacing_rate(c.as_fd()).unwrap(), 10_000_000);
        // The kernel doubles the requested size for bookkeeping, within the sysctl caps.
        assert!(a.send_buffer >= 200_000, "{}", a.send_buffer);
        assert_eq!(a.congestion, cc);
        let info = tcp_info(&c).unwrap();
        assert!(info.snd_mss > 0);
    }
}
