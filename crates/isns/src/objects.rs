//! The messages an iSCSI target and initiator exchange with an iSNS server, built from
//! and read into plain structs: an entity's registration (RFC 4171 5.6.5.1), its
//! deregistration (5.6.5.4), the query for targets and their portals (5.6.5.2, 5.6.5.3),
//! SCN registration (5.6.5.5), and the answers a client owes the server for SCN and ESI
//! (5.7.5.8, 5.7.5.13).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::attr::{node_type, protocol, Attr, Tag};
use crate::message::{Message, Status};
use crate::pdu::FunctionId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub alias: Option<String>,
    /// `attr::node_type` bits.
    pub node_type: u32,
}

/// A network entity and what it holds: its portals, its storage nodes, and the portal
/// group tag under which each node is reached on every portal (no groups for an
/// initiator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entity {
    pub eid: String,
    /// Seconds the registration should last; `None` leaves it to the server.
    pub period: Option<u32>,
    pub portals: Vec<SocketAddr>,
    pub nodes: Vec<Node>,
    pub portal_group_tag: Option<u32>,
}

/// DevAttrReg of the whole entity, with `source` (a node of it) as the source. Without
/// `replace` the server adds to or refreshes what it has; with it, the entity's old
/// registration is dropped first.
pub fn dev_attr_reg(xid: u16, source: &str, e: &Entity, replace: bool) -> Message {
    let mut op = vec![
        Attr::string(Tag::ENTITY_ID, &e.eid),
        Attr::u32(Tag::ENTITY_PROTOCOL, protocol::ISCSI),
    ];
    if let Some(p) = e.period {
        op.push(Attr::u32(Tag::REGISTRATION_PERIOD, p));
    }
    for p in &e.portals {
        op.push(Attr::ip(Tag::PORTAL_IP, p.ip()));
        op.push(Attr::tcp_port(Tag::PORTAL_PORT, p.port()));
    }
    for n in &e.nodes {
        op.push(Attr::string(Tag::ISCSI_NAME, &n.name));
        op.push(Attr::u32(Tag::ISCSI_NODE_TYPE, n.node_type));
        if let Some(a) = &n.alias {
            op.push(Attr::string(Tag::ISCSI_ALIAS, a));
        }
    }
    if let Some(tag) = e.portal_group_tag {
        for n in &e.nodes {
            for p in &e.portals {
                op.push(Attr::string(Tag::PG_ISCSI_NAME, &n.name));
                op.push(Attr::ip(Tag::PG_PORTAL_IP, p.ip()));
                op.push(Attr::tcp_port(Tag::PG_PORTAL_PORT, p.port()));
                op.push(Attr::u32(Tag::PG_TAG, tag));
            }
        }
    }
    let mut m = Message::request(
        FunctionId::DEV_ATTR_REG,
        xid,
        Attr::string(Tag::ISCSI_NAME, source),
        vec![Attr::string(Tag::ENTITY_ID, &e.eid)],
        op,
    );
    if replace {
        m.flags.0 |= crate::Flags::REPLACE;
    }
    m
}

/// DevDereg of a whole entity: its portals, nodes and portal groups go with it.
pub fn dev_dereg(xid: u16, source: &str, eid: &str) -> Message {
    Message::request(
        FunctionId::DEV_DEREG,
        xid,
        Attr::string(Tag::ISCSI_NAME, source),
        Vec::new(),
        vec![Attr::string(Tag::ENTITY_ID, eid)],
    )
}

/// The attributes asked for about each target: the node, then its portal groups.
const TARGET_ATTRS: [Tag; 7] = [
    Tag::ISCSI_NAME,
    Tag::ISCSI_NODE_TYPE,
    Tag::ISCSI_ALIAS,
    Tag::PG_ISCSI_NAME,
    Tag::PG_PORTAL_IP,
    Tag::PG_PORTAL_PORT,
    Tag::PG_TAG,
];

