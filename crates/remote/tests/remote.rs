//! A Reservoir target whose LUNs live on other targets: a remote LUN alone, and a stripe
//! over remote LUNs (Data Reservoir's file server over its disk servers), all in this
//! process. Data written through the file server lands on the disk servers at the offsets
//! the layout says; a disk server that stops fails the commands that need it with CHECK
//! CONDITION, and once it is back the volume works again without a restart.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use initiator::{Error, IscsiUrl, Lun, SessionOptions};
use targetd::Running;

const DISK: &str = "iqn.2026-11.org.reservoir:disk";
const FILE_SERVER: &str = "iqn.2026-11.org.reservoir:volume";

/// A target on `listen` (port 0: any) with the given LUN lines.
async fn target(listen: &str, iqn: &str, luns: &str, data: &Path) -> (SocketAddr, Running) {
    let toml = format!(
        "portals = [\"{listen}\"]\ndata_dir = \"{}\"\n[[target]]\niqn = \"{iqn}\"\n{luns}",
        data.display()
    );
    let config = targetd::Config::parse(&toml, "test").unwrap();
    let mut stores = backstore::Registry::with_builtins();
    remote::register(&mut stores);
    let server = targetd::Server::bind(config, &stores).await.unwrap();
    let addr = server.portals()[0];
    (addr, server.spawn(Duration::from_millis(200)))
}

fn disk_lun(size: &str) -> String {
    format!("[[target.lun]]\nid = 0\nstore = \"file:disk.img?size={size}\"\n")
}

async fn open(url: &str) -> Lun {
    let opts = SessionOptions {
        auto_tune: false,
        recovery_timeout: Duration::from_secs(2),
        ..SessionOptions::default()
    };
    Lun::open_url(&IscsiUrl::parse(url).unwrap(), &opts)
        .await
        .unwrap()
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect::<Vec<_>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_over_remote_luns_reads_and_writes_through_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut disks = Vec::new();
    for i in 0..3 {
        let d = dir.path().join(format!("disk{i}"));
        std::fs::create_dir_all(&d).unwrap();
        disks.push(target("127.0.0.1:0", DISK, &disk_lun("8MiB"), &d).await);
    }
    let members: Vec<String> = disks
        .iter()
        .map(|(a, _)| format!("iscsi://{a}/{DISK}/0?connections=2"))
        .collect();
    let luns = format!(
        "[[target.lun]]\nid = 0\nstore = \"stripe:?unit=64K&members=[{}]\"\n\
         [[target.lun]]\nid = 1\nstore = \"{}\"\n",
        members.join(","),
        members[0]
    );
    let fs_dir = dir.path().join("fs");
    std::fs::create_dir_all(&fs_dir).unwrap();
    let (fs, file_server) = target("127.0.0.1:0", FILE_SERVER, &luns, &fs_dir).await;

    let volume = open(&format!("iscsi://{fs}/{FILE_SERVER}/0")).await;
    assert_eq!(volume.size(), (3 * 8) << 20);
    let data = pattern(1 << 20, 5);
    // Unaligned to the stripe unit, so it spans all three disk servers.
    volume.write_at(3 << 16 | 4096, data.clone()).await.unwrap();
    volume.flush().await.unwrap();
    assert_eq!(volume.read_at(3 << 16 | 4096, 1 << 20).await.unwrap(), data);

    // Logical unit 3 is disk 0's second unit: its first bytes are the write's first.
    let disk0 = open(&format!("iscsi://{}/{DISK}/0", disks[0].0)).await;
    let on_disk = disk0.read_at(64 << 10 | 4096, 4096).await.unwrap();
    assert_eq!(on_disk, data.slice(..4096));

    // The remote LUN alone is the disk itself.
    let direct = open(&format!("iscsi://{fs}/{FILE_SERVER}/1")).await;
    assert_eq!(direct.size(), 8 << 20);
    assert_eq!(
        direct.read_at(64 << 10 | 4096, 4096).await.unwrap(),
        data.slice(..4096)
    );

    // The file server first: its last flush reaches the disk servers.
    file_server.stop().await.unwrap();
    for (_, d) in disks {
        d.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_server_that_stops_fails_its_commands_and_comes_back_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let disk_dir = dir.path().join("disk");
    std::fs::create_dir_all(&disk_dir).unwrap();
    let (disk, disk_server) = target("127.0.0.1:0", DISK, &disk_lun("8MiB"), &disk_dir).await;
    let member = format!("iscsi://{disk}/{DISK}/0?recovery_timeout=1&command_timeout=2");
    let luns = format!("[[target.lun]]\nid = 0\nstore = \"{member}\"\n");
    let fs_dir = dir.path().join("fs");
    std::fs::create_dir_all(&fs_dir).unwrap();
    let (fs, file_server) = target("127.0.0.1:0", FILE_SERVER, &luns, &fs_dir).await;
    let volume = open(&format!("iscsi://{fs}/{FILE_SERVER}/0")).await;
    let data = pattern(256 << 10, 9);
    volume.write_at(0, data.clone()).await.unwrap();

    disk_server.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    match volume.read_at(0, 256 << 10).await {
        Err(Error::Scsi { status, .. }) => assert_eq!(status, 2, "CHECK CONDITION"),
        other => panic!("a read from a stopped disk server gave {other:?}"),
    }

    // The disk server back on its port, its file as it was.
    let (again, disk_again) = target(&disk.to_string(), DISK, &disk_lun("8MiB"), &disk_dir).await;
    assert_eq!(again, disk);
    let mut back = None;
    for _ in 0..20 {
        match volume.read_at(0, 256 << 10).await {
            Ok(b) => {
                back = Some(b);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    assert_eq!(back.expect("the volume never came back"), data);
    file_server.stop().await.unwrap();
    disk_again.stop().await.unwrap();
}
