//! The daemon: opens the LUNs, listens on the portals and starts a connection for each
//! accepted socket, puts a reloaded configuration in force, and shuts down gracefully.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use backstore::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
pub use crate::node::{LunStore, TargetNode};
use crate::open::{open_target, Kept};
use crate::session::ConnEvent;
use crate::shared::{Live, Shared};
use crate::wire::PortalTls;

/// How long a shutting-down target gives the initiator to log out when it asks it to.
const LOGOUT_WITHIN_SECS: u16 = 5;

/// Hands a running target connections that did not come through its listeners: an
/// in-memory carrier in tests (`net::transport::memory_pair`), later a tunnel's far end.
#[derive(Clone)]
pub struct Connector(Arc<Shared>);

impl Connector {
    /// Serves `stream` as if a portal had accepted it: login, then full feature phase.
    pub fn serve(&self, stream: net::transport::Stream) {
        let peer = stream
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        crate::wire::tune(&self.0, stream.socket(), peer);
        let shared = self.0.clone();
        match &self.0.cores {
            None => drop(tokio::spawn(crate::conn::serve(shared, stream, peer))),
            Some(cores) => cores.spawn(None, move |placed| async move {
                crate::conn::serve(shared, stream, peer).await;
                drop(placed);
            }),
        }
    }
}

/// A target serving in the background ([`Server::spawn`]); dropping it stops the target.
pub struct Running {
    portals: Vec<SocketAddr>,
    connector: Connector,
    _stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub fn portals(&self) -> &[SocketAddr] {
        &self.portals
    }

    pub fn connector(&self) -> Connector {
        self.connector.clone()
    }

    /// The store and change map of LUN `lun` of target `iqn` (case-insensitive); see
    /// [`LunStore`].
    pub fn lun_store(&self, iqn: &str, lun: u16) -> Option<LunStore> {
        self.connector.0.lun_store(iqn, lun)
    }

    /// Takes snapshots of the target's sessions ([`crate::status`]).
    pub fn status_source(&self) -> crate::status::Source {
        crate::status::Source(self.connector.0.clone())
    }

    /// Stops as SIGTERM does (running commands finish, LUNs are flushed) and waits.
    pub async fn stop(self) -> anyhow::Result<()> {
        let Running { _stop, done, .. } = self;
        drop(_stop);
        done.await?
    }
}

/// A target ready to accept connections.
pub struct Server {
    shared: Arc<Shared>,
    /// Each with its portal's TLS, if it has any.
    listeners: Vec<(TcpListener, Option<Arc<PortalTls>>)>,
    shutdown_tx: watch::Sender<bool>,
    /// The targets iSNS registers, which a reload changes.
    isns_targets: Arc<watch::Sender<crate::isns::Targets>>,
    /// Stops the connection threads when the server is done.
    cores_stop: Option<crate::cores::Stop>,
    /// Where `/metrics` is served (`[metrics]`).
    metrics: Option<TcpListener>,
}

/// The targets as iSNS registers them: IQN and alias.
fn isns_targets(targets: &[Arc<TargetNode>]) -> crate::isns::Targets {
    targets
        .iter()
        .map(|t| (t.iqn.clone(), t.alias.clone()))
        .collect()
}

/// The targets in force, as the last configuration reload left them ([`Server::live`]).
#[derive(Clone)]
pub struct LiveTargets(Arc<Shared>);

impl LiveTargets {
    pub fn targets(&self) -> Vec<Arc<TargetNode>> {
        self.0.live().targets.clone()
    }
}

/// Puts a new configuration in force in a running target ([`Server::reloader`]); see
/// [`Reloader::reload`].
pub struct Reloader {
    shared: Arc<Shared>,
    isns_targets: Arc<watch::Sender<crate::isns::Targets>>,
    /// The configuration in force: the last one applied.
    config: Mutex<Config>,
}

impl Reloader {
    /// One line saying what is served, for the service manager.
    pub(crate) fn status(&self) -> String {
        self.shared.status()
    }

