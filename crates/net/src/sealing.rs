//! Sealing TLS records off the sender's thread, and writing them in order.
//!
//! A loopback read is bound by the target's connection thread: the kernel's TCP send
//! takes most of a core, and sealing each record took the rest (`docs/bench-tls.md`).
//! TLS 1.3's nonce is the IV XOR the record's sequence number (RFC 8446 5.3), so a record
//! can be sealed anywhere once its number is known. The sender ([`crate::tlsconn`]'s
//! `Tx`) numbers the records of a large write in order ([`plan`], then
//! `record::Sealer::reserve`), hands them as [`Job`]s to a small pool of sealing threads
//! shared by every connection of the process, and keeps an [`Outbox`]: the connection's
//! records as an ordered queue of segments, each sealed already (small writes, PDU
//! headers, KeyUpdate, close_notify: sealed on the sender's thread, which costs less than
//! the hand-over) or still being sealed; the socket takes the front segment once it is
//! sealed, so records leave in the order of their numbers whoever sealed them.
//!
//! Bounds: a connection holds at most [`MAX_SEGMENTS`] segments of [`SEGMENT`] bytes
//! (1 MiB of records, as before the pool); the sender takes no more plaintext until the
//! socket has taken the front one. A job owns clones of the caller's `Bytes` (a store's
//! lent pages among them) only until it is sealed. A job that fails ends the connection
//! with the cipher's error; a pool that cannot start threads seals on the caller's thread.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::oneshot;

use crate::record::{self, RecordError, SealKey};

/// One segment's buffer: 256 KiB of plaintext in whole records, with room to spare.
pub const SEGMENT: usize = (256 << 10) + (8 << 10);
/// Segments a connection holds at most, sealed or being sealed.
pub const MAX_SEGMENTS: usize = 4;
/// A piece at least this long is sealed from where it lies; shorter ones are gathered.
pub const DIRECT_MIN: usize = 4096;
/// Segments written to the socket in one `writev` at most.
const WRITEV_SEGMENTS: usize = MAX_SEGMENTS;

/// One record of a plan: its spans (a range of [`Plan::spans`]) and plaintext length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRecord {
    pub spans: std::ops::Range<usize>,
    pub len: usize,
}

/// Records over a run of the caller's pieces: which bytes each record holds.
#[derive(Debug, Default)]
pub struct Plan {
    /// The plaintext in order, each span a slice of one piece.
    pub spans: Vec<Bytes>,
    pub records: Vec<PlannedRecord>,
    /// Plaintext bytes the plan covers.
    pub taken: usize,
}

impl Plan {
    /// Bytes of records the plan seals into.
    pub fn sealed_len(&self) -> usize {
        self.taken + self.records.len() * record::OVERHEAD
    }
}

/// Plans records over `pieces` from piece `*i` at offset `*off` (both moved on past what
/// the plan takes), whole records only, at most `cap` bytes of them: a piece's run of
/// [`DIRECT_MIN`] bytes or more is sealed from where it lies, record by record; shorter
/// pieces (PDU headers, small payloads) are gathered into one record, up to the next long
/// piece. Pure: the same pieces give the same records, numbered by the caller.
pub fn plan(pieces: &[Bytes], i: &mut usize, off: &mut usize, cap: usize) -> Plan {
    let mut p = Plan::default();
    let mut room = cap;
    while *i < pieces.len() {
        let cur = &pieces[*i];
        if *off == cur.len() {
            (*i, *off) = (*i + 1, 0);
            continue;
        }
        if room < record::OVERHEAD + 1 {
            break;
        }
        let max = record::MAX_PLAINTEXT.min(room - record::OVERHEAD);
        let first = p.spans.len();
        let mut len = 0;
        if cur.len() - *off >= DIRECT_MIN.min(max) {
            let n = (cur.len() - *off).min(max);
            p.spans.push(cur.slice(*off..*off + n));
            *off += n;
            len = n;
        } else {
            while len < max && *i < pieces.len() {
                let cur = &pieces[*i];
                let rest = cur.len() - *off;
                if rest == 0 {
                    (*i, *off) = (*i + 1, 0);
                    continue;
                }
                if len > 0 && rest >= DIRECT_MIN {
                    break;
                }
                let k = rest.min(max - len);
                p.spans.push(cur.slice(*off..*off + k));
                (len, *off) = (len + k, *off + k);
            }
        }
        p.records.push(PlannedRecord {
            spans: first..p.spans.len(),
            len,
        });
        p.taken += len;
        room -= len + record::OVERHEAD;
    }
    p
}

