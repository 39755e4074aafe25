//! Every spelling the old parsers took, and what it comes to now: the documented value, or
//! an error that says what to write instead.

use std::time::Duration;

use units::{
    format_duration, format_probability, parse_duration, parse_probability, parse_rate,
    parse_rate_limit, parse_size, Rate, Size,
};

/// What a row expects: a value, or an error whose text holds this.
enum Want<T> {
    Is(T),
    Err(&'static str),
}
use Want::{Err as E, Is};

fn check<T: PartialEq + std::fmt::Debug>(
    what: &str,
    rows: &[(&str, Want<T>)],
    parse: impl Fn(&str) -> Result<T, units::ParseError>,
) {
    let mut bad = Vec::new();
    for (input, want) in rows {
        let got = parse(input);
        let ok = match (want, &got) {
            (Is(v), Ok(g)) => v == g,
            (E(sub), Err(e)) => e.to_string().contains(sub),
            _ => false,
        };
        if !ok {
            let want = match want {
                Is(v) => format!("{v:?}"),
                E(sub) => format!("an error with {sub:?}"),
            };
            bad.push(format!("{what} {input:?}: want {want}, got {got:?}"));
        }
    }
    assert!(bad.is_empty(), "\n{}", bad.join("\n"));
}

const KI: u64 = 1 << 10;
const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
const TI: u64 = 1 << 40;

#[test]
fn sizes() {
    check(
        "size",
        &[
            ("0", Is(0)),
            ("4096", Is(4096)),
            (" 4096 ", Is(4096)),
            ("4096B", Is(4096)),
            ("1500", Is(1500)),
            ("64k", Is(64 * KI)),
            ("64K", Is(64 * KI)),
            ("64KiB", Is(64 * KI)),
            ("64kiB", Is(64 * KI)),
            ("64KIB", Is(64 * KI)),
            ("48KiB", Is(48 * KI)),
            ("1m", Is(MI)),
            ("1M", Is(MI)),
            ("1MiB", Is(MI)),
            ("256k", Is(256 * KI)),
            ("1 GiB", Is(GI)),
            ("2g", Is(2 * GI)),
            ("1T", Is(TI)),
            ("1TiB", Is(TI)),
            ("64KB", Is(64_000)),
            ("64kB", Is(64_000)),
            ("10MB", Is(10_000_000)),
            ("1.25MB", Is(1_250_000)),
            ("1GB", Is(1_000_000_000)),
            ("2TB", Is(2_000_000_000_000)),
            ("1.5G", Is(3 * GI / 2)),
            ("1.5M", Is(3 << 19)),
            ("0.5K", Is(512)),
            ("1.000", Is(1)),
            // wan's old parse_size: `1g`/`k` were powers of 1000.
            ("1g", Is(GI)),
            ("100k", Is(100 * KI)),
            // Whole bytes only.
            ("0.3", E("not a whole number of bytes")),
            ("1.5", E("not a whole number of bytes")),
            ("0.1K", E("not a whole number of bytes")),
            ("1.0001KB", E("not a whole number of bytes")),
            // Overflow.
            ("16777216T", E("too large")),
            ("18446744073709551616", E("too large")),
            ("18446744073709551615", Is(u64::MAX)),
            ("99999999999999999999999999999999", E("expected a number")),
            // A lowercase b: bits to some, bytes to others (the initiator's old `64kb`, `1mb`
            // were KiB and MiB; wan's `1500b` was bytes; dd's `b` is 512 bytes).
            ("64kb", E("lowercase b")),
            (
                "1mb",
                E("say M or MiB for powers of 1024, MB for powers of 1000"),
            ),
            ("64kib", E("lowercase b")),
            ("1Mb", E("lowercase b")),
            ("1500b", E("lowercase b")),
            // Not numbers, not units.
            ("", E("expected a number")),
            ("MB", E("expected a number")),
            ("-3", E("expected a number")),
            ("+3", E("expected a number")),
            ("1.2.3MB", E("expected a number")),
            ("1.", E("expected a number")),
            (".5G", E("expected a number")),
            ("3 bananas", E("unknown unit \"bananas\"")),
            ("1P", E("unknown unit")),
            ("1Ki", E("unknown unit")),
            ("1e6", E("unknown unit")),
            ("4 KB/s", E("unknown unit")),
        ],
        parse_size,
    );
}

fn bits(n: u64) -> Option<Rate> {
    Some(Rate::from_bits_per_sec(n))
}

#[test]
fn rates() {
    check(
        "rate",
        &[
            ("100mbit", Is(bits(100_000_000))),
            ("100Mbit", Is(bits(100_000_000))),
            ("100MBIT", Is(bits(100_000_000))),
            ("100mbit/s", Is(bits(100_000_000))),
            (" 100 mbit ", Is(bits(100_000_000))),
            ("1gbit", Is(bits(1_000_000_000))),
            ("1Gbit", Is(bits(1_000_000_000))),
            ("1.5Gbit", Is(bits(1_500_000_000))),
            ("512kbit", Is(bits(512_000))),
            ("9600bit", Is(bits(9600))),
            ("1tbit", Is(bits(1_000_000_000_000))),
            ("1kibit", Is(bits(1024))),
            ("1Kibit", Is(bits(1024))),
            ("2mibit", Is(bits(2 << 20))),
            ("1gibit", Is(bits(1 << 30))),
            ("0.5kbit", Is(bits(500))),
            ("12MB/s", Is(bits(96_000_000))),
            ("12.5MB/s", Is(bits(100_000_000))),
            ("1.25GB/s", Is(bits(10_000_000_000))),
            ("10MiB/s", Is(bits(80 << 20))),
            ("64KB/s", Is(bits(512_000))),
            ("64kB/s", Is(bits(512_000))),
            ("64KiB/s", Is(bits(512 << 10))),
            ("100B/s", Is(bits(800))),
            ("1.5B/s", Is(bits(12))),
            ("12500000B/s", Is(bits(100_000_000))),
            // "No limit", where the caller allows it.
            ("0", Is(None)),
            ("0mbit", Is(None)),
            ("0MB/s", Is(None)),
            ("unlimited", Is(None)),
            ("Unlimited", Is(None)),
            ("none", Is(None)),
            // Bare numbers: bit/s to wan, bytes/s to the initiator before.
            ("100000000", E("invalid rate \"100000000\": say bits or bytes per second, e.g. 100mbit or 12.5MB/s")),
            ("12500000", E("say bits or bytes per second")),
            ("9600", E("say bits or bytes per second")),
            // tc's byte rates that most read as bits.
            ("10mbps", E("tc reads mbps as bytes per second, most people as bits: say 10mbit")),
            ("10Mbps", E("say 10mbit for bits or 10MB/s for bytes per second")),
            ("1gbps", E("say 1gbit for bits or 1GB/s for bytes")),
            ("512kbps", E("tc reads kbps as bytes per second")),
            ("100bps", E("say 100bit for bits or 100B/s for bytes")),
            ("1kibps", E("tc reads kibps as bytes per second, most people as bits: say 1kibit for bits or 1KiB/s")),
            // Prefix alone: both old parsers read `100m` as 100mbit.
            ("100m", E("say 100mbit for bits or 100MB/s for bytes per second")),
            ("8k", E("say 8kbit for bits or 8KB/s")),
            ("1g", E("say 1gbit")),
            ("1T", E("say 1tbit for bits or 1TB/s")),
            // Bytes need /s and an uppercase B.
            ("100Mb/s", E("Mb/s reads as bits to some, as bytes to others: say 100mbit for bits or 100MB/s for bytes per second")),
            ("100mb/s", E("say 100mbit for bits or 100MB/s")),
            ("10Mib/s", E("say 10mibit for bits or 10MiB/s")),
            ("100b/s", E("say 100bit for bits or 100B/s")),
            ("12MB", E("unknown unit \"MB\"")),
            ("12M/s", E("unknown unit")),
            ("12iB/s", E("unknown unit")),
            // Whole bits, no overflow.
            ("1MBps", E("tc reads mbps")),
            ("1.5bit", E("not a whole number of bits")),
            ("0.1B/s", E("not a whole number of bits")),
            ("20000000tbit", E("too fast")),
            ("3000000TB/s", E("too fast")),
            // Neither number nor unit.
            ("", E("expected a number")),
            ("fast", E("expected a number")),
            ("mbit", E("expected a number")),
            ("-1mbit", E("expected a number")),
            ("100furlongs", E("unknown unit \"furlongs\"")),
            ("100pbit", E("unknown unit")),
            ("100kbyte", E("unknown unit")),
        ],
        parse_rate_limit,
    );
}

#[test]
fn rates_where_no_limit_is_refused() {
    for s in ["0", "0mbit", "none", "unlimited"] {
        let e = parse_rate(s).unwrap_err().to_string();
        assert!(e.contains("needs a rate, not \"no limit\""), "{s}: {e}");
    }
    assert_eq!(
        parse_rate("100mbit"),
        Ok(Rate::from_bits_per_sec(100_000_000))
    );
    assert_eq!(
        "1gbit".parse::<Rate>(),
        Ok(Rate::from_bits_per_sec(1_000_000_000))
    );
    assert!(parse_rate("100")
        .unwrap_err()
        .to_string()
        .contains("100mbit or 12.5MB/s"));
}

#[test]
fn rate_units_at_the_call_site() {
    let r = parse_rate("100mbit").unwrap();
    assert_eq!(
        (r.bits_per_sec(), r.bytes_per_sec()),
        (100_000_000, 12_500_000)
    );
    let r = parse_rate("12.5MB/s").unwrap();
    assert_eq!(
        (r.bits_per_sec(), r.bytes_per_sec()),
        (100_000_000, 12_500_000)
    );
    // Bytes are rounded down: a limit never comes out above what was asked.
    assert_eq!(parse_rate("12bit").unwrap().bytes_per_sec(), 1);
    assert_eq!(
        Rate::from_bytes_per_sec(62_500_000).bits_per_sec(),
        500_000_000
    );
    assert_eq!(Rate::from_bytes_per_sec(u64::MAX).bits_per_sec(), u64::MAX);
}

#[test]
fn durations() {
    let ms = Duration::from_millis;
    check(
        "duration",
        &[
            ("100ms", Is(ms(100))),
            ("1.5s", Is(ms(1500))),
            ("2sec", Is(ms(2000))),
            ("250us", Is(Duration::from_micros(250))),
            ("250µs", Is(Duration::from_micros(250))),
            ("20000ns", Is(Duration::from_micros(20))),
            (" 7ns ", Is(Duration::from_nanos(7))),
            ("0", Is(Duration::ZERO)),
            ("0us", Is(Duration::ZERO)),
            ("0.5ns", E("finer than a nanosecond")),
            // wan read a bare number as milliseconds, the initiator's flags as seconds.
            ("20", E("say ms or s")),
            ("ms", E("expected a number")),
            ("-3ms", E("expected a number")),
            ("10 parsecs", E("unit must be ns, us, ms or s")),
            ("2h", E("unit must be")),
            ("100000000000000000000s", E("too long")),
        ],
        parse_duration,
    );
}

#[test]
fn probabilities() {
    assert!((parse_probability("0.1%").unwrap() - 0.001).abs() < 1e-15);
    assert_eq!(parse_probability("100%"), Ok(1.0));
    assert_eq!(parse_probability("0"), Ok(0.0));
    assert_eq!(parse_probability("0.25"), Ok(0.25));
    for bad in ["101%", "1.5", "-1%", "lots"] {
        assert!(parse_probability(bad).is_err(), "{bad}");
    }
}

#[test]
fn printing_reads_back() {
    for (bytes, text) in [
        (0, "0B"),
        (4095, "4095B"),
        (1 << 10, "1KiB"),
        (48 << 10, "48KiB"),
        (1 << 30, "1GiB"),
        (3 << 29, "1536MiB"),
        (1_250_000, "1250KB"),
        (1_000_000, "1MB"),
        (2 * TI, "2TiB"),
        (u64::MAX, "18446744073709551615B"),
    ] {
        assert_eq!(Size(bytes).to_string(), text);
        assert_eq!(text.parse::<Size>(), Ok(Size(bytes)), "{text}");
    }
    for (b, text) in [
        (100_000_000, "100mbit"),
        (1_000_000_000, "1gbit"),
        (62_500_000, "62500kbit"),
        (1_500_000_000, "1500mbit"),
        (9600, "9600bit"),
        (1024, "1024bit"),
        (2_000_000_000_000, "2tbit"),
    ] {
        let r = Rate::from_bits_per_sec(b);
        assert_eq!(r.to_string(), text);
        assert_eq!(text.parse::<Rate>(), Ok(r), "{text}");
    }
    for (d, text) in [
        (Duration::ZERO, "0ms"),
        (Duration::from_millis(100), "100ms"),
        (Duration::from_secs(2), "2s"),
        (Duration::from_micros(1500), "1500us"),
        (Duration::from_nanos(7), "7ns"),
    ] {
        assert_eq!(format_duration(d), text);
        assert_eq!(parse_duration(text), Ok(d), "{text}");
    }
    // Column widths apply, for tables of counters.
    assert_eq!(
        format!("{:>8}|{:<8}|", Size(1 << 20), Rate::from_bits_per_sec(1000)),
        "    1MiB|1kbit   |"
    );
    assert_eq!(format_probability(0.001), "0.1%");
    assert_eq!(parse_probability(&format_probability(0.001)), Ok(0.001));
}

#[test]
fn rounded_for_people() {
    for (bytes, text) in [
        (0, "0B"),
        (999, "999B"),
        (1023, "1023B"),
        (1 << 10, "1KiB"),
        (2048, "2KiB"),
        (1536, "1.5KiB"),
        (512 << 10, "512KiB"),
        (1_500_000, "1.43MiB"),
        (12_900_000, "12.3MiB"),
        (3 << 29, "1.5GiB"),
        (1 << 30, "1GiB"),
        // Rounding up to 1024 of a unit is one of the next.
        ((1 << 20) - 100, "1MiB"),
        (1023 * KI + 1000, "1MiB"),
        (5 * TI, "5TiB"),
        (5000 * TI, "5000TiB"),
        (u64::MAX, "16777216TiB"),
    ] {
        assert_eq!(Size(bytes).approx().to_string(), text, "{bytes}");
    }
    for (bits, text) in [
        (0, "0bit"),
        (999, "999bit"),
        (100_000_000, "100mbit"),
        (95_312_345, "95.3mbit"),
        (1_250_000_000, "1.25gbit"),
        (104_857_600, "105mbit"),
        (999_999_999, "1gbit"),
        (13_000, "13kbit"),
    ] {
        let r = Rate::from_bits_per_sec(bits);
        assert_eq!(r.approx().to_string(), text, "{bits}");
        // Bits are whole at any three digits: the rounded rate reads back.
        assert!(parse_rate_limit(text).is_ok(), "{text} reads back");
    }
    assert_eq!(
        Rate::measured(12_500_000, 1.0),
        Rate::from_bits_per_sec(100_000_000)
    );
    assert_eq!(Rate::measured(1, 0.0), Rate::from_bits_per_sec(0));
    assert_eq!(format!("{:>9}|", Size(3 << 29).approx()), "   1.5GiB|");
}

#[test]
fn sizes_rates_and_ages_print_for_people() {
    let sizes = [
        (0, "0B"),
        (117, "117B"),
        (1023, "1023B"),
        // One rounding for both: whole units print as the exact forms do.
        (1024, "1KiB"),
        (512 << 10, "512KiB"),
        (1_300_000_000, "1.21GiB"),
        (15 << 20, "15MiB"),
        (u64::MAX, "16777216TiB"),
    ];
    for (n, want) in sizes {
        assert_eq!(Size(n).approx(), want, "{n}");
    }
    let rates = [
        (0, "0bit"),
        (999, "999bit"),
        (941_234_000, "941mbit"),
        (1_250_000_000, "1.25gbit"),
    ];
    for (bits, want) in rates {
        assert_eq!(Rate::from_bits_per_sec(bits).approx(), want, "{bits}");
    }
    let ages = [
        (0, "0s"),
        (59, "59s"),
        (187, "3m07s"),
        (7500, "2h05m"),
        (273_600, "3d04h"),
    ];
    for (s, want) in ages {
        assert_eq!(units::format_age(Duration::from_secs(s)), want, "{s}");
    }
}
