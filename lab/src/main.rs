//! `rsv-lab`: the bench's binary. The product (`rsv`) links none of it; the scenarios run
//! the `rsv` beside this binary as separate processes.

use clap::{ArgAction, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "rsv-lab",
    version,
    about = "Reservoir's bench: the reference studies (R0-R4), the RTT sweep and cut links over \
             the WAN emulator, with Reservoir and standard peers side by side",
    after_help = "Results: SCENARIO.csv, SCENARIO.json (configuration, versions, machine, every \
measurement) and PNG figures under --out. A full run also rewrites its document in docs/ \
(lab-r0-r1.md for r0, r1 and rtt; lab-r2.md, lab-r3.md, lab-r4.md); `rsv-lab doc` redraws them \
all from lab/results.\n\n\
`run` needs root (network namespaces), iproute2, iperf3, qemu-img with iscsi:// \
(qemu-block-extra), tgt and the rsv built beside rsv-lab. Ctrl-C stops the run and removes its \
links and processes."
)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Lab(rsv_lab::cli::LabCommand),
    /// User-space WAN emulator between two network namespaces.
    Wan(wan::cli::WanArgs),
    /// Packet timing of a capture: bursts, gaps, ACKs, iSCSI PDUs, command latency (R3).
    Timing(timing::cli::TimingArgs),
}

/// As `rsv` logs: warnings by default, more with -v (the emulator's relay logs through it).
fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match cli.command {
        Command::Lab(command) => rsv_lab::cli::run(command),
        Command::Wan(args) => wan::cli::run(args),
        Command::Timing(args) => timing::cli::run(args),
    }
}
