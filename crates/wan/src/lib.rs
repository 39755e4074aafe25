//! wan: a user-space WAN link emulator for the Reservoir lab.
//!
//! `rsv wan up --name NAME ...` builds two sites as network namespaces, `NAME-a` and
//! `NAME-b`, each holding a TUN device `wan0`, and starts a relay process that carries IP
//! packets between the two devices while emulating a long, possibly lossy, bottlenecked
//! link. The kernel here has no netem, so this is how the lab gets RTT and loss.
//!
//! Per direction, a packet meets (see [`model`]):
//! 1. random loss, Bernoulli or Gilbert–Elliott — before the queue, as on a lossy line in
//!    front of the bottleneck, so a lost packet takes no queue space;
//! 2. a drop-tail bottleneck queue limited in bytes (default one BDP, at least 16 MTU); a
//!    packet occupies it until the end of its serialization;
//! 3. serialization: it leaves the bottleneck at `max(now, last_departure) + size*8/rate`;
//! 4. the one-way delay (RTT/2 unless set per direction), with optional jitter that never
//!    reorders packets.
//!
//! Sizes are whole IP packets as the TUN device sees them (no Ethernet framing).
//!
//! Measured on the development machine (2 cores, shared): see `docs` in the crate README
//! section of [`cli`] and the figures in the commit history; tests in `tests/` assert RTT,
//! loss, throughput and the Mathis relation through real links.

pub mod cli;
pub mod control;
pub mod link;
pub mod model;
pub mod relay;
pub mod sys;
pub mod units;
