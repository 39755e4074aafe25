//! `GET /metrics` over HTTP/1.1: [`respond`] decides the answer from the request alone
//! (no socket), [`serve`] accepts connections and hands each request to it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE as CONTENT_TYPE_HEADER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

/// The OpenMetrics text format, as Prometheus asks for it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the client asked for OpenMetrics (Prometheus does, first); anyone else
/// (curl, `promtool check metrics`, older scrapers) gets the Prometheus text format
/// 0.0.4, as Prometheus's own client libraries negotiate.
fn wants_openmetrics<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| {
            let mut parts = v.split(';').map(str::trim);
            let zero = |p: &str| p.strip_prefix("q=").is_some_and(|q| q.parse() == Ok(0.0));
            parts.next() == Some("application/openmetrics-text") && !parts.any(zero)
        })
}

/// Connections served at once; more are closed at accept. A scraper needs one; the
/// bound keeps whoever else reaches the address from holding the process's descriptors.
const MAX_CONNECTIONS: usize = 16;

/// How long a connection may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE_HEADER,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to `req`: the registry's exposition for `GET /metrics` (a query string is
/// ignored, as Prometheus's own endpoints ignore unknown parameters), in OpenMetrics
/// text when asked for, else the Prometheus text format; 405 for another method there,
/// 404 for any other path.
pub fn respond<B>(registry: &Registry, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    use prometheus_client::encoding::{prometheus_text, text};
    let mut body = String::with_capacity(64 * 1024);
    let (encoded, content_type) = if wants_openmetrics(req) {
        (text::encode(&mut body, registry), CONTENT_TYPE)
    } else {
        (
            prometheus_text::encode(&mut body, registry),
            prometheus_text::CONTENT_TYPE,
        )
    };
    if let Err(e) = encoded {
        // Writing to a String does not fail; a collector may.
        warn!("metrics: encoding failed: {e}");
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut()
        .insert(CONTENT_TYPE_HEADER, HeaderValue::from_static(content_type));
    r
}

/// Work to await before each scrape is encoded: gathering what a collector cannot read
/// synchronously (a daemon whose figures must be asked of its tasks), so that the
/// collectors then encode a fresh copy.
pub type Refresh = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Serves `registry` at `/metrics` on `listener` until the future is dropped (the
/// connections it started end with the runtime, or when their peers close them).
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) -> Infallible {
    serve_refreshed(listener, registry, None).await
}

/// [`serve`], awaiting `refresh` before each `GET /metrics` is encoded.
pub async fn serve_refreshed(
    listener: TcpListener,
    registry: Arc<Registry>,
    refresh: Option<Refresh>,
) -> Infallible {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("metrics: {peer}: {MAX_CONNECTIONS} connections open already; closed");
            continue;
        };
        let registry = registry.clone();
        let refresh = refresh.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<_>| {
                let registry = registry.clone();
                let refresh = refresh
                    .clone()
                    .filter(|_| req.uri().path() == "/metrics" && req.method() == Method::GET);
                async move {
                    if let Some(refresh) = refresh {
                        refresh().await;
                    }
                    Ok::<_, Infallible>(respond(&registry, &req))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service);
            if let Err(e) = conn.await {
                debug!("metrics: {peer}: {e}");
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use prometheus_client::metrics::counter::Counter;

    fn registry() -> Registry {
        let mut reg = Registry::default();
        let c: Counter = Counter::default();
        c.inc_by(7);
        reg.register("demo_things", "Things", c);
        reg
    }

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
    }

    /// What Prometheus 2.42 sends.
    const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
        application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,\
        */*;q=0.1";

    fn accepting(accept: &str) -> Request<()> {
        Request::builder()
            .uri("/metrics")
            .header(ACCEPT, accept)
            .body(())
            .unwrap()
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        let b = r.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn get_metrics_is_openmetrics_to_whoever_asks_for_it() {
        let mut req = accepting(PROMETHEUS_ACCEPT);
        *req.uri_mut() = "/metrics?x=1".parse().unwrap();
        let r = respond(&registry(), &req);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE_HEADER], CONTENT_TYPE);
        let text = body(r).await;
        assert!(text.contains("# TYPE demo_things counter\n"), "{text}");
        assert!(text.contains("\ndemo_things_total 7\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[tokio::test]
    async fn get_metrics_is_the_prometheus_text_format_otherwise() {
        for req in [
            request(Method::GET, "/metrics"),
            accepting("*/*"),
            accepting("text/plain;version=0.0.4"),
            accepting("application/openmetrics-text;q=0, text/plain"),
        ] {
            let r = respond(&registry(), &req);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(
                r.headers()[CONTENT_TYPE_HEADER],
                "text/plain; version=0.0.4; charset=utf-8"
            );
            let text = body(r).await;
            assert!(
                text.contains("# TYPE demo_things_total counter\n"),
                "{text}"
            );
            assert!(text.contains("\ndemo_things_total 7\n"), "{text}");
            assert!(!text.contains("# EOF"), "{text}");
        }
    }

    #[tokio::test]
    async fn other_methods_and_paths_are_refused() {
        let reg = registry();
        let r = respond(&reg, &request(Method::POST, "/metrics"));
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[ALLOW], "GET");
        for path in ["/", "/metrics/", "/metricsx", "/api"] {
            let r = respond(&reg, &request(Method::GET, path));
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
        }
    }

    /// Through a socket: a request, a keep-alive second one, and a bad one.
    #[tokio::test]
    async fn serves_over_loopback() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(serve(l, Arc::new(registry())));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n\
              DELETE /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
        assert!(all.contains("demo_things_total 7"), "{all}");
        assert!(all.contains("HTTP/1.1 405 Method Not Allowed\r\n"), "{all}");
        server.abort();
    }
}
