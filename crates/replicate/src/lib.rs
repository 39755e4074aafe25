//! Data Reservoir's far-distance transfer (`rsv sync`): a volume's disk servers copy
//! their members straight to the other site's disk servers in parallel iSCSI streams,
//! paced together so the bottleneck stays full and the streams finish together.
//!
//! - [`auth`], [`pace`], [`cut`], [`api`], [`sparse`], [`squeeze`]: sans-IO (the control
//!   channel's authentication, the cooperative rate control, a consistency group's
//!   barrier, the messages, which units carry data, whether to compress);
//! - [`wire`]: the control channel's sockets (HTTP/1.1 through hyper);
//! - [`agent`]: the disk server's side, inside `rsv target`;
//! - [`coord`]: the coordinator, `rsv sync`; [`continuous`]: `rsv sync --every`;
//! - [`cycle`]: the far copy kept whole, cycle by cycle (its decisions sans-IO);
//! - [`metrics`]: what `rsv sync --metrics` serves.

pub mod agent;
pub mod api;
pub mod auth;
pub mod cli;
pub mod continuous;
pub mod coord;
pub mod cut;
pub mod cycle;
pub mod failover;
pub mod failover_cli;
pub mod metrics;
pub mod pace;
pub mod role;
pub mod sparse;
pub mod squeeze;
pub mod wire;
