//! The crash checker's bookkeeping, sans-IO: how a unit of the LUN is stamped, what the
//! checker knows about each unit (the last write known durable and the writes issued
//! since), and the verdict on what a unit holds after a crash.
//!
//! A write is durable once it was acknowledged with FUA, or acknowledged before a
//! SYNCHRONIZE CACHE was issued that was acknowledged in turn. Every unit is written by
//! one writer, one command at a time, with a generation never used before, so after a
//! crash a unit may hold its durable generation, any generation issued to it since (landed
//! or not, acknowledged or not), or nothing if none was durable yet; anything else is a
//! loss (an older generation, or nothing, where a durable one was) or a phantom (bytes
//! never written there: another unit's stamp, a generation never issued to it, a torn or
//! garbled unit).

use std::collections::BTreeSet;

/// Bytes of one stamped unit.
pub const UNIT: usize = 4096;
const MAGIC: &[u8; 8] = b"RSVCRASH";

/// Fills `buf` (one unit) with the stamp of `unit` at generation `gen` for run `run`:
/// magic, unit, generation, run, bytes derived from them, CRC32C of all that at the end.
pub fn stamp(buf: &mut [u8], run: u64, unit: u64, gen: u64) {
    assert_eq!(buf.len(), UNIT);
    buf[0..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&unit.to_le_bytes());
    buf[16..24].copy_from_slice(&gen.to_le_bytes());
    buf[24..32].copy_from_slice(&run.to_le_bytes());
    // xorshift from the header, so that a unit's body differs between generations too.
    let mut x = unit.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ gen ^ run.rotate_left(17) | 1;
    for chunk in buf[32..UNIT - 4].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let crc = crc32c::crc32c(&buf[..UNIT - 4]);
    buf[UNIT - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// What a unit read back holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// All zeros: never written.
    Empty,
    /// A whole stamp.
    Stamp { run: u64, unit: u64, gen: u64 },
    /// Anything else: torn, garbled, foreign.
    Garbage,
}

pub fn parse(buf: &[u8]) -> Found {
    if buf.len() != UNIT {
        return Found::Garbage;
    }
    if buf.iter().all(|&b| b == 0) {
        return Found::Empty;
    }
    let crc = u32::from_le_bytes(buf[UNIT - 4..].try_into().unwrap());
    if &buf[0..8] != MAGIC || crc32c::crc32c(&buf[..UNIT - 4]) != crc {
        return Found::Garbage;
    }
    let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
    let (unit, gen, run) = (word(8), word(16), word(24));
    // The body must be the one the header implies (the CRC covers it, but a stamp copied
    // whole from elsewhere would pass the CRC).
    let mut again = vec![0u8; UNIT];
    stamp(&mut again, run, unit, gen);
    if again != buf {
        return Found::Garbage;
    }
    Found::Stamp { run, unit, gen }
}

/// The verdict on one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// A durable write is not there: `found` is an older generation (0: nothing).
    Lost {
        durable: u64,
        found: u64,
    },
    /// Bytes never written to this unit.
    Phantom(Found),
}

#[derive(Debug, Clone, Default)]
struct UnitState {
    /// The last durable generation; 0: none (the unit may read as zeros).
    durable: u64,
    /// Generations issued since, acknowledged or not.
    since: BTreeSet<u64>,
    /// Garbage found and reported already: not reported again until overwritten.
    garbage: bool,
}

/// What the checker knows about every unit of the LUN, in one run.
#[derive(Debug, Clone)]
pub struct Model {
    run: u64,
    units: Vec<UnitState>,
}

impl Model {
    pub fn new(run: u64, units: u64) -> Model {
        Model {
            run,
            units: vec![UnitState::default(); units as usize],
        }
    }

    pub fn run(&self) -> u64 {
        self.run
    }

    pub fn units(&self) -> u64 {
        self.units.len() as u64
    }

    /// A write of `gen` to `units` is about to be sent.
    pub fn issue(&mut self, units: std::ops::Range<u64>, gen: u64) {
        for u in units {
            self.units[u as usize].since.insert(gen);
        }
    }

    /// `gen` on `units` is durable (acknowledged with FUA, or followed by an acknowledged
    /// SYNCHRONIZE CACHE).
    pub fn durable(&mut self, units: std::ops::Range<u64>, gen: u64) {
        for u in units {
            let s = &mut self.units[u as usize];
            if gen > s.durable {
                s.durable = gen;
                s.since = s.since.split_off(&(gen + 1));
            }
        }
    }

    /// The durable generation of `unit` (0: none).
    pub fn durable_gen(&self, unit: u64) -> u64 {
        self.units[unit as usize].durable
    }

