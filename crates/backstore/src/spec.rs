//! What a store is made of: [`StoreSpec`], written as text or as a table.
//!
//! Text: `KIND:PATH?KEY=VALUE&KEY=VALUE`, where `PATH` is the parameter `path` and
//! `members=[SPEC,SPEC]` lists the stores a store is built on:
//!
//! ```text
//! file:lun0.img?size=1GiB
//! ram:?size=64MiB
//! stripe:?unit=1MiB&members=[file:a.img,stripe:?members=[ram:?size=1G,ram:?size=1G]]
//! ```
//!
//! A table (in the target's TOML) has `kind`, its parameters as keys and `members` as an
//! array of specs, each a string or a table. `%XX` in a path or value stands for the byte
//! `XX` (hex), for the characters that would otherwise end it: `%26` is `&`, `%2C` `,`,
//! `%5D` `]`, `%3F` `?` in a path, `%25` `%`. Inside a member list, brackets that pair up
//! in a path or value (an IPv6 address) need no escape.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A store to open: its kind, its named parameters and the stores it is built on.
///
/// `file:lun0.img?size=1G` and `{ kind = "file", path = "lun0.img", size = "1G" }` are the
/// same spec. Parameters are text; the kind's factory gives them meaning (see
/// [`StoreSpec::size`] and [`StoreSpec::parse`]).
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSpec {
    kind: String,
    params: BTreeMap<String, String>,
    members: Vec<StoreSpec>,
}

/// As shown to people: secrets hidden (a configuration printed whole, a log line).
impl fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreSpec").field(&self.shown()).finish()
    }
}

/// Why a spec is not well formed, or a parameter not what its kind needs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("store spec `{spec}`: {reason}")]
    Syntax { spec: String, reason: String },
    #[error("store spec `{spec}`: {key:?} is given twice")]
    Duplicate { spec: String, key: String },
    #[error(
        "store spec `{spec}`: {name:?} is not a valid {what}: use lower-case letters, digits, \
         `-` and `_`, starting with a letter"
    )]
    BadName {
        spec: String,
        name: String,
        what: &'static str,
    },
    #[error("store spec `{spec}`: {key:?} is no parameter: `kind` names the kind, `members=[..]` lists member stores")]
    Reserved { spec: String, key: String },
    #[error("store `{spec}`: kind {kind:?} takes no parameter {key:?}; it takes {known}")]
    UnknownParam {
        spec: String,
        kind: String,
        key: String,
        known: String,
    },
    #[error("store `{spec}`: kind {kind:?} needs {key:?}{help}")]
    MissingParam {
        spec: String,
        kind: String,
        key: String,
        help: String,
    },
    #[error("store `{spec}`: {key}={value:?}: {reason}")]
    BadValue {
        spec: String,
        key: String,
        value: String,
        reason: String,
    },
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

impl StoreSpec {
    /// A spec of `kind` with no parameters yet.
    pub fn new(kind: impl Into<String>) -> Result<Self, SpecError> {
        let kind = kind.into();
        if !valid_name(&kind) {
            return Err(SpecError::BadName {
                spec: format!("{kind}:"),
                name: kind,
                what: "kind",
            });
        }
        Ok(Self {
            kind,
            params: BTreeMap::new(),
            members: Vec::new(),
        })
    }

