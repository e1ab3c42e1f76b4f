//! Bounded HTTP GETs for plugin sources (https URLs and OCI registries).
//!
//! This crate is the agent's only outbound HTTP client outside the Kubernetes API: the
//! https client here, and the OCI registry client ([`oci`]) on top of it. Its guarantees:
//!
//! - **TLS by default.** A request goes over `https://`, verified against the platform's
//!   trust roots (the system CA bundle; the bundled Mozilla roots when the system has none)
//!   plus any `--plugin-ca-file`. Plain `http://` is refused unless the request is to an OCI
//!   registry whose `HOST:PORT` the administrator listed with `--insecure-registry`
//!   ([`Fetcher::get`]'s `plain_http_hosts`); a URL source never uses it.
//! - **Bounded.** One deadline covers connecting, every redirect and the whole body; a body
//!   larger than the caller's limit is refused as soon as the limit is passed (or up front
//!   when `Content-Length` says so), so a hostile server cannot fill memory or stall a step.
//! - **Few redirects, same rules.** At most [`MAX_REDIRECTS`]; each target must pass the
//!   same scheme rule, so an https start cannot be redirected to plain http. Credentials
//!   (`Authorization`) are not forwarded to another host.
//!
//! It also loads the registry logins of `--registry-auth-file` (a Docker config file) at
//! startup; [`crate::oci`] decides when to send them.
//!
//! The transport is not what makes a plugin trusted: the bytes are pinned by digest and
//! signature-verified before they are compiled. TLS still keeps the origin honest about
//! *which* bytes it serves and keeps the fetch private.
//!
//! Why a small client on hyper instead of reqwest or oci-client: hyper 1, hyper-util,
//! hyper-rustls and rustls (ring) are already in the tree through kube, so this adds no TLS
//! stack, no OpenSSL and no second crypto provider; and the redirect, scheme and size
//! policies above are a few lines here, while with a general client they are settings to
//! get right and keep right.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue, LOCATION};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use url::Url;

pub mod oci;

/// Redirects followed per request at most.
pub const MAX_REDIRECTS: usize = 5;

/// Default cap on a plugin's size (`--plugin-max-mib`).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;

/// Default deadline for one fetch, redirects and body included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Connecting (TCP) must succeed within this, well inside the whole deadline.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How the agent fetches plugin bytes over the network (its `--plugin-*` and
/// `--insecure-registry` flags).
#[derive(Clone, Debug)]
pub struct FetchConfig {
    /// PEM files of extra CA certificates trusted for https (private registries, mirrors).
    pub ca_files: Vec<PathBuf>,
    /// The largest plugin body accepted, in bytes.
    pub max_body_bytes: u64,
    /// Deadline for one fetch (connect, redirects, body).
    pub timeout: Duration,
    /// `HOST:PORT` of OCI registries that may be reached over plain http.
    pub insecure_registries: Vec<String>,
    /// A Docker config file (`{"auths": {...}}`, the `.dockerconfigjson` of a
    /// `kubernetes.io/dockerconfigjson` Secret) with pull credentials per registry.
    pub registry_auth_file: Option<PathBuf>,
}

impl Default for FetchConfig {
    fn default() -> FetchConfig {
        FetchConfig {
            ca_files: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            timeout: DEFAULT_TIMEOUT,
            insecure_registries: Vec::new(),
            registry_auth_file: None,
        }
    }
}

/// The fetch configuration cannot be used (found at startup, not at the first fetch).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--plugin-ca-file {path}: {reason}: give a PEM file of one or more CA certificates")]
    CaFile { path: PathBuf, reason: String },
    #[error(
        "--insecure-registry {value:?} is not HOST:PORT (for example registry.lab:5000): list registries by host and port"
    )]
    InsecureRegistry { value: String },
    #[error("setting up TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error(
        "no trust roots for https: the system has no CA bundle and no --plugin-ca-file was given"
    )]
    NoRoots,
    #[error(
        "--registry-auth-file {path}: {reason}: give a Docker config file ({{\"auths\": {{\"REGISTRY\": {{\"auth\": \"base64(user:password)\"}}}}}}), such as the .dockerconfigjson key of a kubernetes.io/dockerconfigjson Secret"
    )]
    RegistryAuth { path: PathBuf, reason: String },
}

