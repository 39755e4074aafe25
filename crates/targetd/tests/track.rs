//! Change tracking seen from the wire: a file LUN with `track = true` in a target started in
//! this process, written over iSCSI by the initiator's `Lun`, marks the units the writes,
//! UNMAP and WRITE SAME touched, and only those; a freeze between writes splits them into
//! the frozen and the current set; the map survives the target's restart.

use bytes::Bytes;
use initiator::{Lun, SessionOptions};
use testkit::inproc;

const IQN: &str = "iqn.2026-11.org.reservoir:track";
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

async fn start(dir: &std::path::Path) -> targetd::Running {
    let lun = "store = \"file:lun0.img?size=16MiB\"\ntrack = true\ntrack_unit = \"256KiB\"";
    inproc::spawn(&inproc::one_lun(&format!("data_dir = {dir:?}"), IQN, lun)).await
}

fn dirty(map: &backstore::ChangeMap) -> Vec<u64> {
    (0..map.units()).filter(|&u| map.is_dirty(u)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_over_iscsi_mark_their_units() {
    let dir = tempfile::tempdir().unwrap();
    let target = start(dir.path()).await;
    let map = target.lun_store(IQN, 0).unwrap().changes.unwrap();
    assert_eq!(map.path(), dir.path().join("lun0.img.changes"));
    assert_eq!((map.unit(), map.units()), (256 * KIB, 64));
    // A map with no history: the first sync sends everything; then it is clean.
    let first = map.freeze().unwrap();
    assert_eq!(first.dirty_bytes(), 16 * MIB);
    map.release(first.id()).unwrap();
    assert_eq!(map.dirty_bytes(), 0);

    let lun = Lun::open_url(&inproc::url(&target, IQN, 0), &SessionOptions::default())
        .await
        .unwrap();
    // Unaligned, across a unit boundary: units 0 and 1.
    lun.write_at(256 * KIB - 100, Bytes::from(vec![1u8; 300]))
        .await
        .unwrap();
    // Two whole units, 4 and 5, in one command.
    lun.write_at(MIB, Bytes::from(vec![2u8; 512 * KIB as usize]))
        .await
        .unwrap();
    let frozen = map.freeze().unwrap();
    assert_eq!(frozen.units(), [0..2, 4..6]);
    // After the freeze: the current set.
    lun.unmap(4 * MIB, 256 * KIB).await.unwrap(); // unit 16
    lun.write_zeroes(8 * MIB + 512, 512).await.unwrap(); // unit 32
    lun.write_fua(16 * MIB - 512, Bytes::from(vec![3u8; 512]))
        .await
        .unwrap(); // unit 63
    assert_eq!(dirty(&map), [0, 1, 4, 5, 16, 32, 63]);
    map.release(frozen.id()).unwrap();
    assert_eq!(dirty(&map), [16, 32, 63]);
    // Reads mark nothing.
    lun.read_at(0, 2 * MIB as usize).await.unwrap();
    assert_eq!(dirty(&map), [16, 32, 63]);
    let _ = lun.session().logout().await;
    drop(map);
    target.stop().await.unwrap();

    let target = start(dir.path()).await;
    let map = target.lun_store(IQN, 0).unwrap().changes.unwrap();
    assert_eq!(map.recovery(), None);
    assert_eq!(dirty(&map), [16, 32, 63]);
    target.stop().await.unwrap();
}
