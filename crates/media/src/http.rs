//! What the media server makes of HTTP, sans-IO: hyper parses and writes the messages
//! ([`crate::server`]); here is which requests are taken ([`accept`]), how `Range`
//! resolves against a file's length ([`resolve_range`], RFC 9110 14), the heads of the
//! answers ([`file_head`], [`small_head`]) and the percent-encoding of paths.

use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// The `Server` of every answer.
const SERVER: &str = "reservoir-media";

/// Why a request is not taken, and how that is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Neither GET nor HEAD: 405, with `Allow` (RFC 9110 15.5.6).
    Method,
    /// A request body: none of our resources takes one; 413.
    Body,
}

impl Refused {
    pub fn status(self) -> StatusCode {
        match self {
            Refused::Method => StatusCode::METHOD_NOT_ALLOWED,
            Refused::Body => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refused::Method => "only GET and HEAD\n",
            Refused::Body => "request bodies are not accepted\n",
        }
    }
}

/// Whether a request is answered: `Ok(true)` for the head alone (HEAD), `Ok(false)` for
/// head and body (GET). `body_ends` says the request has no body (hyper's
/// `is_end_stream`: no `Content-Length`, or 0, and no `Transfer-Encoding`).
pub fn accept(method: &Method, body_ends: bool) -> Result<bool, Refused> {
    let head_only = match *method {
        Method::GET => false,
        Method::HEAD => true,
        _ => return Err(Refused::Method),
    };
    if !body_ends {
        return Err(Refused::Body);
    }
    Ok(head_only)
}

/// Whether the query asks for the listing to be read again (`refresh=1`).
pub fn wants_refresh(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "refresh=1"))
}

/// What a `Range` header asks of a resource of a known length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranged {
    /// No (usable) range: the whole resource, 200.
    Full,
    /// Bytes `start..=end`, 206.
    Part { start: u64, end: u64 },
    /// No byte of the range exists: 416 with `Content-Range: bytes */LEN`.
    Unsatisfiable,
}

/// Resolves a `Range` header value against `len` bytes. One range is served; a header
/// with several (multipart/byteranges) or that does not parse is ignored and the whole
/// resource sent, as RFC 9110 14.2 allows.
pub fn resolve_range(header: Option<&str>, len: u64) -> Ranged {
    let Some(h) = header else {
        return Ranged::Full;
    };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Ranged::Full;
    };
    if spec.contains(',') {
        return Ranged::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ranged::Full;
    };
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            None
        } else {
            // Digits too many for u64 mean "past any end".
            Some(s.parse().unwrap_or(u64::MAX))
        }
    };
    match (a.trim().is_empty(), num(a), num(b)) {
        // bytes=-N: the last N bytes.
        (true, _, Some(n)) => {
            if n == 0 || len == 0 {
                Ranged::Unsatisfiable
            } else {
                Ranged::Part {
                    start: len.saturating_sub(n),
                    end: len - 1,
                }
            }
        }
        (false, Some(start), None) if b.trim().is_empty() => {
            if start >= len {
                Ranged::Unsatisfiable
            } else {
                Ranged::Part {
                    start,
                    end: len - 1,
                }
            }
        }
        (false, Some(start), Some(end)) if end >= start => {
            if start >= len {
                Ranged::Unsatisfiable
            } else {
                Ranged::Part {
                    start,
                    end: end.min(len - 1),
                }
            }
        }
        _ => Ranged::Full,
    }
}

/// An answer's head with our `Server`; its body is added by the caller.
fn head(status: StatusCode) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::SERVER, HeaderValue::from_static(SERVER));
    r
}

/// A `Content-Range` value: digits, spaces, `-`, `*` and `/` are all valid in a header.
fn content_range(s: String) -> HeaderValue {
    HeaderValue::try_from(s).expect("a Content-Range we wrote is a valid header value")
}

/// The head of a file's answer (body not included) for `range` of `len` bytes.
pub fn file_head(range: Ranged, len: u64, content_type: &'static str) -> Response<()> {
    let (mut r, length) = match range {
        Ranged::Full => (head(StatusCode::OK), len),
        Ranged::Part { start, end } => {
            let mut r = head(StatusCode::PARTIAL_CONTENT);
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                content_range(format!("bytes {start}-{end}/{len}")),
            );
            (r, end - start + 1)
        }
        Ranged::Unsatisfiable => {
            let mut r = head(StatusCode::RANGE_NOT_SATISFIABLE);
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                content_range(format!("bytes */{len}")),
            );
            (r, 0)
        }
    };
    let h = r.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The head of a small whole answer of `body_len` bytes.
pub fn small_head(status: StatusCode, body_len: usize, content_type: &'static str) -> Response<()> {
    let mut r = head(status);
    let h = r.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        h.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    r
}

