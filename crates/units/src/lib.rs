//! The one way Reservoir reads and writes sizes, rates, durations and probabilities, on every
//! command line (`rsv cp`/`bench`/`tune`/`mount` and their URL options, the bench's `rsv-lab`)
//! and in the target's config, so that the same words mean the same thing everywhere.
//!
//! **Sizes** are read as `qemu-img`, `dd` and `truncate` read them: a bare number is bytes
//! (`4096`, or `4096B`); `K`/`k`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` are powers of 1024;
//! `KB`/`kB`, `MB`, `GB`, `TB` are powers of 1000 (as GNU `dd` and `truncate`). A fraction is
//! fine when it comes to whole bytes (`1.5G`), not otherwise (`0.3`). A lowercase `b` after a
//! prefix (`1mb`, `64kib`) is refused: it reads as bits to some and as bytes to others.
//!
//! **Rates** are written as `tc` writes them: `100mbit`, `1gbit`, `512kbit`, `1.5Gbit`, `bit`,
//! `tbit`, and the IEC `kibit`, `mibit`, `gibit`, `tibit` (any case, `/s` optional). Bytes per
//! second always carry `/s` and an uppercase `B`: `12MB/s`, `1.25GB/s` (powers of 1000),
//! `10MiB/s` (powers of 1024), `B/s`. A bare number is refused (a bit rate to `tc` and the
//! emulator, a byte rate to the initiator's old options), and so are `tc`'s own `bps`, `kbps`,
//! `mbps`, `gbps`: bytes per second to `tc`, bits to almost everyone else. Where a setting
//! allows no limit ([`parse_rate_limit`]) `0`, `none` and `unlimited` say so.
//!
//! **Durations** need a unit: `ns`, `us` (or `µs`), `ms`, `s`; only `0` may stand alone, since
//! a bare number is milliseconds to some tools and seconds to others.
//!
//! **Probabilities** are a percentage (`0.1%`) or a fraction (`0.001`).
//!
//! Everything printed uses these spellings ([`Size`], [`Rate`], [`format_duration`],
//! [`format_probability`]), exactly, so that output can be pasted back as input. Where a
//! person reads a measured or arbitrary amount at a glance (a file's size, a copy's rate),
//! [`Size::approx`] and [`Rate::approx`] round it to three significant digits in the same
//! spellings (`1.46GiB`, `95.3mbit`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

/// A value that could not be read, with what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {what} {input:?}: {why}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    why: String,
}

impl ParseError {
    /// For parsers built on these (a list of probabilities, say) that find fault of their own.
    pub fn new(what: &'static str, input: &str, why: impl Into<String>) -> ParseError {
        ParseError {
            what,
            input: input.to_owned(),
            why: why.into(),
        }
    }
}

const SIZE: &str = "size";
const RATE: &str = "rate";
const DURATION: &str = "duration";
const PROBABILITY: &str = "probability";

const SIZE_UNITS: &str = "say bytes (4096), K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) \
                          or KB, MB, GB, TB (powers of 1000)";
const RATE_UNITS: &str = "bits per second are bit, kbit, mbit, gbit, tbit (or kibit, mibit, \
                          gibit, tibit); bytes per second B/s, KB/s, MB/s, GB/s, TB/s (or \
                          KiB/s, MiB/s, GiB/s, TiB/s)";
const BARE_RATE: &str = "say bits or bytes per second, e.g. 100mbit or 12.5MB/s";

/// A decimal number read exactly: `mantissa / 10^decimals`.
struct Decimal {
    mantissa: u128,
    decimals: u32,
}

impl Decimal {
    /// `mantissa × numerator / 10^decimals`, when that is a whole number within a u64.
    fn times(&self, numerator: u128) -> Result<u64, Inexact> {
        let n = self
            .mantissa
            .checked_mul(numerator)
            .ok_or(Inexact::TooLarge)?;
        let d = 10u128.pow(self.decimals);
        if n % d != 0 {
            return Err(Inexact::Fraction);
        }
        u64::try_from(n / d).map_err(|_| Inexact::TooLarge)
    }

    fn is_zero(&self) -> bool {
        self.mantissa == 0
    }
}

enum Inexact {
    Fraction,
    TooLarge,
}

