//! Asymmetric logical unit access (SPC-4 5.16) for a logical unit that several targets
//! export (a gateway group): REPORT TARGET PORT GROUPS' answer from the groups' states,
//! SET TARGET PORT GROUPS' parameter list, and which commands a target port in each
//! state serves. Sans-IO: the states come from the store (`backstore::groups`).

use backstore::groups::{AccessState, GroupState, Why};

use crate::cdb::{be32, truncate};
use crate::opcodes::service_action as sa;
use crate::opcodes::*;
use crate::sense::{self, Sense};

/// SUPPORTED STATES of every group of a gateway group (byte 1 of its descriptor):
/// T_SUP (bit 7), U_SUP (3), S_SUP (2), AN_SUP (1), AO_SUP (0). Not O_SUP (offline: a
/// port taken away by an administrative action other than this command), nor LBD_SUP.
pub const GATEWAY_SUPPORTED: u8 = 0x80 | 0x08 | 0x04 | 0x02 | 0x01;
/// A target alone (no peers): its one group is always active/optimized (AO_SUP).
pub const FIXED_SUPPORTED: u8 = 0x01;

/// What REPORT TARGET PORT GROUPS reports.
pub struct Report<'a> {
    /// Every group in the order of its id; each holds one target port whose relative
    /// identifier is the group's (`own_port` for this target's group).
    pub groups: &'a [GroupState],
    pub own_group: u16,
    pub own_port: u16,
    pub supported: u8,
    /// IMPLICIT TRANSITION TIME of the extended header, in seconds.
    pub transition_time: u8,
}

/// REPORT TARGET PORT GROUPS (SPC-4 6.37): the length (or the extended header, format
/// 01b) and one descriptor per group.
///
/// No group is marked preferred (PREF, byte 0 bit 7, stays zero, as LIO and SCST leave
/// it unless told): libiscsi from its RTPG support (release 1.20.3) until its fix of the
/// bit fields reads byte 0's high nibble as the access state, so a set PREF reached its
/// users (and its test suite's ReportTargetPortGroups.Simple) as the invalid state 8.
pub fn report_target_port_groups(cdb: &[u8], r: &Report<'_>) -> Result<Vec<u8>, Sense> {
    let format = cdb[1] >> 5;
    if format > 1 {
        return Err(Sense::invalid_field_in_cdb(1, Some(7)));
    }
    let alloc = be32(&cdb[6..10]) as usize;
    let mut body = Vec::with_capacity(12 * r.groups.len());
    for g in r.groups {
        let port = if g.group == r.own_group {
            r.own_port
        } else {
            g.group
        };
        body.push(g.state.code());
        body.push(r.supported);
        body.extend_from_slice(&g.group.to_be_bytes());
        // Reserved, STATUS CODE, vendor specific, TARGET PORT COUNT.
        body.extend_from_slice(&[0, g.why.code(), 0, 1]);
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&port.to_be_bytes());
    }
    let mut d = Vec::with_capacity(8 + body.len());
    if format == 1 {
        d.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        // FORMAT TYPE 001b; IMPLICIT TRANSITION TIME.
        d.extend_from_slice(&[0x10, r.transition_time, 0, 0]);
    } else {
        d.extend_from_slice(&(body.len() as u32).to_be_bytes());
    }
    d.extend(body);
    Ok(truncate(d, alloc))
}

/// The fixed answer of a group whose states nothing keeps: every group active/optimized,
/// no status.
pub fn fixed_states(own: u16, peers: &[u16]) -> Vec<GroupState> {
    let mut ids: Vec<u16> = peers.iter().copied().chain([own]).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|group| GroupState {
            group,
            state: AccessState::ActiveOptimized,
            why: Why::None,
        })
        .collect()
}

