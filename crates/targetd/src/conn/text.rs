//! Text requests in full feature phase (RFC 7143 11.10, 11.11): requests and responses
//! that span several PDUs, SendTargets with the portals as this connection reaches them,
//! and the `X-org.reservoir.PacingRate` hint; every other key is answered NotUnderstood or
//! Reject, as renegotiation is not offered. A SendTargets whose value is none of the
//! three RFC 7143 allows is a protocol error: the request gets a Reject PDU.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use iscsi::negotiate::TargetPacing;
use iscsi::pdu::{reject_reason, Pdu, TextRequest, TextResponse, RESERVED_TAG};
use iscsi::text::{split_for_pdus, TextKeys};
use tracing::debug;

use crate::loglimit::peer_log;

use super::{header_of, Conn};
use crate::node::TargetNode;
use crate::wire::Out;

impl Conn {
    /// A text request that cannot be read: a protocol error, answered with a Reject.
    fn refuse_text(&self, t: TextRequest, e: impl std::fmt::Display) {
        peer_log!(warn, "connection {}: text request: {e}", self.cid);
        self.reject(
            reject_reason::PROTOCOL_ERROR,
            &header_of(&Pdu::TextRequest(t)),
        );
    }

    pub(super) fn on_text(&mut self, t: TextRequest) {
        let max = self.params.max_send_data_segment_length as usize;
        if t.ttt != RESERVED_TAG {
            // The initiator asks for the next part of a long response.
            match self.text_out.take() {
                Some((itt, ttt, mut rest)) if itt == t.itt && ttt == t.ttt => {
                    let chunk = rest.pop_front().unwrap_or_default();
                    let more = !rest.is_empty();
                    self.send(TextResponse {
                        final_: !more,
                        cont: more,
                        lun: t.lun,
                        itt: t.itt,
                        ttt: if more { ttt } else { RESERVED_TAG },
                        data: Bytes::from(chunk),
                        ..Default::default()
                    });
                    if more {
                        self.text_out = Some((itt, ttt, rest));
                    }
                }
                _ => self.reject(
                    reject_reason::INVALID_PDU_FIELD,
                    &header_of(&Pdu::TextRequest(t)),
                ),
            }
            return;
        }
        self.text_out = None;
        let whole = match self.text_in.push(&t.data, t.cont) {
            Ok(Some(whole)) => whole,
            Ok(None) => {
                // More of the request follows: answer empty, as RFC 7143 11.10.2 asks.
                let ttt = self.new_ttt();
                self.send(TextResponse {
                    final_: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt,
                    ..Default::default()
                });
                return;
            }
            Err(e) => return self.refuse_text(t, e),
        };
        let keys = match TextKeys::parse(&whole) {
            Ok(k) => k,
            Err(e) => return self.refuse_text(t, e),
        };
        let mut answer = TextKeys::new();
        for (k, v) in keys.iter() {
            if k == "SendTargets" {
                let Some(scope) = SendTargetsScope::of(v) else {
                    // As LIO does: there is no answer to give in the text (no target is
                    // named and "All" is not what was asked), and an empty list would say
                    // "no such target" to a request that names none.
                    peer_log!(
                        warn,
                        "connection {}: SendTargets={v:?}: neither All, empty nor an iSCSI name",
                        self.cid
                    );
                    self.reject(
                        reject_reason::PROTOCOL_ERROR,
                        &header_of(&Pdu::TextRequest(t)),
                    );
                    return;
                };
                self.send_targets(scope, &mut answer);
            } else if k == iscsi::negotiate::PACING_RATE_KEY {
                self.pacing_hint(v, &mut answer);
            } else if k.starts_with("X-")
                || k.starts_with("X#")
                || iscsi::negotiate::lookup(k).is_none()
            {
                answer.push(k, iscsi::text::NOT_UNDERSTOOD);
            } else {
                // Renegotiation in full feature phase is not offered: the value in force
                // stays (RFC 7143 6.2).
                answer.push(k, iscsi::text::REJECT);
            }
        }
        let mut chunks: VecDeque<Vec<u8>> = split_for_pdus(&answer.encode(), max).into();
        let first = chunks.pop_front().unwrap_or_default();
        let more = !chunks.is_empty();
        let ttt = if more { self.new_ttt() } else { RESERVED_TAG };
        self.send(TextResponse {
            final_: !more,
            cont: more,
            lun: t.lun,
            itt: t.itt,
            ttt,
            data: Bytes::from(first),
            ..Default::default()
        });
        if more {
            self.text_out = Some((t.itt, ttt, chunks));
        }
    }