/// Splits `"1.25 MB"` into the number and the unit (`"MB"`, trimmed).
fn split(s: &str) -> Option<(Decimal, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || (num.contains('.') && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    // 10^30 and beyond is no size, rate or duration anyone means; it also keeps the
    // arithmetic within a u128.
    if int.len() + frac.len() > 30 {
        return None;
    }
    let mantissa = format!("{int}{frac}").parse().ok()?;
    Some((
        Decimal {
            mantissa,
            decimals: frac.len() as u32,
        },
        unit.trim(),
    ))
}

/// The power of a metric prefix letter (`k` 1 .. `t` 4), in either case.
fn prefix_power(c: char) -> Option<u32> {
    match c.to_ascii_lowercase() {
        'k' => Some(1),
        'm' => Some(2),
        'g' => Some(3),
        't' => Some(4),
        _ => None,
    }
}

/// Bytes per unit of a size unit; `Err` says what is wrong with the unit.
fn size_unit(unit: &str) -> Result<u128, String> {
    if unit.is_empty() || unit == "B" {
        return Ok(1);
    }
    if unit == "b" {
        return Err(
            "a lowercase b reads as bits to some, as 512-byte blocks to dd: \
                    say bytes as a bare number or with B"
                .into(),
        );
    }
    let mut chars = unit.chars();
    let Some(power) = chars.next().and_then(prefix_power) else {
        return Err(format!("unknown unit {unit:?}; {SIZE_UNITS}"));
    };
    match chars.as_str() {
        "" | "iB" | "IB" => Ok(1024u128.pow(power)),
        "B" => Ok(1000u128.pow(power)),
        "b" | "ib" | "Ib" => Err(format!(
            "a lowercase b reads as bits to some, as bytes to others: say {p} or {p}iB for \
             powers of 1024, {p}B for powers of 1000",
            p = unit[..1].to_ascii_uppercase()
        )),
        _ => Err(format!("unknown unit {unit:?}; {SIZE_UNITS}")),
    }
}

/// A size in bytes: `4096`, `64K`, `1.5GiB`, `10MB` (see the crate's documentation).
pub fn parse_size(s: &str) -> Result<u64, ParseError> {
    let (n, unit) = split(s).ok_or_else(|| {
        ParseError::new(
            SIZE,
            s,
            "expected a number of bytes, e.g. 4096, 64K or 1.5GiB",
        )
    })?;
    let per = size_unit(unit).map_err(|why| ParseError::new(SIZE, s, why))?;
    n.times(per).map_err(|e| match e {
        Inexact::Fraction => ParseError::new(SIZE, s, "not a whole number of bytes"),
        Inexact::TooLarge => ParseError::new(SIZE, s, "too large (at most 16 EiB)"),
    })
}

/// The power-of-1024 size units, largest first.
const BINARY: &[(u64, &str)] = &[
    (1 << 40, "TiB"),
    (1 << 30, "GiB"),
    (1 << 20, "MiB"),
    (1 << 10, "KiB"),
];

/// The rate units above `bit`, as `tc` writes them, largest first.
const BITS: &[(u64, &str)] = &[
    (1_000_000_000_000, "tbit"),
    (1_000_000_000, "gbit"),
    (1_000_000, "mbit"),
    (1_000, "kbit"),
];

/// A size in bytes that prints as it would be written: the largest power-of-1024 unit that
/// holds it exactly (`1GiB`, `1536MiB`), else powers of 1000 (`1250KB`), else `B`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Size, ParseError> {
        parse_size(s).map(Size)
    }
}

impl Size {
    /// The size for people, rounded: three significant digits in the largest
    /// power-of-1024 unit it reaches (`1.46GiB`, `12.3MiB`, `512KiB`, `999B`), trailing
    /// zeros dropped, so that a whole number of a unit prints as [`Size`] prints it.
    pub fn approx(self) -> String {
        rounded(self.0, 1024, BINARY, "B")
    }
}

