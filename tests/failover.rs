//! Failover and failback end to end (`rsv sync promote|demote|resync`): two sites, each an
//! `rsv target` process with its agent on its own loopback address, a file LUN with
//! change tracking on each. A is synced to B, written more, killed; B is promoted and
//! written; A comes back, is demoted and resynced from B with only the units that differ;
//! then both are promoted and a sync between them is refused.

use std::path::Path;

use bytes::Bytes;
use testkit::site::{key_file, Host, Hosts};

const IQN: &str = "iqn.2026-11.org.reservoir:dr";
const SIZE: u64 = 16 << 20;
const UNIT: u64 = 64 << 10;

/// A site: an `rsv target` at `addr` whose configuration and data outlive it under `root`
/// (it can be killed and started again on the same data), one file LUN with change
/// tracking.
fn site(hosts: &Hosts, root: &Path, addr: &str) -> Host {
    hosts.host(
        Some(&root.join(addr)),
        addr,
        &format!(
            "[[target.lun]]\nid = 0\nstore = \"file:disk.img?size={SIZE}\"\ntrack = true\n\
             track_unit = \"64KiB\"\n"
        ),
    )
}

/// The LUN's bytes, read from its file (the target writes it in place).
fn image(site: &Host) -> Vec<u8> {
    std::fs::read(site.dir.join("disk.img")).unwrap()
}

/// Writes `data` at `offset` as an application does (the initiator's own name, not a
/// replica's writer); the SCSI error, if refused.
fn app_write(url: &str, offset: u64, data: Vec<u8>) -> Result<(), initiator::Error> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = initiator::IscsiUrl::parse(url).unwrap();
        let lun = initiator::Lun::open_url(&url, &initiator::SessionOptions::default())
            .await
            .unwrap();
        let r = lun.write_at(offset, Bytes::from(data)).await;
        let _ = lun.flush().await;
        let _ = lun.session().logout().await;
        r
    })
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write_protected(e: &initiator::Error) -> bool {
    matches!(e, initiator::Error::Scsi { sense: Some(s), .. } if s.key == 0x07 && s.asc == 0x27)
}