/// Seals the records of `plan`, numbered from `first`, into the front of `out` (which
/// must hold [`Plan::sealed_len`] bytes); the bytes written.
pub fn seal_plan(
    key: &SealKey,
    first: u64,
    plan: &Plan,
    out: &mut [u8],
) -> Result<usize, RecordError> {
    let mut at = 0;
    for (k, r) in plan.records.iter().enumerate() {
        let seq = first + k as u64;
        let spans = &plan.spans[r.spans.clone()];
        at += if let [one] = spans {
            key.seal(seq, record::APPLICATION_DATA, one, &mut out[at..])?
        } else {
            let mut n = at + record::HEADER_LEN;
            for s in spans {
                out[n..n + s.len()].copy_from_slice(s);
                n += s.len();
            }
            key.seal_in_place(seq, record::APPLICATION_DATA, r.len, &mut out[at..])?
        };
    }
    Ok(at)
}

/// What a job gives back: its buffer and the length of the records in it.
type Sealed = Result<(Box<[u8]>, usize), RecordError>;

/// Records to seal off the sender's thread.
pub struct Job {
    key: Arc<SealKey>,
    first: u64,
    plan: Plan,
    out: Box<[u8]>,
    done: oneshot::Sender<Sealed>,
}

impl Job {
    /// Seals, lets go of the plaintext, and tells the sender (gone: nothing to tell).
    fn run(self) {
        let Job {
            key,
            first,
            plan,
            mut out,
            done,
        } = self;
        let r = seal_plan(&key, first, &plan, &mut out);
        drop(plan);
        let _ = done.send(r.map(|n| (out, n)));
    }
}

/// The process's sealing threads: one per core, fed from one queue.
struct Pool {
    queue: Mutex<mpsc::Sender<Job>>,
}

fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for k in 0..n {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rsv-seal{k}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(j) => j.run(),
                        Err(_) => return,
                    }
                });
            started += spawned.is_ok() as usize;
        }
        (started > 0).then(|| Pool {
            queue: Mutex::new(tx),
        })
    })
    .as_ref()
}

