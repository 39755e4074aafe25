//! Reservoir's iSCSI target daemon: configuration, portals, login, sessions with many
//! connections, CmdSN ordering, R2T and data collection, task management and discovery.
//! Protocol rules live in the sans-IO `iscsi` and `scsi` crates; this crate is the I/O.

pub mod cli;
pub mod config;
mod conn;
pub mod server;
mod session;
mod tags;
mod wire;

pub use config::Config;
pub use server::Server;
