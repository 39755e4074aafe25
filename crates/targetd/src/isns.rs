//! Registration with an iSNS server (RFC 4171), the target's only iSNS socket code: at
//! start a DevAttrReg of the network entity, its portals, every target node with its
//! alias and the portal groups (all portals in group 1); again within each period the
//! server grants; after a configuration reload, at once, a DevAttrReg that replaces the
//! entity's registration with the targets now configured (targets added, removed or
//! realiased follow); a DevDereg of the entity at shutdown. The messages are built and
//! read by the sans-IO `isns` crate.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use isns::objects::{self, Entity, Node};
use isns::pdu::MAX_PAYLOAD;
use isns::{Message, Reassembler};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config;

/// One exchange with the server may take this long, connection included.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed registration, the next try comes this much later (or at half the
/// period, if that is sooner).
const RETRY: Duration = Duration::from_secs(5);

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the target registers.
pub(crate) struct Registrar {
    server: String,
    /// With `[isns.auth]`: what signs our messages and checks the server's.
    auth: Option<std::sync::Mutex<isns::auth::ClientAuth>>,
    entity: Entity,
    /// The name the messages come from: the first target's.
    source: String,
}

/// The target nodes to register: each target's IQN and alias.
pub(crate) type Targets = Vec<(String, Option<String>)>;

fn nodes(targets: &[(String, Option<String>)]) -> Vec<Node> {
    targets
        .iter()
        .map(|(name, alias)| Node {
            name: name.clone(),
            alias: alias.clone(),
            node_type: isns::attr::node_type::TARGET,
        })
        .collect()
}

impl Registrar {
    pub(crate) fn new(
        cfg: &config::Isns,
        targets: &[(String, Option<String>)],
        portals: &[SocketAddr],
        portal_group: u16,
    ) -> Option<Registrar> {
        let (first, _) = targets.first()?;
        // The configuration's check read these keys already; failing now (a file changed
        // since) registers nothing rather than registering unsigned.
        let auth = match cfg.auth.as_ref().map(config::IsnsAuth::load).transpose() {
            Ok(a) => a.map(std::sync::Mutex::new),
            Err(e) => {
                warn!("iSNS: not registering: isns.auth: {e}");
                return None;
            }
        };
        Some(Registrar {
            auth,
            server: cfg.server.clone(),
            source: first.clone(),
            entity: Entity {
                eid: cfg.entity.clone().unwrap_or_else(|| format!("rsv:{first}")),
                period: cfg.registration_period,
                portals: portals.to_vec(),
                nodes: nodes(targets),
                portal_group_tag: Some(u32::from(portal_group)),
            },
        })
    }

    /// Registers, refreshes until `stop` turns true, then deregisters. When `targets`
    /// changes (a reload), registers at once what it holds in place of what was.
    pub(crate) async fn run(
        mut self,
        mut stop: watch::Receiver<bool>,
        mut targets: watch::Receiver<Targets>,
    ) {
        let mut xid: u16 = 0;
        let mut registered = false;
        // The registration replaces the server's: at the first, and after a change.
        let mut replace = true;
        loop {
            xid = xid.wrapping_add(1);
            let wait = match self.register(xid, replace).await {
                Ok(period) => {
                    if registered && replace {
                        info!(
                            "iSNS: registration of entity {:?} updated ({} targets)",
                            self.entity.eid,
                            self.entity.nodes.len()
                        );
                    } else if !registered {
                        info!(
                            "iSNS: registered entity {:?} ({} targets, {} portals) with {}; period {period}s",
                            self.entity.eid,
                            self.entity.nodes.len(),
                            self.entity.portals.len(),
                            self.server
                        );
                    }
                    registered = true;
                    replace = false;
                    Duration::from_secs(u64::from(period.max(2)) / 2)
                }
                Err(e) => {
                    warn!("iSNS: registering with {}: {e}", self.server);
                    let half = self
                        .entity
                        .period
                        .map_or(RETRY, |p| Duration::from_secs(u64::from(p.max(2)) / 2));
                    RETRY.min(half)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => break,
                Ok(()) = targets.changed() => {
                    let now = targets.borrow_and_update().clone();
                    // A reload keeps at least one target (the configuration needs one).
                    if let Some((first, _)) = now.first() {
                        self.source = first.clone();
                        self.entity.nodes = nodes(&now);
                        replace = true;
                    }
                }
            }
        }
        if !registered {
            return;
        }
        xid = xid.wrapping_add(1);
        let msg = objects::dev_dereg(xid, &self.source, &self.entity.eid);
        match self.exchange(|_| msg).await {
            Ok(rsp) if rsp.status.is_some_and(|s| s.is_success()) => {
                info!("iSNS: deregistered entity {:?}", self.entity.eid)
            }
            Ok(rsp) => warn!(
                "iSNS: deregistering {:?}: {}",
                self.entity.eid,
                rsp.status.map_or("no status".into(), |s| s.to_string())
            ),
            Err(e) => warn!("iSNS: deregistering {:?}: {e}", self.entity.eid),
        }
    }

    /// One DevAttrReg (replacing what the server had on the first); the period granted.
    async fn register(&self, xid: u16, replace: bool) -> io::Result<u32> {
        let rsp = self
            .exchange(|local| {
                // A wildcard portal is registered as the address the server reaches us at.
                let mut e = self.entity.clone();
                for p in &mut e.portals {
                    if p.ip().is_unspecified() {
                        p.set_ip(local);
                    }
                }
                objects::dev_attr_reg(xid, &self.source, &e, replace)
            })
            .await?;
        match rsp.status {
            Some(s) if s.is_success() => Ok(objects::granted_period(&rsp)
                .or(self.entity.period)
                .unwrap_or(900)),
            Some(s) => Err(io::Error::other(format!("the server answered {s}"))),
            None => Err(io::Error::other("an answer without status")),
        }
    }

    /// Connects, sends the message `build` makes for our local address, reads its answer.
    async fn exchange(
        &self,
        build: impl FnOnce(std::net::IpAddr) -> Message,
    ) -> io::Result<Message> {
        let (host, port) = isns::server_address(&self.server).map_err(io::Error::other)?;
        tokio::time::timeout(EXCHANGE_TIMEOUT, async {
            let mut s = TcpStream::connect((host.as_str(), port)).await?;
            let msg = build(s.local_addr()?.ip());
            let wire = match &self.auth {
                Some(a) => a.lock().expect("auth lock").seal(&msg, unix_now()),
                None => msg.encode(MAX_PAYLOAD),
            };
            s.write_all(&wire).await?;
            let mut r = Reassembler::new();
            let mut buf = vec![0u8; 16 << 10];
            loop {
                while let Some(got) = r.next_received().map_err(io::Error::other)? {
                    let m = match &self.auth {
                        Some(a) => a
                            .lock()
                            .expect("auth lock")
                            .open(got, unix_now())
                            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?,
                        None => got.message,
                    };
                    if m.xid == msg.xid && m.function == msg.function.response() {
                        return Ok(m);
                    }
                }
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                r.push(&buf[..n]);
            }
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer in 10 s"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isns::server::Registry;
    use std::sync::{Arc, Mutex};
    use tokio::net::TcpListener;

    type Regs = Arc<std::sync::atomic::AtomicUsize>;

    /// An iSNS server in this process, on `isns::server`'s registry; it counts the
    /// DevAttrRegs it gets.
    async fn server(period: u32) -> (String, Arc<Mutex<Registry>>, Regs) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let reg = Arc::new(Mutex::new(Registry::new(period)));
        let regs = Regs::default();
        let (r, count) = (reg.clone(), regs.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let (r, count) = (r.clone(), count.clone());
                tokio::spawn(async move {
                    let mut dec = Reassembler::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        while let Ok(Some(m)) = dec.next_message() {
                            if m.function == isns::FunctionId::DEV_ATTR_REG {
                                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            let (rsp, _) = r.lock().unwrap().handle(&m, 0);
                            s.write_all(&rsp.encode(MAX_PAYLOAD)).await.unwrap();
                        }
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => dec.push(&buf[..n]),
                        }
                    }
                });
            }
        });
        (addr, reg, regs)
    }

