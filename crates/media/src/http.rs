//! The HTTP/1.1 the media server speaks, sans-IO: a request head parsed from bytes as
//! they come ([`parse_request`]), `Range` resolved against a file's length
//! ([`resolve_range`], RFC 9110 14), and the head of an answer ([`Head`]). Only GET and
//! HEAD carry meaning here; a request body is refused (none of our resources takes one).
//! Connections are kept alive unless the client says `Connection: close` or speaks 1.0.

/// Longest request head accepted.
pub const MAX_HEAD: usize = 16 << 10;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path as sent (percent-encoded), without the query.
    pub path: String,
    pub query: Option<String>,
    pub headers: Vec<(String, String)>,
    /// Whether the connection may carry another request after the answer.
    pub keep_alive: bool,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HttpError {
    #[error("request head longer than 16 KiB")]
    HeadTooLong,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("request bodies are not accepted")]
    Body,
}

impl HttpError {
    /// The status to answer it with.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeadTooLong => 431,
            HttpError::Malformed(_) => 400,
            HttpError::Body => 413,
        }
    }
}

/// The request at the start of `buf` and the bytes it took, `Ok(None)` while its head is
/// not complete.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, HttpError> {
    let Some(end) = find_head_end(buf) else {
        return if buf.len() > MAX_HEAD {
            Err(HttpError::HeadTooLong)
        } else {
            Ok(None)
        };
    };
    if end > MAX_HEAD {
        return Err(HttpError::HeadTooLong);
    }
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| HttpError::Malformed("not UTF-8"))?;
    let mut lines = head
        .split("\r\n")
        .map(|l| l.strip_suffix('\r').unwrap_or(l));
    // A client may send empty lines before a request (RFC 9112 2.2).
    let start = lines
        .by_ref()
        .find(|l| !l.is_empty())
        .ok_or(HttpError::Malformed("no request line"))?;
    let mut parts = start.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Malformed(
            "request line is not METHOD TARGET VERSION",
        ));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(HttpError::Malformed("bad method"));
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(HttpError::Malformed("not HTTP/1.x")),
    };
    if !target.starts_with('/') {
        return Err(HttpError::Malformed("target is not an absolute path"));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target.to_owned(), None),
    };
    let mut headers = Vec::new();
    for l in lines.filter(|l| !l.is_empty()) {
        let (k, v) = l
            .split_once(':')
            .ok_or(HttpError::Malformed("header without a colon"))?;
        if k.is_empty() || k.ends_with(' ') || k.ends_with('\t') {
            return Err(HttpError::Malformed("bad header name"));
        }
        headers.push((k.to_owned(), v.trim().to_owned()));
    }
    let req = Request {
        method: method.to_owned(),
        path,
        query,
        keep_alive: false,
        headers,
    };
    if req.header("transfer-encoding").is_some()
        || req
            .header("content-length")
            .is_some_and(|v| v.trim() != "0")
    {
        return Err(HttpError::Body);
    }
    let conn = req.header("connection").unwrap_or("").to_ascii_lowercase();
    let keep_alive = if http11 {
        !conn.split(',').any(|t| t.trim() == "close")
    } else {
        conn.split(',').any(|t| t.trim() == "keep-alive")
    };
    Ok(Some((Request { keep_alive, ..req }, end + 4)))
}

/// Offset of the `\r\n\r\n` that ends the head.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
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

/// The head of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
}

impl Head {
    pub fn new(status: u16) -> Head {
        Head {
            status,
            headers: vec![("Server", "reservoir-media".to_owned())],
        }
    }

