//! Text key=value pairs (RFC 7143 section 6.1) and their value encodings (section 5.1).
//!
//! A data segment of a Login or Text PDU is a sequence of `key=value\0` pairs. Everything
//! here is bounded so that a hostile peer cannot make us allocate without limit.

use thiserror::Error;

/// Longest key name the RFC allows.
pub const MAX_KEY_LEN: usize = 63;
/// Longest value we accept: CHAP binary values may reach 1024 bytes, i.e. 2050 characters
/// in hex; 8192 leaves room for long TargetAddress lists without letting a value grow large.
pub const MAX_VALUE_LEN: usize = 8192;
/// Most pairs accepted in one (possibly multi-PDU) text. Every RFC key fits many times over.
pub const MAX_PAIRS: usize = 1024;
/// Bound on the text of one request or response gathered over several PDUs with C=1.
pub const DEFAULT_TEXT_LIMIT: usize = 64 * 1024;

pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
pub const IRRELEVANT: &str = "Irrelevant";
pub const REJECT: &str = "Reject";

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TextError {
    #[error("text pair is not terminated by a NUL byte")]
    MissingNul,
    #[error("text pair has no '='")]
    MissingEquals,
    #[error("empty key name")]
    EmptyKey,
    #[error("key name longer than {MAX_KEY_LEN} bytes")]
    KeyTooLong,
    #[error("key name contains a character outside the RFC 7143 alphabet")]
    BadKeyChar,
    #[error("value longer than {MAX_VALUE_LEN} bytes")]
    ValueTooLong,
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("more than {MAX_PAIRS} key=value pairs")]
    TooManyPairs,
    #[error("continued text exceeds {0} bytes")]
    TooLong(usize),
    #[error("malformed numerical value")]
    BadNumber,
    #[error("malformed binary value")]
    BadBinary,
}

/// Ordered key=value pairs, as they appear on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextKeys(pub Vec<(String, String)>);

fn valid_key_char(c: u8) -> bool {
    // RFC 7143 6.1: letters, digits, '.', '-', '+', '@', '_'; '#' appears in X# keys.
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'@' | b'_' | b'#')
}

impl TextKeys {
    pub fn new() -> Self {
        TextKeys(Vec::new())
    }

    /// Parses a whole text (all continuation PDUs already joined). Zero bytes after the
    /// last pair are padding and are accepted.
    pub fn parse(data: &[u8]) -> Result<TextKeys, TextError> {
        let mut pairs = Vec::new();
        let mut rest = data;
        loop {
            if rest.iter().all(|&b| b == 0) {
                break;
            }
            let end = rest
                .iter()
                .position(|&b| b == 0)
                .ok_or(TextError::MissingNul)?;
            let pair = &rest[..end];
            rest = &rest[end + 1..];
            if pairs.len() == MAX_PAIRS {
                return Err(TextError::TooManyPairs);
            }
            let eq = pair
                .iter()
                .position(|&b| b == b'=')
                .ok_or(TextError::MissingEquals)?;
            let (key, value) = (&pair[..eq], &pair[eq + 1..]);
            if key.is_empty() {
                return Err(TextError::EmptyKey);
            }
            if key.len() > MAX_KEY_LEN {
                return Err(TextError::KeyTooLong);
            }
            if !key.iter().all(|&c| valid_key_char(c)) {
                return Err(TextError::BadKeyChar);
            }
            if value.len() > MAX_VALUE_LEN {
                return Err(TextError::ValueTooLong);
            }
            let value = std::str::from_utf8(value).map_err(|_| TextError::NotUtf8)?;
            // The key alphabet is ASCII, so this cannot fail after the check above.
            let key = std::str::from_utf8(key).map_err(|_| TextError::NotUtf8)?;
            pairs.push((key.to_owned(), value.to_owned()));
        }
        Ok(TextKeys(pairs))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
        for (k, v) in &self.0 {
            out.extend_from_slice(k.as_bytes());
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }

    /// The first value given for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn push(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.push((key.into(), value.into()));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Parses a numerical value: decimal, `0x` hex or `0b` base64 (RFC 7143 5.1), at most 64 bits.
pub fn parse_number(v: &str) -> Result<u64, TextError> {
    if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        let digits = hex.trim_start_matches('0');
        if hex.is_empty() || digits.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TextError::BadNumber);
        }
        return u64::from_str_radix(if digits.is_empty() { "0" } else { digits }, 16)
            .map_err(|_| TextError::BadNumber);
    }
    if v.starts_with("0b") || v.starts_with("0B") {
        let bytes = decode_binary(v).map_err(|_| TextError::BadNumber)?;
        let significant: Vec<u8> = bytes.into_iter().skip_while(|&b| b == 0).collect();
        if significant.len() > 8 {
            return Err(TextError::BadNumber);
        }
        return Ok(significant
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | b as u64));
    }
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TextError::BadNumber);
    }
    v.parse::<u64>().map_err(|_| TextError::BadNumber)
}

