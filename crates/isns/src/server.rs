//! The registry behind an iSNS server, sans-IO: what entities registered (portals,
//! storage nodes, portal groups, SCN registrations), the answer to each request, the
//! state change notifications a change causes, expiry by registration period, and the
//! registry as bytes for a file that outlives a restart. The caller supplies the time
//! (seconds) and moves the bytes. One discovery domain holds everyone.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::attr::{node_type, scn, Attr, Tag};
use crate::message::{Message, Reassembler, Status};
use crate::pdu::{Flags, FunctionId, MAX_PAYLOAD};

#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeRec {
    name: String,
    node_type: u32,
    alias: Option<String>,
    scn: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct PgRec {
    name: String,
    ip: IpAddr,
    port: u32,
    tag: u32,
}

/// Who sent a request, as far as the server can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller<'a> {
    /// Authentication is off: the Source attribute is all there is to go by.
    Unauthenticated,
    /// Authentication is on and the request was signed by this enrolled SPI.
    Authenticated(&'a str),
    /// Authentication is on and the request was unsigned (or by an SPI nobody enrolled):
    /// it may look, not change anything.
    Anonymous,
}

/// Who may change an entity: the SPI that registered it, or, without authentication, the
/// source that did (and the nodes registered in it). What a server without authentication
/// records can be forged by whoever forges a source name; it stops mistakes and the
/// casual intruder, not a determined one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    Spi(String),
    Source(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct EntityRec {
    owner: Owner,
    protocol: u32,
    period: u32,
    seen: u64,
    portals: Vec<(IpAddr, u32)>,
    nodes: Vec<NodeRec>,
    pgs: Vec<PgRec>,
}

/// A state change to tell `to` about: `changed` was added, updated or removed (`bitmap`,
/// `attr::scn` bits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    pub to: String,
    pub changed: String,
    pub bitmap: u32,
}

impl Notification {
    /// The SCN message (RFC 4171 5.6.5.8): destination, timestamp, the changed node and
    /// what happened to it.
    pub fn message(&self, xid: u16, now: u64) -> Message {
        Message {
            function: FunctionId::SCN,
            flags: Flags(Flags::SERVER),
            xid,
            status: None,
            attrs: vec![
                Attr::string(Tag::ISCSI_NAME, &self.to),
                Attr::u64(Tag::TIMESTAMP, now),
                Attr::string(Tag::ISCSI_NAME, &self.changed),
                Attr::u32(Tag::ISCSI_SCN_BITMAP, self.bitmap),
            ],
        }
    }
}

#[derive(Debug, Default)]
pub struct Registry {
    entities: BTreeMap<String, EntityRec>,
    /// The longest registration period granted; a client asking less gets what it asks.
    period: u32,
    next_eid: u32,
}

/// The first bytes of [`Registry::save`]'s output (the format with owners).
const SAVE_MAGIC: &[u8; 8] = b"rsvisns2";
const OWNER_SPI: u8 = 1;
const OWNER_SOURCE: u8 = 2;

/// What a query naming no attributes gets.
const ALL: [Tag; 11] = [
    Tag::ENTITY_ID,
    Tag::ENTITY_PROTOCOL,
    Tag::REGISTRATION_PERIOD,
    Tag::PORTAL_IP,
    Tag::PORTAL_PORT,
    Tag::ISCSI_NAME,
    Tag::ISCSI_NODE_TYPE,
    Tag::ISCSI_ALIAS,
    Tag::PG_ISCSI_NAME,
    Tag::PG_PORTAL_IP,
    Tag::PG_TAG,
];

