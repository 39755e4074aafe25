//! The only module on the HTTP sockets: a task per connection, requests read and answered
//! one after another on it (keep-alive), files streamed from a volume in chunks with a
//! few chunks read ahead of the socket.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::http::{self, Head, Ranged, Request};
use crate::listing::{self, Listing, Route};
use crate::mime::content_type;
use crate::storage::Catalog;

/// Bytes per read from a volume while streaming.
const CHUNK: usize = 256 << 10;
/// The first chunk of an answer: small, so that the head and the first bytes go out as
/// soon as one small read of the LUN brings them (see `readahead::SMALL_READ`), while the
/// read-ahead fetches what follows.
const FIRST_CHUNK: usize = 8 << 10;
/// Chunks read ahead of the socket.
const CHUNKS_AHEAD: usize = 4;
/// A kept-alive connection with no request for this long is closed.
const IDLE: Duration = Duration::from_secs(60);

pub async fn serve(listener: TcpListener, catalog: Arc<Catalog>) -> io::Result<()> {
    loop {
        let (sock, peer) = listener.accept().await?;
        let _ = sock.set_nodelay(true);
        let catalog = catalog.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(sock, catalog).await {
                tracing::debug!("{peer}: {e}");
            }
        });
    }
}

async fn connection(mut sock: TcpStream, catalog: Arc<Catalog>) -> io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let req = loop {
            match http::parse_request(&buf) {
                Ok(Some((req, used))) => {
                    buf.drain(..used);
                    break req;
                }
                Ok(None) => {}
                Err(e) => {
                    let body = format!("{e}\n");
                    let head = Head::for_body(e.status(), body.len(), "text/plain", false);
                    sock.write_all(&head.encode()).await?;
                    sock.write_all(body.as_bytes()).await?;
                    return Ok(());
                }
            }
            let mut chunk = [0u8; 4096];
            let n = match tokio::time::timeout(IDLE, sock.read(&mut chunk)).await {
                Ok(r) => r?,
                Err(_) => return Ok(()),
            };
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let keep = answer(&mut sock, &req, &catalog).await? && req.keep_alive;
        if !keep {
            return Ok(());
        }
    }
}

/// Answers one request; `false` when the connection must close after it.
async fn answer(sock: &mut TcpStream, req: &Request, catalog: &Arc<Catalog>) -> io::Result<bool> {
    let head_only = match req.method.as_str() {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return small(
                sock,
                req,
                405,
                "text/plain",
                b"only GET and HEAD\n".to_vec(),
                false,
            )
            .await;
        }
    };
    let refresh = req
        .query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv == "refresh=1"));
    match listing::route(&req.path) {
        Route::Page => {
            let l = listing(catalog, refresh).await;
            small(
                sock,
                req,
                200,
                "text/html; charset=utf-8",
                l.html().into_bytes(),
                head_only,
            )
            .await
        }
        Route::Json => {
            let l = listing(catalog, refresh).await;
            small(
                sock,
                req,
                200,
                "application/json",
                l.json().into_bytes(),
                head_only,
            )
            .await
        }
        Route::Player { storage, lun, path } => {
            if catalog.find(&storage).is_none() {
                return not_found(sock, req, head_only).await;
            }
            let (t, _) = content_type(&path);
            let src = format!(
                "/media/{}/{lun}{}",
                http::percent_encode_path(&storage),
                http::percent_encode_path(&path)
            );
            let page = listing::player(&path, &src, t);
            small(
                sock,
                req,
                200,
                "text/html; charset=utf-8",
                page.into_bytes(),
                head_only,
            )
            .await
        }
        Route::File { storage, lun, path } => {
            file(sock, req, catalog, &storage, lun, &path, head_only).await
        }
        Route::NotFound => not_found(sock, req, head_only).await,
    }
}

async fn listing(catalog: &Arc<Catalog>, refresh: bool) -> Listing {
    // Every storage at once: one that is slow to answer holds up only its own entry.
    let mut set = tokio::task::JoinSet::new();
    for (i, s) in catalog.all().into_iter().enumerate() {
        set.spawn(async move { (i, s.view(refresh).await) });
    }
    let mut views = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(v) = r {
            views.push(v);
        }
    }
    views.sort_by_key(|(i, _)| *i);
    Listing {
        storages: views.into_iter().map(|(_, v)| v).collect(),
    }
}

