//! The initiator's commands of `rsv`: `ls`, `inq`, `cp`, `bench`, `tune` and `mount`, with
//! their flags, output and FUSE adapter. The `initiator` library stays free of clap,
//! indicatif and fuser for programs that only want to reach a LUN.

pub mod cli;
pub mod crash;
pub mod load;
pub mod mount;
mod tune_cli;