/// `n` to three significant digits in the largest of `units` (largest first, each
/// `(per, name)`, each `base` times the next) that it reaches, else whole `base_unit`s.
fn rounded(n: u64, base: u64, units: &[(u64, &'static str)], base_unit: &str) -> String {
    let Some(i) = units.iter().position(|&(per, _)| n >= per) else {
        return format!("{n}{base_unit}");
    };
    let (per, name) = units[i];
    let v = n as f64 / per as f64;
    let text = match v {
        v if v < 10.0 => format!("{v:.2}"),
        v if v < 100.0 => format!("{v:.1}"),
        v => format!("{v:.0}"),
    };
    // Rounding up may reach the next unit (1023.7KiB is 1MiB, not 1024KiB).
    if i > 0 && text.parse::<f64>().is_ok_and(|r| r >= base as f64) {
        return rounded(units[i - 1].0, base, units, base_unit);
    }
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text}{name}")
}

/// The largest of `units` (largest first, each `(per, name)`) that divides `n`.
fn exact_unit(n: u64, units: &[(u64, &'static str)]) -> Option<(u64, &'static str)> {
    units
        .iter()
        .find(|(per, _)| n % per == 0)
        .map(|&(per, name)| (n / per, name))
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const DECIMAL: &[(u64, &str)] = &[
            (1_000_000_000_000, "TB"),
            (1_000_000_000, "GB"),
            (1_000_000, "MB"),
            (1_000, "KB"),
        ];
        let (n, unit) = match self.0 {
            0 => (0, "B"),
            b => exact_unit(b, BINARY)
                .or_else(|| exact_unit(b, DECIMAL))
                .unwrap_or((b, "B")),
        };
        f.pad(&format!("{n}{unit}"))
    }
}

/// A data rate, kept in bits per second (as `tc` and link speeds count); never zero when read
/// from text, since zero is how "no limit" is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate {
    bits_per_sec: u64,
}

impl Rate {
    pub const fn from_bits_per_sec(bits: u64) -> Rate {
        Rate { bits_per_sec: bits }
    }

    /// Saturates at the largest rate a u64 of bits per second holds.
    pub const fn from_bytes_per_sec(bytes: u64) -> Rate {
        Rate {
            bits_per_sec: bytes.saturating_mul(8),
        }
    }

    pub const fn bits_per_sec(self) -> u64 {
        self.bits_per_sec
    }

    /// Rounded down: a limit in whole bytes never exceeds the rate asked for.
    pub const fn bytes_per_sec(self) -> u64 {
        self.bits_per_sec / 8
    }

    /// A measured rate: `bytes` over `seconds` (none over no time).
    pub fn measured(bytes: u64, seconds: f64) -> Rate {
        if seconds > 0.0 {
            // `as` saturates: a rate past u64's bits per second prints as the largest.
            Rate::from_bits_per_sec((bytes as f64 * 8.0 / seconds) as u64)
        } else {
            Rate::from_bits_per_sec(0)
        }
    }

    /// The rate for people, rounded: three significant digits in the largest of `tbit`,
    /// `gbit`, `mbit`, `kbit` it reaches (`95.3mbit`, `1.25gbit`, `100mbit`, `900bit`),
    /// trailing zeros dropped, so that a whole number of a unit prints as [`Rate`] prints it.
    pub fn approx(self) -> String {
        rounded(self.bits_per_sec, 1000, BITS, "bit")
    }
}

/// The advice for a rate whose unit could be read as bits or as bytes: `num` with `prefix`
/// (`k`, `Mi`, ...) spelled both ways.
fn say_bits_or_bytes(num: &str, prefix: &str) -> String {
    let bytes = match prefix.strip_suffix(['i', 'I']) {
        Some(p) => format!("{}iB", p.to_ascii_uppercase()),
        None => format!("{}B", prefix.to_ascii_uppercase()),
    };
    format!(
        "say {num}{}bit for bits or {num}{bytes}/s for bytes per second",
        prefix.to_ascii_lowercase()
    )
}

/// What a rate's text came to: a rate, or "no limit".
fn read_rate(s: &str) -> Result<Option<Rate>, ParseError> {
    let err = |why: &str| ParseError::new(RATE, s, why);
    if matches!(s.trim().to_ascii_lowercase().as_str(), "unlimited" | "none") {
        return Ok(None);
    }
    let (n, unit) = split(s).ok_or_else(|| err(&format!("expected a number; {BARE_RATE}")))?;
    if unit.is_empty() {
        return if n.is_zero() {
            Ok(None)
        } else {
            Err(err(BARE_RATE))
        };
    }
    let num = s.trim().strip_suffix(unit).unwrap_or_default().trim_end();
    let lower = unit.to_ascii_lowercase();
    if let Some(p) = unit
        .strip_suffix(['s', 'S'])
        .and_then(|u| u.strip_suffix(['p', 'P']))
    {
        if let Some(p) = p.strip_suffix(['b', 'B']) {
            return Err(err(&format!(
                "tc reads {lower} as bytes per second, most people as bits: {}",
                say_bits_or_bytes(num, p)
            )));
        }
    }
    let bits_per_unit: u128 = if let Some(bits) = lower
        .strip_suffix("/s")
        .unwrap_or(&lower)
        .strip_suffix("bit")
    {
        let mut chars = bits.chars();
        let power = match chars.next() {
            None => Some(0),
            Some(c) => prefix_power(c),
        };
        match (power, chars.as_str()) {
            (Some(0), "") => 1,
            (Some(p), "") => 1000u128.pow(p),
            (Some(p), "i") if p > 0 => 1024u128.pow(p),
            _ => return Err(err(&format!("unknown unit {unit:?}; {RATE_UNITS}"))),
        }
    } else if let Some(bytes) = unit.strip_suffix("/s") {
        match bytes.trim_end() {
            "B" => 8,
            b if b.ends_with('B') && b.len() > 1 => {
                8 * size_unit(b)
                    .map_err(|_| err(&format!("unknown unit {unit:?}; {RATE_UNITS}")))?
            }
            b if b.ends_with('b') => {
                return Err(err(&format!(
                    "{unit} reads as bits to some, as bytes to others: {}",
                    say_bits_or_bytes(num, &b[..b.len() - 1])
                )));
            }
            _ => return Err(err(&format!("unknown unit {unit:?}; {RATE_UNITS}"))),
        }
    } else if lower.len() == 1 && prefix_power(lower.chars().next().unwrap_or(' ')).is_some() {
        return Err(err(&say_bits_or_bytes(num, unit)));
    } else {
        return Err(err(&format!("unknown unit {unit:?}; {RATE_UNITS}")));
    };
    match n.times(bits_per_unit) {
        Ok(0) => Ok(None),
        Ok(bits) => Ok(Some(Rate::from_bits_per_sec(bits))),
        Err(Inexact::Fraction) => Err(err("not a whole number of bits per second")),
        Err(Inexact::TooLarge) => Err(err("too fast to count in bits per second")),
    }
}

/// A rate where a rate is required: `100mbit`, `12.5MB/s` (see the crate's documentation).
/// "No limit" (`0`, `none`, `unlimited`) is refused.
pub fn parse_rate(s: &str) -> Result<Rate, ParseError> {
    read_rate(s)?.ok_or_else(|| {
        ParseError::new(
            RATE,
            s,
            "this setting needs a rate, not \"no limit\"; e.g. 100mbit or 12.5MB/s",
        )
    })
}

/// A rate where "no limit" is allowed: `None` for `0` (in any unit), `none` or `unlimited`.
pub fn parse_rate_limit(s: &str) -> Result<Option<Rate>, ParseError> {
    read_rate(s)
}

impl FromStr for Rate {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Rate, ParseError> {
        parse_rate(s)
    }
}

/// As `tc` writes rates: the largest of `tbit`, `gbit`, `mbit`, `kbit` that holds it exactly,
/// else `bit`.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, unit) = match self.bits_per_sec {
            0 => (0, "bit"),
            b => exact_unit(b, BITS).unwrap_or((b, "bit")),
        };
        f.pad(&format!("{n}{unit}"))
    }
}

