//! A LUN of another iSCSI target (Reservoir, tgt, any RFC 7143 target) as a store: the
//! `iscsi` kind, `iscsi://[user[%password]@]host[:port]/target-iqn/lun?key=value&...`,
//! reached through the initiator library with its connections, auto-tuning and recovery.
//! This is how a Reservoir target becomes a Data Reservoir file server: a stripe whose
//! members are the disk servers' LUNs.
//!
//! The `Backstore` calls are synchronous and come from the target's blocking workers; each
//! runs the initiator's async call to completion on this store's own runtime, so the
//! target's runtime never waits on the remote one. A failed session (its recovery gave up)
//! fails the commands that met it and is replaced on the next command, so the store comes
//! back without a restart when its target does.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backstore::{Backstore, OpenContext, OpenError, Param, Registry, StoreFactory, StoreSpec};
use initiator::{IscsiUrl, Lun, Provisioning, SessionOptions};

/// How long a (re)connection may take before the command waiting for it fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Registers the `iscsi` kind.
pub fn register(registry: &mut Registry) {
    registry.register(RemoteFactory);
}

pub struct RemoteLun {
    url: IscsiUrl,
    opts: SessionOptions,
    /// Where the sessions' tasks run, apart from the target's runtime. Always `Some` but
    /// in `drop`, which shuts it down without waiting (a store may go inside a task).
    rt: Option<tokio::runtime::Runtime>,
    lun: Mutex<Option<Lun>>,
    size: u64,
    block_size: u32,
    read_only: bool,
}

impl std::fmt::Debug for RemoteLun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteLun({})", shown(&self.url))
    }
}

/// The URL without its password.
fn shown(url: &IscsiUrl) -> String {
    let user = url
        .user
        .as_ref()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    format!(
        "iscsi://{user}{}/{}/{}",
        url.portal(),
        url.target.as_deref().unwrap_or(""),
        url.lun.unwrap_or(0)
    )
}

/// Whether the session is beyond its own recovery: what failed was the path or the
/// session, not the command.
fn session_lost(e: &initiator::Error) -> bool {
    use initiator::Error as E;
    matches!(
        e,
        E::Closed | E::ConnectionLost { .. } | E::Unreachable { .. } | E::Timeout(_)
    )
}

fn io_error(e: initiator::Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl RemoteLun {
    /// Logs in to the LUN of `url` (its query string holds session options). Call it off
    /// any async runtime's worker threads, or from a plain thread.
    pub fn open(url: IscsiUrl, opts: SessionOptions, read_only: bool) -> io::Result<RemoteLun> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("rsv-remote")
            .enable_all()
            .build()?;
        let lun = rt.block_on(connect(&url, &opts))?;
        Ok(RemoteLun {
            size: lun.size(),
            block_size: lun.block_size(),
            lun: Mutex::new(Some(lun)),
            url,
            opts,
            rt: Some(rt),
            read_only,
        })
    }

    /// Runs `f` to completion on this store's runtime, from the target's blocking workers
    /// (where every call into a store comes from).
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt
            .as_ref()
            .expect("runtime present until drop")
            .block_on(f)
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Runs `op` on the LUN's session, logging in again first when the last session
    /// failed. A session that fails now is dropped, so the next command starts afresh.
    fn run<T>(&self, op: impl AsyncFnOnce(&Lun) -> initiator::Result<T>) -> io::Result<T> {
        let current = self.lun.lock().unwrap().clone();
        self.block_on(async {
            let lun = match current {
                Some(l) => l,
                None => {
                    let l = connect(&self.url, &self.opts).await?;
                    if l.size() != self.size || l.block_size() != self.block_size {
                        return Err(io::Error::other(format!(
                            "{} came back as {} bytes in blocks of {}, not {} in blocks of {}",
                            shown(&self.url),
                            l.size(),
                            l.block_size(),
                            self.size,
                            self.block_size
                        )));
                    }
                    tracing::info!("{}: logged in again", shown(&self.url));
                    *self.lun.lock().unwrap() = Some(l.clone());
                    l
                }
            };
            match op(&lun).await {
                Ok(v) => Ok(v),
                Err(e) => {
                    if session_lost(&e) {
                        tracing::warn!("{}: {e}; the next command logs in again", shown(&self.url));
                        let mut slot = self.lun.lock().unwrap();
                        // Unless another command has replaced it already.
                        if slot
                            .as_ref()
                            .is_some_and(|l| l.session().same(lun.session()))
                        {
                            *slot = None;
                        }
                    }
                    Err(io_error(e))
                }
            }
        })
    }
}

impl Drop for RemoteLun {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn connect(url: &IscsiUrl, opts: &SessionOptions) -> io::Result<Lun> {
    match tokio::time::timeout(CONNECT_TIMEOUT, Lun::open_url(url, opts)).await {
        Ok(r) => r.map_err(io_error),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{}: no login within {CONNECT_TIMEOUT:?}", shown(url)),
        )),
    }
}