/// Hands `job` to the pool, or seals it here when there is none.
fn submit(job: Job) {
    let job = match pool() {
        Some(p) => match p.queue.lock().unwrap_or_else(|e| e.into_inner()).send(job) {
            Ok(()) => return,
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    job.run();
}

enum Segment {
    Sealed {
        buf: Box<[u8]>,
        start: usize,
        end: usize,
    },
    Sealing(oneshot::Receiver<Sealed>),
}

/// A connection's records in the order of their numbers, sealed or being sealed, until
/// the socket takes them.
pub struct Outbox {
    segments: VecDeque<Segment>,
    /// Buffers of sent segments, for the next ones.
    free: Vec<Box<[u8]>>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Outbox({} segments)", self.segments.len())
    }
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox::new()
    }
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox {
            segments: VecDeque::with_capacity(MAX_SEGMENTS),
            free: Vec::with_capacity(MAX_SEGMENTS),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    fn buffer(&mut self) -> Box<[u8]> {
        self.free
            .pop()
            .unwrap_or_else(|| vec![0u8; SEGMENT].into_boxed_slice())
    }

    /// Room for records of `n` bytes sealed here: the last segment's free tail, or a new
    /// segment when the bounds allow one; `None` when the socket must take some first.
    /// The caller seals into the slice and [`Outbox::commit`]s what it wrote.
    pub fn tail(&mut self, n: usize) -> Option<&mut [u8]> {
        assert!(n <= SEGMENT);
        let fits = matches!(self.segments.back(), Some(Segment::Sealed { buf, end, .. }) if buf.len() - end >= n);
        if !fits {
            if self.segments.len() >= MAX_SEGMENTS {
                return None;
            }
            let buf = self.buffer();
            self.segments.push_back(Segment::Sealed {
                buf,
                start: 0,
                end: 0,
            });
        }
        match self.segments.back_mut() {
            Some(Segment::Sealed { buf, end, .. }) => Some(&mut buf[*end..]),
            _ => unreachable!("a sealed segment is last"),
        }
    }

    /// Free bytes after the last segment's records (0 when it is being sealed).
    pub fn tail_room(&self) -> usize {
        match self.segments.back() {
            Some(Segment::Sealed { buf, end, .. }) => buf.len() - end,
            _ => 0,
        }
    }

    /// `n` bytes of records written into the slice [`Outbox::tail`] gave.
    pub fn commit(&mut self, n: usize) {
        match self.segments.back_mut() {
            Some(Segment::Sealed { end, .. }) => *end += n,
            _ => unreachable!("commit after tail"),
        }
    }

    /// Whether a segment sealed elsewhere may be queued now.
    pub fn has_room(&self) -> bool {
        self.segments.len() < MAX_SEGMENTS
    }

    /// Queues the records of `plan` (as many as [`SEGMENT`] holds), numbered from
    /// `first` under `key`, to be sealed off this thread.
    pub fn seal_elsewhere(&mut self, key: Arc<SealKey>, first: u64, plan: Plan) {
        assert!(self.has_room() && plan.sealed_len() <= SEGMENT);
        let (done, rx) = oneshot::channel();
        let out = self.buffer();
        self.segments.push_back(Segment::Sealing(rx));
        submit(Job {
            key,
            first,
            plan,
            out,
            done,
        });
    }

    /// Writes records to `io`, in order, until none is left or the socket is full or the
    /// front segment is still being sealed.
    pub fn poll_send<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            // The front segment sealed?
            if let Some(Segment::Sealing(rx)) = self.segments.front_mut() {
                let (buf, n) = match ready!(Pin::new(rx).poll(cx)) {
                    Ok(Ok(sealed)) => sealed,
                    Ok(Err(e)) => return Poll::Ready(Err(crate::tlsconn::record_error(e))),
                    Err(_) => {
                        return Poll::Ready(Err(io::Error::other(
                            "TLS: a sealing thread ended without sealing its records",
                        )))
                    }
                };
                self.segments[0] = Segment::Sealed {
                    buf,
                    start: 0,
                    end: n,
                };
            }
            // Every sealed segment from the front, in one write.
            let mut slices = [io::IoSlice::new(&[]); WRITEV_SEGMENTS];
            let mut count = 0;
            for s in self.segments.iter().take(WRITEV_SEGMENTS) {
                match s {
                    Segment::Sealed { buf, start, end } if start < end => {
                        slices[count] = io::IoSlice::new(&buf[*start..*end]);
                        count += 1;
                    }
                    Segment::Sealed { .. } => {}
                    Segment::Sealing(_) => break,
                }
            }
            if count == 0 {
                // Nothing sealed to send: drop empty segments (keeping the last buffer
                // for the next records), or wait on the one being sealed.
                match self.segments.front() {
                    None => return Poll::Ready(Ok(())),
                    Some(Segment::Sealing(_)) => continue,
                    Some(Segment::Sealed { .. }) if self.segments.len() == 1 => {
                        if let Some(Segment::Sealed { start, end, .. }) = self.segments.front_mut()
                        {
                            (*start, *end) = (0, 0);
                        }
                        return Poll::Ready(Ok(()));
                    }
                    Some(Segment::Sealed { .. }) => {
                        self.recycle_front();
                        continue;
                    }
                }
            }
            let mut n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            // Move past what the socket took, freeing the segments it emptied (but the
            // last, which the next records may fill).
            while n > 0 {
                let last = self.segments.len() == 1;
                let Some(Segment::Sealed { start, end, .. }) = self.segments.front_mut() else {
                    unreachable!("only sealed segments were written");
                };
                let k = n.min(*end - *start);
                *start += k;
                n -= k;
                if *start == *end {
                    if last {
                        (*start, *end) = (0, 0);
                    } else {
                        self.recycle_front();
                    }
                }
            }
        }
    }

    fn recycle_front(&mut self) {
        if let Some(Segment::Sealed { buf, .. }) = self.segments.pop_front() {
            self.free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Opener;
    use ring::aead;

    fn suite(which: u8) -> (&'static aead::Algorithm, usize) {
        match which {
            0 => (&aead::AES_128_GCM, 16),
            1 => (&aead::AES_256_GCM, 32),
            _ => (&aead::CHACHA20_POLY1305, 32),
        }
    }

    fn key(which: u8) -> Arc<SealKey> {
        let (alg, len) = suite(which);
        Arc::new(SealKey::for_tests(alg, &[which + 3; 32][..len], &[9; 12]))
    }

    fn opener(which: u8, seq: u64) -> Opener {
        let (alg, len) = suite(which);
        Opener::for_tests(alg, &[which + 3; 32][..len], &[9; 12], seq)
    }

    fn pattern(len: usize, seed: usize) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|i| ((i * 7 + seed) % 251) as u8)
                .collect::<Vec<_>>(),
        )
    }

    /// Opens every record of `wire` in order from `seq`: the plaintext, and the number
    /// of records.
    fn open_all(which: u8, seq: u64, wire: &mut [u8]) -> (Vec<u8>, u64) {
        let mut o = opener(which, seq);
        let (mut at, mut plain, mut n) = (0, Vec::new(), 0);
        while at < wire.len() {
            let len = record::record_len(&wire[at..]).unwrap().unwrap();
            let (t, r) = o.open(&mut wire[at..at + len]).unwrap();
            assert_eq!(t, record::APPLICATION_DATA);
            plain.extend_from_slice(&wire[at..][r]);
            (at, n) = (at + len, n + 1);
        }
        (plain, n)
    }

    /// PDU-like pieces: a 48-byte header, then a payload, over and over.
    fn pdus() -> Vec<Bytes> {
        let mut v = Vec::new();
        for (k, len) in [65536usize, 100, 0, 8192, 3000, 1 << 20, 5]
            .into_iter()
            .enumerate()
        {
            v.push(pattern(48, k));
            v.push(pattern(len, k + 100));
        }
        v
    }

    #[test]
    fn plans_take_whole_records_within_the_cap_and_every_byte_once() {
        let pieces = pdus();
        let all: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let (mut i, mut off, mut got) = (0, 0, Vec::new());
        while i < pieces.len() {
            let p = plan(&pieces, &mut i, &mut off, SEGMENT);
            assert!(p.taken > 0 && p.sealed_len() <= SEGMENT);
            for r in &p.records {
                assert!(r.len >= 1 && r.len <= record::MAX_PLAINTEXT);
                let spans = &p.spans[r.spans.clone()];
                assert_eq!(spans.iter().map(|s| s.len()).sum::<usize>(), r.len);
                // A long run is sealed from where it lies, alone.
                if spans.iter().any(|s| s.len() >= DIRECT_MIN) {
                    assert_eq!(spans.len(), 1);
                }
            }
            got.extend(p.spans.iter().flat_map(|s| s.iter().copied()));
        }
        assert!(got == all);
        // A cap too small for one record takes nothing.
        let (mut i, mut off) = (0, 0);
        assert_eq!(plan(&pieces, &mut i, &mut off, record::OVERHEAD).taken, 0);
        assert_eq!((i, off), (0, 0));
    }

    /// Segments sealed on other threads, each numbered ahead, come out as one stream of
    /// records that opens in order; a segment opened from a wrong number does not.
    #[test]
    fn records_sealed_elsewhere_open_in_the_order_of_their_numbers() {
        for which in 0..3 {
            let k = key(which);
            let pieces = pdus();
            let all: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            let (mut i, mut off, mut seq) = (0, 0, 7u64);
            let mut ob = Outbox::new();
            let mut wire = Vec::new();
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            while i < pieces.len() {
                if !ob.has_room() {
                    rt.block_on(std::future::poll_fn(|cx| ob.poll_send(&mut wire, cx)))
                        .unwrap();
                }
                let p = plan(&pieces, &mut i, &mut off, SEGMENT);
                let n = p.records.len() as u64;
                ob.seal_elsewhere(k.clone(), seq, p);
                seq += n;
                let _ = ob.poll_send(&mut wire, &mut cx);
            }
            rt.block_on(std::future::poll_fn(|cx| ob.poll_send(&mut wire, cx)))
                .unwrap();
            assert!(ob.segments.len() <= 1);
            let (plain, n) = open_all(which, 7, &mut wire.clone());
            assert!(plain == all);
            assert_eq!(n, seq - 7);
            let mut o = opener(which, 8);
            let len = record::record_len(&wire).unwrap().unwrap();
            assert_eq!(o.open(&mut wire[..len]), Err(RecordError::Decrypt));
        }
    }

    /// Records sealed here (the tail) and elsewhere interleave in the order queued.
    #[test]
    fn records_sealed_here_and_elsewhere_keep_their_order() {
        let k = key(0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut ob = Outbox::new();
        let mut seq = 0u64;
        let mut expect = Vec::new();
        let here = |ob: &mut Outbox, seq: &mut u64, text: &[u8]| {
            let out = ob.tail(text.len() + record::OVERHEAD).unwrap();
            let n = k.seal(*seq, record::APPLICATION_DATA, text, out).unwrap();
            ob.commit(n);
            *seq += 1;
        };
        here(&mut ob, &mut seq, b"first");
        expect.extend_from_slice(b"first");
        let big = [pattern(200 << 10, 1)];
        let (mut i, mut off) = (0, 0);
        let p = plan(&big, &mut i, &mut off, SEGMENT);
        let n = p.records.len() as u64;
        ob.seal_elsewhere(k.clone(), seq, p);
        seq += n;
        expect.extend_from_slice(&big[0]);
        here(&mut ob, &mut seq, b"after");
        expect.extend_from_slice(b"after");
        let mut wire = Vec::new();
        rt.block_on(std::future::poll_fn(|cx| ob.poll_send(&mut wire, cx)))
            .unwrap();
        let (plain, records) = open_all(0, 0, &mut wire);
        assert!(plain == expect);
        assert_eq!(records, seq);
    }

    /// A socket that takes nothing: the outbox holds at most its bound, and says so.
    #[test]
    fn a_socket_that_takes_nothing_stops_the_sender_at_the_bound() {
        struct Stuck;
        impl AsyncWrite for Stuck {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &[u8],
            ) -> Poll<io::Result<usize>> {
                Poll::Pending
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Pending
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Pending
            }
        }
        let k = key(2);
        let pieces = [pattern(4 << 20, 3)];
        let (mut i, mut off, mut seq) = (0, 0, 0u64);
        let mut ob = Outbox::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut queued = 0;
        while ob.has_room() {
            let p = plan(&pieces, &mut i, &mut off, SEGMENT);
            queued += p.taken;
            let n = p.records.len() as u64;
            ob.seal_elsewhere(k.clone(), seq, p);
            seq += n;
        }
        assert_eq!(ob.segments.len(), MAX_SEGMENTS);
        assert!(queued <= MAX_SEGMENTS * SEGMENT);
        assert!(ob.tail(100).is_none());
        // The sealed records wait for the socket, however long it is polled.
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(ob.poll_send(&mut Stuck, &mut cx).is_pending());
        }
        assert!(!ob.has_room());
    }

    /// A job whose sealing thread is gone ends the connection with one error, never a
    /// wrong stream.
    #[test]
    fn a_job_that_never_comes_back_is_an_error() {
        let mut ob = Outbox::new();
        let (done, rx) = oneshot::channel::<Sealed>();
        ob.segments.push_back(Segment::Sealing(rx));
        drop(done);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut wire = Vec::new();
        let Poll::Ready(Err(e)) = ob.poll_send(&mut wire, &mut cx) else {
            panic!("no error")
        };
        assert!(e.to_string().contains("sealing thread"), "{e}");
        assert!(wire.is_empty());
        // A cipher's refusal reaches the sender as TLS's error.
        let mut ob = Outbox::new();
        let (done, rx) = oneshot::channel::<Sealed>();
        ob.segments.push_back(Segment::Sealing(rx));
        done.send(Err(RecordError::Seal)).unwrap();
        let Poll::Ready(Err(e)) = ob.poll_send(&mut wire, &mut cx) else {
            panic!("no error")
        };
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(wire.is_empty());
    }
}
