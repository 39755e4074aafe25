//! Mode parameters: caching (08h), control (0Ah) and informational exceptions (1Ch) pages,
//! MODE SENSE and MODE SELECT.

use crate::cdb::{be16, be24, be32};
use crate::sense::{self, Sense};

pub(crate) const PAGE_CACHING: u8 = 0x08;
pub(crate) const PAGE_CONTROL: u8 = 0x0a;
pub(crate) const PAGE_INFO_EXCEPTIONS: u8 = 0x1c;
pub(crate) const PAGE_ALL: u8 = 0x3f;

/// Values of the changeable mode parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ModeState {
    /// Write cache enable: without it every write is written through.
    pub wce: bool,
    /// Read cache disable: accepted, meaningless for this device.
    pub rcd: bool,
    /// Software write protect.
    pub swp: bool,
}

impl Default for ModeState {
    fn default() -> Self {
        Self {
            wce: true,
            rcd: false,
            swp: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pc {
    Current,
    Changeable,
    Default,
}

fn caching(v: Option<&ModeState>) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = PAGE_CACHING;
    p[1] = 18;
    p[2] = match v {
        Some(s) => (if s.wce { 0x04 } else { 0 }) | (if s.rcd { 0x01 } else { 0 }),
        None => 0x04 | 0x01,
    };
    p
}

fn control(v: Option<&ModeState>) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = PAGE_CONTROL;
    p[1] = 10;
    match v {
        Some(s) => {
            p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
            if s.swp {
                p[4] |= 0x08;
            }
            p[8..10].copy_from_slice(&0xffffu16.to_be_bytes()); // busy timeout: unlimited
        }
        None => p[4] = 0x08,
    }
    p
}

fn info_exceptions(v: Option<&ModeState>) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = PAGE_INFO_EXCEPTIONS;
    p[1] = 10;
    if v.is_some() {
        p[2] = 0x08; // DEXCPT: no informational exceptions are reported
    }
    p
}

/// The page `code` for a page control; `None` if the page does not exist.
fn page(code: u8, pc: Pc, current: &ModeState) -> Option<Vec<u8>> {
    let default = ModeState::default();
    let v = match pc {
        Pc::Current => Some(current),
        Pc::Default => Some(&default),
        Pc::Changeable => None,
    };
    match code {
        PAGE_CACHING => Some(caching(v)),
        PAGE_CONTROL => Some(control(v)),
        PAGE_INFO_EXCEPTIONS => Some(info_exceptions(v)),
        _ => None,
    }
}

/// What MODE SENSE needs to know about the logical unit.
pub(crate) struct Device {
    pub write_protected: bool,
    pub capacity: u64,
    pub block_size: u32,
}

/// MODE SENSE(6) and (10).
pub(crate) fn mode_sense(cdb: &[u8], state: &ModeState, dev: &Device) -> Result<Vec<u8>, Sense> {
    let ten = cdb[0] == 0x5a;
    let dbd = cdb[1] & 0x08 != 0;
    let llbaa = ten && cdb[1] & 0x10 != 0;
    let pc = match cdb[2] >> 6 {
        0 => Pc::Current,
        1 => Pc::Changeable,
        2 => Pc::Default,
        _ => return Err(sense::SAVING_PARAMETERS_NOT_SUPPORTED),
    };
    let code = cdb[2] & 0x3f;
    let subpage = cdb[3];
    let alloc = if ten {
        be16(&cdb[7..9]) as usize
    } else {
        cdb[4] as usize
    };

    let mut pages = Vec::new();
    if code == PAGE_ALL {
        if subpage != 0 && subpage != 0xff {
            return Err(Sense::invalid_field_in_cdb(3, None));
        }
        for c in [PAGE_CACHING, PAGE_CONTROL, PAGE_INFO_EXCEPTIONS] {
            pages.extend(page(c, pc, state).unwrap_or_default());
        }
    } else {
        if subpage != 0 {
            return Err(Sense::invalid_field_in_cdb(3, None));
        }
        match page(code, pc, state) {
            Some(p) => pages.extend(p),
            None => return Err(Sense::invalid_field_in_cdb(2, Some(5))),
        }
    }

    let mut descriptor = Vec::new();
    if !dbd {
        let changeable = pc == Pc::Changeable;
        if llbaa {
            descriptor
                .extend_from_slice(&(if changeable { 0 } else { dev.capacity }).to_be_bytes());
            descriptor.extend_from_slice(&[0; 4]);
            descriptor
                .extend_from_slice(&(if changeable { 0 } else { dev.block_size }).to_be_bytes());
        } else {
            let blocks = if changeable {
                0
            } else {
                dev.capacity.min(0xffff_ffff) as u32
            };
            descriptor.extend_from_slice(&blocks.to_be_bytes());
            let len = if changeable { 0 } else { dev.block_size };
            descriptor.extend_from_slice(&len.to_be_bytes());
            descriptor[4] = 0; // density code
        }
    }

    // WP, and DPOFUA: DPO and FUA are honoured.
    let dsp = if dev.write_protected { 0x80 } else { 0 } | 0x10;
    let mut data = if ten {
        let mut h = vec![0u8; 8];
        h[3] = dsp;
        if llbaa && !descriptor.is_empty() {
            h[4] = 0x01;
        }
        h[6..8].copy_from_slice(&(descriptor.len() as u16).to_be_bytes());
        h
    } else {
        vec![0, 0, dsp, descriptor.len() as u8]
    };
    data.extend(descriptor);
    data.extend(pages);
    if ten {
        let len = (data.len() - 2) as u16;
        data[0..2].copy_from_slice(&len.to_be_bytes());
    } else {
        data[0] = (data.len() - 1) as u8;
    }
    data.truncate(alloc);
    Ok(data)
}