    /// Puts `new` (read and validated) in force as far as a running target can
    /// (`crate::reload`), opening the stores of LUNs added or changed with `stores`'
    /// kinds; nothing changes unless all of it can. Ok: one line saying what was done.
    pub fn reload(&self, new: &Config, stores: &Registry) -> anyhow::Result<String> {
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        let plan = crate::reload::plan(&config, new).map_err(anyhow::Error::msg)?;
        let live = self.shared.live();
        let running = |iqn: &str| {
            live.targets
                .iter()
                .find(|t| t.iqn.eq_ignore_ascii_case(iqn))
        };
        // The LUNs that run on, each with its unit and store.
        let mut keep: BTreeMap<String, Kept> = BTreeMap::new();
        let mut taken = HashSet::new();
        for t in &plan.config.targets {
            let Some(node) = running(&t.iqn) else {
                continue;
            };
            let change = plan
                .changed
                .iter()
                .find(|c| c.iqn.eq_ignore_ascii_case(&t.iqn));
            let kept: Kept = node
                .luns
                .iter()
                .filter(|(id, _)| change.is_none_or(|c| c.keeps(**id)))
                .filter_map(|(id, lu)| Some((*id, (lu.clone(), node.stores.get(id)?.clone()))))
                .collect();
            for (_, store) in kept.values() {
                if let Some(map) = &store.changes {
                    taken.insert(map.path().to_path_buf());
                }
            }
            keep.insert(t.iqn.to_ascii_lowercase(), kept);
        }
        let mut targets = Vec::new();
        let none = Kept::new();
        for t in &plan.config.targets {
            let kept = keep.get(&t.iqn.to_ascii_lowercase()).unwrap_or(&none);
            targets.push(Arc::new(open_target(
                t,
                &plan.config,
                stores,
                &mut taken,
                kept,
            )?));
        }
        // Everything opened: from here on nothing fails.
        let registered = isns_targets(&targets);
        let live = Live {
            targets,
            discovery_chap: plan.config.discovery.chap.clone(),
        };
        // Before the LUs it adds are reachable: they abort tasks as the others do.
        self.shared.lend_aborter(&live);
        let dropped = self.shared.replace_live(live);
        self.isns_targets.send_if_modified(|t| {
            let changed = *t != registered;
            *t = registered;
            changed
        });
        if !dropped.is_empty() {
            // What initiators wrote there reaches the medium before it is closed.
            tokio::task::spawn_blocking(move || {
                for d in dropped {
                    match d.lu.flush() {
                        Ok(()) => info!("target {} LUN {}: flushed and closed", d.target, d.lun),
                        Err(e) => warn!("target {} LUN {}: flushing: {e}", d.target, d.lun),
                    }
                }
            });
        }
        let summary = plan.summary();
        *config = plan.config;
        Ok(summary)
    }
}

/// A listening socket on `addr` (address reuse and backlog as tokio's `bind`), whose
/// accepted connections inherit `recv_buffer`: their first window (see
/// `net::first_window_buffer`), so that a long path's is not the kernel's 64 KB.
fn listen(addr: SocketAddr, recv_buffer: Option<usize>) -> std::io::Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    if let Some(n) = recv_buffer {
        if let Err(e) = net::set_recv_buffer(sock.as_fd(), n) {
            warn!("portal {addr}: a receive buffer of {n} bytes: {e}");
        }
    }
    sock.bind(addr)?;
    sock.listen(1024)
}

