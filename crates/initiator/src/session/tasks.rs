//! The task table: what each ITT in flight belongs to, and the guard that ends a task.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use iscsi::pdu::{Pdu, RESERVED_TAG};

use super::placed::ReadSink;
use super::Shared;
use crate::conn::Conn;
use crate::inbox;

/// A map keyed by integers the session gives out itself (ITTs, LUN numbers), hashed by one
/// multiplication rather than std's SipHash. A 4 KiB read looks its ITT up five times (a
/// free ITT, its insert, the reader's routing, the removal's look and remove) and its LUN's
/// block size once: with SipHash those six hashes were about 580 of the 9,600 instructions
/// the initiator ran per read (callgrind, `rsv bench` 4 KiB random reads). SipHash guards a
/// table whose keys a peer chooses against crafted collisions; these keys are ours (a
/// target's PDU can only look an ITT up, not insert one).
pub(super) type OwnKeyMap<K, V> = HashMap<K, V, BuildHasherDefault<OwnKeyHasher>>;

/// [`OwnKeyMap`]'s hasher: each integer written is mixed in by a multiplication with an
/// odd constant (as rustc's own FxHash), which spreads consecutive keys over both the
/// bucket index (the low bits) and the tag hashbrown keeps of each entry (the top 7 bits).
#[derive(Default, Clone, Copy)]
pub(super) struct OwnKeyHasher(u64);

impl OwnKeyHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(Self::K);
    }
}

impl Hasher for OwnKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A PDU for a task, with the connection it came on.
pub(super) struct Routed {
    pub(super) pdu: Pdu,
    pub(super) via: Arc<Conn>,
    /// Bytes of a Data-In's segment its reader put straight into the task's [`ReadSink`]
    /// at the PDU's buffer offset (the PDU itself then carries no data); 0 otherwise.
    pub(super) placed: usize,
}

pub(super) struct Task {
    /// Unique in the session's life: an ITT is used again once its task is gone.
    pub(super) id: u64,
    /// [`Conn::serial`] of the connection the task is allegiant to.
    pub(super) serial: u64,
    pub(super) tx: inbox::Sender<Routed>,
    /// SCSI commands only: what TASK REASSIGN needs to move it to another connection.
    pub(super) command: Option<Reassignable>,
    /// Large reads only: where their reader places Data-In segments.
    pub(super) sink: Option<Arc<ReadSink>>,
}

pub(super) struct Reassignable {
    pub(super) lun: u16,
    pub(super) cmdsn: u32,
    /// The next Data-In DataSN the command waits for: TASK REASSIGN's ExpDataSN.
    pub(super) exp_datasn: Arc<AtomicU32>,
}

/// Lives in the session's state, under its lock: a command registers its task in the
/// same critical section that gives it its connection and CmdSN, and a lost connection's
/// tasks are sorted out together with its recovery entry.
pub(super) struct TaskTable {
    next_itt: u32,
    next_task_id: u64,
    pub(super) by_itt: OwnKeyMap<u32, Task>,
}

impl TaskTable {
    pub(super) fn new() -> TaskTable {
        TaskTable {
            next_itt: 0x100,
            next_task_id: 0,
            by_itt: OwnKeyMap::default(),
        }
    }

    fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG && !self.by_itt.contains_key(&itt) {
                return itt;
            }
        }
    }

    pub(super) fn new_task(
        &mut self,
        conn: &Conn,
        command: Option<Reassignable>,
        sink: Option<Arc<ReadSink>>,
    ) -> (u32, u64, inbox::Receiver<Routed>) {
        let (tx, rx) = inbox::inbox();
        let itt = self.alloc_itt();
        self.next_task_id += 1;
        let id = self.next_task_id;
        self.by_itt.insert(
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

    /// Removes task `id`, unless its ITT belongs to another task by now (the table was
    /// cleared by a reinstatement and the ITT given out again).
    pub(super) fn end(&mut self, itt: u32, id: u64) {
        if self.by_itt.get(&itt).is_some_and(|t| t.id == id) {
            self.by_itt.remove(&itt);
        }
    }
}

/// Removes a task from the table and its weight from the connection when the command
/// ends, however it ends.
pub(super) struct TaskGuard<'a> {
    pub(super) shared: &'a Shared,
    pub(super) itt: u32,
    pub(super) id: u64,
    pub(super) conn: Arc<Conn>,
    pub(super) weight: u64,
}

impl TaskGuard<'_> {
    /// The task goes on on `to` (reassigned): its weight moves there.
    pub(super) fn move_to(&mut self, to: &Arc<Conn>) {
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
        self.shared
            .state
            .lock()
            .unwrap()
            .tasks
            .end(self.itt, self.id);
    }
}

impl Shared {
    /// A task other than a SCSI command (NOP, TMF, Logout) on `conn`; it ends with the
    /// guard.
    pub(super) fn register(&self, conn: &Arc<Conn>) -> (TaskGuard<'_>, inbox::Receiver<Routed>) {
        let (itt, id, rx) = self.state.lock().unwrap().tasks.new_task(conn, None, None);
        let guard = TaskGuard {
            shared: self,
            itt,
            id,
            conn: conn.clone(),
            weight: 0,
        };
        (guard, rx)
    }
}

pub(super) async fn recv_pdu(rx: &mut inbox::Receiver<Routed>) -> Option<Pdu> {
    rx.recv().await.map(|r| r.pdu)
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    /// The task table's hasher is one multiplication, not SipHash (a read hashes its ITT
    /// five times), yet it must spread the ITTs a session gives out one after another
    /// over both what hashbrown takes from a hash: the bucket index (the low bits) and each
    /// entry's tag (the top 7 bits), else lookups would compare many entries each. An
    /// identity hash of the ITT, the obvious cheap choice, puts every tag at 0.
    #[test]
    fn own_keys_spread_over_buckets_and_tags() {
        let b = BuildHasherDefault::<OwnKeyHasher>::default();
        let itts = 0x100u32..0x100 + 4096;
        let hashes: Vec<u64> = itts.map(|itt| b.hash_one(itt)).collect();
        let buckets: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 4095).collect();
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(buckets.len(), 4096, "consecutive ITTs share buckets");
        assert!(tags.len() >= 120, "only {} of 128 tags used", tags.len());
        // LUN numbers (the block size cache) too.
        let luns: std::collections::HashSet<u64> =
            (0u16..256).map(|l| b.hash_one(l) >> 57).collect();
        assert!(
            luns.len() >= 100,
            "only {} of 128 tags used by LUNs",
            luns.len()
        );
    }

    #[test]
    fn the_task_table_finds_and_ends_its_tasks() {
        let mut t = TaskTable::new();
        for itt in 0x100u32..0x100 + 1000 {
            let (tx, _) = inbox::inbox();
            t.by_itt.insert(
                itt,
                Task {
                    id: u64::from(itt),
                    serial: 0,
                    tx,
                    command: None,
                    sink: None,
                },
            );
        }
        assert_eq!(t.alloc_itt(), 0x100 + 1000, "taken ITTs are skipped");
        t.end(0x105, 0x105);
        t.end(0x106, 1);
        assert!(!t.by_itt.contains_key(&0x105));
        assert!(t.by_itt.contains_key(&0x106), "another task's ITT stays");
        assert_eq!(t.by_itt.len(), 999);
    }
}
