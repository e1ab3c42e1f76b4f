//! How both binaries reach the API server: a `User-Agent` that names the process (so an
//! audit log, or an API server's request metrics, tell one replica from another), and a
//! first contact that waits for an API server that is down instead of exiting.
//!
//! Bosun restarts the API server itself (`kubeadm upgrade apply`, a certificate renewal), so
//! a process that starts while it is down must wait for it, not crash-loop into the
//! kubelet's growing restart backoff.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

/// How long a request that is not a watch may wait for the API server's answer (its
/// response headers) before it is cut and fails ([`AnswerDeadline`]).
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(20);

/// Cuts every request but a watch that has no answer after a deadline, so a connection to
/// an API server that accepted the request and never answers (one whose etcd member was
/// just restarted, a connection half-dead after a partition) fails the request instead of
/// hanging it, and with it the reconcile that made it, for as long as the TCP connection
/// lives. kube-client sets no read timeout by default. Cutting a request drops its
/// connection, so the retry goes out on another.
///
/// Watches (`watch=true`) are not cut: they wait for events by design, and a watch that
/// stalls is found by `watch::keep_fresh` instead. A watch asks instead for its connection
/// to be closed when it ends (`Connection: close`), so that the watch that follows it goes
/// out on another connection: without this, the HTTP/1 pool hands the follower the same
/// connection, and a process whose watch reached an API server that stopped delivering (its
/// etcd member stopped) would watch through that server again each time its watch ends,
/// for as long as the server lives. The deadline ([`ANSWER_DEADLINE`]) is
/// far above what any request of Bosun's takes on a working API server (milliseconds; an
/// eviction or a page of a list included) and under the API server's own 60 s request
/// timeout.
#[derive(Clone, Copy, Debug)]
pub struct AnswerDeadline(pub Duration);