    /// Adds a parameter; `kind` and `members` are not parameters, and a key goes in once.
    pub fn with(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, SpecError> {
        let key = key.into();
        if key == "kind" || key == "members" {
            return Err(SpecError::Reserved {
                spec: self.shown(),
                key,
            });
        }
        if !valid_name(&key) {
            return Err(SpecError::BadName {
                spec: self.shown(),
                name: key,
                what: "parameter name",
            });
        }
        if self.params.contains_key(&key) {
            return Err(SpecError::Duplicate {
                spec: self.shown(),
                key,
            });
        }
        self.params.insert(key, value.into());
        Ok(self)
    }

    /// Adds a store this one is built on, after those already there.
    pub fn with_member(mut self, member: StoreSpec) -> Self {
        self.members.push(member);
        self
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The parameters, by name.
    pub fn params(&self) -> &BTreeMap<String, String> {
        &self.params
    }

    pub fn members(&self) -> &[StoreSpec] {
        &self.members
    }

    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.get(key).map(String::as_str)
    }

    /// A parameter the kind cannot do without.
    pub fn require(&self, key: &str) -> Result<&str, SpecError> {
        self.param(key).ok_or_else(|| self.missing(key))
    }

    /// The error for a parameter the kind needs and the spec lacks.
    pub fn missing(&self, key: &str) -> SpecError {
        SpecError::MissingParam {
            spec: self.shown(),
            kind: self.kind.clone(),
            key: key.into(),
            help: String::new(),
        }
    }

    /// A byte count with an optional unit: `1GiB` or `1G` (binary), `1GB` (decimal), `4096`.
    pub fn size(&self, key: &str) -> Result<Option<u64>, SpecError> {
        self.param(key)
            .map(|v| parse_size(v).map_err(|reason| self.bad_value(key, v, reason)))
            .transpose()
    }

    /// A parameter as any type that parses from text (numbers, `true`/`false`).
    pub fn parse<T: FromStr>(&self, key: &str) -> Result<Option<T>, SpecError>
    where
        T::Err: fmt::Display,
    {
        self.param(key)
            .map(|v| {
                v.parse()
                    .map_err(|e: T::Err| self.bad_value(key, v, e.to_string()))
            })
            .transpose()
    }

    /// The error for a parameter whose value the kind cannot use, naming both (a secret
    /// one's value is not named).
    pub fn bad_value(&self, key: &str, value: &str, reason: impl Into<String>) -> SpecError {
        SpecError::BadValue {
            spec: self.shown(),
            key: key.into(),
            value: if is_secret_param(key) {
                HIDDEN.into()
            } else {
                value.into()
            },
            reason: reason.into(),
        }
    }

    /// The text form to show people and logs: every secret (a parameter named like
    /// `secret` or `password`, the password of an `iscsi://user%password@` path) replaced
    /// by `***`, in this spec and its members. It parses, but not back to this spec.
    pub fn shown(&self) -> String {
        self.hidden().to_string()
    }

    fn hidden(&self) -> StoreSpec {
        StoreSpec {
            kind: self.kind.clone(),
            params: self
                .params
                .iter()
                .map(|(k, v)| {
                    let v = if is_secret_param(k) {
                        HIDDEN.to_string()
                    } else if k == "path" {
                        hide_url_password(v)
                    } else {
                        v.clone()
                    };
                    (k.clone(), v)
                })
                .collect(),
            members: self.members.iter().map(StoreSpec::hidden).collect(),
        }
    }
}

/// What stands for a secret in text shown to people.
const HIDDEN: &str = "***";

/// Parameters that hold secrets (CHAP secrets and passwords of the kinds that log in).
fn is_secret_param(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("secret") || k.contains("password")
}

/// `//user%password@host/...` (libiscsi's URL form, as the `iscsi` kind's path has it)
/// with the password hidden; any other text as it is.
fn hide_url_password(path: &str) -> String {
    let (scheme, rest) = match path.find("//") {
        Some(i) => path.split_at(i + 2),
        None => return path.to_owned(),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return path.to_owned();
    };
    match rest[..at].find('%') {
        Some(pct) => format!("{scheme}{}%{HIDDEN}{}", &rest[..pct], &rest[at..]),
        None => path.to_owned(),
    }
}

/// A spec's text as a person typed it, with what looks like a secret hidden (for errors
/// about text that does not parse, where no spec exists to ask).
fn hide_in_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(c) = text[at..].chars().next() {
        out.push(c);
        at += c.len_utf8();
        if c != '=' {
            continue;
        }
        // A `key=value` whose key names a secret: the value runs to `&`, `,` or `]`.
        let key_start = text[..at - 1]
            .rfind(['?', '&', '[', ','])
            .map_or(0, |i| i + 1);
        if is_secret_param(&text[key_start..at - 1]) {
            out.push_str(HIDDEN);
            at = text[at..]
                .find(['&', ',', ']'])
                .map_or(text.len(), |i| at + i);
        }
    }
    hide_url_passwords(&out)
}

/// Every `//user%password@` in `text` with the password hidden.
fn hide_url_passwords(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("//") {
        let (before, from) = rest.split_at(i);
        out.push_str(before);
        let end = from[2..]
            .find(['/', ',', ']', '?'])
            .map_or(from.len(), |j| j + 2);
        out.push_str(&hide_url_password(&from[..end]));
        rest = &from[end..];
    }
    out.push_str(rest);
    out
}

/// Sizes as every command line and the config write them (the units crate).
fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}

