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
use isns::pdu::MAX_PAYLOAD;
use isns::server::{Notification, Registry};
use isns::{FunctionId, Reassembler};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{info, warn};

#[derive(Args, Debug)]
#[command(after_help = "\
Serves iSNS on TCP: registration (DevAttrReg), queries (DevAttrQry, DevGetNext),
deregistration (DevDereg) and SCN registration from targets and initiators (rsv target
--isns, rsv ls isns://, open-iscsi, isnsadm). Every node sees every other (one discovery
domain). An entity that neither registers again nor sends any request within its
registration period is dropped. With --db the registrations are written to that file
after every change and read back at start. A node that registered for SCNs gets them over
the connection it registered on. Prints `listening ADDR` for each address, then `ready`.
SIGTERM or SIGINT: save and exit 0.")]
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
            if tx.send(n.message(self.xid, t).encode(MAX_PAYLOAD)).is_err() {
                self.listeners.remove(&key);
            } else {
                info!("SCN to {}: {} (bitmap 0x{:x})", n.to, n.changed, n.bitmap);
            }
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
    }));
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
    rt.block_on(async move {
        for addr in &listen {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr}"))?;
            println!("listening {}", l.local_addr()?);
            let state = state.clone();
            tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, peer)) => {
                            tokio::spawn(serve(state.clone(), s, peer));
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

async fn serve(state: Arc<Mutex<State>>, stream: TcpStream, peer: SocketAddr) {
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
            let msg = match dec.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    warn!("{peer}: {e}; closing");
                    break 'conn;
                }
            };
            // Answers to our SCNs need nothing further.
            if msg.function.is_response() {
                continue;
            }
            tracing::debug!("{peer}: {msg:?}");
            let mut st = state.lock().expect("registry lock");
            let (rsp, notes) = st.registry.handle(&msg, now());
            tracing::debug!("{peer}: answer {rsp:?}");
            let ok = rsp.status.is_some_and(|s| s.is_success());
            info!(
                "{peer}: {} from {} -> {}",
                msg.function.name(),
                msg.source().and_then(|a| a.as_str()).unwrap_or("?"),
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
            let _ = tx.send(rsp.encode(MAX_PAYLOAD));
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
