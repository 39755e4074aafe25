//! The control channel's sockets: the only module of this crate that touches the network
//! for control (the data goes over iSCSI, through the initiator library). HTTP/1.1 through
//! hyper; both directions authenticated by [`crate::auth`], every request on its own
//! (a request's MAC covers its nonce, never the connection it came on).
//!
//! Connections are kept between requests (HTTP keep-alive): over a long path a new TCP
//! connection costs a round trip before the request's own, and a coordinator asks the far
//! site's agents a dozen times a cycle. The client keeps an idle connection for
//! [`IDLE_KEEP`] at most, under the agent's [`IO_TIMEOUT`] wait for the next request's
//! head (after which the agent closes it), so that a request is not sent on a connection
//! the agent is closing; one that went out on a kept connection that turned out closed
//! before it was sent is sent again on a new one (it was never written, so never
//! processed). An agent of an older version answers `Connection: close`, and its
//! connections are not kept.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, HOST};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::auth::{Key, Verifier};

/// How long one side waits for the other's message; also how long the agent keeps an
/// idle connection open for the next request.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the client keeps an idle connection: well under the agent's [`IO_TIMEOUT`],
/// so that the agent never closes one the client is about to use.
pub const IDLE_KEEP: Duration = Duration::from_secs(20);
/// Idle connections kept per agent (a coordinator asks one agent a few things at once at
/// most: a job's status, its pacing, a cut's step).
const IDLE_PER_AGENT: usize = 4;
/// Largest body accepted: a checksum list of a 16 TiB member in 1 MiB units is ~1 MiB of
/// JSON per 8k units; 64 MiB is room for far more.
pub const MAX_BODY: usize = 64 << 20;
/// Largest request head: ours are a few hundred bytes.
const MAX_HEAD: usize = 16 << 10;
/// The answer's MAC header ([`Key::sign_answer`]).
const MAC: &str = "x-rsv-mac";

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Serves requests on `listener` until the task is dropped: each is checked, given to
/// `handle(method, path, body)`, and its answer signed.
pub async fn serve<H, F>(listener: TcpListener, key: Key, handle: H)
where
    H: Fn(String, String, Vec<u8>) -> F + Send + Sync + 'static,
    F: Future<Output = (u16, Vec<u8>)> + Send + 'static,
{
    let verifier = Arc::new(Mutex::new(Verifier::new(key.clone())));
    let handle = Arc::new(handle);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        // Kept for the next request until it comes, or for IO_TIMEOUT without one (the
        // header read timeout runs while the connection waits idle, too).
        .keep_alive(true);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("control accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (verifier, handle, key, http) =
            (verifier.clone(), handle.clone(), key.clone(), http.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let (verifier, handle, key) = (verifier.clone(), handle.clone(), key.clone());
                async move {
                    let (status, body, mac) = answer(req, peer, &verifier, &key, &*handle).await;
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    *r.status_mut() = status;
                    let h = r.headers_mut();
                    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    if let Some(mac) = mac.and_then(|m| HeaderValue::try_from(m).ok()) {
                        h.insert(MAC, mac);
                    }
                    Ok::<_, Infallible>(r)
                }
            });
            if let Err(e) = http.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!("control request from {peer}: {e}");
            }
        });
    }
}

/// The answer to one request: its status, body and MAC (none for a request refused
/// before it was authenticated).
async fn answer<H, F>(
    req: Request<hyper::body::Incoming>,
    peer: SocketAddr,
    verifier: &Mutex<Verifier>,
    key: &Key,
    handle: &H,
) -> (StatusCode, Vec<u8>, Option<String>)
where
    H: Fn(String, String, Vec<u8>) -> F,
    F: Future<Output = (u16, Vec<u8>)>,
{
    let method = req.method().as_str().to_owned();
    let Some(path) = req.uri().path_and_query().map(|p| p.as_str().to_owned()) else {
        let e = error_body("the request target is not a path");
        return (StatusCode::BAD_REQUEST, e, None);
    };
    let auth = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match tokio::time::timeout(
        IO_TIMEOUT,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => {
            tracing::debug!("control request {method} {path} from {peer}: {e}");
            let e = error_body(&format!("request body: {e} (at most {MAX_BODY} bytes)"));
            return (StatusCode::PAYLOAD_TOO_LARGE, e, None);
        }
        Err(_) => {
            let e = error_body("request body: not whole within 30 s");
            return (StatusCode::REQUEST_TIMEOUT, e, None);
        }
    };
    let checked =
        verifier
            .lock()
            .unwrap()
            .check(&method, &path, auth.as_deref(), &body, now_unix());
    match checked {
        Err(e) => {
            // Logged without anything secret: who, what and why.
            tracing::warn!("control request {method} {path} from {peer} refused: {e}");
            (StatusCode::UNAUTHORIZED, error_body(&e.to_string()), None)
        }
        Ok(nonce) => {
            let (status, body) = handle(method, path, body.to_vec()).await;
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mac = key.sign_answer(&nonce, status.as_u16(), &body);
            (status, body, Some(mac))
        }
    }
}

