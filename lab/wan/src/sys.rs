//! Thin wrappers over the system calls the emulator needs: network namespaces, TUN devices,
//! the monotonic clock, precise sleeps, and `ip` invocations.

use anyhow::{bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

/// Where `ip netns` keeps its bind mounts.
pub const NETNS_DIR: &str = "/run/netns";

/// CLOCK_MONOTONIC in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Timer slack defaults to 50 µs for normal threads; a relay thread wants its wake-ups on time.
pub fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}

/// Waits until `fd` is readable or `timeout_ns` passes (None: forever).
pub fn wait_readable(fd: i32, timeout_ns: Option<u64>) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: pfd and ts outlive the call; a null sigmask keeps the current mask.
    unsafe { libc::ppoll(&mut pfd, 1, tsp, std::ptr::null()) };
}

/// Runs `f` on a fresh thread that has entered network namespace `ns` (a name under
/// /run/netns). Sockets and TUN devices created there stay in that namespace when used from
/// any other thread afterwards.
pub fn in_netns<T, F>(ns: &str, f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    let path = Path::new(NETNS_DIR).join(ns);
    let nsfile = File::open(&path).with_context(|| format!("network namespace {ns}"))?;
    std::thread::spawn(move || {
        // SAFETY: setns on a namespace fd affects only this thread, which ends after f.
        let rc = unsafe { libc::setns(nsfile.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            bail!("setns: {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("netns thread panicked"))?
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Creates TUN device `name` (IFF_TUN | IFF_NO_PI) in the calling thread's namespace and
/// returns its non-blocking fd. The device lives as long as the fd.
pub fn open_tun(name: &str) -> Result<File> {
    if name.len() >= libc::IFNAMSIZ {
        bail!("interface name {name} too long");
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .context("open /dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: req is a properly laid out struct ifreq for TUNSETIFF.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) };
    if rc != 0 {
        bail!("TUNSETIFF {name}: {}", std::io::Error::last_os_error());
    }
    Ok(file)
}

/// Duplicates a descriptor (close-on-exec).
pub fn dup(fd: &File) -> Result<File> {
    // SAFETY: fcntl F_DUPFD_CLOEXEC on a valid fd returns a new owned fd or -1.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        bail!("dup: {}", std::io::Error::last_os_error());
    }
    // SAFETY: new is a fresh descriptor nobody else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(new) }))
}

/// Runs `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Writes a sysctl under /proc/sys inside namespace `ns`.
pub fn sysctl_in(ns: &str, key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let value = value.to_string();
    in_netns(ns, move || {
        std::fs::write(&path, value).with_context(|| format!("writing {path}"))
    })
}

pub fn netns_exists(ns: &str) -> bool {
    Path::new(NETNS_DIR).join(ns).exists()
}

/// Names of all namespaces under /run/netns.
pub fn list_netns() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` runs; a zombie waiting for its parent to reap it does not.
pub fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim().chars().next());
    !matches!(state, Some('Z') | Some('X'))
}

pub fn kill(pid: i32, sig: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, sig) };
}
