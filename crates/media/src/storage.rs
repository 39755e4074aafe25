//! The storage the server knows, and sessions to it on demand: found in iSNS (polled) or
//! given as `iscsi://` URLs; a session is logged in on the first request that needs it,
//! the file system on each LUN opened on it, and it is logged out after an idle time with
//! no stream running. The LUN's blocks reach the file system readers through
//! [`LunDevice`], which reads in units with read-ahead ([`crate::readahead`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use initiator::{IscsiUrl, Lun, Session, SessionOptions};
use tokio::runtime::Handle;

use crate::listing::{FileView, StorageView, VolumeView};
use crate::metrics::{LunStats, Stats};
use crate::readahead::{self, Planner};
use crate::volume::{Device, Volume};

/// Where a storage was found, and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub target: String,
    pub alias: Option<String>,
    /// `host:port` of the portal.
    pub portal: String,
    /// Only this LUN (a URL that named one); else every LUN the target reports.
    pub lun: Option<u16>,
    /// `url`, or `isns SERVER`.
    pub found_by: String,
    /// The URL's query (session options) and CHAP user and password.
    pub url: IscsiUrl,
}

impl Source {
    /// The name in URLs: the alias, else the IQN.
    pub fn id(&self) -> String {
        self.alias
            .clone()
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .unwrap_or_else(|| self.target.clone())
    }
}

/// A logged-in session and the volumes found on its LUNs.
struct Open {
    session: Session,
    volumes: Vec<(u16, Result<Volume, String>)>,
}

pub struct Storage {
    pub source: Mutex<Source>,
    open: tokio::sync::Mutex<Option<Open>>,
    /// The last listing of each volume, kept while the storage is known (a listing page
    /// does not log in again for every look).
    files: Mutex<Option<Vec<VolumeView>>>,
    error: Mutex<Option<String>>,
    last_used: Mutex<Instant>,
    /// Requests and streams using the session now.
    active: AtomicUsize,
    opts: SessionOptions,
    readahead: Option<u64>,
    stats: Arc<Stats>,
    /// What each LUN read for answers, for `/metrics` (LUNs read from only).
    luns: Mutex<BTreeMap<u16, Arc<LunStats>>>,
}

/// Holds a storage busy (not to be closed for idleness) while it lives.
pub struct InUse(Arc<Storage>);