/// The error of a request cut by an [`AnswerDeadline`].
#[derive(Debug, thiserror::Error)]
#[error(
    "the API server did not answer {method} {path} within {deadline:?}; the request was cut and its connection dropped"
)]
pub struct NoAnswer {
    pub method: http::Method,
    pub path: String,
    pub deadline: Duration,
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1` in its query).
pub fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch"))
    })
}

impl<S> tower::Layer<S> for AnswerDeadline {
    type Service = Deadlined<S>;

    fn layer(&self, inner: S) -> Deadlined<S> {
        Deadlined {
            inner,
            deadline: self.0,
        }
    }
}

/// A service behind an [`AnswerDeadline`].
#[derive(Clone, Debug)]
pub struct Deadlined<S> {
    inner: S,
    deadline: Duration,
}

impl<S, B> tower::Service<http::Request<B>> for Deadlined<S>
where
    S: tower::Service<http::Request<B>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let watch = is_watch(request.uri());
        if watch {
            request
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        let deadline = self.deadline;
        let sent = self.inner.call(request);
        Box::pin(async move {
            if watch {
                return sent.await.map_err(Into::into);
            }
            match tokio::time::timeout(deadline, sent).await {
                Ok(answer) => answer.map_err(Into::into),
                Err(_) => Err(NoAnswer {
                    method,
                    path,
                    deadline,
                }
                .into()),
            }
        })
    }
}

/// The first wait between attempts to reach the API server at start.
pub const FIRST_CONTACT_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between attempts to reach the API server at start.
pub const FIRST_CONTACT_RETRY_MAX: Duration = Duration::from_secs(15);

/// The `User-Agent` header for `component` (`bosun-controller`, `bosun-agent`) of this
/// version, run as `identity` (a controller's leader identity, an agent's node name):
/// `bosun-controller/0.1.0 (identity)`. An identity that is not a valid header value (it
/// comes from a flag) is left out rather than failing the start.
pub fn user_agent(component: &str, identity: &str) -> (HeaderName, HeaderValue) {
    let version = env!("CARGO_PKG_VERSION");
    let value = HeaderValue::from_str(&format!("{component}/{version} ({identity})"))
        .unwrap_or_else(|_| {
            HeaderValue::from_str(&format!("{component}/{version}"))
                .unwrap_or(HeaderValue::from_static("bosun"))
        });
    (http::header::USER_AGENT, value)
}

/// Sets `config`'s `User-Agent` (see [`user_agent`]), replacing one set before.
pub fn identify(config: &mut kube::Config, component: &str, identity: &str) {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push(user_agent(component, identity));
}

/// The wait before attempt `attempt + 1` (0: after the first failure): doubling from
/// [`FIRST_CONTACT_RETRY_FIRST`] up to [`FIRST_CONTACT_RETRY_MAX`].
pub fn first_contact_wait(attempt: u32) -> Duration {
    FIRST_CONTACT_RETRY_FIRST
        .saturating_mul(1 << attempt.min(8))
        .min(FIRST_CONTACT_RETRY_MAX)
}

/// Asks the API server for its version until it answers, logging each failure. A refused
/// credential (401, 403) is not waited out: it is returned, since no restart of the API
/// server will fix it.
pub async fn wait_for_api_server(client: &kube::Client) -> Result<(), kube::Error> {
    let mut attempt = 0u32;
    loop {
        match client.apiserver_version().await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403 => {
                return Err(kube::Error::Api(s));
            }
            Err(error) => {
                let wait = first_contact_wait(attempt);
                tracing::warn!(%error, retry_in_s = wait.as_secs(), "the API server does not answer yet; waiting for it (it may be restarting)");
                tokio::time::sleep(wait).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, ServiceExt as _};

    #[test]
    fn only_watch_requests_are_watches() {
        let watch = |u: &str| is_watch(&u.parse::<http::Uri>().expect("a URI"));
        assert!(watch(
            "/apis/bosun.dev/v1alpha1/nodetasks?labelSelector=a%3Db&watch=true&resourceVersion=5"
        ));
        assert!(watch("/api/v1/nodes?watch=1"));
        assert!(!watch("/api/v1/nodes?watch=false"));
        assert!(!watch("/api/v1/nodes?labelSelector=watch%3Dtrue"));
        assert!(!watch("/api/v1/nodes"));
    }

    #[tokio::test]
    async fn a_watch_asks_for_its_connection_to_be_closed_when_it_ends_and_no_other_request_does() {
        // Answers with the Connection header the request carried, as a response header.
        let echo = tower::service_fn(|request: http::Request<()>| async move {
            let mut response = http::Response::new(());
            if let Some(v) = request.headers().get(http::header::CONNECTION) {
                response
                    .headers_mut()
                    .insert(http::header::CONNECTION, v.clone());
            }
            Ok::<_, std::convert::Infallible>(response)
        });
        let service = AnswerDeadline(Duration::from_secs(5)).layer(echo);
        let cases = [
            ("/api/v1/nodes?watch=true&resourceVersion=7", Some("close")),
            ("/apis/bosun.dev/v1alpha1/operations?watch=1", Some("close")),
            ("/api/v1/nodes", None),
            ("/api/v1/namespaces/a/configmaps/watch", None),
        ];
        for (uri, want) in cases {
            let request = http::Request::get(uri).body(()).expect("a request");
            let response = service.clone().oneshot(request).await.expect("an answer");
            let got = response
                .headers()
                .get(http::header::CONNECTION)
                .map(|v| v.to_str().expect("ascii"));
            assert_eq!(got, want, "{uri}");
        }
    }

    #[tokio::test]
    async fn a_request_without_an_answer_is_cut_at_the_deadline_and_a_watch_is_not() {
        // An API server that accepts every request and never answers.
        let silent = tower::service_fn(|_: http::Request<()>| {
            std::future::pending::<Result<http::Response<()>, std::convert::Infallible>>()
        });
        let deadline = Duration::from_millis(50);
        let service = AnswerDeadline(deadline).layer(silent);
        let get = http::Request::get("/api/v1/nodes/n1")
            .body(())
            .expect("a request");
        let start = std::time::Instant::now();
        let error = service.clone().oneshot(get).await.expect_err("no answer");
        assert!(start.elapsed() >= deadline);
        let cut = error.downcast_ref::<NoAnswer>().expect("a NoAnswer");
        assert_eq!(
            (cut.method.as_str(), cut.path.as_str()),
            ("GET", "/api/v1/nodes/n1")
        );
        let watch = http::Request::get("/api/v1/nodes?watch=true")
            .body(())
            .expect("a request");
        let waited = tokio::time::timeout(deadline * 10, service.oneshot(watch)).await;
        assert!(waited.is_err(), "a watch is never cut by the deadline");
    }

    #[test]
    fn the_user_agent_names_the_component_its_version_and_the_identity() {
        let (name, value) = user_agent("bosun-controller", "replica-a");
        assert_eq!(name, http::header::USER_AGENT);
        assert_eq!(
            value.to_str().unwrap(),
            format!("bosun-controller/{} (replica-a)", env!("CARGO_PKG_VERSION"))
        );
        let (_, bad) = user_agent("bosun-agent", "line\nbreak");
        assert_eq!(
            bad.to_str().unwrap(),
            format!("bosun-agent/{}", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn identify_replaces_an_earlier_user_agent() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        identify(&mut config, "bosun-agent", "a");
        identify(&mut config, "bosun-agent", "b");
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .collect();
        assert_eq!(agents.len(), 1);
        assert!(agents[0].1.to_str().unwrap().ends_with("(b)"));
    }

    #[test]
    fn first_contact_waits_double_up_to_the_cap() {
        let waits: Vec<u64> = (0..7).map(|a| first_contact_wait(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 15, 15, 15]);
        assert_eq!(first_contact_wait(u32::MAX), FIRST_CONTACT_RETRY_MAX);
    }
}
