//! The lab: scenarios that reproduce the reference studies (R0, R1) on the WAN emulator,
//! with Reservoir and standard peers measured side by side in one run.
//!
//! Everything runs as separate processes (`rsv wan`, `rsv target`, `rsv bench`, `tgtd`,
//! `qemu-img`, `iperf3`) inside the emulator's namespaces, so the lab measures exactly
//! what a user of those commands gets.

mod busy;
pub mod cli;
mod cuts;
mod doc;
mod env;
mod peers;
mod plot;
mod proc;
mod r0;
mod r1;
mod r2;
mod r3;
mod r4;
mod rtt;
mod stats;