impl Drop for InUse {
    fn drop(&mut self) {
        *self.0.last_used.lock().unwrap() = Instant::now();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Storage {
    fn new(
        source: Source,
        opts: SessionOptions,
        readahead: Option<u64>,
        stats: Arc<Stats>,
    ) -> Storage {
        Storage {
            source: Mutex::new(source),
            open: tokio::sync::Mutex::new(None),
            files: Mutex::new(None),
            error: Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
            active: AtomicUsize::new(0),
            opts,
            readahead,
            stats,
            luns: Mutex::new(BTreeMap::new()),
        }
    }

    /// The counts of `lun`'s reads for answers.
    pub fn lun_stat(&self, lun: u16) -> Arc<LunStats> {
        let mut luns = self.luns.lock().unwrap();
        luns.entry(lun).or_default().clone()
    }

    /// Every LUN's counts, by LUN.
    pub fn lun_stats(&self) -> Vec<(u16, Arc<LunStats>)> {
        let luns = self.luns.lock().unwrap();
        luns.iter().map(|(l, s)| (*l, s.clone())).collect()
    }

    pub fn use_(self: &Arc<Self>) -> InUse {
        self.active.fetch_add(1, Ordering::AcqRel);
        *self.last_used.lock().unwrap() = Instant::now();
        InUse(self.clone())
    }

    pub fn is_open(&self) -> bool {
        self.open.try_lock().map_or(true, |o| o.is_some())
    }

    /// The volume on `lun`, logging in first if no session is open.
    pub async fn volume(&self, lun: u16) -> Result<Volume, String> {
        let mut g = self.open.lock().await;
        if g.is_none() {
            *g = Some(self.login().await?);
        }
        let open = g.as_ref().expect("just opened");
        match open.volumes.iter().find(|(l, _)| *l == lun) {
            Some((_, Ok(v))) => Ok(v.clone()),
            Some((_, Err(e))) => Err(format!("LUN {lun}: {e}")),
            None => Err(format!("no LUN {lun}")),
        }
    }

    async fn login(&self) -> Result<Open, String> {
        let src = self.source.lock().unwrap().clone();
        let r = async {
            let mut url = src.url.clone();
            let (host, port) = split_portal(&src.portal)?;
            url.host = host;
            url.port = port;
            url.target = Some(src.target.clone());
            url.lun = None;
            let mut opts = url.options(&self.opts).map_err(|e| e.to_string())?;
            stream_connections(&mut opts);
            let session = Session::connect(&url, &opts)
                .await
                .map_err(|e| e.to_string())?;
            let luns = match src.lun {
                Some(l) => vec![l],
                None => session.report_luns().await.map_err(|e| e.to_string())?,
            };
            let (window, _) = window_for(&session, self.readahead);
            let mut volumes = Vec::new();
            for l in luns {
                let v = volume_on(&session, l, window, &format!("{}/{l}", src.id())).await;
                volumes.push((l, v));
            }
            tracing::info!(
                "logged in to {} at {} ({} LUNs, read-ahead {} KiB)",
                src.target,
                src.portal,
                volumes.len(),
                window >> 10
            );
            Ok::<_, String>(Open { session, volumes })
        }
        .await;
        self.stats.login(r.is_ok());
        *self.error.lock().unwrap() = r.as_ref().err().cloned();
        if r.is_ok() {
            *self.files.lock().unwrap() = None;
        }
        r
    }

    /// Logs out if open. Streams still holding a volume see their reads fail.
    pub async fn close(&self) {
        let open = self.open.lock().await.take();
        if let Some(o) = open {
            drop(o.volumes);
            if let Err(e) = o.session.logout().await {
                tracing::debug!("logout: {e}");
            }
            let t = self.source.lock().unwrap().target.clone();
            tracing::info!("logged out of {t} (idle)");
        }
    }

    /// The storage as the listing shows it; lists the volumes (logging in if need be)
    /// unless a listing is kept, or `refresh`.
    pub async fn view(self: &Arc<Self>, refresh: bool) -> StorageView {
        let src = self.source.lock().unwrap().clone();
        let id = src.id();
        let kept = self.files.lock().unwrap().clone();
        let volumes = match kept {
            Some(v) if !refresh => v,
            _ => {
                let _busy = self.use_();
                match self.list(&id).await {
                    Ok(v) => {
                        *self.files.lock().unwrap() = Some(v.clone());
                        v
                    }
                    Err(e) => {
                        *self.error.lock().unwrap() = Some(e);
                        Vec::new()
                    }
                }
            }
        };
        let error = self.error.lock().unwrap().clone();
        let state = if self.is_open() {
            "open"
        } else if error.is_some() {
            "unreachable"
        } else {
            "closed"
        };
        StorageView {
            id,
            target: src.target,
            alias: src.alias,
            portal: src.portal,
            found_by: src.found_by,
            state: state.to_owned(),
            error,
            volumes,
        }
    }

    async fn list(&self, id: &str) -> Result<Vec<VolumeView>, String> {
        let luns: Vec<(u16, Result<Volume, String>)> = {
            let mut g = self.open.lock().await;
            if g.is_none() {
                *g = Some(self.login().await?);
            }
            g.as_ref().expect("open").volumes.clone()
        };
        let mut out = Vec::new();
        for (lun, v) in luns {
            out.push(match v {
                Ok(v) => match v.list().await {
                    Ok(files) => VolumeView {
                        lun,
                        fs: Some(format!("{:?}", v.kind).to_lowercase()),
                        error: None,
                        files: files
                            .iter()
                            .filter_map(|f| FileView::media(id, lun, &f.path, f.size))
                            .collect(),
                    },
                    Err(e) => VolumeView {
                        lun,
                        fs: Some(format!("{:?}", v.kind).to_lowercase()),
                        error: Some(e.to_string()),
                        files: Vec::new(),
                    },
                },
                Err(e) => VolumeView {
                    lun,
                    fs: None,
                    error: Some(e),
                    files: Vec::new(),
                },
            });
        }
        Ok(out)
    }

    fn idle_for(&self) -> Option<Duration> {
        (self.active.load(Ordering::Acquire) == 0).then(|| self.last_used.lock().unwrap().elapsed())
    }
}

/// Connections of a media session that reads streams.
///
/// A stream is read in order, unit after unit: spread over N connections each paced at
/// 1/N of the rate, a unit takes N times as long to cross its connection, the read-ahead
/// must hold that on top of the round trip, and a unit late on one connection stalls the
/// reader while the others idle. One connection at the whole rate carries each unit in
/// the least time. At 16 ms each way, 100 Mbit/s, a 512 MiB file read in 32 KiB calls:
/// 95.4 % of the link on one connection against 94.5 % on the eight auto-tuning gives a
/// 32 ms path (target on CUBIC), 95.6 against 94.1 (target on `rsv`).
pub const STREAM_CONNECTIONS: u16 = 1;

/// Applies [`STREAM_CONNECTIONS`] to a session's options unless its URL chose the
/// connections, or set the receive buffer: a buffer set by hand (the study's 64 KB
/// window) holds less than a round trip of the path, and auto-tuning's count of
/// connections (each with such a buffer) keeps more in flight.
pub fn stream_connections(opts: &mut SessionOptions) {
    if opts.is_pinned("connections") || opts.is_pinned("recv_buffer") {
        return;
    }
    opts.connections = STREAM_CONNECTIONS;
    opts.pin("connections");
}

/// The read-ahead window for a session's path (`fixed` wins), and the RTT it measured.
fn window_for(session: &Session, fixed: Option<u64>) -> (u64, Option<f64>) {
    let info = session.info();
    let rtt_ms = info.tuning.as_ref().map(|p| p.rtt_ms);
    let w = fixed.unwrap_or_else(|| {
        let (rtt, rate, conns) = info.tuning.as_ref().map_or((0.001, 125_000_000, 1), |p| {
            (p.rtt_ms / 1000.0, p.rate_bytes_per_s, p.connections)
        });
        readahead::window_bytes(Duration::from_secs_f64(rtt.max(0.0)), rate, conns)
    });
    (w, rtt_ms)
}

/// The file system on LUN `l` of `session`, read through a [`LunDevice`].
async fn volume_on(session: &Session, l: u16, window: u64, name: &str) -> Result<Volume, String> {
    volume_with_stats(session, l, window, name)
        .await
        .map(|(v, _)| v)
}

async fn volume_with_stats(
    session: &Session,
    l: u16,
    window: u64,
    name: &str,
) -> Result<(Volume, Arc<DeviceStats>), String> {
    let lun = Lun::open(session.clone(), l)
        .await
        .map_err(|e| e.to_string())?;
    let dev = LunDevice::new(lun, Handle::current(), window);
    let stats = dev.stats();
    let name = name.to_owned();
    let v = tokio::task::spawn_blocking(move || Volume::open(Box::new(dev), &name))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok((v, stats))
}

/// A volume opened by [`open_volume`] for a one-off reader.
pub struct Opened {
    pub volume: Volume,
    /// The read-ahead window, bytes.
    pub window: u64,
    /// The RTT auto-tuning measured.
    pub rtt_ms: Option<f64>,
    pub session: Session,
    /// What the device under the volume did.
    pub stats: Arc<DeviceStats>,
}

/// Logs in to `src` and opens the volume on `lun` (for a one-off reader).
pub async fn open_volume(
    src: &Source,
    lun: u16,
    opts: &SessionOptions,
    readahead: Option<u64>,
) -> Result<Opened, String> {
    let mut url = src.url.clone();
    url.lun = None;
    let mut opts = url.options(opts).map_err(|e| e.to_string())?;
    stream_connections(&mut opts);
    let session = Session::connect(&url, &opts)
        .await
        .map_err(|e| e.to_string())?;
    let (window, rtt_ms) = window_for(&session, readahead);
    let (volume, stats) =
        volume_with_stats(&session, lun, window, &format!("{}/{lun}", src.id())).await?;
    Ok(Opened {
        volume,
        window,
        rtt_ms,
        session,
        stats,
    })
}

fn split_portal(p: &str) -> Result<(String, u16), String> {
    let (h, port) = p
        .rsplit_once(':')
        .ok_or_else(|| format!("portal {p} has no port"))?;
    let port = port.parse().map_err(|_| format!("portal {p}: bad port"))?;
    Ok((
        h.trim_start_matches('[').trim_end_matches(']').to_owned(),
        port,
    ))
}

/// Every storage known, by IQN (lower case).
pub struct Catalog {
    storages: Mutex<BTreeMap<String, Arc<Storage>>>,
    opts: SessionOptions,
    readahead: Option<u64>,
    stats: Arc<Stats>,
}

impl Catalog {
    pub fn new(opts: SessionOptions, readahead: Option<u64>) -> Arc<Catalog> {
        Arc::new(Catalog {
            storages: Mutex::new(BTreeMap::new()),
            opts,
            readahead,
            stats: Arc::default(),
        })
    }

    /// What the server counts (`/metrics`).
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    pub fn all(&self) -> Vec<Arc<Storage>> {
        self.storages.lock().unwrap().values().cloned().collect()
    }

    /// The storage whose id (alias or IQN) is `id`.
    pub fn find(&self, id: &str) -> Option<Arc<Storage>> {
        let all = self.storages.lock().unwrap();
        all.values()
            .find(|s| s.source.lock().unwrap().id() == id)
            .or_else(|| all.get(&id.to_ascii_lowercase()))
            .cloned()
    }

    /// Makes the storage found by `found_by` exactly `now`: new ones added, changed ones
    /// updated (their session closed: the portal moved), gone ones dropped. Storage found
    /// otherwise is left alone.
    pub fn update(&self, found_by: &str, now: Vec<Source>) {
        let mut closing = Vec::new();
        {
            let mut all = self.storages.lock().unwrap();
            let keys: Vec<String> = now.iter().map(|s| s.target.to_ascii_lowercase()).collect();
            all.retain(|k, s| {
                let mine = s.source.lock().unwrap().found_by == found_by;
                let keep = !mine || keys.contains(k);
                if !keep {
                    tracing::info!("storage gone: {k}");
                    closing.push(s.clone());
                }
                keep
            });
            for src in now {
                let k = src.target.to_ascii_lowercase();
                match all.get(&k) {
                    Some(s) => {
                        let mut cur = s.source.lock().unwrap();
                        if cur.found_by == found_by && *cur != src {
                            let moved = cur.portal != src.portal;
                            *cur = src;
                            if moved {
                                closing.push(s.clone());
                            }
                        }
                    }
                    None => {
                        tracing::info!("storage found: {} at {}", src.target, src.portal);
                        all.insert(
                            k,
                            Arc::new(Storage::new(
                                src,
                                self.opts.clone(),
                                self.readahead,
                                self.stats.clone(),
                            )),
                        );
                    }
                }
            }
        }
        for s in closing {
            tokio::spawn(async move { s.close().await });
        }
    }

    /// Logs out of storage idle for `idle`, every second, for ever.
    pub async fn reap(self: Arc<Self>, idle: Duration) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            for s in self.all() {
                if s.is_open() && s.idle_for().is_some_and(|d| d >= idle) {
                    s.close().await;
                }
            }
        }
    }
}

