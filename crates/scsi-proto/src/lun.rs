//! The 8-byte LUN field (SAM-5 4.7): single-level LUNs, as REPORT LUNS lists them and
//! iSCSI's PDUs carry them.

/// SAM LUN encoding of `lun` for the 8-byte LUN field: peripheral device addressing below
/// 256, flat space addressing below 16384, extended flat space addressing above.
pub fn to_wire(lun: u16) -> u64 {
    let lun = u64::from(lun);
    if lun < 256 {
        lun << 48
    } else if lun < 0x4000 {
        (0x4000 | lun) << 48
    } else {
        (0xd2 << 56) | (lun << 32)
    }
}

/// The single-level LUN in an 8-byte LUN field, if it is one [`to_wire`] can express
/// (peripheral with bus 0, flat space, or extended flat space addressing).
pub fn from_wire(raw: u64) -> Option<u16> {
    let b = raw.to_be_bytes();
    match b[0] >> 6 {
        0b00 if b[0] == 0 && raw & 0x0000_ffff_ffff_ffff == 0 => Some(u16::from(b[1])),
        0b01 if raw & 0x0000_ffff_ffff_ffff == 0 => Some(u16::from_be_bytes([b[0] & 0x3f, b[1]])),
        0b11 if b[0] == 0xd2 && b[1] == 0 && raw & 0xffff_ffff == 0 => {
            Some(u16::from_be_bytes([b[2], b[3]]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings() {
        assert_eq!(to_wire(0), 0);
        assert_eq!(to_wire(5), 0x0005_0000_0000_0000);
        assert_eq!(to_wire(300), 0x412c_0000_0000_0000);
        assert_eq!(to_wire(0x3fff), 0x7fff_0000_0000_0000);
        assert_eq!(to_wire(0x4000), 0xd200_4000_0000_0000);
        for lun in [0, 1, 255, 256, 0x3fff, 0x4000, u16::MAX] {
            assert_eq!(from_wire(to_wire(lun)), Some(lun));
        }
        assert_eq!(from_wire(0x0105_0000_0000_0000), None, "bus 1");
        assert_eq!(from_wire(0x0005_0001_0000_0000), None, "second level");
        assert_eq!(
            from_wire(0x8000_0000_0000_0000),
            None,
            "logical unit addressing"
        );
        assert_eq!(from_wire(0xd201_0000_0000_0000), None, "beyond u16");
    }
}
