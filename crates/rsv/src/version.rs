//! `rsv version`: what this build is and has: its version, the commit it was built at
//! (when known), its cargo features, the store kinds it opens and the congestion controls
//! a connection may ask for here.

use std::io::Write;

use clap::Args;

#[derive(Args)]
pub struct VersionArgs {
    /// One JSON object on standard output, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// What `rsv version` reports.
pub struct Report {
    version: &'static str,
    commit: Option<&'static str>,
    features: Vec<&'static str>,
    stores: Vec<String>,
    /// Whether this build carries the BPF program `rsv`, or why not.
    rsv_cc: Result<(), String>,
    /// What the running kernel offers (`net.ipv4.tcp_available_congestion_control`).
    kernel_cc: Vec<String>,
}

pub fn report(stores: &backstore::Registry) -> Report {
    let mut features = Vec::new();
    if cfg!(feature = "bpf") {
        features.push("bpf");
    }
    if cfg!(feature = "rbd") {
        features.push("rbd");
    }
    if cfg!(feature = "man") {
        features.push("man");
    }
    Report {
        version: env!("CARGO_PKG_VERSION"),
        commit: Some(env!("RSV_BUILD_COMMIT")).filter(|c| !c.is_empty()),
        features,
        stores: stores.kinds().map(str::to_owned).collect(),
        rsv_cc: net::cc::built(),
        kernel_cc: net::available_congestion(),
    }
}

pub fn run(args: VersionArgs, stores: &backstore::Registry) -> anyhow::Result<()> {
    match print(args, stores, &mut std::io::stdout().lock()) {
        // A reader that stopped early (`rsv version | grep -q rbd`) is not a failure: end
        // quietly, as a command killed by SIGPIPE would (Rust ignores the signal, so the
        // write fails with EPIPE instead).
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn print(
    args: VersionArgs,
    stores: &backstore::Registry,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let r = report(stores);
    if args.json {
        let v = serde_json::json!({
            "version": r.version,
            "commit": r.commit,
            "features": r.features,
            "store_kinds": r.stores,
            "congestion": {
                "rsv_built": r.rsv_cc.is_ok(),
                "rsv_not_built": r.rsv_cc.as_ref().err(),
                "kernel": r.kernel_cc,
            },
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    writeln!(out, "rsv {}", r.version)?;
    writeln!(out, "commit: {}", r.commit.unwrap_or("unknown"))?;
    let features = if r.features.is_empty() {
        "none".to_owned()
    } else {
        r.features.join(", ")
    };
    writeln!(out, "features: {features}")?;
    writeln!(out, "store kinds: {}", r.stores.join(", "))?;
    match &r.rsv_cc {
        Ok(()) => writeln!(out, "congestion control rsv: built in")?,
        Err(why) => writeln!(out, "congestion control rsv: not built ({why})")?,
    }
    let kernel = if r.kernel_cc.is_empty() {
        "unknown".to_owned()
    } else {
        r.kernel_cc.join(", ")
    };
    writeln!(out, "kernel congestion controls: {kernel}")?;
    Ok(())
}
