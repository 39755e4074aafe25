//! SendTargets discovery: which targets a portal offers, in a discovery session of its own.
//! iSNS (`isns.rs`) is the other source of targets.

use std::time::Duration;

use bytes::Bytes;
use iscsi::ffp::logout;
use iscsi::login::{InitiatorLoginConfig, SessionType};
use iscsi::negotiate::SessionParams;
use iscsi::pdu::{LogoutRequest, Pdu, TextRequest, RESERVED_TAG};
use serde::Serialize;

use crate::conn::RawConn;
use crate::session::login::{chap, connection_prefs, new_isid};
use crate::{Error, IscsiUrl, Result, SessionOptions};

/// A target found by SendTargets.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    /// Known from iSNS; SendTargets does not carry it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// `address:port,tpgt` as the target reported them.
    pub portals: Vec<String>,
}

/// SendTargets discovery on the portal of `url` (target and LUN in it are ignored).
pub async fn discover(url: &IscsiUrl, opts: &SessionOptions) -> Result<Vec<DiscoveredTarget>> {
    let portal = url.portal();
    let mut raw = RawConn::connect(&portal, opts).await?;
    let isid = new_isid();
    let cfg = InitiatorLoginConfig {
        initiator_name: opts.initiator_name.clone(),
        initiator_alias: None,
        target_name: None,
        session_type: SessionType::Discovery,
        isid,
        tsih: 0,
        cid: 0,
        auth: chap(url, opts),
        session: SessionParams::default(),
        connection: connection_prefs(opts),
        leading: true,
        pacing_hint: None,
        start_hint: None,
        probe_hint: None,
    };
    let done = raw.login(cfg, 1, 1).await?;
    let mut cmdsn = done.expcmdsn;
    let mut text = Vec::new();
    let mut ttt = RESERVED_TAG;
    let mut data = Bytes::from_static(b"SendTargets=All\0");
    loop {
        raw.send(&Pdu::TextRequest(TextRequest {
            immediate: false,
            final_: true,
            cont: false,
            lun: 0,
            itt: 2,
            ttt,
            cmdsn,
            expstatsn: raw.exp_statsn,
            data: std::mem::take(&mut data),
        }))
        .await?;
        cmdsn = cmdsn.wrapping_add(1);
        let resp = match raw.recv().await? {
            Pdu::TextResponse(r) => r,
            Pdu::Reject(r) => {
                return Err(Error::Protocol(format!(
                    "SendTargets rejected (reason 0x{:02x})",
                    r.reason
                )))
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {:?} during discovery",
                    other.opcode()
                )))
            }
        };
        raw.exp_statsn = resp.statsn.wrapping_add(1);
        text.extend_from_slice(&resp.data);
        if !resp.cont {
            break;
        }
        ttt = resp.ttt;
    }
    let _ = raw
        .send(&Pdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: logout::CLOSE_SESSION,
            itt: 3,
            cid: 0,
            cmdsn,
            expstatsn: raw.exp_statsn,
        }))
        .await;
    let _ = tokio::time::timeout(Duration::from_secs(2), raw.recv()).await;
    Ok(parse_send_targets(&text, &portal))
}

fn parse_send_targets(text: &[u8], portal: &str) -> Vec<DiscoveredTarget> {
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for pair in text.split(|&b| b == 0) {
        let pair = String::from_utf8_lossy(pair);
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        match k {
            "TargetName" => out.push(DiscoveredTarget {
                name: v.to_owned(),
                alias: None,
                portals: Vec::new(),
            }),
            "TargetAddress" => {
                if let Some(t) = out.last_mut() {
                    t.portals.push(v.to_owned());
                }
            }
            _ => {}
        }
    }
    // A target that lists no address is reachable where it was asked (RFC 7143 C.1).
    for t in &mut out {
        if t.portals.is_empty() {
            t.portals.push(portal.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_targets_text() {
        let t = b"TargetName=iqn.a\0TargetAddress=10.0.0.1:3260,1\0TargetAddress=[::1]:3260,1\0TargetName=iqn.b\0";
        let v = parse_send_targets(t, "h:3260");
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].portals.len(), 2);
        assert_eq!(v[1].portals, vec!["h:3260".to_owned()]);
    }
}