/// SET TARGET PORT GROUPS' parameter list (SPC-4 6.43): four reserved bytes, then one
/// four-byte descriptor per group (ASYMMETRIC ACCESS STATE in byte 0's low nibble, the
/// group's id in bytes 2-3). `known` are the groups that exist. A state may be set to
/// active/optimized, active/non-optimized, standby or unavailable; transitioning is the
/// targets' own to enter, and a group named twice is ambiguous: both refused, as is a
/// group that does not exist, with the field pointer on the offending byte. An empty
/// list changes nothing.
pub fn parse_set_target_port_groups(
    data: &[u8],
    known: &[u16],
) -> Result<Vec<(u16, AccessState)>, Sense> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    if data.len() < 4 || !(data.len() - 4).is_multiple_of(4) {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let mut out: Vec<(u16, AccessState)> = Vec::with_capacity((data.len() - 4) / 4);
    for (i, d) in data[4..].chunks_exact(4).enumerate() {
        let at = (4 + 4 * i) as u16;
        let state = match AccessState::from_code(d[0] & 0x0f) {
            Some(AccessState::Transitioning) | None => {
                return Err(Sense::invalid_field_in_parameter_list(at, Some(3)))
            }
            Some(s) => s,
        };
        let group = u16::from_be_bytes([d[2], d[3]]);
        if !known.contains(&group) || out.iter().any(|(g, _)| *g == group) {
            return Err(Sense::invalid_field_in_parameter_list(at + 2, None));
        }
        out.push((group, state));
    }
    Ok(out)
}