/// The targets an iSNS server knows, as sources.
pub async fn from_isns(server: &str, initiator_name: &str) -> Result<Vec<Source>, String> {
    let u =
        initiator::isns::IsnsUrl::parse(&format!("isns://{server}/")).map_err(|e| e.to_string())?;
    let found = initiator::isns::lookup(&u, initiator_name)
        .await
        .map_err(|e| e.to_string())?;
    Ok(found
        .into_iter()
        .filter_map(|t| {
            let p = t.portals.first()?;
            let portal = p.rsplit_once(',').map_or(p.as_str(), |(a, _)| a).to_owned();
            Some(Source {
                target: t.name.clone(),
                alias: t.alias.clone(),
                portal,
                lun: None,
                found_by: format!("isns {server}"),
                url: IscsiUrl::parse("iscsi://127.0.0.1/").expect("static URL"),
            })
        })
        .collect())
}

/// A storage named by an `iscsi://HOST[:PORT]/IQN[/LUN]` URL.
pub fn from_url(s: &str) -> Result<Source, String> {
    let url = IscsiUrl::parse(s).map_err(|e| e.to_string())?;
    let target = url.target_required().map_err(|e| e.to_string())?.to_owned();
    Ok(Source {
        target,
        alias: None,
        portal: url.portal(),
        lun: url.lun,
        found_by: "url".to_owned(),
        url,
    })
}

