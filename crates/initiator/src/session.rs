//! Sessions: login of all connections, command scheduling over them, the reader task
//! that routes target PDUs, keep-alive, task management, recovery and logout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use iscsi::ffp::{self, logout, tmf};
use iscsi::framing::{PduDecoder, PeekedHeader};
use iscsi::login::{ChapCredentials, InitiatorLoginConfig, SessionType};
use iscsi::negotiate::{ConnectionParams, SessionParams, TargetPacing, PACING_RATE_KEY};
use iscsi::pdu::{
    lun_to_wire, DataOut, LogoutRequest, NopOut, Opcode, Pdu, ScsiCommand, TaskMgmtRequest,
    TextRequest, BHS_LEN, RESERVED_TAG,
};
use iscsi::serial::{sn_gt, sn_le, sn_lt};
use serde::Serialize;
use tokio::sync::{watch, Notify, Semaphore};

use crate::conn::{Conn, LoginDone, RawConn, Reader};
use crate::inbox;
use crate::scsi::{self, Capacity, Inquiry, Sense};
use crate::tune::RateControl;
use crate::{Error, IscsiUrl, Result, SessionOptions};

/// Direction and size of a command's data.
#[derive(Clone, Debug)]
pub enum DataDir {
    None,
    /// Expected length of the data to read.
    Read(u32),
    Write(Bytes),
}

/// What a SCSI command returned.
#[derive(Clone, Debug)]
pub struct ScsiResult {
    pub status: u8,
    pub sense: Option<Sense>,
    pub data: Bytes,
    /// Bytes the target transferred less than expected (underflow).
    pub residual: u32,
}

impl ScsiResult {
    pub fn is_good(&self) -> bool {
        self.status == scsi::STATUS_GOOD
    }
}

/// Negotiated values and identity of a session, for people and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct SessionInfo {
    pub target: String,
    pub portal: String,
    pub isid: String,
    pub tsih: u16,
    pub connections: usize,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_recv_data_segment_length: u32,
    pub max_send_data_segment_length: u32,
    pub header_digest: bool,
    pub data_digest: bool,
    pub error_recovery_level: u8,
    pub queue_depth: usize,
    pub congestion: Option<String>,
    pub send_buffer: usize,
    pub recv_buffer: usize,
    /// What auto-tuning measured and chose (absent when it was off).
    pub tuning: Option<crate::tune::Plan>,
    /// The path as the connections measured it last (TCP_INFO).
    pub path: Option<PathReport>,
    /// Whether the target paces its sends to us, as each connection last answered
    /// (at login, or to a hint of the rate control since).
    pub target_pacing: crate::tune::TargetPacingReport,
    /// The bottleneck found and the pacing chosen without a given rate (absent unless the
    /// rate control runs: `rate_control=yes`, auto-tuning on, no rate or pacing given).
    pub rate_control: Option<crate::tune::RateControlReport>,
}

/// The session's connections' latest TCP_INFO, summed up.
#[derive(Clone, Debug, Serialize, Default)]
pub struct PathReport {
    pub min_rtt_ms: f64,
    pub srtt_ms: f64,
    /// Bytes per second over all connections in the last sample.
    pub rate_bytes_per_s: u64,
    pub retransmits: u64,
    pub connections_sampled: usize,
}

pub(crate) fn new_isid() -> [u8; 6] {
    let r: [u8; 4] = rand::random();
    // Type 0x80: random format (RFC 7143 11.12.5).
    [0x80, r[0], r[1], r[2], 0, r[3] | 1]
}

pub(crate) fn chap(url: &IscsiUrl, opts: &SessionOptions) -> Option<ChapCredentials> {
    let user = url.user.clone()?;
    Some(ChapCredentials {
        user,
        secret: url.password.clone().unwrap_or_default().into_bytes(),
        mutual: opts.target_secret.clone().map(String::into_bytes),
    })
}

pub(crate) fn connection_prefs(opts: &SessionOptions) -> ConnectionParams {
    ConnectionParams {
        header_digest: opts.header_digest,
        data_digest: opts.data_digest,
        max_recv_data_segment_length: opts.max_recv_data_segment,
        ..ConnectionParams::default()
    }
}

/// A PDU for a task, with the connection it came on.
struct Routed {
    pdu: Pdu,
    via: Arc<Conn>,
    /// Bytes of a Data-In's segment its reader put straight into the task's [`ReadSink`]
    /// at the PDU's buffer offset (the PDU itself then carries no data); 0 otherwise.
    placed: usize,
}

/// Data-In segments at least this large that arrive in order go from the socket straight
/// into their read's buffer rather than through the connection's buffer and a copy when
/// the read completes.
const PLACE_MIN: usize = 32 * 1024;

/// The buffer of one read that its connection's reader fills straight from the socket
/// with the Data-In segments that arrive in order (see [`PLACE_MIN`]).
struct ReadSink {
    /// The read's expected length: the buffer's capacity.
    edtl: usize,
    /// The data placed so far, from offset 0. The reader takes it out while it reads
    /// into it (`None` meanwhile) and puts it back before it tells the task.
    buf: Mutex<Option<Vec<u8>>>,
    /// Where the buffer comes from and goes back to once the caller drops the data.
    pool: Arc<BufPool>,
}

/// Read buffers used before, kept for the next reads: a fresh one costs a page fault and
/// a zeroed page per 4 KiB as the socket's data is copied into it.
#[derive(Default)]
struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufPool {
    /// Bytes of idle buffers kept at most.
    const MAX_IDLE: usize = 64 << 20;

    /// An empty buffer of at least `cap` bytes' capacity (and not wastefully more): the
    /// one given back last, whose memory is likeliest still in the CPU's caches.
    fn take(&self, cap: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap();
        match free
            .iter()
            .rposition(|v| v.capacity() >= cap && v.capacity() / 2 <= cap)
        {
            Some(i) => free.remove(i),
            None => {
                drop(free);
                Vec::with_capacity(cap)
            }
        }
    }

    fn put(&self, mut v: Vec<u8>) {
        v.clear();
        let mut free = self.free.lock().unwrap();
        let idle: usize = free.iter().map(Vec::capacity).sum();
        if idle + v.capacity() <= Self::MAX_IDLE {
            free.push(v);
        }
    }

    /// `v` as the caller's data; the buffer comes back here when the last `Bytes` of it
    /// is dropped.
    fn wrap(self: &Arc<Self>, v: Vec<u8>) -> Bytes {
        struct Pooled(Vec<u8>, std::sync::Weak<BufPool>);
        impl AsRef<[u8]> for Pooled {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Pooled {
            fn drop(&mut self) {
                if let Some(pool) = self.1.upgrade() {
                    pool.put(std::mem::take(&mut self.0));
                }
            }
        }
        Bytes::from_owner(Pooled(v, Arc::downgrade(self)))
    }
}

struct Task {
    /// Unique in the session's life: an ITT is used again once its task is gone.
    id: u64,
    /// [`Conn::serial`] of the connection the task is allegiant to.
    serial: u64,
    tx: inbox::Sender<Routed>,
    /// SCSI commands only: what TASK REASSIGN needs to move it to another connection.
    command: Option<Reassignable>,
    /// Large reads only: where their reader places Data-In segments.
    sink: Option<Arc<ReadSink>>,
}

struct Reassignable {
    lun: u16,
    cmdsn: u32,
    /// The next Data-In DataSN the command waits for: TASK REASSIGN's ExpDataSN.
    exp_datasn: Arc<AtomicU32>,
}

/// Progress of the recovery of one lost connection, as the commands it carried see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// The Logout of the lost CID is under way on another connection.
    Pending,
    /// The target dropped the connection and everything queued on it; its ExpCmdSN then
    /// tells which of the lost commands it had received.
    LoggedOut { expcmdsn: u32 },
    /// No other connection could log it out: only session recovery is left.
    Failed,
}

struct State {
    gen: u64,
    cmdsn: u32,
    expcmdsn: u32,
    maxcmdsn: u32,
    next_itt: u32,
    next_task_id: u64,
    tasks: HashMap<u32, Task>,
    conns: Vec<Arc<Conn>>,
    /// Connections being recovered, by [`Conn::serial`].
    losses: HashMap<u64, watch::Receiver<Loss>>,
    tsih: u16,
    params: SessionParams,
    info: Option<SessionInfo>,
    closed: bool,
}

impl State {
    fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG && !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }

    /// A lost connection is being brought back (ERL 2): commands wait for it rather than
    /// have the session reinstated.
    fn recovering(&self) -> bool {
        self.params.error_recovery_level >= 2
            && self.losses.values().any(|l| *l.borrow() == Loss::Pending)
    }

    fn new_task(
        &mut self,
        conn: &Conn,
        command: Option<Reassignable>,
        sink: Option<Arc<ReadSink>>,
    ) -> (u32, u64, inbox::Receiver<Routed>) {
        let (tx, rx) = inbox::inbox();
        let itt = self.alloc_itt();
        self.next_task_id += 1;
        let id = self.next_task_id;
        self.tasks.insert(
            itt,
            Task {
                id,
                serial: conn.serial,
                tx,
                command,
                sink,
            },
        );
        (itt, id, rx)
    }

    fn pick_conn(&self) -> Option<Arc<Conn>> {
        self.conns
            .iter()
            .filter(|c| c.is_alive())
            .min_by_key(|c| c.outstanding.load(Ordering::Relaxed))
            .cloned()
    }
}

struct Shared {
    url: IscsiUrl,
    target: String,
    opts: SessionOptions,
    isid: [u8; 6],
    state: Mutex<State>,
    window: Notify,
    slots: Semaphore,
    recovery: tokio::sync::Mutex<()>,
    capacity: Mutex<HashMap<u16, Capacity>>,
    retries: AtomicU64,
    reinstatements: AtomicU64,
    reassigned: AtomicU64,
    reconnections: AtomicU64,
    epoch: Instant,
    /// Commands allowed in flight now: the slots' total, grown or cut back by auto-tuning.
    queue_depth: std::sync::atomic::AtomicUsize,
    /// Slots still to be taken away after a cut: commands in flight when the queue was cut
    /// keep theirs until they finish, and it is forgotten then ([`Slot`]).
    slot_debt: std::sync::atomic::AtomicUsize,
    /// The session's peak delivery rate while busy, for cutting a long path's queue back.
    peak: Mutex<crate::tune::PeakRate>,
    plan: Option<crate::tune::Plan>,
    bufs: Arc<BufPool>,
    /// Finds the bottleneck and paces the session to it, when asked (`rate_control=yes`)
    /// and no rate was given (see [`crate::tune::RateControl`]).
    rate: Option<Mutex<RateControl>>,
    /// The session's total pacing rate from `rate`, bytes per second (0: none yet).
    pace_total: AtomicU64,
    /// How often the readers sample TCP_INFO, microseconds.
    sample_every_us: AtomicU64,
    /// The least time the connections' rates are measured over, microseconds.
    span_us: AtomicU64,
}

