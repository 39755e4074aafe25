//! Operation codes and service actions, as the vocabulary declares them
//! (`scsi_proto::opcodes`); the commands this logical unit runs are the rows of its command
//! table (`lu/commands.rs`).

pub use scsi_proto::opcodes::*;
