//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS: within one logical unit, between logical
//! units a nexus reaches, refused lists, and a copy target masked or sanitized while a copy
//! runs.

mod support;

use std::sync::Arc;

use scsi::{Command, Designator, LogicalUnit, LuConfig, Reach, Response};

use support::*;

/// The NAA designator of a logical unit, from VPD page 83h.
fn naa_of(lu: &LogicalUnit) -> Vec<u8> {
    let v = good(&exec(lu, &[0x12, 1, 0x83, 1, 0, 0], &[])).to_vec();
    let mut i = 4;
    while i + 4 <= v.len() {
        let len = v[i + 3] as usize;
        if v[i + 1] & 0x0f == 3 {
            return v[i + 4..i + 4 + len].to_vec();
        }
        i += 4 + len;
    }
    panic!("no NAA designator");
}

fn cscd(naa: &[u8], block_size: u32) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xe4;
    d[4] = 0x01;
    d[5] = 0x03;
    d[7] = naa.len() as u8;
    d[8..8 + naa.len()].copy_from_slice(naa);
    d[29..32].copy_from_slice(&block_size.to_be_bytes()[1..]);
    d
}

fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut d = vec![0u8; 28];
    d[0] = 0x02;
    d[3] = 24;
    d[4..6].copy_from_slice(&src.to_be_bytes());
    d[6..8].copy_from_slice(&dst.to_be_bytes());
    d[10..12].copy_from_slice(&blocks.to_be_bytes());
    d[12..20].copy_from_slice(&src_lba.to_be_bytes());
    d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    d
}

fn copy_list(list_id: u8, usage: u8, cscds: &[Vec<u8>], segments: &[Vec<u8>]) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[1] = usage << 3;
    let cl: usize = cscds.iter().map(Vec::len).sum();
    let sl: usize = segments.iter().map(Vec::len).sum();
    p[2..4].copy_from_slice(&(cl as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(sl as u32).to_be_bytes());
    cscds.iter().chain(segments).for_each(|d| p.extend(d));
    p
}

fn xcopy_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn xcopy(lu: &LogicalUnit, p: &[u8]) -> Response {
    exec(lu, &xcopy_cdb(p.len()), p)
}

/// EXTENDED COPY from a nexus that reaches the logical units `reach` finds.
fn xcopy_via(lu: &LogicalUnit, reach: &dyn Reach, p: &[u8]) -> Response {
    lu.execute_abortable(
        &Command {
            cdb: &xcopy_cdb(p.len()),
            data_out: p,
            nexus: N,
        },
        reach,
        &|| false,
    )
}