/// A command's place in the session's queue: given back when the command is done, or
/// forgotten if the queue was cut back meanwhile.
struct Slot<'a> {
    shared: &'a Shared,
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            if self.shared.take_debt(1) == 1 {
                p.forget();
            }
        }
    }
}

/// An iSCSI session with one or more connections. Cheap to clone; all clones share the
/// session. Commands may be issued concurrently from many tasks.
///
/// When the target grants ErrorRecoveryLevel 2, a failed connection is recovered by
/// task reassignment (RFC 7143 6.2.2): a surviving connection logs the lost CID out with
/// reason "remove the connection for recovery" (with none left, the CID logs in again
/// with the session's TSIH, which does the same implicitly), then each command the lost
/// connection carried is moved with TASK REASSIGN to a live connection, where the target
/// carries it on: R2Ts for the data it still lacks, Data-In from the first one we lack
/// (ExpDataSN), the status. The commands wait meanwhile; they are not issued again. One
/// the target does not know (it never arrived) is sent again as below.
///
/// At ErrorRecoveryLevel 0 or 1 (the target recovers nothing itself; SNACK is not used
/// here) the recovery is by reissue. When one of several connections fails, a surviving
/// one logs the lost CID out (the target then drops what it still held of it, and its
/// ExpCmdSN tells which of the lost commands it had received). Those it never received
/// are sent again with their own CmdSN, which plugs the hole that would otherwise stall
/// the session's command order; those it had are issued as new commands (new ITT and
/// CmdSN, RFC 7143 allows that on any connection). Meanwhile the CID logs in again with
/// the session's TSIH. Only when no connection is left is the session reinstated (same
/// ISID, TSIH 0, so the target closes the old one) and every command without status
/// issued anew. Reads and writes are idempotent, so a copy ends the same as without the
/// failure.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

enum Attempt {
    /// The connection went away: reinstate the session (if nobody did yet) and retry.
    Lost {
        gen: u64,
        why: String,
        /// The command was sent on this connection (serial, CmdSN): it may be recovered
        /// on the others while the session goes on.
        sent: Option<(u64, u32)>,
    },
    /// The command was aborted after a timeout; retry without recovery.
    Aborted,
    Fatal(Error),
}

/// Removes a task from the table and its weight from the connection when the command
/// ends, however it ends.
struct TaskGuard<'a> {
    shared: &'a Shared,
    itt: u32,
    id: u64,
    conn: Arc<Conn>,
    weight: u64,
}

impl TaskGuard<'_> {
    /// The task goes on on `to` (reassigned): its weight moves there.
    fn move_to(&mut self, to: &Arc<Conn>) {
        self.conn
            .outstanding
            .fetch_sub(self.weight, Ordering::Relaxed);
        to.outstanding.fetch_add(self.weight, Ordering::Relaxed);
        self.conn = to.clone();
    }
}

impl Drop for TaskGuard<'_> {
    fn drop(&mut self) {
        self.conn
            .outstanding
            .fetch_sub(self.weight, Ordering::Relaxed);
        let mut st = self.shared.state.lock().unwrap();
        if st.tasks.get(&self.itt).is_some_and(|t| t.id == self.id) {
            st.tasks.remove(&self.itt);
        }
    }
}

const MAX_ATTEMPTS: u32 = 20;

impl Session {
    /// Logs in to the target of `url` with `opts` (query-string options of the URL already
    /// applied by the caller, see [`IscsiUrl::options`]) and opens all connections.
    pub async fn connect(url: &IscsiUrl, opts: &SessionOptions) -> Result<Session> {
        let target = url.target_required()?.to_owned();
        let (opts, plan) = if opts.auto_tune {
            let probe = crate::tune::probe(&url.portal(), opts.dialer.as_ref()).await?;
            let (o, p) = crate::tune::plan(opts, &probe, &net::KernelLimits::read());
            for r in &p.reasons {
                tracing::info!("auto-tuning: {r}");
            }
            (o, Some(p))
        } else {
            (opts.clone(), None)
        };
        let opts = &opts;
        let rate_control = plan.as_ref().is_some_and(|p| p.rate_control);
        let shared = Arc::new(Shared {
            url: url.clone(),
            target,
            opts: opts.clone(),
            isid: new_isid(),
            state: Mutex::new(State {
                gen: 0,
                cmdsn: 1,
                expcmdsn: 1,
                maxcmdsn: 1,
                next_itt: 0x100,
                next_task_id: 0,
                tasks: HashMap::new(),
                conns: Vec::new(),
                losses: HashMap::new(),
                tsih: 0,
                params: SessionParams::default(),
                info: None,
                closed: false,
            }),
            window: Notify::new(),
            slots: Semaphore::new(opts.queue_depth.max(1)),
            recovery: tokio::sync::Mutex::new(()),
            capacity: Mutex::new(HashMap::new()),
            retries: AtomicU64::new(0),
            reinstatements: AtomicU64::new(0),
            reassigned: AtomicU64::new(0),
            reconnections: AtomicU64::new(0),
            epoch: Instant::now(),
            queue_depth: opts.queue_depth.max(1).into(),
            slot_debt: 0.into(),
            peak: Mutex::default(),
            plan,
            bufs: Arc::default(),
            rate: rate_control.then(|| Mutex::new(RateControl::default())),
            pace_total: AtomicU64::new(0),
            sample_every_us: AtomicU64::new(PATH_SAMPLE_INTERVAL.as_micros() as u64),
            span_us: AtomicU64::new(RateControl::span(Duration::ZERO).as_micros() as u64),
        });
        Shared::establish(&shared).await?;
        tokio::spawn(keepalive(Arc::downgrade(&shared)));
        Ok(Session { shared })
    }

    pub fn info(&self) -> SessionInfo {
        let st = self.shared.state.lock().unwrap();
        let mut info = st.info.clone().expect("established session has info");
        info.connections = st.conns.iter().filter(|c| c.is_alive()).count();
        info.queue_depth = self.queue_depth();
        info.tuning = self.shared.plan.clone();
        info.path = Shared::path(&st.conns);
        let live = st.conns.iter().filter(|c| c.is_alive()).count().max(1) as u64;
        let hinted = match self.shared.pace_total.load(Ordering::Relaxed) {
            0 => None,
            _ if !self.shared.opts.pacing_hint => None,
            total => Some(total / live),
        };
        info.target_pacing = crate::tune::TargetPacingReport::new(
            self.shared.opts.target_pacing_hint().or(hinted),
            st.conns
                .iter()
                .filter(|c| c.is_alive())
                .map(|c| (c.cid, c.target_pacing_now())),
        );
        info.rate_control = self
            .shared
            .rate
            .as_ref()
            .map(|r| r.lock().unwrap().report());
        info
    }

    /// Commands the session lets in flight now (auto-tuning may grow it while it runs).
    pub fn queue_depth(&self) -> usize {
        self.shared.queue_depth.load(Ordering::Relaxed)
    }

    /// Commands issued again after a connection failure or a timeout.
    pub fn retries(&self) -> u64 {
        self.shared.retries.load(Ordering::Relaxed)
    }

    /// Times the session was reinstated after a failure.
    pub fn reinstatements(&self) -> u64 {
        self.shared.reinstatements.load(Ordering::Relaxed)
    }

    /// Commands moved to another connection by TASK REASSIGN (ERL 2) and carried on there.
    pub fn reassigned_tasks(&self) -> u64 {
        self.shared.reassigned.load(Ordering::Relaxed)
    }

    /// Connections of the session logged in again after a failure (the session itself
    /// went on).
    pub fn reconnections(&self) -> u64 {
        self.shared.reconnections.load(Ordering::Relaxed)
    }

    /// Issues one SCSI command and waits for its status. Retries transparently on
    /// connection loss (after recovery), on UNIT ATTENTION and on BUSY/TASK SET FULL.
    /// A status other than GOOD is returned as a result, not an error.
    pub async fn command(&self, lun: u16, cdb: &[u8], dir: DataDir) -> Result<ScsiResult> {
        let _slot = Slot {
            shared: &self.shared,
            permit: Some(
                self.shared
                    .slots
                    .acquire()
                    .await
                    .map_err(|_| Error::Closed)?,
            ),
        };
        let mut attempts = 0;
        let mut unit_attentions = 0;
        let mut plug = None;
        loop {
            match self.shared.attempt(lun, cdb, &dir, plug.take()).await {
                Ok(r) => {
                    let ua = r.status == scsi::STATUS_CHECK_CONDITION
                        && r.sense
                            .as_ref()
                            .is_some_and(|s| s.key == scsi::SENSE_UNIT_ATTENTION);
                    let busy =
                        r.status == scsi::STATUS_BUSY || r.status == scsi::STATUS_TASK_SET_FULL;
                    if (ua || busy) && unit_attentions < 10 {
                        unit_attentions += 1;
                        if busy {
                            tokio::time::sleep(Duration::from_millis(5 << unit_attentions.min(6)))
                                .await;
                        }
                        continue;
                    }
                    return Ok(r);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Aborted) => {}
                Err(Attempt::Lost { gen, why, sent }) => {
                    match self.shared.after_conn_loss(sent).await {
                        Some(p) => plug = p,
                        None => self.shared.recover(gen, &why).await?,
                    }
                }
            }
            attempts += 1;
            self.shared.retries.fetch_add(1, Ordering::Relaxed);
            if attempts >= MAX_ATTEMPTS {
                return Err(Error::RecoveryFailed {
                    attempts,
                    last: "command kept failing".into(),
                });
            }
        }
    }