pub fn error_body(message: &str) -> Vec<u8> {
    serde_json::to_vec(&crate::api::ErrorBody {
        error: message.to_owned(),
    })
    .unwrap_or_default()
}

/// A disk server's control endpoint as the coordinator reaches it.
#[derive(Clone, Debug)]
pub struct Client {
    pub addr: String,
    key: Key,
}

/// An answer as it came: status, MAC header and body.
struct Answer {
    status: u16,
    mac: String,
    body: Bytes,
}

impl Client {
    pub fn new(addr: impl Into<String>, key: Key) -> Client {
        Client {
            addr: addr.into(),
            key,
        }
    }

    /// One request, on a kept connection to this agent if there is one, else on a new
    /// one; the connection is kept afterwards unless the agent said it closes it.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> anyhow::Result<Answer> {
        // Connections are driven by a task on the runtime that made them: keyed by it, so
        // that a request never waits on another runtime (tests run many).
        let key = tokio::runtime::Handle::try_current()
            .ok()
            .map(|h| (h.id(), self.addr.clone()));
        let mut request = request;
        while let Some(mut conn) = key.as_ref().and_then(take_idle) {
            // Ready once its task has taken the last answer's end; an error: it closed.
            if conn.sender.ready().await.is_err() {
                continue;
            }
            match conn.sender.try_send_request(request).await {
                Ok(answer) => return finish(answer, conn, key).await,
                Err(mut e) => match e.take_message() {
                    // Never written: the connection had closed. A new one takes it.
                    Some(r) => {
                        tracing::debug!(
                            "control endpoint {}: a kept connection had closed ({}); a new one",
                            self.addr,
                            e.error()
                        );
                        request = r;
                    }
                    None => return Err(e.into_error().into()),
                },
            }
        }
        let stream = TcpStream::connect(&self.addr).await?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // The connection's I/O runs in a task of its own, for as long as it is kept;
        // dropping the `Conn` (an error, the caller's timeout, an idle one let go) ends it.
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("control connection: {e}");
            }
        })
        .abort_handle();
        let mut conn = Conn {
            sender,
            task,
            since: Instant::now(),
        };
        let answer = conn.sender.send_request(request).await?;
        finish(answer, conn, key).await
    }

    /// Sends a request and returns the answer's JSON, checked to come from a holder of
    /// the key; an error status becomes an error with the agent's message.
    pub async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &impl serde::Serialize,
    ) -> anyhow::Result<T> {
        let body = if method == "GET" {
            Vec::new()
        } else {
            serde_json::to_vec(body)?
        };
        let (auth, nonce) = self.key.sign_request(method, path, &body, now_unix());
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.addr.as_str())
            .header(CONTENT_TYPE, "application/json")
            .header(AUTHORIZATION, auth)
            .body(Full::new(Bytes::from(body)))
            .with_context(|| format!("control request {method} {path}"))?;
        let answer = tokio::time::timeout(IO_TIMEOUT, self.exchange(request))
            .await
            .map_err(|_| {
                anyhow!(
                    "control endpoint {}: no answer within {IO_TIMEOUT:?}",
                    self.addr
                )
            })?
            .with_context(|| format!("control endpoint {}", self.addr))?;
        let status = answer.status;
        if status == 401 {
            let why = serde_json::from_slice::<crate::api::ErrorBody>(&answer.body)
                .map_or_else(|_| "refused".to_owned(), |e| e.error);
            bail!(
                "control endpoint {}: authentication refused: {why}",
                self.addr
            );
        }
        if !self
            .key
            .check_answer(&nonce, status, &answer.body, &answer.mac)
        {
            bail!(
                "control endpoint {}: the answer is not signed with our key (wrong key file, or not a Reservoir agent)",
                self.addr
            );
        }
        if status != 200 {
            let why = serde_json::from_slice::<crate::api::ErrorBody>(&answer.body)
                .map_or_else(|_| format!("status {status}"), |e| e.error);
            bail!("{}: {why}", self.addr);
        }
        serde_json::from_slice(&answer.body).with_context(|| {
            format!(
                "control endpoint {}: unexpected answer to {method} {path}",
                self.addr
            )
        })
    }
}

