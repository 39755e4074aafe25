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
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "\
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
configuration in force as it was, with one log line naming the error."
)]
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
    /// Serve the local control socket (`rsv target status`, `drop`) here (overrides
    /// `[control] socket`); by default `$RUNTIME_DIRECTORY/control.sock` under systemd,
    /// else none.
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    #[command(subcommand)]
    pub action: Option<TargetAction>,
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

/// What `rsv target` does besides serving: ask a running target over its control socket.
#[derive(clap::Subcommand, Debug)]
pub enum TargetAction {
    /// The sessions of a running target, over its control socket.
    ///
    /// One row per session: initiator, address, target and LUNs, connections, TLS, age,
    /// bytes in and out, and the path's RTT and delivery rate as TCP sees it now; --json
    /// adds the negotiated keys and each connection's details.
    Status(StatusArgs),
    /// End a session: ask its initiator to log out, then drop its connections.
    ///
    /// The target sends an Async Message asking for a logout within --wait seconds
    /// (AsyncEvent 1, RFC 7143 11.9.1) and closes the session's connections if it has
    /// not gone by then (at once with --now). An initiator that logs in again comes back
    /// as a new session; to keep it out, change the target's access rules and reload.
    Drop(DropArgs),
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The target's control socket ([control] socket); default
    /// $RUNTIME_DIRECTORY/control.sock, else /run/reservoir/control.sock.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Print the snapshot as JSON (`targetd::status::TargetStatus`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DropArgs {
    /// The session: its TSIH as `status` shows it (decimal, or 0x-prefixed hex).
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// The target's control socket, as for `status`.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Seconds the initiator has to log out (the Async Message's Parameter3), 1..3600.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=3600))]
    pub wait: u16,
    /// Drop the connections at once, without asking for a logout.
    #[arg(long)]
    pub now: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Where the client looks for the control socket when not told.
fn client_socket(given: &Option<PathBuf>) -> PathBuf {
    given
        .clone()
        .or_else(crate::control::default_path)
        .unwrap_or_else(|| PathBuf::from("/run/reservoir").join(crate::control::DEFAULT_NAME))
}

/// A session as `drop` takes it: decimal or 0x-prefixed hex TSIH.
fn parse_tsih(s: &str) -> anyhow::Result<u16> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => s.parse(),
    };
    match parsed {
        Ok(0) | Err(_) => Err(anyhow!(
            "session {s}: not a TSIH (1..65535, decimal or 0x-prefixed hex, as status shows it)"
        )),
        Ok(t) => Ok(t),
    }
}

/// Runs `rsv target status` or `drop`.
pub fn act(action: TargetAction) -> anyhow::Result<()> {
    use crate::control::proto::{Request, Response};
    match action {
        TargetAction::Status(a) => {
            let path = client_socket(&a.control);
            match crate::control::request(&path, &Request::Status, Duration::from_secs(10))? {
                Response::Status(s) if a.json => {
                    println!("{}", serde_json::to_string_pretty(&s)?);
                }
                Response::Status(s) => print!("{}", status_table(&s)),
                Response::Error(e) => return Err(anyhow!("{}: {e}", path.display())),
                other => return Err(anyhow!("{}: unexpected answer {other:?}", path.display())),
            }
        }
        TargetAction::Drop(a) => {
            let path = client_socket(&a.control);
            let session = parse_tsih(&a.session)?;
            let wait_s = if a.now { 0 } else { a.wait };
            let r = Request::Drop { session, wait_s };
            let within = Duration::from_secs(u64::from(wait_s) + 10);
            match crate::control::request(&path, &r, within)? {
                Response::Dropped(d) if a.json => println!("{}", serde_json::to_string(&d)?),
                Response::Dropped(d) => println!("session {}: {}", d.tsih, d.outcome),
                Response::Error(e) => return Err(anyhow!("{}: {e}", path.display())),
                other => return Err(anyhow!("{}: unexpected answer {other:?}", path.display())),
            }
        }
    }
    Ok(())
}