/// DevAttrQry for every target node `source` may see, with their portal groups.
pub fn query_targets(xid: u16, source: &str) -> Message {
    Message::request(
        FunctionId::DEV_ATTR_QRY,
        xid,
        Attr::string(Tag::ISCSI_NAME, source),
        vec![Attr::u32(Tag::ISCSI_NODE_TYPE, node_type::TARGET)],
        TARGET_ATTRS.into_iter().map(Attr::empty).collect(),
    )
}

/// DevGetNext: the storage node after `after` (the first with `None`), to walk the
/// server's nodes one by one.
pub fn dev_get_next(xid: u16, source: &str, after: Option<&str>) -> Message {
    let key = match after {
        Some(n) => Attr::string(Tag::ISCSI_NAME, n),
        None => Attr::empty(Tag::ISCSI_NAME),
    };
    Message::request(
        FunctionId::DEV_GET_NEXT,
        xid,
        Attr::string(Tag::ISCSI_NAME, source),
        vec![key],
        vec![
            Attr::empty(Tag::ISCSI_NODE_TYPE),
            Attr::empty(Tag::ISCSI_ALIAS),
        ],
    )
}

/// SCNReg: state change notifications of the kinds in `bitmap` (`attr::scn`) to `node`.
pub fn scn_reg(xid: u16, node: &str, bitmap: u32) -> Message {
    Message::request(
        FunctionId::SCN_REG,
        xid,
        Attr::string(Tag::ISCSI_NAME, node),
        vec![Attr::string(Tag::ISCSI_NAME, node)],
        vec![Attr::u32(Tag::ISCSI_SCN_BITMAP, bitmap)],
    )
}

/// A target as the server knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoundTarget {
    pub name: String,
    pub alias: Option<String>,
    /// Its portals, each with its portal group tag.
    pub portals: Vec<(SocketAddr, u32)>,
}

/// What the answer to [`query_targets`] says: targets by name, each with the portals of
/// the portal groups that name it. Attributes the parse does not know are skipped; a
/// portal group without address, port or tag is left out.
pub fn parse_targets(rsp: &Message) -> Vec<FoundTarget> {
    let mut nodes: BTreeMap<String, FoundTarget> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut node: Option<(String, u32)> = None;
    let mut alias: Option<String> = None;
    let mut pg: Option<(String, Option<SocketAddr>, Option<u32>)> = None;
    let flush_pg = |pg: &mut Option<(String, Option<SocketAddr>, Option<u32>)>,
                    nodes: &mut BTreeMap<String, FoundTarget>| {
        if let Some((name, Some(addr), Some(tag))) = pg.take() {
            let t = nodes.entry(name.clone()).or_insert_with(|| FoundTarget {
                name,
                ..FoundTarget::default()
            });
            if !t.portals.contains(&(addr, tag)) {
                t.portals.push((addr, tag));
            }
        }
    };
    let flush_node = |node: &mut Option<(String, u32)>,
                      alias: &mut Option<String>,
                      nodes: &mut BTreeMap<String, FoundTarget>,
                      order: &mut Vec<String>| {
        if let Some((name, ty)) = node.take() {
            let alias = alias.take();
            if ty & node_type::TARGET == 0 {
                return;
            }
            if !order.contains(&name) {
                order.push(name.clone());
            }
            let t = nodes.entry(name.clone()).or_insert_with(|| FoundTarget {
                name,
                ..FoundTarget::default()
            });
            if alias.is_some() {
                t.alias = alias;
            }
        }
    };
    for a in rsp.operating() {
        match a.tag {
            Tag::ISCSI_NAME => {
                flush_node(&mut node, &mut alias, &mut nodes, &mut order);
                if let Some(n) = a.as_str().filter(|n| !n.is_empty()) {
                    // Until a node type says otherwise, a node in this answer is a target.
                    node = Some((n.to_owned(), node_type::TARGET));
                }
            }
            Tag::ISCSI_NODE_TYPE => {
                if let (Some(n), Some(v)) = (node.as_mut(), a.as_u32()) {
                    n.1 = v;
                }
            }
            Tag::ISCSI_ALIAS => alias = a.as_str().map(str::to_owned),
            Tag::PG_ISCSI_NAME => {
                flush_pg(&mut pg, &mut nodes);
                pg = a.as_str().map(|n| (n.to_owned(), None, None));
            }
            Tag::PG_PORTAL_IP => {
                if let Some(p) = pg.as_mut() {
                    let port = p.1.map_or(0, |s| s.port());
                    p.1 = a.as_ip().map(|ip| SocketAddr::new(ip, port));
                }
            }
            Tag::PG_PORTAL_PORT => {
                if let (Some(p), Some((port, false))) = (pg.as_mut(), a.as_port()) {
                    if let Some(s) = p.1.as_mut() {
                        s.set_port(port);
                    }
                }
            }
            Tag::PG_TAG => {
                if let Some(p) = pg.as_mut() {
                    p.2 = a.as_u32();
                }
            }
            _ => {}
        }
    }
    flush_node(&mut node, &mut alias, &mut nodes, &mut order);
    flush_pg(&mut pg, &mut nodes);
    // Portal groups of nodes the answer did not list as targets are not targets.
    order.into_iter().filter_map(|n| nodes.remove(&n)).collect()
}

