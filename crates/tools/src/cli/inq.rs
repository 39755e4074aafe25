//! `rsv inq`: what a LUN says of itself (INQUIRY, capacity, VPD pages).

use super::*;

#[derive(Args, Debug)]
pub struct InqArgs {
    /// iscsi://[user[%password]@]host[:port]/TARGET-IQN/LUN, or
    /// isns://SERVER[:PORT]/ALIAS-or-IQN/LUN (the target's portal from an iSNS server)
    pub url: String,
    #[command(flatten)]
    pub session: SessionFlags,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct InquiryReport {
    pub target: String,
    pub lun: u16,
    pub standard: scsi::Inquiry,
    pub supported_vpd_pages: Vec<u8>,
    pub serial: Option<String>,
    pub designators: Vec<scsi::Designator>,
    pub block_limits: Option<scsi::BlockLimits>,
    pub capacity: Option<Capacity>,
    pub session: SessionInfo,
}

pub async fn inquire(url: &IscsiUrl, flags: &SessionFlags) -> initiator::Result<InquiryReport> {
    let lun = url.lun_required()?;
    let mut opts = flags.options(url)?;
    opts.connections = 1;
    let s = Session::connect(url, &opts).await?;
    let result = async {
        let standard = s.inquiry(lun).await?;
        let pages = s
            .vpd(lun, 0)
            .await
            .map(|p| {
                let n = p.get(3).copied().unwrap_or(0) as usize;
                p.get(4..4 + n).unwrap_or(&p[p.len().min(4)..]).to_vec()
            })
            .unwrap_or_default();
        let has = |pg: u8| pages.contains(&pg);
        let serial = if has(0x80) {
            s.vpd(lun, 0x80)
                .await
                .ok()
                .and_then(|p| scsi::parse_vpd80(&p))
        } else {
            None
        };
        let designators = if has(0x83) {
            s.vpd(lun, 0x83)
                .await
                .map(|p| scsi::parse_vpd83(&p))
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let block_limits = if has(0xb0) {
            s.vpd(lun, 0xb0)
                .await
                .ok()
                .and_then(|p| scsi::parse_vpd_b0(&p))
        } else {
            None
        };
        let capacity = if standard.device_type == 0 {
            Some(s.read_capacity(lun).await?)
        } else {
            None
        };
        Ok(InquiryReport {
            target: url.target_required()?.to_owned(),
            lun,
            standard,
            supported_vpd_pages: pages.clone(),
            serial,
            designators,
            block_limits,
            capacity,
            session: s.info(),
        })
    }
    .await;
    let _ = s.logout().await;
    result
}

pub fn inq(args: InqArgs) -> anyhow::Result<()> {
    let r = runtime()?.block_on(async {
        let url = target_url(&args.url, &args.session).await?;
        anyhow::Ok(inquire(&url, &args.session).await?)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let i = &r.standard;
    println!("Target:  {}  LUN {}", r.target, r.lun);
    println!(
        "Device:  {} (type 0x{:02x}, qualifier {}){}",
        i.device_type_name,
        i.device_type,
        i.peripheral_qualifier,
        if i.removable { ", removable" } else { "" }
    );
    println!("Vendor:  {}", i.vendor);
    println!("Product: {}", i.product);
    println!("Rev:     {}", i.revision);
    println!("SPC:     version 0x{:02x}", i.version);
    let pages: Vec<String> = r
        .supported_vpd_pages
        .iter()
        .map(|p| format!("0x{p:02x}"))
        .collect();
    println!("VPD:     {}", pages.join(" "));
    if let Some(s) = &r.serial {
        println!("Serial:  {s}");
    }
    for d in &r.designators {
        println!("Id:      {} ({}) {}", d.kind, d.association, d.value);
    }
    if let Some(b) = &r.block_limits {
        println!(
            "Limits:  max transfer {} blocks, optimal {} blocks, granularity {}",
            b.max_transfer_blocks, b.optimal_transfer_blocks, b.optimal_granularity_blocks
        );
    }
    if let Some(c) = &r.capacity {
        println!(
            "Size:    {} ({} blocks of {} bytes)",
            Size(c.bytes()).approx(),
            c.blocks,
            c.block_size
        );
    }
    Ok(())
}
