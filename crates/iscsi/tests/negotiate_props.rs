//! Property tests for the negotiation rules of RFC 7143 section 6.2.

use iscsi::negotiate::*;
use iscsi::text::{parse_number, TextKeys};
use proptest::prelude::*;

fn target_ctx() -> NegotiationContext {
    NegotiationContext {
        session_type: SessionType::Normal,
        leading: true,
        phase: Phase::Operational,
        we_are_target: true,
    }
}

fn session_params() -> impl Strategy<Value = SessionParams> {
    (
        (
            1u16..=65535,
            any::<bool>(),
            any::<bool>(),
            512u32..(1 << 24),
        ),
        (512u32..(1 << 24), 0u16..=3600, 0u16..=3600, 1u16..=65535),
        (any::<bool>(), any::<bool>(), 0u8..=2, 0u8..=31),
        prop_oneof![
            Just(TaskReporting::Rfc3720),
            Just(TaskReporting::ResponseFence),
            Just(TaskReporting::FastAbort)
        ],
    )
        .prop_map(
            |((mc, ir2t, imm, mbl), (fbl, t2w, t2r, mor2t), (dpio, dsio, erl, lvl), tr)| {
                SessionParams {
                    max_connections: mc,
                    initial_r2t: ir2t,
                    immediate_data: imm,
                    max_burst_length: mbl,
                    first_burst_length: fbl,
                    default_time2wait: t2w,
                    default_time2retain: t2r,
                    max_outstanding_r2t: mor2t,
                    data_pdu_in_order: dpio,
                    data_sequence_in_order: dsio,
                    error_recovery_level: erl,
                    iscsi_protocol_level: lvl,
                    task_reporting: tr,
                }
            },
        )
}

fn connection_params() -> impl Strategy<Value = ConnectionParams> {
    (any::<bool>(), any::<bool>(), 512u32..(1 << 24)).prop_map(|(hd, dd, mrdsl)| ConnectionParams {
        header_digest: hd,
        data_digest: dd,
        max_recv_data_segment_length: mrdsl,
        max_send_data_segment_length: 8192,
    })
}

const NUMERICAL: &[&str] = &[
    "MaxConnections",
    "MaxBurstLength",
    "FirstBurstLength",
    "DefaultTime2Wait",
    "DefaultTime2Retain",
    "MaxOutstandingR2T",
    "ErrorRecoveryLevel",
    "iSCSIProtocolLevel",
];

const BOOLEAN: &[&str] = &[
    "InitialR2T",
    "ImmediateData",
    "DataPDUInOrder",
    "DataSequenceInOrder",
];

fn ours(name: &str, s: &SessionParams) -> u64 {
    match name {
        "MaxConnections" => s.max_connections as u64,
        "MaxBurstLength" => s.max_burst_length as u64,
        "FirstBurstLength" => s.first_burst_length as u64,
        "DefaultTime2Wait" => s.default_time2wait as u64,
        "DefaultTime2Retain" => s.default_time2retain as u64,
        "MaxOutstandingR2T" => s.max_outstanding_r2t as u64,
        "ErrorRecoveryLevel" => s.error_recovery_level as u64,
        "iSCSIProtocolLevel" => s.iscsi_protocol_level as u64,
        "InitialR2T" => s.initial_r2t as u64,
        "ImmediateData" => s.immediate_data as u64,
        "DataPDUInOrder" => s.data_pdu_in_order as u64,
        "DataSequenceInOrder" => s.data_sequence_in_order as u64,
        _ => unreachable!(),
    }
}

