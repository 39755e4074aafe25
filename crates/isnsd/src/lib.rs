//! `rsv isns`: an iSNS server (RFC 4171) for a home or a lab, on the registry of the
//! sans-IO `isns` crate (`isns::server`). This crate is its I/O: listeners, one task per
//! connection, the clock that expires registrations, the file that keeps them across a
//! restart, and delivery of state change notifications (SCN) over the connection each
//! node sent its SCNReg on, while that connection stays open.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use isns::auth::{self, AuthError, Identity, Verifier};
use isns::pdu::MAX_PAYLOAD;
use isns::server::{Caller, Notification, Registry};
use isns::{FunctionId, Reassembler, Received};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{info, warn};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry as MetricsRegistry;

#[derive(Args, Debug)]
#[command(after_help = "\
Serves iSNS on TCP: registration (DevAttrReg), queries (DevAttrQry, DevGetNext),
deregistration (DevDereg) and SCN registration from targets and initiators (rsv target
--isns, rsv ls isns://, open-iscsi, isnsadm). Every node sees every other (one discovery
domain). An entity that neither registers again nor sends any request within its
registration period is dropped. With --db the registrations are written to that file
after every change and read back at start. A node that registered for SCNs gets them over
the connection it registered on. Prints `listening ADDR` for each address (with --metrics,
`metrics ADDR` first), then `ready`.
SIGTERM or SIGINT: save and exit 0.

Authentication (RFC 4171 5.5, as open-isns with Security = 1): with --auth-key, every
answer and SCN is signed with that DSA key, and a request counts as its sender's only
when signed by a key enrolled in --key-store (a file per client named by its SPI holding
its public key in PEM, open-isns's ClientKeyStore layout). Only the SPI that registered
an entity may change or deregister it; unsigned requests, and those of SPIs nobody
enrolled, may only query; a bad signature or an old timestamp closes the connection.
Without --auth-key, a source may change only the entity it registered (or one its node
is in), and the answers are advisory: see docs/security.md.")]
pub struct IsnsArgs {
    /// Address to listen on (repeatable). Default 0.0.0.0:3205.
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: Vec<SocketAddr>,
    /// File that keeps the registrations across restarts.
    #[arg(long, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// Longest registration period granted, in seconds (a client may ask for less).
    #[arg(long, default_value_t = 900)]
    pub period: u32,
    /// The server's DSA private key (PKCS #8 PEM): turns authentication on.
    #[arg(long, value_name = "FILE", requires = "key_store")]
    pub auth_key: Option<PathBuf>,
    /// The SPI the server signs as (clients check the key, not the name).
    #[arg(long, value_name = "SPI", default_value = "rsv-isns")]
    pub auth_name: String,
    /// Directory of the clients' public keys, one PEM file per SPI named by it.
    #[arg(long, value_name = "DIR")]
    pub key_store: Option<PathBuf>,
    /// Largest difference in seconds between a signature's timestamp and our clock.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub replay_window: u64,
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics: requests by
    /// function and result, requests refused by authentication, nodes registered.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
}

/// What `/metrics` counts (`--metrics`).
#[derive(Debug, Default)]
struct Counts {
    requests: Family<RequestLabels, Counter>,
    auth_refused: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    function: &'static str,
    result: &'static str,
}

/// A request's function as a label: the RFC's functions a server answers, else `other`
/// (a peer must not make new series at will).
fn function_label(f: FunctionId) -> &'static str {
    match f {
        FunctionId::DEV_ATTR_REG => "dev_attr_reg",
        FunctionId::DEV_ATTR_QRY => "dev_attr_qry",
        FunctionId::DEV_GET_NEXT => "dev_get_next",
        FunctionId::DEV_DEREG => "dev_dereg",
        FunctionId::SCN_REG => "scn_reg",
        FunctionId::SCN_DEREG => "scn_dereg",
        FunctionId::ESI => "esi",
        FunctionId::HEARTBEAT => "heartbeat",
        _ => "other",
    }
}

/// The registry's node count at each scrape.
struct Nodes(Arc<Mutex<State>>);

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nodes")
    }
}

