//! The agent's network plugin sources against loopback servers: an https server with a
//! test CA (made here with rcgen) for `url` sources, and a small registry speaking the
//! OCI distribution pull protocol (with the bearer-token challenge) for `oci` sources, so
//! each refusal can be provoked precisely. The real registry (crane) and push tool (oras)
//! are exercised end to end in tests/e2e/tests/plugin_sources.rs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_agent::plugins::{ResolveError, Store, fetch_url};
use bosun_fetch::oci::{self, OciError, WASM_LAYER};
use bosun_fetch::{FetchConfig, FetchError, Fetcher};
use bosun_test_pki::TestPki as Pki;
use bosun_trust::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A request as the handler sees it.
#[derive(Debug, Clone)]
struct Req {
    /// Path and query.
    target: String,
    headers: HashMap<String, String>,
}

/// A reply: status, extra headers, body, and whether to send Content-Length (without it
/// the body ends when the connection closes).
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    content_length: bool,
    /// How long the server waits before answering.
    delay: Duration,
}

impl Reply {
    fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            content_length: true,
            delay: Duration::ZERO,
        }
    }
    fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            content_length: true,
            delay: Duration::ZERO,
        }
    }
    fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
    fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Handler = Arc<dyn Fn(&Req) -> Reply + Send + Sync>;

/// A test CA and a server certificate for 127.0.0.1 and localhost signed by it.
fn pki() -> Pki {
    Pki::new("bosun test CA", &["127.0.0.1", "localhost"])
}

/// Serves `handler` on a loopback port (TLS with `pki` when given) until the test ends.
/// Returns the base URL and the log of requests seen.
async fn serve(pki: Option<&Pki>, handler: Handler) -> (String, Arc<Mutex<Vec<Req>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let acceptor = pki.map(|p| tokio_rustls::TlsAcceptor::from(p.server_config()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let log = log.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    // A failed handshake (an untrusting client) just ends the connection.
                    Some(a) => {
                        if let Ok(tls) = a.accept(stream).await {
                            answer(tls, &handler, &log).await;
                        }
                    }
                    None => answer(stream, &handler, &log).await,
                }
            });
        }
    });
    let scheme = if pki.is_some() { "https" } else { "http" };
    (format!("{scheme}://{addr}"), seen)
}

async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    handler: &Handler,
    log: &Mutex<Vec<Req>>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            // Not a request line (a TLS ClientHello to this plain server): answer 400 and
            // close, as real HTTP servers do.
            Ok(1) if head.is_empty() && !byte[0].is_ascii_uppercase() => {
                let _ = stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                    .await;
                return;
            }
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.split("\r\n");
    let target = lines
        .next()
        .unwrap_or_default()
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let req = Req { target, headers };
    log.lock().unwrap().push(req.clone());
    let reply = handler(&req);
    tokio::time::sleep(reply.delay).await;
    let mut out = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", reply.status);
    for (k, v) in &reply.headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if reply.content_length {
        out.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
    }
    out.push_str("\r\n");
    let _ = stream.write_all(out.as_bytes()).await;
    let _ = stream.write_all(&reply.body).await;
    let _ = stream.shutdown().await;
}

fn ca_file(dir: &tempfile::TempDir, pki: &Pki) -> PathBuf {
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, &pki.ca_pem).unwrap();
    path
}

/// The fetch error a URL source's resolve failed with (`None` for any other failure).
fn fetch_error(err: &ResolveError) -> Option<&FetchError> {
    match err {
        ResolveError::Url { source, .. } => Some(source),
        _ => None,
    }
}

fn fetcher(ca: Option<PathBuf>, max: u64, insecure: &[&str]) -> Fetcher {
    Fetcher::new(&FetchConfig {
        ca_files: ca.into_iter().collect(),
        max_body_bytes: max,
        timeout: Duration::from_secs(20),
        insecure_registries: insecure.iter().map(|s| s.to_string()).collect(),
        registry_auth_file: None,
    })
    .unwrap()
}

const PLUGIN: &[u8] = b"\0asm pretend component bytes";

// ---------------------------------------------------------------------------------------
// url sources