    pub fn verdict(&self, unit: u64, found: Found) -> Verdict {
        let s = &self.units[unit as usize];
        match found {
            Found::Empty if s.durable == 0 => Verdict::Ok,
            Found::Garbage if s.garbage && s.durable == 0 => Verdict::Ok,
            Found::Empty => Verdict::Lost {
                durable: s.durable,
                found: 0,
            },
            Found::Stamp { run, unit: u, gen } if run == self.run && u == unit => {
                if gen == s.durable || s.since.contains(&gen) {
                    Verdict::Ok
                } else if gen < s.durable {
                    Verdict::Lost {
                        durable: s.durable,
                        found: gen,
                    }
                } else {
                    Verdict::Phantom(found)
                }
            }
            _ => Verdict::Phantom(found),
        }
    }

    /// After a verified round and a SYNCHRONIZE CACHE: what the unit holds is durable and
    /// the only thing it may hold.
    pub fn settle(&mut self, unit: u64, found: Found) {
        let s = &mut self.units[unit as usize];
        s.since.clear();
        s.garbage = found == Found::Garbage;
        s.durable = match found {
            Found::Stamp { gen, .. } => gen,
            _ => 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(run: u64, unit: u64, gen: u64) -> Vec<u8> {
        let mut b = vec![0u8; UNIT];
        stamp(&mut b, run, unit, gen);
        b
    }

    #[test]
    fn stamps_parse_back_and_damage_is_garbage() {
        let b = stamped(7, 3, 99);
        assert_eq!(
            parse(&b),
            Found::Stamp {
                run: 7,
                unit: 3,
                gen: 99
            }
        );
        assert_eq!(parse(&[0u8; UNIT]), Found::Empty);
        let mut torn = b.clone();
        torn[2048..].copy_from_slice(&stamped(7, 3, 100)[2048..]);
        assert_eq!(parse(&torn), Found::Garbage);
        let mut flipped = b.clone();
        flipped[100] ^= 1;
        assert_eq!(parse(&flipped), Found::Garbage);
        let mut half_zero = b;
        half_zero[512..].fill(0);
        assert_eq!(parse(&half_zero), Found::Garbage);
    }

    #[test]
    fn verdicts() {
        let mut m = Model::new(1, 4);
        let st = |unit, gen| Found::Stamp { run: 1, unit, gen };
        // Nothing durable yet: zeros and anything issued are fine.
        assert_eq!(m.verdict(0, Found::Empty), Verdict::Ok);
        m.issue(0..2, 5);
        assert_eq!(m.verdict(0, st(0, 5)), Verdict::Ok);
        assert_eq!(m.verdict(0, st(0, 6)), Verdict::Phantom(st(0, 6)));
        assert_eq!(m.verdict(0, st(1, 5)), Verdict::Phantom(st(1, 5)));
        assert_eq!(
            m.verdict(
                0,
                Found::Stamp {
                    run: 2,
                    unit: 0,
                    gen: 5
                }
            ),
            Verdict::Phantom(Found::Stamp {
                run: 2,
                unit: 0,
                gen: 5
            })
        );
        // Durable: zeros and older generations are losses, later issued ones fine.
        m.durable(0..2, 5);
        m.issue(0..1, 8);
        assert_eq!(
            m.verdict(0, Found::Empty),
            Verdict::Lost {
                durable: 5,
                found: 0
            }
        );
        assert_eq!(m.verdict(0, st(0, 5)), Verdict::Ok);
        assert_eq!(m.verdict(0, st(0, 8)), Verdict::Ok);
        assert_eq!(m.verdict(1, st(1, 8)), Verdict::Phantom(st(1, 8)));
        m.issue(0..1, 9);
        m.durable(0..1, 9);
        assert_eq!(
            m.verdict(0, st(0, 8)),
            Verdict::Lost {
                durable: 9,
                found: 8
            }
        );
        assert_eq!(
            m.verdict(0, Found::Garbage),
            Verdict::Phantom(Found::Garbage)
        );
        // An older durable mark changes nothing.
        m.durable(0..1, 8);
        assert_eq!(m.durable_gen(0), 9);
        m.settle(0, st(0, 9));
        assert_eq!(m.verdict(0, st(0, 9)), Verdict::Ok);
        m.settle(2, Found::Empty);
        assert_eq!(m.verdict(2, Found::Empty), Verdict::Ok);
        // Garbage is reported once, until the unit is written again.
        m.settle(3, Found::Garbage);
        assert_eq!(m.verdict(3, Found::Garbage), Verdict::Ok);
        m.issue(3..4, 20);
        m.durable(3..4, 20);
        assert_eq!(
            m.verdict(3, Found::Garbage),
            Verdict::Phantom(Found::Garbage)
        );
    }
}