impl prometheus_client::collector::Collector for Nodes {
    fn encode(
        &self,
        mut enc: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let n = self
            .0
            .lock()
            .expect("registry lock")
            .registry
            .nodes()
            .count();
        prometheus_client::metrics::gauge::ConstGauge::new(n as i64).encode(enc.encode_descriptor(
            "rsv_isns_nodes",
            "Storage nodes (targets and initiators) registered",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?)
    }
}

/// The registry `/metrics` serves: the counts, and the nodes of `state` at each scrape.
fn metrics_registry(counts: &Counts, state: &Arc<Mutex<State>>) -> MetricsRegistry {
    let mut reg = MetricsRegistry::default();
    reg.register(
        "rsv_isns_requests",
        "Requests answered, by function and result (success or an error status)",
        counts.requests.clone(),
    );
    reg.register(
        "rsv_isns_auth_refused",
        "Requests refused by authentication (bad or missing signature, stale timestamp); \
         each closes its connection",
        counts.auth_refused.clone(),
    );
    reg.register_collector(Box::new(Nodes(state.clone())));
    reg
}

/// What authentication needs at run time: our key, the clients' keys as they are
/// enrolled (read from the key store when an SPI is first seen), their last timestamps.
struct Auth {
    me: Identity,
    store: PathBuf,
    verifier: Verifier,
}

impl Auth {
    fn load(args: &IsnsArgs) -> anyhow::Result<Option<Auth>> {
        let Some(key) = &args.auth_key else {
            return Ok(None);
        };
        let store = args
            .key_store
            .clone()
            .context("--auth-key needs --key-store")?;
        let pem =
            std::fs::read_to_string(key).with_context(|| format!("reading {}", key.display()))?;
        let me = Identity::from_pem(&args.auth_name, &pem)
            .with_context(|| format!("the server key {}", key.display()))?;
        anyhow::ensure!(
            store.is_dir(),
            "--key-store {}: not a directory",
            store.display()
        );
        Ok(Some(Auth {
            me,
            store,
            verifier: Verifier::enrolled(HashMap::new(), args.replay_window),
        }))
    }

