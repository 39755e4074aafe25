//! The disk server's side: an agent inside `rsv target` that serves the control channel
//! and runs sends. A send reads the local LUN's units straight from its store and writes
//! them to the destination disk server's LUN over iSCSI (the initiator library: many
//! connections, auto-tuning, ERL 2 recovery), paced as the coordinator says; the data never
//! passes through the coordinator or a file server. Every unit's BLAKE3 is taken as it is
//! read; the destination's agent takes its own from its store (`POST /v1/sums`), so the
//! check needs no read-back across the WAN.
//!
//! Durability and resume: every two seconds the send flushes the destination
//! (SYNCHRONIZE CACHE); units acknowledged before a flush that succeeded are durable.
//! The last window of a send (as many units as the session keeps in flight) is written
//! with FUA and the final flush goes out as soon as every other unit is acknowledged, so
//! a send is durable when its last unit is acknowledged, not a round trip or two later.
//! Only durable units are reported as safe to skip on resume (`durable_prefix`) and, with
//! change tracking, cleared from the frozen set ([`ChangeLog::sent`]), so an interrupted
//! sync resumes without resending what arrived, and never skips what did not.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use backstore::buffers::Buf;
use backstore::Backstore;
use bytes::Bytes;
use initiator::{IscsiUrl, Lun, Session, SessionOptions};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::api::{self, JobState, JobStatus, What};
use crate::sparse::{self, Op};
use crate::squeeze::{self, Adaptive};

/// How often a send flushes its destination to make what arrived durable.
const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// Units a send makes zeros with one request, at most (1 GiB in 1 MiB units): the
/// progress of a sparse volume's holes still shows, and a resume loses little.
const MAX_CLEAR: usize = 1024;
/// A send nobody has asked about for this long has lost its coordinator: it stops (what
/// arrived durably is kept; a new `rsv sync` resumes).
const ORPHANED: Duration = Duration::from_secs(60);

/// A LUN's change tracking as a send needs it (the target's `track = true`).
pub trait ChangeLog: Send + Sync {
    /// The tracking unit, bytes.
    fn unit(&self) -> u64;
    /// Starts a new epoch: returns its id and the ranges of units to send (everything
    /// written since the last released epoch, and what an interrupted send left).
    fn freeze(&self) -> io::Result<(u64, Vec<(u64, u64)>)>;
    /// These units of `epoch` are on the destination, durably.
    fn sent(&self, epoch: u64, units: &[u64]) -> io::Result<()>;
    /// The sync of `epoch` is complete and verified.
    fn release(&self, epoch: u64) -> io::Result<()>;
    /// Bytes in units marked written.
    fn dirty_bytes(&self) -> u64;
    /// The units a freeze would return now, without freezing (ranges of indices).
    fn dirty_units(&self) -> Vec<(u64, u64)>;
    /// Forgets every unit marked: the LUN now equals the image the other site holds (a
    /// replica after a completed sync).
    fn forget(&self) -> io::Result<()> {
        let (epoch, _) = self.freeze()?;
        self.release(epoch)
    }
}

/// A LUN of the local target, as the agent reaches it.
#[derive(Clone)]
pub struct LocalLun {
    pub iqn: String,
    pub lun: u16,
    pub store: Arc<dyn Backstore>,
    pub spec: String,
    pub block_size: u32,
    pub changes: Option<Arc<dyn ChangeLog>>,
    /// Where its point-in-time images are taken (the layer the target's writes pass
    /// through) and its write answers held for a cut; absent: the LUN takes no part in
    /// consistency groups.
    pub cut: Option<CutPoint>,
    /// Its replication role's record and fence (`crate::failover`); absent: its store
    /// has no place beside its data, and it takes no role.
    pub role: Option<crate::failover::RolePoint>,
    /// The layer that keeps the LUN whole as a replica (`crate::cycle`); absent: a sync
    /// cut off halfway leaves it holding no single image.
    pub undo: Option<Arc<backstore::Undo>>,
}

/// A LUN's part in a consistency group: its image layer and its hold of write answers.
#[derive(Clone)]
pub struct CutPoint {
    pub imaged: Arc<backstore::Imaged>,
    pub hold: Arc<backstore::Hold>,
}

/// How long a held image lives with no request naming it, unless the cut says.
const IMAGE_LEASE: Duration = Duration::from_secs(60);
/// The longest hold a coordinator may ask for.
const MAX_HOLD: Duration = Duration::from_secs(30);

/// An image held for a cut: what a send of the cut reads.
struct CutImage {
    iqn: String,
    lun: u16,
    image: backstore::Image,
    /// The change-tracking epoch frozen at the cut, and its units.
    frozen: Option<(u64, Vec<(u64, u64)>)>,
    lease: Duration,
    touched: Mutex<Instant>,
}

/// Where a send reads: the live store, or an image.
#[derive(Clone)]
enum Source {
    Live(Arc<dyn Backstore>),
    Image(backstore::Image),
}

impl Source {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Source::Live(s) => s.read_at(buf, offset),
            Source::Image(i) => i.read_at(buf, offset),
        }
    }

    /// What the source holds: the live store's allocation, or what it held at the cut.
    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        match self {
            Source::Live(s) => s.is_allocated(offset, len),
            Source::Image(i) => i.is_allocated(offset, len),
        }
    }
}

/// The LUNs the agent serves, asked at every request: those the target has now, so a
/// configuration reload that removes a LUN takes it from the agent too.
pub type Luns = Box<dyn Fn() -> Vec<LocalLun> + Send + Sync>;

pub struct Agent {
    luns: Luns,
    portals: Vec<String>,
    jobs: Mutex<HashMap<u64, Arc<Job>>>,
    next_job: AtomicU64,
    base: SessionOptions,
    /// Images held for cuts, by cut id.
    images: Mutex<HashMap<u64, Arc<CutImage>>>,
    /// Sessions logged in ahead of their send ([`Agent::connect`]), and how many logins
    /// ahead are under way (each holds a place under [`MAX_PARKED`] while it logs in).
    parked: Mutex<Parking>,
}

/// The sessions logged in ahead, and the logins ahead still under way.
#[derive(Default)]
struct Parking {
    kept: Vec<Parked>,
    logging_in: usize,
}

/// A session logged in ahead of its send (`POST /v1/connect`): its LUN opened, waiting
/// for the send to the same destination with the same session options.
struct Parked {
    dest: String,
    session: Vec<(String, String)>,
    lun: Lun,
    at: Instant,
}

/// How long a session logged in ahead waits for its send: a coordinator sends within a
/// cut and the answers of the far cycle's open, well under this.
const PARKED_FOR: Duration = Duration::from_secs(30);

/// Sessions an agent keeps logged in ahead at once, those still logging in counted: each
/// holds a session (connections, buffers) on both sites for up to [`PARKED_FOR`], so a key
/// holder asking without end would otherwise make the agent hold without bound. A cycle
/// logs in one stream per member the agent serves (a few); 32 leaves room for several
/// coordinators' cycles at once. Beyond it `/v1/connect` is refused (429) and the send
/// logs in itself, as it did before sessions were logged in ahead.
pub const MAX_PARKED: usize = 32;

