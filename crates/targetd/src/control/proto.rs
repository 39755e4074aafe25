//! The control socket's protocol, sans-IO: the client sends one request, a JSON object on
//! one line (`{"op":"status"}`, `{"op":"drop","session":3,"wait_s":10}`), at most
//! [`MAX_REQUEST`] bytes; the target answers one JSON object on one line and closes.
//! Anything else (too long, not JSON, an unknown op or field) is answered with an error.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::status::TargetStatus;

/// The longest request line taken, newline included; a request has no reason to be
/// longer than a few dozen bytes.
pub const MAX_REQUEST: usize = 4096;
/// The longest answer a client reads: a snapshot of some thousand sessions fits.
pub const MAX_RESPONSE: usize = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", try_from = "WireRequest")]
pub enum Request {
    /// A snapshot of every session ([`TargetStatus`]).
    Status,
    /// End session `session` (its TSIH): ask its initiator to log out within `wait_s`
    /// seconds (Async Message event 1), then close its connections; 0: close them at once.
    Drop { session: u16, wait_s: u16 },
}

/// A request as read: every field any request has, none other. serde's
/// `deny_unknown_fields` does not reach the unit variants of a tagged enum, so each
/// request's fields are checked here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRequest {
    op: Op,
    session: Option<u16>,
    wait_s: Option<u16>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    Status,
    Drop,
}

impl TryFrom<WireRequest> for Request {
    type Error = &'static str;

    fn try_from(w: WireRequest) -> Result<Request, &'static str> {
        match (w.op, w.session, w.wait_s) {
            (Op::Status, None, None) => Ok(Request::Status),
            (Op::Status, ..) => Err("status takes no session or wait_s"),
            (Op::Drop, Some(session), wait_s) => Ok(Request::Drop {
                session,
                wait_s: wait_s.unwrap_or(0),
            }),
            (Op::Drop, None, _) => Err("drop needs a session"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Status(TargetStatus),
    Dropped(Dropped),
    Error(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    pub tsih: u16,
    pub outcome: DropOutcome,
}

/// How a dropped session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropOutcome {
    /// Its initiator logged out, as asked.
    LoggedOut,
    /// Its initiator closed its connections without a logout.
    ClosedByInitiator,
    /// The target closed its connections: at once, or no logout came in time.
    Dropped,
}

impl fmt::Display for DropOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropOutcome::LoggedOut => "the initiator logged out",
            DropOutcome::ClosedByInitiator => "the initiator closed its connections",
            DropOutcome::Dropped => "its connections were dropped",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("request longer than {MAX_REQUEST} bytes")]
    TooLong,
    #[error("empty request")]
    Empty,
    #[error("bad request: {0}")]
    Json(String),
    #[error("bad answer: {0}")]
    Answer(String),
    #[error("{0}")]
    Io(String),
}

/// Collects a request line from the bytes as they arrive.
#[derive(Debug, Default)]
pub struct RequestReader {
    buf: Vec<u8>,
}

impl RequestReader {
    /// Takes the next bytes; the request once its line is complete. Bytes after the
    /// newline are ignored (one request per connection).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<Request>, ProtoError> {
        let room = MAX_REQUEST - self.buf.len();
        let seen = &bytes[..bytes.len().min(room)];
        if let Some(nl) = seen.iter().position(|&b| b == b'\n') {
            self.buf.extend_from_slice(&seen[..nl]);
            return parse_request(&self.buf).map(Some);
        }
        if bytes.len() >= room {
            return Err(ProtoError::TooLong);
        }
        self.buf.extend_from_slice(bytes);
        Ok(None)
    }

    /// The request, when the client shut its side without a newline.
    pub fn finish(&self) -> Result<Request, ProtoError> {
        parse_request(&self.buf)
    }
}

/// One request line, without its newline.
pub fn parse_request(line: &[u8]) -> Result<Request, ProtoError> {
    if line.len() >= MAX_REQUEST {
        return Err(ProtoError::TooLong);
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(ProtoError::Empty);
    }
    serde_json::from_slice(line).map_err(|e| ProtoError::Json(e.to_string()))
}

