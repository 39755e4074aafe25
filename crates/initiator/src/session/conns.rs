//! The connection set: the session's connections of the current generation, what their
//! login settled, and the lost ones being recovered.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use iscsi::negotiate::SessionParams;
use tokio::sync::watch;

use super::recovery::Loss;
use super::SessionInfo;
use crate::conn::Conn;

/// Round trips (minimum, microseconds, as TCP_INFO measures them) under which a path counts
/// as short for [`ConnSet::pick_for`]: a connection's window is not what limits it.
pub(super) const PACK_RTT_US: u32 = 1000;

/// Bytes of commands outstanding (data plus 4 KiB each) up to which [`ConnSet::pick_for`]
/// packs commands onto one connection of a short path before it opens the next: sixteen
/// 4 KiB commands. Measured against 64 KiB and 1 MiB (all of QD32 on one connection) at
/// 4 KiB QD32 on loopback: 1 MiB lost what two connections gain over one (each end works
/// on one connection's round while the other's is at its peer; spread over two, 1.17 ×
/// one connection's IOPS, packed on one 1.04 ×); 64 KiB left eight connections 7 % less
/// than 128 KiB and dearer per GiB (0.61 against 0.56 s on the initiator).
pub(super) const PACK_BYTES: u64 = 128 << 10;

/// Lives in the session's state, under its lock: a command picks its connection in the
/// same critical section as its CmdSN, and a failed connection's recovery entry is made
/// together with the sorting out of its tasks.
pub(super) struct ConnSet {
    /// Bumped by each (re)instatement of the session; a connection belongs to one.
    pub(super) gen: u64,
    pub(super) all: Vec<Arc<Conn>>,
    /// Connections being recovered, by [`Conn::serial`].
    pub(super) losses: HashMap<u64, watch::Receiver<Loss>>,
    pub(super) tsih: u16,
    pub(super) params: SessionParams,
    pub(super) info: Option<SessionInfo>,
    pub(super) closed: bool,
    /// Commands wait: the session has just moved to another gateway and its
    /// registration is not yet made again on the new I_T nexus (`multipath`).
    pub(super) held: bool,
    /// The last reinstatement that gave up: the generation it tried to replace, when it
    /// gave up, its attempts and why. Commands issued before it gave up fail with it
    /// instead of each trying again for as long (with a queue of 32, a link cut for good
    /// would otherwise hold a copy for 32 recovery timeouts); a command issued later
    /// tries afresh.
    pub(super) failed: Option<(u64, std::time::Instant, u32, String)>,
}

impl ConnSet {
    pub(super) fn new() -> ConnSet {
        ConnSet {
            gen: 0,
            all: Vec::new(),
            losses: HashMap::new(),
            tsih: 0,
            params: SessionParams::default(),
            info: None,
            closed: false,
            held: false,
            failed: None,
        }
    }

    /// The live connection with the fewest bytes outstanding.
    pub(super) fn pick(&self) -> Option<Arc<Conn>> {
        self.all
            .iter()
            .filter(|c| c.is_alive())
            .min_by_key(|c| c.outstanding.load(Ordering::Relaxed))
            .cloned()
    }

    /// The connection for a command of `weight` bytes (its data plus a PDU's worth): on
    /// a short path the first live connection, in login order, on which it still fits
    /// under [`PACK_BYTES`]; otherwise, as for [`ConnSet::pick`], the one with the fewest
    /// bytes outstanding.
    ///
    /// Why pack: a connection costs both ends a receive, a send and a wake-up per round of
    /// PDUs, however few that round carries. Spread evenly, QD32 of 4 KiB reads over
    /// eight connections leaves four commands per round on each, and both ends made one
    /// system call of each kind per four commands where one connection made one per
    /// twenty (loopback, `perf stat`): eight connections gave 0.8 of one's IOPS. On a
    /// path whose round trip is under [`PACK_RTT_US`], a single TCP window holds far more
    /// than [`PACK_BYTES`], so more connections add nothing for such commands but that
    /// cost. Large commands (over `PACK_BYTES` each), and every command on a longer path,
    /// where each connection's window is what more connections are for, spread as before;
    /// so do commands on a connection whose path was not sampled yet.
    pub(super) fn pick_for(&self, weight: u64) -> Option<Arc<Conn>> {
        self.all
            .iter()
            .filter(|c| c.is_alive())
            .find(|c| {
                let rtt = c.min_rtt_us.load(Ordering::Relaxed);
                rtt > 0
                    && rtt < PACK_RTT_US
                    && c.outstanding.load(Ordering::Relaxed) + weight <= PACK_BYTES
            })
            .cloned()
            .or_else(|| self.pick())
    }

    /// A lost connection is being brought back (ERL 2): commands wait for it rather than
    /// have the session reinstated.
    pub(super) fn recovering(&self) -> bool {
        self.params.error_recovery_level >= 2
            && self.losses.values().any(|l| *l.borrow() == Loss::Pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi::negotiate::TargetPacing;
    use iscsi::pdu::Digests;

    /// `n` connections over in-memory streams, each with `rtt_us` as its sampled path.
    fn set(n: u16, rtt_us: u32) -> ConnSet {
        let mut s = ConnSet::new();
        for cid in 0..n {
            let a = "127.0.0.1:1".parse().unwrap();
            let b = "127.0.0.1:2".parse().unwrap();
            let (ours, _theirs, _cut) = net::transport::memory_pair(a, b, 1 << 16);
            let (_r, w) = ours.into_split();
            let (c, _dead) = Conn::new(
                cid,
                0,
                "test".into(),
                8192,
                0,
                w,
                Digests::default(),
                TargetPacing::NotAsked,
            );
            c.min_rtt_us.store(rtt_us, Ordering::Relaxed);
            s.all.push(c);
        }
        s
    }

    /// Picks for `k` commands of `weight` each, counted as outstanding as the command
    /// path counts them; the CIDs chosen.
    fn issue(s: &ConnSet, k: usize, weight: u64) -> Vec<u16> {
        (0..k)
            .map(|_| {
                let c = s.pick_for(weight).unwrap();
                c.outstanding.fetch_add(weight, Ordering::Relaxed);
                c.cid
            })
            .collect()
    }

    fn count(cids: &[u16], cid: u16) -> usize {
        cids.iter().filter(|&&c| c == cid).count()
    }

    #[tokio::test]
    async fn small_commands_on_a_short_path_fill_one_connection_then_the_next() {
        let s = set(8, 50);
        let got = issue(&s, 32, 4096 + 4096);
        assert_eq!(count(&got, 0), 16);
        assert_eq!(count(&got, 1), 16);
        // A 33rd finds both full and goes to the least busy of the others.
        let c = s.pick_for(8192).unwrap();
        assert!(c.cid >= 2, "went to {}", c.cid);
    }

    #[tokio::test]
    async fn large_commands_and_long_or_unsampled_paths_spread() {
        let s = set(4, 50);
        let got = issue(&s, 8, (1 << 20) + 4096);
        assert!((0..4).all(|cid| count(&got, cid) == 2), "{got:?}");
        for rtt in [0, PACK_RTT_US, 20_000] {
            let s = set(4, rtt);
            let got = issue(&s, 32, 8192);
            assert!(
                (0..4).all(|cid| count(&got, cid) == 8),
                "rtt {rtt}: {got:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_dead_connection_is_never_picked() {
        let s = set(3, 50);
        s.all[0].kill();
        let got = issue(&s, 20, 8192);
        assert_eq!(count(&got, 0), 0);
        assert_eq!(count(&got, 1), 16);
        assert_eq!(count(&got, 2), 4);
    }
}
