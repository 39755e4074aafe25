//! Registration with an iSNS server (RFC 4171), the target's only iSNS socket code: at
//! start a DevAttrReg of the network entity, its portals, every target node with its
//! alias and the portal groups (all portals in group 1); again within each period the
//! server grants; a DevDereg of the entity at shutdown. The messages are built and read
//! by the sans-IO `isns` crate.

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

/// What the target registers.
pub(crate) struct Registrar {
    server: String,
    entity: Entity,
    /// The name the messages come from: the first target's.
    source: String,
}

impl Registrar {
    pub(crate) fn new(
        cfg: &config::Isns,
        targets: &[(String, Option<String>)],
        portals: &[SocketAddr],
        portal_group: u16,
    ) -> Option<Registrar> {
        let (first, _) = targets.first()?;
        Some(Registrar {
            server: cfg.server.clone(),
            source: first.clone(),
            entity: Entity {
                eid: cfg.entity.clone().unwrap_or_else(|| format!("rsv:{first}")),
                period: cfg.registration_period,
                portals: portals.to_vec(),
                nodes: targets
                    .iter()
                    .map(|(name, alias)| Node {
                        name: name.clone(),
                        alias: alias.clone(),
                        node_type: isns::attr::node_type::TARGET,
                    })
                    .collect(),
                portal_group_tag: Some(u32::from(portal_group)),
            },
        })
    }

    /// Registers, refreshes until `stop` turns true, then deregisters.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut xid: u16 = 0;
        let mut registered = false;
        loop {
            xid = xid.wrapping_add(1);
            let wait = match self.register(xid, !registered).await {
                Ok(period) => {
                    if !registered {
                        info!(
                            "iSNS: registered entity {:?} ({} targets, {} portals) with {}; period {period}s",
                            self.entity.eid,
                            self.entity.nodes.len(),
                            self.entity.portals.len(),
                            self.server
                        );
                    }
                    registered = true;
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
            s.write_all(&msg.encode(MAX_PAYLOAD)).await?;
            let mut r = Reassembler::new();
            let mut buf = vec![0u8; 16 << 10];
            loop {
                while let Some(m) = r.next_message().map_err(io::Error::other)? {
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
