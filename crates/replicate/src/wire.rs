//! The control channel's sockets: the only module of this crate that touches the network
//! for control (the data goes over iSCSI, through the initiator library). HTTP/1.1 through
//! hyper, one request per TCP connection; both directions authenticated by
//! [`crate::auth`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::auth::{Key, Verifier};

/// How long one side waits for the other's message.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
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
        .keep_alive(false);
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

    /// One request on a connection of its own.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> anyhow::Result<Answer> {
        let stream = TcpStream::connect(&self.addr).await?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let answer = async {
            let answer = sender.send_request(request).await?;
            let status = answer.status().as_u16();
            let mac = answer
                .headers()
                .get(MAC)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = Limited::new(answer.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| anyhow!("answer body: {e}"))?
                .to_bytes();
            anyhow::Ok(Answer { status, mac, body })
        };
        // The connection's I/O runs here, not in a task of its own, so that the caller's
        // timeout ends it too. The agent closes it after the answer, which may be before
        // the body is taken from it: then the answer is finished from what it delivered.
        tokio::pin!(conn, answer);
        tokio::select! {
            a = &mut answer => a,
            c = &mut conn => {
                c?;
                answer.await
            }
        }
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

/// Binds the control listener.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("control endpoint {addr}"))
}