    /// Like [`Session::command`] but a status other than GOOD is an error.
    pub async fn command_ok(&self, lun: u16, cdb: &[u8], dir: DataDir) -> Result<ScsiResult> {
        let r = self.command(lun, cdb, dir).await?;
        if r.is_good() {
            return Ok(r);
        }
        if r.sense.as_ref().is_some_and(Sense::is_lun_not_supported) {
            return Err(Error::LunNotFound {
                target: self.shared.target.clone(),
                lun,
            });
        }
        Err(Error::Scsi {
            opcode: cdb[0],
            status: r.status,
            sense: r.sense,
        })
    }

    pub async fn test_unit_ready(&self, lun: u16) -> Result<()> {
        self.command_ok(lun, &scsi::test_unit_ready(), DataDir::None)
            .await
            .map(drop)
    }

    pub async fn inquiry(&self, lun: u16) -> Result<Inquiry> {
        let r = self
            .command_ok(lun, &scsi::inquiry(None, 96), DataDir::Read(96))
            .await?;
        let inq = Inquiry::parse(&r.data)
            .ok_or_else(|| Error::Protocol("INQUIRY data shorter than 36 bytes".into()))?;
        if inq.peripheral_qualifier == 3 {
            return Err(Error::LunNotFound {
                target: self.shared.target.clone(),
                lun,
            });
        }
        Ok(inq)
    }

    /// A VPD page, raw.
    pub async fn vpd(&self, lun: u16, page: u8) -> Result<Bytes> {
        let r = self
            .command_ok(lun, &scsi::inquiry(Some(page), 4096), DataDir::Read(4096))
            .await?;
        Ok(r.data)
    }

    /// READ CAPACITY (16), falling back to (10); cached for [`Session::read`]/`write`.
    pub async fn read_capacity(&self, lun: u16) -> Result<Capacity> {
        let r = self
            .command(lun, &scsi::read_capacity16(), DataDir::Read(32))
            .await?;
        let cap = if r.is_good() {
            Capacity::parse16(&r.data)
        } else {
            if r.sense.as_ref().is_some_and(Sense::is_lun_not_supported) {
                return Err(Error::LunNotFound {
                    target: self.shared.target.clone(),
                    lun,
                });
            }
            let r = self
                .command_ok(lun, &scsi::read_capacity10(), DataDir::Read(8))
                .await?;
            Capacity::parse10(&r.data)
        }
        .filter(|c| c.block_size > 0)
        .ok_or_else(|| Error::Protocol("malformed READ CAPACITY data".into()))?;
        self.shared
            .capacity
            .lock()
            .unwrap()
            .insert(lun, cap.clone());
        Ok(cap)
    }

    pub async fn report_luns(&self) -> Result<Vec<u16>> {
        let r = self
            .command_ok(0, &scsi::report_luns(16384), DataDir::Read(16384))
            .await?;
        Ok(scsi::parse_report_luns(&r.data))
    }

    async fn block_size(&self, lun: u16) -> Result<u32> {
        if let Some(c) = self.shared.capacity.lock().unwrap().get(&lun) {
            return Ok(c.block_size);
        }
        Ok(self.read_capacity(lun).await?.block_size)
    }

    /// Reads `blocks` blocks at `lba`.
    pub async fn read(&self, lun: u16, lba: u64, blocks: u32) -> Result<Bytes> {
        let bs = self.block_size(lun).await?;
        let len = blocks
            .checked_mul(bs)
            .ok_or_else(|| Error::Option("read too large".into()))?;
        let r = self
            .command_ok(lun, &scsi::read16(lba, blocks), DataDir::Read(len))
            .await?;
        if r.data.len() != len as usize {
            return Err(Error::Protocol(format!(
                "READ returned {} bytes of {len}",
                r.data.len()
            )));
        }
        Ok(r.data)
    }

    /// Writes `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lun: u16, lba: u64, data: Bytes) -> Result<()> {
        let bs = self.block_size(lun).await?;
        if !data.len().is_multiple_of(bs as usize) {
            return Err(Error::Option(format!(
                "write of {} bytes is not a multiple of the block size {bs}",
                data.len()
            )));
        }
        let blocks = (data.len() / bs as usize) as u32;
        self.command_ok(lun, &scsi::write16(lba, blocks), DataDir::Write(data))
            .await
            .map(drop)
    }

    pub async fn sync_cache(&self, lun: u16) -> Result<()> {
        self.command_ok(lun, &scsi::sync_cache10(), DataDir::None)
            .await
            .map(drop)
    }

    /// LOGICAL UNIT RESET; returns the TMF response code (0 = function complete).
    pub async fn lun_reset(&self, lun: u16) -> Result<u8> {
        let conn = {
            let st = self.shared.state.lock().unwrap();
            st.pick_conn().ok_or(Error::Closed)?
        };
        self.shared
            .task_mgmt(&conn, tmf::LOGICAL_UNIT_RESET, lun, RESERVED_TAG, 0, 0)
            .await
    }

    /// Closes the session (Logout, reason "close the session") and all connections.
    pub async fn logout(&self) -> Result<()> {
        let conn = {
            let mut st = self.shared.state.lock().unwrap();
            st.closed = true;
            st.pick_conn()
        };
        self.shared.window.notify_waiters();
        let result = match conn {
            Some(conn) => {
                let (guard, mut rx) = self.shared.register(&conn);
                let cmdsn = self.shared.state.lock().unwrap().cmdsn;
                conn.send(Pdu::LogoutRequest(LogoutRequest {
                    immediate: true,
                    reason: logout::CLOSE_SESSION,
                    itt: guard.itt,
                    cid: conn.cid,
                    cmdsn,
                    expstatsn: 0,
                }));
                match tokio::time::timeout(Duration::from_secs(5), recv_pdu(&mut rx)).await {
                    Ok(Some(Pdu::LogoutResponse(r))) if r.response == 0 => Ok(()),
                    Ok(Some(Pdu::LogoutResponse(r))) => Err(Error::Protocol(format!(
                        "logout refused (response {})",
                        r.response
                    ))),
                    Ok(_) => Ok(()),
                    Err(_) => Err(Error::Timeout("logout".into())),
                }
            }
            None => Ok(()),
        };
        let conns = std::mem::take(&mut self.shared.state.lock().unwrap().conns);
        for c in conns {
            c.kill();
        }
        result
    }
}

impl Shared {
    fn portal(&self) -> String {
        self.url.portal()
    }

    fn path(conns: &[Arc<Conn>]) -> Option<PathReport> {
        let mut r = PathReport::default();
        let mut min_rtt = u32::MAX;
        let mut srtt = 0u64;
        for c in conns.iter().filter(|c| c.is_alive()) {
            if let Some(p) = *c.path.lock().unwrap() {
                r.connections_sampled += 1;
                r.rate_bytes_per_s += p.rate;
                r.retransmits += u64::from(p.info.total_retrans);
                if p.info.min_rtt_us > 0 {
                    min_rtt = min_rtt.min(p.info.min_rtt_us);
                }
                srtt += u64::from(p.info.rtt_us);
            }
        }
        if r.connections_sampled == 0 {
            return None;
        }
        r.min_rtt_ms = if min_rtt == u32::MAX {
            0.0
        } else {
            f64::from(min_rtt) / 1e3
        };
        r.srtt_ms = srtt as f64 / r.connections_sampled as f64 / 1e3;
        Some(r)
    }

    /// Called by a connection's reader after a read, every [`Shared::sample_every`]:
    /// samples its TCP_INFO, grows the queue depth when the measured path needs more in
    /// flight, and runs the rate control.
    fn observe(self: &Arc<Self>, conn: &Arc<Conn>, stream: &Reader) {
        let span = Duration::from_micros(self.span_us.load(Ordering::Relaxed));
        let Some(fd) = stream.socket() else {
            return;
        };
        if !conn.sample_path(fd, self.epoch.elapsed(), span) || !self.opts.auto_tune {
            return;
        }
        let conns = self.state.lock().unwrap().conns.clone();
        let Some(path) = Self::path(&conns) else {
            return;
        };
        if !self.opts.is_pinned("queue_depth") {
            self.grow_queue(&path, conns.len());
            self.shrink_queue(&path, conns.len());
        }
        if self.rate.is_some() {
            self.control_rate(conn, stream, &conns, &path);
        }
    }

    fn grow_queue(&self, path: &PathReport, connections: usize) {
        let io = self.plan.as_ref().map_or(1 << 20, |p| p.io_size);
        let current = self.queue_depth.load(Ordering::Relaxed);
        if let Some(q) = crate::tune::grown_queue_depth(
            current,
            path.rate_bytes_per_s,
            Duration::from_secs_f64(path.min_rtt_ms / 1e3),
            io,
            connections,
        ) {
            if self
                .queue_depth
                .compare_exchange(current, q, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                // Slots owed from an earlier cut are simply not taken away.
                let more = q - current;
                let owed = self.take_debt(more);
                self.slots.add_permits(more - owed);
                tracing::info!(
                    "auto-tuning: queue depth {current} -> {q} for {:.0} Mbit/s at {:.1} ms",
                    path.rate_bytes_per_s as f64 * 8e-6,
                    path.min_rtt_ms
                );
            }
        }
    }

