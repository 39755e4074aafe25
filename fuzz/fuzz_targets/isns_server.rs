//! The iSNS server's registry with state, as `rsv isns --auth-key` runs it: a sequence of
//! requests, each from one of three enrolled SPIs or from an anonymous client, each
//! answered with a status, and after each one the ownership rule checked: an entity
//! another caller registered is exactly as it was (portals, nodes, aliases, SCN
//! bitmaps, portal groups, period), and an anonymous request changes nothing. A
//! second registry takes the same requests without authentication (source-owned
//! entities): nothing may panic there, and what it holds survives a save and a load.
//!
//! Input: per request a caller byte (0-2: SPI a/b/c, 3: anonymous; +4: the time moves
//! on a second), a 16-bit length, then that many bytes of PDUs.

#![no_main]

use std::collections::BTreeMap;

use isns::attr::{Attr, Tag};
use isns::message::{Message, Reassembler};
use isns::pdu::FunctionId;
use isns::server::{Caller, Registry};
use libfuzzer_sys::fuzz_target;

const SPIS: [&str; 3] = ["spi-a", "spi-b", "spi-c"];

/// Everything the registry shows of each entity, by entity id, asked anonymously (a
/// query changes nothing but an entity's last sign of life, which is not shown).
fn view(r: &mut Registry) -> BTreeMap<String, Vec<Attr>> {
    let want = [
        Tag::ENTITY_ID,
        Tag::ENTITY_PROTOCOL,
        Tag::REGISTRATION_PERIOD,
        Tag::PORTAL_IP,
        Tag::PORTAL_PORT,
        Tag::ISCSI_NAME,
        Tag::ISCSI_NODE_TYPE,
        Tag::ISCSI_ALIAS,
        Tag::ISCSI_SCN_BITMAP,
        Tag::PG_ISCSI_NAME,
        Tag::PG_PORTAL_IP,
        Tag::PG_PORTAL_PORT,
        Tag::PG_TAG,
    ];
    let q = Message::request(
        FunctionId::DEV_ATTR_QRY,
        0,
        Attr::string(Tag::ISCSI_NAME, "observer"),
        Vec::new(),
        want.into_iter().map(Attr::empty).collect(),
    );
    let (rsp, _) = r.handle_from(&q, 0, Caller::Anonymous);
    let mut out: BTreeMap<String, Vec<Attr>> = BTreeMap::new();
    let mut current = None;
    for a in rsp.operating() {
        if a.tag == Tag::ENTITY_ID {
            current = a.as_str().map(str::to_owned);
        }
        if let Some(eid) = &current {
            out.entry(eid.clone()).or_default().push(a.clone());
        }
    }
    out
}

fuzz_target!(|input: &[u8]| {
    let mut secured = Registry::new(30);
    let mut open = Registry::new(30);
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    let mut now = 0u64;
    let mut rest = input;
    let mut requests = 0;
    while let [who, hi, lo, tail @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        let (bytes, after) = tail.split_at(len);
        rest = after;
        requests += 1;
        if requests > 64 {
            break;
        }
        if who & 4 != 0 {
            now += 1;
        }
        let spi = usize::from(who & 3);
        let caller = match SPIS.get(spi) {
            Some(s) => Caller::Authenticated(s),
            None => Caller::Anonymous,
        };
        let mut dec = Reassembler::new();
        dec.push(bytes);
        let Ok(Some(m)) = dec.next_message() else {
            continue;
        };
        if m.function.is_response() {
            continue;
        }
        let before = view(&mut secured);
        let (rsp, _) = secured.handle_from(&m, now, caller);
        assert!(rsp.status.is_some());
        let after = view(&mut secured);
        for (eid, was) in &before {
            let owner = owners.get(eid).copied();
            let may = owner.is_some() && owner == SPIS.get(spi).map(|_| spi);
            if !may {
                assert_eq!(
                    after.get(eid),
                    Some(was),
                    "entity {eid} changed by {caller:?}"
                );
            }
        }
        owners.retain(|eid, _| after.contains_key(eid));
        for eid in after.keys() {
            if !before.contains_key(eid) {
                assert!(
                    spi < SPIS.len(),
                    "entity {eid} made by an anonymous request"
                );
                owners.insert(eid.clone(), spi);
            }
        }

        let (rsp, _) = open.handle(&m, now);
        assert!(rsp.status.is_some());
    }
    let saved = secured.save();
    let mut again = Registry::load(30, &saved);
    assert_eq!(view(&mut again), view(&mut secured));
    assert_eq!(Registry::load(30, &open.save()).save(), open.save());
});
