//! The little HTTP/1.1 the control channel speaks, sans-IO: a message is a start line,
//! headers and a body of `Content-Length` bytes; one request per connection
//! (`Connection: close`). [`Parser`] takes bytes as they come and yields the message once
//! whole; [`Message::encode`] writes one. Standard tools (curl) can talk to it, given the
//! `Authorization` header of [`crate::auth`].

/// Largest body accepted: a checksum list of a 16 TiB member in 1 MiB units is ~1 MiB of
/// JSON per 8k units; 64 MiB is room for far more.
pub const MAX_BODY: usize = 64 << 20;
const MAX_HEAD: usize = 16 << 10;

/// A request (`start` = `METHOD PATH HTTP/1.1`) or an answer (`HTTP/1.1 STATUS REASON`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub start: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HttpError {
    #[error("header section longer than 16 KiB")]
    HeadTooLong,
    #[error("body of {0} bytes is over the 64 MiB limit")]
    BodyTooLong(usize),
    #[error("malformed HTTP: {0}")]
    Malformed(&'static str),
}

impl Message {
    pub fn request(method: &str, path: &str, body: Vec<u8>) -> Message {
        Message {
            start: format!("{method} {path} HTTP/1.1"),
            headers: Vec::new(),
            body,
        }
    }

    pub fn answer(status: u16, body: Vec<u8>) -> Message {
        Message {
            start: format!("HTTP/1.1 {status} {}", reason(status)),
            headers: vec![("Content-Type".into(), "application/json".into())],
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Message {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    /// `(method, path)` of a request.
    pub fn method_path(&self) -> Result<(&str, &str), HttpError> {
        let mut it = self.start.split(' ');
        match (it.next(), it.next(), it.next(), it.next()) {
            (Some(m), Some(p), Some(v), None) if v.starts_with("HTTP/1.") && p.starts_with('/') => {
                Ok((m, p))
            }
            _ => Err(HttpError::Malformed("request line")),
        }
    }

    /// The status of an answer.
    pub fn status(&self) -> Result<u16, HttpError> {
        let mut it = self.start.splitn(3, ' ');
        match (it.next(), it.next()) {
            (Some(v), Some(s)) if v.starts_with("HTTP/1.") => {
                s.parse().map_err(|_| HttpError::Malformed("status"))
            }
            _ => Err(HttpError::Malformed("status line")),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 256);
        out.extend_from_slice(self.start.as_bytes());
        out.extend_from_slice(b"\r\n");
        for (k, v) in &self.headers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(
            format!(
                "Content-Length: {}\r\nConnection: close\r\n\r\n",
                self.body.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(&self.body);
        out
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        409 => "Conflict",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

/// Gathers one message from bytes as they arrive.
#[derive(Default, Debug)]
pub struct Parser {
    buf: Vec<u8>,
}

impl Parser {
    /// Adds bytes; returns the message once it is whole. Bytes past its end are ignored
    /// (one message per connection).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Option<Message>, HttpError> {
        self.buf.extend_from_slice(bytes);
        let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            if self.buf.len() > MAX_HEAD {
                return Err(HttpError::HeadTooLong);
            }
            return Ok(None);
        };
        if end > MAX_HEAD {
            return Err(HttpError::HeadTooLong);
        }
        let head =
            std::str::from_utf8(&self.buf[..end]).map_err(|_| HttpError::Malformed("not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let start = lines.next().unwrap_or_default().to_owned();
        let mut headers = Vec::new();
        let mut length = 0usize;
        for line in lines {
            let (k, v) = line
                .split_once(':')
                .ok_or(HttpError::Malformed("header line"))?;
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                length = v
                    .parse()
                    .map_err(|_| HttpError::Malformed("Content-Length"))?;
                if length > MAX_BODY {
                    return Err(HttpError::BodyTooLong(length));
                }
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                return Err(HttpError::Malformed(
                    "Transfer-Encoding is not supported; send Content-Length",
                ));
            } else if !k.eq_ignore_ascii_case("connection") {
                headers.push((k.to_owned(), v.to_owned()));
            }
        }
        let body_at = end + 4;
        if self.buf.len() < body_at + length {
            return Ok(None);
        }
        Ok(Some(Message {
            start,
            headers,
            body: self.buf[body_at..body_at + length].to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_in_pieces() {
        let m = Message::request("POST", "/v1/send", b"{\"a\":1}".to_vec())
            .with_header("Authorization", "RSV1 x");
        let bytes = m.encode();
        for split in 0..bytes.len() {
            let mut p = Parser::default();
            assert_eq!(p.push(&bytes[..split]).unwrap(), None, "split {split}");
            let got = p.push(&bytes[split..]).unwrap().unwrap();
            assert_eq!(got, m);
            assert_eq!(got.method_path().unwrap(), ("POST", "/v1/send"));
        }
        let a = Message::answer(404, b"{}".to_vec());
        let got = Parser::default().push(&a.encode()).unwrap().unwrap();
        assert_eq!(got.status().unwrap(), 404);
    }

    #[test]
    fn limits_and_garbage() {
        let mut p = Parser::default();
        assert_eq!(
            p.push(b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"),
            Err(HttpError::BodyTooLong(99999999999))
        );
        assert!(Parser::default().push(&vec![b'a'; MAX_HEAD + 10]).is_err());
        assert!(Parser::default()
            .push(b"GET / HTTP/1.1\r\nnocolon\r\n\r\n")
            .is_err());
        let m = Parser::default()
            .push(b"GET nopath HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(m.method_path().is_err());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut p = Parser::default();
            if let Ok(Some(m)) = p.push(&bytes) {
                let _ = m.method_path();
                let _ = m.status();
            }
        }
    }
}
