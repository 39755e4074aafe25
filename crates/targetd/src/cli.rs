//! `rsv target`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context};
use backstore::Registry;
use clap::Args;
use tracing::info;

use crate::config::Config;
use crate::server::Server;

#[derive(Args, Debug)]
#[command(after_help = "\
With no flags the target serves one 1 GiB sparse file LUN (./data/lun0.img) as
iqn.2026-11.org.reservoir:target0 on 127.0.0.1:3260. A --config file describes portals,
targets, LUNs (a store each, 512 or 4096-byte blocks, read-only), allowed initiators, CHAP
(one-way and mutual, per target and for discovery) and session defaults; --listen and
--data-dir override it.

On start it prints `portal ADDR` for every address it listens on and `target IQN` for
every target, then `ready`. With --isns (or [isns] in the configuration) it registers its
portals and targets with that iSNS server and keeps the registration fresh. SIGTERM or
SIGINT: stop accepting, deregister from iSNS, ask initiators to log out, let in-flight
commands finish, flush LUNs, exit 0.")]
pub struct TargetArgs {
    /// Address to listen on (repeatable; port 0 picks a free port). Default 127.0.0.1:3260.
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Directory for LUN images with relative paths. Default ./data.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML configuration file.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Seconds to let in-flight commands finish on shutdown.
    #[arg(long, default_value_t = 10)]
    pub grace: u64,
    /// Register with this iSNS server (RFC 4171), as `[isns] server` in the
    /// configuration does: HOST, HOST:PORT or [IPv6]:PORT, port 3205 by default.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub isns: Option<String>,
    /// Print the configuration in effect, with each LUN's store, and exit.
    #[arg(long)]
    pub check: bool,
}

pub fn load(args: &TargetArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::embedded_default(),
    };
    if !args.listen.is_empty() {
        config.portals = args.listen.clone();
    }
    if let Some(d) = &args.data_dir {
        config.data_dir = d.clone();
    }
    if let Some(server) = &args.isns {
        match &mut config.isns {
            Some(i) => i.server = server.clone(),
            None => {
                config.isns = Some(crate::config::Isns {
                    server: server.clone(),
                    entity: None,
                    registration_period: None,
                })
            }
        }
    }
    config.validate().map_err(anyhow::Error::msg)?;
    Ok(config)
}

/// `rsv target --help` ends with the store kinds `stores` knows and their parameters.
pub fn document_stores(cmd: clap::Command, stores: &Registry) -> clap::Command {
    let after = cmd
        .get_after_help()
        .map(ToString::to_string)
        .unwrap_or_default();
    cmd.after_long_help(format!("{after}\n\n{}", stores.help()))
}

/// Runs the target, opening stores of the kinds `stores` knows.
pub fn run(args: TargetArgs, stores: &Registry) -> anyhow::Result<()> {
    let config = load(&args)?;
    if args.check {
        let opener = stores.context(&config.data_dir);
        let mut luns = Vec::new();
        for t in &config.targets {
            for l in &t.luns {
                let at = format!("target {} LUN {}", t.iqn, l.id);
                let spec = l.store_spec(stores).map_err(|e| anyhow!("{at}: {e}"))?;
                let description = opener
                    .read_only(l.read_only)
                    .check(&spec)
                    .with_context(|| format!("checking {at}"))?;
                luns.push(format!("{at}: store {spec}\n    {description}"));
            }
        }
        println!("{config:#?}");
        for l in luns {
            println!("{l}");
        }
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("rsv-target")
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let server = Server::bind(config, stores).await?;
        for p in server.portals() {
            println!("portal {p}");
        }
        for t in server.targets() {
            println!("target {}", t.iqn);
        }
        println!("ready");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        server
            .run(shutdown_signal(), Duration::from_secs(args.grace))
            .await
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT"),
    }
}
