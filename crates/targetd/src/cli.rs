//! `rsv target`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context};
use backstore::Registry;
use clap::Args;
use tracing::{info, warn};

use crate::config::{Config, Portal, PortalTls};
use crate::server::{Reloader, Server};

#[derive(Args, Debug)]
#[command(after_help = "\
With no flags the target serves one 1 GiB sparse file LUN (./data/lun0.img) as
iqn.2026-11.org.reservoir:target0 on 127.0.0.1:3260. A --config file describes portals,
targets, LUNs (a store each, 512 or 4096-byte blocks, read-only), allowed initiators, CHAP
(one-way and mutual, per target and for discovery) and session defaults; --listen and
--data-dir override it. --stripe makes that one LUN a stripe over other stores instead:
a Data Reservoir file server over its disk servers in one flag,

  rsv target --stripe iscsi://ds1/IQN/0,iscsi://ds2/IQN/0 --stripe-unit 1M

is LUN 0 with store = \"stripe:?unit=1M&members=[iscsi://ds1/IQN/0,iscsi://ds2/IQN/0]\"
(--check shows its layout: unit, capacity, each member and its size; it logs in to iscsi
members to learn their sizes).

TLS 1.3 portals: --tls-listen with --tls-cert and --tls-key (and --tls-client-ca for
mutual TLS), or `tls` on a portal in the configuration (docs/target.md); the log names each
TLS portal's certificate fingerprint, which initiators without a CA pin (`?pin=`).