impl Server {
    /// Opens every LUN, each store with the factory `stores` has for its kind, and binds
    /// every portal.
    pub async fn bind(config: Config, stores: &Registry) -> anyhow::Result<Server> {
        config.validate().map_err(anyhow::Error::msg)?;
        let mut targets = Vec::new();
        let mut change_maps = std::collections::HashSet::new();
        for t in &config.targets {
            let node = Arc::new(open_target(
                t,
                &config,
                stores,
                &mut change_maps,
                &BTreeMap::new(),
            )?);
            targets.push(node);
        }
        if config.session.congestion.is_none() {
            // Decided (and rsv loaded, where it can be) before the first login, once: the
            // verifier's time is not a login's, and the log says the choice at start.
            tokio::task::spawn_blocking(net::default_congestion)
                .await
                .context("deciding the default congestion control")?;
        }
        let mut listeners = Vec::new();
        let mut portals = Vec::new();
        // Read once: the limits are the namespace's, the same for every portal.
        let first_window = net::first_window(config.session.recv_buffer, config.session.auto_tune);
        for p in &config.portals {
            // Key and certificates first: a portal whose TLS cannot work does not open.
            let tls = match &p.tls {
                None => None,
                Some(t) => Some(Arc::new(PortalTls {
                    tls: net::tls::ServerTls::new(&t.files())
                        .with_context(|| format!("portal {}: tls", p.listen))?,
                    require: t.require,
                })),
            };
            let l = listen(p.listen, first_window)
                .with_context(|| format!("listening on {}", p.listen))?;
            let addr = l.local_addr()?;
            if let Some(t) = &tls {
                info!(
                    "portal {addr}: TLS 1.3, certificate {}{}{}",
                    net::tls::fingerprint_text(&t.tls.fingerprint),
                    if t.tls.mutual {
                        ", client certificates required"
                    } else {
                        ""
                    },
                    if t.require {
                        ""
                    } else {
                        ", plaintext logins too"
                    }
                );
            }
            portals.push(addr);
            listeners.push((l, tls));
        }
        let metrics = match &config.metrics {
            None => None,
            Some(m) => Some(
                TcpListener::bind(m.listen)
                    .await
                    .with_context(|| format!("listening for metrics on {}", m.listen))?,
            ),
        };
        let (shutdown_tx, shutdown) = watch::channel(false);
        let (cores, cores_stop) = match config.threads.count() {
            None => (None, None),
            Some(n) => {
                let (cores, stop) =
                    crate::cores::Cores::start(n).context("starting the connection threads")?;
                (Some(cores), Some(stop))
            }
        };
        let (isns_targets, _) = watch::channel(isns_targets(&targets));
        let shared = Arc::new(Shared::new(config, targets, portals, shutdown, cores));
        shared.lend_aborter(&shared.live());
        Ok(Server {
            shared,
            listeners,
            shutdown_tx,
            isns_targets: Arc::new(isns_targets),
            cores_stop,
            metrics,
        })
    }

    /// Where `/metrics` is served, if it is (port 0 resolved).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Where connections from elsewhere than the portals come in; see [`Connector`].
    pub fn connector(&self) -> Connector {
        Connector(self.shared.clone())
    }

    pub fn portals(&self) -> &[SocketAddr] {
        &self.shared.portals
    }

