//! A LUN addressed in bytes: what a copy, a FUSE file or a remote volume member needs
//! from a block device, on top of [`Session`]'s block commands.
//!
//! Offsets and lengths are bytes. They become READ/WRITE (16) of the blocks that cover
//! them; a request longer than the target's maximum transfer length (Block Limits VPD)
//! becomes several commands, issued together. Writes that start or end inside a block
//! read that block, patch it and write it back (read-modify-write), one such write at a
//! time per `Lun`: two writes of different bytes of one block must not both write back
//! the old copy of the other's bytes. Whole-block writes take no lock; a caller writing
//! the same bytes twice at once gets one of the two, as from a disk.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use scsi_proto::cdb;

use crate::scsi::{self, Capacity, LbaStatus, Provisioning};
use crate::{DataDir, Error, IscsiUrl, Result, Session, SessionOptions};

/// A logical unit of a session, read and written at byte offsets. Clones share the
/// session and the read-modify-write lock.
#[derive(Clone)]
pub struct Lun {
    session: Session,
    lun: u16,
    capacity: Capacity,
    limits: Limits,
    rmw: Arc<tokio::sync::Mutex<()>>,
}

/// The target's limits in blocks, with "none reported" already replaced by what a
/// command can express.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_transfer: u64,
    max_unmap: u64,
    max_unmap_descriptors: usize,
    max_write_same: u64,
}

/// A run of bytes with one provisioning status (from GET LBA STATUS).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LbaExtent {
    pub offset: u64,
    pub len: u64,
    pub status: Provisioning,
}

impl Lun {
    /// Opens LUN `lun` of `session`: READ CAPACITY and the Block Limits VPD page. A
    /// target without that page (or refusing it) is taken to have no limits.
    ///
    /// The commands go out together, in one round trip where one after the other took
    /// four on a long path. TEST UNIT READY goes first (the lowest CmdSN) to take the
    /// unit attention a new I_T nexus holds, which READ CAPACITY would otherwise get and
    /// repeat (INQUIRY never reports one). The Block Limits page is asked for at once;
    /// it counts only if the supported-pages list names it.
    pub async fn open(session: Session, lun: u16) -> Result<Lun> {
        let (_, capacity, pages, b0) = tokio::join!(
            session.absorb_unit_attention(lun),
            session.read_capacity(lun),
            session.vpd(lun, 0),
            session.vpd(lun, 0xb0),
        );
        let capacity = capacity?;
        let b0 = match pages {
            Ok(pages) if supported_vpd_pages(&pages).contains(&0xb0) => {
                b0.ok().and_then(|p| scsi::parse_vpd_b0(&p))
            }
            _ => None,
        };
        let b0 = b0.unwrap_or_default();
        let bs = u64::from(capacity.block_size);
        // A READ's expected length is a u32 of bytes.
        let max_command = u64::from(u32::MAX) / bs;
        let or_max = |v: u64| {
            if v == 0 {
                max_command
            } else {
                v.min(max_command)
            }
        };
        let limits = Limits {
            max_transfer: or_max(u64::from(b0.max_transfer_blocks)),
            max_unmap: or_max(u64::from(b0.max_unmap_blocks)),
            // The parameter list length is 16 bits: at most 4095 descriptors.
            max_unmap_descriptors: (b0.max_unmap_descriptors as usize).clamp(1, 4095),
            max_write_same: or_max(b0.max_write_same_blocks),
        };
        Ok(Lun {
            session,
            lun,
            capacity,
            limits,
            rmw: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// Logs in to the target of `url` and opens its LUN.
    pub async fn open_url(url: &IscsiUrl, opts: &SessionOptions) -> Result<Lun> {
        let lun = url.lun_required()?;
        let session = Session::connect(url, opts).await?;
        match Lun::open(session.clone(), lun).await {
            Ok(l) => Ok(l),
            Err(e) => {
                let _ = session.logout().await;
                Err(e)
            }
        }
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn lun(&self) -> u16 {
        self.lun
    }

    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    pub fn block_size(&self) -> u32 {
        self.capacity.block_size
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.capacity.bytes()
    }

    /// The most one command moves; longer requests are split at multiples of it.
    pub fn max_transfer_bytes(&self) -> u64 {
        self.limits.max_transfer * self.bs()
    }

    fn bs(&self) -> u64 {
        u64::from(self.capacity.block_size)
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(Error::OutOfRange {
                lun: self.lun,
                offset,
                len,
                size: self.size(),
            }),
        }
    }

    /// Reads `len` bytes at `offset`. A read of whole blocks within the maximum transfer
    /// length returns the session's buffer as it is (no copy); a split one is joined.
    pub async fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        self.check(offset, len as u64)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let span = covering(offset, len as u64, self.bs());
        if span.count <= self.limits.max_transfer {
            let data = self
                .session
                .read(self.lun, span.first, span.count as u32)
                .await?;
            return Ok(data.slice(span.head..span.head + len));
        }
        // Boxed: a read longer than the maximum transfer length is rare, and its
        // future (the commands' join) is larger than the one command's above.
        let pieces = Box::pin(self.read_blocks(span.first, span.count)).await?;
        let mut out = BytesMut::with_capacity(len);
        gather(&pieces, span.head, len, |part| out.extend_from_slice(part));
        Ok(out.freeze())
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub async fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let span = covering(offset, buf.len() as u64, self.bs());
        let pieces = self.read_blocks(span.first, span.count).await?;
        let mut at = 0;
        gather(&pieces, span.head, buf.len(), |part| {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        });
        Ok(())
    }

    /// Writes `data` at `offset`; partial blocks at either end are read, patched and
    /// written back.
    pub async fn write_at(&self, offset: u64, data: Bytes) -> Result<()> {
        self.write(offset, data, false).await
    }

    /// [`Lun::write_at`] of a borrowed buffer (copied once).
    pub async fn write_slice_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, Bytes::copy_from_slice(data), false)
            .await
    }