/// MODE SELECT(6) and (10): validates the whole parameter list, then returns the new state.
pub(crate) fn mode_select(
    cdb: &[u8],
    data_out: &[u8],
    state: &ModeState,
    block_size: u32,
) -> Result<ModeState, Sense> {
    let ten = cdb[0] == 0x55;
    let pf = cdb[1] & 0x10 != 0;
    let sp = cdb[1] & 0x01 != 0;
    let len = if ten {
        be16(&cdb[7..9]) as usize
    } else {
        cdb[4] as usize
    };
    if sp {
        return Err(Sense::invalid_field_in_cdb(1, Some(0)));
    }
    if len == 0 {
        return Ok(*state);
    }
    if !pf {
        return Err(Sense::invalid_field_in_cdb(1, Some(4)));
    }
    let header = if ten { 8 } else { 4 };
    if len < header {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    if data_out.len() < len {
        return Err(sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT);
    }
    let p = &data_out[..len];
    let (bdl, long) = if ten {
        (be16(&p[6..8]) as usize, p[4] & 0x01 != 0)
    } else {
        (p[3] as usize, false)
    };
    let desc_len = if long { 16 } else { 8 };
    if bdl % desc_len != 0 || bdl > desc_len {
        let at = if ten { 6 } else { 3 };
        return Err(Sense::invalid_field_in_parameter_list(at, None));
    }
    if header + bdl > len {
        return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    if bdl > 0 {
        let d = &p[header..header + bdl];
        let requested = if long {
            be32(&d[12..16])
        } else {
            be24(&d[5..8])
        };
        if requested != block_size {
            let at = header + if long { 12 } else { 5 };
            return Err(Sense::invalid_field_in_parameter_list(at as u16, None));
        }
        // The NUMBER OF LOGICAL BLOCKS cannot change this device's capacity and is ignored.
    }

    let mut new = *state;
    let mut pos = header + bdl;
    while pos < len {
        if len - pos < 2 {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let code = p[pos] & 0x3f;
        if p[pos] & 0x40 != 0 {
            return Err(Sense::invalid_field_in_parameter_list(pos as u16, Some(6)));
        }
        let plen = p[pos + 1] as usize + 2;
        if pos + plen > len {
            return Err(sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let given = &p[pos..pos + plen];
        let (Some(current), Some(mask)) = (
            page(code, Pc::Current, &new),
            page(code, Pc::Changeable, &new),
        ) else {
            return Err(Sense::invalid_field_in_parameter_list(pos as u16, Some(5)));
        };
        if plen != current.len() {
            return Err(Sense::invalid_field_in_parameter_list(pos as u16 + 1, None));
        }
        for i in 2..plen {
            let diff = (given[i] ^ current[i]) & !mask[i];
            if diff != 0 {
                let bit = 7 - diff.leading_zeros() as u8;
                return Err(Sense::invalid_field_in_parameter_list(
                    (pos + i) as u16,
                    Some(bit),
                ));
            }
        }
        match code {
            PAGE_CACHING => {
                new.wce = given[2] & 0x04 != 0;
                new.rcd = given[2] & 0x01 != 0;
            }
            PAGE_CONTROL => new.swp = given[4] & 0x08 != 0,
            _ => {}
        }
        pos += plen;
    }
    Ok(new)
}
