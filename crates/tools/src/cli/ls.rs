//! `rsv ls`: the targets and LUNs a portal or an iSNS server offers.

use super::*;

#[derive(Args, Debug)]
pub struct LsArgs {
    /// iscsi://[user[%password]@]host[:port]/ (all targets) or .../TARGET-IQN (one target);
    /// isns://SERVER[:PORT]/ (the targets an iSNS server knows) or .../ALIAS-or-IQN.
    pub url: String,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct LunListing {
    pub lun: u16,
    pub device_type: String,
    pub vendor: String,
    pub product: String,
    pub size_bytes: Option<u64>,
    pub blocks: Option<u64>,
    pub block_size: Option<u32>,
}

#[derive(Serialize, Debug, Clone)]
pub struct TargetListing {
    pub target: String,
    /// Known from iSNS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    pub portals: Vec<String>,
    pub luns: Vec<LunListing>,
    /// Why the LUNs could not be listed, if they could not.
    pub error: Option<String>,
}

pub async fn list(url: &IscsiUrl, flags: &SessionFlags) -> initiator::Result<Vec<TargetListing>> {
    let opts = flags.options(url)?;
    let targets = match &url.target {
        Some(t) => vec![initiator::DiscoveredTarget {
            name: t.clone(),
            alias: None,
            portals: vec![url.portal()],
        }],
        None => discover(url, &opts).await?,
    };
    let mut out = Vec::new();
    for t in targets {
        let mut turl = url.clone();
        turl.target = Some(t.name.clone());
        let mut listing = TargetListing {
            target: t.name.clone(),
            alias: t.alias.clone(),
            portals: t.portals.clone(),
            luns: Vec::new(),
            error: None,
        };
        let mut o = opts.clone();
        o.connections = 1;
        match lun_listing(&turl, &o).await {
            Ok(l) => listing.luns = l,
            Err(e) if url.target.is_some() => return Err(e),
            Err(e) => listing.error = Some(e.to_string()),
        }
        out.push(listing);
    }
    Ok(out)
}

async fn lun_listing(url: &IscsiUrl, opts: &SessionOptions) -> initiator::Result<Vec<LunListing>> {
    let s = Session::connect(url, opts).await?;
    let result = async {
        let mut luns = Vec::new();
        for lun in s.report_luns().await? {
            let inq = s.inquiry(lun).await?;
            let cap = if inq.device_type == 0 {
                s.read_capacity(lun).await.ok()
            } else {
                None
            };
            luns.push(LunListing {
                lun,
                device_type: inq.device_type_name.to_owned(),
                vendor: inq.vendor,
                product: inq.product,
                size_bytes: cap.as_ref().map(Capacity::bytes),
                blocks: cap.as_ref().map(|c| c.blocks),
                block_size: cap.as_ref().map(|c| c.block_size),
            });
        }
        Ok(luns)
    }
    .await;
    let _ = s.logout().await;
    result
}

/// [`list`] for an `iscsi://` or an `isns://` URL: the targets an iSNS server knows, or
/// the one it names.
pub async fn list_spec(spec: &str, flags: &SessionFlags) -> anyhow::Result<Vec<TargetListing>> {
    if !IsnsUrl::is_isns(spec) {
        return Ok(list(&IscsiUrl::parse(spec)?, flags).await?);
    }
    let u = IsnsUrl::parse(spec)?;
    if u.url.target.is_some() {
        let name = flags.options(&u.url)?.initiator_name;
        let (url, found) = initiator::isns::resolve_target(&u, &name).await?;
        let mut listing = list(&url, flags).await?;
        for l in &mut listing {
            l.alias = found.alias.clone();
            l.portals = found.portals.clone();
        }
        return Ok(listing);
    }
    let opts = flags.options(&u.url)?;
    let found = initiator::isns::lookup(&u, &opts.initiator_name).await?;
    let mut out = Vec::new();
    for t in found {
        let Some(portal) = t.portals.first() else {
            out.push(TargetListing {
                target: t.name,
                alias: t.alias,
                portals: Vec::new(),
                luns: Vec::new(),
                error: Some("no portal registered".into()),
            });
            continue;
        };
        let addr = portal.rsplit_once(',').map_or(portal.as_str(), |(a, _)| a);
        let mut url = IscsiUrl::parse(&format!("iscsi://{addr}/"))?;
        url.target = Some(t.name.clone());
        url.user = u.url.user.clone();
        url.password = u.url.password.clone();
        url.query = u.url.query.clone();
        let mut listing = TargetListing {
            target: t.name,
            alias: t.alias,
            portals: t.portals.clone(),
            luns: Vec::new(),
            error: None,
        };
        let mut o = opts.clone();
        o.connections = 1;
        match lun_listing(&url, &o).await {
            Ok(l) => listing.luns = l,
            Err(e) => listing.error = Some(e.to_string()),
        }
        out.push(listing);
    }
    Ok(out)
}

pub fn ls(args: LsArgs) -> anyhow::Result<()> {
    let listing = runtime()?.block_on(list_spec(&args.url, &args.session))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    for t in &listing {
        match &t.alias {
            Some(a) => println!("Target: {} (alias {a})", t.target),
            None => println!("Target: {}", t.target),
        }
        for p in &t.portals {
            println!("  Portal: {p}");
        }
        if let Some(e) = &t.error {
            println!("  (LUNs not listed: {e})");
        }
        for l in &t.luns {
            let size = match (l.size_bytes, l.blocks, l.block_size) {
                (Some(b), Some(n), Some(bs)) => {
                    format!("  {} ({n} blocks of {bs} bytes)", Size(b).approx())
                }
                _ => String::new(),
            };
            println!(
                "  LUN {}: {} [{} {}]{size}",
                l.lun, l.device_type, l.vendor, l.product
            );
        }
    }
    Ok(())
}