    /// [`Lun::write_at`] with Force Unit Access: done once the data is on the target's
    /// stable storage, without flushing anything else.
    pub async fn write_fua(&self, offset: u64, data: Bytes) -> Result<()> {
        self.write(offset, data, true).await
    }

    /// Whether [`Lun::write_compressed`] can carry `len` bytes at `offset`: whole blocks,
    /// in one command.
    pub fn compressible(&self, offset: u64, len: u64) -> bool {
        let bs = self.bs();
        offset.is_multiple_of(bs)
            && len.is_multiple_of(bs)
            && len > 0
            && len / bs <= self.limits.max_transfer
    }

    /// Writes the `len` bytes at `offset` that `frame` (one zstd frame) holds, with
    /// Reservoir's WRITE COMPRESSED (16): the target decompresses. Only whole blocks in one
    /// command ([`Lun::compressible`]). A target that is not Reservoir's refuses it with
    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE ([`Error::Scsi`]).
    pub async fn write_compressed(
        &self,
        offset: u64,
        len: u64,
        frame: Bytes,
        fua: bool,
    ) -> Result<()> {
        self.check(offset, len)?;
        if !self.compressible(offset, len) {
            return Err(Error::Protocol(format!(
                "a compressed write of {len} bytes at {offset} is not whole blocks in one command"
            )));
        }
        let cdb = cdb::write_compressed16(offset / self.bs(), (len / self.bs()) as u32, fua);
        self.session
            .command_ok(self.lun, &cdb, DataDir::Write(frame))
            .await
            .map(drop)
    }

    /// SYNCHRONIZE CACHE: every write acknowledged so far is on stable storage.
    pub async fn flush(&self) -> Result<()> {
        self.session.sync_cache(self.lun).await
    }

    /// Deallocates the whole blocks inside `[offset, offset + len)` (UNMAP). Bytes of
    /// partial blocks at the edges are left as they are: unmapping says the data is no
    /// longer needed, it does not promise zeros (see [`Lun::write_zeroes`]).
    pub async fn unmap(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        let bs = self.bs();
        let (first, end) = (offset.div_ceil(bs), (offset + len) / bs);
        if end <= first {
            return Ok(());
        }
        let ranges: Vec<(u64, u32)> = runs(first, end - first, self.limits.max_unmap)
            .map(|(lba, n)| (lba, n as u32))
            .collect();
        let jobs = ranges.chunks(self.limits.max_unmap_descriptors).map(|r| {
            let (s, lun) = (self.session.clone(), self.lun);
            let (cdb, params) = cdb::unmap(r);
            async move {
                s.command_ok(lun, &cdb, DataDir::Write(params.into()))
                    .await
                    .map(drop)
            }
        });
        all(jobs.collect()).await.map(drop)
    }