impl fmt::Display for StoreSpec {
    /// The text form, which parses back to the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.kind)?;
        let inline_path = self.param("path").filter(|p| !p.is_empty());
        if let Some(p) = inline_path {
            f.write_str(&escape(p, true))?;
        }
        let mut sep = '?';
        for (k, v) in &self.params {
            if k == "path" && inline_path.is_some() {
                continue;
            }
            write!(f, "{sep}{k}={}", escape(v, false))?;
            sep = '&';
        }
        if !self.members.is_empty() {
            write!(f, "{sep}members=[")?;
            for (i, m) in self.members.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{m}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// Escapes what would end the text early where it may stand (in a member list); brackets
/// that pair up stay as they are, so an IPv6 address reads as one.
fn escape(s: &str, path: bool) -> String {
    let mut depth = 0i32;
    let paired = s.chars().all(|c| {
        depth += match c {
            '[' => 1,
            ']' => -1,
            _ => 0,
        };
        depth >= 0
    }) && depth == 0;
    depth = 0;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let open = depth > 0;
        depth += match c {
            '[' if paired => 1,
            ']' if paired => -1,
            _ => 0,
        };
        match c {
            '%' | '&' => {}
            ',' if !open => {}
            '[' | ']' if !paired => {}
            '?' if path => {}
            c => {
                out.push(c);
                continue;
            }
        }
        out.push_str(&format!("%{:02X}", c as u32));
    }
    out
}

impl FromStr for StoreSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let mut p = Parser { text, pos: 0 };
        let spec = p.spec(false)?;
        match p.peek() {
            None => Ok(spec),
            Some(_) => Err(p.error("unexpected text")),
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        let yes = self.peek() == Some(c);
        if yes {
            self.pos += c.len_utf8();
        }
        yes
    }

    fn error(&self, reason: &str) -> SpecError {
        let rest = &self.text[self.pos..];
        let reason = if rest.is_empty() {
            format!("{reason} at the end")
        } else {
            let near: String = rest.chars().take(24).collect();
            format!("{reason} at {near:?}")
        };
        SpecError::Syntax {
            spec: hide_in_text(self.text),
            reason,
        }
    }

    fn name(&mut self) -> &str {
        let start = self.pos;
        let len = self.text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(self.text.len() - start);
        self.pos += len;
        &self.text[start..self.pos]
    }

    /// One spec; `nested` inside a member list, where `,` and `]` end it.
    fn spec(&mut self, nested: bool) -> Result<StoreSpec, SpecError> {
        let kind = self.name().to_owned();
        if kind.is_empty() || !self.eat(':') {
            return Err(self.error("expected KIND: (as in file:lun0.img or ram:?size=1G)"));
        }
        let mut spec = StoreSpec::new(kind).map_err(|e| self.rename(e))?;
        let path = self.token(nested, true)?;
        if !path.is_empty() {
            spec = spec.with("path", path).map_err(|e| self.rename(e))?;
        }
        if !self.eat('?') {
            return Ok(spec);
        }
        loop {
            match self.peek() {
                None => return Ok(spec),
                Some(',' | ']') if nested => return Ok(spec),
                Some('&') => {
                    self.pos += 1;
                    continue;
                }
                _ => {}
            }
            let key = self.name().to_owned();
            if key.is_empty() || !self.eat('=') {
                return Err(self.error("expected KEY=VALUE"));
            }
            if key == "members" {
                if !spec.members.is_empty() {
                    return Err(SpecError::Duplicate {
                        spec: hide_in_text(self.text),
                        key,
                    });
                }
                if !self.eat('[') {
                    return Err(self.error("members take a list: members=[SPEC,SPEC]"));
                }
                loop {
                    spec.members.push(self.spec(true)?);
                    if self.eat(']') {
                        break;
                    }
                    if !self.eat(',') {
                        return Err(self.error("expected `,` or `]` after a member"));
                    }
                }
            } else {
                let value = self.token(nested, false)?;
                spec = spec.with(key, value).map_err(|e| self.rename(e))?;
            }
            match self.peek() {
                None | Some('&') => {}
                Some(',' | ']') if nested => {}
                _ => return Err(self.error("expected `&` between parameters")),
            }
        }
    }

    /// Errors found while building name the text being parsed, not the part built so far.
    fn rename(&self, e: SpecError) -> SpecError {
        match e {
            SpecError::Duplicate { key, .. } => SpecError::Duplicate {
                spec: hide_in_text(self.text),
                key,
            },
            SpecError::BadName { name, what, .. } => SpecError::BadName {
                spec: hide_in_text(self.text),
                name,
                what,
            },
            SpecError::Reserved { key, .. } => SpecError::Reserved {
                spec: hide_in_text(self.text),
                key,
            },
            e => e,
        }
    }