fn receive_copy_results(sa: u8, list_id: u8) -> Vec<u8> {
    let mut c = vec![0u8; 16];
    c[0] = 0x84;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

#[test]
fn extended_copy_within_one_logical_unit() {
    let lu = lu();
    let me = cscd(&naa_of(&lu), 512);
    let data: Vec<u8> = (0..8 * BS).map(|i| (i / 7) as u8).collect();
    good(&exec(&lu, &write10(10, 8), &data));
    let p = copy_list(
        1,
        0,
        std::slice::from_ref(&me),
        &[segment(0, 0, 8, 10, 1000)],
    );
    assert_eq!(
        LogicalUnit::data_out_len(&xcopy_cdb(p.len()), 512),
        Some(p.len() as u32)
    );
    good(&xcopy(&lu, &p));
    assert_eq!(good(&exec(&lu, &read10(1000, 8), &[])), &data[..]);

    // Status held for list 1, reported once.
    let st = good(&exec(&lu, &receive_copy_results(0, 1), &[])).to_vec();
    assert_eq!(st.len(), 12);
    assert_eq!((st[4], u16::from_be_bytes([st[5], st[6]])), (1, 1));
    assert_eq!(u32::from_be_bytes([st[8], st[9], st[10], st[11]]), 8 * 512);
    assert_invalid_cdb(&exec(&lu, &receive_copy_results(0, 1), &[]), 2);
    // LIST ID USAGE 11b: nothing kept.
    good(&xcopy(
        &lu,
        &copy_list(2, 3, std::slice::from_ref(&me), &[segment(0, 0, 1, 0, 1)]),
    ));
    assert_invalid_cdb(&exec(&lu, &receive_copy_results(0, 2), &[]), 2);

    // Overlapping ranges, destination above the source: copied as if read first.
    let src: Vec<u8> = (0..4096 * BS).map(|i| (i % 251) as u8).collect();
    let lu2 = lu_with(LuConfig::default());
    let me2 = cscd(&naa_of(&lu2), 512);
    for (lba, chunk) in src.chunks(256 * BS).enumerate() {
        good(&exec(&lu2, &write10(256 * lba as u32, 256), chunk));
    }
    good(&xcopy(
        &lu2,
        &copy_list(4, 3, &[me2], &[segment(0, 0, 3000, 0, 1000)]),
    ));
    for (i, want) in src[..3000 * BS].chunks(256 * BS).enumerate() {
        let got = good(&exec(
            &lu2,
            &read10(1000 + 256 * i as u32, (want.len() / BS) as u16),
            &[],
        ))
        .to_vec();
        assert_eq!(got, want, "block {}", 1000 + 256 * i);
    }
    // An empty parameter list copies nothing.
    good(&exec(&lu, &xcopy_cdb(0), &[]));
}

#[derive(Debug)]
struct Peers(Vec<Arc<LogicalUnit>>);

impl Reach for Peers {
    fn find(&self, d: &Designator) -> Option<Arc<LogicalUnit>> {
        self.0.iter().find(|lu| lu.has_designator(d)).cloned()
    }

    fn admits(&self, _: &str, _: &LogicalUnit) -> bool {
        true
    }
}

fn peer_config(naa: u64) -> LuConfig {
    LuConfig {
        naa_id: naa,
        device_id: format!("lu-{naa:x}"),
        ..LuConfig::default()
    }
}

#[test]
fn extended_copy_between_logical_units() {
    let a = Arc::new(lu_with(peer_config(0x6000_0000_0000_00a1)));
    let b = Arc::new(lu_with(peer_config(0x6000_0000_0000_00b2)));
    let ro = Arc::new(lu_with(LuConfig {
        read_only: true,
        ..peer_config(0x6000_0000_0000_00c3)
    }));
    let (da, db, dro) = (naa_of(&a), naa_of(&b), naa_of(&ro));
    let peers = Peers(vec![a.clone(), b.clone(), ro.clone()]);
    let list = copy_list(
        1,
        3,
        &[cscd(&da, 512), cscd(&db, 512)],
        &[segment(0, 1, 4, 0, 100)],
    );
    // Without a way to the other logical units, b cannot be reached.
    assert_sense(&xcopy(&a, &list), 0x0a, 0x08, 0x04);
    let xcopy = |lu: &LogicalUnit, p: &[u8]| xcopy_via(lu, &peers, p);
    good(&exec(&a, &write10(0, 4), &fill(0x77, 4)));
    good(&xcopy(&a, &list));
    assert_eq!(good(&exec(&b, &read10(100, 4), &[])), &fill(0x77, 4)[..]);
    // Sent to b, copying b to a.
    let back = copy_list(
        1,
        3,
        &[cscd(&db, 512), cscd(&da, 512)],
        &[segment(0, 1, 4, 100, 50)],
    );
    good(&xcopy(&b, &back));
    assert_eq!(good(&exec(&a, &read10(50, 4), &[])), &fill(0x77, 4)[..]);
    // A write-protected destination aborts the copy, pointing at the segment.
    let to_ro = copy_list(
        1,
        3,
        &[cscd(&da, 512), cscd(&dro, 512)],
        &[segment(0, 1, 4, 0, 0)],
    );
    let r = xcopy(&a, &to_ro);
    assert_sense(&r, 0x0a, 0x00, 0x00);
    let s = r.sense.unwrap();
    assert_eq!((s[15], u16::from_be_bytes([s[16], s[17]])), (0x80, 16 + 64));
    // A wrong block length in the CSCD descriptor, an unknown designator.
    let wrong = copy_list(1, 3, &[cscd(&da, 4096)], &[segment(0, 0, 1, 0, 1)]);
    assert_sense(&xcopy(&a, &wrong), 0x0a, 0x0d, 0x03);
    let unknown = copy_list(1, 3, &[cscd(&[0x60; 16], 512)], &[segment(0, 0, 1, 0, 1)]);
    assert_sense(&xcopy(&a, &unknown), 0x0a, 0x08, 0x04);
}

#[test]
fn extended_copy_refuses_bad_lists() {
    let lu = lu();
    let me = cscd(&naa_of(&lu), 512);
    // A segment naming a CSCD that is not in the list, one beyond the end of the medium.
    let r = xcopy(
        &lu,
        &copy_list(1, 0, std::slice::from_ref(&me), &[segment(0, 1, 8, 0, 8)]),
    );
    assert_sense(&r, 0x0a, 0x0d, 0x02);
    let r = xcopy(
        &lu,
        &copy_list(
            1,
            0,
            std::slice::from_ref(&me),
            &[segment(0, 0, 8, 0, BLOCKS - 1)],
        ),
    );
    assert_sense(&r, 0x0a, 0x00, 0x00);
    // The failed copy's status is held: completed with errors.
    let st = good(&exec(&lu, &receive_copy_results(0, 1), &[])).to_vec();
    assert_eq!((st[4], st[6]), (2, 0));
    // Truncated lists, too many descriptors, unsupported types.
    let p = copy_list(1, 0, std::slice::from_ref(&me), &[segment(0, 0, 8, 0, 8)]);
    for cut in [47, 75, 10] {
        assert_sense(&exec(&lu, &xcopy_cdb(cut), &p[..cut]), 0x05, 0x1a, 0x00);
    }
    let many = copy_list(1, 0, &vec![me.clone(); 9], &[segment(0, 0, 1, 0, 8)]);
    assert_sense(&xcopy(&lu, &many), 0x05, 0x26, 0x06);
    let many = copy_list(
        1,
        0,
        std::slice::from_ref(&me),
        &vec![segment(0, 0, 1, 0, 8); 65],
    );
    assert_sense(&xcopy(&lu, &many), 0x05, 0x26, 0x08);
    let mut fc = me.clone();
    fc[0] = 0xe0;
    assert_sense(
        &xcopy(&lu, &copy_list(1, 0, &[fc], &[segment(0, 0, 1, 0, 8)])),
        0x05,
        0x26,
        0x07,
    );
    let mut stream = segment(0, 0, 1, 0, 8);
    stream[0] = 0x03;
    assert_sense(
        &xcopy(&lu, &copy_list(1, 0, std::slice::from_ref(&me), &[stream])),
        0x05,
        0x26,
        0x09,
    );
    // Less data than the CDB announces; LID4 is not offered.
    assert_sense(&exec(&lu, &xcopy_cdb(76), &p[..60]), 0x05, 0x0e, 0x03);
    let mut lid4 = xcopy_cdb(p.len());
    lid4[1] = 0x01;
    assert_invalid_cdb(&exec(&lu, &lid4, &p), 1);
    // Random parameter lists never panic.
    let mut seed = 0x1234_5678u64;
    for _ in 0..2000 {
        let mut q = p.clone();
        for _ in 0..4 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (seed >> 33) as usize % q.len();
            q[i] = (seed >> 20) as u8;
        }
        let r = xcopy(&lu, &q);
        assert!(r.status == 0 || r.status == 2);
    }
}