/// `rsv sync ARGS --key-file KEY`: exit status, stdout, stderr.
fn sync(hosts: &Hosts, args: &[&str]) -> (bool, String, String) {
    let out = hosts.sync(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status(hosts: &Hosts, site: &Host) -> serde_json::Value {
    let out = hosts.sync_ok(&["status", &site.volume(0), "--json"]);
    serde_json::from_str(out.trim()).unwrap()
}

/// Units of `UNIT` bytes in which `a` and `b` differ, and their bytes.
fn differing(a: &[u8], b: &[u8]) -> (u64, u64) {
    let units = a
        .chunks(UNIT as usize)
        .zip(b.chunks(UNIT as usize))
        .filter(|(x, y)| x != y)
        .count() as u64;
    (units, units * UNIT)
}

#[test]
fn failover_then_failback_sends_only_what_differs() {
    let root = tempfile::tempdir().unwrap();
    let key = key_file(
        &root.path().join("control.key"),
        "failover test key 0123456789abcdef",
    );
    let hosts = Hosts::new(IQN, testkit::free_port(), &key);
    let mut a = site(&hosts, root.path(), "127.0.0.71");
    let b = site(&hosts, root.path(), "127.0.0.72");

    // A is the primary: written, synced to B.
    app_write(&a.url(0), 0, noise(4 << 20, 1)).unwrap();
    hosts.sync_ok(&[&a.volume(0), &b.volume(0), "--json"]);
    let (sa, sb) = (status(&hosts, &a), status(&hosts, &b));
    assert_eq!(
        (sa["role"].as_str(), sa["epoch"].as_u64()),
        (Some("primary"), Some(1))
    );
    assert_eq!(
        (sb["role"].as_str(), sb["epoch"].as_u64()),
        (Some("replica"), Some(1))
    );
    assert_eq!(sa["image"], sb["image"], "both hold the sync's image");
    assert!(sa["image"].is_string());
    // A replica is read-only to applications.
    let e = app_write(&b.url(0), 0, vec![1; 4096]).unwrap_err();
    assert!(
        write_protected(&e),
        "an application write to the replica: {e:?}"
    );
    assert_eq!(image(&a), image(&b));

    // A is written more; these never reach B. Then site A is lost.
    app_write(&a.url(0), 8 << 20, noise(1 << 20, 2)).unwrap();
    app_write(&a.url(0), 14 << 20, noise(100 << 10, 3)).unwrap();
    a.kill();

    // B takes over at a new epoch and is written: over part of A's lost writes, and
    // elsewhere.
    let p = hosts.sync_ok(&["promote", &b.volume(0), "--json"]);
    let p: serde_json::Value = serde_json::from_str(p.trim()).unwrap();
    assert_eq!(
        (p["role"].as_str(), p["epoch"].as_u64()),
        (Some("primary"), Some(2))
    );
    app_write(&b.url(0), (8 << 20) + (512 << 10), noise(1 << 20, 4)).unwrap();
    app_write(&b.url(0), 2 << 20, noise(256 << 10, 5)).unwrap();

    // A comes back (primary at epoch 1 as it knows), is demoted, and resynced from B.
    a.restart();
    let d = hosts.sync_ok(&["demote", &a.volume(0), "--json"]);
    let d: serde_json::Value = serde_json::from_str(d.trim()).unwrap();
    assert_eq!(
        (d["role"].as_str(), d["epoch"].as_u64()),
        (Some("replica"), Some(1))
    );
    let (units, differ) = differing(&image(&a), &image(&b));
    assert!(units > 0);
    let out = hosts.sync_ok(&["resync", &b.volume(0), &a.volume(0), "--json"]);
    let done: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "done")
        .expect("a done line");
    let sent = done["data_bytes"].as_u64().unwrap() + done["zero_bytes"].as_u64().unwrap();
    println!(
        "resync: {units} unit(s) of {UNIT} bytes differed ({differ} bytes); sent {sent} bytes ({} as data), {:.3}x",
        done["data_bytes"],
        sent as f64 / differ as f64
    );
    assert!(
        image(&a) == image(&b),
        "A equals B byte for byte after the resync"
    );
    assert!(
        sent >= differ,
        "sent {sent} bytes, less than the {differ} that differ"
    );
    assert!(
        sent * 10 <= differ * 11,
        "sent {sent} bytes for {differ} that differ: more than 1.1x"
    );
    // A is B's replica now, at B's epoch, read-only to applications.
    let sa = status(&hosts, &a);
    assert_eq!(
        (sa["role"].as_str(), sa["epoch"].as_u64()),
        (Some("replica"), Some(2))
    );
    assert_eq!(sa["image"], status(&hosts, &b)["image"]);
    let e = app_write(&a.url(0), 0, vec![1; 4096]).unwrap_err();
    assert!(
        write_protected(&e),
        "an application write to the demoted A: {e:?}"
    );

    // Two primaries: both promoted; a sync either way is refused before any data moves,
    // naming the stale site and what to run.
    hosts.sync_ok(&["promote", &a.volume(0)]);
    app_write(&b.url(0), 0, noise(64 << 10, 6)).unwrap();
    let before = image(&a);
    for (src, dst) in [(&b, &a), (&a, &b)] {
        let (ok, out, err) = sync(&hosts, &[&src.volume(0), &dst.volume(0)]);
        assert!(!ok, "a sync between two primaries ran:\n{out}");
        assert!(err.contains("two primaries"), "{err}");
        assert!(
            err.contains(&format!("{} is stale", b.volume(0))),
            "B (epoch 2) is stale beside A (epoch 3): {err}"
        );
        assert!(
            err.contains(&format!("rsv sync demote {}", b.volume(0))),
            "{err}"
        );
    }
    assert!(image(&a) == before, "a refused sync wrote A");
}