    /// A path (up to `?`) or a value (up to `&`), percent-decoded; in a member list also up
    /// to a `,` or `]` outside brackets of its own.
    fn token(&mut self, nested: bool, path: bool) -> Result<String, SpecError> {
        let start = self.pos;
        let mut depth = 0usize;
        for (i, c) in self.text[start..].char_indices() {
            let end = match c {
                '?' if path => true,
                '&' if !path => true,
                '[' if nested => {
                    depth += 1;
                    false
                }
                ']' if nested && depth > 0 => {
                    depth -= 1;
                    false
                }
                ',' | ']' if nested && depth == 0 => true,
                _ => false,
            };
            if end {
                self.pos = start + i;
                return self.decode(start);
            }
        }
        self.pos = self.text.len();
        self.decode(start)
    }

    fn decode(&self, start: usize) -> Result<String, SpecError> {
        let raw = &self.text.as_bytes()[start..self.pos];
        let mut out = Vec::with_capacity(raw.len());
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == b'%' {
                let byte = raw
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                let Some(byte) = byte else {
                    return Err(SpecError::Syntax {
                        spec: hide_in_text(self.text),
                        reason: "`%` must start an escape of two hex digits (%25 for `%` itself)"
                            .into(),
                    });
                };
                out.push(byte);
                i += 3;
            } else {
                out.push(raw[i]);
                i += 1;
            }
        }
        String::from_utf8(out).map_err(|_| SpecError::Syntax {
            spec: hide_in_text(self.text),
            reason: "an escape decodes to bytes that are not UTF-8".into(),
        })
    }
}

impl<'de> serde::Deserialize<'de> for StoreSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> serde::de::Visitor<'de> for SpecVisitor {
    type Value = StoreSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a store spec: text like \"file:lun0.img?size=1GiB\" or a table with `kind`")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<StoreSpec, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<StoreSpec, A::Error> {
        use serde::de::Error;
        let mut kind = None;
        let mut params = Vec::new();
        let mut members = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "kind" => kind = Some(map.next_value::<String>()?),
                "members" => members = map.next_value::<Vec<StoreSpec>>()?,
                _ => match map.next_value::<Scalar>()? {
                    Scalar::Text(v) => params.push((key, v)),
                    Scalar::Other(what) => {
                        return Err(A::Error::custom(format!(
                            "store table: `{key}` is {what}; a parameter is a string, number \
                             or boolean (only `members` lists stores)"
                        )))
                    }
                },
            }
        }
        let Some(kind) = kind else {
            let keys: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
            return Err(A::Error::custom(format!(
                "store table with keys [{}] has no `kind` (such as \"file\" or \"ram\")",
                keys.join(", ")
            )));
        };
        let mut spec = StoreSpec::new(kind).map_err(A::Error::custom)?;
        for (k, v) in params {
            spec = spec.with(k, v).map_err(A::Error::custom)?;
        }
        spec.members = members;
        Ok(spec)
    }
}

