//! Which congestion control a connection runs when nobody said: Reservoir's own `rsv`
//! where this process can load it, else the kernel's BBR, else CUBIC, else what the kernel
//! allows. The decision is sans-IO ([`precheck`], [`choose`]) from what [`Host`] says was
//! probed, so that every fallback is unit-tested; [`crate::default_congestion`] probes,
//! loads once per process and logs the outcome once.

use serde::{Deserialize, Serialize};

/// Linux capability numbers (`include/uapi/linux/capability.h`).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// What the process found about itself and the kernel before loading anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Whether the build carries the BPF program (`rsv_cc::built`), and if not why.
    pub built: Result<(), String>,
    /// The process's effective capabilities (`CapEff` of `/proc/self/status`).
    pub cap_eff: u64,
    /// `/sys/kernel/btf/vmlinux` exists: struct_ops needs the kernel's BTF.
    pub btf: bool,
    /// `net.ipv4.tcp_available_congestion_control`.
    pub available: Vec<String>,
    /// `net.ipv4.tcp_allowed_congestion_control`: what a process without CAP_NET_ADMIN
    /// may select on a socket.
    pub allowed: Vec<String>,
}

/// Why `rsv` is not the default here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Missing {
    /// The build had no BPF program (no `bpf` feature, or no clang/libbpf-dev at build).
    NotBuilt(String),
    /// The process lacks these capabilities.
    NoRights(Vec<String>),
    /// The kernel cannot run a struct_ops congestion control (no BTF, no
    /// `tcp_congestion_ops` struct_ops), with the detail.
    NoStructOps(String),
    /// The system's libbpf (`libbpf.so.1`) could not be opened.
    NoLibbpf(String),
    /// The kernel refused the load: the verifier's or libbpf's words.
    Refused(String),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::NotBuilt(w) => write!(f, "this build has no BPF support ({w})"),
            Missing::NoRights(caps) => write!(
                f,
                "no rights to load BPF: missing {} (run as root or under the packaged \
                 unit, which grants them)",
                caps.join(", ")
            ),
            Missing::NoStructOps(w) => write!(
                f,
                "the kernel cannot load a BPF congestion control (struct_ops): {w}"
            ),
            Missing::NoLibbpf(w) => write!(f, "no libbpf: {w}"),
            Missing::Refused(w) => write!(f, "the kernel refused it: {w}"),
        }
    }
}

/// The congestion control the process's connections run by default, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    /// The name a socket selects (`rsv`, `bbr`, `cubic`, ...); `None`: the kernel's own
    /// default, nothing is set.
    pub name: Option<String>,
    /// Why `rsv` is not it; `None` when it is.
    pub rsv_missing: Option<Missing>,
    /// One line for people: what and why.
    pub why: String,
}

/// The capabilities loading `rsv` and selecting it on a socket need that `cap_eff` lacks:
/// a struct_ops map and program need CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, which
/// implies both), and a socket may select a congestion control outside
/// `tcp_allowed_congestion_control` only with CAP_NET_ADMIN.
pub fn missing_caps(cap_eff: u64) -> Vec<String> {
    let has = |c: u32| cap_eff & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    missing.into_iter().map(str::to_owned).collect()
}

/// Whether loading is worth trying: the build has the program, the process the rights
/// and the kernel BTF. A load that passes this may still fail ([`choose`] takes its
/// outcome).
pub fn precheck(h: &Host) -> Result<(), Missing> {
    if let Err(w) = &h.built {
        return Err(Missing::NotBuilt(w.clone()));
    }
    let caps = missing_caps(h.cap_eff);
    if !caps.is_empty() {
        return Err(Missing::NoRights(caps));
    }
    if !h.btf {
        return Err(Missing::NoStructOps(
            "no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)".into(),
        ));
    }
    Ok(())
}

/// The default from what was probed and how loading `rsv` went (`Ok`: loaded, or
/// registered by this process or shared with the process that holds the name).
pub fn choose(h: &Host, rsv: Result<(), Missing>) -> Choice {
    let missing = match rsv {
        Ok(()) => {
            return Choice {
                name: Some(crate::cc::NAME.into()),
                rsv_missing: None,
                why: "rsv, Reservoir's BPF congestion control, loaded by this process (the \
                      default wherever it loads)"
                    .into(),
            }
        }
        Err(m) => m,
    };
    // Without CAP_NET_ADMIN a socket takes only what the kernel allows.
    let may = |n: &str| {
        h.available.iter().any(|a| a == n)
            && (missing_caps(h.cap_eff).iter().all(|c| c != "CAP_NET_ADMIN")
                || h.allowed.iter().any(|a| a == n))
    };
    let mut skipped = Vec::new();
    for fallback in ["bbr", "cubic"] {
        if may(fallback) {
            let also = if skipped.is_empty() {
                String::new()
            } else {
                format!("; {}", skipped.join("; "))
            };
            return Choice {
                name: Some(fallback.into()),
                why: format!("{fallback}, not rsv: {missing}{also}"),
                rsv_missing: Some(missing),
            };
        }
        skipped.push(if h.available.iter().any(|a| a == fallback) {
            format!("{fallback} not allowed without CAP_NET_ADMIN (tcp_allowed_congestion_control)")
        } else {
            format!("{fallback} not available (tcp_available_congestion_control)")
        });
    }
    let why = format!(
        "the kernel's default, not rsv: {missing}; {}",
        skipped.join("; ")
    );
    Choice {
        name: None,
        rsv_missing: Some(missing),
        why,
    }
}