/// Whether a target port in `state` serves `cdb` (SPC-4 5.16.2.4.3-5.16.2.4.6); `Err`
/// with the NOT READY sense the state prescribes for the commands it refuses.
pub fn serves(state: AccessState, cdb: &[u8]) -> Result<(), Sense> {
    let opcode = cdb.first().copied().unwrap_or(0);
    let action = cdb.get(1).map_or(0, |b| b & 0x1f);
    let stpg = opcode == MAINTENANCE_OUT && action == sa::maintenance_out::SET_TARGET_PORT_GROUPS;
    // Every state serves these: what an initiator needs to find the LU and its paths,
    // and to choose another state.
    let anywhere = matches!(
        opcode,
        INQUIRY | REPORT_LUNS | REQUEST_SENSE | MAINTENANCE_IN
    ) || stpg;
    match state {
        AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => Ok(()),
        _ if anywhere => Ok(()),
        AccessState::Standby
            if matches!(
                opcode,
                MODE_SENSE_6
                    | MODE_SENSE_10
                    | MODE_SELECT_6
                    | MODE_SELECT_10
                    | SEND_DIAGNOSTIC
                    | PERSISTENT_RESERVE_IN
                    | PERSISTENT_RESERVE_OUT
            ) =>
        {
            Ok(())
        }
        AccessState::Standby => Err(sense::TARGET_PORT_IN_STANDBY_STATE),
        AccessState::Unavailable => Err(sense::TARGET_PORT_IN_UNAVAILABLE_STATE),
        AccessState::Transitioning => Err(sense::ASYMMETRIC_ACCESS_STATE_TRANSITION),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(group: u16, state: AccessState, why: Why) -> GroupState {
        GroupState { group, state, why }
    }

    #[test]
    fn report_encodes_states_supported_status_and_extended_header() {
        let groups = [
            g(1, AccessState::ActiveOptimized, Why::None),
            g(2, AccessState::Standby, Why::Explicit),
            g(3, AccessState::Unavailable, Why::Implicit),
        ];
        let r = Report {
            groups: &groups,
            own_group: 2,
            own_port: 7,
            supported: GATEWAY_SUPPORTED,
            transition_time: 5,
        };
        let plain =
            report_target_port_groups(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], &r).unwrap();
        assert_eq!(plain.len(), 4 + 36);
        assert_eq!(&plain[..4], &36u32.to_be_bytes());
        assert_eq!(
            &plain[4..16],
            &[0x00, 0x8f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1],
            "group 1: AO, T/U/S/AN/AO supported, no status, one port 1"
        );
        assert_eq!(&plain[16..28], &[0x02, 0x8f, 0, 2, 0, 1, 0, 1, 0, 0, 0, 7]);
        assert_eq!(&plain[28..40], &[0x03, 0x8f, 0, 3, 0, 2, 0, 1, 0, 0, 0, 3]);
        let ext =
            report_target_port_groups(&[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], &r).unwrap();
        assert_eq!(&ext[..8], &[0, 0, 0, 40, 0x10, 5, 0, 0]);
        assert_eq!(&ext[8..], &plain[4..]);
        // Transitioning is Fh; the allocation length cuts.
        let t = [g(1, AccessState::Transitioning, Why::Implicit)];
        let r = Report { groups: &t, ..r };
        let d = report_target_port_groups(&[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0], &r).unwrap();
        assert_eq!(d, [0, 0, 0, 12, 0x0f]);
        assert!(
            report_target_port_groups(&[0xa3, 0x4a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0], &r).is_err()
        );
    }

    #[test]
    fn fixed_is_one_active_optimized_group_per_target() {
        let s = fixed_states(2, &[3, 1, 2]);
        assert_eq!(
            s.iter().map(|g| (g.group, g.state)).collect::<Vec<_>>(),
            [1, 2, 3].map(|g| (g, AccessState::ActiveOptimized))
        );
    }

    #[test]
    fn set_target_port_groups_list() {
        let known = [1, 2];
        let ok = parse_set_target_port_groups(&[0, 0, 0, 0, 0x02, 0, 0, 2, 0x01, 0, 0, 1], &known);
        assert_eq!(
            ok.unwrap(),
            [
                (2, AccessState::Standby),
                (1, AccessState::ActiveNonOptimized)
            ]
        );
        // The high nibble of byte 0 is reserved: only the state is read.
        assert_eq!(
            parse_set_target_port_groups(&[0, 0, 0, 0, 0x80, 0, 0, 1], &known).unwrap(),
            [(1, AccessState::ActiveOptimized)]
        );
        assert_eq!(parse_set_target_port_groups(&[], &known).unwrap(), []);
        assert_eq!(
            parse_set_target_port_groups(&[0, 0, 0, 0], &known).unwrap(),
            []
        );
        for bad in [
            &[0u8, 0, 0][..],
            &[0, 0, 0, 0, 0, 0, 1],
            &[0, 0, 0, 0, 0, 0, 0, 1, 0],
        ] {
            assert_eq!(
                parse_set_target_port_groups(bad, &known).unwrap_err(),
                sense::PARAMETER_LIST_LENGTH_ERROR,
                "{bad:?}"
            );
        }
        let field = |e: Sense| (e.asc, e.sks);
        // Transitioning, reserved codes, an unknown group, a group twice.
        let e = parse_set_target_port_groups(&[0, 0, 0, 0, 0x0f, 0, 0, 1], &known).unwrap_err();
        assert_eq!(field(e), (0x26, Some([0x8b, 0, 4])));
        let e = parse_set_target_port_groups(&[0, 0, 0, 0, 0x04, 0, 0, 1], &known).unwrap_err();
        assert_eq!(e.asc, 0x26);
        let e = parse_set_target_port_groups(&[0, 0, 0, 0, 0, 0, 0, 9], &known).unwrap_err();
        assert_eq!(field(e), (0x26, Some([0x80, 0, 6])));
        let e = parse_set_target_port_groups(&[0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 1], &known)
            .unwrap_err();
        assert_eq!(field(e), (0x26, Some([0x80, 0, 10])));
    }

    #[test]
    fn states_serve_what_spc_lets_them() {
        let read = [READ_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let tur = [TEST_UNIT_READY, 0, 0, 0, 0, 0];
        let rtpg = [MAINTENANCE_IN, 0x0a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        let stpg = [MAINTENANCE_OUT, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
        let prin = [PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
        for s in [
            AccessState::ActiveOptimized,
            AccessState::ActiveNonOptimized,
        ] {
            assert!(serves(s, &read).is_ok());
        }
        for (s, refusal) in [
            (AccessState::Standby, sense::TARGET_PORT_IN_STANDBY_STATE),
            (
                AccessState::Unavailable,
                sense::TARGET_PORT_IN_UNAVAILABLE_STATE,
            ),
            (
                AccessState::Transitioning,
                sense::ASYMMETRIC_ACCESS_STATE_TRANSITION,
            ),
        ] {
            assert_eq!(serves(s, &read), Err(refusal));
            assert_eq!(serves(s, &tur), Err(refusal));
            for ok in [
                &rtpg[..],
                &stpg,
                &[INQUIRY, 0, 0, 0, 96, 0],
                &[REQUEST_SENSE, 0, 0, 0, 18, 0],
            ] {
                assert!(serves(s, ok).is_ok(), "{s:?} {ok:02x?}");
            }
            assert_eq!(serves(s, &prin).is_ok(), s == AccessState::Standby);
        }
    }
}
