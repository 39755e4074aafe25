//! `rsv`: Reservoir's binary, the product. Thin: parses arguments and calls the libraries.
//! The bench (the lab, the WAN emulator, capture timing) is `rsv-lab`, under `lab/`.

#[cfg(feature = "man")]
mod man;
mod version;

use std::process::ExitCode;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Parser)]
#[command(
    name = "rsv",
    version,
    about = "Reservoir: iSCSI storage built for distance"
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
    /// Run the iSCSI target (with no flags: one 1 GiB sparse LUN under ./data on 127.0.0.1:3260).
    Target(targetd::cli::TargetArgs),
    /// List targets, portals and LUNs (with sizes) of a portal or target.
    Ls(tools::cli::LsArgs),
    /// INQUIRY (standard, VPD 0x80/0x83/0xB0) and capacity of a LUN.
    Inq(tools::cli::InqArgs),
    /// Copy between files, block devices and iscsi:// LUNs (image backup and restore).
    Cp(tools::cli::CpArgs),
    /// Measure IOPS, throughput and latency of a LUN.
    Bench(tools::cli::BenchArgs),
    /// Show what auto-tuning measures and chooses for a LUN's path, and why.
    Tune(tools::cli::TuneArgs),
    /// Expose a LUN as a regular file through FUSE (for losetup, mkfs, mount).
    Mount(tools::cli::MountArgs),
    /// Copy a volume site to site, disk server to disk server, in paced parallel streams.
    Sync(replicate::cli::SyncArgs),
    /// Crash-consistency check: stamped writes, SIGKILLed targets, every durable write
    /// verified after the restart.
    Crash(tools::crash::CrashArgs),
    /// Many sessions of verified mixed I/O against one target: errors, latency, the
    /// target's memory and descriptors.
    Load(tools::load::LoadArgs),
    /// A small iSNS server (RFC 4171): registrations kept in a file, expiry, SCN.
    Isns(isnsd::IsnsArgs),
    /// A media server: finds storage in iSNS, reads its file systems, streams over HTTP.
    Media(media::MediaArgs),
    /// This build: version, commit, features, store kinds and congestion controls.
    Version(version::VersionArgs),
    /// Write the manual pages (rsv.1 and rsv-SUBCOMMAND.1) into DIR.
    #[cfg(feature = "man")]
    #[command(hide = true)]
    Man {
        /// Where the pages go (made if missing).
        dir: std::path::PathBuf,
    },
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn,target=info,rsv=info,isnsd=info,media=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    // RUST_LOG as `target=level` directives and a bare default level (`warn,targetd=debug`),
    // matched on the target's prefix as EnvFilter does; not EnvFilter itself, whose span
    // and field filters would bring a regex engine into the product's build.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| default.parse().expect("the default filter parses"));
    // The builder's own level is INFO unless told: without this the filter's `debug` and
    // `trace` directives (and -vv) showed nothing below INFO. The filter decides alone.
    let fmt = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_writer(std::io::stderr);
    // The journal stamps every line itself and shows no colours.
    if stderr_is_the_journal() {
        fmt.without_time()
            .with_ansi(false)
            .finish()
            .with(filter)
            .init();
    } else {
        fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish()
            .with(filter)
            .init();
    }
}

/// Whether standard error goes to systemd's journal: JOURNAL_STREAM names its device and
/// inode (systemd.exec(5)), and they are standard error's.
fn stderr_is_the_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2")
        .is_ok_and(|m| dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino()))
}