#[test]
fn receive_copy_results_operating_parameters() {
    let lu = lu();
    let d = good(&exec(&lu, &receive_copy_results(3, 0), &[])).to_vec();
    let available = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    assert_eq!(available, d.len() - 4);
    assert!(d.len() >= 44);
    let max_cscd = u16::from_be_bytes([d[8], d[9]]) as usize;
    let max_seg = u16::from_be_bytes([d[10], d[11]]) as usize;
    let max_list = u32::from_be_bytes([d[12], d[13], d[14], d[15]]) as usize;
    // One more descriptor of either kind still fits the list length, so that too many
    // descriptors are told apart from too long a list.
    assert!((max_cscd + 1) * 32 + 28 <= max_list);
    assert!(32 + (max_seg + 1) * 28 <= max_list);
    assert_eq!(&d[44..44 + d[43] as usize], &[0x02, 0xe4]);
    // Other service actions are not offered; the 3PC bit says a copy manager is here.
    assert_invalid_cdb(&exec(&lu, &receive_copy_results(1, 0), &[]), 1);
    let inq = good(&exec(&lu, &[0x12, 0, 0, 0, 96, 0], &[])).to_vec();
    assert_eq!(inq[5] & 0x08, 0x08);
}

/// Copy targets as a nexus's view gives them, masked after `left` lookups: a
/// configuration reload that hides a LU while a copy to or from it runs.
#[derive(Debug)]
struct MaskedAfter {
    peers: Vec<Arc<LogicalUnit>>,
    left: std::sync::atomic::AtomicUsize,
}

