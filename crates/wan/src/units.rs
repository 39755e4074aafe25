//! Parsing and printing of the quantities on the command line, in the spellings `tc` uses:
//! durations (`100ms`), bit rates (`100mbit`), probabilities (`0.1%`) and sizes (`1.25MB`).

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid {what} {input:?}: {why}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    why: &'static str,
}

pub(crate) fn err(what: &'static str, input: &str, why: &'static str) -> ParseError {
    ParseError {
        what,
        input: input.to_string(),
        why,
    }
}

/// Splits `"1.25MB"` into `(1.25, "MB")`.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let value: f64 = num.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value, unit.trim()))
}

/// A duration in nanoseconds: `100ms`, `1.5s`, `250us`, `20000ns`; a bare number is milliseconds.
pub fn parse_duration(s: &str) -> Result<u64, ParseError> {
    const WHAT: &str = "duration";
    let (v, unit) = split_number(s).ok_or_else(|| err(WHAT, s, "expected a number and a unit"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "" | "ms" => 1e6,
        "s" | "sec" => 1e9,
        _ => return Err(err(WHAT, s, "unit must be ns, us, ms or s")),
    };
    let ns = v * scale;
    if ns > 3600e9 {
        return Err(err(WHAT, s, "longer than an hour"));
    }
    Ok(ns.round() as u64)
}

/// A bit rate in bit/s, `tc` style: `100mbit`, `1gbit`, `512kbit`, `1.5Gbit`; `bps`, `kbps`,
/// `mbps`, `gbps` are bytes per second as in `tc`; a bare number is bit/s. `0` and
/// `unlimited` mean no rate limit and give 0.
pub fn parse_rate(s: &str) -> Result<u64, ParseError> {
    const WHAT: &str = "rate";
    if s.trim().eq_ignore_ascii_case("unlimited") {
        return Ok(0);
    }
    let (v, unit) = split_number(s).ok_or_else(|| err(WHAT, s, "expected a number and a unit"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "bit" => 1.0,
        "k" | "kbit" => 1e3,
        "m" | "mbit" => 1e6,
        "g" | "gbit" => 1e9,
        "t" | "tbit" => 1e12,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => {
            return Err(err(
                WHAT,
                s,
                "unit must be bit, kbit, mbit, gbit (or tc's bps, mbps: bytes)",
            ))
        }
    };
    let bits = v * scale;
    if bits > 1e13 {
        return Err(err(WHAT, s, "faster than 10 Tbit/s"));
    }
    Ok(bits.round() as u64)
}

/// A probability: `0.1%` or a fraction `0.001`; must lie in [0, 1].
pub fn parse_probability(s: &str) -> Result<f64, ParseError> {
    const WHAT: &str = "probability";
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 0.01),
        None => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| err(WHAT, s, "expected 0.1% or 0.001"))?;
    let p = v * scale;
    if !(0.0..=1.0).contains(&p) {
        return Err(err(WHAT, s, "must lie between 0 and 100%"));
    }
    Ok(p)
}

/// A size in bytes: `1.25MB` (decimal, `kB`/`KB` = 1000), `64KiB` (binary), `1500B` or `1500`.
pub fn parse_size(s: &str) -> Result<u64, ParseError> {
    const WHAT: &str = "size";
    let (v, unit) = split_number(s).ok_or_else(|| err(WHAT, s, "expected a number and a unit"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(err(WHAT, s, "unit must be B, KB, MB, GB, KiB, MiB or GiB")),
    };
    let bytes = v * scale;
    if bytes > 1e12 {
        return Err(err(WHAT, s, "larger than 1 TB"));
    }
    Ok(bytes.round() as u64)
}

pub fn fmt_duration(ns: u64) -> String {
    if ns == 0 {
        "0ms".into()
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns >= 1_000_000 {
        format!("{:.3}ms", ns as f64 / 1e6)
    } else {
        format!("{:.1}us", ns as f64 / 1e3)
    }
}

pub fn fmt_rate(bps: u64) -> String {
    match bps {
        0 => "unlimited".into(),
        b if b % 1_000_000_000 == 0 => format!("{}gbit", b / 1_000_000_000),
        b if b % 1_000_000 == 0 => format!("{}mbit", b / 1_000_000),
        b if b % 1_000 == 0 => format!("{}kbit", b / 1_000),
        b => format!("{b}bit"),
    }
}

pub fn fmt_size(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.3}MB", bytes as f64 / 1e6)
    } else if bytes >= 10_000 {
        format!("{:.1}KB", bytes as f64 / 1e3)
    } else {
        format!("{bytes}B")
    }
}

pub fn fmt_probability(p: f64) -> String {
    format!("{}%", (p * 100.0 * 1e6).round() / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(100_000_000));
        assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration("250us"), Ok(250_000));
        assert_eq!(parse_duration("20"), Ok(20_000_000));
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration(" 7ns "), Ok(7));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-3ms").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("2h").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("1Gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("1.5gbit"), Ok(1_500_000_000));
        assert_eq!(parse_rate("512kbit"), Ok(512_000));
        assert_eq!(parse_rate("10mbps"), Ok(80_000_000));
        assert_eq!(parse_rate("9600"), Ok(9600));
        assert_eq!(parse_rate("unlimited"), Ok(0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("100furlongs").is_err());
    }

    #[test]
    fn probabilities() {
        assert!((parse_probability("0.1%").unwrap() - 0.001).abs() < 1e-15);
        assert_eq!(parse_probability("100%"), Ok(1.0));
        assert_eq!(parse_probability("0"), Ok(0.0));
        assert_eq!(parse_probability("0.25"), Ok(0.25));
        assert!(parse_probability("101%").is_err());
        assert!(parse_probability("1.5").is_err());
        assert!(parse_probability("-1%").is_err());
        assert!(parse_probability("lots").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1.25MB"), Ok(1_250_000));
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("64kB"), Ok(64_000));
        assert_eq!(parse_size("1500B"), Ok(1500));
        assert_eq!(parse_size("1500"), Ok(1500));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("1.2.3MB").is_err());
        assert!(parse_size("3 bananas").is_err());
    }

    #[test]
    fn printing_round_trips() {
        for s in ["100ms", "1gbit", "250mbit", "0.1%"] {
            let printed = if s.ends_with('%') {
                fmt_probability(parse_probability(s).unwrap())
            } else if s.ends_with("bit") {
                fmt_rate(parse_rate(s).unwrap())
            } else {
                fmt_duration(parse_duration(s).unwrap())
            };
            assert_eq!(printed, s);
        }
        assert_eq!(fmt_size(1_250_000), "1.250MB");
    }
}
