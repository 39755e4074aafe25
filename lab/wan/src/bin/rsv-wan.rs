//! The `wan` crate's own copy of `rsv-lab wan`, for working on the emulator alone. It takes
//! the same arguments as `rsv-lab` (`rsv-wan wan up ...`), so the relay re-exec works the
//! same way.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "rsv-wan", version)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// User-space WAN emulator between two network namespaces.
    Wan(wan::cli::WanArgs),
}

fn main() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let Top::Wan(args) = Cli::parse().command;
    wan::cli::run(args)
}