/// A duration: `100ms`, `1.5s`, `250us`, `20000ns`; `0` alone, anything else with its unit.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let err = |why: &str| ParseError::new(DURATION, s, why);
    let (n, unit) = split(s).ok_or_else(|| err("expected a number and a unit, e.g. 100ms"))?;
    let ns_per_unit: u128 = match unit.to_ascii_lowercase().as_str() {
        "" if n.is_zero() => 1,
        "" => {
            return Err(err(
                "say ms or s (a bare number is milliseconds to some tools, seconds to others)",
            ))
        }
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" => 1_000_000_000,
        _ => return Err(err("unit must be ns, us, ms or s")),
    };
    match n.times(ns_per_unit) {
        Ok(ns) => Ok(Duration::from_nanos(ns)),
        Err(Inexact::Fraction) => Err(err("finer than a nanosecond")),
        Err(Inexact::TooLarge) => Err(err("too long")),
    }
}

/// A duration as [`parse_duration`] reads it: the largest of `s`, `ms`, `us`, `ns` that holds
/// it exactly (`100ms`, `1500us`).
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0ms".into();
    }
    let (per, unit) = [
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ]
    .into_iter()
    .find(|(per, _)| ns % per == 0)
    .unwrap_or((1, "ns"));
    format!("{}{unit}", ns / per)
}

/// An age for people, in its two largest units: `42s`, `3m07s`, `2h05m`, `3d04h`.
pub fn format_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// A probability: `0.1%` or the fraction `0.001`; within [0, 1].
pub fn parse_probability(s: &str) -> Result<f64, ParseError> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 0.01),
        None => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| ParseError::new(PROBABILITY, s, "expected 0.1% or 0.001"))?;
    let p = v * scale;
    if !(0.0..=1.0).contains(&p) {
        return Err(ParseError::new(
            PROBABILITY,
            s,
            "must lie between 0 and 100%",
        ));
    }
    Ok(p)
}

/// A probability as a percentage, to six decimals of a percent (`0.1%`).
pub fn format_probability(p: f64) -> String {
    format!("{}%", (p * 100.0 * 1e6).round() / 1e6)
}
