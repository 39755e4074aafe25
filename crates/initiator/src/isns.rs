//! Targets found through an iSNS server (RFC 4171), the initiator's only iSNS socket
//! code: `isns://SERVER[:PORT]/` lists the targets the server knows with their portals,
//! and `isns://SERVER[:PORT]/ALIAS-or-IQN/LUN` resolves to the `iscsi://` URL of the
//! target's first portal. As open-iscsi does, the initiator registers itself as an
//! initiator node before it asks (open-isns answers an unknown source with nothing) and
//! deregisters afterwards. The messages are the sans-IO `isns` crate's.

use std::io;
use std::time::Duration;

use isns::attr::node_type;
use isns::auth::ClientAuth;
use isns::objects::{self, Entity, Node};
use isns::{Message, Reassembler};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{DiscoveredTarget, Error, IscsiUrl, Result};

const TIMEOUT: Duration = Duration::from_secs(10);

/// An `isns://[user[%password]@]server[:port]/[TARGET/LUN][?query]` URL: the iSNS server
/// (port 3205 by default), and the rest as an `iscsi://` URL would have it (the user and
/// password are the target's CHAP, the query the session's options).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsnsUrl {
    pub server: String,
    pub port: u16,
    /// Host and port in here are the server's until [`resolve`] puts the portal's in.
    pub url: IscsiUrl,
}

impl IsnsUrl {
    pub fn is_isns(s: &str) -> bool {
        s.starts_with("isns://")
    }

    pub fn parse(s: &str) -> Result<IsnsUrl> {
        let rest = s
            .strip_prefix("isns://")
            .ok_or_else(|| Error::Url(format!("{s}: must start with isns://")))?;
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (server, port) =
            isns::server_address(hostport).map_err(|e| Error::Url(format!("{s}: {e}")))?;
        let mut url = IscsiUrl::parse(&format!("iscsi://{rest}"))
            .map_err(|e| Error::Url(e.to_string().replace("iscsi://", "isns://")))?;
        url.port = port;
        Ok(IsnsUrl { server, port, url })
    }

    /// The URL without its password.
    pub fn shown(&self) -> String {
        self.url.to_string().replacen("iscsi://", "isns://", 1)
    }

    /// `host:port` of the server, with brackets around IPv6.
    pub fn server_address(&self) -> String {
        if self.server.contains(':') {
            format!("[{}]:{}", self.server, self.port)
        } else {
            format!("{}:{}", self.server, self.port)
        }
    }
}

/// The environment variables that turn iSNS authentication on for every client of this
/// process (`rsv ls`, `inq`, `cp`, `mount`, `media` with `isns://`): the SPI to sign as,
/// its DSA private key, the server's public key (open-isns's `AuthName`, `AuthKeyFile`,
/// `ServerKeyFile`). All three, or none.
pub const AUTH_ENV: [&str; 3] = [
    "RSV_ISNS_AUTH_NAME",
    "RSV_ISNS_AUTH_KEY",
    "RSV_ISNS_SERVER_KEY",
];

/// The client's authentication from [`AUTH_ENV`], `None` when none of it is set.
pub fn auth_from_env() -> std::result::Result<Option<ClientAuth>, String> {
    let vals: Vec<Option<String>> = AUTH_ENV
        .iter()
        .map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .collect();
    let bad = |m: String| m;
    match (&vals[0], &vals[1], &vals[2]) {
        (None, None, None) => Ok(None),
        (Some(spi), Some(key), Some(server)) => {
            let read =
                |p: &str| std::fs::read_to_string(p).map_err(|e| bad(format!("reading {p}: {e}")));
            ClientAuth::from_pem(spi, &read(key)?, &read(server)?)
                .map(Some)
                .map_err(|e| bad(format!("iSNS authentication: {e}")))
        }
        _ => Err(bad(format!(
            "iSNS authentication needs all of {} or none",
            AUTH_ENV.join(", ")
        ))),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A connection to the server and what signs and checks its messages.
struct Conn {
    s: TcpStream,
    auth: Option<ClientAuth>,
}

impl Conn {
    fn wire(&self, m: &Message) -> Vec<u8> {
        isns::auth::wire(self.auth.as_ref(), m, unix_now())
    }

    /// The next whole message in `r`, checked when authentication is on.
    fn next(&mut self, r: &mut Reassembler) -> io::Result<Option<Message>> {
        match r.next_received().map_err(io::Error::other)? {
            None => Ok(None),
            Some(got) => isns::auth::open(self.auth.as_mut(), got, unix_now())
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e)),
        }
    }
}