/// A client connection to an agent: the sender and the task that drives its I/O.
struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: tokio::task::AbortHandle,
    /// Since when it is idle (kept).
    since: Instant,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Not kept: its socket closes now, not when the peer notices.
        self.task.abort();
    }
}

type PoolKey = (tokio::runtime::Id, String);

/// Idle connections by runtime and agent address.
static IDLE: LazyLock<Mutex<HashMap<PoolKey, Vec<Conn>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A kept connection to `key`'s agent that is still open and idle for less than
/// [`IDLE_KEEP`]; older or closed ones are dropped on the way.
fn take_idle(key: &PoolKey) -> Option<Conn> {
    let mut idle = IDLE.lock().unwrap();
    let list = idle.get_mut(key)?;
    while let Some(c) = list.pop() {
        if c.since.elapsed() < IDLE_KEEP && !c.sender.is_closed() {
            return Some(c);
        }
    }
    None
}

/// Keeps `conn` for the next request to its agent.
fn keep(key: PoolKey, mut conn: Conn) {
    conn.since = Instant::now();
    let mut idle = IDLE.lock().unwrap();
    // Every agent's list loses its stale connections here, so none piles up.
    idle.retain(|_, list| {
        list.retain(|c| c.since.elapsed() < IDLE_KEEP && !c.sender.is_closed());
        !list.is_empty()
    });
    let list = idle.entry(key).or_default();
    if list.len() < IDLE_PER_AGENT {
        list.push(conn);
    }
}

/// Reads an answer whole; its connection is kept unless the agent closes it.
async fn finish(
    answer: Response<hyper::body::Incoming>,
    conn: Conn,
    key: Option<PoolKey>,
) -> anyhow::Result<Answer> {
    let status = answer.status().as_u16();
    let mac = answer
        .headers()
        .get(MAC)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // An older agent closes every connection after its answer.
    let closes = answer
        .headers()
        .get(CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let body = Limited::new(answer.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| anyhow!("answer body: {e}"))?
        .to_bytes();
    if let (Some(key), false) = (key, closes) {
        keep(key, conn);
    }
    Ok(Answer { status, mac, body })
}

/// Binds the control listener.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("control endpoint {addr}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A relay in front of an agent's endpoint that counts the connections it accepts
    /// and can cut every one it carries.
    struct Relay {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        carried: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    }

    async fn relay(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let carried = Arc::new(Mutex::new(Vec::new()));
        let (a, c) = (accepted.clone(), carried.clone());
        tokio::spawn(async move {
            while let Ok((mut near, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let task = tokio::spawn(async move {
                    let mut far = TcpStream::connect(to).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut near, &mut far).await;
                });
                c.lock().unwrap().push(task.abort_handle());
            }
        });
        Relay {
            addr,
            accepted,
            carried,
        }
    }

    /// Requests to one agent go on one kept connection (one TCP handshake, not one a
    /// request: a round trip each over a long path); once that connection is cut, the
    /// next request goes on a new one and is answered. Fails with the agent's or the
    /// client's keep-alive off (three connections), or with a closed connection reused.
    #[tokio::test]
    async fn requests_share_a_kept_connection_and_a_closed_one_is_replaced() {
        let key = Key::new(b"0123456789abcdef-shared").unwrap();
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let agent = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, key.clone(), |_m, path, _b| async move {
            (
                200,
                serde_json::to_vec(&serde_json::json!({ "path": path })).unwrap(),
            )
        }));
        let relay = relay(agent).await;
        let client = Client::new(relay.addr.to_string(), key);
        for i in 0..3 {
            let path = format!("/v1/test/{i}");
            let v: serde_json::Value = client.call("POST", &path, &()).await.unwrap();
            assert_eq!(v["path"], path);
        }
        assert_eq!(relay.accepted.load(Ordering::SeqCst), 1, "one connection");
        // The agent restarts, or a middlebox drops the connection.
        for t in relay.carried.lock().unwrap().drain(..) {
            t.abort();
        }
        // The kept connection's task sees its end.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let v: serde_json::Value = client.call("GET", "/v1/after", &()).await.unwrap();
        assert_eq!(v["path"], "/v1/after");
        assert_eq!(relay.accepted.load(Ordering::SeqCst), 2, "a new connection");
    }
}