    /// Cuts a long path's queue back to what its measured peak rate needs
    /// ([`crate::tune::shrunk_queue_depth`]) once the session has been busy long enough to
    /// know it.
    fn shrink_queue(&self, path: &PathReport, connections: usize) {
        let io = self.plan.as_ref().map_or(1 << 20, |p| p.io_size);
        let current = self.queue_depth.load(Ordering::Relaxed);
        let busy = self.slots.available_permits() * 4 < current;
        let peak =
            self.peak
                .lock()
                .unwrap()
                .push(self.epoch.elapsed(), path.rate_bytes_per_s, busy);
        let Some(q) = peak.and_then(|peak| {
            crate::tune::shrunk_queue_depth(
                current,
                peak,
                Duration::from_secs_f64(path.min_rtt_ms / 1e3),
                io,
                connections,
            )
        }) else {
            return;
        };
        if self
            .queue_depth
            .compare_exchange(current, q, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let cut = current - q;
        let now = self.slots.forget_permits(cut);
        self.slot_debt.fetch_add(cut - now, Ordering::Relaxed);
        tracing::info!(
            "auto-tuning: queue depth {current} -> {q}: a peak of {:.0} Mbit/s at {:.1} ms \
             needs no more",
            peak.unwrap_or(0) as f64 * 8e-6,
            path.min_rtt_ms
        );
    }

    /// Takes up to `n` slots off the debt; returns how many. Every command's finish asks:
    /// with no debt (nearly always) it only reads.
    fn take_debt(&self, n: usize) -> usize {
        let mut took = 0;
        let _ = self
            .slot_debt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                took = d.min(n);
                (took > 0).then(|| d - took)
            });
        took
    }

    /// How often a reader samples its connection's TCP_INFO.
    fn sample_every(&self) -> Duration {
        Duration::from_micros(self.sample_every_us.load(Ordering::Relaxed))
    }

    /// Feeds the rate control what the session's connections delivered, and paces this
    /// connection to its share of the session's rate: its own sends with
    /// SO_MAX_PACING_RATE, the target's with a hint (`X-org.reservoir.PacingRate` in a
    /// Text request) where the target takes them.
    fn control_rate(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        stream: &Reader,
        conns: &[Arc<Conn>],
        path: &PathReport,
    ) {
        let Some(rate) = &self.rate else { return };
        let min_rtt = Duration::from_secs_f64(path.min_rtt_ms / 1e3);
        let every = RateControl::interval(min_rtt);
        self.sample_every_us
            .store(every.as_micros() as u64, Ordering::Relaxed);
        self.span_us.store(
            RateControl::span(min_rtt).as_micros() as u64,
            Ordering::Relaxed,
        );
        let live: Vec<&Arc<Conn>> = conns.iter().filter(|c| c.is_alive()).collect();
        {
            let mut rc = rate.lock().unwrap();
            let now = self.epoch.elapsed();
            if rc.due(now, every) {
                // The sum of every live connection's rate over its own last span.
                let rate: Option<u64> = live
                    .iter()
                    .map(|c| c.path.lock().unwrap().and_then(|p| p.span_rate))
                    .sum();
                // Busy: more than three quarters of the queue in use (a session short
                // of work measures itself, not the path).
                let busy =
                    self.slots.available_permits() * 4 < self.queue_depth.load(Ordering::Relaxed);
                if let Some(total) = rc.sample(now, rate, busy) {
                    self.pace_total.store(total, Ordering::Relaxed);
                    let r = rc.report();
                    tracing::info!(
                        "rate control ({}): bottleneck {:.1} Mbit/s, session paced at {:.1} \
                         Mbit/s over {} connections",
                        r.phase,
                        r.bottleneck_bytes_per_s as f64 * 8e-6,
                        total as f64 * 8e-6,
                        live.len()
                    );
                }
            }
        }
        let total = self.pace_total.load(Ordering::Relaxed);
        if total == 0 {
            return;
        }
        let share = (total / live.len().max(1) as u64).max(1);
        let applied = conn.applied_pace.load(Ordering::Relaxed);
        if share.abs_diff(applied) * 50 <= applied {
            return;
        }
        conn.applied_pace.store(share, Ordering::Relaxed);
        let Some(fd) = stream.socket() else { return };
        if let Err(e) = net::set_pacing_rate(fd, share) {
            tracing::warn!(cid = conn.cid, "SO_MAX_PACING_RATE {share}: {e}");
        }
        if conn.target_takes_hints() {
            self.hint_target_pacing(conn, share);
        }
    }

    /// Asks the target to pace what it sends on `conn` at `rate` bytes per second
    /// (a Text request in full feature phase) and records its answer.
    fn hint_target_pacing(self: &Arc<Self>, conn: &Arc<Conn>, rate: u64) {
        let s = self.clone();
        let c = conn.clone();
        tokio::spawn(async move {
            let (guard, mut rx) = s.register(&c);
            let cmdsn = s.state.lock().unwrap().cmdsn;
            c.send(Pdu::TextRequest(TextRequest {
                immediate: true,
                final_: true,
                cont: false,
                lun: 0,
                itt: guard.itt,
                ttt: RESERVED_TAG,
                cmdsn,
                expstatsn: 0,
                data: Bytes::from(format!("{PACING_RATE_KEY}={rate}\0")),
            }));
            let answer =
                match tokio::time::timeout(Duration::from_secs(10), recv_pdu(&mut rx)).await {
                    Ok(Some(Pdu::TextResponse(r))) => iscsi::text::TextKeys::parse(&r.data)
                        .ok()
                        .and_then(|k| {
                            k.get(PACING_RATE_KEY)
                                .map(iscsi::negotiate::pacing_from_answer)
                        })
                        .unwrap_or(TargetPacing::Refused),
                    Ok(Some(_)) => TargetPacing::Refused,
                    // No answer (the connection went): nothing learnt.
                    _ => return,
                };
            tracing::debug!(
                cid = c.cid,
                "pacing hint {rate}: the target answered {}",
                answer.as_str()
            );
            *c.ffp_pacing.lock().unwrap() = Some(answer);
            drop(guard);
        });
    }

    fn login_config(&self, cid: u16, tsih: u16, session: SessionParams) -> InitiatorLoginConfig {
        let o = &self.opts;
        InitiatorLoginConfig {
            initiator_name: o.initiator_name.clone(),
            initiator_alias: None,
            target_name: Some(self.target.clone()),
            session_type: SessionType::Normal,
            isid: self.isid,
            tsih,
            cid,
            auth: chap(&self.url, o),
            session,
            connection: connection_prefs(o),
            leading: tsih == 0,
            // With the rate control on, "0" (no pacing yet) asks whether the target knows
            // the key: only then do hints follow in full feature phase.
            pacing_hint: o.target_pacing_hint().or(self
                .rate
                .as_ref()
                .filter(|_| o.pacing_hint)
                .map(|_| 0)),
        }
    }

    /// Logs in the leading connection and the others, and installs them as a new
    /// generation of the session.
    async fn establish(self: &Arc<Self>) -> Result<()> {
        let o = &self.opts;
        let proposal = SessionParams {
            max_connections: o.connections,
            initial_r2t: o.initial_r2t,
            immediate_data: o.immediate_data,
            max_burst_length: o.max_burst,
            first_burst_length: o.first_burst.min(o.max_burst),
            max_outstanding_r2t: 8,
            error_recovery_level: o.error_recovery_level,
            ..SessionParams::default()
        };
        let portal = self.portal();
        let mut raw = RawConn::connect(&portal, o).await?;
        let cmdsn = {
            let st = self.state.lock().unwrap();
            st.cmdsn
        };
        let lead = raw
            .login(self.login_config(0, 0, proposal), 0, cmdsn)
            .await?;
        let params = lead.outcome.session.clone();
        let tsih = lead.outcome.tsih;
        let tuning = raw.tuning.clone();
        let mut logged_in: Vec<(RawConn, LoginDone, u16)> = vec![(raw, lead, 0)];
        let want = o.connections.min(params.max_connections).max(1);
        for cid in 1..want {
            let extra = async {
                let mut raw = RawConn::connect(&portal, o).await?;
                let done = raw
                    .login(
                        self.login_config(cid, tsih, params.clone()),
                        u32::from(cid),
                        cmdsn,
                    )
                    .await?;
                Ok::<_, Error>((raw, done))
            };
            match extra.await {
                Ok((raw, done)) => logged_in.push((raw, done, cid)),
                Err(e) => {
                    tracing::warn!("connection {cid} of the session could not log in: {e}");
                    break;
                }
            }
        }
        let first = &logged_in[0].1;
        let conn_params = first.outcome.connection.clone();
        let (expcmdsn, maxcmdsn) =
            logged_in
                .iter()
                .fold((first.expcmdsn, first.maxcmdsn), |(e, m), (_, d, _)| {
                    (
                        if sn_gt(d.expcmdsn, e) { d.expcmdsn } else { e },
                        if sn_gt(d.maxcmdsn, m) { d.maxcmdsn } else { m },
                    )
                });
        let mut st = self.state.lock().unwrap();
        let gen = st.gen + 1;
        let mut conns = Vec::new();
        for (raw, done, cid) in logged_in {
            conns.push(self.start_conn(raw, &done, cid, gen));
        }
        for old in std::mem::replace(&mut st.conns, conns) {
            old.kill();
        }
        st.gen = gen;
        st.cmdsn = cmdsn;
        st.expcmdsn = expcmdsn;
        st.maxcmdsn = maxcmdsn;
        st.tasks.clear();
        st.losses.clear();
        st.tsih = tsih;
        st.info = Some(SessionInfo {
            target: self.target.clone(),
            portal,
            isid: self.isid.iter().map(|b| format!("{b:02x}")).collect(),
            tsih,
            connections: st.conns.len(),
            max_connections: params.max_connections,
            initial_r2t: params.initial_r2t,
            immediate_data: params.immediate_data,
            max_burst_length: params.max_burst_length,
            first_burst_length: params.first_burst_length,
            max_recv_data_segment_length: conn_params.max_recv_data_segment_length,
            max_send_data_segment_length: conn_params.max_send_data_segment_length,
            header_digest: conn_params.header_digest,
            data_digest: conn_params.data_digest,
            error_recovery_level: params.error_recovery_level,
            queue_depth: o.queue_depth,
            congestion: tuning.congestion,
            send_buffer: tuning.send_buffer,
            recv_buffer: tuning.recv_buffer,
            tuning: None,
            path: None,
            target_pacing: Default::default(),
            rate_control: None,
        });
        st.params = params;
        drop(st);
        self.window.notify_waiters();
        Ok(())
    }

    /// Reinstates the session unless another task already did since generation `gen`.
    async fn recover(self: &Arc<Self>, gen: u64, why: &str) -> Result<()> {
        let _g = self.recovery.lock().await;
        {
            let mut st = self.state.lock().unwrap();
            if st.closed {
                return Err(Error::Closed);
            }
            if st.gen != gen {
                return Ok(());
            }
            for c in &st.conns {
                c.kill();
            }
            st.tasks.clear();
        }
        tracing::warn!("session to {} failed ({why}); reinstating", self.target);
        let deadline = Instant::now() + self.opts.recovery_timeout;
        let mut delay = Duration::from_millis(100);
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.establish().await {
                Ok(()) => {
                    self.reinstatements.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("session to {} reinstated", self.target);
                    return Ok(());
                }
                Err(e @ (Error::Auth { .. } | Error::LoginRefused { class: 2, .. })) => {
                    return Err(e)
                }
                Err(e) if Instant::now() + delay > deadline => {
                    return Err(Error::RecoveryFailed {
                        attempts,
                        last: e.to_string(),
                    })
                }
                Err(e) => {
                    tracing::debug!("reinstatement attempt {attempts}: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// What to do with a command whose connection was lost: `Some(Some(cmdsn))` to send
    /// it again with its CmdSN (the target never received it, and until
    /// it does its CmdSN is a hole that stalls the session), `Some(None)` to issue it as
    /// a new command (the target had it and ended it with the connection), `None` when
    /// only session recovery is left.
    async fn after_conn_loss(&self, sent: Option<(u64, u32)>) -> Option<Option<u32>> {
        let (serial, cmdsn) = sent?;
        let mut rx = self.state.lock().unwrap().losses.get(&serial)?.clone();
        let loss = tokio::time::timeout(
            self.opts.recovery_timeout,
            rx.wait_for(|l| *l != Loss::Pending),
        )
        .await
        .ok()?
        .ok()
        .map(|l| *l)?;
        match loss {
            Loss::LoggedOut { expcmdsn } if sn_le(expcmdsn, cmdsn) => Some(Some(cmdsn)),
            Loss::LoggedOut { .. } => Some(None),
            Loss::Failed | Loss::Pending => None,
        }
    }

    /// Recovers one lost connection while the session goes on over the others: logs the
    /// CID out through a surviving connection (so the target drops what it still held of
    /// it and its ExpCmdSN says what it received), then logs the same CID in again with
    /// the session's TSIH, retrying until `recovery_timeout`.
    async fn recover_connection(self: Arc<Self>, lost: Arc<Conn>, tx: watch::Sender<Loss>) {
        tracing::warn!(
            cid = lost.cid,
            "recovering connection {} of the session on the others",
            lost.cid
        );
        let logged_out = self
            .logout_connection(&lost, logout::CLOSE_CONNECTION)
            .await;
        let _ = tx.send(match logged_out {
            Some(expcmdsn) => Loss::LoggedOut { expcmdsn },
            None => Loss::Failed,
        });
        if logged_out.is_none() {
            return;
        }
        self.relogin(&lost).await;
    }

    /// Recovers one lost connection at ERL 2 (RFC 7143 6.2.2): logs it out "for recovery"
    /// through a surviving connection, or, when none is left, logs its CID in again
    /// (which logs the old one out implicitly); then moves each of its commands to a live
    /// connection with TASK REASSIGN. A command the target does not know (it never
    /// arrived) is sent again like at ERL 0; when no connection can be had at all, only
    /// session reinstatement is left.
    async fn reassign_connection(self: Arc<Self>, lost: Arc<Conn>, tx: watch::Sender<Loss>) {
        tracing::warn!(
            cid = lost.cid,
            "recovering connection {} by task reassignment",
            lost.cid
        );
        let (carrier, expcmdsn) = match self
            .logout_connection(&lost, logout::REMOVE_FOR_RECOVERY)
            .await
        {
            Some(exp) => (None, Some(exp)),
            None => match self.relogin(&lost).await {
                Some((conn, exp)) => (Some(conn), Some(exp)),
                None => (None, None),
            },
        };
        let _ = tx.send(match expcmdsn {
            Some(expcmdsn) => Loss::LoggedOut { expcmdsn },
            None => Loss::Failed,
        });
        let orphans: Vec<(u32, u64, u16, u32, Arc<AtomicU32>)> = {
            let mut st = self.state.lock().unwrap();
            let list = st
                .tasks
                .iter()
                .filter(|(_, t)| t.serial == lost.serial)
                .filter_map(|(itt, t)| {
                    let c = t.command.as_ref()?;
                    Some((*itt, t.id, c.lun, c.cmdsn, c.exp_datasn.clone()))
                })
                .collect();
            if expcmdsn.is_none() {
                // Their attempts see the connection lost and the session reinstated.
                st.tasks.retain(|_, t| t.serial != lost.serial);
            }
            list
        };
        self.window.notify_waiters();
        if expcmdsn.is_none() {
            return;
        }
        let mut jobs = tokio::task::JoinSet::new();
        for (itt, id, lun, cmdsn, exp_datasn) in orphans {
            let (me, carrier) = (self.clone(), carrier.clone());
            jobs.spawn(async move {
                me.reassign_task(carrier, itt, id, lun, cmdsn, &exp_datasn)
                    .await
            });
        }
        while jobs.join_next().await.is_some() {}
        if carrier.is_none() {
            // Logged out through another connection: bring the CID back for later.
            self.relogin(&lost).await;
        }
    }

    /// TASK REASSIGN of one command to `carrier` (or any live connection). When the
    /// target refuses, the command is dropped here and its attempt sends it again.
    async fn reassign_task(
        &self,
        carrier: Option<Arc<Conn>>,
        itt: u32,
        id: u64,
        lun: u16,
        cmdsn: u32,
        exp_datasn: &AtomicU32,
    ) {
        let mut still_allegiant = 0;
        let outcome = loop {
            let via = {
                let mut st = self.state.lock().unwrap();
                let via = carrier
                    .clone()
                    .filter(|c| c.is_alive())
                    .or_else(|| st.pick_conn());
                match (st.tasks.get_mut(&itt), &via) {
                    (Some(t), Some(via)) if t.id == id => t.serial = via.serial,
                    (Some(t), None) if t.id == id => break Err("no connection left".to_owned()),
                    // The command ended meanwhile.
                    _ => return,
                }
                via.expect("checked above")
            };
            let exp = exp_datasn.load(Ordering::Acquire);
            match self
                .task_mgmt(&via, tmf::TASK_REASSIGN, lun, itt, cmdsn, exp)
                .await
            {
                Ok(0) => break Ok(()),
                // The old connection is not logged out yet: that takes a moment.
                Ok(3) if still_allegiant < 50 => {
                    still_allegiant += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(r) => break Err(format!("TASK REASSIGN answered {r}")),
                // Its new connection failed too: that connection's recovery has it now.
                Err(_) if !via.is_alive() => return,
                Err(e) => break Err(e.to_string()),
            }
        };
        match outcome {
            Ok(()) => {
                self.reassigned.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(itt, "task reassigned");
            }
            Err(why) => {
                tracing::debug!(itt, "task not reassigned ({why}); it is sent again");
                let mut st = self.state.lock().unwrap();
                if st.tasks.get(&itt).is_some_and(|t| t.id == id) {
                    st.tasks.remove(&itt);
                }
            }
        }
    }

    /// Logs the CID of `lost` in again with the session's TSIH, retrying until
    /// `recovery_timeout`; returns the running connection and the target's ExpCmdSN.
    async fn relogin(self: &Arc<Self>, lost: &Arc<Conn>) -> Option<(Arc<Conn>, u32)> {
        let deadline = Instant::now() + self.opts.recovery_timeout;
        let mut delay = Duration::from_millis(50);
        loop {
            let (gen, tsih, params, cmdsn, closed) = {
                let st = self.state.lock().unwrap();
                (st.gen, st.tsih, st.params.clone(), st.cmdsn, st.closed)
            };
            if closed || gen != lost.gen {
                return None;
            }
            let login = async {
                let mut raw = RawConn::connect(&lost.portal, &self.opts).await?;
                let done = raw
                    .login(
                        self.login_config(lost.cid, tsih, params),
                        u32::from(lost.cid),
                        cmdsn,
                    )
                    .await?;
                Ok::<_, Error>((raw, done))
            };
            match login.await {
                Ok((raw, done)) => {
                    let mut st = self.state.lock().unwrap();
                    if st.closed || st.gen != lost.gen {
                        return None;
                    }
                    let conn = self.start_conn(raw, &done, lost.cid, gen);
                    st.conns.retain(|c| c.serial != lost.serial);
                    st.conns.push(conn.clone());
                    drop(st);
                    self.reconnections.fetch_add(1, Ordering::Relaxed);
                    self.update_window(done.expcmdsn, done.maxcmdsn);
                    self.window.notify_waiters();
                    tracing::info!(cid = lost.cid, "connection {} re-established", lost.cid);
                    return Some((conn, done.expcmdsn));
                }
                Err(e @ (Error::Auth { .. } | Error::LoginRefused { class: 2, .. })) => {
                    tracing::warn!(
                        cid = lost.cid,
                        "connection {} could not be re-established: {e}",
                        lost.cid
                    );
                    return None;
                }
                Err(e) if Instant::now() + delay > deadline => {
                    tracing::warn!(
                        cid = lost.cid,
                        "connection {} could not be re-established: {e}; going on with fewer",
                        lost.cid
                    );
                    return None;
                }
                Err(e) => {
                    tracing::debug!(cid = lost.cid, "re-login: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Logout of `lost`'s CID on another connection, with `reason` 1 "close the
    /// connection" or 2 "remove the connection for recovery"; returns the target's
    /// ExpCmdSN once the target no longer knows the CID.
    async fn logout_connection(&self, lost: &Conn, reason: u8) -> Option<u32> {
        let start = Instant::now();
        loop {
            let via = {
                let st = self.state.lock().unwrap();
                if st.closed || st.gen != lost.gen {
                    return None;
                }
                st.pick_conn()?
            };
            let (guard, mut rx) = self.register(&via);
            let cmdsn = self.state.lock().unwrap().cmdsn;
            via.send(Pdu::LogoutRequest(LogoutRequest {
                immediate: true,
                reason,
                itt: guard.itt,
                cid: lost.cid,
                cmdsn,
                expstatsn: 0,
            }));
            match tokio::time::timeout(Duration::from_secs(10), recv_pdu(&mut rx)).await {
                // 1: CID not found — the target has dropped the connection and the
                // commands it queued for it.
                Ok(Some(Pdu::LogoutResponse(r))) if r.response == 1 => return Some(r.expcmdsn),
                // Accepted: the target closes it now; ask again until it is gone (a
                // target that closes synchronously is believed after a while). For
                // recovery, success means the tasks are ready to be reassigned.
                Ok(Some(Pdu::LogoutResponse(r))) if r.response == 0 => {
                    if reason == logout::REMOVE_FOR_RECOVERY
                        || start.elapsed() > Duration::from_secs(2)
                    {
                        return Some(r.expcmdsn);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Some(other)) => {
                    tracing::warn!(
                        cid = lost.cid,
                        "logout of the lost connection answered with {:?}",
                        other.opcode()
                    );
                    return None;
                }
                // The connection carrying the logout failed too: try another.
                Ok(None) => {}
                Err(_) => return None,
            }
        }
    }

    /// Turns a logged-in connection into a running one of generation `gen`.
    fn start_conn(
        self: &Arc<Self>,
        raw: RawConn,
        done: &LoginDone,
        cid: u16,
        gen: u64,
    ) -> Arc<Conn> {
        let exp_statsn = raw.exp_statsn;
        let portal = raw.portal.clone();
        let (r, w, buf, dec, digests) = raw.into_parts();
        let (conn, dead) = Conn::new(
            cid,
            gen,
            portal,
            done.outcome.connection.max_send_data_segment_length,
            exp_statsn,
            w,
            digests,
            done.outcome.pacing,
        );
        match done.outcome.pacing {
            TargetPacing::NotAsked => {}
            TargetPacing::Paced(r) => tracing::debug!(
                cid,
                "the target paces this connection's Data-In at {:.1} Mbit/s",
                r as f64 * 8e-6
            ),
            other => tracing::debug!(
                cid,
                "the target does not pace this connection's Data-In (pacing hint {})",
                other.as_str()
            ),
        }
        tokio::spawn(reader(
            Arc::downgrade(self),
            conn.clone(),
            r,
            buf,
            dec,
            dead,
        ));
        conn
    }

    /// A task other than a SCSI command (NOP, TMF, Logout) on `conn`; it ends with the
    /// guard.
    fn register(&self, conn: &Arc<Conn>) -> (TaskGuard<'_>, inbox::Receiver<Routed>) {
        let (itt, id, rx) = self.state.lock().unwrap().new_task(conn, None, None);
        let guard = TaskGuard {
            shared: self,
            itt,
            id,
            conn: conn.clone(),
            weight: 0,
        };
        (guard, rx)
    }

    /// One try at a command: wait for a CmdSN in the window, send the command with its
    /// unsolicited data, answer R2Ts and collect Data-In until the status arrives.
    async fn attempt(
        &self,
        lun: u16,
        cdb: &[u8],
        dir: &DataDir,
        plug: Option<u32>,
    ) -> Result<ScsiResult, Attempt> {
        let (edtl, read, write) = match dir {
            DataDir::None => (0u32, false, None),
            DataDir::Read(n) => (*n, true, None),
            DataDir::Write(d) => (
                u32::try_from(d.len())
                    .map_err(|_| Attempt::Fatal(Error::Option("write larger than 4 GiB".into())))?,
                false,
                Some(d),
            ),
        };
        let wire_lun = lun_to_wire(lun);
        // Set when the command first has to wait for the window (or a connection).
        let mut wait_start = None;
        let exp_datasn = Arc::new(AtomicU32::new(0));
        let sink = (read && edtl as usize >= PLACE_MIN).then(|| {
            Arc::new(ReadSink {
                edtl: edtl as usize,
                buf: Mutex::new(Some(Vec::new())),
                pool: self.bufs.clone(),
            })
        });
        let (conn, itt, id, cmdsn, mut rx) = loop {
            // Registered before the state is looked at, so that no opening of the window
            // is missed; only once the command had to wait (the first look is free).
            let notified = wait_start.map(|_| self.window.notified());
            tokio::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            {
                let mut st = self.state.lock().unwrap();
                if st.closed {
                    return Err(Attempt::Fatal(Error::Closed));
                }
                let conn = st.pick_conn();
                let conn = match conn {
                    Some(c) => Some(c),
                    // ERL 2: the lost connection is on its way back; wait for it.
                    None if st.recovering() => None,
                    None => {
                        return Err(Attempt::Lost {
                            gen: st.gen,
                            why: "no connection left".into(),
                            sent: None,
                        })
                    }
                };
                // A plug reuses the CmdSN of a command the target never received, which
                // was inside the window when first sent; a fresh ITT, because the target
                // may still be forgetting the old one.
                if let Some(conn) = conn.filter(|_| plug.is_some() || sn_le(st.cmdsn, st.maxcmdsn))
                {
                    let cmdsn = plug.unwrap_or_else(|| {
                        let cmdsn = st.cmdsn;
                        st.cmdsn = cmdsn.wrapping_add(1);
                        cmdsn
                    });
                    let (itt, id, rx) = st.new_task(
                        &conn,
                        Some(Reassignable {
                            lun,
                            cmdsn,
                            exp_datasn: exp_datasn.clone(),
                        }),
                        sink.clone(),
                    );
                    // Sent under the lock so that each connection carries CmdSNs in order.
                    self.send_command(
                        &st.params, &conn, wire_lun, itt, cmdsn, cdb, edtl, read, write,
                    );
                    break (conn, itt, id, cmdsn, rx);
                }
            }
            let Some(since) = wait_start else {
                // Look again, now registered for the window's opening.
                wait_start = Some(Instant::now());
                continue;
            };
            if since.elapsed() > self.opts.command_timeout {
                let gen = self.state.lock().unwrap().gen;
                return Err(Attempt::Lost {
                    gen,
                    why: "the target's command window stayed closed".into(),
                    sent: None,
                });
            }
            if let Some(n) = notified.as_pin_mut() {
                let _ = tokio::time::timeout(Duration::from_millis(500), n).await;
            }
        };
        let weight = u64::from(edtl) + 4096;
        conn.outstanding.fetch_add(weight, Ordering::Relaxed);
        let mut guard = TaskGuard {
            shared: self,
            itt,
            id,
            conn: conn.clone(),
            weight,
        };
        let mut conn = conn;
        let mut data_in = ReadData {
            sink,
            ..ReadData::default()
        };
        let protocol = |m: String| Attempt::Fatal(Error::Protocol(m));
        loop {
            let (pdu, placed) =
                match tokio::time::timeout(self.opts.command_timeout, rx.recv()).await {
                    Ok(Some(Routed { pdu, via, placed })) => {
                        if via.serial != conn.serial {
                            // Reassigned (ERL 2): R2Ts are answered where they come from.
                            guard.move_to(&via);
                            conn = via;
                        }
                        (pdu, placed)
                    }
                    Ok(None) => {
                        return Err(Attempt::Lost {
                            gen: conn.gen,
                            why: format!("connection {} failed", conn.cid),
                            sent: Some((conn.serial, cmdsn)),
                        })
                    }
                    Err(_) => {
                        tracing::warn!(itt, "command 0x{:02x} timed out; aborting it", cdb[0]);
                        return match self
                            .task_mgmt(&conn, tmf::ABORT_TASK, lun, itt, cmdsn, 0)
                            .await
                        {
                            Ok(_) => Err(Attempt::Aborted),
                            Err(_) => {
                                conn.kill();
                                Err(Attempt::Lost {
                                    gen: conn.gen,
                                    why: "command and abort timed out".into(),
                                    sent: None,
                                })
                            }
                        };
                    }
                };
            match pdu {
                Pdu::DataIn(d) => {
                    let off = d.buffer_offset as usize;
                    let end = off + d.data.len() + placed;
                    if !read || end > edtl as usize {
                        return Err(protocol(format!(
                            "Data-In at {off}..{end} beyond the expected {} bytes",
                            if read { edtl } else { 0 }
                        )));
                    }
                    if placed > 0 {
                        data_in.placed(off, placed);
                    } else {
                        data_in.add(off, d.data);
                    }
                    let _ = exp_datasn.compare_exchange(
                        d.datasn,
                        d.datasn.wrapping_add(1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if d.status_present {
                        let residual = if d.underflow { d.residual_count } else { 0 };
                        return Ok(ScsiResult {
                            status: d.status,
                            sense: None,
                            data: data_in.into_bytes(edtl, residual),
                            residual,
                        });
                    }
                }
                Pdu::R2t(r) => {
                    let Some(data) = write else {
                        return Err(protocol("R2T for a command without write data".into()));
                    };
                    let off = r.buffer_offset as usize;
                    let end = off + r.desired_data_transfer_length as usize;
                    if end > data.len() {
                        return Err(protocol(format!(
                            "R2T for {off}..{end} beyond the {} bytes of the write",
                            data.len()
                        )));
                    }
                    send_data_out(&conn, wire_lun, itt, r.ttt, data, off, end);
                }
                Pdu::ScsiResponse(r) => {
                    if r.response != 0 {
                        return Err(Attempt::Fatal(Error::Response(r.response)));
                    }
                    let residual = if r.underflow { r.residual_count } else { 0 };
                    return Ok(ScsiResult {
                        status: r.status,
                        sense: r.sense().and_then(Sense::parse),
                        data: if read {
                            data_in.into_bytes(edtl, residual)
                        } else {
                            Bytes::new()
                        },
                        residual,
                    });
                }
                Pdu::Reject(r) => {
                    return Err(protocol(format!(
                        "target rejected command 0x{:02x} (reason 0x{:02x})",
                        cdb[0], r.reason
                    )))
                }
                other => {
                    return Err(protocol(format!(
                        "unexpected {:?} for a SCSI command",
                        other.opcode()
                    )))
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn send_command(
        &self,
        params: &SessionParams,
        conn: &Conn,
        lun: u64,
        itt: u32,
        cmdsn: u32,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        write: Option<&Bytes>,
    ) {
        let plan = match write {
            Some(_) => ffp::WritePlan::initiator(
                edtl,
                &ffp::DataRules::from(params),
                conn.max_send_segment,
            ),
            None => ffp::WritePlan {
                immediate: 0,
                unsolicited_end: 0,
            },
        };
        let (immediate_len, unsolicited_end) =
            (plan.immediate as usize, plan.unsolicited_end as usize);
        let final_ = plan.final_bit();
        conn.send(Pdu::ScsiCommand(ScsiCommand {
            immediate: false,
            final_,
            read,
            write: write.is_some(),
            attr: 1,
            lun,
            itt,
            edtl,
            cmdsn,
            cdb: cdb.to_vec(),
            data: write.map(|d| d.slice(..immediate_len)).unwrap_or_default(),
            ..ScsiCommand::default()
        }));
        if let Some(d) = write {
            if unsolicited_end > immediate_len {
                send_data_out(
                    conn,
                    lun,
                    itt,
                    RESERVED_TAG,
                    d,
                    immediate_len,
                    unsolicited_end,
                );
            }
        }
    }

    /// Sends a task management request and waits for its response code.
    async fn task_mgmt(
        &self,
        conn: &Arc<Conn>,
        function: u8,
        lun: u16,
        referenced: u32,
        refcmdsn: u32,
        expdatasn: u32,
    ) -> Result<u8> {
        let (guard, mut rx) = self.register(conn);
        let cmdsn = self.state.lock().unwrap().cmdsn;
        conn.send(Pdu::TaskMgmtRequest(TaskMgmtRequest {
            immediate: true,
            function,
            lun: lun_to_wire(lun),
            itt: guard.itt,
            referenced_task_tag: referenced,
            cmdsn,
            refcmdsn,
            expdatasn,
            ..TaskMgmtRequest::default()
        }));
        match tokio::time::timeout(Duration::from_secs(10), recv_pdu(&mut rx)).await {
            Ok(Some(Pdu::TaskMgmtResponse(r))) => Ok(r.response),
            Ok(_) => Err(Error::ConnectionLost {
                portal: conn.portal.clone(),
                why: "during task management".into(),
            }),
            Err(_) => Err(Error::Timeout("task management request".into())),
        }
    }

    fn update_window(&self, expcmdsn: u32, maxcmdsn: u32) {
        let mut st = self.state.lock().unwrap();
        // RFC 7143 4.2.2.1: MaxCmdSN < ExpCmdSN - 1 is invalid and ignored.
        if sn_lt(maxcmdsn, expcmdsn.wrapping_sub(1)) {
            return;
        }
        let mut opened = false;
        if sn_gt(expcmdsn, st.expcmdsn) {
            st.expcmdsn = expcmdsn;
        }
        if sn_gt(maxcmdsn, st.maxcmdsn) {
            st.maxcmdsn = maxcmdsn;
            opened = true;
        }
        drop(st);
        if opened {
            self.window.notify_waiters();
        }
    }

    fn route(&self, conn: &Arc<Conn>, itt: u32, pdu: Pdu, placed: usize) {
        let st = self.state.lock().unwrap();
        match st.tasks.get(&itt) {
            // Sending never blocks: it only queues and wakes the task.
            Some(t) => {
                t.tx.send(Routed {
                    pdu,
                    via: conn.clone(),
                    placed,
                });
            }
            None => {
                drop(st);
                tracing::debug!(itt, "{:?} for no known task", pdu.opcode())
            }
        }
    }

    /// Handles a PDU from the target; `placed` as in [`Routed`].
    fn dispatch(&self, conn: &Arc<Conn>, pdu: Pdu, placed: usize) {
        let window = match &pdu {
            Pdu::ScsiResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::DataIn(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, p.status_present)),
            Pdu::R2t(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, false)),
            Pdu::NopIn(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, p.itt != RESERVED_TAG)),
            Pdu::TaskMgmtResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::TextResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::LogoutResponse(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::AsyncMessage(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            Pdu::Reject(p) => Some((p.statsn, p.expcmdsn, p.maxcmdsn, true)),
            _ => None,
        };
        if let Some((statsn, exp, max, advances)) = window {
            if advances {
                conn.advance_statsn(statsn);
            }
            self.update_window(exp, max);
        }
        match pdu {
            Pdu::NopIn(p) => {
                if p.ttt != RESERVED_TAG {
                    // The target pings us: answer with its TTT and data (RFC 7143 11.18).
                    let cmdsn = self.state.lock().unwrap().cmdsn;
                    conn.send(Pdu::NopOut(NopOut {
                        immediate: true,
                        lun: p.lun,
                        itt: RESERVED_TAG,
                        ttt: p.ttt,
                        cmdsn,
                        expstatsn: 0,
                        data: p.data.clone(),
                    }));
                }
                if p.itt != RESERVED_TAG {
                    self.route(conn, p.itt, Pdu::NopIn(p), 0);
                }
            }
            Pdu::AsyncMessage(m) => match m.async_event {
                1..=3 => {
                    tracing::warn!(
                        cid = conn.cid,
                        "target asks to end the connection (async event {})",
                        m.async_event
                    );
                    conn.kill();
                }
                e => tracing::debug!(cid = conn.cid, "async event {e}"),
            },
            Pdu::Reject(r) => {
                if r.data.len() >= 20 {
                    let itt = u32::from_be_bytes(r.data[16..20].try_into().unwrap());
                    self.route(conn, itt, Pdu::Reject(r), 0);
                } else {
                    tracing::warn!("Reject without the rejected header");
                }
            }
            other => {
                let itt = other.itt();
                self.route(conn, itt, other, placed);
            }
        }
    }

    /// The buffer of the read that the Data-In `h` carries data for, taken out of its
    /// sink to read the segment into, when the segment is large, comes next in it and
    /// fits. `None`: decode the PDU as usual.
    fn sink_for(&self, h: &PeekedHeader) -> Option<(Arc<ReadSink>, Vec<u8>)> {
        if h.bhs[0] & 0x3f != Opcode::DataIn as u8
            || h.data_len < PLACE_MIN
            || !h.data_len.is_multiple_of(4)
        {
            return None;
        }
        let itt = u32::from_be_bytes(h.bhs[16..20].try_into().unwrap());
        let off = u32::from_be_bytes(h.bhs[40..44].try_into().unwrap()) as usize;
        let sink = self.state.lock().unwrap().tasks.get(&itt)?.sink.clone()?;
        if off + h.data_len > sink.edtl {
            return None;
        }
        let mut v = {
            let mut g = sink.buf.lock().unwrap();
            if g.as_ref().map(Vec::len) != Some(off) {
                return None;
            }
            g.take()?
        };
        if v.capacity() == 0 {
            v = sink.pool.take(sink.edtl);
        }
        Some((sink, v))
    }

    fn conn_failed(self: &Arc<Self>, conn: &Arc<Conn>, why: &str) {
        conn.kill();
        let mut st = self.state.lock().unwrap();
        if st.closed {
            return;
        }
        tracing::warn!(
            cid = conn.cid,
            "connection to {} failed: {why}",
            conn.portal
        );
        let current = conn.gen == st.gen && !st.losses.contains_key(&conn.serial);
        if current && st.params.error_recovery_level >= 2 {
            // ERL 2: its commands stay where they are until TASK REASSIGN moves them.
            st.tasks
                .retain(|_, t| t.serial != conn.serial || t.command.is_some());
            let (tx, rx) = watch::channel(Loss::Pending);
            st.losses.insert(conn.serial, rx);
            tokio::spawn(self.clone().reassign_connection(conn.clone(), tx));
            drop(st);
            self.window.notify_waiters();
            return;
        }
        st.tasks.retain(|_, t| t.serial != conn.serial);
        // Another connection of this session is still up: recover this one alone.
        let others = st
            .conns
            .iter()
            .any(|c| c.is_alive() && c.serial != conn.serial);
        if current && others {
            let (tx, rx) = watch::channel(Loss::Pending);
            st.losses.insert(conn.serial, rx);
            tokio::spawn(self.clone().recover_connection(conn.clone(), tx));
        }
        drop(st);
        self.window.notify_waiters();
    }
}

/// The Data-In payloads of one read: a prefix its reader placed in the read's own buffer
/// ([`ReadSink`]), and the others as the reader's copies of them. Nothing is zeroed or
/// copied again until the status arrives, and then only when segments were not placed.
#[derive(Default)]
struct ReadData {
    parts: Vec<(usize, Bytes)>,
    received: usize,
    sink: Option<Arc<ReadSink>>,
    /// Bytes of the sink, from offset 0, that the reader said it placed.
    placed: usize,
}

impl ReadData {
    /// The reader put `len` bytes at `off` into the sink: always where the previous
    /// placement ended.
    fn placed(&mut self, off: usize, len: usize) {
        self.placed = self.placed.max(off + len);
        self.received = self.received.max(off + len);
    }

    fn add(&mut self, off: usize, data: Bytes) {
        self.received = self.received.max(off + data.len());
        if !data.is_empty() {
            self.parts.push((off, data));
        }
    }

    /// The data of a read of `edtl` bytes with `residual` not sent: one payload is
    /// returned as it is, several in order are joined with a single copy; gaps (out of
    /// order, or less sent than the residual says) read as zeros.
    fn into_bytes(mut self, edtl: u32, residual: u32) -> Bytes {
        let len = self
            .received
            .max(edtl.saturating_sub(residual) as usize)
            .min(edtl as usize);
        if let Some(sink) = self.sink.take().filter(|_| self.placed > 0) {
            let mut v = sink.buf.lock().unwrap().take().unwrap_or_default();
            // What the task was told of (the reader puts the buffer back first).
            v.resize(self.placed, 0);
            if self.parts.is_empty() || v.len() >= len {
                v.resize(len, 0);
                return sink.pool.wrap(v);
            }
            self.parts.insert(0, (0, sink.pool.wrap(v)));
        }
        if let [(0, b)] = &self.parts[..] {
            if b.len() >= len {
                return b.slice(..len);
            }
        }
        let in_order = self
            .parts
            .iter()
            .try_fold(0, |pos, (off, b)| (*off == pos).then_some(pos + b.len()))
            .is_some();
        let mut out = BytesMut::with_capacity(len);
        if in_order {
            for (_, b) in &self.parts {
                out.extend_from_slice(&b[..b.len().min(len - out.len())]);
            }
            out.resize(len, 0);
        } else {
            out.resize(len, 0);
            for (off, b) in &self.parts {
                let end = (off + b.len()).min(len);
                if *off < end {
                    out[*off..end].copy_from_slice(&b[..end - off]);
                }
            }
        }
        out.freeze()
    }
}

async fn recv_pdu(rx: &mut inbox::Receiver<Routed>) -> Option<Pdu> {
    rx.recv().await.map(|r| r.pdu)
}

/// Data-Out PDUs for `data[off..end]`, each at most the target's MaxRecvDataSegmentLength.
fn send_data_out(conn: &Conn, lun: u64, itt: u32, ttt: u32, data: &Bytes, off: usize, end: usize) {
    for seg in ffp::data_out(off as u32..end as u32, conn.max_send_segment) {
        let at = seg.offset as usize;
        conn.send(Pdu::DataOut(DataOut {
            final_: seg.final_,
            lun,
            itt,
            ttt,
            expstatsn: 0,
            datasn: seg.datasn,
            buffer_offset: seg.offset,
            data: data.slice(at..at + seg.len as usize),
        }));
    }
}

/// Gives a PDU the reader decoded a data segment of its own. The decoder's segment is a
/// slice of the reader's buffer, and even an empty one holds a reference to it: while any
/// PDU handed to a task lives (a read's Data-In until its caller drops the data), the
/// buffer is shared, and each reserve in the reader then allocates a fresh one, whose
/// pages fault in as the socket fills them, and which the allocator gets from the kernel
/// with brk or mmap and gives back again. A small segment's copy lands in memory the
/// allocator just freed, still in the cache; large ones go to their read's buffer
/// ([`ReadSink`]) and do not come here unless out of order.
fn detach_data(pdu: &mut Pdu) {
    let data = match pdu {
        Pdu::NopOut(p) => &mut p.data,
        Pdu::ScsiCommand(p) => &mut p.data,
        Pdu::LoginRequest(p) => &mut p.data,
        Pdu::TextRequest(p) => &mut p.data,
        Pdu::DataOut(p) => &mut p.data,
        Pdu::NopIn(p) => &mut p.data,
        Pdu::ScsiResponse(p) => &mut p.data,
        Pdu::LoginResponse(p) => &mut p.data,
        Pdu::TextResponse(p) => &mut p.data,
        Pdu::DataIn(p) => &mut p.data,
        Pdu::AsyncMessage(p) => &mut p.data,
        Pdu::Reject(p) => &mut p.data,
        Pdu::TaskMgmtRequest(_)
        | Pdu::LogoutRequest(_)
        | Pdu::SnackRequest(_)
        | Pdu::TaskMgmtResponse(_)
        | Pdu::LogoutResponse(_)
        | Pdu::R2t(_) => return,
    };
    *data = Bytes::copy_from_slice(data);
}

/// Bytes of data a connection's reader hands to commands before it lets them run. Left
/// alone, it goes on until the socket is drained or tokio's budget runs out, which with a
/// target streaming 1 MiB reads is some 17 reads: 17 buffers filled before any caller
/// takes its data and frees its buffer, so each new read lands in memory long out of the
/// CPU's caches. Yielding once per 1 MiB lets the callers drop their data and the pool
/// hand the same few buffers out again: the kernel's copy into them, most of the
/// initiator's CPU time for large reads, got some 20 % cheaper per read on loopback.
const YIELD_BYTES: usize = 1 << 20;

/// How often a connection's reader samples TCP_INFO for auto-tuning.
const PATH_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

async fn reader(
    shared: Weak<Shared>,
    conn: Arc<Conn>,
    mut rd: Reader,
    mut buf: BytesMut,
    mut dec: PduDecoder,
    mut dead: watch::Receiver<bool>,
) {
    // The first read samples at once; later ones once per interval, so that the hot path
    // pays one clock read per socket read.
    let mut next_sample = Instant::now();
    let Some(epoch) = shared.upgrade().map(|s| s.epoch) else {
        return;
    };
    // After a segment was read into its command's buffer, the next read takes only the
    // next header, so that the segment after it (a read's next Data-In, typically) can go
    // straight to its place too rather than into `buf`.
    let header_only = BHS_LEN + if dec.digests().header { 4 } else { 0 };
    let mut read_limit = usize::MAX;
    // Data bytes handed to tasks since the reader last let them run.
    let mut moved = 0usize;
    let why: String = 'outer: loop {
        loop {
            let Some(s) = shared.upgrade() else { return };
            let h = match dec.peek_header(&buf) {
                Ok(h) => h,
                Err(e) => break 'outer format!("bad PDU from the target: {e}"),
            };
            if let Some((h, sink, mut v)) = h.and_then(|h| s.sink_for(&h).map(|(k, v)| (h, k, v))) {
                drop(s);
                let pdu = match dec.take_header(&mut buf, &h) {
                    Ok(p) => p,
                    Err(e) => {
                        *sink.buf.lock().unwrap() = Some(v);
                        break 'outer format!("bad PDU from the target: {e}");
                    }
                };
                let committed = v.len();
                let have = buf.len().min(h.data_len);
                v.extend_from_slice(&buf[..have]);
                buf.advance(have);
                let rest = h.data_len - have;
                let r = if rest > 0 {
                    read_limit = header_only;
                    tokio::select! {
                        r = rd.read_exact_into(&mut v, rest) => r.map_err(|e| e.to_string()),
                        _ = dead.changed() => Err("closed".to_owned()),
                    }
                } else {
                    Ok(())
                };
                if r.is_err() {
                    v.truncate(committed);
                }
                *sink.buf.lock().unwrap() = Some(v);
                if let Err(why) = r {
                    break 'outer why;
                }
                match shared.upgrade() {
                    Some(s) => s.dispatch(&conn, pdu, h.data_len),
                    None => return,
                }
                // The tasks this reader woke run now and then (see YIELD_BYTES).
                moved += h.data_len;
                if moved >= YIELD_BYTES {
                    moved = 0;
                    tokio::task::yield_now().await;
                }
                continue;
            }
            match dec.decode(&mut buf) {
                Ok(Some(mut pdu)) => {
                    moved += pdu.data().len();
                    detach_data(&mut pdu);
                    s.dispatch(&conn, pdu, 0);
                    if moved >= YIELD_BYTES {
                        moved = 0;
                        drop(s);
                        tokio::task::yield_now().await;
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer format!("bad PDU from the target: {e}"),
            }
        }
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        let mut dst = (&mut buf).limit(std::mem::replace(&mut read_limit, usize::MAX));
        tokio::select! {
            r = rd.fill(&mut dst) => match r {
                Ok(0) => break "closed by the target".to_owned(),
                Ok(_) => {
                    let now = Instant::now();
                    conn.last_rx_ms
                        .store(now.duration_since(epoch).as_millis() as u64, Ordering::Relaxed);
                    if now >= next_sample {
                        if let Some(s) = shared.upgrade() {
                            next_sample = now + s.sample_every();
                            s.observe(&conn, &rd);
                        }
                    }
                }
                Err(e) => break e.to_string(),
            },
            _ = dead.changed() => break "closed".to_owned(),
        }
    };
    if let Some(s) = shared.upgrade() {
        s.conn_failed(&conn, &why);
    }
}

/// Pings idle connections with NOP-Out; one that does not answer is dropped (and the
/// session recovered by the next command that needs it).
async fn keepalive(shared: Weak<Shared>) {
    loop {
        let interval = match shared.upgrade() {
            Some(s) => s.opts.nop_interval,
            None => return,
        };
        tokio::time::sleep(interval / 2).await;
        let Some(s) = shared.upgrade() else { return };
        let (conns, closed) = {
            let st = s.state.lock().unwrap();
            (st.conns.clone(), st.closed)
        };
        if closed {
            return;
        }
        let now = s.epoch.elapsed().as_millis() as u64;
        for c in conns {
            let idle = now.saturating_sub(c.last_rx_ms.load(Ordering::Relaxed));
            if !c.is_alive()
                || idle < interval.as_millis() as u64
                || c.pinging.swap(true, Ordering::AcqRel)
            {
                continue;
            }
            let s2 = s.clone();
            tokio::spawn(async move {
                let (guard, mut rx) = s2.register(&c);
                let cmdsn = s2.state.lock().unwrap().cmdsn;
                c.send(Pdu::NopOut(NopOut {
                    immediate: true,
                    lun: 0,
                    itt: guard.itt,
                    ttt: RESERVED_TAG,
                    cmdsn,
                    expstatsn: 0,
                    data: Bytes::new(),
                }));
                let timeout = (interval * 2).max(Duration::from_secs(5));
                match tokio::time::timeout(timeout, rx.recv()).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {}
                    Err(_) => {
                        tracing::warn!(
                            cid = c.cid,
                            "no answer to NOP-Out; dropping the connection"
                        );
                        c.kill();
                    }
                }
                drop(guard);
                c.pinging.store(false, Ordering::Release);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_data_assembly() {
        let whole = ReadData {
            parts: vec![(0, Bytes::from_static(b"abcd"))],
            received: 4,
            ..ReadData::default()
        };
        assert_eq!(&whole.into_bytes(4, 0)[..], b"abcd");
        let mut parts = ReadData::default();
        parts.add(0, Bytes::from_static(b"ab"));
        parts.add(2, Bytes::from_static(b"cd"));
        assert_eq!(&parts.into_bytes(6, 0)[..], b"abcd\0\0");
        let mut shuffled = ReadData::default();
        shuffled.add(2, Bytes::from_static(b"cd"));
        shuffled.add(0, Bytes::from_static(b"ab"));
        assert_eq!(&shuffled.into_bytes(8, 4)[..], b"abcd");
    }

    #[test]
    fn read_data_with_a_placed_prefix() {
        let pool = Arc::new(BufPool::default());
        let sink = |placed: &[u8]| {
            Arc::new(ReadSink {
                edtl: 8,
                buf: Mutex::new(Some(placed.to_vec())),
                pool: pool.clone(),
            })
        };
        // Placed, then a segment that was not: joined.
        let mut d = ReadData {
            sink: Some(sink(b"abcd")),
            ..ReadData::default()
        };
        d.placed(0, 4);
        d.add(4, Bytes::from_static(b"efgh"));
        assert_eq!(&d.into_bytes(8, 0)[..], b"abcdefgh");
        // All placed: the buffer itself, which goes back to the pool when dropped.
        let mut d = ReadData {
            sink: Some(sink(b"abcdefgh")),
            ..ReadData::default()
        };
        d.placed(0, 4);
        d.placed(4, 4);
        let b = d.into_bytes(8, 0);
        assert_eq!(&b[..], b"abcdefgh");
        assert_eq!(pool.free.lock().unwrap().len(), 1);
        drop(b);
        assert_eq!(pool.free.lock().unwrap().len(), 2);
        assert!(pool.take(8).capacity() >= 8);
        // Less sent than expected: what the reader placed, no more.
        let mut d = ReadData {
            sink: Some(sink(b"abcdef")),
            ..ReadData::default()
        };
        d.placed(0, 6);
        assert_eq!(&d.into_bytes(8, 2)[..], b"abcdef");
    }
}