/// Connects to the iSNS server within [`TIMEOUT`].
async fn connect(url: &IsnsUrl) -> Result<Conn> {
    let auth = auth_from_env().map_err(|message| Error::Isns {
        server: url.server_address(),
        message,
    })?;
    let fail = |e: io::Error| Error::Isns {
        server: url.server_address(),
        message: e.to_string(),
    };
    let s = tokio::time::timeout(TIMEOUT, TcpStream::connect((url.server.as_str(), url.port)))
        .await
        .map_err(|_| fail(io::ErrorKind::TimedOut.into()))?
        .map_err(fail)?;
    Ok(Conn { s, auth })
}

/// Every target the server lets `initiator_name` see, with its portals as SendTargets
/// writes them (`address:port,tag`).
pub async fn lookup(url: &IsnsUrl, initiator_name: &str) -> Result<Vec<DiscoveredTarget>> {
    let at = url.server_address();
    let fail = |e: io::Error| Error::Isns {
        server: at.clone(),
        message: e.to_string(),
    };
    let mut s = connect(url).await?;
    // One entity per process: two lookups at once must not deregister each other.
    let me = Entity {
        eid: format!("rsv:{initiator_name}:{}", std::process::id()),
        period: None,
        portals: Vec::new(),
        nodes: vec![Node {
            name: initiator_name.to_owned(),
            alias: None,
            node_type: node_type::INITIATOR,
        }],
        portal_group_tag: None,
    };
    let status = |what: &str, m: &Message| match m.status {
        Some(s) if s.is_success() => Ok(()),
        Some(s) => Err(Error::Isns {
            server: at.clone(),
            message: format!("{what}: {s}"),
        }),
        None => Err(Error::Isns {
            server: at.clone(),
            message: format!("{what}: an answer without status"),
        }),
    };
    // The registration and the query go out together (the server answers them in order):
    // one round trip after the handshake, and one more for the deregistration.
    let mut answers = exchange_all(
        &mut s,
        &[
            objects::dev_attr_reg(1, initiator_name, &me, false),
            objects::query_targets(2, initiator_name),
        ],
    )
    .await
    .map_err(fail)?
    .into_iter();
    let (reg, found) = match (answers.next(), answers.next()) {
        (Some(r), Some(f)) => (r, f),
        _ => return Err(fail(io::ErrorKind::UnexpectedEof.into())),
    };
    status("registering the initiator", &reg)?;
    let dereg = exchange(&mut s, &objects::dev_dereg(3, initiator_name, &me.eid)).await;
    if let Ok(d) = dereg {
        if let Some(st) = d.status.filter(|s| !s.is_success()) {
            tracing::warn!("iSNS server {at}: deregistering the initiator: {st}");
        }
    }
    status("querying targets", &found)?;
    Ok(objects::parse_targets(&found)
        .into_iter()
        .map(|t| DiscoveredTarget {
            name: t.name,
            alias: t.alias,
            portals: t
                .portals
                .iter()
                .map(|(addr, tag)| format!("{addr},{tag}"))
                .collect(),
        })
        .collect())
}

/// The `iscsi://` URL of the target `url` names (by IQN, any case, or by alias), at its
/// first portal, with the URL's LUN, user and options.
pub async fn resolve(url: &IsnsUrl, initiator_name: &str) -> Result<IscsiUrl> {
    Ok(resolve_target(url, initiator_name).await?.0)
}