On start it prints `portal ADDR` for every address it listens on, `target IQN` for
every target and, with --metrics (or [metrics] listen), `metrics ADDR`, then `ready`.
The metrics (docs/target.md, \"Metrics\"): per target and LUN, commands, bytes and a
latency histogram for reads, writes, flushes and other commands, CHECK CONDITIONs by
sense key, commands in flight; logins refused by reason, task management, ERL 2
recoveries, limits reached; sessions and connections. With --isns (or [isns] in the configuration) it registers its
portals and targets with that iSNS server and keeps the registration fresh. SIGTERM or
SIGINT: stop accepting, deregister from iSNS, ask initiators to log out, let in-flight
commands finish, flush LUNs (each step up to --grace seconds), exit 0; 1 if a LUN could
not be flushed in time (a remote member whose disk server is gone).

SIGHUP: read the --config file again (with the flags applied over it as at start). Targets
added or removed, their LUNs, aliases and access rules, and discovery CHAP take effect at
once (sessions that see a changed LUN list get a REPORTED LUNS DATA HAS CHANGED unit
attention; sessions of a removed target are closed); portals, [session], [isns],
[threads], [control], [metrics], data_dir and the portal groups keep their values until a restart,
which the log line says. A file that does not parse, validate or open leaves the
configuration in force as it was, with one log line naming the error.")]
pub struct TargetArgs {
    /// Address to listen on (repeatable; port 0 picks a free port). Default 127.0.0.1:3260.
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// Address of a TLS 1.3 portal (repeatable), with --tls-cert and --tls-key; with
    /// --listen or the configuration's portals beside it. Plaintext logins are refused there.
    #[arg(long = "tls-listen", value_name = "ADDR:PORT", requires_all = ["tls_cert", "tls_key"])]
    pub tls_listen: Vec<SocketAddr>,
    /// The TLS portals' certificate (PEM; the chain, leaf first).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS portals' private key (PEM; readable by its owner only, or refused).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require initiators on the TLS portals to present a client certificate signed by one
    /// of these CAs (PEM): mutual TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Directory for LUN images with relative paths. Default ./data.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML configuration file.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Seconds to let in-flight commands finish on shutdown, and again for LUNs to flush.
    #[arg(long, default_value_t = 10)]
    pub grace: u64,
    /// Register with this iSNS server (RFC 4171), as `[isns] server` in the
    /// configuration does: HOST, HOST:PORT or [IPv6]:PORT, port 3205 by default.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub isns: Option<String>,
    /// Print the configuration in effect, with each LUN's store, and exit.
    #[arg(long)]
    pub check: bool,
    /// Serve the control endpoint of `rsv sync` here (a disk server's agent; overrides
    /// `[control] listen`). Needs --control-key.
    #[arg(long, value_name = "ADDR:PORT")]
    pub control: Option<SocketAddr>,
    /// The key file that signs control requests (owner-readable only; the same file on
    /// the coordinator).
    #[arg(long, value_name = "FILE")]
    pub control_key: Option<PathBuf>,
    /// Make the default target's LUN 0 a stripe over these stores, in order: store specs
    /// (iscsi://HOST[:PORT]/IQN/LUN, file:PATH?size=.., ram:?size=..), comma-separated or
    /// the flag repeated. Instead of --config.
    #[arg(long, value_name = "SPEC,SPEC,...", conflicts_with = "config")]
    pub stripe: Vec<String>,
    /// Bytes per member before the next, with --stripe: a multiple of 4 KiB.
    #[arg(long, value_name = "SIZE", default_value = "1M", requires = "stripe")]
    pub stripe_unit: String,
    /// TCP congestion control of the target's connections (overrides `[session]
    /// congestion`): a kernel one (bbr, cubic) or `rsv`, Reservoir's own, loaded when the
    /// first connection asks for it (root); without it, the kernel's BBR, said once in the log.
    #[arg(long, value_name = "NAME")]
    pub congestion: Option<String>,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics (overrides
    /// `[metrics] listen`; port 0 picks a free port). Off unless asked.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
}

/// The spec `--stripe` and `--stripe-unit` stand for.
pub fn stripe_spec(members: &[String], unit: &str) -> anyhow::Result<backstore::StoreSpec> {
    units::parse_size(unit).map_err(|e| anyhow!("--stripe-unit {unit}: {e}"))?;
    let text = format!("stripe:?unit={unit}&members=[{}]", members.join(","));
    text.parse().map_err(|e| anyhow!("--stripe: {e}"))
}

pub fn load(args: &TargetArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::embedded_default(),
    };
    if !args.listen.is_empty() {
        config.portals = args.listen.iter().copied().map(Portal::plain).collect();
    }
    if !args.tls_listen.is_empty() {
        let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
            return Err(anyhow!("--tls-listen needs --tls-cert and --tls-key"));
        };
        if args.listen.is_empty() && args.config.is_none() {
            // Only TLS, unless plaintext portals were asked for too.
            config.portals.clear();
        }
        config
            .portals
            .extend(args.tls_listen.iter().map(|&listen| Portal {
                listen,
                tls: Some(PortalTls {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: args.tls_client_ca.clone(),
                    require: true,
                }),
            }));
    }
    if let Some(d) = &args.data_dir {
        config.data_dir = d.clone();
    }
    if let Some(cc) = &args.congestion {
        config.session.congestion = Some(cc.clone());
    }
    match (args.control, &args.control_key, &mut config.control) {
        (None, None, _) => {}
        (Some(listen), Some(key), c) => {
            *c = Some(crate::config::ControlConfig {
                listen,
                key_file: key.clone(),
            })
        }
        (Some(listen), None, Some(c)) => c.listen = listen,
        (None, Some(key), Some(c)) => c.key_file = key.clone(),
        (Some(_), None, None) => return Err(anyhow!("--control needs --control-key FILE")),
        (None, Some(_), None) => return Err(anyhow!("--control-key needs --control ADDR:PORT")),
    }
    if let Some(listen) = args.metrics {
        match &mut config.metrics {
            Some(m) => m.listen = listen,
            None => config.metrics = Some(crate::config::MetricsConfig::at(listen)),
        }
    }
    if !args.stripe.is_empty() {
        let lun = &mut config.targets[0].luns[0];
        lun.store = Some(stripe_spec(&args.stripe, &args.stripe_unit)?);
        (lun.backstore, lun.path, lun.size) = (None, None, None);
    }
    if let Some(server) = &args.isns {
        match &mut config.isns {
            Some(i) => i.server = server.clone(),
            None => {
                config.isns = Some(crate::config::Isns {
                    server: server.clone(),
                    entity: None,
                    registration_period: None,
                    auth: None,
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
    let congestion = match net::cc::built() {
        Ok(()) => "rsv (Reservoir's BPF congestion control; it loads where the process may \
                   load BPF, as root) and the kernel's"
            .to_string(),
        Err(why) => format!("the kernel's only (rsv not in this build: {why})"),
    };
    cmd.after_long_help(format!(
        "{after}\n\n{}\n\nCongestion controls in this build: {congestion}: {}.",
        stores.help(),
        net::available_congestion().join(", ")
    ))
}

/// Runs the target, opening stores of the kinds `stores` knows.
pub fn run(args: TargetArgs, stores: &Registry) -> anyhow::Result<()> {
    run_with(args, stores, |_, _| Ok(()))
}

/// [`run`], with `extra` called on the runtime once the target is bound and before it
/// says `ready`: services that live beside the target (the agent of `rsv sync`) start
/// there, with the server and the configuration in hand.
pub fn run_with(
    args: TargetArgs,
    stores: &Registry,
    extra: impl FnOnce(&Server, &Config) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
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
                let unit = units::Size(l.track_unit());
                let tracking = match (l.track, &l.track_file) {
                    (false, _) => "changes not tracked".to_string(),
                    (true, Some(f)) => format!(
                        "changes tracked in {} (units of {unit})",
                        config.data_dir.join(f).display()
                    ),
                    (true, None) => format!(
                        "changes tracked in the store's `.changes` file beside its data \
                         (units of {unit}); a store with no such place refuses to start"
                    ),
                };
                let description = description.replace('\n', "\n    ");
                luns.push(format!(
                    "{at}: store {}\n    {description}\n    {tracking}",
                    spec.shown()
                ));
            }
        }
        println!("{config:#?}");
        for l in luns {
            println!("{l}");
        }
        for p in &config.portals {
            if let Some(t) = &p.tls {
                let tls = net::tls::ServerTls::new(&t.files())
                    .with_context(|| format!("portal {}: tls", p.listen))?;
                println!(
                    "portal {}: TLS 1.3, certificate {}",
                    p.listen,
                    net::tls::fingerprint_text(&tls.fingerprint)
                );
            }
        }
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("rsv-target")
        .build()
        .context("starting the runtime")?;
    let result = rt.block_on(async move {
        let server = Server::bind(config.clone(), stores).await?;
        extra(&server, &config)?;
        // Before `ready`: SIGHUP's default action would end the process.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("installing the SIGHUP handler")?;
        let reloads = follow_reloads(hangup, &args, stores, server.reloader());
        for p in server.portals() {
            println!("portal {p}");
        }
        for t in server.targets() {
            println!("target {}", t.iqn);
        }
        if let Some(m) = server.metrics_addr() {
            println!("metrics {m}");
        }
        println!("ready");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        crate::notify::ready(&server.shared().status());
        if let Some(every) = crate::notify::watchdog_interval() {
            info!("systemd watchdog: {every:?}; pinged at half of it");
        }
        let watchdog = crate::notify::watchdog(server.shared());
        let grace = Duration::from_secs(args.grace);
        tokio::select! {
            r = server.run(shutdown_signal(), grace) => r,
            never = reloads => match never {},
            never = watchdog => match never {},
        }
    });
    // A flush given up on after the grace period may still hold a blocking worker.
    rt.shutdown_timeout(Duration::from_millis(100));
    result
}

/// Reloads the configuration on every SIGHUP, for as long as the target runs.
async fn follow_reloads(
    mut hangup: tokio::signal::unix::Signal,
    args: &TargetArgs,
    stores: &Registry,
    reloader: Reloader,
) -> std::convert::Infallible {
    loop {
        hangup.recv().await;
        let Some(path) = &args.config else {
            info!("SIGHUP: no --config file, nothing to reload");
            continue;
        };
        let path = path.display();
        info!("SIGHUP: reloading {path}");
        crate::notify::reloading();
        // Opening a store may block (files, another target's login).
        let done = tokio::task::block_in_place(|| {
            let config = load(args)?;
            reloader.reload(&config, stores)
        });
        match done {
            Ok(summary) => info!("reloaded {path}: {summary}"),
            Err(e) => {
                warn!("reload of {path} refused, the configuration in force is unchanged: {e:#}")
            }
        }
        crate::notify::ready(&reloader.status());
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT"),
    }
    crate::notify::stopping();
}