/// `Yes` / `No`, exactly as the RFC spells them.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

pub fn encode_bool(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

/// Decodes a binary value given as `0x` hex or `0b` base64. An odd number of hex digits is
/// read as if a leading zero were present.
pub fn decode_binary(v: &str) -> Result<Vec<u8>, TextError> {
    if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if hex.is_empty() || hex.len() > MAX_VALUE_LEN {
            return Err(TextError::BadBinary);
        }
        let digits: Vec<u8> = hex
            .bytes()
            .map(hex_digit)
            .collect::<Option<_>>()
            .ok_or(TextError::BadBinary)?;
        let mut out = Vec::with_capacity(digits.len().div_ceil(2));
        let mut iter = digits.iter();
        if digits.len() % 2 == 1 {
            out.push(*iter.next().unwrap_or(&0));
        }
        while let (Some(&hi), Some(&lo)) = (iter.next(), iter.next()) {
            out.push((hi << 4) | lo);
        }
        return Ok(out);
    }
    if let Some(b64) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        return decode_base64(b64);
    }
    Err(TextError::BadBinary)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// `0x` followed by two lowercase hex digits per byte.
pub fn encode_hex(data: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + data.len() * 2);
    s.push_str("0x");
    for &b in data {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `0b` followed by standard, padded base64.
pub fn encode_base64(data: &[u8]) -> String {
    let mut s = String::with_capacity(2 + data.len().div_ceil(3) * 4);
    s.push_str("0b");
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (b as u32) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                s.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn decode_base64(s: &str) -> Result<Vec<u8>, TextError> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes.len() & 3 != 0 || bytes.len() > MAX_VALUE_LEN {
        return Err(TextError::BadBinary);
    }
    let pad = bytes.iter().rev().take_while(|&&b| b == b'=').count();
    if pad > 2 {
        return Err(TextError::BadBinary);
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let body = &bytes[..bytes.len() - pad];
    let mut acc = 0u32;
    let mut bits = 0;
    for &c in body {
        let v = B64
            .iter()
            .position(|&x| x == c)
            .ok_or(TextError::BadBinary)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be zero, otherwise two encodings map to one value.
    if acc != 0 {
        return Err(TextError::BadBinary);
    }
    Ok(out)
}

/// Gathers the data segments of a text that spans several PDUs (C bit, RFC 7143 11.10.2 /
/// 11.12.2), bounded in total size.
#[derive(Debug, Clone)]
pub struct TextAccumulator {
    buf: Vec<u8>,
    limit: usize,
}

impl Default for TextAccumulator {
    fn default() -> Self {
        Self::new(DEFAULT_TEXT_LIMIT)
    }
}

impl TextAccumulator {
    pub fn new(limit: usize) -> Self {
        TextAccumulator {
            buf: Vec::new(),
            limit,
        }
    }

    /// Adds one PDU's data segment. Returns the whole text once a PDU with C=0 arrives.
    /// On error the accumulator is emptied.
    pub fn push(&mut self, segment: &[u8], cont: bool) -> Result<Option<Vec<u8>>, TextError> {
        if self.buf.len() + segment.len() > self.limit {
            self.buf = Vec::new();
            return Err(TextError::TooLong(self.limit));
        }
        self.buf.extend_from_slice(segment);
        if cont {
            Ok(None)
        } else {
            Ok(Some(std::mem::take(&mut self.buf)))
        }
    }

    /// True while a continued text has started and not yet ended.
    pub fn is_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    pub fn reset(&mut self) {
        self.buf.clear();
    }
}

/// Splits a text into data segments of at most `max_seg` bytes; the sender sets C=1 on all
/// but the last. An empty text still yields one (empty) segment.
pub fn split_for_pdus(data: &[u8], max_seg: usize) -> Vec<Vec<u8>> {
    if data.is_empty() {
        return vec![Vec::new()];
    }
    data.chunks(max_seg.max(1)).map(<[u8]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_encode_round_trip() {
        let raw = b"InitiatorName=iqn.2024-01.org.example:host\0SessionType=Normal\0";
        let keys = TextKeys::parse(raw).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.get("SessionType"), Some("Normal"));
        assert_eq!(keys.encode(), raw.to_vec());
    }

    #[test]
    fn padding_zeros_are_accepted_and_empty_text_is_empty() {
        let keys = TextKeys::parse(b"A=1\0\0\0\0").unwrap();
        assert_eq!(keys.0, vec![("A".into(), "1".into())]);
        assert!(TextKeys::parse(b"").unwrap().is_empty());
        assert!(TextKeys::parse(b"\0\0").unwrap().is_empty());
    }

    #[test]
    fn empty_value_is_kept() {
        let keys = TextKeys::parse(b"X-a=\0").unwrap();
        assert_eq!(keys.get("X-a"), Some(""));
    }

    #[test]
    fn malformed_texts_are_rejected() {
        assert_eq!(TextKeys::parse(b"A=1"), Err(TextError::MissingNul));
        assert_eq!(TextKeys::parse(b"A1\0"), Err(TextError::MissingEquals));
        assert_eq!(TextKeys::parse(b"=1\0"), Err(TextError::EmptyKey));
        assert_eq!(TextKeys::parse(b"A B=1\0"), Err(TextError::BadKeyChar));
        assert_eq!(TextKeys::parse(b"A=\xff\0"), Err(TextError::NotUtf8));
        // A NUL in the middle followed by more text is not padding.
        assert_eq!(
            TextKeys::parse(b"A=1\0\0B=2\0"),
            Err(TextError::MissingEquals)
        );
        let long_key = format!("{}=1\0", "K".repeat(64));
        assert_eq!(
            TextKeys::parse(long_key.as_bytes()),
            Err(TextError::KeyTooLong)
        );
        let ok_key = format!("{}=1\0", "K".repeat(63));
        assert!(TextKeys::parse(ok_key.as_bytes()).is_ok());
        let long_value = format!("A={}\0", "v".repeat(MAX_VALUE_LEN + 1));
        assert_eq!(
            TextKeys::parse(long_value.as_bytes()),
            Err(TextError::ValueTooLong)
        );
    }

    #[test]
    fn pair_flood_is_bounded() {
        let flood: Vec<u8> = b"a=b\0".repeat(MAX_PAIRS + 1);
        assert_eq!(TextKeys::parse(&flood), Err(TextError::TooManyPairs));
        let ok: Vec<u8> = b"a=b\0".repeat(MAX_PAIRS);
        assert_eq!(TextKeys::parse(&ok).unwrap().len(), MAX_PAIRS);
    }

    #[test]
    fn numbers_in_three_encodings() {
        assert_eq!(parse_number("8192"), Ok(8192));
        assert_eq!(parse_number("0x2000"), Ok(8192));
        assert_eq!(parse_number("0X00002000"), Ok(8192));
        assert_eq!(parse_number("0bIAA="), Ok(8192));
        assert_eq!(parse_number("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            "-1",
            "+1",
            "1.0",
            "0x",
            "0xg",
            "18446744073709551616",
            "0x10000000000000000",
            " 1",
        ] {
            assert_eq!(parse_number(bad), Err(TextError::BadNumber), "{bad:?}");
        }
    }

    #[test]
    fn binary_values() {
        assert_eq!(decode_binary("0x0102ff"), Ok(vec![1, 2, 255]));
        assert_eq!(decode_binary("0x102ff"), Ok(vec![1, 2, 255]));
        assert_eq!(decode_binary("0bAQL/"), Ok(vec![1, 2, 255]));
        assert_eq!(decode_binary("0bAQ=="), Ok(vec![1]));
        assert_eq!(decode_binary("0bAR=="), Err(TextError::BadBinary));
        assert_eq!(decode_binary("0102"), Err(TextError::BadBinary));
        assert_eq!(decode_binary("0x"), Err(TextError::BadBinary));
        assert_eq!(decode_binary("0bA"), Err(TextError::BadBinary));
        assert_eq!(encode_hex(&[0, 0xab, 0x10]), "0x00ab10");
        for data in [&b""[..], b"a", b"ab", b"abc", b"abcd", b"\x00\xff\x10\x80"] {
            if !data.is_empty() {
                assert_eq!(decode_binary(&encode_base64(data)).unwrap(), data);
                assert_eq!(decode_binary(&encode_hex(data)).unwrap(), data);
            }
        }
        assert_eq!(encode_base64(b"Man"), "0bTWFu");
    }

    #[test]
    fn accumulator_joins_and_bounds() {
        let mut acc = TextAccumulator::new(10);
        assert_eq!(acc.push(b"A=", true), Ok(None));
        assert!(acc.is_pending());
        assert_eq!(acc.push(b"1\0", false), Ok(Some(b"A=1\0".to_vec())));
        assert!(!acc.is_pending());
        assert_eq!(acc.push(b"123456", true), Ok(None));
        assert_eq!(acc.push(b"12345", true), Err(TextError::TooLong(10)));
        assert!(!acc.is_pending());
    }

    #[test]
    fn split_covers_data() {
        let data: Vec<u8> = (0..=255u8).collect();
        let parts = split_for_pdus(&data, 100);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.len() <= 100));
        assert_eq!(parts.concat(), data);
        assert_eq!(split_for_pdus(b"", 100), vec![Vec::<u8>::new()]);
    }
}