/// [`resolve`], and the target as the server described it (alias, every portal).
pub async fn resolve_target(
    url: &IsnsUrl,
    initiator_name: &str,
) -> Result<(IscsiUrl, DiscoveredTarget)> {
    let wanted = url.url.target_required()?.to_owned();
    let targets = lookup(url, initiator_name).await?;
    let pick = pick(&targets, &wanted).map_err(|m| Error::Isns {
        server: url.server_address(),
        message: m,
    })?;
    let portal = pick.portals.first().ok_or_else(|| Error::Isns {
        server: url.server_address(),
        message: format!("target {} has no portal", pick.name),
    })?;
    let addr = portal.rsplit_once(',').map_or(portal.as_str(), |(a, _)| a);
    let mut out = IscsiUrl::parse(&format!("iscsi://{addr}/"))?;
    out.target = Some(pick.name.clone());
    out.lun = url.url.lun;
    out.user = url.url.user.clone();
    out.password = url.url.password.clone();
    out.query = url.url.query.clone();
    Ok((out, pick.clone()))
}

fn pick<'a>(targets: &'a [DiscoveredTarget], wanted: &str) -> Result<&'a DiscoveredTarget, String> {
    if let Some(t) = targets.iter().find(|t| t.name.eq_ignore_ascii_case(wanted)) {
        return Ok(t);
    }
    let by_alias: Vec<&DiscoveredTarget> = targets
        .iter()
        .filter(|t| t.alias.as_deref() == Some(wanted))
        .collect();
    match by_alias[..] {
        [t] => Ok(t),
        [] => Err(format!(
            "no target named or aliased {wanted:?} (known: {})",
            targets
                .iter()
                .map(|t| match &t.alias {
                    Some(a) => format!("{} ({a})", t.name),
                    None => t.name.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Err(format!(
            "alias {wanted:?} names {} targets; use an IQN",
            by_alias.len()
        )),
    }
}

/// The node name a watcher ([`watch`]) registers under: not the initiator's own, whose
/// registration each [`lookup`] makes and removes again.
pub fn watcher_name(initiator_name: &str) -> String {
    format!("{initiator_name}-scn")
}

/// What the SCNs [`watch`] asks for: targets (and itself) added and removed. Without
/// "targets and self only" the lookups' own registration of the initiator would be
/// notified too, and each poll it wakes would wake the next.
pub const WATCH_SCN_BITMAP: u32 = isns::attr::scn::OBJECT_ADDED
    | isns::attr::scn::OBJECT_REMOVED
    | isns::attr::scn::TARGET_AND_SELF_ONLY;

/// Registers for state-change notifications (RFC 4171 5.6.5.5: targets added and removed)
/// on one connection kept open, as the node [`watcher_name`], and calls `changed` once
/// registered (whatever changed before) and for each SCN the server sends on that
/// connection (answering it) about another node than the initiator's own; the
/// registration is refreshed at half the period the server grants. When `stop` turns
/// true it deregisters the watcher and returns `Ok`; it returns an error when the
/// connection fails, the server stops answering the refreshes or refuses the
/// registration (deregistering what it had registered). `rsv isns` sends SCNs on the
/// connection of the SCNReg; open-isns refuses an SCNReg from a node with no portal
/// registering an SCN port (status 17), so there the caller's polling is all there is.
pub async fn watch(
    url: &IsnsUrl,
    initiator_name: &str,
    mut changed: impl FnMut(),
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let at = url.server_address();
    let fail = |e: io::Error| Error::Isns {
        server: at.clone(),
        message: e.to_string(),
    };
    let mut s = connect(url).await?;
    let node = watcher_name(initiator_name);
    let me = Entity {
        eid: format!("rsv:{node}:{}", std::process::id()),
        period: None,
        portals: Vec::new(),
        nodes: vec![Node {
            name: node.clone(),
            alias: None,
            node_type: node_type::INITIATOR,
        }],
        portal_group_tag: None,
    };
    let mut answers = exchange_all(
        &mut s,
        &[
            objects::dev_attr_reg(1, &node, &me, false),
            objects::scn_reg(2, &node, WATCH_SCN_BITMAP),
        ],
    )
    .await
    .map_err(fail)?
    .into_iter();
    let (reg, sreg) = match (answers.next(), answers.next()) {
        (Some(r), Some(f)) => (r, f),
        _ => return Err(fail(io::ErrorKind::UnexpectedEof.into())),
    };
    let refused = |what: &str, m: &Message| match m.status {
        Some(st) if st.is_success() => None,
        Some(st) => Some(format!("{what}: {st}")),
        None => Some(format!("{what}: an answer without status")),
    };
    if let Some(why) = refused("registering the watcher", &reg) {
        return Err(Error::Isns {
            server: at.clone(),
            message: why,
        });
    }
    if let Some(why) = refused("registering for SCNs", &sreg) {
        // Registered but not watching: take the node away again.
        let _ = exchange(&mut s, &objects::dev_dereg(3, &node, &me.eid)).await;
        return Err(Error::Isns {
            server: at.clone(),
            message: why,
        });
    }
    changed();
    let refresh = Duration::from_secs(u64::from(
        objects::granted_period(&reg).unwrap_or(900).max(2) / 2,
    ));
    let mut next_refresh = tokio::time::Instant::now() + refresh;
    // The refresh last sent and not answered yet.
    let mut waiting: Option<u16> = None;
    let mut xid = 3u16;
    let mut r = Reassembler::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        while let Some(m) = s.next(&mut r).map_err(fail)? {
            if m.function == isns::FunctionId::SCN {
                let answer = s.wire(&objects::scn_response(&m));
                s.s.write_all(&answer).await.map_err(fail)?;
                let about = objects::scn_changes(&m);
                tracing::debug!("iSNS server {at}: SCN {about:?}");
                if about.iter().any(|(n, _)| {
                    !n.eq_ignore_ascii_case(initiator_name) && !n.eq_ignore_ascii_case(&node)
                }) {
                    changed();
                }
            } else if Some(m.xid) == waiting
                && m.function == isns::FunctionId::DEV_ATTR_REG.response()
            {
                if let Some(why) = refused("refreshing the watcher", &m) {
                    return Err(Error::Isns {
                        server: at.clone(),
                        message: why,
                    });
                }
                waiting = None;
            }
        }
        let n = tokio::select! {
            n = s.s.read(&mut buf) => n.map_err(fail)?,
            _ = tokio::time::sleep_until(next_refresh) => {
                if waiting.is_some() {
                    // A whole half period without an answer.
                    return Err(fail(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no answer to the watcher's refresh",
                    )));
                }
                xid = xid.wrapping_add(1).max(4);
                let again = s.wire(&objects::dev_attr_reg(xid, &node, &me, false));
                s.s.write_all(&again).await.map_err(fail)?;
                waiting = Some(xid);
                next_refresh += refresh;
                continue;
            }
            _ = stopped(&mut stop) => {
                xid = xid.wrapping_add(1).max(4);
                let dereg = objects::dev_dereg(xid, &node, &me.eid);
                return match tokio::time::timeout(Duration::from_secs(2), exchange(&mut s, &dereg)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(fail(e)),
                    Err(_) => Err(fail(io::ErrorKind::TimedOut.into())),
                };
            }
        };
        if n == 0 {
            return Err(fail(io::ErrorKind::UnexpectedEof.into()));
        }
        r.push(&buf[..n]);
    }
}

/// Returns once `stop` is true, or its sender is gone.
pub async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Sends `msgs` at once and reads their answers (by transaction id), in the same order.
async fn exchange_all(s: &mut Conn, msgs: &[Message]) -> io::Result<Vec<Message>> {
    tokio::time::timeout(TIMEOUT, async {
        let mut out = Vec::new();
        for m in msgs {
            out.extend_from_slice(&s.wire(m));
        }
        s.s.write_all(&out).await?;
        let mut r = Reassembler::new();
        let mut got: Vec<Option<Message>> = msgs.iter().map(|_| None).collect();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            while let Some(m) = s.next(&mut r)? {
                if let Some(i) = msgs
                    .iter()
                    .position(|q| m.xid == q.xid && m.function == q.function.response())
                {
                    got[i] = Some(m);
                    // All in: what follows in the buffer is not read.
                    if got.iter().all(Option::is_some) {
                        break;
                    }
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            let n = s.s.read(&mut buf).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            r.push(&buf[..n]);
        }
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer in 10 s"))?
}

/// Sends `msg` and reads its answer.
async fn exchange(s: &mut Conn, msg: &Message) -> io::Result<Message> {
    exchange_all(s, std::slice::from_ref(msg))
        .await?
        .pop()
        .ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use isns::pdu::MAX_PAYLOAD;

    #[test]
    fn urls() {
        let u = IsnsUrl::parse("isns://isns.lan/home-media/0?connections=2").unwrap();
        assert_eq!((u.server.as_str(), u.port), ("isns.lan", 3205));
        assert_eq!(u.url.target.as_deref(), Some("home-media"));
        assert_eq!(u.url.lun, Some(0));
        assert_eq!(u.url.query, vec![("connections".into(), "2".into())]);
        assert_eq!(u.shown(), "isns://isns.lan:3205/home-media/0");
        let u = IsnsUrl::parse("isns://bob%pw@[fd00::5]:3206/").unwrap();
        assert_eq!(u.server_address(), "[fd00::5]:3206");
        assert_eq!(u.url.user.as_deref(), Some("bob"));
        assert_eq!(u.url.target, None);
        assert!(IsnsUrl::parse("isns://h:0/").is_err());
        assert!(IsnsUrl::parse("iscsi://h/").is_err());
        assert!(IsnsUrl::parse("isns://h/t/notalun").is_err());
    }

    #[tokio::test]
    async fn lookup_and_resolve_against_a_registry() {
        use isns::server::Registry;
        use std::sync::{Arc, Mutex};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let reg = Arc::new(Mutex::new(Registry::new(60)));
        let target = objects::dev_attr_reg(
            1,
            "iqn.2026-11.org.reservoir:home",
            &Entity {
                eid: "storage".into(),
                period: None,
                portals: vec!["[fd00::7]:3261".parse().unwrap()],
                nodes: vec![Node {
                    name: "iqn.2026-11.org.reservoir:home".into(),
                    alias: Some("home-media".into()),
                    node_type: node_type::TARGET,
                }],
                portal_group_tag: Some(1),
            },
            false,
        );
        reg.lock().unwrap().handle(&target, 0);
        let r = reg.clone();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let r = r.clone();
                tokio::spawn(async move {
                    let mut dec = Reassembler::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        while let Ok(Some(m)) = dec.next_message() {
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
        let me = "iqn.2026-11.org.reservoir:me";
        let u = IsnsUrl::parse(&format!("isns://127.0.0.1:{port}/")).unwrap();
        let found = lookup(&u, me).await.unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].alias.as_deref(), Some("home-media"));
        assert_eq!(found[0].portals, vec!["[fd00::7]:3261,1".to_owned()]);
        // The initiator registered itself for the question only.
        assert_eq!(reg.lock().unwrap().nodes().count(), 1);
        let u = IsnsUrl::parse(&format!("isns://127.0.0.1:{port}/home-media/3?erl=0")).unwrap();
        let url = resolve(&u, me).await.unwrap();
        assert_eq!(
            url.to_string(),
            "iscsi://[fd00::7]:3261/iqn.2026-11.org.reservoir:home/3"
        );
        assert_eq!(url.query, vec![("erl".into(), "0".into())]);
        let u = IsnsUrl::parse(&format!("isns://127.0.0.1:{port}/nothing/0")).unwrap();
        assert!(resolve(&u, me)
            .await
            .unwrap_err()
            .to_string()
            .contains("no target named"));
    }

    #[test]
    fn picks_by_iqn_then_alias() {
        let t = |name: &str, alias: Option<&str>| DiscoveredTarget {
            name: name.into(),
            alias: alias.map(Into::into),
            portals: vec!["10.0.0.1:3260,1".into()],
        };
        let ts = [
            t("iqn.a", Some("home")),
            t("iqn.b", Some("dup")),
            t("iqn.c", Some("dup")),
        ];
        assert_eq!(pick(&ts, "IQN.A").unwrap().name, "iqn.a");
        assert_eq!(pick(&ts, "home").unwrap().name, "iqn.a");
        assert!(pick(&ts, "dup").unwrap_err().contains("2 targets"));
        assert!(pick(&ts, "none").unwrap_err().contains("iqn.a (home)"));
    }
}