/// The registration period the server granted in a DevAttrRegRsp, in seconds.
pub fn granted_period(rsp: &Message) -> Option<u32> {
    rsp.attrs
        .iter()
        .find(|a| a.tag == Tag::REGISTRATION_PERIOD)
        .and_then(Attr::as_u32)
}

/// A client's answer to an SCN: the status, and the destination attribute (RFC 4171
/// 5.7.5.8).
pub fn scn_response(scn: &Message) -> Message {
    let dest = scn.attrs.first().cloned().into_iter().collect();
    Message::response_to(scn, Status::SUCCESS, dest)
}

/// A client's answer to an ESI: the status, and the ESI's own attributes echoed (RFC
/// 4171 5.7.5.13).
pub fn esi_response(esi: &Message) -> Message {
    Message::response_to(esi, Status::SUCCESS, esi.attrs.clone())
}

/// What an SCN says changed: the names of the nodes it lists, with their SCN bitmaps.
pub fn scn_changes(scn: &Message) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    // The first attribute is the destination; the changed objects follow.
    let mut name: Option<String> = None;
    for a in scn.attrs.iter().skip(1) {
        match a.tag {
            Tag::ISCSI_NAME => name = a.as_str().map(str::to_owned),
            Tag::ISCSI_SCN_BITMAP => {
                if let (Some(n), Some(b)) = (name.take(), a.as_u32()) {
                    out.push((n, b));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::MAX_PAYLOAD;
    use crate::{Flags, Reassembler};

    fn entity() -> Entity {
        Entity {
            eid: "rsv:host".into(),
            period: Some(900),
            portals: vec!["10.0.0.1:3260".parse().unwrap()],
            nodes: vec![Node {
                name: "iqn.2026-11.org.reservoir:t0".into(),
                alias: Some("home".into()),
                node_type: node_type::TARGET,
            }],
            portal_group_tag: Some(1),
        }
    }

    #[test]
    fn registration_layout() {
        let m = dev_attr_reg(1, "iqn.2026-11.org.reservoir:t0", &entity(), false);
        assert_eq!(m.function, FunctionId::DEV_ATTR_REG);
        assert_eq!(m.keys(), &[Attr::string(Tag::ENTITY_ID, "rsv:host")]);
        let tags: Vec<u32> = m.operating().iter().map(|a| a.tag.0).collect();
        assert_eq!(tags, [1, 2, 6, 16, 17, 32, 33, 34, 48, 49, 50, 51]);
        assert!(!m.flags.has(Flags::REPLACE));
        assert!(dev_attr_reg(1, "x", &entity(), true)
            .flags
            .has(Flags::REPLACE));
    }

    #[test]
    fn targets_from_an_answer() {
        let q = query_targets(3, "iqn.i");
        let mut attrs = q.keys().to_vec();
        attrs.push(Attr::empty(Tag::DELIMITER));
        for (name, alias, ty) in [
            ("iqn.t1", Some("one"), node_type::TARGET),
            ("iqn.i", None, node_type::INITIATOR),
            ("iqn.t2", None, node_type::TARGET | node_type::CONTROL),
        ] {
            attrs.push(Attr::string(Tag::ISCSI_NAME, name));
            attrs.push(Attr::u32(Tag::ISCSI_NODE_TYPE, ty));
            if let Some(a) = alias {
                attrs.push(Attr::string(Tag::ISCSI_ALIAS, a));
            }
        }
        for (name, ip, port) in [
            ("iqn.t1", "10.0.0.1", 3260),
            ("iqn.t1", "fd00::1", 3261),
            ("iqn.i", "10.0.0.9", 3260),
            ("iqn.t2", "10.0.0.2", 3260),
        ] {
            attrs.push(Attr::string(Tag::PG_ISCSI_NAME, name));
            attrs.push(Attr::ip(Tag::PG_PORTAL_IP, ip.parse().unwrap()));
            attrs.push(Attr::tcp_port(Tag::PG_PORTAL_PORT, port));
            attrs.push(Attr::u32(Tag::PG_TAG, 1));
        }
        let rsp = Message::response_to(&q, Status::SUCCESS, attrs);
        let mut r = Reassembler::new();
        r.push(&rsp.encode(MAX_PAYLOAD));
        let got = parse_targets(&r.next_message().unwrap().unwrap());
        assert_eq!(
            got,
            vec![
                FoundTarget {
                    name: "iqn.t1".into(),
                    alias: Some("one".into()),
                    portals: vec![
                        ("10.0.0.1:3260".parse().unwrap(), 1),
                        ("[fd00::1]:3261".parse().unwrap(), 1)
                    ],
                },
                FoundTarget {
                    name: "iqn.t2".into(),
                    alias: None,
                    portals: vec![("10.0.0.2:3260".parse().unwrap(), 1)],
                },
            ]
        );
    }

    #[test]
    fn period_scn_and_esi_answers() {
        let reg = dev_attr_reg(9, "iqn.t", &entity(), false);
        let rsp = Message::response_to(
            &reg,
            Status::SUCCESS,
            vec![
                Attr::string(Tag::ENTITY_ID, "rsv:host"),
                Attr::empty(Tag::DELIMITER),
                Attr::u32(Tag::REGISTRATION_PERIOD, 30),
            ],
        );
        assert_eq!(granted_period(&rsp), Some(30));

        let scn = Message {
            function: FunctionId::SCN,
            flags: Flags(Flags::SERVER),
            xid: 4,
            status: None,
            attrs: vec![
                Attr::string(Tag::ISCSI_NAME, "iqn.i"),
                Attr::u64(Tag::TIMESTAMP, 1),
                Attr::string(Tag::ISCSI_NAME, "iqn.t"),
                Attr::u32(Tag::ISCSI_SCN_BITMAP, crate::attr::scn::OBJECT_ADDED),
            ],
        };
        assert_eq!(scn_changes(&scn), vec![("iqn.t".to_owned(), 8)]);
        let a = scn_response(&scn);
        assert_eq!(a.function, FunctionId(0x8008));
        assert_eq!(a.flags.0, Flags::CLIENT);
        assert_eq!(a.attrs, vec![Attr::string(Tag::ISCSI_NAME, "iqn.i")]);

        let esi = Message {
            function: FunctionId::ESI,
            flags: Flags(Flags::SERVER),
            xid: 5,
            status: None,
            attrs: vec![
                Attr::u64(Tag::TIMESTAMP, 2),
                Attr::string(Tag::ENTITY_ID, "e"),
            ],
        };
        let a = esi_response(&esi);
        assert_eq!(
            (a.function, a.status),
            (FunctionId(0x800d), Some(Status::SUCCESS))
        );
        assert_eq!(a.attrs, esi.attrs);
    }
}