fn same(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

impl Registry {
    pub fn new(period: u32) -> Registry {
        Registry {
            period: period.max(1),
            ..Registry::default()
        }
    }

    /// Storage node names, with their entity, in the registry's order.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entities
            .iter()
            .flat_map(|(eid, e)| e.nodes.iter().map(move |n| (eid.as_str(), n.name.as_str())))
    }

    /// The owner a registration by `caller` with source `source` records.
    fn owner_for(caller: Caller<'_>, source: &str) -> Owner {
        match caller {
            Caller::Authenticated(spi) => Owner::Spi(spi.to_owned()),
            _ => Owner::Source(source.to_ascii_lowercase()),
        }
    }

    /// Whether `caller`, sending as `source`, may change or remove entity `e`: its
    /// owner's SPI; without authentication, its owning source or one of its nodes.
    fn may_change(e: &EntityRec, caller: Caller<'_>, source: &str) -> bool {
        match (caller, &e.owner) {
            (Caller::Authenticated(spi), Owner::Spi(o)) => spi == o,
            (Caller::Unauthenticated, Owner::Source(o)) => {
                same(o, source) || e.nodes.iter().any(|n| same(&n.name, source))
            }
            _ => false,
        }
    }

    fn entity_of(&self, node: &str) -> Option<&str> {
        self.nodes().find(|(_, n)| same(n, node)).map(|(e, _)| e)
    }

    /// Who is told about `changed` (bits `event`): every node with an SCN registration
    /// that asks for the event, within the "only targets/initiators and self" limits.
    fn notify(&self, changed: &str, changed_type: u32, event: u32, out: &mut Vec<Notification>) {
        for e in self.entities.values() {
            for n in &e.nodes {
                let Some(bits) = n.scn else { continue };
                if bits & event == 0 {
                    continue;
                }
                let is_self = same(&n.name, changed);
                if bits & scn::TARGET_AND_SELF_ONLY != 0
                    && !is_self
                    && changed_type & node_type::TARGET == 0
                {
                    continue;
                }
                if bits & scn::INITIATOR_AND_SELF_ONLY != 0
                    && !is_self
                    && changed_type & node_type::INITIATOR == 0
                {
                    continue;
                }
                out.push(Notification {
                    to: n.name.clone(),
                    changed: changed.to_owned(),
                    bitmap: event,
                });
            }
        }
    }

    /// The answer to `req` at time `now` from a server without authentication, and the
    /// notifications it causes.
    pub fn handle(&mut self, req: &Message, now: u64) -> (Message, Vec<Notification>) {
        self.handle_from(req, now, Caller::Unauthenticated)
    }

    /// The answer to `req` from `caller` at time `now`, and the notifications it causes.
    /// A change to an entity that `caller` does not own is refused with Source
    /// Unauthorized (RFC 4171 5.4 status 8), and so is any change from an anonymous
    /// caller.
    pub fn handle_from(
        &mut self,
        req: &Message,
        now: u64,
        caller: Caller<'_>,
    ) -> (Message, Vec<Notification>) {
        let mut out = Vec::new();
        let looks = matches!(
            req.function,
            FunctionId::DEV_ATTR_QRY | FunctionId::DEV_GET_NEXT
        );
        if caller == Caller::Anonymous && !looks {
            return (
                Message::response_to(req, Status::SOURCE_UNAUTHORIZED, Vec::new()),
                out,
            );
        }
        // Any request from a registered node counts as a sign of life of its entity.
        if let Some(src) = req.source().and_then(Attr::as_str) {
            if let Some(eid) = self.entity_of(src).map(str::to_owned) {
                if let Some(e) = self.entities.get_mut(&eid) {
                    e.seen = now;
                }
            }
        }
        let (status, attrs) = match req.function {
            FunctionId::DEV_ATTR_REG => self.register(req, now, caller, &mut out),
            FunctionId::DEV_ATTR_QRY => (Status::SUCCESS, self.query(req)),
            FunctionId::DEV_GET_NEXT => self.get_next(req),
            FunctionId::DEV_DEREG => self.deregister(req, caller, &mut out),
            FunctionId::SCN_REG => self.scn_reg(req, caller, true),
            FunctionId::SCN_DEREG => self.scn_reg(req, caller, false),
            _ => (Status::MESSAGE_NOT_SUPPORTED, Vec::new()),
        };
        (Message::response_to(req, status, attrs), out)
    }

    fn register(
        &mut self,
        req: &Message,
        now: u64,
        caller: Caller<'_>,
        out: &mut Vec<Notification>,
    ) -> (Status, Vec<Attr>) {
        let source = req.source().and_then(Attr::as_str).unwrap_or("");
        let mut eid: Option<String> = None;
        let mut protocol = None;
        let mut period = None;
        let mut portals: Vec<(IpAddr, u32)> = Vec::new();
        let mut pending_ip: Option<IpAddr> = None;
        let mut nodes: Vec<NodeRec> = Vec::new();
        // Name, address, port, tag: complete ones are kept.
        type PartPg = (String, Option<IpAddr>, Option<u32>, Option<u32>);
        let mut pgs: Vec<PartPg> = Vec::new();
        for a in req.operating() {
            match a.tag {
                Tag::ENTITY_ID => eid = a.as_str().filter(|s| !s.is_empty()).map(Into::into),
                Tag::ENTITY_PROTOCOL => protocol = a.as_u32(),
                Tag::REGISTRATION_PERIOD => period = a.as_u32(),
                Tag::PORTAL_IP => pending_ip = a.as_ip(),
                Tag::PORTAL_PORT => {
                    if let (Some(ip), Some(p)) = (pending_ip.take(), a.as_u32()) {
                        portals.push((ip, p));
                    }
                }
                Tag::ISCSI_NAME => match a.as_str().filter(|s| !s.is_empty()) {
                    Some(n) => nodes.push(NodeRec {
                        name: n.to_owned(),
                        node_type: 0,
                        alias: None,
                        scn: None,
                    }),
                    None => return (Status::INVALID_REGISTRATION, Vec::new()),
                },
                Tag::ISCSI_NODE_TYPE => {
                    if let (Some(n), Some(t)) = (nodes.last_mut(), a.as_u32()) {
                        n.node_type = t;
                    }
                }
                Tag::ISCSI_ALIAS => {
                    if let Some(n) = nodes.last_mut() {
                        n.alias = a.as_str().map(Into::into);
                    }
                }
                Tag::ISCSI_SCN_BITMAP => {
                    if let Some(n) = nodes.last_mut() {
                        n.scn = a.as_u32();
                    }
                }
                Tag::PG_ISCSI_NAME => {
                    if let Some(n) = a.as_str() {
                        pgs.push((n.to_owned(), None, None, None));
                    }
                }
                Tag::PG_PORTAL_IP => {
                    if let Some(p) = pgs.last_mut() {
                        p.1 = a.as_ip();
                    }
                }
                Tag::PG_PORTAL_PORT => {
                    if let Some(p) = pgs.last_mut() {
                        p.2 = a.as_u32();
                    }
                }
                Tag::PG_TAG => {
                    if let Some(p) = pgs.last_mut() {
                        p.3 = a.as_u32();
                    }
                }
                _ => {}
            }
        }
        // The entity: named in the message, or the one holding the registered nodes, or
        // a new name.
        let key_eid = req
            .keys()
            .iter()
            .find(|a| a.tag == Tag::ENTITY_ID)
            .and_then(Attr::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let eid = match eid.or(key_eid).or_else(|| {
            nodes
                .iter()
                .find_map(|n| self.entity_of(&n.name).map(str::to_owned))
        }) {
            Some(e) => e,
            None => {
                self.next_eid += 1;
                format!("isns-entity-{}", self.next_eid)
            }
        };
        if nodes.iter().any(|n| {
            self.entity_of(&n.name)
                .is_some_and(|other| !same(other, &eid))
        }) {
            // A node belongs to one entity.
            return (Status::INVALID_REGISTRATION, Vec::new());
        }
        if let Some(e) = self.entities.get(&eid) {
            if !Self::may_change(e, caller, source) {
                return (Status::SOURCE_UNAUTHORIZED, Vec::new());
            }
        }
        let granted = match period {
            Some(p) if p > 0 => p.min(self.period),
            _ => self.period,
        };
        let replace = req.flags.has(Flags::REPLACE);
        let old = if replace {
            self.entities.remove(&eid)
        } else {
            None
        };
        let owner = old
            .as_ref()
            .map(|o| o.owner.clone())
            .unwrap_or_else(|| Self::owner_for(caller, source));
        let e = self.entities.entry(eid.clone()).or_insert(EntityRec {
            owner,
            protocol: protocol.unwrap_or(crate::attr::protocol::ISCSI),
            period: granted,
            seen: now,
            portals: Vec::new(),
            nodes: Vec::new(),
            pgs: Vec::new(),
        });
        e.seen = now;
        e.period = granted;
        if let Some(p) = protocol {
            e.protocol = p;
        }
        for p in portals {
            if !e.portals.contains(&p) {
                e.portals.push(p);
            }
        }
        let mut changed = Vec::new();
        for n in nodes {
            let before = old
                .as_ref()
                .and_then(|o| o.nodes.iter().find(|m| same(&m.name, &n.name)))
                .cloned();
            match e.nodes.iter_mut().find(|m| same(&m.name, &n.name)) {
                Some(m) => {
                    if n.node_type != 0 {
                        m.node_type = n.node_type;
                    }
                    if n.alias.is_some() {
                        m.alias = n.alias;
                    }
                    if n.scn.is_some() {
                        m.scn = n.scn;
                    }
                    changed.push((m.name.clone(), m.node_type, scn::OBJECT_UPDATED));
                }
                None => {
                    let event = if before.is_some() {
                        scn::OBJECT_UPDATED
                    } else {
                        scn::OBJECT_ADDED
                    };
                    let mut n = n;
                    if n.scn.is_none() {
                        n.scn = before.and_then(|b| b.scn);
                    }
                    changed.push((n.name.clone(), n.node_type, event));
                    e.nodes.push(n);
                }
            }
        }
        for (name, ip, port, tag) in pgs {
            if let (Some(ip), Some(port), Some(tag)) = (ip, port, tag) {
                e.pgs
                    .retain(|p| !(same(&p.name, &name) && p.ip == ip && p.port == port));
                e.pgs.push(PgRec {
                    name,
                    ip,
                    port,
                    tag,
                });
            }
        }
        if let Some(old) = old {
            for n in &old.nodes {
                if !self.entities[&eid]
                    .nodes
                    .iter()
                    .any(|m| same(&m.name, &n.name))
                {
                    changed.push((n.name.clone(), n.node_type, scn::OBJECT_REMOVED));
                }
            }
        }
        for (name, ty, event) in changed {
            self.notify(&name, ty, event, out);
        }
        (
            Status::SUCCESS,
            vec![
                Attr::string(Tag::ENTITY_ID, &eid),
                Attr::empty(Tag::DELIMITER),
                Attr::string(Tag::ENTITY_ID, &eid),
                Attr::u32(Tag::REGISTRATION_PERIOD, granted),
            ],
        )
    }

    /// The portal groups of an entity's node; every portal in group 1 when the entity
    /// registered none.
    fn groups<'a>(e: &'a EntityRec, node: &'a str) -> Vec<PgRec> {
        if e.pgs.is_empty() {
            return e
                .portals
                .iter()
                .map(|&(ip, port)| PgRec {
                    name: node.to_owned(),
                    ip,
                    port,
                    tag: 1,
                })
                .collect();
        }
        e.pgs
            .iter()
            .filter(|p| same(&p.name, node))
            .cloned()
            .collect()
    }

    /// Requested attributes of one node (and its entity, portals and portal groups).
    fn describe(eid: &str, e: &EntityRec, n: &NodeRec, want: &[Tag], out: &mut Vec<Attr>) {
        let has = |t: Tag| want.contains(&t);
        if has(Tag::ENTITY_ID) {
            out.push(Attr::string(Tag::ENTITY_ID, eid));
        }
        if has(Tag::ENTITY_PROTOCOL) {
            out.push(Attr::u32(Tag::ENTITY_PROTOCOL, e.protocol));
        }
        if has(Tag::REGISTRATION_PERIOD) {
            out.push(Attr::u32(Tag::REGISTRATION_PERIOD, e.period));
        }
        if has(Tag::PORTAL_IP) || has(Tag::PORTAL_PORT) {
            for &(ip, port) in &e.portals {
                out.push(Attr::ip(Tag::PORTAL_IP, ip));
                out.push(Attr::u32(Tag::PORTAL_PORT, port));
            }
        }
        if has(Tag::ISCSI_NAME) {
            out.push(Attr::string(Tag::ISCSI_NAME, &n.name));
        }
        if has(Tag::ISCSI_NODE_TYPE) {
            out.push(Attr::u32(Tag::ISCSI_NODE_TYPE, n.node_type));
        }
        if has(Tag::ISCSI_ALIAS) {
            if let Some(a) = &n.alias {
                out.push(Attr::string(Tag::ISCSI_ALIAS, a));
            }
        }
        if has(Tag::ISCSI_SCN_BITMAP) {
            if let Some(b) = n.scn {
                out.push(Attr::u32(Tag::ISCSI_SCN_BITMAP, b));
            }
        }
        if [
            Tag::PG_ISCSI_NAME,
            Tag::PG_PORTAL_IP,
            Tag::PG_PORTAL_PORT,
            Tag::PG_TAG,
        ]
        .iter()
        .any(|&t| has(t))
        {
            for p in Self::groups(e, &n.name) {
                out.push(Attr::string(Tag::PG_ISCSI_NAME, &p.name));
                out.push(Attr::ip(Tag::PG_PORTAL_IP, p.ip));
                out.push(Attr::u32(Tag::PG_PORTAL_PORT, p.port));
                out.push(Attr::u32(Tag::PG_TAG, p.tag));
            }
        }
    }

    fn matches(eid: &str, e: &EntityRec, n: &NodeRec, keys: &[Attr]) -> bool {
        keys.iter().all(|k| match k.tag {
            Tag::ISCSI_NAME => k.as_str().is_none_or(|v| v.is_empty() || same(v, &n.name)),
            Tag::ISCSI_NODE_TYPE => k.as_u32().is_none_or(|t| t & n.node_type != 0),
            Tag::ENTITY_ID => k.as_str().is_none_or(|v| v.is_empty() || v == eid),
            Tag::PORTAL_IP => k
                .as_ip()
                .is_none_or(|ip| e.portals.iter().any(|p| p.0 == ip)),
            _ => true,
        })
    }

    fn query(&self, req: &Message) -> Vec<Attr> {
        let keys = req.keys();
        let mut want: Vec<Tag> = req.operating().iter().map(|a| a.tag).collect();
        if want.is_empty() {
            // No attributes named: all of them (as open-isns answers `isnsadm --query`).
            want = ALL.to_vec();
        }
        let mut out = keys.to_vec();
        out.push(Attr::empty(Tag::DELIMITER));
        for (eid, e) in &self.entities {
            for n in &e.nodes {
                if Self::matches(eid, e, n, keys) {
                    Self::describe(eid, e, n, &want, &mut out);
                }
            }
        }
        out
    }

    fn get_next(&self, req: &Message) -> (Status, Vec<Attr>) {
        let mut want: Vec<Tag> = req.operating().iter().map(|a| a.tag).collect();
        if want.is_empty() {
            want = vec![Tag::ISCSI_NAME, Tag::ISCSI_NODE_TYPE, Tag::ISCSI_ALIAS];
        }
        let after = req
            .keys()
            .iter()
            .find(|a| a.tag == Tag::ISCSI_NAME)
            .and_then(Attr::as_str)
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut all: Vec<(String, &str, &EntityRec, &NodeRec)> = self
            .entities
            .iter()
            .flat_map(|(eid, e)| {
                e.nodes
                    .iter()
                    .map(move |n| (n.name.to_ascii_lowercase(), eid.as_str(), e, n))
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let Some((_, eid, e, n)) = all
            .into_iter()
            .find(|(k, ..)| after.is_empty() || *k > after)
        else {
            return (Status::NO_SUCH_ENTRY, Vec::new());
        };
        let mut out = vec![
            Attr::string(Tag::ISCSI_NAME, &n.name),
            Attr::empty(Tag::DELIMITER),
        ];
        Self::describe(eid, e, n, &want, &mut out);
        (Status::SUCCESS, out)
    }

    /// The entities a DevDereg's operating attributes touch.
    fn dereg_targets(&self, req: &Message) -> Vec<String> {
        let mut hit = Vec::new();
        let mut pending_ip = None;
        for a in req.operating() {
            match a.tag {
                Tag::ENTITY_ID => {
                    if let Some(id) = a.as_str().filter(|id| self.entities.contains_key(*id)) {
                        hit.push(id.to_owned());
                    }
                }
                Tag::ISCSI_NAME => {
                    if let Some(eid) = a.as_str().and_then(|n| self.entity_of(n)) {
                        hit.push(eid.to_owned());
                    }
                }
                Tag::PORTAL_IP => pending_ip = a.as_ip(),
                Tag::PORTAL_PORT => {
                    if let (Some(ip), Some(port)) = (pending_ip.take(), a.as_u32()) {
                        hit.extend(
                            self.entities
                                .iter()
                                .filter(|(_, e)| e.portals.contains(&(ip, port)))
                                .map(|(id, _)| id.clone()),
                        );
                    }
                }
                _ => {}
            }
        }
        hit
    }

    fn deregister(
        &mut self,
        req: &Message,
        caller: Caller<'_>,
        out: &mut Vec<Notification>,
    ) -> (Status, Vec<Attr>) {
        // All or nothing: one entity of another owner refuses the whole request.
        let source = req.source().and_then(Attr::as_str).unwrap_or("");
        if self
            .dereg_targets(req)
            .iter()
            .any(|id| !Self::may_change(&self.entities[id], caller, source))
        {
            return (Status::SOURCE_UNAUTHORIZED, Vec::new());
        }
        let mut removed: Vec<(String, u32)> = Vec::new();
        let mut found = false;
        let mut pending_ip = None;
        for a in req.operating() {
            match a.tag {
                Tag::ENTITY_ID => {
                    if let Some(e) = a.as_str().and_then(|id| self.entities.remove(id)) {
                        found = true;
                        removed.extend(e.nodes.into_iter().map(|n| (n.name, n.node_type)));
                    }
                }
                Tag::ISCSI_NAME => {
                    let Some(name) = a.as_str() else { continue };
                    for e in self.entities.values_mut() {
                        if let Some(i) = e.nodes.iter().position(|n| same(&n.name, name)) {
                            found = true;
                            let n = e.nodes.remove(i);
                            e.pgs.retain(|p| !same(&p.name, name));
                            removed.push((n.name, n.node_type));
                        }
                    }
                }
                Tag::PORTAL_IP => pending_ip = a.as_ip(),
                Tag::PORTAL_PORT => {
                    if let (Some(ip), Some(port)) = (pending_ip.take(), a.as_u32()) {
                        for e in self.entities.values_mut() {
                            let before = e.portals.len();
                            e.portals.retain(|&p| p != (ip, port));
                            e.pgs.retain(|p| (p.ip, p.port) != (ip, port));
                            found |= e.portals.len() != before;
                        }
                    }
                }
                _ => {}
            }
        }
        for (name, ty) in removed {
            self.notify(&name, ty, scn::OBJECT_REMOVED, out);
        }
        if found {
            (Status::SUCCESS, Vec::new())
        } else {
            (Status::NO_SUCH_ENTRY, Vec::new())
        }
    }

    fn scn_reg(&mut self, req: &Message, caller: Caller<'_>, on: bool) -> (Status, Vec<Attr>) {
        let source = req.source().and_then(Attr::as_str).unwrap_or("");
        let Some(name) = req
            .keys()
            .iter()
            .find(|a| a.tag == Tag::ISCSI_NAME)
            .and_then(Attr::as_str)
        else {
            return (Status::MESSAGE_FORMAT_ERROR, Vec::new());
        };
        let bits = req
            .operating()
            .iter()
            .find(|a| a.tag == Tag::ISCSI_SCN_BITMAP)
            .and_then(Attr::as_u32);
        for e in self.entities.values_mut() {
            if !e.nodes.iter().any(|n| same(&n.name, name)) {
                continue;
            }
            if !Self::may_change(e, caller, source) {
                return (Status::SOURCE_UNAUTHORIZED, Vec::new());
            }
            if let Some(n) = e.nodes.iter_mut().find(|n| same(&n.name, name)) {
                n.scn = if on { bits.or(n.scn) } else { None };
                return (Status::SUCCESS, Vec::new());
            }
        }
        (Status::NO_SUCH_ENTRY, Vec::new())
    }

    /// Drops the entities whose period has run out by `now`; the notifications their
    /// nodes' removal causes.
    pub fn expire(&mut self, now: u64) -> Vec<Notification> {
        let dead: Vec<String> = self
            .entities
            .iter()
            .filter(|(_, e)| e.seen + u64::from(e.period) < now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for eid in dead {
            if let Some(e) = self.entities.remove(&eid) {
                for n in e.nodes {
                    self.notify(&n.name, n.node_type, scn::OBJECT_REMOVED, &mut out);
                }
            }
        }
        out
    }

    /// The registry as bytes: a magic, then per entity its last sign of life, its
    /// owner, and a DevAttrReg that registers it again (SCN bitmaps included).
    pub fn save(&self) -> Vec<u8> {
        let mut out = SAVE_MAGIC.to_vec();
        for (eid, e) in &self.entities {
            let mut op = vec![
                Attr::string(Tag::ENTITY_ID, eid),
                Attr::u32(Tag::ENTITY_PROTOCOL, e.protocol),
                Attr::u32(Tag::REGISTRATION_PERIOD, e.period),
            ];
            for &(ip, port) in &e.portals {
                op.push(Attr::ip(Tag::PORTAL_IP, ip));
                op.push(Attr::u32(Tag::PORTAL_PORT, port));
            }
            for n in &e.nodes {
                op.push(Attr::string(Tag::ISCSI_NAME, &n.name));
                op.push(Attr::u32(Tag::ISCSI_NODE_TYPE, n.node_type));
                if let Some(a) = &n.alias {
                    op.push(Attr::string(Tag::ISCSI_ALIAS, a));
                }
                if let Some(b) = n.scn {
                    op.push(Attr::u32(Tag::ISCSI_SCN_BITMAP, b));
                }
            }
            for p in &e.pgs {
                op.push(Attr::string(Tag::PG_ISCSI_NAME, &p.name));
                op.push(Attr::ip(Tag::PG_PORTAL_IP, p.ip));
                op.push(Attr::u32(Tag::PG_PORTAL_PORT, p.port));
                op.push(Attr::u32(Tag::PG_TAG, p.tag));
            }
            // The owner goes in the source attribute, where `load` finds it again.
            let (kind, who) = match &e.owner {
                Owner::Spi(s) => (OWNER_SPI, s),
                Owner::Source(s) => (OWNER_SOURCE, s),
            };
            let mut m = Message::request(
                FunctionId::DEV_ATTR_REG,
                0,
                Attr::string(Tag::ISCSI_NAME, who),
                vec![Attr::string(Tag::ENTITY_ID, eid)],
                op,
            );
            m.flags.0 |= Flags::REPLACE;
            out.extend_from_slice(&e.seen.to_be_bytes());
            out.push(kind);
            let wire = m.encode(MAX_PAYLOAD);
            out.extend_from_slice(&(wire.len() as u32).to_be_bytes());
            out.extend_from_slice(&wire);
        }
        out
    }

    /// A registry from [`Registry::save`]'s bytes; what does not decode is left out.
    /// A file from before owners were kept (no magic) loads each entity as owned by
    /// its own nodes.
    pub fn load(period: u32, b: &[u8]) -> Registry {
        let mut r = Registry::new(period);
        let (mut b, with_owner) = match b.strip_prefix(SAVE_MAGIC) {
            Some(rest) => (rest, true),
            None => (b, false),
        };
        let head = if with_owner { 13 } else { 12 };
        while let (Some(seen), Some(len)) = (b.first_chunk::<8>(), b.get(head - 4..head)) {
            let seen = u64::from_be_bytes(*seen);
            let kind = if with_owner { b[8] } else { OWNER_SOURCE };
            let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
            let Some(wire) = b.get(head..head + len) else {
                break;
            };
            b = &b[head + len..];
            let mut dec = Reassembler::new();
            dec.push(wire);
            if let Ok(Some(m)) = dec.next_message() {
                let who = m.source().and_then(Attr::as_str).unwrap_or("").to_owned();
                let caller = match kind {
                    OWNER_SPI => Caller::Authenticated(&who),
                    _ => Caller::Unauthenticated,
                };
                let mut sink = Vec::new();
                r.register(&m, seen, caller, &mut sink);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{self, Entity, Node};

    fn target(eid: &str, name: &str, alias: Option<&str>) -> Message {
        objects::dev_attr_reg(
            1,
            name,
            &Entity {
                eid: eid.into(),
                period: None,
                portals: vec!["10.0.0.1:3260".parse().unwrap()],
                nodes: vec![Node {
                    name: name.into(),
                    alias: alias.map(Into::into),
                    node_type: node_type::TARGET,
                }],
                portal_group_tag: Some(1),
            },
            true,
        )
    }

    fn initiator(name: &str) -> Message {
        objects::dev_attr_reg(
            1,
            name,
            &Entity {
                eid: format!("e-{name}"),
                period: Some(10),
                portals: Vec::new(),
                nodes: vec![Node {
                    name: name.into(),
                    alias: None,
                    node_type: node_type::INITIATOR,
                }],
                portal_group_tag: None,
            },
            false,
        )
    }

    #[test]
    fn register_query_notify_expire_persist() {
        let mut r = Registry::new(30);
        let (rsp, _) = r.handle(&initiator("iqn.i"), 0);
        assert_eq!(rsp.status, Some(Status::SUCCESS));
        assert_eq!(objects::granted_period(&rsp), Some(10));
        let (rsp, _) = r.handle(
            &objects::scn_reg(2, "iqn.i", scn::OBJECT_ADDED | scn::OBJECT_REMOVED),
            0,
        );
        assert_eq!(rsp.status, Some(Status::SUCCESS));

        let (rsp, n) = r.handle(&target("e-t", "iqn.t", Some("home")), 1);
        assert_eq!(objects::granted_period(&rsp), Some(30));
        assert_eq!(
            n,
            vec![Notification {
                to: "iqn.i".into(),
                changed: "iqn.t".into(),
                bitmap: scn::OBJECT_ADDED
            }]
        );
        let scn_msg = n[0].message(9, 1);
        assert_eq!(
            objects::scn_changes(&scn_msg),
            vec![("iqn.t".into(), scn::OBJECT_ADDED)]
        );

        let (rsp, _) = r.handle(&objects::query_targets(3, "iqn.i"), 2);
        let found = objects::parse_targets(&rsp);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].alias.as_deref(), Some("home"));
        assert_eq!(
            found[0].portals,
            vec![("10.0.0.1:3260".parse().unwrap(), 1)]
        );

        let (rsp, _) = r.handle(&objects::dev_get_next(4, "iqn.i", None), 2);
        assert_eq!(rsp.keys_of_response(), Some("iqn.i"));
        let (rsp, _) = r.handle(&objects::dev_get_next(5, "iqn.i", Some("iqn.i")), 2);
        assert_eq!(rsp.keys_of_response(), Some("iqn.t"));
        let (rsp, _) = r.handle(&objects::dev_get_next(6, "iqn.i", Some("iqn.t")), 2);
        assert_eq!(rsp.status, Some(Status::NO_SUCH_ENTRY));

        // Saved and loaded: the same answers.
        let again = Registry::load(30, &r.save());
        assert_eq!(again.entities, r.entities);

        // The initiator's 10 s (from its query at 2) run out first; the target, refreshed
        // by a query of its own at 20, stays until 50.
        let (_, _) = r.handle(&objects::query_targets(7, "iqn.t"), 20);
        assert!(r.expire(13).is_empty());
        assert_eq!(r.nodes().count(), 1);
        let gone = r.expire(51);
        assert!(gone.is_empty(), "nobody left to tell");
        assert_eq!(r.nodes().count(), 0);
    }

    #[test]
    fn deregistration_and_errors() {
        let mut r = Registry::new(30);
        r.handle(&initiator("iqn.i"), 0);
        r.handle(
            &objects::scn_reg(2, "iqn.i", scn::OBJECT_REMOVED | scn::TARGET_AND_SELF_ONLY),
            0,
        );
        r.handle(&target("e-t", "iqn.t", None), 0);
        r.handle(&initiator("iqn.j"), 0);
        let (rsp, n) = r.handle(&objects::dev_dereg(3, "iqn.j", "e-iqn.j"), 0);
        assert_eq!(rsp.status, Some(Status::SUCCESS));
        assert!(n.is_empty(), "iqn.i asked about targets only");
        let (_, n) = r.handle(&objects::dev_dereg(4, "iqn.t", "e-t"), 0);
        assert_eq!(n.len(), 1);
        let (rsp, _) = r.handle(&objects::dev_dereg(5, "iqn.t", "e-t"), 0);
        assert_eq!(rsp.status, Some(Status::NO_SUCH_ENTRY));
        // A node of one entity cannot be registered into another.
        let mut m = initiator("iqn.i");
        m.attrs[1] = Attr::string(Tag::ENTITY_ID, "elsewhere");
        m.attrs[3] = Attr::string(Tag::ENTITY_ID, "elsewhere");
        assert_eq!(r.handle(&m, 0).0.status, Some(Status::INVALID_REGISTRATION));
        let mut odd = initiator("iqn.k");
        odd.function = FunctionId::HEARTBEAT;
        assert_eq!(
            r.handle(&odd, 0).0.status,
            Some(Status::MESSAGE_NOT_SUPPORTED)
        );
    }

    /// The intruder of issue 35: `isnsadm --replace --register entity=victim-ent
    /// portal=127.0.0.9:3260 target=…:evil` under its own source name, and its kin.
    fn intrusions(r: &mut Registry, evil: Caller<'_>, evil_source: &str) {
        let status = |r: &mut Registry, m: &Message| r.handle_from(m, 1, evil).0.status;
        let mut hijack = target("victim-ent", "iqn.evil", None);
        hijack.attrs[0] = Attr::string(Tag::ISCSI_NAME, evil_source);
        for replace in [true, false] {
            let mut m = hijack.clone();
            if !replace {
                m.flags.0 &= !Flags::REPLACE;
            }
            m.attrs
                .retain(|a| a.tag != Tag::PORTAL_IP && a.tag != Tag::PORTAL_PORT);
            m.attrs
                .push(Attr::ip(Tag::PORTAL_IP, "127.0.0.9".parse().unwrap()));
            m.attrs.push(Attr::u32(Tag::PORTAL_PORT, 3260));
            assert_eq!(
                status(r, &m),
                Some(Status::SOURCE_UNAUTHORIZED),
                "replace {replace}"
            );
        }
        let dereg = objects::dev_dereg(2, evil_source, "victim-ent");
        assert_eq!(status(r, &dereg), Some(Status::SOURCE_UNAUTHORIZED));
        let mut by_node = dereg.clone();
        by_node.attrs[2] = Attr::string(Tag::ISCSI_NAME, "iqn.victim");
        assert_eq!(status(r, &by_node), Some(Status::SOURCE_UNAUTHORIZED));
        let mut by_portal = dereg.clone();
        by_portal.attrs.truncate(2);
        by_portal
            .attrs
            .push(Attr::ip(Tag::PORTAL_IP, "10.0.0.1".parse().unwrap()));
        by_portal.attrs.push(Attr::u32(Tag::PORTAL_PORT, 3260));
        assert_eq!(status(r, &by_portal), Some(Status::SOURCE_UNAUTHORIZED));
        let mut scn = objects::scn_reg(3, "iqn.victim", scn::OBJECT_ADDED);
        scn.attrs[0] = Attr::string(Tag::ISCSI_NAME, evil_source);
        assert_eq!(status(r, &scn), Some(Status::SOURCE_UNAUTHORIZED));
        // Nothing of the victim's changed.
        let (rsp, _) = r.handle_from(&objects::query_targets(4, "iqn.x"), 1, evil);
        let found = objects::parse_targets(&rsp);
        let victim: Vec<_> = found.iter().filter(|t| t.name == "iqn.victim").collect();
        assert_eq!(victim.len(), 1);
        assert_eq!(
            victim[0].portals,
            vec![("10.0.0.1:3260".parse().unwrap(), 1)]
        );
        assert!(found.iter().all(|t| t.name != "iqn.evil"));
    }

    #[test]
    fn without_authentication_a_source_changes_only_its_own() {
        let mut r = Registry::new(30);
        let (rsp, _) = r.handle(&target("victim-ent", "iqn.victim", None), 0);
        assert_eq!(rsp.status, Some(Status::SUCCESS));
        intrusions(&mut r, Caller::Unauthenticated, "iqn.evil");
        // The intruder's own entity is its to register and remove.
        let mut own = target("evil-ent", "iqn.evil", None);
        own.attrs[0] = Attr::string(Tag::ISCSI_NAME, "iqn.evil");
        assert_eq!(r.handle(&own, 1).0.status, Some(Status::SUCCESS));
        let dereg = objects::dev_dereg(5, "iqn.evil", "evil-ent");
        assert_eq!(r.handle(&dereg, 1).0.status, Some(Status::SUCCESS));
        // The owner, and a node registered in the entity, still can.
        let mut two = target("victim-ent", "iqn.victim2", None);
        two.flags.0 &= !Flags::REPLACE;
        two.attrs[0] = Attr::string(Tag::ISCSI_NAME, "iqn.victim");
        assert_eq!(r.handle(&two, 2).0.status, Some(Status::SUCCESS));
        let dereg = objects::dev_dereg(6, "iqn.victim2", "victim-ent");
        assert_eq!(r.handle(&dereg, 2).0.status, Some(Status::SUCCESS));
        // Owners survive a save and load.
        r.handle(&target("victim-ent", "iqn.victim", None), 3);
        let mut again = Registry::load(30, &r.save());
        assert_eq!(again.entities, r.entities);
        intrusions(&mut again, Caller::Unauthenticated, "iqn.evil");
    }

    #[test]
    fn with_authentication_only_the_owning_spi_changes_an_entity() {
        let mut r = Registry::new(30);
        let victim = Caller::Authenticated("victim");
        let (rsp, _) = r.handle_from(&target("victim-ent", "iqn.victim", None), 0, victim);
        assert_eq!(rsp.status, Some(Status::SUCCESS));
        // Another SPI, even sending as the victim's own node name; an unsigned request;
        // and an unauthenticated owner record do not match an SPI.
        intrusions(&mut r, Caller::Authenticated("evil"), "iqn.victim");
        intrusions(&mut r, Caller::Anonymous, "iqn.victim");
        let mut own = target("evil-ent", "iqn.evil", None);
        own.attrs[0] = Attr::string(Tag::ISCSI_NAME, "iqn.evil");
        assert_eq!(
            r.handle_from(&own, 1, Caller::Anonymous).0.status,
            Some(Status::SOURCE_UNAUTHORIZED),
            "unsigned requests may only look"
        );
        // The owner refreshes, registers SCNs, deregisters.
        let (rsp, _) = r.handle_from(&target("victim-ent", "iqn.victim", None), 2, victim);
        assert_eq!(rsp.status, Some(Status::SUCCESS));
        let scn = objects::scn_reg(7, "iqn.victim", scn::OBJECT_ADDED);
        assert_eq!(
            r.handle_from(&scn, 2, victim).0.status,
            Some(Status::SUCCESS)
        );
        let mut again = Registry::load(30, &r.save());
        assert_eq!(again.entities, r.entities);
        intrusions(&mut again, Caller::Authenticated("evil"), "iqn.victim");
        let dereg = objects::dev_dereg(8, "iqn.victim", "victim-ent");
        assert_eq!(
            again.handle_from(&dereg, 3, victim).0.status,
            Some(Status::SUCCESS)
        );
        assert_eq!(again.nodes().count(), 0);
    }
}
