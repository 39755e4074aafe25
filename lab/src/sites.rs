//! Data Reservoir's sites, shared by R2 and DR: on each side of the emulated link, N disk
//! servers (hosts 2..N+1 of the side) each exporting one member, and a file server (host 1)
//! whose LUN 0 stripes over them (1 MiB units), every target with its `rsv sync` agent on
//! the control port and the run's key. A site can be SIGKILLed whole and started again on
//! the same data (DR's failovers).

use crate::peers::{rsv_target, rsv_target_spawn, target_ready, ISCSI_PORT};
use crate::proc::{self, Host, Proc};
use anyhow::Result;
use std::path::{Path, PathBuf};

pub const IQN: &str = "iqn.2026-11.org.reservoir:dr";
pub const CONTROL_PORT: u16 = 3262;

/// A fresh control key (random, owner-readable only) in `dir`.
pub fn control_key(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let key = dir.join("control.key");
    let mut secret = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut secret)?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&key, hex)?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    Ok(key)
}

/// A target's configuration: its portal and agent on `addr`, the LUNs `stores` (ids 0..),
/// each with the TOML lines `lun_options` (e.g. `track = true`).
pub fn target_toml(
    addr: std::net::Ipv4Addr,
    key: &Path,
    stores: &[String],
    lun_options: &str,
) -> String {
    let mut t = format!(
        "portals = [\"{addr}:{ISCSI_PORT}\"]\n[control]\nlisten = \"{addr}:{CONTROL_PORT}\"\n\
         key_file = \"{}\"\n[session]\nmax_connections = 16\n[[target]]\niqn = \"{IQN}\"\n",
        key.display()
    );
    for (i, m) in stores.iter().enumerate() {
        t += &format!("[[target.lun]]\nid = {i}\nstore = \"{m}\"\n{lun_options}");
    }
    t
}

/// What a site's disk servers hold.
pub struct Layout<'a> {
    /// Bytes of each disk server's member.
    pub member: u64,
    /// A second LUN of this size on the first disk server (R2's one-stream row).
    pub one: Option<u64>,
    /// Random data in the members (else sparse zeros).
    pub fill: bool,
    /// TOML lines added to every disk server's LUNs (not the file server's stripe).
    pub disk_lun_options: &'a str,
}

/// How to start one of a site's targets again: its namespace, address, configuration, tag.
struct Recipe {
    ns: String,
    addr: std::net::Ipv4Addr,
    config: String,
    tag: String,
    /// Times started: each start after the first keeps the log of the one before.
    starts: usize,
}

/// A site's targets, stopped (SIGTERM) when it goes.
pub struct Site {
    dir: PathBuf,
    disks: Vec<(Recipe, Option<Proc>)>,
    file_server: (Recipe, Option<Proc>),
}

impl Site {
    /// Starts the disk servers on `hosts[1..]` and the file server on `hosts[0]`, their data
    /// under `dir` (`TAG-diskI/`).
    pub fn start(hosts: &[Host], tag: &str, key: &Path, dir: &Path, l: &Layout) -> Result<Site> {
        let n = hosts.len() - 1;
        let mut disks = Vec::new();
        for (i, h) in hosts[1..].iter().enumerate() {
            let data = dir.join(format!("{tag}-disk{i}"));
            std::fs::create_dir_all(&data)?;
            let img = data.join("member.img");
            let mut stores = vec![format!("file:{}", img.display())];
            let mut files = vec![(img, l.member)];
            if let (0, Some(one)) = (i, l.one) {
                let one_img = data.join("one.img");
                stores.push(format!("file:{}", one_img.display()));
                files.push((one_img, one));
            }
            for (path, len) in files {
                if l.fill {
                    proc::random_file(&path, len)?;
                } else {
                    std::fs::File::create(&path)?.set_len(len)?;
                }
            }
            let recipe = Recipe {
                ns: h.ns.clone(),
                addr: h.addr,
                config: target_toml(h.addr, key, &stores, l.disk_lun_options),
                tag: format!("{tag}-disk{i}"),
                starts: 0,
            };
            disks.push((recipe, None));
        }
        let members: Vec<String> = hosts[1..]
            .iter()
            .map(|h| format!("iscsi://{}:{ISCSI_PORT}/{IQN}/0", h.addr))
            .collect();
        let fs = &hosts[0];
        let file_server = Recipe {
            ns: fs.ns.clone(),
            addr: fs.addr,
            config: target_toml(
                fs.addr,
                key,
                &[format!("stripe:?unit=1M&members=[{}]", members.join(","))],
                "",
            ),
            tag: format!("{tag}-fs"),
            starts: 0,
        };
        let mut site = Site {
            dir: dir.to_owned(),
            disks,
            file_server: (file_server, None),
        };
        site.restart()?;
        eprintln!(
            "lab: site {tag}: file server {} over {n} disk servers",
            fs.addr
        );
        Ok(site)
    }

    /// Starts every target that is not running, disk servers first (the file server opens
    /// its members as it starts), on the data they left. The disk servers start together
    /// (a failover's restart waits for the slowest, not for their sum).
    pub fn restart(&mut self) -> Result<()> {
        let dir = self.dir.clone();
        for (r, p) in self.disks.iter_mut() {
            if p.is_none() {
                if r.starts > 0 {
                    // The start truncates its log: the killed run's goes aside first.
                    let log = dir.join(format!("target-{}.log", r.tag));
                    let _ = std::fs::rename(
                        &log,
                        dir.join(format!("target-{}.log.{}", r.tag, r.starts)),
                    );
                }
                r.starts += 1;
                *p = Some(rsv_target_spawn(
                    &r.ns, r.addr, ISCSI_PORT, &r.config, &dir, &r.tag,
                )?);
            }
        }
        for (_, p) in self.disks.iter_mut() {
            if let Some(p) = p {
                target_ready(p)?;
            }
        }
        let (r, p) = &mut self.file_server;
        if p.is_none() {
            *p = Some(rsv_target(&r.ns, r.addr, &r.config, &dir, &r.tag)?);
        }
        Ok(())
    }

    /// SIGKILL to every target of the site at once: the site is lost as it stands.
    pub fn kill(&mut self) {
        for (_, p) in self
            .disks
            .iter_mut()
            .chain(std::iter::once(&mut self.file_server))
        {
            if let Some(mut p) = p.take() {
                p.sigkill();
            }
        }
    }
}