impl Reach for MaskedAfter {
    fn find(&self, d: &Designator) -> Option<Arc<LogicalUnit>> {
        use std::sync::atomic::Ordering;
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()?;
        self.peers.iter().find(|lu| lu.has_designator(d)).cloned()
    }

    fn admits(&self, _: &str, _: &LogicalUnit) -> bool {
        true
    }
}

#[test]
fn a_copy_target_masked_while_copying_stops_the_copy() {
    let a = Arc::new(lu_with(peer_config(0x6000_0000_0000_00a1)));
    let b = Arc::new(lu_with(peer_config(0x6000_0000_0000_00b2)));
    // The whole LU, 2 MiB: two pieces of 1 MiB, the view asked before each.
    let blocks = BLOCKS as u16;
    let list = copy_list(
        1,
        0,
        &[cscd(&naa_of(&a), 512), cscd(&naa_of(&b), 512)],
        &[segment(0, 1, blocks, 0, 0)],
    );
    let reach = MaskedAfter {
        peers: vec![b.clone()],
        left: 2.into(),
    };
    // Found once to start, reached for the first piece, masked before the second.
    let r = xcopy_via(&a, &reach, &list);
    assert_sense(&r, 0x0a, 0x0d, 0x02);
    let st = good(&exec(&a, &receive_copy_results(0, 1), &[])).to_vec();
    assert_eq!(st[4], 2, "the copy ended with errors");
    // The same copy with the view unchanged completes.
    let reach = MaskedAfter {
        peers: vec![b.clone()],
        left: usize::MAX.into(),
    };
    good(&xcopy_via(&a, &reach, &list));
}

#[test]
fn a_copy_target_being_sanitized_is_not_reachable() {
    let a = Arc::new(lu_with(peer_config(0x6000_0000_0000_00a1)));
    let (b, started, go) = gated_lu(peer_config(0x6000_0000_0000_00b2));
    assert_sense(&exec(&b, &[0, 0, 0, 0, 0, 0], &[]), 0x06, 0x29, 0x00);
    let peers = Peers(vec![a.clone(), b.clone()]);
    let xcopy = |lu: &LogicalUnit, p: &[u8]| xcopy_via(lu, &peers, p);
    let list = copy_list(
        1,
        3,
        &[cscd(&naa_of(&a), 512), cscd(&naa_of(&b), 512)],
        &[segment(0, 1, 4, 0, 100)],
    );
    let erase = {
        let b = b.clone();
        std::thread::spawn(move || exec(&b, &[0x48, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]))
    };
    started.recv().unwrap();
    assert_sense(&xcopy(&a, &list), 0x0a, 0x0d, 0x02);
    go.send(()).unwrap();
    good(&erase.join().unwrap());
    good(&xcopy(&a, &list));
}
