//! `iscsi://[user[%password]@]host[:port]/target-iqn/lun?key=value&...`, as libiscsi
//! writes it. The query string carries [`SessionOptions`] keys (see [`SessionOptions::set`]).

use std::fmt;

use crate::{Error, SessionOptions};

/// A parsed iSCSI URL. `target` and `lun` are absent for a portal-only URL
/// (`iscsi://host/`), which is what discovery takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IscsiUrl {
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<String>,
    pub target: Option<String>,
    pub lun: Option<u16>,
    /// `key=value` pairs of the query string, in order.
    pub query: Vec<(String, String)>,
}

pub const DEFAULT_PORT: u16 = 3260;

impl IscsiUrl {
    pub fn parse(s: &str) -> Result<IscsiUrl, Error> {
        let bad = |why: &str| Error::Url(format!("{s}: {why}"));
        let rest = s
            .strip_prefix("iscsi://")
            .ok_or_else(|| bad("must start with iscsi://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, q),
            None => (rest, ""),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once('%') {
                Some((u, p)) => (Some(percent_decode(u)), Some(percent_decode(p))),
                None => (Some(percent_decode(u)), None),
            },
        };
        let (host, port) = split_host_port(hostport).ok_or_else(|| bad("bad host or port"))?;
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let target = parts.next().map(str::to_owned);
        let lun = match parts.next() {
            None => None,
            Some(l) => Some(
                l.parse::<u16>()
                    .map_err(|_| bad("LUN must be a number below 65536"))?,
            ),
        };
        if parts.next().is_some() {
            return Err(bad("path has more than target and LUN"));
        }
        let query = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_owned(), percent_decode(v)),
                None => (kv.to_owned(), "1".to_owned()),
            })
            .collect();
        Ok(IscsiUrl {
            host,
            port,
            user,
            password,
            target,
            lun,
            query,
        })
    }

    /// `host:port`, with brackets around an IPv6 address.
    pub fn portal(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The options of the query string applied over `base`.
    pub fn options(&self, base: &SessionOptions) -> Result<SessionOptions, Error> {
        let mut o = base.clone();
        for (k, v) in &self.query {
            o.set(k, v)?;
        }
        Ok(o)
    }

    pub fn target_required(&self) -> Result<&str, Error> {
        self.target.as_deref().ok_or_else(|| {
            Error::Url(format!(
                "{self}: no target name; use iscsi://host/TARGET-IQN/LUN (`rsv ls iscsi://{}/` lists targets)",
                self.portal()
            ))
        })
    }

    pub fn lun_required(&self) -> Result<u16, Error> {
        self.lun.ok_or_else(|| {
            Error::Url(format!(
                "{self}: no LUN; use iscsi://host/TARGET-IQN/LUN (`rsv ls` lists LUNs)"
            ))
        })
    }
}

impl fmt::Display for IscsiUrl {
    /// Never shows the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "iscsi://")?;
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        write!(f, "{}/", self.portal())?;
        if let Some(t) = &self.target {
            write!(f, "{t}")?;
            if let Some(l) = self.lun {
                write!(f, "/{l}")?;
            }
        }
        Ok(())
    }
}

fn split_host_port(s: &str) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => DEFAULT_PORT,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((s.to_owned(), DEFAULT_PORT)),
    }
}

/// `%XX` decoded, as libiscsi reads a URL's user, password and option values; an escape
/// that is not one is kept as it is, and bytes that are not UTF-8 become U+FFFD.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_url() {
        let u = IscsiUrl::parse(
            "iscsi://bob%s3cret@10.0.0.1:3261/iqn.2026-01.org.x:disk/3?connections=8&header_digest=crc32c",
        )
        .unwrap();
        assert_eq!(u.host, "10.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.user.as_deref(), Some("bob"));
        assert_eq!(u.password.as_deref(), Some("s3cret"));
        assert_eq!(u.target.as_deref(), Some("iqn.2026-01.org.x:disk"));
        assert_eq!(u.lun, Some(3));
        assert_eq!(u.query.len(), 2);
        let o = u.options(&SessionOptions::default()).unwrap();
        assert_eq!(o.connections, 8);
        assert!(o.header_digest);
        assert!(!u.to_string().contains("s3cret"));
    }

    #[test]
    fn escapes_decoded_and_broken_ones_kept() {
        // A `%` before a multi-byte character is no escape (and was once a panic).
        let u = IscsiUrl::parse("iscsi://a%25b@h/iqn.x:y/0?alias=%41%20b%zz%a\u{e9}%").unwrap();
        assert_eq!(u.user.as_deref(), Some("a"));
        assert_eq!(u.password.as_deref(), Some("25b"));
        assert_eq!(
            u.query,
            [("alias".to_owned(), "A b%zz%a\u{e9}%".to_owned())]
        );
        let u = IscsiUrl::parse("iscsi://h/iqn.x:y/0?x=%FF").unwrap();
        assert_eq!(u.query[0].1, "\u{fffd}");
    }

    #[test]
    fn portal_only_and_ipv6() {
        let u = IscsiUrl::parse("iscsi://[::1]/").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, DEFAULT_PORT);
        assert_eq!(u.target, None);
        assert_eq!(u.portal(), "[::1]:3260");
        assert!(IscsiUrl::parse("http://x/").is_err());
        assert!(IscsiUrl::parse("iscsi://h/t/notalun").is_err());
        assert!(IscsiUrl::parse("iscsi://h/t/1?bogus=1")
            .unwrap()
            .options(&SessionOptions::default())
            .is_err());
    }
}
