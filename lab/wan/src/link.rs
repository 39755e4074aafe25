//! A link's configuration, its namespaces and addresses, and bringing it up and down.
//!
//! Addressing: each link owns one 10.P.Q.0/24, P.Q chosen from a hash of its name (then the
//! next free one). Site A is 10.P.Q.0/25 with its gateway (the namespace holding the TUN
//! device) at .1 and extra hosts at .2, .3, ...; site B is 10.P.Q.128/25 with .129, .130, ...
//! Extra hosts hang off a bridge `br0` in their site's gateway namespace through veth pairs,
//! and the gateway routes between the bridge and the TUN device `wan0`.

use crate::control::{self, Request};
use crate::model::{default_queue_bytes, DirParams, LossModel};
use crate::sys;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const STATE_DIR: &str = "/run/reservoir-wan";
/// The TUN device in each site's gateway namespace.
pub const TUN_NAME: &str = "wan0";
/// Packets the kernel queues on a TUN device for the relay to read. Not part of the
/// emulated path: it only has to cover the time the relay waits for a core. The kernel's
/// 1000 is 15 ms at 800 Mbit/s, and on two busy cores the relay waited longer: the R2
/// lab lost 33,782 packets there in one row (seen as `tx dropped` on wan0), none in
/// the emulated queue.
pub const TUN_QUEUE_PACKETS: u32 = 20_000;
pub const MAX_HOSTS: u32 = 100;

pub fn state_dir(name: &str) -> PathBuf {
    PathBuf::from(STATE_DIR).join(name)
}

pub fn config_path(name: &str) -> PathBuf {
    state_dir(name).join("config.json")
}

pub fn pid_path(name: &str) -> PathBuf {
    state_dir(name).join("relay.pid")
}

pub fn socket_path(name: &str) -> PathBuf {
    state_dir(name).join("control.sock")
}

pub fn log_path(name: &str) -> PathBuf {
    state_dir(name).join("relay.log")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn letter(self) -> char {
        match self {
            Side::A => 'a',
            Side::B => 'b',
        }
    }
}

/// Everything the relay and the other commands need to know about a link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    pub name: String,
    /// The link's /24 is 10.subnet[0].subnet[1].0/24.
    pub subnet: [u8; 2],
    pub mtu: u32,
    pub hosts_a: u32,
    pub hosts_b: u32,
    /// Site A to site B.
    pub ab: DirParams,
    /// Site B to site A.
    pub ba: DirParams,
    /// Busy-wait this long before a departure instead of sleeping (0: always sleep).
    pub spin_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    pub netns: String,
    pub addr: Ipv4Addr,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Site {
    /// The site's gateway namespace, which holds the TUN device.
    pub netns: String,
    pub addr: Ipv4Addr,
    pub subnet: String,
    /// All hosts of the site, the gateway first.
    pub hosts: Vec<Host>,
}

impl LinkConfig {
    pub fn hosts(&self, side: Side) -> u32 {
        match side {
            Side::A => self.hosts_a,
            Side::B => self.hosts_b,
        }
    }

    /// Namespace of host `i` (1-based) of a site: `NAME-a`, `NAME-a2`, ...
    pub fn netns(&self, side: Side, i: u32) -> String {
        if i <= 1 {
            format!("{}-{}", self.name, side.letter())
        } else {
            format!("{}-{}{}", self.name, side.letter(), i)
        }
    }

    pub fn addr(&self, side: Side, i: u32) -> Ipv4Addr {
        let base = match side {
            Side::A => 0,
            Side::B => 128,
        };
        Ipv4Addr::new(10, self.subnet[0], self.subnet[1], base + i as u8)
    }

    pub fn site_prefix(&self, side: Side) -> String {
        let base = match side {
            Side::A => 0,
            Side::B => 128,
        };
        format!("10.{}.{}.{}/25", self.subnet[0], self.subnet[1], base)
    }

    pub fn site(&self, side: Side) -> Site {
        Site {
            netns: self.netns(side, 1),
            addr: self.addr(side, 1),
            subnet: self.site_prefix(side),
            hosts: (1..=self.hosts(side))
                .map(|i| Host {
                    netns: self.netns(side, i),
                    addr: self.addr(side, i),
                })
                .collect(),
        }
    }

    pub fn all_netns(&self) -> Vec<String> {
        [Side::A, Side::B]
            .into_iter()
            .flat_map(|s| (1..=self.hosts(s)).map(move |i| (s, i)))
            .map(|(s, i)| self.netns(s, i))
            .collect()
    }

    pub fn rtt_ns(&self) -> u64 {
        self.ab.delay_ns + self.ba.delay_ns
    }