    /// Who sent `r`: its SPI when signed by the key enrolled for it, anonymous when
    /// unsigned or signed by an SPI without a key; an error for a signature that fails.
    fn caller(&mut self, r: &Received, now: u64) -> Result<Option<String>, AuthError> {
        let Some(spi) = Verifier::spi_of(&r.seals) else {
            return Ok(None);
        };
        // Keys are read when an SPI is first seen, as open-isns's key store does, so that
        // a client enrolled while the server runs is known without a restart.
        if !self.verifier.knows(spi) && auth::check_spi(spi).is_ok() {
            let path = self.store.join(spi);
            if let Ok(pem) = std::fs::read_to_string(&path) {
                match auth::public_key_from_pem(&pem) {
                    Ok(k) => self.verifier.enroll(spi, k),
                    Err(e) => warn!("{}: {e}", path.display()),
                }
            }
        }
        match self.verifier.check(r.pdus, &r.seals, now) {
            Ok(spi) => Ok(Some(spi)),
            Err(AuthError::UnknownSpi(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

struct State {
    registry: Registry,
    /// Where each node's SCNs go: the connection of its SCNReg (lower-case names).
    listeners: HashMap<String, mpsc::UnboundedSender<Vec<u8>>>,
    xid: u16,
    db: Option<PathBuf>,
    auth: Option<Auth>,
}

impl State {
    fn deliver(&mut self, notes: Vec<Notification>) {
        let t = now();
        for n in notes {
            let key = n.to.to_ascii_lowercase();
            let Some(tx) = self.listeners.get(&key) else {
                continue;
            };
            self.xid = self.xid.wrapping_add(1);
            let wire = self.wire(&n.message(self.xid, t));
            if tx.send(wire).is_err() {
                self.listeners.remove(&key);
            } else {
                info!("SCN to {}: {} (bitmap 0x{:x})", n.to, n.changed, n.bitmap);
            }
        }
    }

    /// A message as sent: signed when authentication is on.
    fn wire(&self, m: &isns::Message) -> Vec<u8> {
        let w = m.encode(MAX_PAYLOAD);
        match &self.auth {
            Some(a) => a.me.seal(&w, now()),
            None => w,
        }
    }

    fn save(&self) {
        let Some(path) = &self.db else { return };
        if let Err(e) = write_atomic(path, &self.registry.save()) {
            warn!("saving the registrations to {}: {e}", path.display());
        }
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

pub fn run(args: IsnsArgs) -> anyhow::Result<()> {
    let registry = match &args.db {
        Some(p) if p.exists() => {
            let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            let r = Registry::load(args.period, &b);
            info!("{} nodes from {}", r.nodes().count(), p.display());
            r
        }
        _ => Registry::new(args.period),
    };
    let state = Arc::new(Mutex::new(State {
        registry,
        listeners: HashMap::new(),
        xid: 0,
        db: args.db.clone(),
        auth: Auth::load(&args)?,
    }));
    if let Some(a) = &state.lock().expect("registry lock").auth {
        info!(
            "authentication on: signing as {:?}, client keys in {}",
            a.me.spi(),
            a.store.display()
        );
    }
    let listen = if args.listen.is_empty() {
        vec![SocketAddr::from(([0, 0, 0, 0], isns::DEFAULT_PORT))]
    } else {
        args.listen.clone()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let counts = Arc::new(Counts::default());
    rt.block_on(async move {
        if let Some(addr) = args.metrics {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for metrics on {addr}"))?;
            println!("metrics {}", l.local_addr()?);
            let registry = Arc::new(metrics_registry(&counts, &state));
            tokio::spawn(rsv_metrics::serve(l, registry));
        }
        for addr in &listen {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr}"))?;
            println!("listening {}", l.local_addr()?);
            let state = state.clone();
            let counts = counts.clone();
            tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, peer)) => {
                            tokio::spawn(serve(state.clone(), counts.clone(), s, peer));
                        }
                        Err(e) => {
                            warn!("accept: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            });
        }
        let ticker = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let mut st = ticker.lock().expect("registry lock");
                let before = st.registry.nodes().count();
                let notes = st.registry.expire(now());
                if st.registry.nodes().count() != before {
                    info!("expired: {} nodes left", st.registry.nodes().count());
                    st.save();
                }
                st.deliver(notes);
            }
        });
        println!("ready");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        shutdown_signal().await;
        state.lock().expect("registry lock").save();
        info!("stopped");
        Ok(())
    })
}

async fn serve(state: Arc<Mutex<State>>, counts: Arc<Counts>, stream: TcpStream, peer: SocketAddr) {
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if wr.write_all(&b).await.is_err() {
                break;
            }
        }
    });
    let mut dec = Reassembler::new();
    let mut buf = vec![0u8; 16 << 10];
    'conn: loop {
        loop {
            let got = match dec.next_received() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    warn!("{peer}: {e}; closing");
                    break 'conn;
                }
            };
            let msg = &got.message;
            // Answers to our SCNs need nothing further.
            if msg.function.is_response() {
                continue;
            }
            tracing::debug!("{peer}: {msg:?}");
            let mut st = state.lock().expect("registry lock");
            let t = now();
            let spi = match st.auth.as_mut().map(|a| a.caller(&got, t)) {
                None => None,
                Some(Ok(spi)) => spi,
                Some(Err(e)) => {
                    counts.auth_refused.inc();
                    // As open-isns: no answer to a message that fails its check (there is
                    // no status for it); closing tells the client at once.
                    warn!("{peer}: {} refused: {e}; closing", msg.function.name());
                    break 'conn;
                }
            };
            let caller = match (&st.auth, &spi) {
                (None, _) => Caller::Unauthenticated,
                (Some(_), Some(spi)) => Caller::Authenticated(spi),
                (Some(_), None) => Caller::Anonymous,
            };
            let (rsp, notes) = st.registry.handle_from(msg, t, caller);
            tracing::debug!("{peer}: answer {rsp:?}");
            let ok = rsp.status.is_some_and(|s| s.is_success());
            counts
                .requests
                .get_or_create(&RequestLabels {
                    function: function_label(msg.function),
                    result: if ok { "success" } else { "error" },
                })
                .inc();
            info!(
                "{peer}: {} from {}{} -> {}",
                msg.function.name(),
                msg.source().and_then(|a| a.as_str()).unwrap_or("?"),
                spi.as_deref()
                    .map_or(String::new(), |s| format!(" (SPI {s})")),
                rsp.status.map_or(String::new(), |s| s.to_string())
            );
            if ok && msg.function == FunctionId::SCN_REG {
                if let Some(n) = msg.keys().first().and_then(|a| a.as_str()) {
                    st.listeners.insert(n.to_ascii_lowercase(), tx.clone());
                }
            }
            if ok
                && matches!(
                    msg.function,
                    FunctionId::DEV_ATTR_REG
                        | FunctionId::DEV_DEREG
                        | FunctionId::SCN_REG
                        | FunctionId::SCN_DEREG
                )
            {
                st.save();
            }
            let _ = tx.send(st.wire(&rsp));
            st.deliver(notes);
        }
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => dec.push(&buf[..n]),
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT"),
    }
}