    /// The targets in force.
    pub fn targets(&self) -> Vec<Arc<TargetNode>> {
        self.shared.live().targets.clone()
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The targets in force at each call, for code beside the server that must follow
    /// configuration reloads (the sync agent).
    pub fn live(&self) -> LiveTargets {
        LiveTargets(self.shared.clone())
    }

    /// What puts a reloaded configuration in force while [`Server::run`] serves.
    /// Takes snapshots of the target's sessions ([`crate::status`]); it outlives `run`'s
    /// start, for services beside the target (the control socket, a metrics endpoint).
    pub fn status_source(&self) -> crate::status::Source {
        crate::status::Source(self.shared.clone())
    }

    pub fn reloader(&self) -> Reloader {
        Reloader {
            shared: self.shared.clone(),
            isns_targets: self.isns_targets.clone(),
            config: Mutex::new(self.shared.config.clone()),
        }
    }

    /// The store and change map of LUN `lun` of target `iqn` (case-insensitive); see
    /// [`LunStore`].
    pub fn lun_store(&self, iqn: &str, lun: u16) -> Option<LunStore> {
        self.shared.lun_store(iqn, lun)
    }

    /// Serves in the background on the current tokio runtime until the returned handle
    /// is stopped or dropped: a target embedded in another program, or in a test.
    pub fn spawn(self, grace: Duration) -> Running {
        let portals = self.portals().to_vec();
        let connector = self.connector();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(self.run(
            async {
                let _ = stopped.await;
            },
            grace,
        ));
        Running {
            portals,
            connector,
            _stop: stop,
            done,
        }
    }

    /// Serves until `stop` resolves, then drains: no new connections, initiators asked to
    /// log out, in-flight commands finished (bounded by `grace`), LUNs flushed (bounded by
    /// `grace` again).
    pub async fn run(
        self,
        stop: impl std::future::Future<Output = ()>,
        grace: Duration,
    ) -> anyhow::Result<()> {
        let Server {
            shared,
            listeners,
            shutdown_tx,
            isns_targets,
            cores_stop,
            metrics,
        } = self;
        // On this runtime, beside the accept loops: a scrape encodes atomics and a status
        // snapshot taken as it goes (TCP_INFO read from duplicates of the connections'
        // sockets, no connection asked). Served through the drain, until this returns.
        let _metrics = metrics.map(|l| {
            let max_series = shared.config.metrics.as_ref().map_or(0, |m| m.max_series);
            let registry = crate::metrics::metrics(&shared, max_series);
            AbortOnDrop(tokio::spawn(rsv_metrics::serve(l, Arc::new(registry))))
        });
        let registrar = shared.config.isns.as_ref().and_then(|cfg| {
            let targets = isns_targets.borrow().clone();
            crate::isns::Registrar::new(cfg, &targets, &shared.portals, shared.config.portal_group)
        });
        let registration = registrar
            .map(|r| tokio::spawn(r.run(shutdown_tx.subscribe(), isns_targets.subscribe())));
        let mut accept_tasks = Vec::new();
        for (l, tls) in listeners {
            let shared = shared.clone();
            accept_tasks.push(tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((tcp, peer)) => {
                            let open = match shared.open_connection() {
                                Ok(open) => open,
                                Err(n) => {
                                    shared.events.limit(crate::stats::Limit::OpenConnections);
                                    crate::loglimit::peer_log!(
                                        warn,
                                        "{peer}: connection closed at once: {n} open, \
                                         max_open_connections"
                                    );
                                    continue;
                                }
                            };
                            let shared = shared.clone();
                            let tls = tls.clone();
                            tokio::spawn(async move {
                                crate::wire::tune(&shared, Some(tcp.as_fd()), peer);
                                let Some((first, n)) =
                                    crate::wire::first_bytes(&shared, &tcp, peer).await
                                else {
                                    return;
                                };
                                let Some(cores) = &shared.cores else {
                                    serve_accepted(shared, tcp, first[0], peer, tls, open).await;
                                    return;
                                };
                                // A connection joining a session goes to the session's
                                // thread: their commands wait on each other's CmdSN.
                                let home = crate::wire::login_tsih(&first[..n])
                                    .and_then(|tsih| shared.session(tsih))
                                    .and_then(|s| s.home());
                                let tcp = match tcp.into_std() {
                                    Ok(tcp) => tcp,
                                    Err(e) => {
                                        warn!("{peer}: {e}");
                                        return;
                                    }
                                };
                                let first = first[0];
                                let to = shared.clone();
                                cores.spawn(home, move |placed| async move {
                                    // Registered with this thread's reactor.
                                    match tokio::net::TcpStream::from_std(tcp) {
                                        Ok(tcp) => {
                                            serve_accepted(to, tcp, first, peer, tls, open).await
                                        }
                                        Err(e) => warn!("{peer}: {e}"),
                                    }
                                    drop(placed);
                                });
                            });
                        }
                        Err(e) => {
                            // EMFILE and friends: back off instead of spinning.
                            warn!("accept: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }));
        }
        stop.await;
        info!("shutting down: no new connections, draining");
        for t in &accept_tasks {
            t.abort();
        }
        let _ = shutdown_tx.send(true);
        // Initiators stop finding the target before its sessions end.
        if let Some(r) = registration {
            if tokio::time::timeout(Duration::from_secs(12), r)
                .await
                .is_err()
            {
                warn!("iSNS: deregistration still unanswered; going on");
            }
        }
        for s in shared.all_sessions() {
            s.broadcast(|| ConnEvent::RequestLogout(LOGOUT_WITHIN_SECS));
        }
        if tokio::time::timeout(grace, shared.wait_idle())
            .await
            .is_err()
        {
            warn!("commands still running after {grace:?}; closing anyway");
        }
        for s in shared.all_sessions() {
            s.broadcast(|| ConnEvent::Close("target shutting down"));
        }
        // A flush waits on devices (or another target, for a remote store): on a worker
        // that may block, as every other call into a store. It too gets `grace`: a remote
        // member whose disk server is gone would hold it through the session's recovery
        // (a minute and more), and a stop should not.
        let flushing = shared.clone();
        let flush = tokio::task::spawn_blocking(move || {
            let mut failed = false;
            for t in &flushing.live().targets {
                for (id, lu) in &t.luns {
                    if let Err(e) = lu.flush() {
                        warn!("flushing {} LUN {id}: {e}", t.iqn);
                        failed = true;
                    }
                }
            }
            failed
        });
        let Ok(failed) = tokio::time::timeout(grace, flush).await else {
            bail!("LUNs still flushing after {grace:?}; stopping without waiting for them");
        };
        if failed? {
            bail!("some LUNs could not be flushed");
        }
        drop(cores_stop);
        info!("stopped cleanly");
        Ok(())
    }
}

/// A task that ends when this is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An accepted connection from its transport's set-up to its end.
async fn serve_accepted(
    shared: Arc<Shared>,
    tcp: tokio::net::TcpStream,
    first: u8,
    peer: SocketAddr,
    tls: Option<Arc<PortalTls>>,
    open: crate::shared::OpenConnection,
) {
    let Some(stream) = crate::wire::accept(&shared, tcp, first, peer, tls.as_deref()).await else {
        return;
    };
    crate::conn::serve(shared, stream, peer).await;
    drop(open);
}

#[cfg(test)]
mod tests {
    use super::*;
    use backstore::{Backstore, OpenContext, OpenError, Param, StoreFactory, StoreSpec};
    use scsi::{Command, LogicalUnit, Nexus, Response};

    /// `alias:?members=[SPEC]`: its one member, under a kind the target has never heard of.
    struct Alias;

    impl StoreFactory for Alias {
        fn kind(&self) -> &str {
            "alias"
        }
        fn summary(&self) -> &str {
            "another store under a new name"
        }
        fn params(&self) -> &[Param] {
            &[Param {
                name: "members",
                required: true,
                help: "the store",
            }]
        }
        fn check(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<String, OpenError> {
            ctx.check(&spec.members()[0])
        }
        fn open(
            &self,
            spec: &StoreSpec,
            ctx: &OpenContext<'_>,
        ) -> Result<Arc<dyn Backstore>, OpenError> {
            ctx.open(&spec.members()[0])
        }
    }

    /// A configuration on a kernel-chosen loopback port: `data_dir` when given, then `body`
    /// (targets and LUNs, as `target` and `lun` write them).
    fn test_config(data_dir: Option<&std::path::Path>, body: &str) -> Config {
        let dir = data_dir.map_or(String::new(), |d| {
            format!("data_dir = \"{}\"\n", d.display())
        });
        Config::parse(
            &format!("portals = [\"127.0.0.1:0\"]\n{dir}{body}"),
            "test.toml",
        )
        .unwrap()
    }

    /// A `[[target]]` table named `iqn.2026-11.org.reservoir:NAME`.
    fn target(name: &str) -> String {
        format!("[[target]]\niqn = \"iqn.2026-11.org.reservoir:{name}\"\n")
    }

    /// A `[[target.lun]]` table: `id` on `store`.
    fn lun(id: u16, store: &str) -> String {
        format!("[[target.lun]]\nid = {id}\nstore = \"{store}\"\n")
    }

    /// Why `Server::bind` refused `config`, with its causes.
    async fn bind_error(config: Config, stores: &Registry) -> String {
        match Server::bind(config, stores).await {
            Ok(_) => panic!("the configuration was taken"),
            Err(e) => format!("{e:#}"),
        }
    }

    fn lun_config(dir: &std::path::Path, store: &str) -> Config {
        let luns = lun(0, store) + &lun(1, "ram:?size=1MiB");
        test_config(Some(dir), &(target("specs") + &luns))
    }

    #[tokio::test]
    async fn luns_open_with_the_kinds_of_the_registry_given() {
        let dir = tempfile::tempdir().unwrap();
        let config = lun_config(dir.path(), "alias:?members=[file:a.img?size=1MiB]");
        let e = Server::bind(config.clone(), &Registry::with_builtins())
            .await
            .err()
            .expect("a kind the registry lacks");
        let e = format!("{e:#}");
        assert!(
            e.contains("LUN 0") && e.contains("\"alias\"") && e.contains("file, null, ram"),
            "{e}"
        );

        let mut stores = Registry::with_builtins();
        stores.register(Alias);
        let server = Server::bind(config, &stores).await.unwrap();
        let targets = server.targets();
        let t = &targets[0];
        assert_eq!(t.luns[&0].capacity_blocks(), 2048);
        // The file under the alias keeps APTPL reservations beside its image; ram nowhere.
        assert_eq!(
            t.luns[&0].config().pr_file,
            Some(dir.path().join("a.img.pr"))
        );
        assert_eq!(t.luns[&1].config().pr_file, None);

        let e = bind_error(lun_config(dir.path(), "ram:?size=1000"), &stores).await;
        assert!(
            e.contains("LUN 0") && e.contains("not a positive multiple of the block size 512"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_reload_keeps_unchanged_luns_and_applies_whole_or_not_at_all() {
        let config =
            |luns: &str| test_config(None, &(target("r") + &lun(0, "ram:?size=1MiB") + luns));
        let stores = Registry::with_builtins();
        let server = Server::bind(config(""), &stores).await.unwrap();
        let reloader = server.reloader();
        let lu0 = server.targets()[0].luns[&0].clone();
        let added = config("[[target.lun]]\nid = 1\nstore = \"ram:?size=2MiB\"\n");
        let said = reloader.reload(&added, &stores).unwrap();
        assert_eq!(said, "target iqn.2026-11.org.reservoir:r: LUN +1");
        let t = server.targets()[0].clone();
        assert!(Arc::ptr_eq(&t.luns[&0], &lu0), "LUN 0 was reopened");
        assert_eq!(t.luns[&1].capacity_blocks(), 4096);
        // A store that does not open: nothing changes, not even the LUN that would.
        let bad = config(
            "[[target.lun]]\nid = 1\nstore = \"ram:?size=2MiB\"\n\
             [[target.lun]]\nid = 2\nstore = \"nosuch:?size=1MiB\"\n\
             [[target]]\niqn = \"iqn.2026-11.org.reservoir:s\"\n",
        );
        let e = format!("{:#}", reloader.reload(&bad, &stores).unwrap_err());
        assert!(e.contains("LUN 2") && e.contains("nosuch"), "{e}");
        let now = server.targets();
        assert_eq!((now.len(), now[0].lun_ids()), (1, vec![0, 1]));
        assert!(Arc::ptr_eq(&now[0], &t));
        let removed = config("");
        reloader.reload(&removed, &stores).unwrap();
        assert_eq!(server.targets()[0].lun_ids(), vec![0]);
    }

    fn tracked_config(dir: &std::path::Path, luns: &str) -> Config {
        test_config(Some(dir), &(target("track") + luns))
    }

    #[tokio::test]
    async fn tracked_luns_mark_what_scsi_writes_and_hand_their_map_out() {
        let dir = tempfile::tempdir().unwrap();
        let config = tracked_config(
            dir.path(),
            "[[target.lun]]\nid = 0\nstore = \"file:a.img?size=8MiB\"\ntrack = true\n\
             [[target.lun]]\nid = 1\nstore = \"ram:?size=8MiB\"\ntrack = true\n\
             track_file = \"ram1.changes\"\ntrack_unit = \"64KiB\"\n\
             [[target.lun]]\nid = 2\nstore = \"ram:?size=1MiB\"\n",
        );
        let server = Server::bind(config, &Registry::with_builtins())
            .await
            .unwrap();
        let iqn = "IQN.2026-11.org.reservoir:TRACK";
        let file = server.lun_store(iqn, 0).unwrap();
        let map = file.changes.clone().unwrap();
        assert_eq!(map.path(), dir.path().join("a.img.changes"));
        assert_eq!((map.unit(), map.units()), (1 << 20, 8));
        // A new map knows no history: everything goes with the first sync.
        assert_eq!(map.dirty_bytes(), 8 << 20);
        let first = map.freeze().unwrap();
        map.release(first.id()).unwrap();
        let ram = server.lun_store(iqn, 1).unwrap().changes.unwrap();
        assert_eq!(ram.path(), dir.path().join("ram1.changes"));
        assert_eq!(ram.unit(), 64 << 10);
        assert!(server.lun_store(iqn, 2).unwrap().changes.is_none());
        assert!(server.lun_store(iqn, 3).is_none());
        // The store handed out is the one under the tracking: its description says so.
        assert!(!file.store.description().contains("tracked"));

        let targets = server.targets();
        let t = &targets[0];
        let lu = &t.luns[&0];
        exec(lu, &[0, 0, 0, 0, 0, 0], &[]); // power-on unit attention
                                            // WRITE(10) of 2 blocks at LBA 4096 (2 MiB), WRITE SAME(16) with UNMAP of 8
                                            // blocks at 6 MiB.
        let write = [0x2a, 0, 0, 0, 0x10, 0, 0, 0, 2, 0];
        assert_eq!(exec(lu, &write, &[0x5c; 1024]).status, 0);
        let mut same = vec![0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        same[2..10].copy_from_slice(&(6u64 << 11).to_be_bytes());
        same[13] = 8;
        assert_eq!(exec(lu, &same, &[0; 512]).status, 0);
        let dirty: Vec<u64> = (0..map.units()).filter(|&u| map.is_dirty(u)).collect();
        assert_eq!(dirty, [2, 6]);
        drop(server);

        // A ram store has no place for the map.
        let ram = lun(5, "ram:?size=1MiB") + "track = true\n";
        let e = bind_error(tracked_config(dir.path(), &ram), &Registry::with_builtins()).await;
        assert!(e.contains("LUN 5") && e.contains("track_file"), "{e}");

        // One map for two LUNs.
        let two = lun(0, "file:a.img")
            + "track = true\n"
            + &lun(6, "ram:?size=8MiB")
            + "track = true\ntrack_file = \"a.img.changes\"\n";
        let e = bind_error(tracked_config(dir.path(), &two), &Registry::with_builtins()).await;
        assert!(e.contains("LUN 6") && e.contains("another LUN's"), "{e}");
    }

    fn exec(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Response {
        lu.execute(&Command {
            cdb,
            data_out,
            nexus: Nexus(1),
        })
    }

    /// The NAA designator (VPD page 83h) as an identification CSCD descriptor.
    fn cscd(lu: &LogicalUnit) -> Vec<u8> {
        let v = exec(lu, &[0x12, 1, 0x83, 1, 0, 0], &[]).data_in;
        let mut i = 4;
        while v[i + 1] & 0x0f != 3 {
            i += 4 + v[i + 3] as usize;
        }
        let len = v[i + 3] as usize;
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4..8].copy_from_slice(&v[i..i + 4]);
        d[8..8 + len].copy_from_slice(&v[i + 4..i + 4 + len]);
        d[30] = 0x02; // 512-byte blocks
        d
    }

    #[tokio::test]
    async fn extended_copy_reaches_the_other_luns_of_the_target() {
        let ram = "ram:?size=1MiB";
        let copy = target("copy") + &lun(0, ram) + &lun(3, ram);
        let config = test_config(None, &(copy + &target("elsewhere") + &lun(0, ram)));
        let server = Server::bind(config, &Registry::with_builtins())
            .await
            .unwrap();
        let targets = server.targets();
        let (a, b) = (&targets[0].luns[&0], &targets[0].luns[&3]);
        let other = &targets[1].luns[&0];
        for lu in [a, b, other] {
            exec(lu, &[0, 0, 0, 0, 0, 0], &[]); // power-on unit attention
        }
        let mut write = vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 2, 0];
        assert_eq!(exec(a, &write, &[0x5c; 1024]).status, 0);

        let list = |dst: &LogicalUnit| {
            let mut p = vec![0u8; 16];
            p[1] = 0x18; // LIST ID USAGE 11b: no list identifier
            p[3] = 64;
            p[11] = 28;
            p.extend(cscd(a));
            p.extend(cscd(dst));
            let mut seg = vec![0u8; 28];
            seg[0] = 0x02;
            seg[3] = 24;
            seg[7] = 1; // destination: the second CSCD descriptor
            seg[11] = 2;
            seg[27] = 40;
            p.extend(seg);
            p
        };
        // Sent by a session that sees the whole target (a masked one's view is tested in
        // tests/masking.rs).
        let xcopy = |lu: &LogicalUnit, p: &[u8]| {
            let mut c = vec![0u8; 16];
            c[0] = 0x83;
            c[13] = p.len() as u8;
            let cmd = Command {
                cdb: &c,
                data_out: p,
                nexus: Nexus(1),
            };
            lu.execute_abortable(&cmd, &*targets[0], &|| false)
        };
        // Sent to either LU of the target, the copy goes from LU 0 to LU 3.
        for to in [a, b] {
            write[5] = 40;
            let r = xcopy(to, &list(b));
            assert_eq!(r.status, 0, "{:02x?}", r.sense);
            let read = [0x28, 0, 0, 0, 0, 40, 0, 0, 2, 0];
            assert_eq!(exec(b, &read, &[]).data_in, vec![0x5c; 1024]);
            assert_eq!(exec(b, &write, &[0; 1024]).status, 0);
        }
        // Another target's LU is not reachable.
        let r = xcopy(a, &list(other));
        let s = r.sense.unwrap();
        assert_eq!((s[2] & 0x0f, s[12], s[13]), (0x0a, 0x08, 0x04));
    }
}