/// Why a fetch failed. Each message names the URL and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("refusing plain http to {url}: only https is allowed{hint}")]
    PlainHttp { url: String, hint: &'static str },
    #[error("{url} is not a usable URL: {reason}")]
    BadUrl { url: String, reason: String },
    #[error(
        "could not GET {url}: {detail}: check the address and that the server's certificate chains to a trusted root (the platform's CAs, or the agent's --plugin-ca-file)"
    )]
    Connect { url: String, detail: String },
    #[error(
        "GET {url} did not finish within {after:?}: check the server, or raise the agent's --plugin-fetch-timeout-seconds"
    )]
    Timeout { url: String, after: Duration },
    #[error(
        "{url} serves {found} bytes, more than the agent's limit of {limit} bytes: raise the agent's --plugin-max-mib, or publish a smaller plugin"
    )]
    TooLarge {
        url: String,
        limit: u64,
        found: String,
    },
    #[error(
        "{url} redirected more than {MAX_REDIRECTS} times: point the source at the final location"
    )]
    TooManyRedirects { url: String },
    #[error(
        "{url} answered {status} with no usable Location header ({location:?}): fix the server or point the source at the final location"
    )]
    BadRedirect {
        url: String,
        status: StatusCode,
        location: String,
    },
    #[error("reading the body of {url}: {detail}")]
    Body { url: String, detail: String },
}

/// A finished response: status, headers, the whole (bounded) body, and the URL that
/// answered (after redirects).
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub url: Url,
}

/// The agent's HTTP client for plugin sources; cheap to clone (connections are pooled).
#[derive(Clone, Debug)]
pub struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    max_body_bytes: u64,
    timeout: Duration,
    insecure_registries: Arc<BTreeSet<String>>,
    credentials: Arc<std::collections::BTreeMap<String, Credentials>>,
}

/// A registry login (user name and password or token). Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// The `Authorization: Basic ...` value.
    pub fn basic(&self) -> String {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", self.username, self.password))
        )
    }
}

/// The registry host a Docker config `auths` key names: `https://index.docker.io/v1/`,
/// `docker.io`, `registry.example.com:5000/` and the like, reduced to what references use
/// (Docker Hub as its API host, `registry-1.docker.io`).
pub fn normalize_registry(key: &str) -> String {
    let key = key.trim();
    let key = key.split_once("://").map_or(key, |(_, rest)| rest);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "docker.io" | "index.docker.io" | "registry.hub.docker.com" => {
            "registry-1.docker.io".to_string()
        }
        _ => host,
    }
}

/// Parses a Docker config file's `auths`: registry → credentials. An entry has `auth`
/// (base64 of `user:password`) or `username` and `password`; entries with neither (an
/// `identitytoken` only, a credential helper) are skipped with a warning.
pub fn parse_docker_config(
    text: &str,
) -> Result<std::collections::BTreeMap<String, Credentials>, String> {
    use base64::Engine as _;
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    if !value.is_object() {
        return Err("not a Docker config: the document must be a JSON object".into());
    }
    let config: Config = serde_json::from_value(value)
        .map_err(|e| format!("not a Docker config JSON document: {e}"))?;
    let mut out = std::collections::BTreeMap::new();
    for (key, entry) in config.auths {
        let credentials = match (
            entry.auth.filter(|a| !a.is_empty()),
            entry.username,
            entry.password,
        ) {
            (Some(auth), _, _) => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| format!("the auth of {key:?} is not base64 of user:password"))?;
                let (username, password) = decoded.split_once(':').ok_or_else(|| {
                    format!("the auth of {key:?} has no ':' between user and password")
                })?;
                Credentials {
                    username: username.into(),
                    password: password.into(),
                }
            }
            (None, Some(username), Some(password)) => Credentials { username, password },
            _ => {
                tracing::warn!(registry = %key, "registry auth entry has neither auth nor username and password; skipped");
                continue;
            }
        };
        out.insert(normalize_registry(&key), credentials);
    }
    Ok(out)
}