#[tokio::test]
async fn a_url_source_is_fetched_over_tls_with_the_given_ca_and_stored_under_its_digest() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = serve(
        Some(&pki),
        Arc::new(|r: &Req| {
            if r.target == "/hello.wasm" {
                Reply::ok(PLUGIN)
            } else {
                Reply::status(404)
            }
        }),
    )
    .await;
    let f = fetcher(Some(ca_file(&dir, &pki)), 1 << 20, &[]);
    let bytes = fetch_url(&f, "hello", &format!("{base}/hello.wasm"))
        .await
        .unwrap();
    assert_eq!(bytes, PLUGIN);
    let store = Store::new(dir.path().join("store")).unwrap();
    store
        .put("hello", "test", &Digest::of(PLUGIN), &bytes)
        .unwrap();
    assert_eq!(
        store.get(&Digest::of(PLUGIN)).unwrap().as_deref(),
        Some(PLUGIN)
    );
}

#[tokio::test]
async fn wrong_bytes_from_a_url_are_refused_by_the_digest_and_never_stored() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = serve(
        Some(&pki),
        Arc::new(|_: &Req| Reply::ok(&b"\0asm other bytes"[..])),
    )
    .await;
    let f = fetcher(Some(ca_file(&dir, &pki)), 1 << 20, &[]);
    let bytes = fetch_url(&f, "hello", &format!("{base}/hello.wasm"))
        .await
        .unwrap();
    let store = Store::new(dir.path().join("store")).unwrap();
    let err = store
        .put(
            "hello",
            &format!("{base}/hello.wasm"),
            &Digest::of(PLUGIN),
            &bytes,
        )
        .unwrap_err();
    assert!(matches!(err, ResolveError::DigestMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains(&Digest::of(PLUGIN).to_string()),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(store.dir()).unwrap().count(),
        0,
        "nothing stored"
    );
}

#[tokio::test]
async fn a_server_whose_certificate_chains_to_an_untrusted_ca_is_refused() {
    let pki = pki();
    let (base, seen) = serve(Some(&pki), Arc::new(|_: &Req| Reply::ok(PLUGIN))).await;
    // No --plugin-ca-file: only the platform's roots, which do not include the test CA.
    let err = fetch_url(
        &fetcher(None, 1 << 20, &[]),
        "hello",
        &format!("{base}/hello.wasm"),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(fetch_error(&err), Some(FetchError::Connect { .. })),
        "{text}"
    );
    assert!(
        text.contains("certificate") && text.contains("--plugin-ca-file"),
        "{text}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "no request was sent over the untrusted connection"
    );
}

