//! INQUIRY: standard data and the vital product data pages.

use crate::cdb::{ascii_field, be16, truncate};
use crate::sense::{self, Sense};
use crate::{Designator, LuConfig};

pub(crate) const VPD_SUPPORTED: u8 = 0x00;
pub(crate) const VPD_SERIAL: u8 = 0x80;
pub(crate) const VPD_DEVICE_ID: u8 = 0x83;
pub(crate) const VPD_BLOCK_LIMITS: u8 = 0xb0;
pub(crate) const VPD_BLOCK_CHARACTERISTICS: u8 = 0xb1;
pub(crate) const VPD_PROVISIONING: u8 = 0xb2;

/// Version 06h: SPC-4. (SPC-5 would be 07h, which common initiators' checks reject.)
const VERSION_SPC4: u8 = 0x06;
const VERSION_DESCRIPTORS: [u16; 4] = [
    0x00a0, // SAM-5
    0x0460, // SPC-4
    0x04c0, // SBC-3
    0x0960, // iSCSI
];

/// Limits reported in the Block Limits page and enforced by the commands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_transfer: u32,
    pub optimal_transfer: u32,
    pub granularity: u16,
    pub max_compare_and_write: u8,
    pub max_unmap_lba: u32,
    pub max_unmap_descriptors: u32,
    pub max_write_same: u64,
}

impl Limits {
    pub fn new(config: &LuConfig) -> Self {
        let max_transfer = config.max_transfer_blocks.max(1);
        Self {
            max_transfer,
            optimal_transfer: config.optimal_transfer_blocks.min(max_transfer),
            granularity: (4096 / config.block_size)
                .max(1)
                .max(1 << config.physical_block_exponent.min(15)) as u16,
            max_compare_and_write: max_transfer.min(255) as u8,
            max_unmap_lba: 0xffff_ffff,
            max_unmap_descriptors: 256,
            // Beyond this a WRITE SAME would occupy the device for too long in one command;
            // below 64Ki blocks, because initiators probe that size without looking at
            // the maximum transfer length.
            max_write_same: ((1u64 << 30) / config.block_size as u64).min(0xffff),
        }
    }
}

pub(crate) fn standard(config: &LuConfig) -> Vec<u8> {
    let mut d = vec![0u8; 8];
    d[0] = 0x00;
    d[1] = if config.removable { 0x80 } else { 0 };
    d[2] = VERSION_SPC4;
    d[3] = 0x10 | 0x02; // HISUP, response data format 2
    d[5] = 0x10 | 0x08; // TPGS 01b (REPORT TARGET PORT GROUPS); 3PC (EXTENDED COPY)
    d[7] = 0x02; // CMDQUE
    d.extend(ascii_field(&config.vendor, 8));
    d.extend(ascii_field(&config.product, 16));
    d.extend(ascii_field(&config.revision, 4));
    d.resize(58, 0);
    for v in VERSION_DESCRIPTORS {
        d.extend_from_slice(&v.to_be_bytes());
    }
    d.resize(74, 0);
    d[4] = (d.len() - 5) as u8;
    d
}

/// INQUIRY for an existing logical unit.
pub(crate) fn inquiry(cdb: &[u8], config: &LuConfig, limits: &Limits) -> Result<Vec<u8>, Sense> {
    let evpd = cdb[1] & 0x01 != 0;
    if cdb[1] & 0x02 != 0 {
        return Err(Sense::invalid_field_in_cdb(1, Some(1)));
    }
    let page = cdb[2];
    let alloc = be16(&cdb[3..5]) as usize;
    let data = if !evpd {
        if page != 0 {
            return Err(Sense::invalid_field_in_cdb(2, None));
        }
        standard(config)
    } else {
        vpd(page, config, limits)?
    };
    Ok(truncate(data, alloc))
}

fn page(code: u8, body: Vec<u8>) -> Vec<u8> {
    let mut d = vec![0x00, code];
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend(body);
    d
}

fn vpd(code: u8, config: &LuConfig, limits: &Limits) -> Result<Vec<u8>, Sense> {
    Ok(match code {
        VPD_SUPPORTED => page(
            code,
            vec![
                VPD_SUPPORTED,
                VPD_SERIAL,
                VPD_DEVICE_ID,
                VPD_BLOCK_LIMITS,
                VPD_BLOCK_CHARACTERISTICS,
                VPD_PROVISIONING,
            ],
        ),
        VPD_SERIAL => page(
            code,
            ascii_field(&config.serial, config.serial.len().min(252)),
        ),
        VPD_DEVICE_ID => page(code, device_identification(config)),
        VPD_BLOCK_LIMITS => page(code, block_limits(config, limits)),
        VPD_BLOCK_CHARACTERISTICS => {
            let mut b = vec![0u8; 0x3c];
            // Non-rotating medium.
            b[0..2].copy_from_slice(&1u16.to_be_bytes());
            // WABEREQ and WACEREQ 01b: reads after a SANITIZE erase succeed. The erases
            // are offered only on a thin LU; elsewhere both stay 0 (not specified).
            if config.thin {
                b[3] = 0x40 | 0x10;
            }
            page(code, b)
        }
        VPD_PROVISIONING => {
            let mut b = vec![0u8; 4];
            if config.thin {
                b[1] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU, LBPWS, LBPWS10, LBPRZ=001b
                b[2] = 0x02; // thin provisioned
            }
            page(code, b)
        }
        _ => return Err(Sense::invalid_field_in_cdb(2, None)),
    })
}