impl Fetcher {
    /// A client trusting the platform's roots and `config.ca_files`.
    pub fn new(config: &FetchConfig) -> Result<Fetcher, ConfigError> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "reading the system's CA certificates");
        }
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            // A minimal container image has no CA bundle: use the bundled Mozilla roots
            // rather than trusting nothing.
            let (bundled, _) = roots.add_parsable_certificates(
                webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
            );
            tracing::info!(
                roots = bundled,
                "no system CA certificates found; using the bundled Mozilla roots for https plugin sources"
            );
        }
        for path in &config.ca_files {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<_, _>>())
                .map_err(|e| ConfigError::CaFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(ConfigError::CaFile {
                    path: path.clone(),
                    reason: "no CERTIFICATE block in it".into(),
                });
            }
            for cert in certs {
                roots.add(cert).map_err(|e| ConfigError::CaFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            }
        }
        if roots.is_empty() {
            return Err(ConfigError::NoRoots);
        }
        let credentials = match &config.registry_auth_file {
            None => Default::default(),
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|text| parse_docker_config(&text))
                .map_err(|reason| ConfigError::RegistryAuth {
                    path: path.clone(),
                    reason,
                })?,
        };
        let mut insecure = BTreeSet::new();
        for value in &config.insecure_registries {
            let ok = value.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
            });
            if !ok {
                return Err(ConfigError::InsecureRegistry {
                    value: value.clone(),
                });
            }
            insecure.insert(value.to_ascii_lowercase());
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        // The connector may speak both schemes; which URL may use plain http is decided per
        // request in `get` (deny by default).
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Fetcher {
            client,
            max_body_bytes: config.max_body_bytes,
            timeout: config.timeout,
            insecure_registries: Arc::new(insecure),
            credentials: Arc::new(credentials),
        })
    }

    /// The largest body accepted, in bytes.
    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes
    }

    /// The deadline of one fetch (`--plugin-fetch-timeout-seconds`). An OCI pull, which
    /// takes several requests, is held to it as a whole as well as per request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The `--registry-auth-file` login for `registry` (as written in references), if any.
    pub fn credentials(&self, registry: &str) -> Option<&Credentials> {
        self.credentials.get(&normalize_registry(registry))
    }

    /// Whether `host_port` (as `HOST:PORT`) is listed with `--insecure-registry`.
    pub fn is_insecure_registry(&self, host_port: &str) -> bool {
        self.insecure_registries
            .contains(&host_port.to_ascii_lowercase())
    }

    /// GETs `url` with `headers`, following at most [`MAX_REDIRECTS`] redirects, and reads
    /// the body up to `limit` bytes. Plain http is allowed only when `plain_http_hosts` is
    /// true and the URL's `HOST:PORT` is an `--insecure-registry` (each redirect target is
    /// checked again). Any status is returned: the caller decides what it means.
    pub async fn get(
        &self,
        url: &Url,
        headers: &[(HeaderName, String)],
        limit: u64,
        plain_http_hosts: bool,
    ) -> Result<Response, FetchError> {
        match tokio::time::timeout(
            self.timeout,
            self.get_inner(url, headers, limit, plain_http_hosts),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout {
                url: url.to_string(),
                after: self.timeout,
            }),
        }
    }

    async fn get_inner(
        &self,
        start: &Url,
        headers: &[(HeaderName, String)],
        limit: u64,
        plain_http_hosts: bool,
    ) -> Result<Response, FetchError> {
        let mut url = start.clone();
        let origin = host_port(start);
        for _ in 0..=MAX_REDIRECTS {
            self.check_scheme(&url, plain_http_hosts)?;
            let mut request = Request::get(url.as_str());
            for (name, value) in headers {
                // Credentials are meant for the host they were issued for; a registry that
                // redirects a blob to a storage service must not see them forwarded there.
                if *name == AUTHORIZATION && host_port(&url) != origin {
                    continue;
                }
                let value = HeaderValue::from_str(value).map_err(|e| FetchError::BadUrl {
                    url: url.to_string(),
                    reason: format!("header {name}: {e}"),
                })?;
                request = request.header(name, value);
            }
            let request = request.body(Empty::new()).map_err(|e| FetchError::BadUrl {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| FetchError::Connect {
                    url: url.to_string(),
                    detail: chain(&e),
                })?;
            let status = response.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                let location = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let next = url.join(&location).ok().filter(|_| !location.is_empty());
                url = next.ok_or_else(|| FetchError::BadRedirect {
                    url: url.to_string(),
                    status,
                    location,
                })?;
                continue;
            }
            let declared = response
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if let Some(n) = declared.filter(|n| *n > limit) {
                return Err(FetchError::TooLarge {
                    url: url.to_string(),
                    limit,
                    found: n.to_string(),
                });
            }
            let (parts, body) = response.into_parts();
            let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
            let body = match Limited::new(body, limit_usize).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return Err(FetchError::TooLarge {
                        url: url.to_string(),
                        limit,
                        found: format!("more than {limit}"),
                    });
                }
                Err(e) => {
                    return Err(FetchError::Body {
                        url: url.to_string(),
                        detail: e.to_string(),
                    });
                }
            };
            return Ok(Response {
                status: parts.status,
                headers: parts.headers,
                body,
                url,
            });
        }
        Err(FetchError::TooManyRedirects {
            url: start.to_string(),
        })
    }

    fn check_scheme(&self, url: &Url, plain_http_hosts: bool) -> Result<(), FetchError> {
        match url.scheme() {
            "https" => Ok(()),
            "http" if plain_http_hosts && self.is_insecure_registry(&host_port(url)) => Ok(()),
            "http" => Err(FetchError::PlainHttp {
                url: url.to_string(),
                hint: if plain_http_hosts {
                    " (an administrator can allow a registry over plain http with the agent's --insecure-registry HOST:PORT)"
                } else {
                    ""
                },
            }),
            other => Err(FetchError::BadUrl {
                url: url.to_string(),
                reason: format!("scheme {other} is not https"),
            }),
        }
    }
}