/// Maps the loader's reason onto what the default says was missing.
pub fn missing_from(why: &crate::cc::Why) -> Missing {
    use crate::cc::Why;
    match why {
        Why::NotBuilt(w) => Missing::NotBuilt(w.clone()),
        Why::NoLibbpf(w) => Missing::NoLibbpf(w.clone()),
        Why::NotPermitted(w) => Missing::NoRights(vec![format!("the kernel said: {w}")]),
        Why::NoBtf => Missing::NoStructOps("no BTF (/sys/kernel/btf/vmlinux)".into()),
        Why::NoStructOps(w) => Missing::NoStructOps(w.clone()),
        Why::Verifier(w) | Why::Failed(w) => Missing::Refused(w.clone()),
    }
}

/// `CapEff` from the text of `/proc/self/status`; 0 when absent.
pub fn cap_eff(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: u64 = 0x0000_01ff_ffff_ffff;
    /// The packaged unit's set: CAP_NET_BIND_SERVICE, CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF.
    const UNIT: u64 = (1 << 10) | (1 << CAP_NET_ADMIN) | (1 << CAP_PERFMON) | (1 << CAP_BPF);

    fn host(cap_eff: u64) -> Host {
        Host {
            built: Ok(()),
            cap_eff,
            btf: true,
            available: vec!["reno".into(), "cubic".into(), "bbr".into()],
            allowed: vec!["reno".into(), "cubic".into()],
        }
    }

    #[test]
    fn rsv_where_it_loads() {
        for caps in [ROOT, UNIT, (1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN)] {
            let h = host(caps);
            assert_eq!(precheck(&h), Ok(()), "{caps:x}");
            let c = choose(&h, Ok(()));
            assert_eq!(c.name.as_deref(), Some("rsv"));
            assert_eq!(c.rsv_missing, None);
        }
    }

    #[test]
    fn a_build_without_bpf_falls_back_to_bbr() {
        let h = Host {
            built: Err("the bpf feature is off".into()),
            ..host(ROOT)
        };
        let m = precheck(&h).unwrap_err();
        assert!(matches!(m, Missing::NotBuilt(_)));
        let c = choose(&h, Err(m));
        assert_eq!(c.name.as_deref(), Some("bbr"));
        assert!(c.why.contains("no BPF support"), "{}", c.why);
    }

    #[test]
    fn no_rights_names_the_capabilities_missing() {
        // No capability at all: bbr is not in the allowed list, so CUBIC.
        let h = host(0);
        let m = precheck(&h).unwrap_err();
        assert_eq!(
            m,
            Missing::NoRights(vec![
                "CAP_BPF".into(),
                "CAP_PERFMON".into(),
                "CAP_NET_ADMIN".into()
            ])
        );
        let c = choose(&h, Err(m));
        assert_eq!(c.name.as_deref(), Some("cubic"));
        assert!(
            c.why
                .contains("missing CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN"),
            "{}",
            c.why
        );
        assert!(c.why.contains("bbr not allowed"), "{}", c.why);
        // CAP_NET_ADMIN alone: BBR, and the two BPF capabilities named.
        let h = host(1 << CAP_NET_ADMIN);
        let m = precheck(&h).unwrap_err();
        assert_eq!(
            m,
            Missing::NoRights(vec!["CAP_BPF".into(), "CAP_PERFMON".into()])
        );
        assert_eq!(choose(&h, Err(m)).name.as_deref(), Some("bbr"));
        // bbr allowed to all: BBR even without rights.
        let mut h = host(0);
        h.allowed.push("bbr".into());
        let m = precheck(&h).unwrap_err();
        assert_eq!(choose(&h, Err(m)).name.as_deref(), Some("bbr"));
        // Only CAP_PERFMON missing.
        assert_eq!(
            missing_caps(UNIT & !(1 << CAP_PERFMON)),
            vec!["CAP_PERFMON".to_owned()]
        );
    }

    #[test]
    fn no_struct_ops_in_the_kernel() {
        let h = Host {
            btf: false,
            ..host(ROOT)
        };
        let m = precheck(&h).unwrap_err();
        assert!(matches!(m, Missing::NoStructOps(_)));
        let c = choose(&h, Err(m));
        assert_eq!(c.name.as_deref(), Some("bbr"));
        assert!(c.why.contains("struct_ops"), "{}", c.why);
        // A kernel that has BTF but refuses the struct_ops at load.
        let h = host(ROOT);
        let c = choose(
            &h,
            Err(missing_from(&crate::cc::Why::NoStructOps(
                "struct tcp_congestion_ops is not found in kernel BTF".into(),
            ))),
        );
        assert_eq!(c.name.as_deref(), Some("bbr"));
        assert!(c.why.contains("not found in kernel BTF"), "{}", c.why);
    }

    #[test]
    fn without_bbr_cubic_then_the_kernels_default() {
        let mut h = host(ROOT);
        h.available = vec!["reno".into(), "cubic".into()];
        let c = choose(&h, Err(Missing::Refused("verifier".into())));
        assert_eq!(c.name.as_deref(), Some("cubic"));
        assert!(c.why.contains("bbr not available"), "{}", c.why);
        h.available = vec!["reno".into()];
        let c = choose(&h, Err(Missing::Refused("verifier".into())));
        assert_eq!(c.name, None);
        assert!(c.why.contains("cubic not available"), "{}", c.why);
    }

    #[test]
    fn cap_eff_is_read_from_proc_status() {
        let s = "Name:\trsv\nCapInh:\t0000000000000000\nCapEff:\t000000c000001400\n";
        assert_eq!(cap_eff(s), UNIT);
        assert!(missing_caps(cap_eff(s)).is_empty());
        assert_eq!(cap_eff("Name: x\n"), 0);
    }
}
