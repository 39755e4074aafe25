//! Reservoir's target in this process (`targetd::Server`), on a loopback port the system
//! chooses or reached through the in-memory carrier, and what a test does to a session of
//! the real initiator against it.

use std::time::Duration;

use targetd::Config;

/// The configuration of one target `iqn` whose LUN 0 is described by `lun` (TOML keys of
/// a `[[target.lun]]`, e.g. `backstore = "ram"` and `size = "16MiB"`), with `head` (global
/// keys and tables such as `[session]`) before it.
pub fn one_lun(head: &str, iqn: &str, lun: &str) -> String {
    format!("{head}\n[[target]]\niqn = \"{iqn}\"\n[[target.lun]]\nid = 0\n{lun}\n")
}

/// `lun` for [`one_lun`]: a RAM store of `size` (as the configuration spells sizes).
pub fn ram(size: &str) -> String {
    format!("backstore = \"ram\"\nsize = \"{size}\"")
}

/// `toml` with its portals replaced by one on 127.0.0.1, port chosen, parsed.
pub fn config(toml: &str) -> Config {
    Config::parse(&format!("portals = [\"127.0.0.1:0\"]\n{toml}"), "test").unwrap()
}

/// A target of this configuration (portals: see [`config`]) running in this runtime until
/// the handle is stopped or dropped.
pub async fn spawn(toml: &str) -> targetd::Running {
    targetd::Server::bind(config(toml), &backstore::Registry::with_builtins())
        .await
        .unwrap()
        .spawn(Duration::from_secs(1))
}

/// A target of this configuration on a runtime of its own, in a thread of its own, for a
/// test that is not async; it runs until the test process ends. Its first portal.
pub fn spawn_thread(toml: &str) -> std::net::SocketAddr {
    let config = config(toml);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let server = targetd::Server::bind(config, &backstore::Registry::with_builtins())
                .await
                .unwrap();
            tx.send(server.portals()[0]).unwrap();
            server
                .run(std::future::pending(), Duration::from_secs(1))
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}

/// The URL of `iqn`'s LUN `lun` on the target's first portal.
pub fn url(target: &targetd::Running, iqn: &str, lun: u16) -> initiator::IscsiUrl {
    initiator::IscsiUrl::parse(&format!("iscsi://{}/{iqn}/{lun}", target.portals()[0])).unwrap()
}

/// Runs `depth` reads of 1 MiB at a time (within the first 8 MiB of `lun`) on `s` until
/// `done` says so (checked every 100 ms) or `limit` passes; true if `done` did.
pub async fn busy_until(
    s: &initiator::Session,
    lun: u16,
    depth: usize,
    limit: Duration,
    done: impl Fn(&initiator::Session) -> bool,
) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..depth {
        let (s, stop) = (s.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let data = s.read(lun, (i as u64 % 8) * 2048, 2048).await.unwrap();
                assert_eq!(data.len(), 1 << 20);
            }
        }));
    }
    let end = std::time::Instant::now() + limit;
    let mut ok = false;
    while std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if done(s) {
            ok = true;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    ok
}
