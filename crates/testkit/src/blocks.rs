//! Writers of stamped 4 KiB blocks through one `Lun`, each in a region of its own, for the
//! tests that kill the gateway under them: what each wrote last and was acknowledged,
//! when each write completed (the stall across a kill), and what the blocks read back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use initiator::Lun;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// A block's size.
pub const BS: usize = 4096;

/// `BS` bytes stamped with the writer and its sequence number, every 16 bytes.
pub fn stamp(writer: u64, seq: u64) -> Bytes {
    let mut b = vec![0u8; BS];
    for chunk in b.chunks_exact_mut(16) {
        chunk[..8].copy_from_slice(&writer.to_be_bytes());
        chunk[8..].copy_from_slice(&seq.to_be_bytes());
    }
    Bytes::from(b)
}

/// `writers` writers, writer `w` rewriting blocks `w * each ..` in turn, one write in
/// flight each, until stopped or a write fails.
pub struct Writers {
    writers: u64,
    each: u64,
    stop: Arc<AtomicBool>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Per block, the last sequence number acknowledged (0: none).
    acked: Arc<Vec<AtomicU64>>,
    completions: Arc<Mutex<Vec<Instant>>>,
    tasks: Vec<JoinHandle<()>>,
}

/// A block as read back after the writers stopped.
pub struct ReadBack {
    pub block: u64,
    /// The writer that owns the block.
    pub owner: u64,
    /// The last sequence number acknowledged for it.
    pub want: u64,
    /// The writer and sequence number the block holds.
    pub writer: u64,
    pub seq: u64,
}

impl Writers {
    pub fn start(rt: &Runtime, lun: &Lun, writers: u64, each: u64) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let acked: Arc<Vec<AtomicU64>> =
            Arc::new((0..writers * each).map(|_| AtomicU64::new(0)).collect());
        let completions = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..writers)
            .map(|w| {
                let (lun, stop, errors, acked, completions) = (
                    lun.clone(),
                    stop.clone(),
                    errors.clone(),
                    acked.clone(),
                    completions.clone(),
                );
                rt.spawn(async move {
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        seq += 1;
                        let block = w * each + seq % each;
                        match lun.write_at(block * BS as u64, stamp(w, seq)).await {
                            Ok(()) => {
                                acked[block as usize].store(seq, Ordering::Relaxed);
                                completions.lock().unwrap().push(Instant::now());
                            }
                            Err(e) => {
                                errors.lock().unwrap().push(format!("writer {w}: {e}"));
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        Writers {
            writers,
            each,
            stop,
            errors,
            acked,
            completions,
            tasks,
        }
    }

    /// When each write completed so far, in order.
    pub fn completions(&self) -> Vec<Instant> {
        self.completions.lock().unwrap().clone()
    }

    /// The errors met so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Stops the writers and waits for them: the errors they met and when each write
    /// completed.
    pub fn stop(&mut self, rt: &Runtime) -> (Vec<String>, Vec<Instant>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks.drain(..) {
            rt.block_on(t).unwrap();
        }
        (self.errors.lock().unwrap().clone(), self.completions())
    }

    /// Every block with an acknowledged write, read back through `lun`.
    pub fn read_back(&self, rt: &Runtime, lun: &Lun) -> Vec<ReadBack> {
        let mut out = Vec::new();
        for owner in 0..self.writers {
            for i in 0..self.each {
                let block = owner * self.each + i;
                let want = self.acked[block as usize].load(Ordering::Relaxed);
                if want == 0 {
                    continue;
                }
                let got = rt.block_on(lun.read_at(block * BS as u64, BS)).unwrap();
                out.push(ReadBack {
                    block,
                    owner,
                    want,
                    writer: u64::from_be_bytes(got[..8].try_into().unwrap()),
                    seq: u64::from_be_bytes(got[8..16].try_into().unwrap()),
                });
            }
        }
        out
    }
}