// --- the LUN as a device for the file system readers ---------------------------------

enum Slot {
    Ready(Bytes),
    Pending(std_mpsc::Receiver<initiator::Result<Bytes>>),
}

/// What a [`LunDevice`] did: units asked for, and how long its reader waited for them.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Units asked for (needed or read ahead).
    pub units: AtomicU64,
    /// Small reads of their own (a stream's first bytes, metadata).
    pub small_reads: AtomicU64,
    /// Units read-ahead stepped over: they hold no file data (the file system's
    /// metadata and journal, `Device::no_file_data`).
    pub skipped: AtomicU64,
    /// Times a read found a unit it needed still on its way, and waited.
    pub waits: AtomicU64,
    /// Nanoseconds spent in those waits.
    pub wait_ns: AtomicU64,
    /// Summed over the waits: units beyond the awaited one that had already arrived (the
    /// awaited unit late behind later ones: its connection was behind the others).
    pub ready_ahead_at_waits: AtomicU64,
    /// Summed over the waits: units beyond the awaited one still on their way.
    pub pending_ahead_at_waits: AtomicU64,
}

/// A LUN read in units of [`readahead::UNIT`], with the units ahead of a forward read
/// fetched in the background (on the runtime) while the reader uses the ones it has.
/// A read that starts a stream (metadata, a seek's first bytes) is answered by a small
/// read of its own ([`readahead::small_read`]), kept in a side cache of 4 KiB blocks.
/// Runs on a volume's thread: it blocks on the units it needs.
pub struct LunDevice {
    lun: Lun,
    rt: Handle,
    plan: Planner,
    cache: HashMap<u64, Slot>,
    order: VecDeque<u64>,
    /// Small reads, by 4 KiB block.
    small: HashMap<u64, Bytes>,
    small_order: VecDeque<u64>,
    size: u64,
    stats: Arc<DeviceStats>,
}