    /// Makes `[offset, offset + len)` read as zeros: WRITE SAME (16) of a zero block for
    /// the whole blocks, read-modify-write for partial ones.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        let bs = self.bs();
        let end = offset + len;
        let (first, last) = (offset.div_ceil(bs), end / bs);
        if last <= first {
            return self
                .write(offset, Bytes::from(vec![0; len as usize]), false)
                .await;
        }
        let zero = Bytes::from(vec![0u8; bs as usize]);
        let mut jobs: Vec<BoxedJob<()>> = runs(first, last - first, self.limits.max_write_same)
            .map(|(lba, n)| {
                let (s, lun, zero) = (self.session.clone(), self.lun, zero.clone());
                let cdb = cdb::write_same16(lba, n as u32);
                Box::pin(async move {
                    s.command_ok(lun, &cdb, DataDir::Write(zero))
                        .await
                        .map(drop)
                }) as BoxedJob<()>
            })
            .collect();
        for (at, n) in [(offset, first * bs - offset), (last * bs, end - last * bs)] {
            if n > 0 {
                let me = self.clone();
                jobs.push(Box::pin(async move {
                    me.write(at, Bytes::from(vec![0; n as usize]), false).await
                }));
            }
        }
        all(jobs).await.map(drop)
    }

    /// Which parts of `[offset, offset + len)` are mapped, deallocated or anchored, in
    /// order, clipped to the range (GET LBA STATUS, as many as it takes).
    pub async fn get_lba_status(&self, offset: u64, len: u64) -> Result<Vec<LbaExtent>> {
        self.check(offset, len)?;
        let bs = self.bs();
        let end = offset + len;
        let mut out: Vec<LbaExtent> = Vec::new();
        let mut lba = offset / bs;
        while lba * bs < end {
            const DESCRIPTORS: u32 = 256;
            let alloc = 8 + 16 * DESCRIPTORS;
            let r = self
                .session
                .command_ok(
                    self.lun,
                    &cdb::get_lba_status16(lba, alloc),
                    DataDir::Read(alloc),
                )
                .await?;
            let before = lba;
            for LbaStatus {
                lba: at,
                blocks,
                status,
            } in scsi::parse_lba_status(&r.data)
            {
                let next = at + u64::from(blocks);
                if at > lba || next <= lba {
                    break;
                }
                let (from, to) = ((lba * bs).max(offset), (next * bs).min(end));
                match out.last_mut() {
                    Some(e) if e.status == status && e.offset + e.len == from => {
                        e.len = to - e.offset
                    }
                    _ => out.push(LbaExtent {
                        offset: from,
                        len: to - from,
                        status,
                    }),
                }
                lba = next;
                if lba * bs >= end {
                    break;
                }
            }
            if lba == before {
                return Err(Error::Protocol(format!(
                    "GET LBA STATUS at LBA {lba} described no blocks from there"
                )));
            }
        }
        Ok(out)
    }

    /// Blocks `[first, first + count)`, as one buffer per command, in order.
    async fn read_blocks(&self, first: u64, count: u64) -> Result<Vec<Bytes>> {
        let jobs = runs(first, count, self.limits.max_transfer).map(|(lba, n)| {
            let (s, lun) = (self.session.clone(), self.lun);
            async move { s.read(lun, lba, n as u32).await }
        });
        all(jobs.collect()).await
    }

    /// Whole blocks from `lba`, split at the maximum transfer length.
    fn write_blocks(&self, lba: u64, data: Bytes, fua: bool) -> Vec<BoxedJob<()>> {
        let bs = self.bs();
        runs(lba, data.len() as u64 / bs, self.limits.max_transfer)
            .map(|(at, n)| {
                let (s, lun) = (self.session.clone(), self.lun);
                let from = ((at - lba) * bs) as usize;
                let part = data.slice(from..from + (n * bs) as usize);
                let cdb = write_cdb(at, n as u32, fua);
                Box::pin(async move {
                    s.command_ok(lun, &cdb, DataDir::Write(part))
                        .await
                        .map(drop)
                }) as BoxedJob<()>
            })
            .collect()
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let plan = plan_write(offset, data.len() as u64, self.bs());
        let blocks = data.len() as u64 / self.bs();
        if plan.edges.is_empty() && blocks <= self.limits.max_transfer {
            let cdb = write_cdb(offset / self.bs(), blocks as u32, fua);
            return self
                .session
                .command_ok(self.lun, &cdb, DataDir::Write(data))
                .await
                .map(drop);
        }
        let mut jobs = match &plan.middle {
            Some((lba, r)) => self.write_blocks(*lba, data.slice(r.clone()), fua),
            None => Vec::new(),
        };
        if !plan.edges.is_empty() {
            let me = self.clone();
            jobs.push(Box::pin(
                async move { me.patch(&plan.edges, &data, fua).await },
            ));
        }
        all(jobs).await.map(drop)
    }

    /// Read-modify-write of the partial blocks of a write, under the lock.
    async fn patch(&self, edges: &[Edge], data: &Bytes, fua: bool) -> Result<()> {
        let _one_at_a_time = self.rmw.lock().await;
        let reads = edges.iter().map(|e| {
            let (s, lun, lba) = (self.session.clone(), self.lun, e.lba);
            async move { s.read(lun, lba, 1).await }
        });
        let old = all(reads.collect()).await?;
        let mut jobs = Vec::new();
        for (e, old) in edges.iter().zip(old) {
            let mut block = BytesMut::from(&old[..]);
            block[e.at..e.at + e.data.len()].copy_from_slice(&data[e.data.clone()]);
            jobs.extend(self.write_blocks(e.lba, block.freeze(), fua));
        }
        all(jobs).await.map(drop)
    }
}