/// A request or response as sent: its JSON and a newline.
pub fn encode(msg: &impl Serialize) -> Vec<u8> {
    let mut v = serde_json::to_vec(msg).expect("control messages serialize");
    v.push(b'\n');
    v
}

pub fn parse_response(bytes: &[u8]) -> Result<Response, ProtoError> {
    if bytes.len() > MAX_RESPONSE {
        return Err(ProtoError::Answer(format!(
            "longer than {MAX_RESPONSE} bytes"
        )));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ProtoError::Answer(
            "nothing (the target closed the socket without answering)".into(),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| ProtoError::Answer(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request(br#"{"op":"status"}"#), Ok(Request::Status));
        assert_eq!(
            parse_request(br#"{"op":"drop","session":3,"wait_s":10}"#),
            Ok(Request::Drop {
                session: 3,
                wait_s: 10
            })
        );
        assert_eq!(
            parse_request(br#"{"op":"drop","session":7}"#),
            Ok(Request::Drop {
                session: 7,
                wait_s: 0
            })
        );
        let encoded = encode(&Request::Drop {
            session: 65535,
            wait_s: 1,
        });
        assert_eq!(encoded.last(), Some(&b'\n'));
        let mut r = RequestReader::default();
        assert_eq!(
            r.feed(&encoded),
            Ok(Some(Request::Drop {
                session: 65535,
                wait_s: 1
            }))
        );
    }

    #[test]
    fn bad_requests_are_errors() {
        for bad in [
            &b""[..],
            b"  ",
            b"status",
            b"{}",
            br#"{"op":"reboot"}"#,
            br#"{"op":"status","x":1}"#,
            br#"{"op":"status","session":1}"#,
            br#"{"op":"drop"}"#,
            br#"{"op":"drop","session":65536}"#,
            br#"{"op":"drop","session":-1}"#,
            br#"{"op":"drop","session":1,"wait_s":"10"}"#,
            b"\xff\xfe",
        ] {
            assert!(
                parse_request(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_request_comes_in_pieces_and_stops_at_its_newline() {
        let mut r = RequestReader::default();
        assert_eq!(r.feed(b"{\"op\":"), Ok(None));
        assert_eq!(r.feed(b"\"status\"}"), Ok(None));
        assert_eq!(r.feed(b"\n{\"op\":\"drop\"}"), Ok(Some(Request::Status)));
        let mut r = RequestReader::default();
        r.feed(br#"{"op":"status"}"#).unwrap();
        assert_eq!(r.finish(), Ok(Request::Status));
    }

    #[test]
    fn oversized_requests_are_refused() {
        let mut r = RequestReader::default();
        let long = vec![b' '; MAX_REQUEST - 1];
        assert_eq!(r.feed(&long), Ok(None));
        assert_eq!(r.feed(b" "), Err(ProtoError::TooLong));
        // One feed far past the limit, newline and all.
        let mut r = RequestReader::default();
        let mut big = vec![b' '; 10 * MAX_REQUEST];
        big.push(b'\n');
        assert_eq!(r.feed(&big), Err(ProtoError::TooLong));
        // Just under the limit with its newline is taken.
        let mut line = br#"{"op":"status"}"#.to_vec();
        line.resize(MAX_REQUEST - 1, b' ');
        line.push(b'\n');
        assert_eq!(
            RequestReader::default().feed(&line),
            Ok(Some(Request::Status))
        );
    }

    #[test]
    fn responses_round_trip() {
        let d = Response::Dropped(Dropped {
            tsih: 2,
            outcome: DropOutcome::LoggedOut,
        });
        let text = encode(&d);
        assert_eq!(
            std::str::from_utf8(&text).unwrap(),
            "{\"dropped\":{\"tsih\":2,\"outcome\":\"logged_out\"}}\n"
        );
        assert_eq!(parse_response(&text), Ok(d));
        let e = Response::Error("no session 9".into());
        assert_eq!(parse_response(&encode(&e)), Ok(e));
        assert!(parse_response(b"").is_err());
        assert!(parse_response(b"{\"status\":").is_err());
    }
}
