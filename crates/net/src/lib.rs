//! Socket tuning that both ends share: buffer sizes, congestion control, pacing,
//! TCP_NOTSENT_LOWAT and TCP_INFO sampling. Everything works on a raw fd so that std and
//! tokio sockets alike can be tuned.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use serde::Serialize;
use socket2::SockRef;

/// What a connection should look like; `None` leaves the kernel's choice alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SocketTuning {
    pub send_buffer: Option<usize>,
    pub recv_buffer: Option<usize>,
    pub congestion: Option<String>,
    /// Bytes per second; the kernel paces this socket's packets (works without fq since 4.20).
    pub pacing_rate: Option<u64>,
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
    if let Some(n) = tuning.send_buffer {
        if let Err(e) = sock.set_send_buffer_size(n) {
            applied.warnings.push(format!("SO_SNDBUF {n}: {e}"));
        }
    }
    if let Some(n) = tuning.recv_buffer {
        if let Err(e) = sock.set_recv_buffer_size(n) {
            applied.warnings.push(format!("SO_RCVBUF {n}: {e}"));
        }
    }
    if let Some(cc) = &tuning.congestion {
        if let Err(e) = set_congestion(fd, cc) {
            applied.warnings.push(format!("TCP_CONGESTION {cc}: {e}"));
        }
    }
    if let Some(rate) = tuning.pacing_rate {
        if let Err(e) = set_pacing_rate(fd, rate) {
            applied
                .warnings
                .push(format!("SO_MAX_PACING_RATE {rate}: {e}"));
        }
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

/// Bytes per second. The kernel takes a u64 since 4.13 but older ones a u32; u64 is tried
/// first.
pub fn set_pacing_rate(fd: BorrowedFd<'_>, bytes_per_sec: u64) -> io::Result<()> {
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

/// Congestion-control algorithms this kernel offers without loading modules.
pub fn available_congestion() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The algorithm to prefer for long fat pipes: BBR where the kernel has it.
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
}

// Offsets into struct tcp_info (include/uapi/linux/tcp.h), stable ABI since the fields were
// appended in order.
const OFF_SND_MSS: usize = 16;
const OFF_RTT: usize = 68;
const OFF_RTTVAR: usize = 72;
const OFF_SND_CWND: usize = 80;
const OFF_TOTAL_RETRANS: usize = 100;
const OFF_PACING_RATE: usize = 104;
const OFF_BYTES_ACKED: usize = 120;
const OFF_BYTES_RECEIVED: usize = 128;
const OFF_MIN_RTT: usize = 148;
const OFF_DELIVERY_RATE: usize = 160;

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
    })
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
            notsent_lowat: Some(128 * 1024),
            nodelay: true,
        };
        let a = apply(c.as_fd(), &t);
        assert!(
            a.warnings.is_empty(),
            "{:?} (available: {avail:?})",
            a.warnings
        );
        // The kernel doubles the requested size for bookkeeping, within the sysctl caps.
        assert!(a.send_buffer >= 200_000, "{}", a.send_buffer);
        assert_eq!(a.congestion, cc);
        let info = tcp_info(&c).unwrap();
        assert!(info.snd_mss > 0);
    }
}