    #[tokio::test]
    async fn registers_refreshes_and_deregisters() {
        let (addr, reg, regs) = server(2).await;
        let cfg = config::Isns {
            server: addr,
            entity: None,
            registration_period: None,
            auth: None,
        };
        let targets = vec![
            (
                "iqn.2026-11.org.reservoir:a".to_owned(),
                Some("home".to_owned()),
            ),
            ("iqn.2026-11.org.reservoir:b".to_owned(), None),
        ];
        let portals = ["0.0.0.0:3260".parse().unwrap()];
        let r = Registrar::new(&cfg, &targets, &portals, 1).unwrap();
        assert_eq!(r.entity.eid, "rsv:iqn.2026-11.org.reservoir:a");
        let (stop_tx, stop) = watch::channel(false);
        let (targets_tx, targets_rx) = watch::channel(targets.clone());
        let task = tokio::spawn(r.run(stop, targets_rx));
        let names = || {
            reg.lock()
                .unwrap()
                .nodes()
                .map(|(_, n)| n.to_owned())
                .collect::<Vec<_>>()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while names().len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "never registered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The wildcard portal went in as the address the server was reached from.
        let q = objects::query_targets(9, "iqn.2026-11.org.reservoir:a");
        let (rsp, _) = reg.lock().unwrap().handle(&q, 0);
        let found = objects::parse_targets(&rsp);
        assert_eq!(found[0].alias.as_deref(), Some("home"));
        assert_eq!(
            found[0].portals,
            vec![("127.0.0.1:3260".parse().unwrap(), 1)]
        );
        assert_eq!(found[1].portals, found[0].portals);
        // Granted 2 s, it registers again after 1 s.
        while regs.load(std::sync::atomic::Ordering::Relaxed) < 2 {
            assert!(tokio::time::Instant::now() < deadline, "never refreshed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A reload: b removed, a realiased, c added; at once, not at the next refresh.
        let alias = |name: &str| {
            let q = objects::query_targets(10, name);
            let (rsp, _) = reg.lock().unwrap().handle(&q, 0);
            objects::parse_targets(&rsp)
                .into_iter()
                .find(|t| t.name == name)
                .map(|t| t.alias)
        };
        targets_tx
            .send(vec![
                (
                    "iqn.2026-11.org.reservoir:a".to_owned(),
                    Some("away".to_owned()),
                ),
                ("iqn.2026-11.org.reservoir:c".to_owned(), None),
            ])
            .unwrap();
        let want = ["iqn.2026-11.org.reservoir:a", "iqn.2026-11.org.reservoir:c"];
        while {
            let mut n = names();
            n.sort();
            n != want
        } {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", names());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            alias("iqn.2026-11.org.reservoir:a"),
            Some(Some("away".to_owned()))
        );
        stop_tx.send(true).unwrap();
        task.await.unwrap();
        assert!(names().is_empty(), "still registered: {:?}", names());
    }

    #[tokio::test]
    async fn no_targets_nothing_to_register() {
        let cfg = config::Isns {
            server: "127.0.0.1".into(),
            entity: Some("e".into()),
            registration_period: Some(60),
            auth: None,
        };
        assert!(Registrar::new(&cfg, &[], &[], 1).is_none());
    }
}
