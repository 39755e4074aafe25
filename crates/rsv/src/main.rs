//! `rsv`: the one Reservoir binary. Thin: parses arguments and calls the libraries.

use clap::{ArgAction, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "rsv", version, about = "Reservoir: iSCSI storage built for distance")]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the iSCSI target (with no flags: one 1 GiB sparse LUN under ./data on 127.0.0.1:3260).
    Target(target::cli::TargetArgs),
    /// User-space WAN emulator between two network namespaces.
    Wan(wan::cli::WanArgs),
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn,target=info,rsv=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match cli.command {
        Command::Target(args) => target::cli::run(args),
        Command::Wan(args) => wan::cli::run(args),
    }
}