    pub fn load(name: &str) -> Result<LinkConfig> {
        let path = config_path(name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn save(&self) -> Result<()> {
        let path = config_path(&self.name);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Applies a change; a queue never set explicitly follows one BDP of the new link.
    pub fn apply(&mut self, update: &LinkUpdate) {
        update.ab.apply(&mut self.ab);
        update.ba.apply(&mut self.ba);
        let rtt = self.rtt_ns();
        for d in [&mut self.ab, &mut self.ba] {
            if d.queue_auto {
                d.queue_bytes = default_queue_bytes(d.rate_bps, rtt, self.mtu);
            }
        }
    }
}

/// A change to one direction; `None` leaves a parameter as it is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DirUpdate {
    pub rate_bps: Option<u64>,
    pub delay_ns: Option<u64>,
    pub jitter_ns: Option<u64>,
    pub loss: Option<LossModel>,
    pub queue_bytes: Option<u64>,
}

impl DirUpdate {
    fn apply(&self, p: &mut DirParams) {
        if let Some(v) = self.rate_bps {
            p.rate_bps = v;
        }
        if let Some(v) = self.delay_ns {
            p.delay_ns = v;
        }
        if let Some(v) = self.jitter_ns {
            p.jitter_ns = v;
        }
        if let Some(v) = self.loss {
            p.loss = v;
        }
        if let Some(v) = self.queue_bytes {
            p.queue_bytes = v;
            p.queue_auto = false;
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkUpdate {
    pub ab: DirUpdate,
    pub ba: DirUpdate,
}

/// What `up --json` and `list --json` print.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkInfo {
    pub name: String,
    pub running: bool,
    pub pid: Option<i32>,
    pub mtu: u32,
    pub a: Site,
    pub b: Site,
    pub ab: DirParams,
    pub ba: DirParams,
}

impl LinkInfo {
    pub fn new(cfg: &LinkConfig, pid: Option<i32>) -> LinkInfo {
        LinkInfo {
            name: cfg.name.clone(),
            running: pid.is_some_and(sys::process_alive),
            pid,
            mtu: cfg.mtu,
            a: cfg.site(Side::A),
            b: cfg.site(Side::B),
            ab: cfg.ab,
            ba: cfg.ba,
        }
    }
}

pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        bail!("link name {name:?}: use 1-32 letters, digits, '-' or '_', starting alphanumeric");
    }
    Ok(())
}

fn read_pid(name: &str) -> Option<i32> {
    std::fs::read_to_string(pid_path(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The relay's pid if it is running.
pub fn relay_pid(name: &str) -> Option<i32> {
    read_pid(name).filter(|&p| sys::process_alive(p) && is_our_relay(p, name))
}

/// Waits until `pid` has exited (or is a zombie); false on timeout.
fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while sys::process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn is_our_relay(pid: i32, name: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
            args.contains(&b"relay".as_slice()) && args.contains(&name.as_bytes())
        })
        .unwrap_or(false)
}

fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// 10.P.Q.0/24 for a new link: P in 200..=239, from the name's hash, skipping used ones.
fn pick_subnet(name: &str) -> Result<[u8; 2]> {
    let used: Vec<[u8; 2]> = list_names()
        .iter()
        .filter(|n| n.as_str() != name)
        .filter_map(|n| LinkConfig::load(n).ok())
        .map(|c| c.subnet)
        .collect();
    const SLOTS: u32 = 40 * 256;
    let start = fnv1a(name) % SLOTS;
    (0..SLOTS)
        .map(|k| (start + k) % SLOTS)
        .map(|s| [200 + (s / 256) as u8, (s % 256) as u8])
        .find(|s| !used.contains(s))
        .context("no free 10.x.y.0/24 left for another link")
}

/// Names of the links that have a state directory.
pub fn list_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(STATE_DIR)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub struct UpOptions {
    pub name: String,
    pub mtu: u32,
    pub hosts_a: u32,
    pub hosts_b: u32,
    pub spin_ns: u64,
    pub update: LinkUpdate,
}

/// Builds the link, starts `relay` (a command that runs [`crate::relay::run`] for this name,
/// normally this executable again) in the background, and returns once traffic crosses in
/// both directions (or, for a direction set to lose everything, once the relay runs).
pub fn up(opts: &UpOptions, relay: Command) -> Result<LinkInfo> {
    validate_name(&opts.name)?;
    if !(68..=65535).contains(&opts.mtu) {
        bail!("mtu {} out of range 68..65535", opts.mtu);
    }
    for n in [opts.hosts_a, opts.hosts_b] {
        if !(1..=MAX_HOSTS).contains(&n) {
            bail!("hosts per site must lie in 1..={MAX_HOSTS}");
        }
    }
    if relay_pid(&opts.name).is_some() {
        bail!(
            "link {} is already up (rsv-lab wan down --name {0})",
            opts.name
        );
    }
    down(&opts.name)?;
    let none = DirParams::NONE;
    std::fs::create_dir_all(state_dir(&opts.name))?;
    let mut cfg = LinkConfig {
        name: opts.name.clone(),
        subnet: pick_subnet(&opts.name)?,
        mtu: opts.mtu,
        hosts_a: opts.hosts_a,
        hosts_b: opts.hosts_b,
        ab: none,
        ba: none,
        spin_ns: opts.spin_ns,
    };
    cfg.apply(&opts.update);
    cfg.save()?;
    let built = build(&cfg, relay);
    match built {
        Ok(pid) => Ok(LinkInfo::new(&cfg, Some(pid))),
        Err(e) => {
            if let Err(d) = down(&cfg.name) {
                tracing::warn!("cleaning up after a failed up: {d:#}");
            }
            Err(e)
        }
    }
}

fn build(cfg: &LinkConfig, mut relay: Command) -> Result<i32> {
    for ns in cfg.all_netns() {
        sys::ip(&["netns", "add", &ns])?;
        sys::ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // Router solicitations and MLD reports would otherwise cross the emulated link.
        sys::sysctl_in(&ns, "net.ipv6.conf.all.disable_ipv6", "1")?;
        sys::sysctl_in(&ns, "net.ipv6.conf.default.disable_ipv6", "1")?;
    }
    let pid = start_relay(cfg, &mut relay)?;
    for side in [Side::A, Side::B] {
        configure_site(cfg, side)?;
    }
    for (from, to, d) in [(Side::A, Side::B, &cfg.ab), (Side::B, Side::A, &cfg.ba)] {
        if d.loss.mean_loss() >= 1.0 {
            tracing::warn!(
                "not probing {}->{}: it loses every packet",
                from.letter(),
                to.letter()
            );
            continue;
        }
        let timeout = Duration::from_secs(5) + Duration::from_nanos(cfg.rtt_ns() * 4);
        probe(cfg, from, to, timeout)
            .with_context(|| format!("probing {}->{}", from.letter(), to.letter()))?;
    }
    Ok(pid)
}

fn start_relay(cfg: &LinkConfig, relay: &mut Command) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(log_path(&cfg.name))?;
    relay.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the relay from our terminal session.
    unsafe {
        relay.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = relay.spawn().context("starting the relay")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if control::request(&cfg.name, &Request::Ping).is_ok() {
            return Ok(child.id() as i32);
        }
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(log_path(&cfg.name)).unwrap_or_default();
            bail!("relay exited with {status}: {}", log.trim());
        }
        if Instant::now() > deadline {
            bail!(
                "relay did not answer on {}",
                socket_path(&cfg.name).display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn configure_site(cfg: &LinkConfig, side: Side) -> Result<()> {
    let gw = cfg.netns(side, 1);
    let gw_addr = cfg.addr(side, 1).to_string();
    let mtu = cfg.mtu.to_string();
    let far = cfg.site_prefix(match side {
        Side::A => Side::B,
        Side::B => Side::A,
    });
    sys::ip(&[
        "-n",
        &gw,
        "link",
        "set",
        TUN_NAME,
        "mtu",
        &mtu,
        "txqueuelen",
        &TUN_QUEUE_PACKETS.to_string(),
        "up",
    ])?;
    let n = cfg.hosts(side);
    if n == 1 {
        sys::ip(&[
            "-n",
            &gw,
            "addr",
            "add",
            &format!("{gw_addr}/32"),
            "dev",
            TUN_NAME,
        ])?;
    } else {
        let site_addr = format!("{gw_addr}/25");
        sys::ip(&["-n", &gw, "link", "add", "br0", "type", "bridge"])?;
        sys::ip(&["-n", &gw, "addr", "add", &site_addr, "dev", "br0"])?;
        sys::ip(&["-n", &gw, "link", "set", "br0", "mtu", &mtu, "up"])?;
        sys::sysctl_in(&gw, "net.ipv4.ip_forward", "1")?;
        for i in 2..=n {
            let host = cfg.netns(side, i);
            let port = format!("h{i}");
            sys::ip(&[
                "-n", &gw, "link", "add", &port, "mtu", &mtu, "type", "veth", "peer", "name",
                "eth0", "mtu", &mtu, "netns", &host,
            ])?;
            sys::ip(&["-n", &gw, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("{}/25", cfg.addr(side, i));
            sys::ip(&["-n", &host, "addr", "add", &addr, "dev", "eth0"])?;
            sys::ip(&["-n", &host, "link", "set", "eth0", "up"])?;
            sys::ip(&["-n", &host, "route", "add", "default", "via", &gw_addr])?;
        }
    }
    sys::ip(&[
        "-n", &gw, "route", "add", &far, "dev", TUN_NAME, "src", &gw_addr,
    ])?;
    Ok(())
}

/// Sends UDP datagrams from one gateway to the other until one arrives.
fn probe(cfg: &LinkConfig, from: Side, to: Side, timeout: Duration) -> Result<()> {
    let to_addr = cfg.addr(to, 1);
    let from_addr = cfg.addr(from, 1);
    let rx = sys::in_netns(&cfg.netns(to, 1), move || {
        Ok(UdpSocket::bind((to_addr, 0))?)
    })?;
    let tx = sys::in_netns(&cfg.netns(from, 1), move || {
        Ok(UdpSocket::bind((from_addr, 0))?)
    })?;
    let port = rx.local_addr()?.port();
    rx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        tx.send_to(b"rsv-wan-probe", (to_addr, port))?;
        if let Ok((n, _)) = rx.recv_from(&mut buf) {
            if &buf[..n] == b"rsv-wan-probe" {
                return Ok(());
            }
        }
    }
    bail!("no packet crossed within {timeout:?}")
}

/// Removes everything `up` made for `name`. Succeeds when there is nothing to remove; tells
/// whether there was.
pub fn down(name: &str) -> Result<bool> {
    validate_name(name)?;
    let mut found = false;
    if let Some(pid) = relay_pid(name) {
        found = true;
        // Checked once, before it starts exiting: a process on its way out loses its
        // cmdline, so the check cannot be repeated while waiting.
        if sys::process_alive(pid) && is_our_relay(pid, name) {
            let _ = control::request(name, &Request::Quit);
            if !wait_gone(pid, Duration::from_secs(2)) {
                sys::kill(pid, libc::SIGKILL);
                if !wait_gone(pid, Duration::from_secs(5)) {
                    bail!("relay {pid} of link {name} does not exit");
                }
            }
        }
    }
    let a = format!("{name}-a");
    let b = format!("{name}-b");
    let ours = |ns: &str| {
        ns == a
            || ns == b
            || [&a, &b].iter().any(|p| {
                ns.strip_prefix(p.as_str())
                    .is_some_and(|i| !i.is_empty() && i.bytes().all(|c| c.is_ascii_digit()))
            })
    };
    for ns in sys::list_netns().into_iter().filter(|n| ours(n)) {
        found = true;
        sys::ip(&["netns", "delete", &ns])?;
    }
    let dir = state_dir(name);
    if dir.exists() {
        found = true;
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LinkConfig {
        let none = DirParams::NONE;
        LinkConfig {
            name: "lab".into(),
            subnet: [201, 7],
            mtu: 1500,
            hosts_a: 3,
            hosts_b: 1,
            ab: none,
            ba: none,
            spin_ns: 0,
        }
    }

    #[test]
    fn names_and_addresses() {
        let c = cfg();
        assert_eq!(c.all_netns(), ["lab-a", "lab-a2", "lab-a3", "lab-b"]);
        assert_eq!(c.addr(Side::A, 3), Ipv4Addr::new(10, 201, 7, 3));
        assert_eq!(c.addr(Side::B, 1), Ipv4Addr::new(10, 201, 7, 129));
        assert_eq!(c.site_prefix(Side::B), "10.201.7.128/25");
        assert_eq!(c.site(Side::A).hosts.len(), 3);
    }

    #[test]
    fn queue_follows_bdp_until_set() {
        let mut c = cfg();
        let mut u = LinkUpdate::default();
        u.ab.rate_bps = Some(100_000_000);
        u.ab.delay_ns = Some(50_000_000);
        u.ba.delay_ns = Some(50_000_000);
        c.apply(&u);
        assert_eq!(c.ab.queue_bytes, 1_250_000);
        let mut u = LinkUpdate::default();
        u.ab.queue_bytes = Some(100_000);
        c.apply(&u);
        let mut u = LinkUpdate::default();
        u.ab.rate_bps = Some(1_000_000_000);
        c.apply(&u);
        assert_eq!(c.ab.queue_bytes, 100_000);
        assert!(!c.ab.queue_auto);
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("lab-1").is_ok());
        assert!(validate_name("-x").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("").is_err());
    }
}