/// Blocks the side cache keeps (4 MiB).
const SMALL_BLOCKS: usize = 1024;

impl LunDevice {
    pub fn new(lun: Lun, rt: Handle, window: u64) -> LunDevice {
        let size = lun.size();
        LunDevice {
            plan: Planner::new(readahead::UNIT, window, size),
            lun,
            rt,
            cache: HashMap::new(),
            order: VecDeque::new(),
            small: HashMap::new(),
            small_order: VecDeque::new(),
            size,
            stats: Arc::default(),
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> Arc<DeviceStats> {
        self.stats.clone()
    }

    fn start(&mut self, u: u64) {
        if self.cache.contains_key(&u) {
            return;
        }
        let (off, len) = self.plan.extent(u, self.size);
        let (tx, rx) = std_mpsc::sync_channel(1);
        let lun = self.lun.clone();
        self.rt.spawn(async move {
            let _ = tx.send(lun.read_at(off, len).await);
        });
        self.cache.insert(u, Slot::Pending(rx));
        self.stats.units.fetch_add(1, Ordering::Relaxed);
        self.order.push_back(u);
        while self.order.len() > self.plan.cache_units() {
            if let Some(old) = self.order.pop_front() {
                self.cache.remove(&old);
            }
        }
    }

    /// Whether unit `u` has arrived.
    fn ready(&self, u: u64) -> bool {
        matches!(self.cache.get(&u), Some(Slot::Ready(_)))
    }

    /// Copies `[offset, offset + buf.len())` from the side cache if it holds it all.
    fn copy_small(&self, offset: u64, buf: &mut [u8]) -> bool {
        let a = readahead::SMALL_ALIGN;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let Some(b) = self.small.get(&(at / a)) else {
                return false;
            };
            let from = (at % a) as usize;
            if from >= b.len() {
                return false;
            }
            let n = (b.len() - from).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&b[from..from + n]);
            done += n;
        }
        true
    }

    /// One small read (blocking), kept by block.
    fn small_read(&mut self, offset: u64, len: u64) -> io::Result<()> {
        let (start, n) = readahead::small_read(offset, len, self.size);
        self.stats.small_reads.fetch_add(1, Ordering::Relaxed);
        let lun = self.lun.clone();
        let data = self
            .rt
            .block_on(async move { lun.read_at(start, n as usize).await })
            .map_err(io::Error::other)?;
        let a = readahead::SMALL_ALIGN;
        let mut at = 0u64;
        while at < data.len() as u64 {
            let end = (at + a).min(data.len() as u64);
            let k = (start + at) / a;
            if self
                .small
                .insert(k, data.slice(at as usize..end as usize))
                .is_none()
            {
                self.small_order.push_back(k);
            }
            at = end;
        }
        while self.small_order.len() > SMALL_BLOCKS {
            if let Some(old) = self.small_order.pop_front() {
                self.small.remove(&old);
            }
        }
        Ok(())
    }