    pub fn with(mut self, name: &'static str, value: impl Into<String>) -> Head {
        self.headers.push((name, value.into()));
        self
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The head of a file's answer (body not included) for `range` of `len` bytes.
    pub fn for_file(range: Ranged, len: u64, content_type: &str, keep_alive: bool) -> Head {
        let h = match range {
            Ranged::Full => Head::new(200).with("Content-Length", len.to_string()),
            Ranged::Part { start, end } => Head::new(206)
                .with("Content-Length", (end - start + 1).to_string())
                .with("Content-Range", format!("bytes {start}-{end}/{len}")),
            Ranged::Unsatisfiable => Head::new(416)
                .with("Content-Length", "0")
                .with("Content-Range", format!("bytes */{len}")),
        };
        h.with("Accept-Ranges", "bytes")
            .with("Content-Type", content_type)
            .with("Cache-Control", "no-cache")
            .keep_alive(keep_alive)
    }

    /// A small whole answer: its head with length and type.
    pub fn for_body(status: u16, body_len: usize, content_type: &str, keep_alive: bool) -> Head {
        Head::new(status)
            .with("Content-Length", body_len.to_string())
            .with("Content-Type", content_type)
            .keep_alive(keep_alive)
    }

    fn keep_alive(self, keep: bool) -> Head {
        self.with("Connection", if keep { "keep-alive" } else { "close" })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (k, v) in &self.headers {
            s.push_str(k);
            s.push_str(": ");
            s.push_str(v);
            s.push_str("\r\n");
        }
        s.push_str("\r\n");
        s.into_bytes()
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        304 => "Not Modified",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// `%XX` decoded; `None` for a bad escape, a NUL or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return None;
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes everything but unreserved characters and `/`.
pub fn percent_encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Request {
        parse_request(s.as_bytes()).unwrap().unwrap().0
    }

    #[test]
    fn parses_a_request_in_pieces() {
        let full = b"GET /media/a%20b.mp4?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-\r\n\r\nGET";
        for cut in 0..full.len() - 3 {
            if cut < full.len() - 3 {
                assert_eq!(parse_request(&full[..cut]).unwrap(), None, "cut {cut}");
            }
        }
        let (r, used) = parse_request(full).unwrap().unwrap();
        assert_eq!(used, full.len() - 3);
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/media/a%20b.mp4");
        assert_eq!(r.query.as_deref(), Some("x=1"));
        assert_eq!(r.header("range"), Some("bytes=0-"));
        assert!(r.keep_alive);
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!req("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(!req("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
    }

    #[test]
    fn refuses_bad_requests_without_panicking() {
        for bad in [
            "GET\r\n\r\n",
            "GET / HTTP/2\r\n\r\n",
            "get / HTTP/1.1\r\n\r\n",
            "GET x HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
            "GET / HTTP/1.1 extra\r\n\r\n",
        ] {
            assert!(
                matches!(parse_request(bad.as_bytes()), Err(HttpError::Malformed(_))),
                "{bad:?}"
            );
        }
        let body = parse_request(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(body, Err(HttpError::Body));
        let long = vec![b'a'; MAX_HEAD + 1];
        assert_eq!(parse_request(&long), Err(HttpError::HeadTooLong));
        // Random bytes never panic.
        let mut x = 0x1234_5678u32;
        for n in 0..2000 {
            let buf: Vec<u8> = (0..n % 97)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    [
                        b'G',
                        b'E',
                        b'T',
                        b' ',
                        b'/',
                        b'\r',
                        b'\n',
                        b':',
                        (x >> 8) as u8,
                    ][x as usize % 9]
                })
                .collect();
            let _ = parse_request(&buf);
        }
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
        let h = Head::for_file(Ranged::Part { start: 2, end: 5 }, 10, "video/mp4", true);
        let t = String::from_utf8(h.encode()).unwrap();
        assert!(t.starts_with("HTTP/1.1 206 Partial Content\r\n"), "{t}");
        assert!(t.contains("Content-Range: bytes 2-5/10\r\n"), "{t}");
        assert!(t.contains("Content-Length: 4\r\n"), "{t}");
        assert!(t.contains("Accept-Ranges: bytes\r\n"), "{t}");
        assert!(t.ends_with("Connection: keep-alive\r\n\r\n"), "{t}");
        let h = Head::for_file(Ranged::Unsatisfiable, 10, "video/mp4", false);
        assert_eq!(h.status, 416);
        assert_eq!(h.get("content-range"), Some("bytes */10"));
        let h = Head::for_file(Ranged::Full, 10, "video/mp4", false);
        assert_eq!((h.status, h.get("Content-Length")), (200, Some("10")));
    }

    #[test]
    fn percent() {
        assert_eq!(percent_decode("a%20b%C3%A9").as_deref(), Some("a bé"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%2"), None);
        assert_eq!(percent_decode("a%00"), None);
        assert_eq!(percent_encode_path("/a b/é.mp4"), "/a%20b/%C3%A9.mp4");
        let s = "/x y/ü?#%.mkv";
        assert_eq!(percent_decode(&percent_encode_path(s)).as_deref(), Some(s));
    }
}