/// `host:port` of a URL, with the scheme's default port filled in.
pub fn host_port(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

/// An error and its sources on one line: hyper's top-level error ("client error
/// (Connect)") says little; the TLS or socket cause is in the chain.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetcher(insecure: &[&str]) -> Fetcher {
        Fetcher::new(&FetchConfig {
            insecure_registries: insecure.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn plain_http_only_to_listed_registries_and_never_for_urls() {
        let f = fetcher(&["registry.lab:5000"]);
        let listed = Url::parse("http://registry.lab:5000/v2/").unwrap();
        let other = Url::parse("http://registry.lab:5001/v2/").unwrap();
        f.check_scheme(&listed, true).unwrap();
        let err = f.check_scheme(&other, true).unwrap_err();
        assert!(err.to_string().contains("--insecure-registry"), "{err}");
        // A URL source never takes the registry exception, even for a listed host.
        assert!(matches!(
            f.check_scheme(&listed, false),
            Err(FetchError::PlainHttp { .. })
        ));
        f.check_scheme(&Url::parse("https://anything.example/x").unwrap(), false)
            .unwrap();
        assert!(matches!(
            f.check_scheme(&Url::parse("ftp://x/y").unwrap(), false),
            Err(FetchError::BadUrl { .. })
        ));
    }

    #[test]
    fn insecure_registries_must_be_host_and_port() {
        for bad in [
            "registry.lab",
            "http://registry.lab:5000",
            "registry.lab:port",
            ":5000",
        ] {
            let err = Fetcher::new(&FetchConfig {
                insecure_registries: vec![bad.into()],
                ..Default::default()
            })
            .unwrap_err();
            assert!(
                matches!(err, ConfigError::InsecureRegistry { .. }),
                "{bad}: {err}"
            );
        }
        assert!(fetcher(&["Registry.Lab:5000"]).is_insecure_registry("registry.lab:5000"));
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = Fetcher::new(&FetchConfig {
            ca_files: vec![path.clone()],
            ..Default::default()
        })
        .unwrap_err();
        assert!(matches!(err, ConfigError::CaFile { .. }), "{err}");
        let err = Fetcher::new(&FetchConfig {
            ca_files: vec![dir.path().join("missing.pem")],
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");
    }

    #[test]
    fn docker_config_auths_are_read_per_registry() {
        let text = r#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "dXNlcjpwYXNzOndpdGg6Y29sb25z"},
            "Registry.Example.com:5000/": {"username": "robot", "password": "s3cret"},
            "helper-only.example.com": {"identitytoken": "x"}
        }}"#;
        let auths = parse_docker_config(text).unwrap();
        assert_eq!(
            auths["registry-1.docker.io"],
            Credentials {
                username: "user".into(),
                password: "pass:with:colons".into()
            }
        );
        assert_eq!(
            auths["registry.example.com:5000"].basic(),
            "Basic cm9ib3Q6czNjcmV0"
        );
        assert_eq!(auths.len(), 2, "{auths:?}");
        assert!(
            !format!("{:?}", auths["registry.example.com:5000"]).contains("s3cret"),
            "Debug hides the password"
        );
        assert!(
            parse_docker_config(r#"{"auths": {"r": {"auth": "bm9jb2xvbg=="}}}"#)
                .unwrap_err()
                .contains("no ':'")
        );
        assert!(parse_docker_config("[]").is_err());
    }

    #[test]
    fn host_port_fills_in_the_default_port() {
        assert_eq!(
            host_port(&Url::parse("https://ghcr.io/v2/").unwrap()),
            "ghcr.io:443"
        );
        assert_eq!(
            host_port(&Url::parse("http://127.0.0.1:20001/v2/").unwrap()),
            "127.0.0.1:20001"
        );
    }
}