impl Backstore for RemoteLun {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.run(async |lun| lun.read_into(offset, buf).await)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "read-only"));
        }
        self.run(async |lun| lun.write_slice_at(offset, buf).await)
    }

    fn flush(&self) -> io::Result<()> {
        self.run(async |lun| lun.flush().await)
    }

    /// Zeroes: an UNMAP need not make the blocks read as zeros on every target, and a
    /// store's discard must.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.run(async |lun| lun.write_zeroes(offset, len).await)
    }

    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        // A target without GET LBA STATUS has every block mapped.
        let extents = match self.run(async |lun| lun.get_lba_status(offset, len).await) {
            Ok(e) if !e.is_empty() => e,
            _ => return Ok(vec![(offset, len, true)]),
        };
        let mut out: Vec<(u64, u64, bool)> = Vec::new();
        let mut at = offset;
        for e in extents {
            let start = e.offset.max(at);
            let end = (e.offset + e.len).min(offset + len);
            if start > at {
                out.push((at, start - at, true));
            }
            if end > start {
                out.push((start, end - start, e.status == Provisioning::Mapped));
                at = end;
            }
        }
        if at < offset + len {
            out.push((at, offset + len - at, true));
        }
        Ok(out)
    }

    fn supports_discard(&self) -> bool {
        false
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn description(&self) -> String {
        format!(
            "iSCSI LUN {}, {} bytes in blocks of {}",
            shown(&self.url),
            self.size,
            self.block_size
        )
    }
}

/// `iscsi://HOST[:PORT]/IQN/LUN?KEY=VALUE&...`.
struct RemoteFactory;

const PARAMS: &[Param] = &[
    Param {
        name: "path",
        required: true,
        help: "//[user[%password]@]host[:port]/target-iqn/lun, as libiscsi writes it",
    },
    Param {
        name: "connections",
        required: false,
        help: "connections of the session (MC/S)",
    },
    Param {
        name: "queue_depth",
        required: false,
        help: "commands in flight",
    },
    Param {
        name: "erl",
        required: false,
        help: "ErrorRecoveryLevel to propose (2 by default)",
    },
    Param {
        name: "error_recovery_level",
        required: false,
        help: "the same as erl",
    },
    Param {
        name: "header_digest",
        required: false,
        help: "CRC32C header digests: yes/no",
    },
    Param {
        name: "data_digest",
        required: false,
        help: "CRC32C data digests: yes/no",
    },
    Param {
        name: "initiator_name",
        required: false,
        help: "the IQN to log in as",
    },
    Param {
        name: "target_secret",
        required: false,
        help: "mutual CHAP: the target's secret",
    },
    Param {
        name: "max_recv_data_segment",
        required: false,
        help: "a size",
    },
    Param {
        name: "max_burst",
        required: false,
        help: "a size",
    },
    Param {
        name: "first_burst",
        required: false,
        help: "a size",
    },
    Param {
        name: "immediate_data",
        required: false,
        help: "yes/no",
    },
    Param {
        name: "pacing_rate",
        required: false,
        help: "per connection, as 100mbit",
    },
    Param {
        name: "congestion",
        required: false,
        help: "TCP congestion control",
    },
    Param {
        name: "command_timeout",
        required: false,
        help: "seconds",
    },
    Param {
        name: "recovery_timeout",
        required: false,
        help: "seconds a failed session may take to come back",
    },
];

impl RemoteFactory {
    fn url(spec: &StoreSpec) -> Result<(IscsiUrl, SessionOptions), OpenError> {
        let path = spec.require("path")?;
        let query: Vec<String> = spec
            .params()
            .iter()
            .filter(|(k, _)| k.as_str() != "path")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let text = if query.is_empty() {
            format!("iscsi:{path}")
        } else {
            format!("iscsi:{path}?{}", query.join("&"))
        };
        let url = IscsiUrl::parse(&text).map_err(|e| OpenError::invalid(spec, e.to_string()))?;
        url.lun_required()
            .map_err(|e| OpenError::invalid(spec, e.to_string()))?;
        let opts = url
            .options(&SessionOptions::default())
            .map_err(|e| OpenError::invalid(spec, e.to_string()))?;
        Ok((url, opts))
    }
}

impl StoreFactory for RemoteFactory {
    fn kind(&self) -> &str {
        "iscsi"
    }

    fn summary(&self) -> &str {
        "a LUN of another iSCSI target, through Reservoir's initiator (many connections, \
         auto-tuning, ERL 2 recovery); logs in again after a failure"
    }

    fn params(&self) -> &[Param] {
        PARAMS
    }

    fn check(&self, spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let (url, _) = Self::url(spec)?;
        Ok(format!("iSCSI LUN {} (logged in to on start)", shown(&url)))
    }

    /// Logs in (read-only) to ask: `rsv target --check` shows a stripe's capacity over
    /// its disk servers so.
    fn capacity(&self, spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<u64, String> {
        let (url, opts) = Self::url(spec).map_err(|e| e.to_string())?;
        let shown_url = shown(&url);
        std::thread::scope(|s| {
            s.spawn(|| RemoteLun::open(url, opts, true).map(|l| l.size()))
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("login thread panicked")))
        })
        .map_err(|e| format!("{shown_url} not reached: {e}"))
    }

    fn open(
        &self,
        spec: &StoreSpec,
        ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        let (url, opts) = Self::url(spec)?;
        let read_only = ctx.is_read_only();
        // The factory may be called from inside the target's runtime, where a runtime of
        // our own cannot block: log in from a plain thread.
        let store = std::thread::scope(|s| {
            s.spawn(|| RemoteLun::open(url, opts, read_only))
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("login thread panicked")))
        })
        .map_err(|e| OpenError::io(spec, e))?;
        Ok(Arc::new(store))
    }
}
