//! What the gateways of a group write for each other about reservations, as bytes (the
//! object `reservoir.IMAGE.pr` and the notifications on it; `pr.rs` does the I/O): pure
//! functions with no librados, so that the fuzz targets build without Ceph's libraries
//! (this module is all the crate has without its `ceph` feature). Everything here reads
//! what another gateway, or whoever may write to the pool, wrote: nothing may panic.

const HEADER: &str = "reservoir-pr-seq ";
/// A notification's first bytes: then the sender's id, the sequence, the state's length,
/// a newline, the state and the logical unit's event.
pub const EVENT: &[u8] = b"reservoir pr ";

/// What the object holds: the sequence, the members, the logical unit's state.
#[derive(Debug, PartialEq, Eq)]
pub struct Content {
    pub seq: u64,
    pub members: Vec<u64>,
    pub state: Vec<u8>,
}

impl Content {
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = format!("{HEADER}{}\n", self.seq).into_bytes();
        for m in &self.members {
            b.extend_from_slice(format!("member {m}\n").as_bytes());
        }
        b.extend_from_slice(b"state\n");
        b.extend_from_slice(&self.state);
        b
    }
}

/// The object's content: `reservoir-pr-seq N`, `member ID` lines, `state`, then the
/// state's bytes.
pub fn parse(content: &[u8]) -> Option<Content> {
    let mut rest = content;
    let mut line = || {
        let nl = rest.iter().position(|&b| b == b'\n')?;
        let l = std::str::from_utf8(&rest[..nl]).ok()?;
        rest = &rest[nl + 1..];
        Some(l)
    };
    let seq = line()?.strip_prefix(HEADER)?.parse().ok()?;
    let mut members = Vec::new();
    loop {
        match line()? {
            "state" => break,
            l => members.push(l.strip_prefix("member ")?.parse().ok()?),
        }
    }
    Some(Content {
        seq,
        members,
        state: rest.to_vec(),
    })
}

/// The ids in the acknowledgements of a `rados_notify2` reply (each target acknowledges
/// with its id): a map of (gid, cookie) to payload, then the timed-out (gid, cookie)s.
pub fn acked(reply: &[u8]) -> Option<Vec<u64>> {
    let mut at = 0usize;
    let mut take = |n: usize| {
        let b = reply.get(at..at + n)?;
        at += n;
        Some(b)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().ok()?);
    let mut ids = Vec::new();
    for _ in 0..count {
        take(16)?;
        let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let payload = take(len)?;
        if let Some(id) = std::str::from_utf8(payload)
            .ok()
            .and_then(|s| s.parse().ok())
        {
            ids.push(id);
        }
    }
    Some(ids)
}

/// A notification: (sender, seq, the object's content, event).
pub fn parse_event(payload: &[u8]) -> Option<(u64, u64, &[u8], &[u8])> {
    let rest = payload.strip_prefix(EVENT)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let head = std::str::from_utf8(&rest[..nl]).ok()?;
    let mut f = head.split(' ');
    let sender = f.next()?.parse().ok()?;
    let seq = f.next()?.parse().ok()?;
    let len: usize = f.next()?.parse().ok()?;
    let body = &rest[nl + 1..];
    if body.len() < len {
        return None;
    }
    Some((sender, seq, &body[..len], &body[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_and_events_parse() {
        let c = Content {
            seq: 7,
            members: vec![3, 4],
            state: b"ab\nstate\n".to_vec(),
        };
        assert_eq!(parse(&c.bytes()), Some(c));
        assert_eq!(
            parse(b"reservoir-pr-seq 0\nstate\n").map(|c| (c.seq, c.members.len())),
            Some((0, 0))
        );
        assert_eq!(parse(b"reservoir-pr-seq 0\n"), None);
        assert_eq!(parse(b"junk\n"), None);
        assert_eq!(parse(b""), None);
        // Two acknowledgements (one with an id, one without), one timeout.
        let mut r = 2u32.to_le_bytes().to_vec();
        r.extend([0u8; 16]);
        r.extend(2u32.to_le_bytes());
        r.extend(b"42");
        r.extend([0u8; 16]);
        r.extend(0u32.to_le_bytes());
        r.extend(1u32.to_le_bytes());
        r.extend([0u8; 16]);
        assert_eq!(acked(&r), Some(vec![42]));
        assert_eq!(acked(&r[..10]), None);
        let p = b"reservoir pr 5 9 3\nabcua x";
        assert_eq!(parse_event(p), Some((5, 9, &b"abc"[..], &b"ua x"[..])));
        assert_eq!(parse_event(b"reservoir pr 5 9 30\nabc"), None);
        assert_eq!(parse_event(b"reservoir lun-reset 5"), None);
    }
}