struct Job {
    id: u64,
    iqn: String,
    lun: u16,
    /// When the coordinator last asked how the send does.
    polled: Mutex<Instant>,
    bytes: u64,
    unit: u64,
    size: u64,
    plan: Vec<u64>,
    /// The plan's steps: runs of units the source does not hold first, then the others.
    ops: Vec<Op>,
    /// Plan positions of units the source does not hold (not in `bytes`).
    holes: Vec<bool>,
    epoch: Option<u64>,
    /// The cut whose image the send reads.
    cut: Option<u64>,
    source: Source,
    started: Instant,
    /// Whether to compress the next unit.
    squeeze: Mutex<Adaptive>,
    /// Cleared when the destination refuses WRITE COMPRESSED (not Reservoir's target).
    may_compress: AtomicBool,
    /// zstd contexts kept for the next unit: a new one per unit allocated its tables and
    /// window afresh (pages faulted in and cleared on every compression).
    /// Each with the level it is set to.
    compressors: Mutex<Vec<(i32, zstd::bulk::Compressor<'static>)>>,
    session: OnceLock<Session>,
    /// The pacing asked for, bytes per second (0: none).
    pacing: AtomicU64,
    cancel: AtomicBool,
    /// Its session was logged in ahead (`POST /v1/connect`).
    connected_ahead: bool,
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    state: Option<JobState>,
    /// When the send ended (done, failed or cancelled), by the agent's clock.
    ended: Option<Instant>,
    /// When its session was logged in and its LUN opened (the data could start).
    logged_in: Option<Instant>,
    /// When the destination acknowledged its first unit.
    first_ack: Option<Instant>,
    error: Option<String>,
    done_bytes: u64,
    durable_bytes: u64,
    done_units: u64,
    durable: Vec<bool>,
    durable_prefix: u64,
    sums: BTreeMap<u64, String>,
    data_bytes: u64,
    wire_bytes: u64,
    zero_bytes: u64,
    compressed_units: u64,
}

type Answer = (u16, Vec<u8>);

fn ok<T: Serialize>(v: &T) -> Answer {
    (200, serde_json::to_vec(v).unwrap_or_default())
}

fn err(status: u16, message: impl std::fmt::Display) -> Answer {
    (status, crate::wire::error_body(&message.to_string()))
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Answer> {
    serde_json::from_slice(body).map_err(|e| err(400, format!("bad request body: {e}")))
}

impl Agent {
    pub fn new(luns: Luns, portals: Vec<String>, base: SessionOptions) -> Agent {
        Agent {
            luns,
            portals,
            jobs: Mutex::new(HashMap::new()),
            next_job: AtomicU64::new(1),
            base,
            images: Mutex::new(HashMap::new()),
            parked: Mutex::default(),
        }
    }

    /// The destination's URL and the options of a send's session to it: the agent's
    /// own, the send's, `join_late`, and no probed start unless asked for.
    fn session_options(
        &self,
        dest: &str,
        session: &[(String, String)],
    ) -> Result<(IscsiUrl, SessionOptions), Answer> {
        let url = IscsiUrl::parse(dest).map_err(|e| err(400, e))?;
        let mut opts = url.options(&self.base).map_err(|e| err(400, e))?;
        // The send starts on the leading connection; the others join a round trip later
        // (350 ms of the start in R2's case), and the pacing is shared among those live.
        opts.join_late = true;
        for (k, v) in session {
            opts.set(k, v)
                .map_err(|e| err(400, format!("session option {k}={v}: {e}")))?;
        }
        // No probed start (`docs/congestion.md`) unless the send, the URL or the agent's
        // own options ask for one: it sends a session's first round at a lone session's
        // share of a fast WAN and starts each connection at the rate its ACKs show, but a
        // sync's streams share one bottleneck and their rate is the coordinator's
        // (`pace`). A stream that logs in while the others still wait for their first
        // ACKs finds the whole path and starts at it: with the probe R2's eight streams
        // were full after 3 s instead of 6-7, and the bottleneck dropped three times the
        // packets (`lab/results/r2-default`). Without it each starts at the unknown
        // path's start and grows; the far target is asked for no probe either (the login
        // key goes only with a probe rate above 0); a stream given a share is paced
        // exactly to it from its first data. Decided here, where every stream's session
        // is made (a send's, one logged in ahead, a resync's), whatever the coordinator.
        if !opts.is_pinned("probe_rate") {
            opts.set("probe_rate", "0")
                .map_err(|e| err(500, format!("probe_rate=0: {e}")))?;
        }
        Ok((url, opts))
    }

    /// `POST /v1/connect`: logs a session in to `dest` and opens its LUN, then keeps it
    /// for the next send there with the same options ([`Agent::take_parked`]). A
    /// coordinator asks it while the far site opens its cycle, before the cut: the
    /// send that follows the cut then writes at once instead of logging in first (a few
    /// round trips over a long path). Answers once logged in.
    async fn connect(self: Arc<Self>, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::ConnectRequest = parse(body)?;
        let (url, opts) = self.session_options(&req.dest, &req.session)?;
        // The place is taken before the login, so that requests at once cannot all pass
        // the check and then all log in.
        let place = self.park_place()?;
        let lun = Lun::open_url(&url, &opts)
            .await
            .map_err(|e| err(502, format!("{}: {e}", req.dest)))?;
        place.keep(Parked {
            dest: req.dest.clone(),
            session: req.session.clone(),
            lun,
            at: Instant::now(),
        });
        // Logged out once too old, whether or not another request comes.
        let agent = Arc::downgrade(&self);
        tokio::spawn(async move {
            tokio::time::sleep(PARKED_FOR + Duration::from_secs(1)).await;
            if let Some(a) = agent.upgrade() {
                a.take_parked("", &[]);
            }
        });
        Ok(ok(&serde_json::json!({ "connected": req.dest })))
    }

    /// A place for one more session logged in ahead, or 429 once [`MAX_PARKED`] are kept
    /// or logging in (those too old are logged out first). The place turns into the session
    /// kept ([`Place::keep`]), or is given back when dropped: a failed login, or the
    /// request dropped while it logs in (its caller's connection closed).
    fn park_place(self: &Arc<Self>) -> Result<Place, Answer> {
        let mut p = self.parked.lock().unwrap();
        let stale = expired(&mut p);
        let held = p.kept.len() + p.logging_in;
        if held >= MAX_PARKED {
            drop(p);
            log_out(stale);
            return Err(err(
                429,
                format!(
                    "{held} sessions are logged in ahead here already ({MAX_PARKED} at most); \
                     the send logs in itself"
                ),
            ));
        }
        p.logging_in += 1;
        drop(p);
        log_out(stale);
        Ok(Place {
            agent: self.clone(),
            kept: false,
        })
    }

    /// The session logged in ahead for a send to `dest` with `session`'s options, if one
    /// waits; those older than [`PARKED_FOR`] are logged out on the way.
    fn take_parked(&self, dest: &str, session: &[(String, String)]) -> Option<Lun> {
        let mut p = self.parked.lock().unwrap();
        let stale = expired(&mut p);
        let found = p
            .kept
            .iter()
            .position(|p| p.dest == dest && p.session == session)
            .map(|i| p.kept.swap_remove(i).lun);
        drop(p);
        log_out(stale);
        found
    }

    fn cut_point(&self, iqn: &str, lun: u16) -> Result<(LocalLun, CutPoint), Answer> {
        let local = self.find(iqn, lun)?;
        let cut = local.cut.clone().ok_or_else(|| {
            err(
                409,
                format!("LUN {lun} of {iqn} takes no images here (no consistency groups)"),
            )
        })?;
        Ok((local, cut))
    }

    fn touch(&self, cut: u64) {
        if let Some(i) = self.images.lock().unwrap().get(&cut) {
            *i.touched.lock().unwrap() = Instant::now();
        }
    }

    /// Drops images whose lease ran out (their coordinator is gone); returns how many.
    fn expire_images(&self) -> usize {
        let mut images = self.images.lock().unwrap();
        let before = images.len();
        images.retain(|cut, i| {
            let live = i.touched.lock().unwrap().elapsed() <= i.lease;
            if !live {
                tracing::warn!(
                    "cut {cut}: the image of LUN {} of {} was not asked about for {:?}; released",
                    i.lun,
                    i.iqn,
                    i.lease
                );
                i.image.release();
            }
            live
        });
        before - images.len()
    }

    /// `POST /v1/cut/hold`: hold the LUN's write answers for cut `cut`, for `hold_ms` at
    /// most (the agent releases it then, whatever the coordinator does).
    fn cut_hold(self: &Arc<Self>, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::CutRequest = parse(body)?;
        let (_, point) = self.cut_point(&req.iqn, req.lun)?;
        let bound = Duration::from_millis(req.hold_ms).min(MAX_HOLD);
        if bound.is_zero() {
            return Err(err(400, "a hold needs its bound (hold_ms)"));
        }
        if !point.hold.start(req.cut) {
            return Err(err(
                409,
                format!(
                    "LUN {} of {} holds for another cut ({:?})",
                    req.lun,
                    req.iqn,
                    point.hold.holding()
                ),
            ));
        }
        let (hold, cut, lun, iqn) = (point.hold.clone(), req.cut, req.lun, req.iqn.clone());
        tokio::spawn(async move {
            tokio::time::sleep(bound).await;
            if let Some(h) = hold.release(cut) {
                tracing::warn!(
                    "cut {cut}: LUN {lun} of {iqn} held {} write answers for {:?}, its bound; released",
                    h.answers,
                    h.held_for
                );
            }
        });
        Ok(ok(&api::CutAnswer {
            cut: req.cut,
            ..Default::default()
        }))
    }

    /// `POST /v1/cut/image`: take the LUN's image for cut `cut`, which must be held here
    /// (a request that comes after the hold's bound is refused: the cut is no more).
    async fn cut_image(self: &Arc<Self>, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::CutRequest = parse(body)?;
        let (local, point) = self.cut_point(&req.iqn, req.lun)?;
        if let Some(i) = self.images.lock().unwrap().get(&req.cut) {
            if i.iqn == req.iqn && i.lun == req.lun {
                *i.touched.lock().unwrap() = Instant::now();
                return Ok(ok(&api::CutAnswer {
                    cut: req.cut,
                    epoch: i.frozen.as_ref().map(|f| f.0),
                    ..Default::default()
                }));
            }
            return Err(err(409, format!("cut {} is another LUN's here", req.cut)));
        }
        if point.hold.holding() != Some(req.cut) {
            return Err(err(
                409,
                format!(
                    "cut {} is not held on LUN {} of {} (too late: its hold ended)",
                    req.cut, req.lun, req.iqn
                ),
            ));
        }
        // An image of an earlier cut of this LUN belongs to a sync that was interrupted
        // (a new one runs, as a new send replaces a running one): it goes.
        let stale: Vec<Arc<CutImage>> = {
            let mut images = self.images.lock().unwrap();
            let old: Vec<u64> = images
                .iter()
                .filter(|(_, i)| i.iqn == req.iqn && i.lun == req.lun)
                .map(|(c, _)| *c)
                .collect();
            old.iter().filter_map(|c| images.remove(c)).collect()
        };
        for i in stale {
            tracing::info!(
                "cut {}: replaces the image of an earlier cut of LUN {} of {}",
                req.cut,
                req.lun,
                req.iqn
            );
            i.image.release();
        }
        let changes = local.changes.clone();
        let imaged = point.imaged.clone();
        let (image, frozen) = tokio::task::spawn_blocking(move || {
            imaged.take_with(|| changes.map(|c| c.freeze()).transpose())
        })
        .await
        .map_err(|e| err(500, e))?
        .map_err(|e| {
            err(
                409,
                format!("taking the image of LUN {} of {}: {e}", req.lun, req.iqn),
            )
        })?;
        let epoch = frozen.as_ref().map(|f| f.0);
        tracing::info!(
            "cut {}: image {} of LUN {} of {} taken{}",
            req.cut,
            image.id(),
            req.lun,
            req.iqn,
            epoch
                .map(|e| format!(", change map frozen as epoch {e}"))
                .unwrap_or_default()
        );
        let lease = match req.lease_ms {
            0 => IMAGE_LEASE,
            ms => Duration::from_millis(ms),
        };
        self.images.lock().unwrap().insert(
            req.cut,
            Arc::new(CutImage {
                iqn: req.iqn.clone(),
                lun: req.lun,
                image,
                frozen,
                lease,
                touched: Mutex::new(Instant::now()),
            }),
        );
        Ok(ok(&api::CutAnswer {
            cut: req.cut,
            epoch,
            ..Default::default()
        }))
    }

    /// `POST /v1/cut/release`: end the hold of cut `cut`; its answers go out.
    fn cut_release(&self, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::CutRequest = parse(body)?;
        let (_, point) = self.cut_point(&req.iqn, req.lun)?;
        let held = point.hold.release(req.cut);
        if let Some(h) = held {
            tracing::info!(
                "cut {}: LUN {} of {} held {} write answers for {:?}",
                req.cut,
                req.lun,
                req.iqn,
                h.answers,
                h.held_for
            );
        }
        Ok(ok(&api::CutAnswer {
            cut: req.cut,
            held_us: held.map(|h| h.held_for.as_micros() as u64),
            answers: held.map(|h| h.answers as u64),
            ..Default::default()
        }))
    }

    /// `POST /v1/cut/drop`: the sync of cut `cut` is over (or the cut aborted): its image
    /// goes, and with it the side store.
    fn cut_drop(&self, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::CutRequest = parse(body)?;
        let mut images = self.images.lock().unwrap();
        if images
            .get(&req.cut)
            .is_some_and(|i| i.iqn == req.iqn && i.lun == req.lun)
        {
            if let Some(i) = images.remove(&req.cut) {
                i.image.release();
                tracing::info!(
                    "cut {}: image of LUN {} of {} dropped ({} bytes were copied aside)",
                    req.cut,
                    req.lun,
                    req.iqn,
                    i.image.status().copied_bytes
                );
            }
        }
        Ok(ok(&api::CutAnswer {
            cut: req.cut,
            ..Default::default()
        }))
    }

    /// `POST /v1/cycle/{state,open,prepare,commit,rollback}`: the far copy kept whole
    /// (`crate::cycle`).
    async fn cycle(&self, what: &str, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::CycleRequest = parse(body)?;
        let local = self.find(&req.iqn, req.lun)?;
        if what == "open" {
            crate::failover::refuse_late_open(&local, req.epoch)?;
        }
        let fence = local.role.as_ref().map(|r| r.cycle.clone());
        crate::cycle::serve(local.undo.clone(), fence, what, req)
            .await
            .map(|a| ok(&a))
            .map_err(|(status, m)| err(status, m))
    }

    pub(crate) fn find(&self, iqn: &str, lun: u16) -> Result<LocalLun, Answer> {
        (self.luns)()
            .into_iter()
            .find(|l| l.iqn == iqn && l.lun == lun)
            .ok_or_else(|| err(404, format!("no LUN {lun} of target {iqn} here")))
    }

    fn job(&self, id: &str) -> Result<Arc<Job>, Answer> {
        let id: u64 = id.parse().map_err(|_| err(404, format!("no job {id}")))?;
        self.jobs
            .lock()
            .unwrap()
            .get(&id)
            .cloned()
            .ok_or_else(|| err(404, format!("no job {id}")))
    }

    /// Answers one authenticated request.
    pub async fn handle(self: Arc<Self>, method: String, path: String, body: Vec<u8>) -> Answer {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        if let Some(a) = crate::failover::serve(&self, &method, &parts, &body).await {
            return a;
        }
        let r = match (method.as_str(), parts.as_slice()) {
            ("GET", ["v1", "luns"]) => Ok(self.luns_info()),
            ("POST", ["v1", "send"]) => self.clone().start_send(&body).await,
            ("GET", ["v1", "jobs", id]) => self.job(id).map(|j| {
                *j.polled.lock().unwrap() = Instant::now();
                if let Some(cut) = j.cut {
                    self.touch(cut);
                }
                ok(&j.status())
            }),
            ("POST", ["v1", "cut", "hold"]) => self.cut_hold(&body),
            ("POST", ["v1", "cut", "image"]) => self.cut_image(&body).await,
            ("POST", ["v1", "cut", "release"]) => self.cut_release(&body),
            ("POST", ["v1", "cut", "drop"]) => self.cut_drop(&body),
            ("POST", ["v1", "cycle", what]) => self.cycle(what, &body).await,
            ("GET", ["v1", "jobs", id, "sums"]) => self.job(id).map(|j| {
                let p = j.progress.lock().unwrap();
                ok(&api::Sums {
                    unit: j.unit,
                    sums: p.sums.iter().map(|(k, v)| (*k, v.clone())).collect(),
                })
            }),
            ("POST", ["v1", "jobs", id, "pace"]) => (|| {
                let job = self.job(id)?;
                let pace: api::Pace = parse(&body)?;
                job.set_pacing(pace.rate);
                Ok(ok(&job.status()))
            })(),
            ("POST", ["v1", "jobs", id, "cancel"]) => self.job(id).map(|j| {
                j.cancel.store(true, Ordering::Relaxed);
                ok(&j.status())
            }),
            ("POST", ["v1", "connect"]) => self.clone().connect(&body).await,
            ("POST", ["v1", "sums"]) => self.sums(&body).await,
            ("POST", ["v1", "release"]) => self.release(&body).await,
            _ => Err(err(404, format!("no such request: {method} {path}"))),
        };
        r.unwrap_or_else(|e| e)
    }

    fn luns_info(&self) -> Answer {
        ok(&api::Luns {
            portals: self.portals.clone(),
            luns: (self.luns)()
                .iter()
                .map(|l| api::LunInfo {
                    iqn: l.iqn.clone(),
                    lun: l.lun,
                    size: l.store.size(),
                    block_size: l.block_size,
                    store: l.spec.clone(),
                    tracking: l.changes.as_ref().map(|c| api::Tracking {
                        unit: c.unit(),
                        dirty_bytes: c.dirty_bytes(),
                    }),
                })
                .collect(),
        })
    }

    async fn start_send(self: Arc<Self>, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::SendRequest = parse(body)?;
        let local = self.find(&req.iqn, req.lun)?;
        let size = local.store.size();
        let (url, opts) = self.session_options(&req.dest, &req.session)?;
        let mut unit = req.unit;
        let image = match req.cut {
            None => None,
            Some(cut) => {
                let found = self.images.lock().unwrap().get(&cut).cloned();
                match found {
                    Some(i) if i.iqn == req.iqn && i.lun == req.lun => {
                        *i.touched.lock().unwrap() = Instant::now();
                        Some(i)
                    }
                    _ => {
                        return Err(err(
                            409,
                            format!(
                                "no image of cut {cut} for LUN {} of {} here",
                                req.lun, req.iqn
                            ),
                        ))
                    }
                }
            }
        };
        let frozen_at_cut = image.as_ref().and_then(|i| i.frozen.clone());
        let (epoch, ranges) = match &req.what {
            What::All => (None, vec![(0, api::unit_count(size, unit))]),
            What::Units(r) => (None, r.clone()),
            What::Changed => {
                let Some(changes) = local.changes.clone() else {
                    return Err(err(
                        409,
                        format!(
                            "LUN {} of {} keeps no change tracking (set `track = true`); send all",
                            req.lun, req.iqn
                        ),
                    ));
                };
                unit = changes.unit();
                // With an image, the units are those frozen at its cut.
                let (epoch, ranges) = match frozen_at_cut {
                    Some(f) => f,
                    None => tokio::task::spawn_blocking(move || changes.freeze())
                        .await
                        .map_err(|e| err(500, e))?
                        .map_err(|e| err(500, format!("freezing the change map: {e}")))?,
                };
                // A failback also sends the destination's own changes since the last
                // image both hold (`crate::failover`).
                (Some(epoch), crate::failover::union(&ranges, &req.also))
            }
        };
        if unit == 0 || !unit.is_multiple_of(u64::from(local.block_size)) {
            return Err(err(
                400,
                format!(
                    "unit {unit} is not a multiple of the block size {}",
                    local.block_size
                ),
            ));
        }
        let count = api::unit_count(size, unit);
        let mut plan = Vec::new();
        for &(a, b) in &ranges {
            if a > b || b > count {
                return Err(err(400, format!("unit range {a}..{b} outside 0..{count}")));
            }
            plan.extend(a..b);
        }
        let skip = (req.skip_units as usize).min(plan.len());
        plan.drain(..skip);
        let source = match &image {
            Some(i) => Source::Image(i.image.clone()),
            None => Source::Live(local.store.clone()),
        };
        let (plan, ops, source) = {
            tokio::task::spawn_blocking(move || {
                // From the image where there is one: a unit discarded since the cut still
                // holds its data there.
                let extents = allocation(&source, &plan, unit, size);
                let ops = sparse::ops(&plan, unit, size, &extents, MAX_CLEAR);
                (plan, ops, source)
            })
            .await
            .map_err(|e| err(500, e))?
        };
        // What goes as data: the units that hold any (a hole costs no wire time).
        let bytes = ops
            .iter()
            .filter_map(|op| match op {
                Op::Data(pos) => {
                    let (s, e) = api::unit_range(plan[*pos], unit, size);
                    Some(e - s)
                }
                Op::Clear { .. } => None,
            })
            .sum();
        self.stop_sends_of(&req.iqn, req.lun).await?;
        // Logged in ahead by `POST /v1/connect`, when one waits: it writes at once.
        let ahead = self.take_parked(&req.dest, &req.session);
        let id = self.next_job.fetch_add(1, Ordering::Relaxed);
        let job = Arc::new(Job {
            id,
            iqn: req.iqn.clone(),
            lun: req.lun,
            polled: Mutex::new(Instant::now()),
            bytes,
            unit,
            size,
            epoch,
            cut: req.cut,
            source,
            started: Instant::now(),
            session: OnceLock::new(),
            holes: {
                let mut h = vec![false; plan.len()];
                for op in &ops {
                    if let Op::Clear { positions } = op {
                        h[positions.clone()].fill(true);
                    }
                }
                h
            },
            squeeze: Mutex::new(Adaptive::new(req.compress, compressors())),
            may_compress: AtomicBool::new(req.compress != squeeze::Mode::Off),
            compressors: Mutex::default(),
            ops,
            pacing: AtomicU64::new(req.pacing.unwrap_or(0)),
            cancel: AtomicBool::new(false),
            connected_ahead: ahead.is_some(),
            progress: Mutex::new(Progress {
                state: Some(JobState::Connecting),
                durable: vec![false; plan.len()],
                ..Progress::default()
            }),
            plan,
        });
        self.jobs.lock().unwrap().insert(id, job.clone());
        let started = api::SendStarted {
            job: id,
            units: job.plan.len() as u64,
            bytes,
            epoch,
        };
        tracing::info!(
            "send {id}: LUN {} of {} to {} ({} units of {unit} bytes, {bytes} bytes)",
            req.lun,
            req.iqn,
            req.dest,
            job.plan.len()
        );
        tokio::spawn(async move {
            let opened = match ahead {
                Some(lun) => Ok(lun),
                None => Lun::open_url(&url, &opts).await,
            };
            let (result, lun) = match opened {
                Ok(lun) => {
                    job.progress.lock().unwrap().logged_in = Some(Instant::now());
                    (pump(&job, &local, &lun).await, Some(lun))
                }
                Err(e) => (Err(e.into()), None),
            };
            job.end(result);
            // The send is over (and said so) once its units are durable; logging out
            // is the session's business, not part of the transfer's time.
            if let Some(lun) = lun {
                let _ = lun.session().logout().await;
            }
        });
        Ok(ok(&started))
    }

    /// A new send of a LUN replaces one still running (its coordinator was interrupted
    /// and the user resumes): the old one is cancelled and waited for, so that the new
    /// one's freeze sees every unit the old one made durable.
    pub(crate) async fn stop_sends_of(&self, iqn: &str, lun: u16) -> Result<(), Answer> {
        let running: Vec<Arc<Job>> = self
            .jobs
            .lock()
            .unwrap()
            .values()
            .filter(|j| j.iqn == iqn && j.lun == lun && !j.is_over())
            .cloned()
            .collect();
        for j in running {
            tracing::info!(
                "send {}: replaced by a new send of the same LUN; stopping it",
                j.id
            );
            j.cancel.store(true, Ordering::Relaxed);
            // Within the coordinator's 30 s wait for an answer, so that it hears why.
            let until = Instant::now() + Duration::from_secs(20);
            while !j.is_over() {
                if Instant::now() > until {
                    return Err(err(409, format!("send {} of this LUN does not stop", j.id)));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    async fn sums(&self, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::SumsRequest = parse(body)?;
        let local = self.find(&req.iqn, req.lun)?;
        if req.unit == 0 {
            return Err(err(400, "unit 0"));
        }
        let store = local.store.clone();
        let answer = tokio::task::spawn_blocking(move || -> io::Result<api::Sums> {
            let size = store.size();
            let count = api::unit_count(size, req.unit);
            let mut out = api::Sums {
                unit: req.unit,
                sums: Vec::new(),
            };
            let mut buf = Vec::new();
            let mut zeros = ZeroSums::default();
            for (a, b) in req.units {
                let b = b.min(count);
                if a >= b {
                    continue;
                }
                // Units the store holds nothing of are zeros: no need to read them. A store
                // that cannot tell is read whole (never a zero sum for data it holds).
                let (from, _) = api::unit_range(a, req.unit, size);
                let (_, to) = api::unit_range(b - 1, req.unit, size);
                let extents = store
                    .is_allocated(from, to - from)
                    .unwrap_or_else(|_| vec![(from, to - from, true)]);
                for i in a..b {
                    let (s, e) = api::unit_range(i, req.unit, size);
                    if !sparse::holds_data(&extents, s, e) {
                        out.sums.push((i, zeros.sum(e - s)));
                        continue;
                    }
                    buf.resize((e - s) as usize, 0);
                    store.read_at(&mut buf, s)?;
                    out.sums.push((i, api::unit_sum(&buf)));
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| err(500, e))?
        .map_err(|e| {
            err(
                500,
                format!("reading LUN {} of {}: {e}", local.lun, local.iqn),
            )
        })?;
        Ok(ok(&answer))
    }

    async fn release(&self, body: &[u8]) -> Result<Answer, Answer> {
        let req: api::Release = parse(body)?;
        let local = self.find(&req.iqn, req.lun)?;
        let Some(changes) = local.changes else {
            return Err(err(409, "this LUN keeps no change tracking"));
        };
        tokio::task::spawn_blocking(move || changes.release(req.epoch))
            .await
            .map_err(|e| err(500, e))?
            .map_err(|e| err(500, format!("releasing epoch {}: {e}", req.epoch)))?;
        Ok(ok(&serde_json::json!({"released": req.epoch})))
    }
}

/// A login ahead's place under [`MAX_PARKED`], held while it logs in.
struct Place {
    agent: Arc<Agent>,
    kept: bool,
}

impl Place {
    /// The login is done: its session takes the place (under the same lock, so the count
    /// never shows the place free in between).
    fn keep(mut self, parked: Parked) {
        let mut p = self.agent.parked.lock().unwrap();
        p.logging_in -= 1;
        p.kept.push(parked);
        self.kept = true;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.kept {
            self.agent.parked.lock().unwrap().logging_in -= 1;
        }
    }
}

/// Sessions kept ahead too long to be taken: out of `p`, to be logged out.
fn expired(p: &mut Parking) -> Vec<Parked> {
    let (stale, kept) = std::mem::take(&mut p.kept)
        .into_iter()
        .partition(|p| p.at.elapsed() > PARKED_FOR);
    p.kept = kept;
    stale
}

/// Logs out sessions kept ahead that no send took, off the caller's way.
fn log_out(stale: Vec<Parked>) {
    for p in stale {
        tracing::debug!(
            "a session logged in ahead to {} was not used; logging out",
            p.dest
        );
        tokio::spawn(async move {
            let _ = p.lun.session().logout().await;
        });
    }
}

impl Job {
    /// `data` as one zstd frame at `level`, in a buffer of the pool (sent as it is, or
    /// dropped back to the pool), by a context kept from an earlier unit.
    fn compress(&self, data: &[u8], level: i32) -> io::Result<Bytes> {
        let kept = {
            let mut kept = self.compressors.lock().unwrap();
            // One set to this level if there is one: a level change makes the context
            // size its tables again on the next frame.
            match kept.iter().rposition(|(l, _)| *l == level) {
                Some(i) => Some(kept.swap_remove(i)),
                None => kept.pop(),
            }
        };
        let mut c = match kept {
            Some((l, c)) if l == level => c,
            Some((_, mut c)) => {
                c.set_compression_level(level)?;
                c
            }
            None => zstd::bulk::Compressor::new(level)?,
        };
        let mut out = Buf::take(zstd::zstd_safe::compress_bound(data.len()));
        let r = c.compress_to_buffer(data, &mut out[..]);
        // A context that failed is dropped: it may hold a half-made frame.
        let n = r?;
        let mut kept = self.compressors.lock().unwrap();
        // At most one context per thread that may compress at once.
        if kept.len() < compressors() {
            kept.push((level, c));
        }
        drop(kept);
        Ok(Bytes::from_owner(out).slice(..n))
    }

    fn is_over(&self) -> bool {
        matches!(
            self.progress.lock().unwrap().state,
            Some(JobState::Done | JobState::Failed | JobState::Cancelled)
        )
    }

    /// Records how the send ended.
    fn end(&self, result: anyhow::Result<()>) {
        let mut p = self.progress.lock().unwrap();
        p.ended = Some(Instant::now());
        match result {
            Ok(()) if self.cancel.load(Ordering::Relaxed) => p.state = Some(JobState::Cancelled),
            Ok(()) => p.state = Some(JobState::Done),
            Err(e) => {
                tracing::warn!("send {}: {e:#}", self.id);
                p.state = Some(JobState::Failed);
                p.error = Some(format!("{e:#}"));
            }
        }
    }

    fn set_pacing(&self, rate: Option<u64>) {
        self.pacing.store(rate.unwrap_or(0), Ordering::Relaxed);
        if let Some(s) = self.session.get() {
            s.set_pacing_rate(rate);
        }
    }

    fn status(&self) -> JobStatus {
        let p = self.progress.lock().unwrap();
        let mut st = JobStatus {
            job: self.id,
            state: p.state.unwrap_or(JobState::Connecting),
            error: p.error.clone(),
            bytes: self.bytes,
            done_bytes: p.done_bytes,
            durable_bytes: p.durable_bytes,
            units: self.plan.len() as u64,
            done_units: p.done_units,
            durable_prefix: p.durable_prefix,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            ended_ms: p
                .ended
                .map(|e| e.saturating_duration_since(self.started).as_millis() as u64),
            login_ms: p
                .logged_in
                .map(|e| e.saturating_duration_since(self.started).as_millis() as u64),
            first_ack_ms: p
                .first_ack
                .map(|e| e.saturating_duration_since(self.started).as_millis() as u64),
            connected_ahead: self.connected_ahead,
            pacing: match self.pacing.load(Ordering::Relaxed) {
                0 => None,
                r => Some(r),
            },
            queue_depth: 0,
            connections: 0,
            min_rtt_ms: 0.0,
            srtt_ms: 0.0,
            retransmits: 0,
            path_rate: 0,
            wire_rate: 0,
            epoch: self.epoch,
            data_bytes: p.data_bytes,
            wire_bytes: p.wire_bytes,
            zero_bytes: p.zero_bytes,
            compressed_units: p.compressed_units,
        };
        drop(p);
        if let Some(s) = self.session.get() {
            let info = s.info();
            st.queue_depth = info.queue_depth;
            st.connections = info.connections;
            if let Some(path) = info.path {
                st.min_rtt_ms = path.min_rtt_ms;
                st.srtt_ms = path.srtt_ms;
                st.retransmits = path.retransmits;
                st.path_rate = path.rate_bytes_per_s;
                st.wire_rate = path.wire_bytes_per_s;
            }
        }
        st
    }

    fn unit_len(&self, i: u64) -> u64 {
        let (s, e) = api::unit_range(i, self.unit, self.size);
        e - s
    }

    /// Plan positions `done` are durable on the destination.
    fn made_durable(&self, done: &[usize]) {
        let mut p = self.progress.lock().unwrap();
        for &pos in done {
            if !p.durable[pos] {
                p.durable[pos] = true;
                if !self.holes[pos] {
                    p.durable_bytes += self.unit_len(self.plan[pos]);
                }
            }
        }
        let mut prefix = p.durable_prefix as usize;
        while prefix < p.durable.len() && p.durable[prefix] {
            prefix += 1;
        }
        p.durable_prefix = prefix as u64;
    }
}

/// The checksum of a unit of zeros, by its length (all units but a LUN's last have one).
#[derive(Default)]
struct ZeroSums(Option<(u64, String)>);

impl ZeroSums {
    fn sum(&mut self, len: u64) -> String {
        match &self.0 {
            Some((l, sum)) if *l == len => sum.clone(),
            _ => {
                let sum = api::unit_sum(&vec![0u8; len as usize]);
                self.0 = Some((len, sum.clone()));
                sum
            }
        }
    }
}

/// The allocation of the units of `plan`, as the store describes it, range by range of
/// consecutive units; a store that cannot tell has everything allocated (all sent).
fn allocation(store: &Source, plan: &[u64], unit: u64, size: u64) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < plan.len() {
        let mut j = i + 1;
        while j < plan.len() && plan[j] == plan[j - 1] + 1 {
            j += 1;
        }
        let (from, _) = api::unit_range(plan[i], unit, size);
        let (_, to) = api::unit_range(plan[j - 1], unit, size);
        match store.is_allocated(from, to - from) {
            Ok(e) => out.extend(e),
            Err(e) => {
                tracing::warn!("the store's allocation at {from}..{to}: {e}; sending it all");
                out.push((from, to - from, true));
            }
        }
        i = j;
    }
    out
}

/// Compressions that may run at once: the cores the agent's process may use.
fn compressors() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How the destination makes a range zeros: UNMAP where its logical unit unmaps to zeros
/// (LBPU and LBPRZ in its Logical Block Provisioning page), else WRITE SAME of zeros.
#[derive(Clone, Copy)]
struct Zeroing {
    unmap: bool,
}

impl Zeroing {
    async fn probe(lun: &Lun) -> Zeroing {
        let page = lun.session().vpd(lun.lun(), 0xb2).await.ok();
        let unmap = page
            .is_some_and(|p| p.len() > 5 && p[1] == 0xb2 && p[5] & 0x80 != 0 && p[5] & 0x07 != 0);
        Zeroing { unmap }
    }

    async fn zero(self, lun: &Lun, offset: u64, len: u64) -> initiator::Result<()> {
        let bs = u64::from(lun.block_size());
        if self.unmap && offset.is_multiple_of(bs) && len.is_multiple_of(bs) {
            lun.unmap(offset, len).await
        } else {
            lun.write_zeroes(offset, len).await
        }
    }
}

/// One step of a send, landed on the destination.
struct Landed {
    positions: Vec<usize>,
    sums: Vec<String>,
    /// Whether it went out as a FUA write (counted so), and whether it is durable now.
    fua: bool,
    durable: bool,
    /// Bytes of the job's `bytes` it covers.
    counted: u64,
    data: u64,
    wire: u64,
    zero: u64,
    compressed: bool,
}

/// What a unit read from the store turned out to be.
enum Unit {
    Zero,
    Plain(Buf),
    Frame(Buf, Bytes),
}

/// Whether the destination refused a command as unknown to it.
fn refused_opcode(e: &initiator::Error) -> bool {
    matches!(e, initiator::Error::Scsi { sense: Some(s), .. } if s.key == 0x05 && s.asc == 0x20)
}

async fn pump(job: &Arc<Job>, local: &LocalLun, lun: &Lun) -> anyhow::Result<()> {
    anyhow::ensure!(
        lun.size() >= job.size,
        "the destination LUN holds {} bytes, less than the {} to send",
        lun.size(),
        job.size
    );
    let session = lun.session().clone();
    let _ = job.session.set(session.clone());
    match job.pacing.load(Ordering::Relaxed) {
        0 => {}
        r => session.set_pacing_rate(Some(r)),
    }
    // Asked once, by the first step that makes zeros (not before the data starts: it
    // costs a round trip).
    let zeroing: Arc<tokio::sync::OnceCell<Zeroing>> = Arc::default();
    {
        let mut p = job.progress.lock().unwrap();
        p.state = Some(JobState::Running);
        p.logged_in.get_or_insert_with(Instant::now);
    }
    let depth = || {
        let per = lun.max_transfer_bytes().clamp(1, job.unit);
        ((session.queue_depth() as u64 * per / job.unit) as usize).max(2)
    };
    let mut next = 0usize;
    let mut inflight: JoinSet<anyhow::Result<Landed>> = JoinSet::new();
    // Acknowledged units written without FUA that no flush has covered yet.
    let mut unflushed: Vec<usize> = Vec::new();
    // Steps without FUA still in flight.
    let mut plain_in_flight = 0usize;
    // Flushes in flight, each with the units it makes durable.
    let mut flushes: JoinSet<(Vec<usize>, initiator::Result<()>)> = JoinSet::new();
    let mut last_flush = Instant::now();
    // Once the last window has begun, every unit with data goes with FUA.
    let mut fua_window = false;
    let changes = local.changes.clone().zip(job.epoch);
    let record = |l: &Landed| {
        let mut p = job.progress.lock().unwrap();
        p.first_ack.get_or_insert_with(Instant::now);
        p.done_bytes += l.counted;
        p.done_units += l.positions.len() as u64;
        p.data_bytes += l.data;
        p.wire_bytes += l.wire;
        p.zero_bytes += l.zero;
        p.compressed_units += u64::from(l.compressed);
        for (&pos, sum) in l.positions.iter().zip(&l.sums) {
            p.sums.insert(job.plan[pos], sum.clone());
        }
    };
    loop {
        if job.polled.lock().unwrap().elapsed() > ORPHANED {
            tracing::warn!(
                "send {}: no word from the coordinator for {ORPHANED:?}; stopping",
                job.id
            );
            job.cancel.store(true, Ordering::Relaxed);
        }
        if job.cancel.load(Ordering::Relaxed) {
            // Let what is in flight land (and become durable below): a resume skips it.
            let mut landed = Vec::new();
            while let Some(r) = inflight.join_next().await {
                if let Ok(Ok(l)) = r {
                    record(&l);
                    if l.durable {
                        landed.extend(l.positions);
                    } else {
                        unflushed.extend(l.positions);
                    }
                }
            }
            durable(job, &changes, &landed).await?;
            break;
        }
        while inflight.len() < depth() && next < job.ops.len() {
            let op = job.ops[next].clone();
            fua_window |= next + depth() >= job.ops.len();
            next += 1;
            let fua = fua_window && matches!(op, Op::Data(_));
            if !fua {
                plain_in_flight += 1;
            }
            let lun = lun.clone();
            let job2 = job.clone();
            let zeroing = zeroing.clone();
            match op {
                Op::Clear { positions } => {
                    let (start, _) = api::unit_range(job.plan[positions.start], job.unit, job.size);
                    let (_, end) = api::unit_range(job.plan[positions.end - 1], job.unit, job.size);
                    inflight.spawn(async move {
                        let z = *zeroing.get_or_init(|| Zeroing::probe(&lun)).await;
                        z.zero(&lun, start, end - start).await?;
                        let mut zeros = ZeroSums::default();
                        let sums = positions
                            .clone()
                            .map(|pos| zeros.sum(job2.unit_len(job2.plan[pos])))
                            .collect();
                        Ok(Landed {
                            positions: positions.collect(),
                            sums,
                            fua: false,
                            durable: false,
                            counted: 0,
                            data: 0,
                            wire: 0,
                            zero: end - start,
                            compressed: false,
                        })
                    });
                }
                Op::Data(pos) => {
                    let (start, end) = api::unit_range(job.plan[pos], job.unit, job.size);
                    let len = end - start;
                    // The zstd level to try this unit at, if any.
                    let try_frame = if job.may_compress.load(Ordering::Relaxed)
                        && lun.compressible(start, len)
                    {
                        job.squeeze.lock().unwrap().next_level()
                    } else {
                        None
                    };
                    let store = job.source.clone();
                    inflight.spawn(async move {
                        let job = job2;
                        let rate = match job.pacing.load(Ordering::Relaxed) {
                            0 => None,
                            r => Some(r),
                        };
                        let j = job.clone();
                        let (unit, sum) =
                            tokio::task::spawn_blocking(move || -> io::Result<(Unit, String)> {
                                // A buffer of the pool, not a new one: a fresh 1 MiB is
                                // pages the kernel faults in and clears on every unit (a
                                // tenth of the source's CPU in R2).
                                let mut buf = Buf::take(len as usize);
                                store.read_at(&mut buf, start)?;
                                let sum = api::unit_sum(&buf);
                                if sparse::is_zero(&buf) {
                                    if try_frame.is_some() {
                                        j.squeeze.lock().unwrap().not_tried();
                                    }
                                    return Ok((Unit::Zero, sum));
                                }
                                let Some(level) = try_frame else {
                                    return Ok((Unit::Plain(buf), sum));
                                };
                                let t = Instant::now();
                                let frame = j.compress(&buf, level)?;
                                let took = t.elapsed();
                                j.squeeze.lock().unwrap().sample_at(
                                    level,
                                    buf.len(),
                                    frame.len(),
                                    took,
                                    rate,
                                );
                                if squeeze::worth_sending(buf.len(), frame.len()) {
                                    Ok((Unit::Frame(buf, frame), sum))
                                } else {
                                    Ok((Unit::Plain(buf), sum))
                                }
                            })
                            .await??;
                        let mut l = Landed {
                            positions: vec![pos],
                            sums: vec![sum],
                            fua,
                            durable: fua,
                            counted: len,
                            data: len,
                            wire: len,
                            zero: 0,
                            compressed: false,
                        };
                        let plain = match unit {
                            Unit::Zero => {
                                let z = *zeroing.get_or_init(|| Zeroing::probe(&lun)).await;
                                z.zero(&lun, start, len).await?;
                                l.durable = false;
                                l.data = 0;
                                l.wire = 0;
                                l.zero = len;
                                return Ok(l);
                            }
                            Unit::Plain(buf) => buf,
                            Unit::Frame(buf, frame) => {
                                let n = frame.len() as u64;
                                match lun.write_compressed(start, len, frame, fua).await {
                                    Ok(()) => {
                                        l.wire = n;
                                        l.compressed = true;
                                        return Ok(l);
                                    }
                                    Err(e) if refused_opcode(&e) => {
                                        if job.may_compress.swap(false, Ordering::Relaxed) {
                                            tracing::info!(
                                                "send {}: the destination takes no compressed writes; sending plainly",
                                                job.id
                                            );
                                        }
                                        buf
                                    }
                                    Err(e) => return Err(e.into()),
                                }
                            }
                        };
                        // The buffer goes back to the pool once the write is done with it.
                        let plain = Bytes::from_owner(plain);
                        if fua {
                            lun.write_fua(start, plain).await?;
                        } else {
                            lun.write_at(start, plain).await?;
                        }
                        Ok(l)
                    });
                }
            }
        }
        if inflight.is_empty() && next >= job.ops.len() {
            break;
        }
        tokio::select! {
            r = inflight.join_next(), if !inflight.is_empty() => {
                let l = r.expect("not empty")??;
                record(&l);
                if !l.fua {
                    plain_in_flight -= 1;
                }
                if l.durable {
                    durable(job, &changes, &l.positions).await?;
                } else {
                    unflushed.extend(l.positions);
                }
            }
            f = flushes.join_next(), if !flushes.is_empty() => {
                let (done, r) = f.expect("not empty")?;
                r?;
                durable(job, &changes, &done).await?;
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        // Every step before the last window acknowledged: flush them at once (beside a
        // periodic flush still out), so that the send is durable when the window lands.
        let last = fua_window && plain_in_flight == 0;
        let due = flushes.is_empty() && last_flush.elapsed() >= FLUSH_EVERY;
        if !unflushed.is_empty() && (last || due) {
            let done = std::mem::take(&mut unflushed);
            let lun = lun.clone();
            last_flush = Instant::now();
            flushes.spawn(async move {
                let r = lun.flush().await;
                (done, r)
            });
        }
    }
    while let Some(f) = flushes.join_next().await {
        let (done, r) = f?;
        r?;
        durable(job, &changes, &done).await?;
    }
    if !unflushed.is_empty() {
        lun.flush().await?;
        durable(job, &changes, &unflushed).await?;
    }
    Ok(())
}

async fn durable(
    job: &Arc<Job>,
    changes: &Option<(Arc<dyn ChangeLog>, u64)>,
    done: &[usize],
) -> anyhow::Result<()> {
    if done.is_empty() {
        return Ok(());
    }
    job.made_durable(done);
    if let Some((changes, epoch)) = changes.clone() {
        let units: Vec<u64> = done.iter().map(|&pos| job.plan[pos]).collect();
        tokio::task::spawn_blocking(move || changes.sent(epoch, &units)).await??;
    }
    Ok(())
}

/// Serves `agent` on `listen` in the background of the current tokio runtime; returns
/// the address bound (port 0 picks one).
pub fn spawn(
    listen: std::net::SocketAddr,
    key: crate::auth::Key,
    agent: Agent,
) -> anyhow::Result<std::net::SocketAddr> {
    let std_listener = std::net::TcpListener::bind(listen)
        .map_err(|e| anyhow::anyhow!("control endpoint {listen}: {e}"))?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let agent = Arc::new(agent);
    // Images whose coordinator is gone are dropped when their lease runs out.
    let weak = Arc::downgrade(&agent);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(agent) = weak.upgrade() else { break };
            agent.expire_images();
        }
    });
    tokio::spawn(crate::wire::serve(listener, key, move |m, p, b| {
        agent.clone().handle(m, p, b)
    }));
    tracing::info!("control endpoint for rsv sync on {addr}");
    Ok(addr)
}

/// The target's change tracking ([`backstore::track`]) as a send uses it.
impl ChangeLog for backstore::track::ChangeMap {
    fn unit(&self) -> u64 {
        backstore::track::ChangeMap::unit(self)
    }

    fn freeze(&self) -> io::Result<(u64, Vec<(u64, u64)>)> {
        let f = backstore::track::ChangeMap::freeze(self)?;
        Ok((f.id(), f.units().iter().map(|r| (r.start, r.end)).collect()))
    }

    fn sent(&self, epoch: u64, units: &[u64]) -> io::Result<()> {
        backstore::track::ChangeMap::sent(self, epoch, units)
    }

    fn release(&self, epoch: u64) -> io::Result<()> {
        backstore::track::ChangeMap::release(self, epoch)
    }

    fn dirty_bytes(&self) -> u64 {
        backstore::track::ChangeMap::dirty_bytes(self)
    }

    fn dirty_units(&self) -> Vec<(u64, u64)> {
        backstore::track::ChangeMap::dirty_units(self)
            .into_iter()
            .map(|r| (r.start, r.end))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> (Arc<Agent>, CutPoint) {
        let store: Arc<dyn Backstore> = Arc::new(backstore::RamBackstore::new(1 << 20));
        let point = CutPoint {
            imaged: Arc::new(
                backstore::Imaged::new(
                    store.clone(),
                    backstore::ImageOptions {
                        side: backstore::SidePlace::Memory,
                        unit: 4096,
                        limit: 1 << 20,
                    },
                )
                .unwrap(),
            ),
            hold: Arc::new(backstore::Hold::default()),
        };
        let lun = LocalLun {
            iqn: "iqn.x".into(),
            lun: 0,
            store,
            spec: "ram:?size=1MiB".into(),
            block_size: 512,
            changes: None,
            cut: Some(point.clone()),
            role: None,
            undo: None,
        };
        let agent = Agent::new(
            Box::new(move || vec![lun.clone()]),
            Vec::new(),
            SessionOptions::default(),
        );
        (Arc::new(agent), point)
    }

    /// The plan a session with `opts` gets on a 350-ms path (R2's), rate unknown, on
    /// `rsv`: what the initiator's auto-tuning decides at login.
    fn planned(opts: &SessionOptions) -> SessionOptions {
        let mut o = opts.clone();
        o.congestion.get_or_insert_with(|| "rsv".into());
        let probe = initiator::tune::Probe {
            rtt_us: 350_000,
            mss: 1448,
            remembered: None,
            congestion_default: None,
        };
        let kernel = net::KernelLimits {
            tcp_wmem_max: 4 << 20,
            tcp_rmem_max: 6 << 20,
            wmem_max: 212_992,
            rmem_max: 212_992,
            can_force: true,
        };
        initiator::tune::plan(&o, &probe, &kernel).0
    }

    #[test]
    fn a_sync_streams_session_starts_without_the_probe() {
        let (agent, _) = agent();
        let dest = "iscsi://192.0.2.1/iqn.x:far/0";
        // A plain session (`rsv cp` to an unknown long path on rsv) probes its start.
        let cp = planned(&SessionOptions::default());
        assert!(cp.start_rate.is_some());
        assert!(cp.probe_rate.is_some_and(|r| r > 0), "{:?}", cp.probe_rate);
        // A stream's session (a send's, or one logged in ahead: both are made here), with
        // what a coordinator sends for a paced sync, a writer's name, or nothing: a
        // start, no probe (so no `X-org.reservoir.ProbeRate` key for the far target).
        for session in [
            vec![],
            vec![("congestion".to_owned(), "rsv,cubic".to_owned())],
            vec![("initiator_name".to_owned(), "iqn.x:writer".to_owned())],
        ] {
            let (_, opts) = agent.session_options(dest, &session).unwrap();
            let o = planned(&opts);
            assert!(o.start_rate.is_some(), "{session:?}");
            assert_eq!(o.probe_rate.filter(|r| *r > 0), None, "{session:?}");
        }
        // Asked for by the send or in the URL, the probe is the user's.
        let by_hand = vec![("probe_rate".to_owned(), "100mbit".to_owned())];
        let (_, opts) = agent.session_options(dest, &by_hand).unwrap();
        assert_eq!(planned(&opts).probe_rate, Some(12_500_000));
        let (_, opts) = agent
            .session_options(&format!("{dest}?probe_rate=200mbit"), &[])
            .unwrap();
        assert_eq!(planned(&opts).probe_rate, Some(25_000_000));
    }

    async fn ask(agent: &Arc<Agent>, what: &str, cut: u64, hold_ms: u64, lease_ms: u64) -> u16 {
        let body = serde_json::to_vec(&api::CutRequest {
            iqn: "iqn.x".into(),
            lun: 0,
            cut,
            hold_ms,
            lease_ms,
        })
        .unwrap();
        agent
            .clone()
            .handle("POST".into(), format!("/v1/cut/{what}"), body)
            .await
            .0
    }

    #[tokio::test]
    async fn a_hold_ends_at_its_bound_and_a_late_image_is_refused() {
        let (agent, point) = agent();
        assert_eq!(
            ask(&agent, "hold", 5, 0, 0).await,
            400,
            "a hold without a bound"
        );
        assert_eq!(ask(&agent, "hold", 5, 50, 0).await, 200);
        assert_eq!(
            ask(&agent, "hold", 5, 50, 0).await,
            200,
            "the same hold twice"
        );
        assert_eq!(
            ask(&agent, "hold", 6, 50, 0).await,
            409,
            "another cut's hold"
        );
        assert_eq!(point.hold.holding(), Some(5));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            point.hold.holding(),
            None,
            "the agent ended the hold at its bound"
        );
        assert_eq!(
            ask(&agent, "image", 5, 0, 0).await,
            409,
            "too late for an image"
        );
        assert!(point.imaged.held().is_none());
    }

    #[tokio::test]
    async fn an_image_goes_when_its_lease_runs_out_or_it_is_dropped() {
        let (agent, point) = agent();
        assert_eq!(ask(&agent, "hold", 9, 5000, 0).await, 200);
        assert_eq!(ask(&agent, "image", 9, 0, 30).await, 200);
        assert_eq!(
            ask(&agent, "image", 9, 0, 30).await,
            200,
            "the same image twice"
        );
        assert_eq!(ask(&agent, "release", 9, 0, 0).await, 200);
        assert!(point.imaged.held().is_some());
        assert_eq!(agent.expire_images(), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(agent.expire_images(), 1, "its lease ran out");
        assert!(point.imaged.held().is_none());

        assert_eq!(ask(&agent, "hold", 11, 5000, 0).await, 200);
        assert_eq!(ask(&agent, "image", 11, 0, 0).await, 200);
        assert_eq!(ask(&agent, "release", 11, 0, 0).await, 200);
        assert_eq!(ask(&agent, "drop", 11, 0, 0).await, 200);
        assert!(point.imaged.held().is_none());
        assert_eq!(ask(&agent, "drop", 11, 0, 0).await, 200, "a late drop");

        // A new cut's image replaces one an interrupted sync left.
        assert_eq!(ask(&agent, "hold", 13, 5000, 0).await, 200);
        assert_eq!(ask(&agent, "image", 13, 0, 0).await, 200);
        assert_eq!(ask(&agent, "release", 13, 0, 0).await, 200);
        assert_eq!(ask(&agent, "hold", 15, 5000, 0).await, 200);
        assert_eq!(ask(&agent, "image", 15, 0, 0).await, 200);
        assert_eq!(ask(&agent, "release", 15, 0, 0).await, 200);
        assert_eq!(agent.images.lock().unwrap().len(), 1);
        assert!(point.imaged.held().is_some());
    }

    /// Places for sessions logged in ahead run out at [`MAX_PARKED`], those still logging
    /// in counted, with 429 and a message that says so; a login that ends (or fails)
    /// gives its place back. Fails without the cap: a key holder's `/v1/connect`s then
    /// make the agent hold sessions without bound.
    #[tokio::test]
    async fn sessions_logged_in_ahead_are_capped() {
        let (agent, _) = agent();
        let places: Vec<Place> = (0..MAX_PARKED)
            .map(|i| {
                agent
                    .park_place()
                    .unwrap_or_else(|e| panic!("place {i} refused: {}", e.0))
            })
            .collect();
        let refused = agent.park_place().err().expect("a place past the cap");
        assert_eq!(refused.0, 429);
        let why = String::from_utf8_lossy(&refused.1);
        assert!(why.contains("logged in ahead"), "{why}");
        // A failed login gives its place back.
        let mut places = places.into_iter();
        drop(places.next());
        let again = agent.park_place().expect("a place given back");
        assert!(agent.park_place().is_err());
        drop(again);
        // Every login over: every place free again (a session kept takes its place in
        // `tests/dr_cycle.rs`, through real logins).
        assert_eq!(agent.parked.lock().unwrap().logging_in, MAX_PARKED - 1);
        drop(places);
        assert_eq!(agent.parked.lock().unwrap().logging_in, 0);
        assert!(agent.park_place().is_ok());
    }

    mod discarded_after_the_cut {
        use super::*;
        use proptest::prelude::*;

        const SIZE: u64 = 2 << 20;
        const UNIT: u64 = 64 << 10;

        /// A change of the source LUN: what UNMAP (`discard`), WRITE SAME of zeros or with
        /// UNMAP (`write_zeroes`, `discard`) and WRITE do to its store.
        #[derive(Clone, Debug)]
        enum Change {
            Discard(u64, u64),
            Zeroes(u64, u64),
            Write(u64, u64, u8),
        }

        fn change() -> impl Strategy<Value = Change> {
            // Whole blocks of 512, up to three send units long, anywhere.
            let range = (0..SIZE / 512, 1..3 * UNIT / 512).prop_map(|(b, n)| {
                let at = b * 512;
                (at, (n * 512).min(SIZE - at))
            });
            prop_oneof![
                3 => range.clone().prop_map(|(a, l)| Change::Discard(a, l)),
                1 => range.clone().prop_map(|(a, l)| Change::Zeroes(a, l)),
                2 => (range, 1..=255u8).prop_map(|((a, l), b)| Change::Write(a, l, b)),
            ]
        }

        fn apply(store: &dyn Backstore, c: &Change) {
            match *c {
                Change::Discard(a, l) => store.discard(a, l).unwrap(),
                Change::Zeroes(a, l) => store.write_zeroes(a, l).unwrap(),
                Change::Write(a, l, b) => store.write_at(&vec![b; l as usize], a).unwrap(),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(24))]
            /// The layers a source LUN has in the target (a file store that punches holes,
            /// the image layer, the undo layer), a cut, then the source's blocks
            /// discarded, zeroed and written before the send plans (its plan asks the
            /// image what it holds) and while it sends: the far copy the plan and the
            /// image's reads make is the LUN at the cut, byte for byte.
            #[test]
            fn a_send_carries_what_was_discarded_after_the_cut(
                before in proptest::collection::vec(change(), 1..24),
                planned in proptest::collection::vec(change(), 0..24),
                sending in proptest::collection::vec(change(), 0..24),
            ) {
                let dir = tempfile::tempdir().unwrap();
                let file: Arc<dyn Backstore> = Arc::new(
                    backstore::FileBackstore::open(dir.path().join("disk.img"), Some(SIZE), true, false)
                        .unwrap(),
                );
                let imaged = Arc::new(
                    backstore::Imaged::new(
                        file,
                        backstore::ImageOptions {
                            side: backstore::SidePlace::File(dir.path().join("disk.img.image")),
                            unit: backstore::image::DEFAULT_UNIT,
                            limit: u64::MAX,
                        },
                    )
                    .unwrap(),
                );
                let lun: Arc<dyn Backstore> = Arc::new(
                    backstore::Undo::open(
                        imaged.clone(),
                        Box::<backstore::undo::MemLog>::default(),
                        backstore::undo::DEFAULT_UNIT,
                    )
                    .unwrap(),
                );
                for c in &before {
                    apply(&*lun, c);
                }
                let image = imaged.take().unwrap();
                let mut at_cut = vec![0u8; SIZE as usize];
                lun.read_at(&mut at_cut, 0).unwrap();
                // Between the cut and the send's plan.
                for c in &planned {
                    apply(&*lun, c);
                }
                let source = Source::Image(image.clone());
                let plan: Vec<u64> = (0..api::unit_count(SIZE, UNIT)).collect();
                let extents = allocation(&source, &plan, UNIT, SIZE);
                let ops = sparse::ops(&plan, UNIT, SIZE, &extents, MAX_CLEAR);
                // The far LUN held older data everywhere.
                let mut far = vec![0xeeu8; SIZE as usize];
                let mut more = sending.iter();
                for op in &ops {
                    // While the send runs, the source changes between its steps.
                    if let Some(c) = more.next() {
                        apply(&*lun, c);
                    }
                    match op {
                        Op::Clear { positions } => {
                            let (s, _) = api::unit_range(plan[positions.start], UNIT, SIZE);
                            let (_, e) = api::unit_range(plan[positions.end - 1], UNIT, SIZE);
                            far[s as usize..e as usize].fill(0);
                        }
                        Op::Data(pos) => {
                            let (s, e) = api::unit_range(plan[*pos], UNIT, SIZE);
                            source.read_at(&mut far[s as usize..e as usize], s).unwrap();
                        }
                    }
                }
                if let Some(at) = far.iter().zip(&at_cut).position(|(a, b)| a != b) {
                    prop_assert!(
                        false,
                        "the far copy differs from the cut at byte {} (unit {}): {:#x} != {:#x}",
                        at, at as u64 / UNIT, far[at], at_cut[at]
                    );
                }
            }
        }
    }
}