fn write_cdb(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    if fua {
        cdb::write16_fua(lba, blocks)
    } else {
        cdb::write16(lba, blocks)
    }
}

fn supported_vpd_pages(p: &[u8]) -> &[u8] {
    let n = p.get(3).copied().unwrap_or(0) as usize;
    p.get(4..4 + n).unwrap_or(&p[p.len().min(4)..])
}

type BoxedJob<T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send>>;

/// Runs `jobs` together and returns their results in order; the first error wins and
/// the others are dropped. One job runs on the caller's task, with no spawn.
async fn all<T, F>(mut jobs: Vec<F>) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    if jobs.len() == 1 {
        return Ok(vec![jobs.pop().unwrap().await?]);
    }
    let mut set = tokio::task::JoinSet::new();
    let n = jobs.len();
    for (i, j) in jobs.into_iter().enumerate() {
        set.spawn(async move { j.await.map(|r| (i, r)) });
    }
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        let (i, v) = r.map_err(|e| Error::Io(std::io::Error::other(e)))??;
        out[i] = Some(v);
    }
    Ok(out.into_iter().map(Option::unwrap).collect())
}

/// Calls `f` with the bytes `[head, head + len)` of the concatenation of `pieces`, in
/// order, piece by piece.
fn gather(pieces: &[Bytes], head: usize, len: usize, mut f: impl FnMut(&[u8])) {
    let (mut skip, mut left) = (head, len);
    for p in pieces {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let n = (p.len() - skip).min(left);
        f(&p[skip..skip + n]);
        skip = 0;
        left -= n;
        if left == 0 {
            break;
        }
    }
}

/// The blocks a byte range touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    first: u64,
    count: u64,
    /// Bytes of the first block before the range.
    head: usize,
}

fn covering(offset: u64, len: u64, bs: u64) -> Span {
    let first = offset / bs;
    Span {
        first,
        count: (offset + len).div_ceil(bs) - first,
        head: (offset - first * bs) as usize,
    }
}

/// `count` blocks from `first` in runs of at most `max`: `(lba, blocks)`.
fn runs(first: u64, count: u64, max: u64) -> impl Iterator<Item = (u64, u64)> {
    let max = max.max(1);
    (0..count.div_ceil(max)).map(move |i| {
        let lba = first + i * max;
        (lba, max.min(first + count - lba))
    })
}

/// A partial block of a write: `data[data]` goes at byte `at` of block `lba`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Edge {
    lba: u64,
    at: usize,
    data: Range<usize>,
}

/// How a write splits: whole blocks written as they are (`middle`: first block and the
/// part of the data), and partial blocks to read-modify-write.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WritePlan {
    middle: Option<(u64, Range<usize>)>,
    edges: Vec<Edge>,
}

