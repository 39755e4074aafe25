//! The only module on the HTTP sockets: hyper serves each connection (HTTP/1.1,
//! keep-alive), and [`answer`] answers its requests; files stream from a volume in chunks
//! with a few chunks read ahead of the socket.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::http::{self, Ranged};
use crate::listing::{self, Listing, Route};
use crate::metrics::{route_class, Stats};
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
/// A connection with no whole request head for this long is closed (kept-alive ones
/// waiting for their next request too).
const IDLE: Duration = Duration::from_secs(60);
/// A request head longer than this is refused (431); none of ours comes near.
const MAX_HEAD: usize = 16 << 10;

pub async fn serve(listener: TcpListener, catalog: Arc<Catalog>) -> io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(IDLE)
        .max_buf_size(MAX_HEAD)
        // Header names as most servers write them; some clients and scripts look for
        // `Content-Range:` as written.
        .title_case_headers(true);
    loop {
        let (sock, peer) = listener.accept().await?;
        let _ = sock.set_nodelay(true);
        let catalog = catalog.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let catalog = catalog.clone();
                async move {
                    let stats = catalog.stats();
                    let (route, r) = answer(req, &catalog).await;
                    stats.request(route, r.status());
                    Ok::<_, Infallible>(r.map(|body| Counted::new(body, stats)))
                }
            });
            if let Err(e) = http.serve_connection(TokioIo::new(sock), service).await {
                tracing::debug!("{peer}: {e}");
            }
        });
    }
}

/// An answer's body as hyper takes it: its bytes counted as they go, and a file's stream
/// counted in flight while it lasts.
struct Counted {
    body: Body,
    stats: Arc<Stats>,
}

impl Counted {
    fn new(body: Body, stats: Arc<Stats>) -> Counted {
        if matches!(body, Body::File(_)) {
            stats.streams.inc();
        }
        Counted { body, stats }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if matches!(self.body, Body::File(_)) {
            self.stats.streams.dec();
        }
    }
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let me = self.get_mut();
        let f = ready!(Pin::new(&mut me.body).poll_frame(cx));
        if let Some(d) = f.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            me.stats.sent.inc_by(d.len() as u64);
        }
        Poll::Ready(f)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An answer's body: small and whole, or a file streaming from its reader task.
enum Body {
    Whole(Option<Bytes>),
    File(FileStream),
}

/// A file's bytes as its reader task sends them; ends with an error when the task stops
/// before the length the head promised (hyper then closes the connection: the only
/// honest end of an answer cut short).
struct FileStream {
    /// Read before the head was answered.
    first: Option<Bytes>,
    rx: mpsc::Receiver<io::Result<Bytes>>,
    left: u64,
    /// `STORAGE/LUN/PATH`, for the log.
    what: String,
    want: u64,
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let f = match self.get_mut() {
            Body::Whole(b) => return Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::File(f) => f,
        };
        if f.left == 0 {
            return Poll::Ready(None);
        }
        let next = match f.first.take() {
            Some(b) => Some(Ok(b)),
            None => ready!(f.rx.poll_recv(cx)),
        };
        let e = match next {
            Some(Ok(b)) => {
                f.left = f.left.saturating_sub(b.len() as u64);
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            Some(Err(e)) => e,
            None => io::Error::new(io::ErrorKind::UnexpectedEof, "the reader stopped"),
        };
        tracing::warn!(
            "{}: stream ended after {} of {} bytes: {e}",
            f.what,
            f.want - f.left,
            f.want
        );
        f.left = 0;
        Poll::Ready(Some(Err(e)))
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Whole(b) => b.is_none(),
            Body::File(f) => f.left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::File(f) => SizeHint::with_exact(f.left),
        }
    }
}

/// Answers one request; with its route's class, for the counts.
async fn answer(req: Request<Incoming>, catalog: &Arc<Catalog>) -> (&'static str, Response<Body>) {
    let route = listing::route(req.uri().path());
    let class = route_class(&route);
    let head_only = match http::accept(req.method(), req.body().is_end_stream()) {
        Ok(h) => h,
        Err(r) => {
            let r = small(r.status(), "text/plain", r.message().into(), false);
            return (class, r);
        }
    };
    let refresh = http::wants_refresh(req.uri().query());
    (
        class,
        answer_route(route, &req, refresh, head_only, catalog).await,
    )
}