    /// Takes what has arrived for the pending unit `u`, without blocking.
    fn poll(&mut self, u: u64) {
        let Some(slot) = self.cache.get_mut(&u) else {
            return;
        };
        let Slot::Pending(rx) = slot else {
            return;
        };
        match rx.try_recv() {
            Ok(Ok(b)) => *slot = Slot::Ready(b),
            // An error stays for `unit` to report: kept in a finished channel.
            Ok(Err(e)) => {
                let (tx, rx) = std_mpsc::sync_channel(1);
                let _ = tx.send(Err(e));
                *slot = Slot::Pending(rx);
            }
            Err(_) => {}
        }
    }

    fn unit(&mut self, u: u64) -> io::Result<Bytes> {
        self.start(u);
        self.poll(u);
        if matches!(self.cache.get(&u), Some(Slot::Pending(_))) {
            // The reader waits: note what of the units ahead has arrived meanwhile.
            let ahead: Vec<u64> = self.cache.keys().copied().filter(|k| *k > u).collect();
            let (mut ready, mut pending) = (0u64, 0u64);
            for k in ahead {
                self.poll(k);
                if self.ready(k) {
                    ready += 1;
                } else {
                    pending += 1;
                }
            }
            let st = &self.stats;
            st.waits.fetch_add(1, Ordering::Relaxed);
            st.ready_ahead_at_waits.fetch_add(ready, Ordering::Relaxed);
            st.pending_ahead_at_waits
                .fetch_add(pending, Ordering::Relaxed);
        }
        let slot = self.cache.get_mut(&u).expect("started");
        if let Slot::Pending(rx) = slot {
            tracing::trace!("waiting for unit {u} (offset {})", u * self.plan.unit());
            let t = Instant::now();
            let r = rx
                .recv()
                .map_err(|_| io::Error::other("read abandoned"))
                .and_then(|r| r.map_err(io::Error::other));
            self.stats
                .wait_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match r {
                Ok(b) => *slot = Slot::Ready(b),
                Err(e) => {
                    self.cache.remove(&u);
                    self.order.retain(|x| *x != u);
                    return Err(e);
                }
            }
        }
        match self.cache.get(&u) {
            Some(Slot::Ready(b)) => Ok(b.clone()),
            _ => unreachable!("made ready above"),
        }
    }
}

impl Device for LunDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn no_file_data(&mut self, ranges: &[std::ops::Range<u64>]) {
        self.plan.set_holes(ranges);
    }

    fn read_if_cached(&mut self, offset: u64, buf: &mut [u8]) -> bool {
        if offset.saturating_add(buf.len() as u64) > self.size {
            return false;
        }
        if self.copy_small(offset, buf) {
            return true;
        }
        // From units that have arrived, the planner untouched.
        let unit = self.plan.unit();
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            let u = at / unit;
            self.poll(u);
            let Some(Slot::Ready(data)) = self.cache.get(&u) else {
                return false;
            };
            let from = (at - u * unit) as usize;
            if from >= data.len() {
                return false;
            }
            let n = (data.len() - from).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&data[from..from + n]);
            done += n;
        }
        true
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset.saturating_add(buf.len() as u64) > self.size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the LUN",
            ));
        }
        let plan = self.plan.access(offset, buf.len() as u64);
        if plan.ahead.is_empty() && self.copy_small(offset, buf) {
            // Metadata read again, or a stream's first bytes: no unit for it.
            return Ok(());
        }
        let all_ready = plan.need.clone().all(|u| self.ready(u));
        if !all_ready && plan.new_stream && buf.len() as u64 <= readahead::UNIT / 4 {
            // A stream's first read: just these bytes, not whole units.
            if !self.copy_small(offset, buf) {
                self.small_read(offset, buf.len() as u64)?;
                if !self.copy_small(offset, buf) {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
                }
            }
            return Ok(());
        }
        // What is needed goes out first, then what is read ahead: a demand read never
        // queues behind the read-ahead it starts.
        for u in plan.need.clone() {
            self.start(u);
        }
        for u in plan.ahead.clone() {
            if self.plan.is_hole(u) {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            } else {
                self.start(u);
            }
        }
        if !all_ready && self.copy_small(offset, buf) {
            // Going on from a small read: its bytes, while the units come.
            return Ok(());
        }
        let unit = self.plan.unit();
        let mut done = 0usize;
        for u in plan.need {
            let data = self.unit(u)?;
            let ustart = u * unit;
            let from = (offset + done as u64 - ustart) as usize;
            let n = (data.len() - from).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&data[from..from + n]);
            done += n;
        }
        if done != buf.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        Ok(())
    }
}