async fn not_found(sock: &mut TcpStream, req: &Request, head_only: bool) -> io::Result<bool> {
    small(
        sock,
        req,
        404,
        "text/plain",
        b"not found\n".to_vec(),
        head_only,
    )
    .await
}

async fn small(
    sock: &mut TcpStream,
    req: &Request,
    status: u16,
    content_type: &str,
    body: Vec<u8>,
    head_only: bool,
) -> io::Result<bool> {
    let head = Head::for_body(status, body.len(), content_type, req.keep_alive);
    let mut out = head.encode();
    if !head_only {
        out.extend_from_slice(&body);
    }
    sock.write_all(&out).await?;
    Ok(true)
}

async fn file(
    sock: &mut TcpStream,
    req: &Request,
    catalog: &Arc<Catalog>,
    storage: &str,
    lun: u16,
    path: &str,
    head_only: bool,
) -> io::Result<bool> {
    let Some(st) = catalog.find(storage) else {
        return not_found(sock, req, head_only).await;
    };
    let busy = st.use_();
    let vol = match st.volume(lun).await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!("{storage}: {e}");
            let body = format!("storage {storage}: {e}\n").into_bytes();
            return small(sock, req, 502, "text/plain", body, head_only).await;
        }
    };
    let len = match vol.stat(path).await {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return not_found(sock, req, head_only).await;
        }
        Err(e) => {
            let body = format!("{path}: {e}\n").into_bytes();
            return small(sock, req, 502, "text/plain", body, head_only).await;
        }
    };
    let range = http::resolve_range(req.header("range"), len);
    let (t, _) = content_type(path);
    let head = Head::for_file(range, len, t, req.keep_alive);
    let (start, end) = match range {
        Ranged::Full if len > 0 && !head_only => (0, len - 1),
        Ranged::Part { start, end } if !head_only => (start, end),
        _ => {
            sock.write_all(&head.encode()).await?;
            return Ok(true);
        }
    };
    // A reader task keeps a few chunks ahead of the socket; a client that goes away
    // drops the receiver and the reader stops at its next chunk.
    let (tx, mut rx) = mpsc::channel::<io::Result<bytes::Bytes>>(CHUNKS_AHEAD);
    let p = path.to_owned();
    tokio::spawn(async move {
        let _busy = busy;
        let mut off = start;
        while off <= end {
            let size = if off == start { FIRST_CHUNK } else { CHUNK };
            let n = (end - off + 1).min(size as u64) as usize;
            let r = vol.read(&p, off, n).await;
            let stop = match &r {
                Ok(b) if b.len() == n => false,
                Ok(_) => true,
                Err(_) => true,
            };
            let r = match r {
                Ok(b) if b.len() != n => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{p}: file shorter than it was at the start of the answer"),
                )),
                r => r,
            };
            if tx.send(r).await.is_err() || stop {
                return;
            }
            off += n as u64;
        }
    });
    // The head goes with the first chunk: a file that cannot be read at all gets a 502,
    // not a 206 that ends at once, and the first byte a client sees is data read.
    let first = match rx.recv().await {
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            let body = format!("{path}: {e}\n").into_bytes();
            return small(sock, req, 502, "text/plain", body, false).await;
        }
        None => {
            let body = format!("{path}: not read\n").into_bytes();
            return small(sock, req, 502, "text/plain", body, false).await;
        }
    };
    let mut out = head.encode();
    out.extend_from_slice(&first);
    sock.write_all(&out).await?;
    let mut sent = first.len() as u64;
    let want = end - start + 1;
    while sent < want {
        match rx.recv().await {
            Some(Ok(b)) => {
                sock.write_all(&b).await?;
                sent += b.len() as u64;
            }
            Some(Err(e)) => {
                // The head promised more: the only honest end is to close the connection.
                tracing::warn!(
                    "{storage}/{lun}{path}: stream ended after {sent} of {want} bytes: {e}"
                );
                let _ = sock.shutdown().await;
                return Ok(false);
            }
            None => {
                tracing::warn!("{storage}/{lun}{path}: stream ended after {sent} of {want} bytes");
                let _ = sock.shutdown().await;
                return Ok(false);
            }
        }
    }
    Ok(true)
}
