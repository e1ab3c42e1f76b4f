//! The admin server: `/live`, `/ready` and `/metrics` over plain HTTP/1.1, nothing else.
//!
//! - `/live` answers 200 while the process's runtime can serve a request at all (a
//!   liveness probe that fails means the process is wedged and should be restarted).
//! - `/ready` answers 200 once the process said it is ready ([`Readiness::set`]), 503 before
//!   and after it says it is not.
//! - `/metrics` answers the OpenMetrics text of [`crate::metrics()`].
//!
//! Any other path is 404, any method but GET and HEAD 405. The server holds no secrets and
//! changes nothing, so it has no authentication; expose it inside the cluster only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The content type of OpenMetrics text, which Prometheus negotiates and accepts.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether the process is ready to do its work. Cloning shares the flag.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Sets what `/ready` answers from now on.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// What `/ready` answers now.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "cannot listen on {addr} for the admin server (expected a free host:port, e.g. 0.0.0.0:9090; pass another --admin-addr): {source}"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running admin server. It stops when the process exits (the task is detached).
#[derive(Debug)]
pub struct AdminServer {
    /// The address it actually listens on (port 0 in `--admin-addr` picks a free port).
    pub local_addr: SocketAddr,
    pub readiness: Readiness,
}

impl AdminServer {
    /// Binds `addr` and serves on the current tokio runtime. Returns once listening, so a
    /// probe that arrives after this returns is answered.
    pub async fn start(addr: SocketAddr) -> Result<AdminServer, AdminError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| AdminError::Bind { addr, source })?;
        let readiness = Readiness::default();
        let ready = readiness.clone();
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: log, and keep accepting.
                        tracing::warn!(error = %e, "admin server: accept failed");
                        continue;
                    }
                };
                let ready = ready.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let ready = ready.clone();
                        async move { Ok::<_, std::convert::Infallible>(respond(&req, &ready)) }
                    });
                    if let Err(e) = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                    {
                        tracing::debug!(error = %e, "admin server: connection ended with an error");
                    }
                });
            }
        });
        tracing::info!(addr = %local_addr, "admin server listening (/live, /ready, /metrics)");
        Ok(AdminServer {
            local_addr,
            readiness,
        })
    }
}

fn respond<B>(req: &Request<B>, ready: &Readiness) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    match req.uri().path() {
        "/live" => text(StatusCode::OK, "ok\n"),
        "/ready" if ready.get() => text(StatusCode::OK, "ok\n"),
        "/ready" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        "/metrics" => {
            let body = crate::metrics().encode();
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(OPENMETRICS),
            );
            resp
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: the admin server serves /live, /ready and /metrics\n",
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One raw HTTP/1.1 request over TCP; the status line and body of the answer.
    async fn get(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        let (head, body) = buf.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    }

    #[tokio::test]
    async fn serves_live_ready_and_metrics_and_nothing_else() {
        let server = AdminServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let a = server.local_addr;
        assert_eq!(get(a, "GET", "/live").await.0, "HTTP/1.1 200 OK");
        assert_eq!(
            get(a, "GET", "/ready").await.0,
            "HTTP/1.1 503 Service Unavailable"
        );
        server.readiness.set(true);
        assert_eq!(get(a, "GET", "/ready").await.0, "HTTP/1.1 200 OK");
        server.readiness.set(false);
        assert_eq!(
            get(a, "GET", "/ready").await.0,
            "HTTP/1.1 503 Service Unavailable"
        );
        let (status, body) = get(a, "GET", "/metrics").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.contains("# TYPE bosun_operations gauge"), "{body}");
        assert!(
            body.contains("# TYPE bosun_step_duration_seconds histogram"),
            "{body}"
        );
        assert_eq!(get(a, "GET", "/secrets").await.0, "HTTP/1.1 404 Not Found");
        assert_eq!(
            get(a, "POST", "/metrics").await.0,
            "HTTP/1.1 405 Method Not Allowed"
        );
    }

    #[tokio::test]
    async fn a_busy_address_is_refused_with_the_flag_to_change() {
        let first = AdminServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let err = AdminServer::start(first.local_addr).await.unwrap_err();
        assert!(err.to_string().contains("--admin-addr"), "{err}");
    }
}
