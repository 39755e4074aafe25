//! The task table: what each ITT in flight belongs to, and the guard that ends a task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use iscsi::pdu::{Pdu, RESERVED_TAG};

use super::placed::ReadSink;
use super::Shared;
use crate::conn::Conn;
use crate::inbox;

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
    pub(super) by_itt: HashMap<u32, Task>,
}

impl TaskTable {
    pub(super) fn new() -> TaskTable {
        TaskTable {
            next_itt: 0x100,
            next_task_id: 0,
            by_itt: HashMap::new(),
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
