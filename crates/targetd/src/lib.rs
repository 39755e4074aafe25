//! Reservoir's iSCSI target daemon: configuration, portals, login, sessions with many
//! connections, CmdSN ordering, R2T and data collection, task management and discovery.
//! Protocol rules live in the sans-IO `iscsi` and `scsi` crates; this crate is the I/O.
//!
//! Modules depend on each other one way only, each on those listed before it:
//! `config` (with `reload`, the sans-IO plan of a configuration reload), `tags`,
//! `loglimit`, `cores`, `stats` (what `/metrics` counts) → `node` → `open` → `task` →
//! `session` (with `session::recovery`) → `shared` → `status` (snapshots of the sessions)
//! → `metrics` (the registry over the targets in force) → `wire` → `login` → `conn` (with
//! `conn::{transfer, exec, text, tmf}`) → `isns` → `server` → `control` (the local control
//! socket, with its sans-IO `control::proto`) → `notify` (systemd's notify protocol) →
//! `cli`. The submodules of
//! `conn` add `impl Conn` blocks and import from `conn`; `conn` imports nothing from them.
//! A module that needs something from one after it in this order gets it handed down (an
//! `Arc`, a channel, a closure) instead of importing it.

pub mod cli;
pub mod config;
mod conn;
pub mod control;
mod cores;
mod isns;
mod login;
mod loglimit;
mod metrics;
mod node;
mod notify;
mod open;
pub mod reload;
pub mod server;
mod session;
mod shared;
mod stats;
pub mod status;
mod tags;
mod task;
mod wire;

pub use config::Config;
pub use server::{Running, Server};