    /// `X-org.reservoir.PacingRate` in full feature phase: the initiator's rate control
    /// found the bottleneck and asks for this connection's share of it. Answered as at
    /// login (the target's own rate wins; hints may be off); applied by the writer, so
    /// that the answer goes out already paced. Discovery sessions send no data to pace.
    fn pacing_hint(&self, offered: &str, answer: &mut TextKeys) {
        let key = iscsi::negotiate::PACING_RATE_KEY;
        if self.session.is_discovery() {
            answer.push(key, iscsi::text::IRRELEVANT);
            return;
        }
        let s = &self.shared.config.session;
        let (a, pacing) = iscsi::negotiate::answer_pacing_hint(offered, &s.pacing_policy());
        match pacing {
            TargetPacing::Paced(rate) if Some(rate) != s.pacing_rate => {
                debug!(
                    "cid {}: Data-In paced at {rate} bytes/s as the initiator asks",
                    self.cid
                );
                let _ = self.out.send(Out::Pace(rate));
            }
            TargetPacing::NotPaced if s.pacing_rate.is_none() && s.accept_pacing_hint => {
                // "0": the initiator no longer wants this connection paced.
                let _ = self.out.send(Out::Pace(u64::MAX));
            }
            _ => {}
        }
        answer.push(key, a.wire().unwrap_or(iscsi::text::REJECT));
    }

    fn portal_addresses(&self) -> Vec<String> {
        self.shared
            .portals
            .iter()
            .map(|p| {
                let ip = if p.ip().is_unspecified() {
                    self.local.ip()
                } else {
                    p.ip()
                };
                let addr = SocketAddr::new(ip, p.port());
                format!("{addr},{}", self.shared.config.portal_group)
            })
            .collect()
    }

    fn send_targets(&self, which: SendTargetsScope, answer: &mut TextKeys) {
        let own = self.session.target();
        // The targets as the configuration has them now (a reload may have changed them).
        let live = self.shared.live();
        let visible: Vec<&Arc<TargetNode>> = match &own {
            // A normal session sees only its own target.
            Some(t) => vec![t],
            None => live
                .targets
                .iter()
                .filter(|t| {
                    t.allows(&self.session.initiator)
                        && t.reachable_through(self.shared.configured_portal(self.local))
                })
                .collect(),
        };
        let wanted: Vec<&Arc<TargetNode>> = match which {
            SendTargetsScope::All => visible,
            SendTargetsScope::SessionTarget => match &own {
                Some(t) => vec![t],
                None => Vec::new(),
            },
            SendTargetsScope::Named(name) => visible
                .into_iter()
                .filter(|t| t.iqn.eq_ignore_ascii_case(name))
                .collect(),
        };
        let addrs = self.portal_addresses();
        for t in wanted {
            answer.push("TargetName", t.iqn.clone());
            for a in &addrs {
                answer.push("TargetAddress", a.clone());
            }
        }
    }
}

/// What a SendTargets request asks for. RFC 7143 13.3 (and its SendTargets appendix):
/// the value is `All`, an iSCSI name, or nothing (in a normal session, the session's
/// target); values are case-sensitive, names compared without case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendTargetsScope<'a> {
    All,
    SessionTarget,
    Named(&'a str),
}

impl<'a> SendTargetsScope<'a> {
    /// `None` for a value of none of the three forms.
    fn of(value: &'a str) -> Option<Self> {
        match value {
            "All" => Some(Self::All),
            "" => Some(Self::SessionTarget),
            name => crate::config::validate_iscsi_name(name)
                .is_ok()
                .then_some(Self::Named(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SendTargetsScope;

    /// libiscsi's iSCSISendTargets.Invalid sends these and expects each to fail, as LIO
    /// fails them (a Reject PDU).
    #[test]
    fn send_targets_takes_all_nothing_or_an_iscsi_name() {
        assert_eq!(SendTargetsScope::of("All"), Some(SendTargetsScope::All));
        assert_eq!(
            SendTargetsScope::of(""),
            Some(SendTargetsScope::SessionTarget)
        );
        for name in [
            "iqn.2026-11.org.reservoir:t",
            "IQN.2026-11.ORG.RESERVOIR:T",
            "eui.0123456789abcdef",
            "naa.0123456789abcdef",
        ] {
            assert_eq!(
                SendTargetsScope::of(name),
                Some(SendTargetsScope::Named(name))
            );
        }
        for bad in ["Alle", "A", "aLL", "all", "iqn.", "eui.01", "All "] {
            assert_eq!(SendTargetsScope::of(bad), None, "{bad:?}");
        }
    }
}