/// What [`percent_encode_path`] escapes: all but unreserved characters (RFC 3986 2.3)
/// and `/`.
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `%XX` decoded; `None` for a malformed escape (RFC 3986 2.1: `%` and two hex digits),
/// a NUL or bytes that are not UTF-8: such a path names no file here.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    // The crate passes a malformed escape through as it is; a path that has one is refused.
    let malformed = b.iter().enumerate().any(|(i, &c)| {
        c == b'%'
            && !b
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return None;
    }
    let out = percent_decode_str(s).decode_utf8().ok()?;
    (!out.contains('\0')).then(|| out.into_owned())
}

/// Percent-encodes everything but unreserved characters and `/`.
pub fn percent_encode_path(s: &str) -> String {
    utf8_percent_encode(s, PATH).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_and_head_without_a_body() {
        assert_eq!(accept(&Method::GET, true), Ok(false));
        assert_eq!(accept(&Method::HEAD, true), Ok(true));
        assert_eq!(accept(&Method::POST, true), Err(Refused::Method));
        assert_eq!(accept(&Method::GET, false), Err(Refused::Body));
        let h = small_head(Refused::Method.status(), 18, "text/plain");
        assert_eq!(h.status(), 405);
        assert_eq!(h.headers()["allow"], "GET, HEAD");
        assert_eq!(Refused::Body.status(), 413);
        assert!(wants_refresh(Some("a=b&refresh=1")));
        assert!(!wants_refresh(Some("refresh=10")));
        assert!(!wants_refresh(None));
    }

    #[test]
    fn ranges() {
        use Ranged::*;
        let r = |h: &str, len| resolve_range(Some(h), len);
        assert_eq!(resolve_range(None, 10), Full);
        assert_eq!(r("bytes=0-", 10), Part { start: 0, end: 9 });
        assert_eq!(r("bytes=2-5", 10), Part { start: 2, end: 5 });
        assert_eq!(r("bytes=2-500", 10), Part { start: 2, end: 9 });
        assert_eq!(r("bytes=-3", 10), Part { start: 7, end: 9 });
        assert_eq!(r("bytes=-30", 10), Part { start: 0, end: 9 });
        assert_eq!(r("bytes=10-", 10), Unsatisfiable);
        assert_eq!(r("bytes=10-20", 10), Unsatisfiable);
        assert_eq!(r("bytes=-0", 10), Unsatisfiable);
        assert_eq!(r("bytes=0-", 0), Unsatisfiable);
        assert_eq!(r("bytes=99999999999999999999999-", 10), Unsatisfiable);
        // Ignored: the whole resource.
        assert_eq!(r("bytes=5-2", 10), Full);
        assert_eq!(r("bytes=0-1,4-5", 10), Full);
        assert_eq!(r("items=0-1", 10), Full);
        assert_eq!(r("bytes=a-b", 10), Full);
        assert_eq!(r("bytes=", 10), Full);
    }

    #[test]
    fn heads() {
        let h = file_head(Ranged::Part { start: 2, end: 5 }, 10, "video/mp4");
        assert_eq!(h.status(), 206);
        let get = |h: &Response<()>, k: &str| h.headers()[k].to_str().unwrap().to_owned();
        assert_eq!(get(&h, "content-range"), "bytes 2-5/10");
        assert_eq!(get(&h, "content-length"), "4");
        assert_eq!(get(&h, "accept-ranges"), "bytes");
        assert_eq!(get(&h, "content-type"), "video/mp4");
        assert_eq!(get(&h, "server"), "reservoir-media");
        let h = file_head(Ranged::Unsatisfiable, 10, "video/mp4");
        assert_eq!(h.status(), 416);
        assert_eq!(get(&h, "content-range"), "bytes */10");
        assert_eq!(get(&h, "content-length"), "0");
        let h = file_head(Ranged::Full, 10, "video/mp4");
        assert_eq!(
            (h.status().as_u16(), get(&h, "content-length")),
            (200, "10".into())
        );
        assert!(h.headers().get("content-range").is_none());
    }

    #[test]
    fn percent() {
        assert_eq!(percent_decode("a%20b%C3%A9").as_deref(), Some("a bé"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%2"), None);
        assert_eq!(percent_decode("a%"), None);
        assert_eq!(percent_decode("%%41"), None);
        assert_eq!(percent_decode("a%00"), None);
        assert_eq!(percent_decode("%FF"), None);
        assert_eq!(percent_encode_path("/a b/é.mp4"), "/a%20b/%C3%A9.mp4");
        assert_eq!(percent_encode_path("/A-z_0.9~"), "/A-z_0.9~");
        let s = "/x y/ü?#%.mkv";
        assert_eq!(percent_decode(&percent_encode_path(s)).as_deref(), Some(s));
    }
}
