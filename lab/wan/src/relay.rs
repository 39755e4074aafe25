//! The relay process: one thread per direction moves packets from one site's TUN device to
//! the other's through a [`Shaper`], and a control thread answers on the link's socket.
//!
//! Each direction thread owns a preallocated byte ring. A packet is read straight into the
//! ring, judged by the shaper, and either left there (its slot is reused) or queued in a FIFO
//! of (offset, length, delivery time). Delivery times never decrease (the shaper guarantees
//! it), so the FIFO head is always the next packet due and no timer wheel is needed. The
//! thread sleeps in `ppoll` on the input device until the head is due (timer slack 1 ns),
//! busy-waiting only for the last `spin_ns` before it.

use crate::control::{DirCounters, LinkStats, Request, Response};
use crate::link::{self, LinkConfig, Side, TUN_NAME};
use crate::model::{DirParams, DropCause, Shaper, Verdict};
use crate::sys;
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// State shared by the direction threads and the control thread.
struct Shared {
    config: Mutex<LinkConfig>,
    /// Bumped on every change of `config`; direction threads poll it once per loop.
    generation: AtomicU64,
    counters: [DirCounters; 2],
    started: Instant,
}

/// The relay's nice value (the endpoints run at 0).
const RELAY_NICE: libc::c_int = -10;
/// The real-time priority of the threads that move packets (SCHED_FIFO, 1..99).
const RELAY_RT_PRIORITY: libc::c_int = 10;

/// Puts the calling thread (one direction of the link) in SCHED_FIFO where allowed. Nice
/// alone was not enough: with sixteen endpoints busy on two cores (the R2 lab at 800
/// Mbit/s) the relay, at -10 among them, still lost 686,145 packets on a TUN device that
/// queues 20,000. A packet-moving thread sleeps until a packet arrives or one is due, so it
/// takes a third of a core at 800 Mbit/s and leaves the rest; the kernel's real-time
/// throttling keeps 5 % of each core for others in any case. Without the privilege it
/// stays at the nice value.
fn realtime() {
    let param = libc::sched_param {
        sched_priority: RELAY_RT_PRIORITY,
    };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        tracing::debug!(
            "relay: SCHED_FIFO: {}; nice {RELAY_NICE} only",
            std::io::Error::last_os_error()
        );
    }
}

/// Runs the relay of link `name` until told to quit. Its configuration comes from the
/// link's state directory, which `up` has written.
pub fn run(name: &str) -> Result<()> {
    let cfg = LinkConfig::load(name)?;
    let tun_a = sys::in_netns(&cfg.netns(Side::A, 1), || sys::open_tun(TUN_NAME))
        .context("TUN device of site a")?;
    let tun_b = sys::in_netns(&cfg.netns(Side::B, 1), || sys::open_tun(TUN_NAME))
        .context("TUN device of site b")?;
    // Ahead of the endpoints in the CPU queue: a relay that waits for a core delays every
    // packet and, once the TUN queue is full, drops them, which the emulated link would
    // not. Threads inherit it; failing to raise it only costs timing.
    // SAFETY: setpriority on the calling thread (who 0) has no memory effects.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, RELAY_NICE) } != 0 {
        tracing::debug!(
            "relay: nice {RELAY_NICE}: {}",
            std::io::Error::last_os_error()
        );
    }
    let shared = Arc::new(Shared {
        config: Mutex::new(cfg.clone()),
        generation: AtomicU64::new(0),
        counters: Default::default(),
        started: Instant::now(),
    });
    let seed = sys::now_ns() ^ (std::process::id() as u64) << 32;
    for (index, input, output) in [
        (0usize, sys::dup(&tun_a)?, sys::dup(&tun_b)?),
        (1usize, tun_b, tun_a),
    ] {
        let shared = shared.clone();
        let mut dir = Direction::new(index, input, output, &cfg, seed.wrapping_add(index as u64));
        std::thread::Builder::new()
            .name(if index == 0 { "wan-ab" } else { "wan-ba" }.into())
            .spawn(move || dir.run(&shared))?;
    }
    let sock = link::socket_path(name);
    let _ = std::fs::remove_file(&sock);
    let listener =
        UnixListener::bind(&sock).with_context(|| format!("binding {}", sock.display()))?;
    std::fs::write(link::pid_path(name), format!("{}\n", std::process::id()))?;
    tracing::info!("relay for {name} running");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if let Err(e) = serve(stream, &shared) {
            tracing::warn!("control connection: {e:#}");
        }
    }
    Ok(())
}