async fn answer_route(
    route: Route,
    req: &Request<Incoming>,
    refresh: bool,
    head_only: bool,
    catalog: &Arc<Catalog>,
) -> Response<Body> {
    match route {
        Route::Page => {
            let l = listing(catalog, refresh).await;
            small(
                StatusCode::OK,
                "text/html; charset=utf-8",
                l.html(),
                head_only,
            )
        }
        Route::Json => {
            let l = listing(catalog, refresh).await;
            small(StatusCode::OK, "application/json", l.json(), head_only)
        }
        Route::Player { storage, lun, path } => {
            if catalog.find(&storage).is_none() {
                return not_found(head_only);
            }
            let (t, _) = content_type(&path);
            let src = format!(
                "/media/{}/{lun}{}",
                http::percent_encode_path(&storage),
                http::percent_encode_path(&path)
            );
            let page = listing::player(&path, &src, t);
            small(StatusCode::OK, "text/html; charset=utf-8", page, head_only)
        }
        Route::File { storage, lun, path } => {
            let range = req
                .headers()
                .get(hyper::header::RANGE)
                .and_then(|v| v.to_str().ok());
            file(catalog, &storage, lun, &path, range, head_only).await
        }
        Route::NotFound => not_found(head_only),
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

fn not_found(head_only: bool) -> Response<Body> {
    small(
        StatusCode::NOT_FOUND,
        "text/plain",
        "not found\n".into(),
        head_only,
    )
}

fn small(
    status: StatusCode,
    content_type: &'static str,
    body: String,
    head_only: bool,
) -> Response<Body> {
    let head = http::small_head(status, body.len(), content_type);
    let body = (!head_only).then(|| Bytes::from(body));
    head.map(|()| Body::Whole(body))
}

async fn file(
    catalog: &Arc<Catalog>,
    storage: &str,
    lun: u16,
    path: &str,
    range: Option<&str>,
    head_only: bool,
) -> Response<Body> {
    let Some(st) = catalog.find(storage) else {
        return not_found(head_only);
    };
    let busy = st.use_();
    let vol = match st.volume(lun).await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!("{storage}: {e}");
            let body = format!("storage {storage}: {e}\n");
            return small(StatusCode::BAD_GATEWAY, "text/plain", body, head_only);
        }
    };
    let len = match vol.stat(path).await {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return not_found(head_only),
        Err(e) => {
            let body = format!("{path}: {e}\n");
            return small(StatusCode::BAD_GATEWAY, "text/plain", body, head_only);
        }
    };
    let range = http::resolve_range(range, len);
    let (t, _) = content_type(path);
    let head = http::file_head(range, len, t);
    let (start, end) = match range {
        Ranged::Full if len > 0 && !head_only => (0, len - 1),
        Ranged::Part { start, end } if !head_only => (start, end),
        _ => return head.map(|()| Body::Whole(None)),
    };
    // A reader task keeps a few chunks ahead of the socket; a client that goes away
    // drops the receiver and the reader stops at its next chunk.
    let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(CHUNKS_AHEAD);
    let p = path.to_owned();
    let counts = st.lun_stat(lun);
    tokio::spawn(async move {
        let _busy = busy;
        let mut off = start;
        while off <= end {
            let size = if off == start { FIRST_CHUNK } else { CHUNK };
            let n = (end - off + 1).min(size as u64) as usize;
            let began = std::time::Instant::now();
            let r = vol.read(&p, off, n).await;
            if let Ok(b) = &r {
                counts.read(b.len(), began.elapsed());
            }
            let r = match r {
                Ok(b) if b.len() != n => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{p}: file shorter than it was at the start of the answer"),
                )),
                r => r,
            };
            let stop = r.is_err();
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
            let body = format!("{path}: {e}\n");
            return small(StatusCode::BAD_GATEWAY, "text/plain", body, false);
        }
        None => {
            let body = format!("{path}: not read\n");
            return small(StatusCode::BAD_GATEWAY, "text/plain", body, false);
        }
    };
    let want = end - start + 1;
    head.map(|()| {
        Body::File(FileStream {
            first: Some(first),
            rx,
            left: want,
            what: format!("{storage}/{lun}{path}"),
            want,
        })
    })
}