/// A table's parameter value as text, or what it was instead.
enum Scalar {
    Text(String),
    Other(&'static str),
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.into()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Scalar, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Scalar::Other("a table"))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Scalar, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("an array"))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn secrets_are_hidden_from_what_people_see() {
        let text = "stripe:?unit=1M&members=[iscsi://ds1%25pw-one@10.0.0.1:3260/iqn.x/0?\
                    target_secret=pw-two,file:a.img?size=1G]";
        let s = spec(text);
        let shown = s.shown();
        for leak in ["pw-one", "pw-two"] {
            assert!(!shown.contains(leak), "{shown}");
            assert!(!format!("{s:?}").contains(leak));
        }
        assert!(
            shown.contains("iscsi://ds1%25***@10.0.0.1:3260/iqn.x/0"),
            "{shown}"
        );
        assert!(shown.contains("target_secret=***"), "{shown}");
        assert!(shown.contains("file:a.img?size=1G"), "{shown}");
        // The spec itself keeps them: it is what the store is opened with.
        assert!(s.to_string().contains("pw-one") && s.to_string().contains("pw-two"));
        // A bad secret's value is not named in the error.
        let e = s.members()[0].bad_value("target_secret", "pw-two", "too short");
        assert!(!e.to_string().contains("pw-two"), "{e}");
        // Nor is text that does not parse.
        let e = "stripe:?members=[iscsi://u%25pw-three@h/iqn/0?chap_secret=pw-four,]]"
            .parse::<StoreSpec>()
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pw-three") && !e.contains("pw-four"), "{e}");
    }

    use super::*;

    fn spec(s: &str) -> StoreSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn text_forms() {
        let f = spec("file:/srv/lun0.img?size=1G");
        assert_eq!(f.kind(), "file");
        assert_eq!(f.param("path"), Some("/srv/lun0.img"));
        assert_eq!(f.size("size").unwrap(), Some(1 << 30));
        assert!(f.members().is_empty());

        let r = spec("ram:?size=64M");
        assert_eq!(r.param("path"), None);
        assert_eq!(r.size("size").unwrap(), Some(64 << 20));
        assert_eq!(spec("ram:"), StoreSpec::new("ram").unwrap());

        let i = spec("iscsi://[::1]:3260/iqn.2026-11.org.example:disk/0?header_digest=CRC32C");
        assert_eq!(
            i.param("path"),
            Some("//[::1]:3260/iqn.2026-11.org.example:disk/0")
        );
        assert_eq!(i.param("header_digest"), Some("CRC32C"));

        let rbd = spec("rbd:pool/image?conf=/etc/ceph/ceph.conf&id=admin");
        assert_eq!(rbd.param("path"), Some("pool/image"));
        assert_eq!(rbd.param("conf"), Some("/etc/ceph/ceph.conf"));
        assert_eq!(rbd.param("id"), Some("admin"));
    }

    #[test]
    fn members_nest() {
        let s = spec(
            "stripe:?unit=1M&members=[stripe:?unit=64K&members=[ram:?size=1G,ram:?size=1G],\
             iscsi://[::1]/iqn.2026-11.x:y/0,file:b.img?size=2G]&note=x",
        );
        assert_eq!(s.kind(), "stripe");
        assert_eq!(s.param("unit"), Some("1M"));
        assert_eq!(s.param("note"), Some("x"));
        let m = s.members();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].kind(), "stripe");
        assert_eq!(m[0].members().len(), 2);
        assert_eq!(m[0].members()[1].size("size").unwrap(), Some(1 << 30));
        assert_eq!(m[1].param("path"), Some("//[::1]/iqn.2026-11.x:y/0"));
        assert_eq!(m[2].param("path"), Some("b.img"));
        assert_eq!(m[2].param("size"), Some("2G"));
    }

    #[test]
    fn escapes_and_round_trips() {
        let s = spec("file:/srv/a%2Cb%3F.img?size=1G&label=50%25%26more");
        assert_eq!(s.param("path"), Some("/srv/a,b?.img"));
        assert_eq!(s.param("label"), Some("50%&more"));
        for text in [
            "file:/srv/a%2Cb%3F.img?label=50%25%26more&size=1G",
            "ram:?size=64M",
            "ram:",
            "stripe:?unit=1M&members=[file:a%5D.img,stripe:?members=[ram:?size=1G,ram:?size=1G]]",
            "file:?path=",
            "iscsi://[::1]:3260/iqn.2026-11.x:y/0",
            "stripe:?members=[iscsi://[::1]/iqn.2026-11.x:y/0,x:?v=a[b,c]d&w=%5D%2C]",
        ] {
            assert_eq!(spec(text).to_string(), text);
            assert_eq!(spec(&spec(text).to_string()), spec(text));
        }
        let built = StoreSpec::new("wrap")
            .unwrap()
            .with("path", "x,y[z]&?%")
            .unwrap()
            .with("v", "a=b&c,d]")
            .unwrap()
            .with_member(spec("ram:?size=1M"));
        assert_eq!(spec(&built.to_string()), built);
    }

    fn arb_spec() -> impl proptest::strategy::Strategy<Value = StoreSpec> {
        use proptest::prelude::*;
        let text = "[a-c:/%&,?=\\[\\] ]{0,8}";
        let leaf = (
            "[a-z][a-z0-9_-]{0,4}",
            proptest::collection::btree_map("[a-z][a-z0-9_]{0,4}", text, 0..4),
        )
            .prop_map(|(kind, params)| {
                params
                    .into_iter()
                    .filter(|(k, _)| k != "kind" && k != "members")
                    .fold(StoreSpec::new(kind).unwrap(), |s, (k, v)| {
                        s.with(k, v).unwrap()
                    })
            });
        leaf.prop_recursive(2, 12, 3, |inner| {
            (inner.clone(), proptest::collection::vec(inner, 1..3))
                .prop_map(|(s, members)| members.into_iter().fold(s, StoreSpec::with_member))
        })
    }

    proptest::proptest! {
        #[test]
        fn any_spec_reads_back_from_its_text(s in arb_spec()) {
            let text = s.to_string();
            let back: StoreSpec = text.parse().map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{text}: {e}")))?;
            proptest::prop_assert_eq!(back, s, "{}", text);
        }
    }

    #[test]
    fn errors_name_the_spec_and_the_key() {
        let err = |s: &str| s.parse::<StoreSpec>().unwrap_err().to_string();
        let e = err("lun0.img");
        assert!(e.contains("`lun0.img`") && e.contains("KIND:"), "{e}");
        let e = err("File:x");
        assert!(e.contains("\"File\"") && e.contains("kind"), "{e}");
        let e = err("ram:?size=1G&size=2G");
        assert!(
            e.contains("\"size\" is given twice") && e.contains("ram:?size=1G&size=2G"),
            "{e}"
        );
        let e = err("file:a.img?path=b.img");
        assert!(e.contains("\"path\" is given twice"), "{e}");
        let e = err("ram:?size");
        assert!(e.contains("KEY=VALUE"), "{e}");
        let e = err("ram:?kind=file");
        assert!(e.contains("\"kind\""), "{e}");
        let e = err("stripe:?members=[ram:?size=1M");
        assert!(e.contains("`]`") && e.contains("at the end"), "{e}");
        let e = err("stripe:?members=ram:");
        assert!(e.contains("members=[SPEC,SPEC]"), "{e}");
        let e = err("file:a%zz");
        assert!(e.contains("%25"), "{e}");
        let e = spec("ram:?size=12 parsecs")
            .size("size")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("size=\"12 parsecs\"") && e.contains("ram:?size=12 parsecs"),
            "{e}"
        );
        let e = spec("x:?n=-1").parse::<u32>("n").unwrap_err().to_string();
        assert!(e.contains("n=\"-1\""), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("18446744073709551104").unwrap(), u64::MAX - 511);
        assert!(parse_size("16777216T").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[derive(serde::Deserialize)]
    struct Lun {
        store: StoreSpec,
    }

    fn table(toml_text: &str) -> Result<StoreSpec, String> {
        toml::from_str::<Lun>(toml_text)
            .map(|l| l.store)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn tables_and_text_are_one_spec() {
        let t = table(
            r#"
[store]
kind = "file"
path = "/srv/lun0.img"
size = "1G"
"#,
        )
        .unwrap();
        assert_eq!(t, spec("file:/srv/lun0.img?size=1G"));
        assert_eq!(
            table("store = \"ram:?size=64M\"").unwrap(),
            spec("ram:?size=64M")
        );
        // Numbers and booleans are parameters as their text.
        assert_eq!(
            table("store = { kind = \"ram\", size = 4096, sync = true }").unwrap(),
            spec("ram:?size=4096&sync=true")
        );
        let nested = table(
            r#"
[store]
kind = "stripe"
unit = "1M"
members = [
    { kind = "stripe", unit = "64K", members = ["ram:?size=1G", { kind = "ram", size = "1G" }] },
    "file:b.img?size=2G",
]
"#,
        )
        .unwrap();
        assert_eq!(
            nested,
            spec("stripe:?unit=1M&members=[stripe:?unit=64K&members=[ram:?size=1G,ram:?size=1G],file:b.img?size=2G]")
        );
        let arrays = table(
            r#"
[store]
kind = "stripe"
[[store.members]]
kind = "ram"
size = "1M"
[[store.members]]
kind = "file"
path = "m.img"
"#,
        )
        .unwrap();
        assert_eq!(arrays, spec("stripe:?members=[ram:?size=1M,file:m.img]"));
    }

    #[test]
    fn table_errors_name_the_key() {
        let e = table("[store]\npath = \"a.img\"\n").unwrap_err();
        assert!(e.contains("no `kind`") && e.contains("path"), "{e}");
        let e = table("[store]\nkind = \"file\"\nsize = { n = 1 }\n").unwrap_err();
        assert!(e.contains("`size` is a table"), "{e}");
        let e = table("[store]\nkind = \"Disk\"\n").unwrap_err();
        assert!(e.contains("\"Disk\""), "{e}");
        let e = table("[store]\nkind = \"stripe\"\nmembers = [\"ram\"]\n").unwrap_err();
        assert!(e.contains("`ram`") && e.contains("KIND:"), "{e}");
        let e = table("[store]\nkind = \"ram\"\nKey = 1\n").unwrap_err();
        assert!(e.contains("\"Key\""), "{e}");
    }
}