fn plan_write(offset: u64, len: u64, bs: u64) -> WritePlan {
    let span = covering(offset, len, bs);
    let len = len as usize;
    let bsz = bs as usize;
    let end_in_last = (offset + len as u64) - (span.first + span.count - 1) * bs;
    if span.count == 1 && (span.head != 0 || end_in_last != bs) {
        return WritePlan {
            middle: None,
            edges: vec![Edge {
                lba: span.first,
                at: span.head,
                data: 0..len,
            }],
        };
    }
    let mut edges = Vec::new();
    let (mut from, mut lba) = (0, span.first);
    if span.head != 0 {
        from = bsz - span.head;
        edges.push(Edge {
            lba: span.first,
            at: span.head,
            data: 0..from,
        });
        lba += 1;
    }
    let mut to = len;
    if end_in_last != bs {
        to = len - end_in_last as usize;
        edges.push(Edge {
            lba: span.first + span.count - 1,
            at: 0,
            data: to..len,
        });
    }
    WritePlan {
        middle: (to > from).then_some((lba, from..to)),
        edges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_rounds_out_to_whole_blocks() {
        let s = |first, count, head| Span { first, count, head };
        assert_eq!(covering(0, 4096, 512), s(0, 8, 0));
        assert_eq!(covering(100, 10, 512), s(0, 1, 100));
        assert_eq!(covering(500, 24, 512), s(0, 2, 500));
        assert_eq!(covering(1024, 1, 512), s(2, 1, 0));
        assert_eq!(covering(4095, 2, 4096), s(0, 2, 4095));
    }

    #[test]
    fn runs_split_at_the_maximum_transfer_length() {
        let r: Vec<_> = runs(10, 25, 8).collect();
        assert_eq!(r, vec![(10, 8), (18, 8), (26, 8), (34, 1)]);
        assert_eq!(runs(0, 16, 8).collect::<Vec<_>>(), vec![(0, 8), (8, 8)]);
        assert_eq!(runs(5, 3, 100).collect::<Vec<_>>(), vec![(5, 3)]);
        assert_eq!(runs(5, 0, 8).count(), 0);
    }

    /// `plan_write` of 512-byte blocks as plain values: the middle, and each edge's LBA,
    /// offset in its block and range of the data.
    #[allow(clippy::type_complexity)]
    fn planned(
        offset: u64,
        len: u64,
    ) -> (Option<(u64, Range<usize>)>, Vec<(u64, usize, Range<usize>)>) {
        let p = plan_write(offset, len, 512);
        let edges = p.edges.into_iter().map(|e| (e.lba, e.at, e.data)).collect();
        (p.middle, edges)
    }

    #[test]
    fn aligned_writes_need_no_read() {
        assert_eq!(planned(1024, 2048), (Some((2, 0..2048)), vec![]));
    }

    #[test]
    fn unaligned_head_and_tail_are_patched() {
        // Bytes 100..1300 of 512-byte blocks: block 0 from byte 100, block 1 whole,
        // block 2 up to byte 276.
        assert_eq!(
            planned(100, 1200),
            (
                Some((1, 412..924)),
                vec![(0, 100, 0..412), (2, 0, 924..1200)]
            )
        );
        // Head only, and tail only.
        assert_eq!(
            planned(256, 768),
            (Some((1, 256..768)), vec![(0, 256, 0..256)])
        );
        assert_eq!(
            planned(512, 700),
            (Some((1, 0..512)), vec![(2, 0, 512..700)])
        );
    }

    #[test]
    fn writes_inside_blocks_touch_only_those_blocks() {
        assert_eq!(planned(10, 20), (None, vec![(0, 10, 0..20)]));
        // Across one boundary, no whole block between.
        assert_eq!(
            planned(500, 24),
            (None, vec![(0, 500, 0..12), (1, 0, 12..24)])
        );
    }

    #[test]
    fn gather_takes_the_range_across_pieces() {
        let pieces = [Bytes::from_static(b"abcd"), Bytes::from_static(b"efgh")];
        let mut out = Vec::new();
        gather(&pieces, 2, 5, |p| out.extend_from_slice(p));
        assert_eq!(out, b"cdefg");
        out.clear();
        gather(&pieces, 5, 2, |p| out.extend_from_slice(p));
        assert_eq!(out, b"fg");
    }

    #[test]
    fn unmap_and_lba_status_wire_formats() {
        let (cdb, p) = cdb::unmap(&[(8, 16), (100, 1)]);
        assert_eq!((cdb[0], u16::from_be_bytes([cdb[7], cdb[8]])), (0x42, 40));
        assert_eq!(&p[..4], &[0, 38, 0, 32]);
        assert_eq!(&p[8..20], &[0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 16]);
        let mut d = vec![0, 0, 0, 36, 0, 0, 0, 0];
        for (lba, n, st) in [(0u64, 8u32, 0u8), (8, 24, 1)] {
            d.extend_from_slice(&lba.to_be_bytes());
            d.extend_from_slice(&n.to_be_bytes());
            d.extend_from_slice(&[st, 0, 0, 0]);
        }
        let s = scsi::parse_lba_status(&d);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[1].lba, s[1].blocks, s[1].status),
            (8, 24, Provisioning::Deallocated)
        );
    }
}
