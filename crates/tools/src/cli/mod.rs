//! `rsv ls`, `rsv inq`, `rsv cp`, `rsv bench`, `rsv tune`, `rsv mount`: argument structs and
//! their logic, a module each; the session flags they share are here. The `rsv` binary
//! only dispatches here.

mod bench;
mod cp;
mod inq;
mod ls;

pub use bench::*;
pub use cp::*;
pub use inq::*;
pub use ls::*;

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use serde::Serialize;
use tokio::task::JoinSet;
use units::{Rate, Size};

pub use crate::mount::{mount, MountArgs};
pub use crate::tune_cli::{tune, TuneArgs};
use initiator::copy::{CopyOptions, Endpoint};
use initiator::isns::IsnsUrl;
use initiator::scsi::{self, Capacity};
use initiator::Lun;
use initiator::{discover, IscsiUrl, Session, SessionInfo, SessionOptions};

/// Session flags shared by the commands. A flag overrides the same key in the URL's query
/// string, which overrides the default.
#[derive(Args, Clone, Debug, Default)]
pub struct SessionFlags {
    /// TCP connections per session (MC/S); the target may grant fewer.
    #[arg(long)]
    pub connections: Option<u16>,
    /// Commands in flight per session.
    #[arg(long)]
    pub queue_depth: Option<usize>,
    /// Pace each connection at this rate: bits as tc writes them (100mbit) or bytes per
    /// second (12.5MB/s); a bare number is refused.
    #[arg(long, value_parser = units::parse_rate)]
    pub pacing_rate: Option<Rate>,
    /// The bottleneck's rate (100mbit, 12.5MB/s): auto-tuning sizes for it and paces the
    /// connections to share it.
    #[arg(long, value_parser = units::parse_rate)]
    pub rate: Option<Rate>,
    /// Take connections, queue depth, bursts and buffers as given instead of choosing
    /// them from the measured path.
    #[arg(long)]
    pub no_auto_tune: bool,
    /// Ask for CRC32C header digests.
    #[arg(long)]
    pub header_digest: bool,
    /// Ask for CRC32C data digests.
    #[arg(long)]
    pub data_digest: bool,
    /// Our iSCSI name (default iqn.2026-01.org.reservoir:initiator.HOSTNAME).
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// The target's CHAP secret: asks the target to authenticate itself (mutual CHAP).
    #[arg(long, env = "RSV_TARGET_PASSWORD")]
    pub target_password: Option<String>,
    /// ErrorRecoveryLevel to propose: 2 (default) recovers a lost connection by task
    /// reassignment where the target grants it; 0 reissues lost commands (what targets
    /// granting only 0, such as tgt, get anyway).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub erl: Option<u8>,
    /// Every connection over TLS 1.3 (as ?tls=1); the target's certificate is checked
    /// against the system's CAs unless --tls-ca or --tls-pin says otherwise.
    #[arg(long)]
    pub tls: bool,
    /// Trust the target's certificate if this CA (PEM file) signed it; implies --tls.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<String>,
    /// Trust exactly the certificate with this SHA-256 fingerprint (as `rsv target` logs
    /// it), whoever signed it and whatever names it carries; implies --tls.
    #[arg(long, value_name = "SHA256")]
    pub tls_pin: Option<String>,
    /// Client certificate (PEM) for targets that require one (mutual TLS), with --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<String>,
    /// The client certificate's private key (PEM, readable by its owner only).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<String>,
    /// The name the target's certificate must carry (default: the URL's host).
    #[arg(long, value_name = "NAME")]
    pub tls_name: Option<String>,
    /// Offer only this TLS 1.3 cipher suite: aes128, aes256 or chacha20 (or its IANA
    /// name, e.g. TLS13_AES_128_GCM_SHA256); default all three, the target choosing.
    #[arg(long, value_name = "SUITE")]
    pub tls_suite: Option<String>,
    /// Extra session options as key=value (same keys as the URL query string).
    #[arg(long = "opt", value_name = "KEY=VALUE")]
    pub opts: Vec<String>,
    /// Another portal of the same target (a gateway exporting the same LUN), repeated
    /// for each; the same as `?portal=HOST:PORT` in the URL. The session logs in to the
    /// one whose ALUA group is active/optimized and moves to another when its gateway
    /// fails: iscsi://gw1/IQN/0?portal=gw2:3260&portal=gw3:3260
    #[arg(long = "portal", value_name = "HOST[:PORT]")]
    pub portals: Vec<String>,
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim_end_matches('s');
    t.parse::<f64>()
        .ok()
        .filter(|x| *x > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{s}: expected seconds like 10 or 2.5s"))
}

impl SessionFlags {
    pub fn options(&self, url: &IscsiUrl) -> initiator::Result<SessionOptions> {
        let mut o = url.options(&SessionOptions::default())?;
        for p in &self.portals {
            o.set("portal", p)?;
        }
        if let Some(n) = self.connections {
            o.connections = n.max(1);
            o.pin("connections");
        }
        if let Some(q) = self.queue_depth {
            o.queue_depth = q.max(1);
            o.pin("queue_depth");
        }
        if let Some(r) = self.pacing_rate {
            o.pacing_rate = Some(r.bytes_per_sec());
            o.pin("pacing_rate");
        }
        if let Some(r) = self.rate {
            o.rate = Some(r.bytes_per_sec());
        }
        if self.no_auto_tune {
            o.auto_tune = false;
        }
        if self.header_digest {
            o.header_digest = true;
        }
        if self.data_digest {
            o.data_digest = true;
        }
        if let Some(n) = &self.initiator_name {
            o.initiator_name = n.clone();
        }
        if self.target_password.is_some() {
            o.target_secret = self.target_password.clone();
        }
        if let Some(erl) = self.erl {
            o.error_recovery_level = erl;
        }
        if self.tls {
            o.tls = true;
        }
        for (key, value) in [
            ("ca", &self.tls_ca),
            ("pin", &self.tls_pin),
            ("cert", &self.tls_cert),
            ("key", &self.tls_key),
            ("tls_name", &self.tls_name),
            ("tls_suite", &self.tls_suite),
        ] {
            if let Some(v) = value {
                o.set(key, v)?;
            }
        }
        for kv in &self.opts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| initiator::Error::Option(format!("{kv}: expected KEY=VALUE")))?;
            o.set(k, v)?;
        }
        Ok(o)
    }
}

/// The `iscsi://` URL a command was given, or for an `isns://SERVER/ALIAS-or-IQN/LUN` one
/// the `iscsi://` URL of that target's first portal, as the iSNS server knows it.
pub async fn target_url(spec: &str, flags: &SessionFlags) -> anyhow::Result<IscsiUrl> {
    if !IsnsUrl::is_isns(spec) {
        return Ok(IscsiUrl::parse(spec)?);
    }
    let u = IsnsUrl::parse(spec)?;
    let name = flags.options(&u.url)?.initiator_name;
    let url = initiator::isns::resolve(&u, &name).await?;
    tracing::info!("{} is {url}", u.shown());
    Ok(url)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