proptest! {
    #[test]
    fn numerical_result_lies_within_both_offers(
        idx in 0..NUMERICAL.len(),
        offered in any::<u64>(),
        prefs in session_params(),
    ) {
        let name = NUMERICAL[idx];
        let def = lookup(name).unwrap();
        let (lo, hi) = def.range.unwrap();
        let answer = respond_key(name, &offered.to_string(), &target_ctx(), &prefs, &ConnectionParams::default());
        if offered < lo || offered > hi {
            prop_assert_eq!(answer, Answer::Reject);
        } else {
            let Answer::Value(v) = answer else { panic!("{name}: {answer:?}") };
            let v = parse_number(&v).unwrap();
            let mine = ours(name, &prefs);
            prop_assert!((lo..=hi).contains(&v));
            match def.kind {
                KeyKind::NumericalMin => {
                    prop_assert!(v <= offered && v <= mine);
                    prop_assert!(v == offered || v == mine);
                }
                KeyKind::NumericalMax => {
                    prop_assert!(v >= offered && v >= mine);
                    prop_assert!(v == offered || v == mine);
                }
                k => panic!("{name} is {k:?}"),
            }
        }
    }

    #[test]
    fn boolean_result_follows_and_or(
        idx in 0..BOOLEAN.len(),
        offered in any::<bool>(),
        prefs in session_params(),
    ) {
        let name = BOOLEAN[idx];
        let def = lookup(name).unwrap();
        let answer = respond_key(name, if offered { "Yes" } else { "No" }, &target_ctx(), &prefs, &ConnectionParams::default());
        let mine = ours(name, &prefs) != 0;
        let expected = match def.kind {
            KeyKind::BooleanAnd => offered && mine,
            KeyKind::BooleanOr => offered || mine,
            k => panic!("{name} is {k:?}"),
        };
        prop_assert_eq!(answer, Answer::Value(if expected { "Yes" } else { "No" }.into()));
    }

    #[test]
    fn list_result_is_offered_and_supported(
        offered in proptest::sample::subsequence(vec!["CRC32C", "None", "MD5", "X"], 1..=4)
            .prop_shuffle(),
        accept_crc in any::<bool>(),
    ) {
        let conn = ConnectionParams { header_digest: accept_crc, ..ConnectionParams::default() };
        let ours: &[&str] = if accept_crc { &["CRC32C", "None"] } else { &["None"] };
        let answer = respond_key("HeaderDigest", &offered.join(","), &target_ctx(), &SessionParams::default(), &conn);
        match answer {
            Answer::Value(v) => {
                prop_assert!(offered.contains(&v.as_str()));
                prop_assert!(ours.contains(&v.as_str()));
                // The first offered value we support wins.
                let first = offered.iter().find(|o| ours.contains(o)).unwrap();
                prop_assert_eq!(&v.as_str(), first);
            }
            Answer::Reject => prop_assert!(!offered.iter().any(|o| ours.contains(o))),
            other => panic!("{other:?}"),
        }
    }

    /// Our originator and our responder agree on every result, whatever either prefers,
    /// and the originator accepts every answer the responder gives.
    #[test]
    fn originator_and_responder_agree(
        init_s in session_params(),
        init_c in connection_params(),
        tgt_s in session_params(),
        tgt_c in connection_params(),
    ) {
        let mut o = Originator::new(
            NegotiationContext { we_are_target: false, ..target_ctx() },
            init_s, init_c.clone(), None,
        );
        let mut r = Responder::new(target_ctx(), tgt_s, tgt_c.clone(), None);
        let offer = o.offer();
        let mut answer = r.respond(&offer).unwrap();
        answer.0.extend(r.declarations().0);
        let reply = o.on_response(&answer).unwrap();
        prop_assert!(reply.is_empty());
        o.finish();
        prop_assert_eq!(&o.session, &r.session);
        prop_assert!(o.session.first_burst_length <= o.session.max_burst_length);
        prop_assert_eq!(o.connection.header_digest, r.connection.header_digest);
        prop_assert_eq!(o.connection.data_digest, r.connection.data_digest);
        prop_assert_eq!(o.connection.max_send_data_segment_length, tgt_c.max_recv_data_segment_length);
        prop_assert_eq!(r.connection.max_send_data_segment_length, init_c.max_recv_data_segment_length);
    }

    #[test]
    fn text_round_trips(pairs in proptest::collection::vec(("[A-Za-z][A-Za-z0-9.+@_-]{0,62}", "[ -~]{0,100}"), 0..50)) {
        let keys = TextKeys(pairs.into_iter().map(|(k, v)| (k, v.replace('\0', ""))).collect());
        let encoded = keys.encode();
        prop_assert_eq!(TextKeys::parse(&encoded).unwrap(), keys.clone());
        let mut padded = encoded;
        padded.extend_from_slice(&[0, 0, 0]);
        prop_assert_eq!(TextKeys::parse(&padded).unwrap(), keys);
    }

    #[test]
    fn parse_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let _ = TextKeys::parse(&data);
    }
}
