//! The relay's control socket: one JSON request per connection, one JSON line back.

use crate::link::{socket_path, LinkConfig, LinkUpdate};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    Get,
    Stats,
    Set { update: Box<LinkUpdate> },
    Quit,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<LinkConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<LinkStats>,
}

/// Counters of one direction, updated by its relay thread.
#[derive(Debug, Default)]
pub struct DirCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub drop_loss: AtomicU64,
    pub drop_queue: AtomicU64,
    pub drop_other: AtomicU64,
    pub queue_bytes: AtomicU64,
    pub queue_packets: AtomicU64,
    pub queue_max_bytes: AtomicU64,
    pub in_flight_packets: AtomicU64,
}

/// A snapshot of [`DirCounters`]. `rx` counts what entered the link, `tx` what left it at the
/// far side; `drop_other` counts packets the relay could not buffer or write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DirStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drop_loss: u64,
    pub drop_queue: u64,
    pub drop_other: u64,
    pub queue_bytes: u64,
    pub queue_packets: u64,
    pub queue_max_bytes: u64,
    /// Packets past the bottleneck, still in their propagation delay.
    pub in_flight_packets: u64,
}

impl DirCounters {
    pub fn snapshot(&self) -> DirStats {
        DirStats {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            tx_packets: self.tx_packets.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            drop_loss: self.drop_loss.load(Relaxed),
            drop_queue: self.drop_queue.load(Relaxed),
            drop_other: self.drop_other.load(Relaxed),
            queue_bytes: self.queue_bytes.load(Relaxed),
            queue_packets: self.queue_packets.load(Relaxed),
            queue_max_bytes: self.queue_max_bytes.load(Relaxed),
            in_flight_packets: self.in_flight_packets.load(Relaxed),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    pub uptime_s: f64,
    pub ab: DirStats,
    pub ba: DirStats,
}

/// Sends one request to link `name`'s relay.
pub fn request(name: &str, req: &Request) -> Result<Response> {
    let path = socket_path(name);
    let mut stream =
        UnixStream::connect(&path).with_context(|| format!("connecting to {}", path.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    if reply.is_empty() {
        bail!("relay closed the control connection");
    }
    let resp: Response = serde_json::from_str(&reply).context("relay reply")?;
    if !resp.ok {
        bail!("relay: {}", resp.error.unwrap_or_default());
    }
    Ok(resp)
}