/// `status` for people: one row per session, its connections summed (bytes, delivery
/// rate) or at their worst (RTT).
pub fn status_table(s: &crate::status::TargetStatus) -> String {
    let cc = s
        .congestion
        .as_ref()
        .map(|c| format!("congestion control ({}): {}\n", c.by, c.why))
        .unwrap_or_default();
    if s.sessions.is_empty() {
        return format!("{cc}no sessions\n");
    }
    let header = [
        "TSIH",
        "INITIATOR",
        "ADDRESS",
        "TARGET",
        "LUNS",
        "CONNS",
        "TLS",
        "AGE",
        "IN",
        "OUT",
        "RTT",
        "RATE",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for x in &s.sessions {
        let paths: Vec<_> = x
            .connections
            .iter()
            .filter_map(|c| c.path.as_ref())
            .collect();
        let rtt = paths.iter().map(|p| p.srtt_us).max();
        let rate: u64 = paths.iter().map(|p| p.delivery_rate).sum();
        let tls = x.connections.iter().filter(|c| c.tls.is_some()).count();
        rows.push(vec![
            x.tsih.to_string(),
            x.initiator.clone(),
            x.connections
                .first()
                .map_or_else(|| "-".into(), |c| c.remote.to_string()),
            x.target.clone().unwrap_or_else(|| "(discovery)".into()),
            if x.luns.is_empty() {
                "-".into()
            } else {
                x.luns
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
            x.connections.len().to_string(),
            match tls {
                0 => "no".into(),
                n if n == x.connections.len() => "yes".into(),
                n => format!("{n}/{}", x.connections.len()),
            },
            units::format_age(Duration::from_secs_f64(x.age_s)),
            units::Size(x.bytes_received).approx(),
            units::Size(x.bytes_sent).approx(),
            rtt.map_or_else(|| "-".into(), |us| format!("{:.1}ms", f64::from(us) / 1e3)),
            if paths.is_empty() {
                "-".into()
            } else {
                units::Rate::from_bytes_per_sec(rate).approx()
            },
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
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
    let has_agent = config.control.as_ref().and_then(|c| c.agent()).is_some();
    match (args.control, &args.control_key) {
        (Some(_), None) if !has_agent => return Err(anyhow!("--control needs --control-key FILE")),
        (None, Some(_)) if !has_agent => {
            return Err(anyhow!("--control-key needs --control ADDR:PORT"))
        }
        (listen, key) => {
            if listen.is_some() || key.is_some() {
                let c = config.control.get_or_insert_with(Default::default);
                c.listen = listen.or(c.listen);
                c.key_file = key.clone().or(c.key_file.take());
            }
        }
    }
    if let Some(path) = &args.control_socket {
        config.control.get_or_insert_with(Default::default).socket = Some(path.clone());
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
    mut args: TargetArgs,
    stores: &Registry,
    extra: impl FnOnce(&Server, &Config) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Some(action) = args.action.take() {
        return act(action);
    }
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
        let control = config.control.clone().unwrap_or_default();
        // Owned here, so that its file goes when the target stops, whatever the runtime's
        // shutdown leaves undone.
        let control_socket = match control.socket.or_else(crate::control::default_path) {
            Some(path) => {
                let socket = crate::control::ControlSocket::bind(&path, control.group.as_deref())?;
                println!("control-socket {}", socket.path().display());
                Some(socket)
            }
            None => None,
        };
        let status = server.status_source();
        let control = async {
            match &control_socket {
                Some(s) => s.serve(status).await,
                None => std::future::pending().await,
            }
        };
        // Before `ready`: SIGHUP's default action would end the process.
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("installing the SIGHUP handler")?;
        let reloads = follow_reloads(hangup, &args, stores, server.reloader());
        let stop = shutdown_signal()?;
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
        let stopped = tokio::select! {
            r = server.run(stop, grace) => r,
            never = reloads => match never {},
            never = watchdog => match never {},
            never = control => match never {},
        };
        drop(control_socket);
        stopped
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

/// SIGTERM and SIGINT, caught from now on: installed before the target says `ready`, so
/// that a stop asked for at once still stops it cleanly (the default action would end the
/// process without flushing, and leave its control socket behind).
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM"),
            _ = int.recv() => info!("SIGINT"),
        }
        crate::notify::stopping();
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{ConnStatus, PathStatus, SessionKeys, SessionStatus, TargetStatus};

    #[test]
    fn a_session_is_named_by_its_tsih() {
        assert_eq!(parse_tsih("7").unwrap(), 7);
        assert_eq!(parse_tsih("0x1f").unwrap(), 31);
        assert_eq!(parse_tsih("65535").unwrap(), 65535);
        for bad in ["0", "65536", "-1", "x", "", "0x", "1.5"] {
            assert!(parse_tsih(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_table_has_a_row_per_session_with_its_path() {
        assert_eq!(
            status_table(&TargetStatus {
                taken_at_ms: 0,
                sessions: vec![],
                congestion: None,
            }),
            "no sessions\n"
        );
        assert_eq!(
            status_table(&TargetStatus {
                taken_at_ms: 0,
                sessions: vec![],
                congestion: Some(crate::status::CongestionStatus {
                    name: Some("bbr".into()),
                    by: "default".into(),
                    why: "bbr, not rsv: no rights".into(),
                }),
            }),
            "congestion control (default): bbr, not rsv: no rights\nno sessions\n"
        );
        let conn = |cid, tls: Option<&str>, srtt_us, rate| ConnStatus {
            cid,
            local: "127.0.0.1:3260".parse().unwrap(),
            remote: "10.0.0.7:51544".parse().unwrap(),
            tls: tls.map(str::to_owned),
            header_digest: false,
            data_digest: false,
            target_max_recv_data_segment_length: 262144,
            initiator_max_recv_data_segment_length: 262144,
            age_s: 1.0,
            bytes_received: 0,
            bytes_sent: 0,
            path: Some(PathStatus {
                srtt_us,
                rttvar_us: 0,
                min_rtt_us: 0,
                cwnd: 10,
                mss: 1448,
                delivery_rate: rate,
                pacing_rate: 0,
                retransmits: 0,
                packets_in_flight: 0,
                bytes_in_flight: 0,
            }),
        };
        let s = TargetStatus {
            taken_at_ms: 0,
            sessions: vec![SessionStatus {
                tsih: 3,
                isid: "800000000001".into(),
                initiator: "iqn.2026-11.org.example:host1".into(),
                target: Some("iqn.2026-11.org.example:db".into()),
                luns: vec![0, 1],
                started_at_ms: 0,
                age_s: 7500.0,
                bytes_received: 1_300_000_000,
                bytes_sent: 117,
                keys: SessionKeys {
                    max_connections: 2,
                    initial_r2t: false,
                    immediate_data: true,
                    max_burst_length: 1 << 20,
                    first_burst_length: 1 << 18,
                    default_time2wait: 2,
                    default_time2retain: 20,
                    max_outstanding_r2t: 1,
                    data_pdu_in_order: true,
                    data_sequence_in_order: true,
                    error_recovery_level: 0,
                },
                connections: vec![
                    conn(0, Some("TLSv1.3"), 41_200, 60_000_000),
                    conn(1, None, 12_000, 57_650_000),
                ],
            }],
            congestion: None,
        };
        let t = status_table(&s);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 2, "{t}");
        let cells: Vec<&str> = rows[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "3",
                "iqn.2026-11.org.example:host1",
                "10.0.0.7:51544",
                "iqn.2026-11.org.example:db",
                "0,1",
                "2",
                "1/2",
                "2h05m",
                "1.21GiB",
                "117B",
                "41.2ms",
                "941mbit"
            ]
        );
    }
}