fn serve(stream: UnixStream, shared: &Shared) -> Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let mut quit = false;
    let resp = match serde_json::from_str::<Request>(&line) {
        Err(e) => Response {
            error: Some(format!("bad request: {e}")),
            ..Default::default()
        },
        Ok(req) => {
            let mut resp = Response {
                ok: true,
                ..Default::default()
            };
            match req {
                Request::Ping => {}
                Request::Get => resp.config = Some(shared.config.lock().unwrap().clone()),
                Request::Stats => resp.stats = Some(stats(shared)),
                Request::Set { update } => {
                    let mut cfg = shared.config.lock().unwrap();
                    cfg.apply(&update);
                    cfg.save()?;
                    shared.generation.fetch_add(1, Relaxed);
                    resp.config = Some(cfg.clone());
                }
                Request::Quit => quit = true,
            }
            resp
        }
    };
    let mut out = serde_json::to_vec(&resp)?;
    out.push(b'\n');
    (&stream).write_all(&out)?;
    if quit {
        let name = shared.config.lock().unwrap().name.clone();
        let _ = std::fs::remove_file(link::socket_path(&name));
        let _ = std::fs::remove_file(link::pid_path(&name));
        tracing::info!("relay for {name} quitting");
        std::process::exit(0);
    }
    Ok(())
}

fn stats(shared: &Shared) -> LinkStats {
    LinkStats {
        uptime_s: shared.started.elapsed().as_secs_f64(),
        ab: shared.counters[0].snapshot(),
        ba: shared.counters[1].snapshot(),
    }
}

struct Pending {
    offset: usize,
    len: usize,
    due: u64,
}

/// Packets waiting for their delivery time, stored back to back in one buffer.
struct Ring {
    buf: Vec<u8>,
    pending: VecDeque<Pending>,
    write: usize,
    /// Room reserved for every read: the largest packet the TUN device can hand us.
    slot: usize,
}

impl Ring {
    fn new(capacity: usize, slot: usize) -> Ring {
        Ring {
            // Zeroed allocation: pages are only touched (and made resident) once used.
            buf: vec![0; capacity],
            pending: VecDeque::with_capacity(capacity / 512),
            write: 0,
            slot,
        }
    }

    /// Where the next packet can be read to, if there is room for a full slot.
    fn reserve(&mut self) -> Option<usize> {
        let Some(head) = self.pending.front() else {
            self.write = 0;
            return Some(0);
        };
        let read = head.offset;
        if self.write >= read {
            if self.write + self.slot <= self.buf.len() {
                return Some(self.write);
            }
            // Wrap; strictly below `read` so a full ring never looks empty.
            if self.slot < read {
                self.write = 0;
                return Some(0);
            }
            None
        } else if self.write + self.slot < read {
            Some(self.write)
        } else {
            None
        }
    }

    fn commit(&mut self, offset: usize, len: usize, due: u64) {
        self.pending.push_back(Pending { offset, len, due });
        // Keep packets cache-line aligned.
        self.write = offset + ((len + 63) & !63);
    }
}

struct Direction {
    index: usize,
    input: File,
    output: File,
    shaper: Shaper,
    ring: Ring,
    scratch: Vec<u8>,
    spin_ns: u64,
    generation: u64,
    /// The ring grows to this when it is next empty, after a `set` made the link longer.
    want_capacity: usize,
}

/// Room for a full bottleneck queue plus twice the bytes in flight over the delay (at the
/// link rate, or 2 Gbit/s when unlimited), so memory follows the link's size. Packets that
/// find no room count as `drop_other`.
fn ring_capacity(p: &DirParams) -> usize {
    let rate = if p.rate_bps == 0 {
        2_000_000_000
    } else {
        p.rate_bps
    };
    let delay = p.delay_ns + p.jitter_ns;
    let in_flight = (rate as u128 * delay as u128 / 8 / 1_000_000_000) as u64;
    (2 * (p.queue_bytes + in_flight) + (16 << 20)).min(1 << 30) as usize
}

const BATCH: usize = 64;
/// Longest sleep without a look at new parameters.
const IDLE_NS: u64 = 100_000_000;

impl Direction {
    fn new(index: usize, input: File, output: File, cfg: &LinkConfig, seed: u64) -> Direction {
        let params = Self::params_of(cfg, index);
        let slot = cfg.mtu as usize + 64;
        let capacity = ring_capacity(&params);
        Direction {
            index,
            input,
            output,
            shaper: Shaper::new(params, seed),
            ring: Ring::new(capacity, slot),
            scratch: vec![0; 65536],
            spin_ns: cfg.spin_ns,
            generation: 0,
            want_capacity: capacity,
        }
    }

    fn params_of(cfg: &LinkConfig, index: usize) -> DirParams {
        if index == 0 {
            cfg.ab
        } else {
            cfg.ba
        }
    }