fn designator(code_set: u8, kind: u8, value: &[u8]) -> Vec<u8> {
    let mut d = vec![code_set, kind, 0, value.len() as u8];
    d.extend_from_slice(value);
    d
}

/// The designators of the logical unit itself (association 00b) in VPD page 83h; EXTENDED
/// COPY names copy targets by them.
pub(crate) fn lu_designators(config: &LuConfig) -> Vec<Designator> {
    let mut naa = config.naa_id.to_be_bytes().to_vec();
    if config.naa_id >> 60 == 6 {
        // NAA 6 (IEEE registered extended) is 16 bytes; the extension stays zero because
        // the 64-bit id is already unique per logical unit.
        naa.resize(16, 0);
    }
    let mut t10 = ascii_field(&config.t10_vendor_id, 8);
    t10.extend(
        config
            .device_id
            .bytes()
            .filter(|b| (0x20..=0x7e).contains(b))
            .take(200),
    );
    vec![
        // Binary code set, type 3: NAA.
        Designator {
            code_set: 0x01,
            kind: 0x03,
            value: naa,
        },
        // ASCII code set, type 1: T10 vendor ID.
        Designator {
            code_set: 0x02,
            kind: 0x01,
            value: t10,
        },
    ]
}

fn device_identification(config: &LuConfig) -> Vec<u8> {
    let mut body = Vec::new();
    for d in lu_designators(config) {
        body.extend(designator(d.code_set, d.kind, &d.value));
    }
    // iSCSI (protocol 5) with PIV, association: target port; binary code set.
    let mut rel = vec![0u8; 2];
    rel.extend_from_slice(&config.relative_port.to_be_bytes());
    body.extend(designator(0x51, 0x90 | 0x04, &rel));
    let mut tpg = vec![0u8; 2];
    tpg.extend_from_slice(&config.target_port_group.to_be_bytes());
    body.extend(designator(0x51, 0x90 | 0x05, &tpg));
    // SCSI name string of the target port: "<name>,t,0x<tpgt>", UTF-8, padded to 4.
    let mut name = format!(
        "{},t,0x{:04x}",
        config.target_name, config.target_port_group
    )
    .into_bytes();
    name.push(0);
    name.resize(name.len().div_ceil(4) * 4, 0);
    name.truncate(252);
    body.extend(designator(0x53, 0x90 | 0x08, &name));
    body
}

fn block_limits(config: &LuConfig, limits: &Limits) -> Vec<u8> {
    let mut b = vec![0u8; 0x3c];
    b[1] = limits.max_compare_and_write;
    b[2..4].copy_from_slice(&limits.granularity.to_be_bytes());
    b[4..8].copy_from_slice(&limits.max_transfer.to_be_bytes());
    b[8..12].copy_from_slice(&limits.optimal_transfer.to_be_bytes());
    b[12..16].copy_from_slice(&limits.max_transfer.to_be_bytes()); // max pre-fetch length
    if config.thin {
        b[16..20].copy_from_slice(&limits.max_unmap_lba.to_be_bytes());
        b[20..24].copy_from_slice(&limits.max_unmap_descriptors.to_be_bytes());
        b[24..28].copy_from_slice(&(limits.granularity as u32).to_be_bytes());
        b[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, alignment 0
    }
    b[32..40].copy_from_slice(&limits.max_write_same.to_be_bytes());
    // MAXIMUM ATOMIC TRANSFER LENGTH: any write; no alignment, granularity or boundaries.
    b[40..44].copy_from_slice(&limits.max_transfer.to_be_bytes());
    b
}

/// Standard INQUIRY data for a LUN with no logical unit behind it.
pub(crate) fn not_supported(cdb: &[u8]) -> Result<Vec<u8>, Sense> {
    if cdb[1] & 0x02 != 0 {
        return Err(Sense::invalid_field_in_cdb(1, Some(1)));
    }
    if cdb[1] & 0x01 != 0 {
        return Err(sense::LOGICAL_UNIT_NOT_SUPPORTED);
    }
    if cdb[2] != 0 {
        return Err(Sense::invalid_field_in_cdb(2, None));
    }
    let mut d = standard(&LuConfig::default());
    d[0] = 0x7f; // qualifier 011b, device type 1Fh
    d[1] = 0;
    Ok(truncate(d, be16(&cdb[3..5]) as usize))
}