/// Starts the agent of `rsv sync` beside the target when `[control]` (or `--control`)
/// asks for it: it reaches the stores of the LUNs the target has at each request (a
/// reload that removes a LUN takes it from the agent too).
fn start_agent(
    server: &targetd::server::Server,
    config: &targetd::config::Config,
) -> anyhow::Result<()> {
    let Some((listen, key_file)) = config.control.as_ref().and_then(|c| c.agent()) else {
        return Ok(());
    };
    let key = replicate::auth::Key::from_file(key_file)?;
    let live = server.live();
    let luns = move || {
        let mut luns = Vec::new();
        for t in live.targets() {
            for (&id, lu) in &t.luns {
                // The store as opened (not the tracking wrapper: the agent only reads
                // it) and its change map, where the LUN keeps one.
                let Some(s) = t.lun_store(id) else { continue };
                luns.push(replicate::agent::LocalLun {
                    iqn: t.iqn.clone(),
                    lun: id,
                    store: s.store.clone(),
                    spec: s.spec.clone(),
                    block_size: lu.config().block_size,
                    changes: s
                        .changes
                        .clone()
                        .map(|c| c as std::sync::Arc<dyn replicate::agent::ChangeLog>),
                    cut: Some(replicate::agent::CutPoint {
                        imaged: s.imaged.clone(),
                        hold: s.hold.clone(),
                    }),
                    // The role record beside the LUN and the logical unit's fence.
                    role: s.role_file.clone().map(|file| {
                        let (f, w, c) = (lu.clone(), lu.clone(), lu.clone());
                        replicate::failover::RolePoint {
                            file,
                            fence: std::sync::Arc::new(move |writers| f.fence().set(writers)),
                            writing: std::sync::Arc::new(move || w.fence().writing()),
                            // Within the coordinator's 30 s wait for an answer.
                            cycle: std::sync::Arc::new(move |cycle| {
                                c.fence()
                                    .set_cycle(cycle, std::time::Duration::from_secs(20))
                            }),
                        }
                    }),
                    undo: s.undo.clone(),
                });
            }
        }
        luns
    };
    let portals = server.portals().iter().map(ToString::to_string).collect();
    let agent = replicate::agent::Agent::new(
        Box::new(luns),
        portals,
        initiator::SessionOptions::default(),
    );
    let addr = replicate::agent::spawn(listen, key, agent)?;
    println!("control {addr}");
    Ok(())
}

/// The target's allocator keeps what it frees for the next command instead of handing it
/// back to the kernel at once. With glibc's defaults a buffer of 128 KiB or more is a
/// fresh mapping, and freed memory above 128 KiB at a heap's top is trimmed: a target
/// receiving 1 MiB writes at 100 MB/s (a sync's far disk server) then maps, faults in,
/// clears and unmaps memory all the time, each unmap a TLB shootdown across the cores.
/// R2's far disk servers spent half their CPU so (`docs/bench-sync-cpu.md`). Up to
/// 16 MiB (the largest pooled buffer) now comes from the heaps, and up to 64 MiB free at
/// a heap's top stays there. An administrator's `MALLOC_TRIM_THRESHOLD_` or
/// `MALLOC_MMAP_THRESHOLD_` still decides.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
            || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        {
            return;
        }
        // SAFETY: mallopt only sets the allocator's parameters; called before the
        // target's threads start.
        let ok = unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20) == 1
        };
        if !ok {
            tracing::debug!("the allocator's thresholds were not changed");
        }
    }
}

fn main() -> anyhow::Result<ExitCode> {
    // Store kinds beyond the built-in ones are registered here.
    let mut stores = backstore::Registry::with_builtins();
    remote::register(&mut stores);
    #[cfg(feature = "rbd")]
    rbd::register(&mut stores);
    let command =
        Cli::command().mut_subcommand("target", |c| targetd::cli::document_stores(c, &stores));
    let matches = command.clone().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging(cli.verbose);
    let ok = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cli.command {
        Command::Target(args) => {
            keep_freed_memory();
            ok(targetd::cli::run_with(args, &stores, |server, config| {
                start_agent(server, config)
            }))
        }
        Command::Ls(args) => ok(tools::cli::ls(args)),
        Command::Inq(args) => ok(tools::cli::inq(args)),
        // 3 when --max-time stopped the copy early (1 is a failure).
        Command::Cp(args) => tools::cli::cp(args),
        Command::Bench(args) => ok(tools::cli::bench(args)),
        Command::Tune(args) => ok(tools::cli::tune(args)),
        Command::Mount(args) => ok(tools::cli::mount(args)),
        Command::Isns(args) => ok(isnsd::run(args)),
        Command::Load(args) => {
            let json = args.json;
            let report = tools::load::run(args)?;
            Ok(if tools::load::print(&report, json)? {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        // 1 when a round found a loss or a phantom, as for an error.
        Command::Crash(args) => tools::crash::run(args).map(|clean| {
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Command::Media(args) => ok(media::run(args)),
        Command::Sync(args) => ok(replicate::cli::run(args)),
        Command::Version(args) => ok(version::run(args, &stores)),
        #[cfg(feature = "man")]
        Command::Man { dir } => {
            for page in man::write(command, &dir)? {
                println!("{}", page.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
