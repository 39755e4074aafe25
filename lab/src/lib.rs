//! The lab: scenarios that reproduce the reference studies (R0-R4), the RTT sweep and cut
//! links on the WAN emulator, with Reservoir and standard peers measured side by side in
//! one run; `rsv-lab` is its binary.
//!
//! Everything runs as separate processes (`rsv-lab wan`, and the product's `rsv target`,
//! `rsv bench`, ... beside it, `tgtd`, `qemu-img`, `iperf3`) inside the emulator's
//! namespaces, so the lab measures exactly what a user of those commands gets.

mod busy;
pub mod cli;
mod cuts;
mod doc;
mod dr;
mod dr_explain;
mod drfs;
mod env;
mod login;
mod peers;
mod plot;
mod proc;
mod r0;
mod r1;
mod r2;
mod r3;
mod r4;
mod results;
mod rtt;
mod sites;
mod stats;