    fn run(&mut self, shared: &Shared) {
        sys::set_timer_slack_ns(1);
        realtime();
        let counters = &shared.counters[self.index];
        let in_fd = self.input.as_raw_fd();
        let out_fd = self.output.as_raw_fd();
        let (mut rx_p, mut rx_b, mut tx_p, mut tx_b) = (0u64, 0u64, 0u64, 0u64);
        let (mut d_loss, mut d_queue, mut d_other) = (0u64, 0u64, 0u64);
        loop {
            let generation = shared.generation.load(Relaxed);
            if generation != self.generation {
                self.generation = generation;
                let cfg = shared.config.lock().unwrap();
                let params = Self::params_of(&cfg, self.index);
                self.shaper.set_params(params);
                self.spin_ns = cfg.spin_ns;
                self.want_capacity = self.want_capacity.max(ring_capacity(&params));
            }
            if self.want_capacity > self.ring.buf.len() && self.ring.pending.is_empty() {
                self.ring = Ring::new(self.want_capacity, self.ring.slot);
            }
            let mut now = sys::now_ns();
            while let Some(p) = self.ring.pending.front() {
                if p.due > now {
                    break;
                }
                let packet = &self.ring.buf[p.offset..p.offset + p.len];
                // SAFETY: writing an initialized buffer to our own fd.
                let n = unsafe { libc::write(out_fd, packet.as_ptr().cast(), packet.len()) };
                if n == p.len as isize {
                    tx_p += 1;
                    tx_b += p.len as u64;
                } else {
                    d_other += 1;
                }
                self.ring.pending.pop_front();
            }
            let mut got = 0;
            while got < BATCH {
                let (ptr, cap, offset) = match self.ring.reserve() {
                    Some(off) => (self.ring.buf[off..].as_mut_ptr(), self.ring.slot, Some(off)),
                    None => (self.scratch.as_mut_ptr(), self.scratch.len(), None),
                };
                // SAFETY: ptr points at `cap` writable bytes owned by this thread.
                let n = unsafe { libc::read(in_fd, ptr.cast(), cap) };
                if n <= 0 {
                    break;
                }
                got += 1;
                let len = n as usize;
                rx_p += 1;
                rx_b += len as u64;
                now = sys::now_ns();
                let Some(offset) = offset else {
                    d_other += 1;
                    continue;
                };
                match self.shaper.admit(now, len as u32) {
                    Verdict::Deliver(due) => self.ring.commit(offset, len, due),
                    Verdict::Drop(DropCause::RandomLoss) => d_loss += 1,
                    Verdict::Drop(DropCause::QueueOverflow) => d_queue += 1,
                }
            }
            counters.rx_packets.store(rx_p, Relaxed);
            counters.rx_bytes.store(rx_b, Relaxed);
            counters.tx_packets.store(tx_p, Relaxed);
            counters.tx_bytes.store(tx_b, Relaxed);
            counters.drop_loss.store(d_loss, Relaxed);
            counters.drop_queue.store(d_queue, Relaxed);
            counters.drop_other.store(d_other, Relaxed);
            let queued_packets = self.shaper.queued_packets(now) as u64;
            counters
                .queue_bytes
                .store(self.shaper.queued_bytes(now), Relaxed);
            counters.queue_packets.store(queued_packets, Relaxed);
            counters
                .queue_max_bytes
                .store(self.shaper.max_queued_bytes(), Relaxed);
            counters.in_flight_packets.store(
                (self.ring.pending.len() as u64).saturating_sub(queued_packets),
                Relaxed,
            );
            if got > 0 {
                continue;
            }
            let now = sys::now_ns();
            match self.ring.pending.front() {
                None => sys::wait_readable(in_fd, Some(IDLE_NS)),
                Some(p) if p.due > now + self.spin_ns => {
                    let wait = (p.due - now - self.spin_ns).min(IDLE_NS);
                    sys::wait_readable(in_fd, Some(wait));
                }
                Some(_) => std::hint::spin_loop(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_reuses_space_and_never_overwrites_pending_packets() {
        let mut ring = Ring::new(1000, 200);
        let mut offsets = vec![];
        while let Some(off) = ring.reserve() {
            ring.commit(off, 150, 0);
            offsets.push(off);
        }
        assert_eq!(offsets, [0, 192, 384, 576, 768]);
        ring.pending.pop_front();
        // 960 + 200 > 1000 and wrapping needs 200 < 192: still full.
        assert_eq!(ring.reserve(), None);
        ring.pending.pop_front();
        assert_eq!(ring.reserve(), Some(0));
        ring.commit(0, 100, 0);
        // Between 128 and the oldest pending packet at 384 there is room for one slot.
        assert_eq!(ring.reserve(), Some(128));
        ring.commit(128, 100, 0);
        assert_eq!(ring.reserve(), None);
    }

    #[test]
    fn ring_follows_the_link_size() {
        let p = DirParams {
            rate_bps: 1_000_000_000,
            delay_ns: 10_000_000,
            jitter_ns: 0,
            loss: crate::model::LossModel::NONE,
            queue_bytes: 2_500_000,
            queue_auto: true,
        };
        // 2 * (2.5 MB queue + 1.25 MB in flight) + 16 MiB.
        assert_eq!(ring_capacity(&p), 7_500_000 + (16 << 20));
        let huge = DirParams {
            delay_ns: 3_600_000_000_000,
            ..p
        };
        assert_eq!(ring_capacity(&huge), 1 << 30);
    }
}
