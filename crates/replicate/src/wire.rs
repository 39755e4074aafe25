//! The control channel's sockets: the only module of this crate that touches the network
//! for control (the data goes over iSCSI, through the initiator library). One request per
//! TCP connection; both directions authenticated by [`crate::auth`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::auth::{Key, Verifier};
use crate::http::{Message, Parser};

/// How long one side waits for the other's message.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn read_message(stream: &mut TcpStream) -> anyhow::Result<Message> {
    let mut parser = Parser::default();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            bail!("connection closed before a whole message");
        }
        if let Some(m) = parser.push(&buf[..n])? {
            return Ok(m);
        }
    }
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
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("control accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let verifier = verifier.clone();
        let handle = handle.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let request = match tokio::time::timeout(IO_TIMEOUT, read_message(&mut stream)).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => {
                    tracing::debug!("control request from {peer}: {e}");
                    return;
                }
                Err(_) => return,
            };
            let Ok((method, path)) = request.method_path() else {
                let _ = stream
                    .write_all(&Message::answer(400, error_body("malformed request line")).encode())
                    .await;
                return;
            };
            let (method, path) = (method.to_owned(), path.to_owned());
            let checked = verifier.lock().unwrap().check(
                &method,
                &path,
                request.header("Authorization"),
                &request.body,
                now_unix(),
            );
            let answer = match checked {
                Err(e) => {
                    // Logged without anything secret: who, what and why.
                    tracing::warn!("control request {method} {path} from {peer} refused: {e}");
                    Message::answer(401, error_body(&e.to_string()))
                }
                Ok(nonce) => {
                    let (status, body) = handle(method, path, request.body).await;
                    let mac = key.sign_answer(&nonce, status, &body);
                    Message::answer(status, body).with_header("X-Rsv-Mac", mac)
                }
            };
            let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(&answer.encode())).await;
            let _ = stream.shutdown().await;
        });
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

impl Client {
    pub fn new(addr: impl Into<String>, key: Key) -> Client {
        Client {
            addr: addr.into(),
            key,
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
        let request = Message::request(method, path, body)
            .with_header("Host", self.addr.clone())
            .with_header("Content-Type", "application/json")
            .with_header("Authorization", auth);
        let exchange = async {
            let mut stream = TcpStream::connect(&self.addr)
                .await
                .with_context(|| format!("control endpoint {}", self.addr))?;
            let _ = stream.set_nodelay(true);
            stream.write_all(&request.encode()).await?;
            read_message(&mut stream).await
        };
        let answer = tokio::time::timeout(IO_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                anyhow!(
                    "control endpoint {}: no answer within {IO_TIMEOUT:?}",
                    self.addr
                )
            })??;
        let status = answer.status()?;
        if status == 401 {
            let why = serde_json::from_slice::<crate::api::ErrorBody>(&answer.body)
                .map_or_else(|_| "refused".to_owned(), |e| e.error);
            bail!(
                "control endpoint {}: authentication refused: {why}",
                self.addr
            );
        }
        let mac = answer.header("X-Rsv-Mac").unwrap_or_default();
        if !self.key.check_answer(&nonce, status, &answer.body, mac) {
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