#[tokio::test]
async fn a_404_says_to_publish_the_plugin_or_fix_the_url() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = serve(Some(&pki), Arc::new(|_: &Req| Reply::status(404))).await;
    let err = fetch_url(
        &fetcher(Some(ca_file(&dir, &pki)), 1 << 20, &[]),
        "hello",
        &format!("{base}/missing.wasm"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ResolveError::UrlStatus { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("404")
            && text.contains("/missing.wasm")
            && text.contains("fix spec.source.url"),
        "{text}"
    );
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_whether_declared_or_streamed() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let big = vec![7u8; 4096];
    let (base, _) = serve(
        Some(&pki),
        Arc::new(move |r: &Req| {
            let mut reply = Reply::ok(big.clone());
            // Without Content-Length the cap must hold while reading.
            reply.content_length = r.target == "/declared.wasm";
            reply
        }),
    )
    .await;
    let f = fetcher(Some(ca_file(&dir, &pki)), 1024, &[]);
    for path in ["declared.wasm", "streamed.wasm"] {
        let err = fetch_url(&f, "hello", &format!("{base}/{path}"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                fetch_error(&err),
                Some(FetchError::TooLarge { limit: 1024, .. })
            ),
            "{path}: {err}"
        );
        assert!(err.to_string().contains("--plugin-max-mib"), "{err}");
    }
    // At the limit exactly, it is accepted.
    let f = fetcher(Some(ca_file(&dir, &pki)), 4096, &[]);
    assert_eq!(
        fetch_url(&f, "hello", &format!("{base}/streamed.wasm"))
            .await
            .unwrap()
            .len(),
        4096
    );
}

#[tokio::test]
async fn redirects_are_followed_over_https_only_and_a_few_times_at_most() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = serve(
        Some(&pki),
        Arc::new(|r: &Req| match r.target.as_str() {
            "/moved.wasm" => Reply::status(302).header("Location", "/hello.wasm"),
            "/hello.wasm" => Reply::ok(PLUGIN),
            "/to-http.wasm" => {
                Reply::status(301).header("Location", "http://127.0.0.1:9/hello.wasm")
            }
            t if t.starts_with("/loop") => {
                Reply::status(307).header("Location", &format!("/loop{}", t.len()))
            }
            _ => Reply::status(404),
        }),
    )
    .await;
    let f = fetcher(Some(ca_file(&dir, &pki)), 1 << 20, &["127.0.0.1:9"]);
    assert_eq!(
        fetch_url(&f, "hello", &format!("{base}/moved.wasm"))
            .await
            .unwrap(),
        PLUGIN
    );
    // Even a host listed as an insecure registry is not reachable over http from a URL source.
    let err = fetch_url(&f, "hello", &format!("{base}/to-http.wasm"))
        .await
        .unwrap_err();
    assert!(
        matches!(fetch_error(&err), Some(FetchError::PlainHttp { .. })),
        "{err}"
    );
    let err = fetch_url(&f, "hello", &format!("{base}/loop"))
        .await
        .unwrap_err();
    assert!(
        matches!(fetch_error(&err), Some(FetchError::TooManyRedirects { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn a_plain_http_url_is_refused_before_any_request() {
    let (base, seen) = serve(None, Arc::new(|_: &Req| Reply::ok(PLUGIN))).await;
    let err = fetch_url(
        &fetcher(None, 1 << 20, &[]),
        "hello",
        &format!("{base}/hello.wasm"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(fetch_error(&err), Some(FetchError::PlainHttp { .. })),
        "{err}"
    );
    assert!(seen.lock().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// oci sources

fn sha(bytes: &[u8]) -> String {
    Digest::of(bytes).to_string()
}

/// A manifest with a config and the given layers ((media type, bytes)).
fn manifest(layers: &[(&str, &[u8])]) -> String {
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|(t, b)| serde_json::json!({ "mediaType": t, "digest": sha(b), "size": b.len() }))
        .collect();
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.bosun.plugin.v1",
        "config": { "mediaType": "application/vnd.wasm.config.v1+json", "digest": sha(b"{}"), "size": 2 },
        "layers": layers,
    })
    .to_string()
}

/// A registry for repository `bosun/hello` that demands an anonymous bearer token from its
/// own `/token` endpoint (as Docker Hub and GHCR do), serving `manifests` by tag or
/// digest and `blobs` by digest.
async fn registry(
    pki: Option<&Pki>,
    manifests: HashMap<String, String>,
    blobs: HashMap<String, Vec<u8>>,
) -> (String, Arc<Mutex<Vec<Req>>>) {
    let base: Arc<Mutex<String>> = Arc::default();
    let realm = base.clone();
    let (url, seen) = serve(
        pki,
        Arc::new(move |r: &Req| {
            if let Some(query) = r.target.strip_prefix("/token?") {
                return if query.contains("scope=repository%3Abosun%2Fhello%3Apull") && query.contains("service=test-registry") {
                    Reply::ok(r#"{"token":"anon-token"}"#)
                } else {
                    Reply::status(400)
                };
            }
            if r.headers.get("authorization").map(String::as_str) != Some("Bearer anon-token") {
                let challenge = format!(r#"Bearer realm="{}/token",service="test-registry",scope="repository:bosun/hello:pull""#, realm.lock().unwrap());
                return Reply::status(401).header("WWW-Authenticate", &challenge);
            }
            if let Some(object) = r.target.strip_prefix("/v2/bosun/hello/manifests/") {
                let by_digest = manifests.values().find(|m| sha(m.as_bytes()) == object);
                return match manifests.get(object).or(by_digest) {
                    Some(m) => Reply::ok(m.clone()).header("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                    None => Reply::status(404),
                };
            }
            if let Some(digest) = r.target.strip_prefix("/v2/bosun/hello/blobs/") {
                return blobs.get(digest).map_or_else(|| Reply::status(404), |b| Reply::ok(b.clone()));
            }
            Reply::status(404)
        }),
    )
    .await;
    *base.lock().unwrap() = url.clone();
    (url, seen)
}

fn host_of(url: &str) -> String {
    url.split("://").nth(1).unwrap().to_string()
}

#[tokio::test]
async fn an_oci_pull_answers_the_token_challenge_and_returns_the_one_wasm_layer() {
    let m = manifest(&[(WASM_LAYER, PLUGIN)]);
    let (url, seen) = registry(
        None,
        HashMap::from([("0.1.0".into(), m.clone())]),
        HashMap::from([(sha(PLUGIN), PLUGIN.to_vec())]),
    )
    .await;
    let host = host_of(&url);
    let f = fetcher(None, 1 << 20, &[host.as_str()]);
    assert_eq!(
        oci::pull(&f, &format!("{host}/bosun/hello:0.1.0"))
            .await
            .unwrap(),
        PLUGIN
    );
    // By digest too (the manifest's bytes are checked against it).
    assert_eq!(
        oci::pull(&f, &format!("{host}/bosun/hello@{}", sha(m.as_bytes())))
            .await
            .unwrap(),
        PLUGIN
    );
    let seen = seen.lock().unwrap();
    let first = &seen[0];
    assert!(
        first.target.starts_with("/v2/bosun/hello/manifests/0.1.0"),
        "{first:?}"
    );
    let accept = first.headers.get("accept").cloned().unwrap_or_default();
    assert!(
        accept.contains("application/vnd.oci.image.manifest.v1+json")
            && accept.contains("application/vnd.docker.distribution.manifest.v2+json"),
        "{accept}"
    );
    assert!(
        seen.iter().any(|r| r.target.starts_with("/token?")),
        "the token endpoint was used"
    );
}

#[tokio::test]
async fn an_oci_pull_over_tls_uses_the_ca_file_and_refuses_an_untrusted_registry() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(&[(WASM_LAYER, PLUGIN)]);
    let (url, _) = registry(
        Some(&pki),
        HashMap::from([("0.1.0".into(), m)]),
        HashMap::from([(sha(PLUGIN), PLUGIN.to_vec())]),
    )
    .await;
    let reference = format!("{}/bosun/hello:0.1.0", host_of(&url));
    assert_eq!(
        oci::pull(
            &fetcher(Some(ca_file(&dir, &pki)), 1 << 20, &[]),
            &reference
        )
        .await
        .unwrap(),
        PLUGIN
    );
    let err = oci::pull(&fetcher(None, 1 << 20, &[]), &reference)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Unreachable { .. }), "{err}");
}

#[tokio::test]
async fn a_plain_http_registry_not_listed_as_insecure_is_refused() {
    let m = manifest(&[(WASM_LAYER, PLUGIN)]);
    let (url, seen) = registry(
        None,
        HashMap::from([("0.1.0".into(), m)]),
        HashMap::from([(sha(PLUGIN), PLUGIN.to_vec())]),
    )
    .await;
    let host = host_of(&url);
    // Another host:port is listed; this one is not, so https is spoken to it and fails.
    let err = oci::pull(
        &fetcher(None, 1 << 20, &["127.0.0.1:1"]),
        &format!("{host}/bosun/hello:0.1.0"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, OciError::Unreachable { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("--insecure-registry {host}")),
        "{err}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "no plain http request was made"
    );
}

/// One registry whose contents are wrong in one way, and what the pull must say.
struct BrokenRegistry {
    what: &'static str,
    /// The tag `0.1.0`'s manifest, if the registry has it.
    manifest: Option<String>,
    blobs: HashMap<String, Vec<u8>>,
    /// The agent's size limit.
    limit: u64,
    refused: fn(&OciError) -> bool,
    /// What the message must name.
    names: &'static [&'static str],
    /// Whether a blob may be requested before the refusal.
    blob_requested: bool,
}

/// A missing tag, a manifest with no wasm layer, a blob that is not its digest's bytes, a
/// layer over the limit: each refused with its own error, naming what to fix, and a layer
/// over the limit before any byte of it is downloaded.
#[tokio::test]
async fn wrong_registry_contents_are_refused_saying_what_is_wrong() {
    let big = vec![1u8; 2048];
    // Same length as the plugin, other bytes: only the digest can tell.
    let mut evil = PLUGIN.to_vec();
    evil[5] ^= 1;
    let cases = [
        BrokenRegistry {
            what: "a missing tag says to push the artifact",
            manifest: None,
            blobs: HashMap::new(),
            limit: 1 << 20,
            refused: |e| matches!(e, OciError::ManifestStatus { .. }),
            names: &["404", "bosun/hello:0.1.0", "push the artifact"],
            blob_requested: false,
        },
        BrokenRegistry {
            what: "a manifest without a wasm layer is refused naming its layers",
            manifest: Some(manifest(&[(
                "application/vnd.oci.image.layer.v1.tar",
                PLUGIN,
            )])),
            blobs: HashMap::from([(sha(PLUGIN), PLUGIN.to_vec())]),
            limit: 1 << 20,
            refused: |e| matches!(e, OciError::NoWasmLayer { .. }),
            names: &["application/vnd.oci.image.layer.v1.tar"],
            blob_requested: false,
        },
        BrokenRegistry {
            what: "a blob that does not match its layer digest is refused",
            manifest: Some(manifest(&[(WASM_LAYER, PLUGIN)])),
            blobs: HashMap::from([(sha(PLUGIN), evil)]),
            limit: 1 << 20,
            refused: |e| matches!(e, OciError::DigestMismatch { .. }),
            names: &[],
            blob_requested: true,
        },
        BrokenRegistry {
            what: "a layer over the limit is refused before it is downloaded",
            manifest: Some(manifest(&[(WASM_LAYER, &big)])),
            blobs: HashMap::from([(sha(&big), big.clone())]),
            limit: 1024,
            refused: |e| {
                matches!(
                    e,
                    OciError::LayerTooLarge {
                        size: 2048,
                        limit: 1024,
                        ..
                    }
                )
            },
            names: &[],
            blob_requested: false,
        },
    ];
    for case in cases {
        let tags = case
            .manifest
            .map(|m| HashMap::from([("0.1.0".to_string(), m)]))
            .unwrap_or_default();
        let (url, seen) = registry(None, tags, case.blobs).await;
        let host = host_of(&url);
        let err = oci::pull(
            &fetcher(None, case.limit, &[host.as_str()]),
            &format!("{host}/bosun/hello:0.1.0"),
        )
        .await
        .unwrap_err();
        let what = case.what;
        assert!((case.refused)(&err), "{what}: {err}");
        let text = err.to_string();
        for name in case.names {
            assert!(text.contains(name), "{what}: {name} not in {text}");
        }
        if !case.blob_requested {
            assert!(
                !seen
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|r| r.target.contains("/blobs/")),
                "{what}: the blob was not requested"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// registry logins (--registry-auth-file)

/// `robot:s3cret`, as HTTP Basic.
const ROBOT_BASIC: &str = "Basic cm9ib3Q6czNjcmV0";

/// A private registry for `bosun/hello`: with `bearer`, its token realm hands a token only
/// to `robot:s3cret` (anonymous token requests get 401, as Docker Hub does for private
/// repositories); without, it takes Basic `robot:s3cret` directly.
async fn private_registry(bearer: bool) -> (String, Arc<Mutex<Vec<Req>>>) {
    let m = manifest(&[(WASM_LAYER, PLUGIN)]);
    let base: Arc<Mutex<String>> = Arc::default();
    let realm = base.clone();
    let (url, seen) = serve(
        None,
        Arc::new(move |r: &Req| {
            let auth = r.headers.get("authorization").cloned().unwrap_or_default();
            if r.target.starts_with("/token?") {
                return if auth == ROBOT_BASIC { Reply::ok(r#"{"access_token":"private-token"}"#) } else { Reply::status(401) };
            }
            let allowed = if bearer { auth == "Bearer private-token" } else { auth == ROBOT_BASIC };
            if !allowed {
                let challenge = if bearer {
                    format!(r#"Bearer realm="{}/token",service="private",scope="repository:bosun/hello:pull""#, realm.lock().unwrap())
                } else {
                    r#"Basic realm="private""#.to_string()
                };
                return Reply::status(401).header("WWW-Authenticate", &challenge);
            }
            match r.target.as_str() {
                "/v2/bosun/hello/manifests/0.1.0" => Reply::ok(m.clone()).header("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                t if t == format!("/v2/bosun/hello/blobs/{}", sha(PLUGIN)) => Reply::ok(PLUGIN),
                _ => Reply::status(404),
            }
        }),
    )
    .await;
    *base.lock().unwrap() = url.clone();
    (url, seen)
}

/// A fetcher that may use plain http to `host` and has `auths` as its registry logins.
fn fetcher_with_logins(dir: &tempfile::TempDir, host: &str, auths: serde_json::Value) -> Fetcher {
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::json!({ "auths": auths }).to_string()).unwrap();
    Fetcher::new(&FetchConfig {
        insecure_registries: vec![host.to_string()],
        registry_auth_file: Some(path),
        ..Default::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_private_registry_is_pulled_with_the_login_from_the_auth_file() {
    for bearer in [true, false] {
        let (url, seen) = private_registry(bearer).await;
        let host = host_of(&url);
        let reference = format!("{host}/bosun/hello:0.1.0");
        let dir = tempfile::tempdir().unwrap();
        // "auth" (base64) for the Bearer registry, username/password for the Basic one.
        let entry = if bearer {
            serde_json::json!({ "auth": "cm9ib3Q6czNjcmV0" })
        } else {
            serde_json::json!({ "username": "robot", "password": "s3cret" })
        };
        let f = fetcher_with_logins(
            &dir,
            &host,
            serde_json::json!({ format!("http://{host}/v2/"): entry }),
        );
        assert_eq!(
            oci::pull(&f, &reference).await.unwrap(),
            PLUGIN,
            "bearer {bearer}"
        );
        if bearer {
            // The password went to the token realm only; the registry saw the token.
            let seen = seen.lock().unwrap();
            assert!(
                seen.iter()
                    .filter(|r| r.target.starts_with("/v2/"))
                    .all(|r| r
                        .headers
                        .get("authorization")
                        .is_none_or(|a| a == "Bearer private-token")),
                "{seen:?}"
            );
        }

        // No login for this registry (only for another one): refused, saying what to do.
        let f = fetcher_with_logins(
            &dir,
            &host,
            serde_json::json!({ "other.example.com": { "auth": "cm9ib3Q6czNjcmV0" } }),
        );
        let err = oci::pull(&f, &reference).await.unwrap_err();
        if bearer {
            assert!(matches!(err, OciError::TokenStatus { .. }), "{err}");
        } else {
            assert!(matches!(err, OciError::Unauthorized { .. }), "{err}");
        }
        assert!(err.to_string().contains("--registry-auth-file"), "{err}");

        // A wrong password: the login is refused, and said so.
        let f = fetcher_with_logins(
            &dir,
            &host,
            serde_json::json!({ host.clone(): { "username": "robot", "password": "wrong" } }),
        );
        let err = oci::pull(&f, &reference).await.unwrap_err();
        assert!(
            matches!(err, OciError::LoginRefused { .. }),
            "bearer {bearer}: {err}"
        );
    }
}

#[tokio::test]
async fn a_malformed_auth_file_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        r#"{"auths": {"r.example.com": {"auth": "not base64!"}}}"#,
    )
    .unwrap();
    let err = Fetcher::new(&FetchConfig {
        registry_auth_file: Some(path),
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("r.example.com")
            && err.to_string().contains("--registry-auth-file"),
        "{err}"
    );
}

#[tokio::test]
async fn a_host_the_registry_redirects_to_gets_neither_its_login_nor_a_token_request() {
    // The storage host the blob is redirected to asks for a Bearer token from itself.
    let storage_base: Arc<Mutex<String>> = Arc::default();
    let realm = storage_base.clone();
    let (storage, storage_seen) = serve(
        None,
        Arc::new(move |r: &Req| {
            if r.target.starts_with("/token") {
                return Reply::ok(r#"{"token":"stolen"}"#);
            }
            let challenge = format!(
                r#"Bearer realm="{}/token",service="storage""#,
                realm.lock().unwrap()
            );
            Reply::status(401).header("WWW-Authenticate", &challenge)
        }),
    )
    .await;
    *storage_base.lock().unwrap() = storage.clone();
    // A private registry (Basic login) that redirects its blob there, with a pre-signed query.
    let m = manifest(&[(WASM_LAYER, PLUGIN)]);
    let to = format!("{storage}/blob?X-Signature=s3cr3t-signature");
    let (url, _) = serve(
        None,
        Arc::new(move |r: &Req| {
            if r.headers.get("authorization").map(String::as_str) != Some(ROBOT_BASIC) {
                return Reply::status(401).header("WWW-Authenticate", r#"Basic realm="private""#);
            }
            match r.target.as_str() {
                "/v2/bosun/hello/manifests/0.1.0" => Reply::ok(m.clone())
                    .header("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                t if t.starts_with("/v2/bosun/hello/blobs/") => {
                    Reply::status(307).header("Location", &to)
                }
                _ => Reply::status(404),
            }
        }),
    )
    .await;
    let (host, storage_host) = (host_of(&url), host_of(&storage));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::json!({ "auths": { host.clone(): { "username": "robot", "password": "s3cret" } } }).to_string()).unwrap();
    let f = Fetcher::new(&FetchConfig {
        insecure_registries: vec![host.clone(), storage_host.clone()],
        registry_auth_file: Some(path),
        ..Default::default()
    })
    .unwrap();
    let err = oci::pull(&f, &format!("{host}/bosun/hello:0.1.0"))
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::ForeignChallenge { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&storage_host) && !text.contains("s3cr3t-signature"),
        "{text}"
    );
    let storage_seen = storage_seen.lock().unwrap();
    assert!(
        storage_seen.iter().all(|r| !r.target.starts_with("/token")),
        "the storage host's token service was asked: {storage_seen:?}"
    );
    assert!(
        storage_seen
            .iter()
            .all(|r| !r.headers.contains_key("authorization")),
        "the storage host saw a login: {storage_seen:?}"
    );
}

#[tokio::test]
async fn one_deadline_holds_the_whole_pull_not_each_request() {
    // Every answer takes 0.7 s: each request is inside the 1 s deadline, the pull
    // (token, manifest and blob requests) is not.
    let m = manifest(&[(WASM_LAYER, PLUGIN)]);
    let blob = PLUGIN.to_vec();
    let (url, _) = serve(
        None,
        Arc::new(move |r: &Req| {
            let slow = Duration::from_millis(700);
            match r.target.as_str() {
                "/v2/bosun/hello/manifests/0.1.0" => Reply::ok(m.clone())
                    .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
                    .after(slow),
                t if t.starts_with("/v2/bosun/hello/blobs/") => Reply::ok(blob.clone()).after(slow),
                _ => Reply::status(404).after(slow),
            }
        }),
    )
    .await;
    let host = host_of(&url);
    let f = Fetcher::new(&FetchConfig {
        insecure_registries: vec![host.clone()],
        timeout: Duration::from_secs(1),
        ..Default::default()
    })
    .unwrap();
    let err = oci::pull(&f, &format!("{host}/bosun/hello:0.1.0"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, OciError::Fetch(FetchError::Timeout { .. })),
        "{err}"
    );
    assert!(
        err.to_string().contains("--plugin-fetch-timeout-seconds"),
        "{err}"
    );
}

#[tokio::test]
async fn an_https_registry_cannot_send_the_agent_to_a_plain_http_token_service() {
    // The token service is plain http on a host that IS listed as insecure, but the
    // registry itself is https: its challenge must not lead the agent to plain http.
    let (realm, realm_seen) = serve(None, Arc::new(|_: &Req| Reply::ok(r#"{"token":"t"}"#))).await;
    let pki = pki();
    let challenge = format!(r#"Bearer realm="{realm}/token",service="s""#);
    let (url, _) = serve(
        Some(&pki),
        Arc::new(move |_: &Req| Reply::status(401).header("WWW-Authenticate", &challenge)),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let f = fetcher(
        Some(ca_file(&dir, &pki)),
        1 << 20,
        &[host_of(&realm).as_str()],
    );
    let err = oci::pull(&f, &format!("{}/bosun/hello:0.1.0", host_of(&url)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, OciError::Fetch(FetchError::PlainHttp { .. })),
        "{err}"
    );
    assert!(
        realm_seen.lock().unwrap().is_empty(),
        "the plain http token service was asked"
    );
}
