//! Pulling a plugin's WebAssembly component from an OCI registry (the OCI distribution
//! spec's pull path: manifest, then one blob).
//!
//! This module owns the registry protocol and nothing else: parsing references, the
//! anonymous bearer-token handshake, manifest parsing and picking the component's layer.
//! Transport rules (TLS, size caps, redirects, plain http only for listed registries) are
//! [`crate`]'s. What a pull guarantees:
//!
//! - The manifest is an OCI image manifest or a Docker v2 manifest (an index or manifest
//!   list is followed only when it names exactly one manifest, or exactly one for the
//!   `wasm` architecture). A manifest fetched by digest must hash to it.
//! - Exactly one layer has media type [`WASM_LAYER`]; none or several is an error naming
//!   the layers found (the convention of the WASM OCI artifact layout, which `oras push
//!   REF plugin.wasm:application/vnd.wasm.content.layer.v1+wasm` produces).
//! - The blob's bytes hash to the layer's digest and have its size. (The caller then checks
//!   the Plugin's own pinned digest and the signature: a registry is not trusted.)
//!
//! Authentication: anonymous pulls, and the standard bearer-token challenge
//! (`WWW-Authenticate: Bearer realm=...,service=...,scope=...`) answered with a token from
//! the realm, which is how public repositories on Docker Hub, GHCR, Quay and others are
//! read. With a login for the registry in the agent's `--registry-auth-file` (a Docker
//! config file, as in a `kubernetes.io/dockerconfigjson` Secret), the token is requested
//! with it (HTTP Basic), and a `Basic` challenge is answered with it directly. Credentials
//! are only ever sent to the registry they are listed for and to the token realm it names:
//! a challenge from a host the registry redirected to (blob storage) is not answered, and
//! plain http is used for redirects and the token realm only when the registry itself is
//! listed with `--insecure-registry`.
//!
//! References are checked against the distribution spec's grammar (repository components,
//! tag, `sha256:` digest) before they become URL paths, and the whole pull — every
//! manifest, token and blob request — is held to the fetcher's one deadline.

use http::StatusCode;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderName, WWW_AUTHENTICATE};
use serde::Deserialize;
use url::Url;

use bosun_trust::Digest;

use crate::{Credentials, FetchError, Fetcher, host_port};

/// The media type of the layer holding a WebAssembly component.
pub const WASM_LAYER: &str = "application/vnd.wasm.content.layer.v1+wasm";

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Manifests are small; the distribution spec lets registries refuse ones over 4 MiB.
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// A token response is a small JSON document.
const MAX_TOKEN_BYTES: u64 = 1024 * 1024;

/// Why a pull failed. Messages name the reference and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(
        "{reference:?} is not an OCI reference ({reason}): write it as REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST"
    )]
    BadReference { reference: String, reason: String },
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(
        "could not reach registry {registry} over https: {detail}: check the reference's host and port, and that the registry's certificate chains to a trusted root (the platform's CAs, or the agent's --plugin-ca-file); a registry that serves plain http must be listed with the agent's --insecure-registry {listing}"
    )]
    Unreachable {
        registry: String,
        listing: String,
        detail: String,
    },
    #[error("registry returned {status} for manifest {repository}:{object} at {url}: {hint}")]
    ManifestStatus {
        repository: String,
        object: String,
        url: String,
        status: StatusCode,
        hint: &'static str,
    },
    #[error(
        "registry returned {status} for blob {digest} of {repository} at {url}: the artifact is incomplete; push it again"
    )]
    BlobStatus {
        repository: String,
        digest: String,
        url: String,
        status: StatusCode,
    },
    #[error(
        "registry at {url} requires credentials ({challenge}) and has none for {registry} in the agent's --registry-auth-file: make the repository publicly readable, or give the agents a login for {registry} (a dockerconfigjson file)"
    )]
    Unauthorized {
        url: String,
        registry: String,
        challenge: String,
    },
    #[error(
        "{host}, where registry {registry} redirected the request for {what}, asks for credentials ({challenge}); the agent sends the login for {registry} only to {registry} and the token service it names: have the registry redirect to storage that needs no login (a pre-signed URL), or serve the content itself"
    )]
    ForeignChallenge {
        host: String,
        registry: String,
        what: String,
        challenge: String,
    },
    #[error(
        "{what} from {url} is larger than the {limit} bytes {limit_source}: the registry did not serve what it described; push the artifact again or use another registry"
    )]
    Oversized {
        what: String,
        url: String,
        limit: u64,
        limit_source: &'static str,
    },
    #[error(
        "registry at {url} refused the login for {registry} from the agent's --registry-auth-file ({challenge}): check that the user may pull the repository, and that the password or token is current"
    )]
    LoginRefused {
        url: String,
        registry: String,
        challenge: String,
    },
    #[error(
        "the token service {realm} answered {status} for scope {scope:?}: check the repository name and, for a private repository, the login for it in the agent's --registry-auth-file"
    )]
    TokenStatus {
        realm: String,
        status: StatusCode,
        scope: String,
    },
    #[error("could not understand the registry's answer from {url}: {reason}")]
    Protocol { url: String, reason: String },
    #[error(
        "{reference} is a manifest of media type {media_type:?}; expected an OCI image manifest or a Docker v2 manifest holding a {WASM_LAYER} layer: push the plugin with `oras push {reference} plugin.wasm:{WASM_LAYER}`"
    )]
    UnsupportedManifest {
        reference: String,
        media_type: String,
    },
    #[error(
        "{reference} is an index of {count} manifests and not exactly one of them is for the wasm architecture: reference the plugin's own manifest by tag or digest"
    )]
    AmbiguousIndex { reference: String, count: usize },
    #[error(
        "{reference} has no layer of media type {WASM_LAYER} (its layers: {found:?}): push the component with `oras push {reference} plugin.wasm:{WASM_LAYER}`"
    )]
    NoWasmLayer {
        reference: String,
        found: Vec<String>,
    },
    #[error(
        "{reference} has {count} layers of media type {WASM_LAYER}; a plugin artifact must have exactly one: push one component per reference"
    )]
    SeveralWasmLayers { reference: String, count: usize },
    #[error(
        "{what} from {url} hashes to {found}, not the {expected} it is addressed by: the registry served other bytes; push the artifact again or use another registry"
    )]
    DigestMismatch {
        what: String,
        url: String,
        expected: String,
        found: Digest,
    },
    #[error(
        "{what} is addressed by {digest:?}, which is not a sha256 digest: this agent checks sha256 only; push with sha256 (the default of oras and docker)"
    )]
    UnsupportedDigest { what: String, digest: String },
    #[error(
        "the {WASM_LAYER} layer of {reference} is {size} bytes, more than the agent's limit of {limit} bytes: raise the agent's --plugin-max-mib, or publish a smaller plugin"
    )]
    LayerTooLarge {
        reference: String,
        size: u64,
        limit: u64,
    },
}

/// A parsed reference: `registry/repository` with a tag or a digest (or both, in which
/// case the digest decides).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]` as written (Docker Hub's `docker.io` mapped to its API host).
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    /// Parses `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]` with Docker's conventions: the first
    /// path component is a registry when it has a `.` or `:` or is `localhost`; otherwise
    /// the registry is Docker Hub (and a one-component repository is under `library/`).
    /// Without tag or digest the tag is `latest`.
    pub fn parse(reference: &str) -> Result<Reference, OciError> {
        let bad = |reason: &str| OciError::BadReference {
            reference: reference.into(),
            reason: reason.into(),
        };
        if reference.is_empty()
            || reference.contains(char::is_whitespace)
            || reference.contains("://")
        {
            return Err(bad("it must be non-empty, without spaces or a scheme"));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => {
                if !is_sha256_digest(digest) {
                    return Err(bad(
                        "the digest must be sha256: and 64 lowercase hex digits (this agent checks sha256 only)",
                    ));
                }
                (rest, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_string()),
            ),
            None => (rest, None),
        };
        if tag.as_deref().is_some_and(|t| !is_tag(t)) {
            return Err(bad(
                "the tag must be 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'",
            ));
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ if name.contains('/') => ("registry-1.docker.io".to_string(), name.to_string()),
            _ => (
                "registry-1.docker.io".to_string(),
                format!("library/{name}"),
            ),
        };
        let registry = if registry == "docker.io" || registry == "index.docker.io" {
            "registry-1.docker.io".to_string()
        } else {
            registry
        };
        if repository.is_empty() || !repository.split('/').all(is_path_component) {
            return Err(bad(
                "the repository must be '/'-separated components of lowercase letters and digits, joined inside a component by '.', '_', '__' or dashes",
            ));
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_string())
        } else {
            tag
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What the manifest is fetched by: the digest when there is one, else the tag.
    pub fn object(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

/// A repository path component of the distribution spec: runs of `[a-z0-9]` joined by
/// `.`, `_`, `__` or dashes, so never empty, `.` or `..`, and never starting or ending
/// with a separator (such a component would let a reference address a path outside its
/// repository once the URL is normalised).
fn is_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(&bytes[0]) || !alnum(&bytes[bytes.len() - 1]) {
        return false;
    }
    let mut separator = String::new();
    for b in bytes {
        if alnum(b) {
            let ok = separator.is_empty()
                || matches!(separator.as_str(), "." | "_" | "__")
                || separator.bytes().all(|s| s == b'-');
            if !ok {
                return false;
            }
            separator.clear();
        } else if b".-_".contains(b) {
            separator.push(char::from(*b));
        } else {
            return false;
        }
    }
    true
}

/// A tag of the distribution spec: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn is_tag(t: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    t.len() <= 128
        && t.chars().next().is_some_and(word)
        && t.chars().all(|c| word(c) || c == '.' || c == '-')
}

/// `sha256:` and 64 lowercase hex digits: the only content addresses this agent follows.
fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A `WWW-Authenticate` challenge: its scheme and parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    /// The value of parameter `name` (case-insensitive name).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one challenge, `Scheme k1="v1",k2=v2`: values quoted (with `\` escapes, and
/// commas allowed inside, as in `scope="repository:a:pull,push"`) or bare tokens.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(c) = chars.peek().copied().filter(|c| *c != '=' && *c != ',') {
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            return None;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.push(chars.next()?),
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return None;
            }
        } else {
            while let Some(c) = chars.peek().copied().filter(|c| *c != ',') {
                value.push(c);
                chars.next();
            }
        }
        params.push((key.trim().to_string(), value.trim_end().to_string()));
    }
    Some(Challenge {
        scheme: scheme.to_string(),
        params,
    })
}

/// A content descriptor of a manifest (a layer, or a manifest of an index).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The platform of an index entry.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// What a manifest document turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Manifest {
    /// An image manifest (OCI or Docker v2) and its layers.
    Image(Vec<Descriptor>),
    /// An index / manifest list and its manifests.
    Index(Vec<Descriptor>),
}

/// Parses a manifest document. The media type is the document's own `mediaType`, else the
/// response's `Content-Type`; an OCI document may carry neither, and is then told apart
/// by having `layers` or `manifests`.
pub fn parse_manifest(
    reference: &str,
    url: &str,
    body: &[u8],
    content_type: Option<&str>,
) -> Result<Manifest, OciError> {
    let raw: RawManifest = serde_json::from_slice(body).map_err(|e| OciError::Protocol {
        url: url.into(),
        reason: format!("the manifest is not JSON of the expected shape: {e}"),
    })?;
    let header = content_type
        .map(|c| c.split(';').next().unwrap_or("").trim().to_string())
        .filter(|c| !c.is_empty());
    let media_type = raw.media_type.clone().or(header);
    match (media_type.as_deref(), raw.layers, raw.manifests) {
        (Some(OCI_MANIFEST | DOCKER_MANIFEST), Some(layers), _) => Ok(Manifest::Image(layers)),
        (Some(OCI_INDEX | DOCKER_LIST), _, Some(manifests)) => Ok(Manifest::Index(manifests)),
        (None | Some("application/json" | "application/octet-stream"), Some(layers), None) => {
            Ok(Manifest::Image(layers))
        }
        (None | Some("application/json" | "application/octet-stream"), None, Some(manifests)) => {
            Ok(Manifest::Index(manifests))
        }
        (t, _, _) => Err(OciError::UnsupportedManifest {
            reference: reference.into(),
            media_type: t.unwrap_or("(none)").into(),
        }),
    }
}

/// The one layer holding the component.
pub fn wasm_layer(reference: &str, layers: &[Descriptor]) -> Result<Descriptor, OciError> {
    let wasm: Vec<&Descriptor> = layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER)
        .collect();
    match wasm.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(OciError::NoWasmLayer {
            reference: reference.into(),
            found: layers.iter().map(|l| l.media_type.clone()).collect(),
        }),
        several => Err(OciError::SeveralWasmLayers {
            reference: reference.into(),
            count: several.len(),
        }),
    }
}

/// The manifest of an index to follow: the only one, or the only one for `wasm`.
pub fn index_entry(reference: &str, manifests: &[Descriptor]) -> Result<Descriptor, OciError> {
    if let [one] = manifests {
        return Ok(one.clone());
    }
    let wasm: Vec<&Descriptor> = manifests
        .iter()
        .filter(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.architecture == "wasm")
        })
        .collect();
    match wasm.as_slice() {
        [one] => Ok((*one).clone()),
        _ => Err(OciError::AmbiguousIndex {
            reference: reference.into(),
            count: manifests.len(),
        }),
    }
}

/// Checks `bytes` against a `sha256:<hex>` content address.
fn check_digest(what: &str, url: &str, expected: &str, bytes: &[u8]) -> Result<(), OciError> {
    let pinned = sha256_digest(what, expected)?;
    let found = Digest::of(bytes);
    if found != pinned {
        return Err(OciError::DigestMismatch {
            what: what.into(),
            url: url.into(),
            expected: expected.into(),
            found,
        });
    }
    Ok(())
}

/// A `sha256:<64 hex>` content address (the algorithm prefix is required here).
fn sha256_digest(what: &str, digest: &str) -> Result<Digest, OciError> {
    digest
        .strip_prefix("sha256:")
        .and_then(|_| Digest::parse(digest).ok())
        .ok_or_else(|| OciError::UnsupportedDigest {
            what: what.into(),
            digest: digest.into(),
        })
}

/// One pull: the registry's base URL and the bearer token once one was obtained.
struct Session<'a> {
    fetcher: &'a Fetcher,
    reference: Reference,
    base: Url,
    /// The `Authorization` value once a challenge was answered.
    authorization: Option<String>,
}

impl Session<'_> {
    /// GET `url` with the current authorization; on a challenge, answer it once: Bearer
    /// with a token from its realm (asked for with the registry's login if there is one),
    /// Basic with the login.
    async fn get(
        &mut self,
        url: &Url,
        accept: Option<&str>,
        limit: u64,
    ) -> Result<crate::Response, OciError> {
        let mut answered = false;
        loop {
            let mut headers: Vec<(HeaderName, String)> = Vec::new();
            if let Some(a) = accept {
                headers.push((ACCEPT, a.to_string()));
            }
            if let Some(t) = &self.authorization {
                headers.push((AUTHORIZATION, t.clone()));
            }
            let response = self
                .fetcher
                .get(url, &headers, limit, self.plain_http())
                .await?;
            if response.status != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            let header = response
                .headers
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let registry = self.reference.registry.clone();
            let shown = if header.is_empty() {
                "no WWW-Authenticate header".to_string()
            } else {
                header.clone()
            };
            // Only the registry itself may ask for its login (or send us to its token
            // service): a host it redirected to is answered with nothing.
            if host_port(&response.url) != host_port(url) {
                return Err(OciError::ForeignChallenge {
                    host: host_port(&response.url),
                    registry,
                    what: url.path().to_string(),
                    challenge: shown,
                });
            }
            let challenge = parse_challenge(&header);
            let login = self.fetcher.credentials(&registry).cloned();
            match (challenge, &login) {
                (_, Some(_)) if answered => {
                    return Err(OciError::LoginRefused {
                        url: url.to_string(),
                        registry,
                        challenge: shown,
                    });
                }
                (Some(c), _) if c.scheme.eq_ignore_ascii_case("bearer") && !answered => {
                    self.authorization = Some(format!(
                        "Bearer {}",
                        self.token(&c, url, login.as_ref()).await?
                    ));
                }
                (Some(c), Some(login)) if c.scheme.eq_ignore_ascii_case("basic") => {
                    self.authorization = Some(login.basic())
                }
                _ => {
                    return Err(OciError::Unauthorized {
                        url: url.to_string(),
                        registry,
                        challenge: shown,
                    });
                }
            }
            answered = true;
        }
    }

    /// Whether plain http may be used: only when the registry itself is reached over it
    /// (it is listed with `--insecure-registry`), for its redirects and its token service
    /// too; an https registry never sends the agent, or its login, over plain http.
    fn plain_http(&self) -> bool {
        self.base.scheme() == "http"
    }

    /// A token from the challenge's realm: anonymous, or for `login`.
    async fn token(
        &self,
        challenge: &Challenge,
        url: &Url,
        login: Option<&Credentials>,
    ) -> Result<String, OciError> {
        let realm = challenge.param("realm").ok_or_else(|| OciError::Protocol {
            url: url.to_string(),
            reason: "the Bearer challenge has no realm".into(),
        })?;
        let mut realm_url = Url::parse(realm).map_err(|e| OciError::Protocol {
            url: url.to_string(),
            reason: format!("the challenge's realm {realm:?} is not a URL: {e}"),
        })?;
        let default_scope = format!("repository:{}:pull", self.reference.repository);
        let scope = challenge
            .param("scope")
            .unwrap_or(&default_scope)
            .to_string();
        {
            let mut query = realm_url.query_pairs_mut();
            if let Some(service) = challenge.param("service") {
                query.append_pair("service", service);
            }
            query.append_pair("scope", &scope);
        }
        let headers: Vec<(HeaderName, String)> = login
            .map(|l| (AUTHORIZATION, l.basic()))
            .into_iter()
            .collect();
        let response = match self
            .fetcher
            .get(&realm_url, &headers, MAX_TOKEN_BYTES, self.plain_http())
            .await
        {
            Err(FetchError::TooLarge { url, limit, .. }) => {
                return Err(OciError::Oversized {
                    what: "the token response".into(),
                    url,
                    limit,
                    limit_source: "a token response may have",
                });
            }
            other => other?,
        };
        if response.status == StatusCode::UNAUTHORIZED && login.is_some() {
            return Err(OciError::LoginRefused {
                url: realm.into(),
                registry: self.reference.registry.clone(),
                challenge: format!("token service answered {}", response.status),
            });
        }
        if !response.status.is_success() {
            return Err(OciError::TokenStatus {
                realm: realm.into(),
                status: response.status,
                scope,
            });
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token =
            serde_json::from_slice(&response.body).map_err(|e| OciError::Protocol {
                url: realm.into(),
                reason: format!("the token response is not JSON with a token: {e}"),
            })?;
        token
            .token
            .or(token.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| OciError::Protocol {
                url: realm.into(),
                reason: "the token response has neither token nor access_token".into(),
            })
    }

    fn url(&self, path: &str) -> Result<Url, OciError> {
        self.base
            .join(&format!("v2/{}/{path}", self.reference.repository))
            .map_err(|e| OciError::BadReference {
                reference: self.reference.to_string(),
                reason: e.to_string(),
            })
    }

    /// The image manifest's layers, following one index level.
    async fn layers(&mut self) -> Result<Vec<Descriptor>, OciError> {
        let display = self.reference.to_string();
        let accept = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST].join(", ");
        let mut object = self.reference.object().to_string();
        let mut by_digest = self.reference.digest.is_some();
        for _ in 0..2 {
            let url = self.url(&format!("manifests/{object}"))?;
            let response = match self.get(&url, Some(&accept), MAX_MANIFEST_BYTES).await {
                Err(OciError::Fetch(FetchError::TooLarge { url, limit, .. })) => {
                    return Err(OciError::Oversized {
                        what: format!("manifest {object}"),
                        url,
                        limit,
                        limit_source: "a manifest may have (the distribution spec's 4 MiB)",
                    });
                }
                other => other?,
            };
            if !response.status.is_success() {
                let hint = if response.status == StatusCode::NOT_FOUND {
                    "push the artifact (oras push) or fix spec.source.oci.reference"
                } else {
                    "check the registry and the reference in spec.source.oci.reference"
                };
                return Err(OciError::ManifestStatus {
                    repository: self.reference.repository.clone(),
                    object,
                    url: url.to_string(),
                    status: response.status,
                    hint,
                });
            }
            if by_digest {
                check_digest(
                    &format!("manifest {object}"),
                    url.as_str(),
                    &object,
                    &response.body,
                )?;
            }
            let content_type = response
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            match parse_manifest(&display, url.as_str(), &response.body, content_type)? {
                Manifest::Image(layers) => return Ok(layers),
                Manifest::Index(manifests) => {
                    object = index_entry(&display, &manifests)?.digest;
                    // Followed into a URL path: it must be a digest, nothing else.
                    sha256_digest(
                        &format!("the manifest {display}'s index points to"),
                        &object,
                    )?;
                    by_digest = true;
                }
            }
        }
        Err(OciError::UnsupportedManifest {
            reference: display,
            media_type: "an index of indexes".into(),
        })
    }
}

/// Pulls the component of `reference`: manifest, its one [`WASM_LAYER`] layer, and that
/// blob, checked against the layer's digest and size. The caller still checks the bytes
/// against the Plugin's pinned digest.
///
/// The whole pull (manifests, token requests, blob, redirects) is held to the fetcher's
/// one deadline, not only each request.
pub async fn pull(fetcher: &Fetcher, reference: &str) -> Result<Vec<u8>, OciError> {
    match tokio::time::timeout(fetcher.timeout(), pull_inner(fetcher, reference)).await {
        Ok(result) => result,
        Err(_) => Err(OciError::Fetch(FetchError::Timeout {
            url: reference.to_string(),
            after: fetcher.timeout(),
        })),
    }
}

async fn pull_inner(fetcher: &Fetcher, reference: &str) -> Result<Vec<u8>, OciError> {
    let parsed = Reference::parse(reference)?;
    let scheme = if fetcher.is_insecure_registry(&registry_host_port(&parsed.registry, "http")) {
        "http"
    } else {
        "https"
    };
    let base = Url::parse(&format!("{scheme}://{}/", parsed.registry)).map_err(|e| {
        OciError::BadReference {
            reference: reference.into(),
            reason: format!("registry {:?}: {e}", parsed.registry),
        }
    })?;
    let registry = parsed.registry.clone();
    let mut session = Session {
        fetcher,
        reference: parsed,
        base,
        authorization: None,
    };
    let layers = match session.layers().await {
        Err(OciError::Fetch(FetchError::Connect { detail, .. })) if scheme == "https" => {
            return Err(OciError::Unreachable {
                listing: registry_host_port(&registry, "http"),
                registry,
                detail,
            });
        }
        other => other?,
    };
    let layer = wasm_layer(reference, &layers)?;
    if layer.size > fetcher.max_body_bytes() {
        return Err(OciError::LayerTooLarge {
            reference: reference.into(),
            size: layer.size,
            limit: fetcher.max_body_bytes(),
        });
    }
    // Refused before downloading: a digest this agent cannot check.
    sha256_digest(&format!("the wasm layer of {reference}"), &layer.digest)?;
    let url = session.url(&format!("blobs/{}", layer.digest))?;
    let what = format!("the wasm layer of {reference}");
    let response = match session.get(&url, None, layer.size).await {
        Err(OciError::Fetch(FetchError::TooLarge { url, limit, .. })) => {
            return Err(OciError::Oversized {
                what,
                url: without_query(&url),
                limit,
                limit_source: "its manifest declares",
            });
        }
        other => other?,
    };
    let served = without_query(response.url.as_str());
    if !response.status.is_success() {
        return Err(OciError::BlobStatus {
            repository: session.reference.repository.clone(),
            digest: layer.digest,
            url: served,
            status: response.status,
        });
    }
    if response.body.len() as u64 != layer.size {
        return Err(OciError::Protocol {
            url: served,
            reason: format!(
                "{what} is {} bytes, but its manifest declares {}",
                response.body.len(),
                layer.size
            ),
        });
    }
    check_digest(&what, &served, &layer.digest, &response.body)?;
    Ok(Vec::from(response.body))
}

/// `host:port` of a registry name as `--insecure-registry` entries are written: the port
/// as written, else the default port of `scheme`.
fn registry_host_port(registry: &str, scheme: &str) -> String {
    if registry
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        registry.to_string()
    } else {
        format!("{registry}:{}", if scheme == "http" { 80 } else { 443 })
    }
}

/// A URL for an error message, without its query (a redirect to storage may carry a
/// pre-signed credential there, and messages end up in NodeTask status).
fn without_query(url: &str) -> String {
    url.split_once('?').map_or(url, |(u, _)| u).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_dockers_conventions() {
        let r = Reference::parse("registry.example.com/bosun/certs:0.1.0").unwrap();
        assert_eq!(
            (
                r.registry.as_str(),
                r.repository.as_str(),
                r.tag.as_deref(),
                r.digest.as_deref()
            ),
            ("registry.example.com", "bosun/certs", Some("0.1.0"), None)
        );
        assert_eq!(r.object(), "0.1.0");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("127.0.0.1:20001/bosun/hello@{d}")).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:20001", "bosun/hello", None)
        );
        assert_eq!(r.object(), d);
        let r = Reference::parse(&format!("localhost/hello:1@{d}")).unwrap();
        assert_eq!(
            (r.registry.as_str(), r.tag.as_deref(), r.object()),
            ("localhost", Some("1"), d.as_str())
        );
        let r = Reference::parse("hello").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("registry-1.docker.io", "library/hello", Some("latest"))
        );
        let r = Reference::parse("docker.io/bosun/hello:2").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("registry-1.docker.io", "bosun/hello")
        );
        assert_eq!(
            Reference::parse("ghcr.io/a/b:1").unwrap().to_string(),
            "ghcr.io/a/b:1"
        );
    }

    #[test]
    fn malformed_references_are_refused_with_the_expected_form() {
        for bad in [
            "",
            "https://ghcr.io/a/b",
            "ghcr.io/A/b:1",
            "ghcr.io/a/b:",
            "ghcr.io/a/b@sha256",
            "ghcr.io/a//b:1",
            "ghcr.io/a/b:x y",
        ] {
            let err = Reference::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains("REGISTRY/REPOSITORY:TAG"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn bearer_challenges_parse_with_quoted_commas_and_escapes() {
        let c = parse_challenge(r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/hello:pull,push""#).unwrap();
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(c.param("Service"), Some("registry.docker.io"));
        assert_eq!(c.param("scope"), Some("repository:library/hello:pull,push"));
        let c =
            parse_challenge(r#"Bearer realm="https://r/t\"x", error=insufficient_scope"#).unwrap();
        assert_eq!(c.param("realm"), Some("https://r/t\"x"));
        assert_eq!(c.param("error"), Some("insufficient_scope"));
        let c = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(
            (c.scheme.as_str(), c.param("realm")),
            ("Basic", Some("Registry Realm"))
        );
        assert_eq!(parse_challenge(r#"Bearer realm="unterminated"#), None);
        assert_eq!(parse_challenge("Bearer realm"), None);
        assert_eq!(parse_challenge(""), None);
    }

    fn layer(media_type: &str, n: u8) -> serde_json::Value {
        serde_json::json!({ "mediaType": media_type, "digest": format!("sha256:{}", format!("{n:02x}").repeat(32)), "size": 10 + u64::from(n) })
    }

    #[test]
    fn oci_and_docker_manifests_yield_their_one_wasm_layer() {
        for media_type in [OCI_MANIFEST, DOCKER_MANIFEST] {
            let doc = serde_json::json!({
                "schemaVersion": 2, "mediaType": media_type,
                "config": { "mediaType": "application/vnd.wasm.config.v1+json", "digest": format!("sha256:{}", "0".repeat(64)), "size": 2 },
                "layers": [layer("application/vnd.oci.image.layer.v1.tar", 1), layer(WASM_LAYER, 2)],
            });
            let Manifest::Image(layers) =
                parse_manifest("r", "u", doc.to_string().as_bytes(), None).unwrap()
            else {
                panic!("not an image manifest")
            };
            let l = wasm_layer("r", &layers).unwrap();
            assert_eq!((l.media_type.as_str(), l.size), (WASM_LAYER, 12));
        }
        // No mediaType in the document: the Content-Type header (with parameters) decides.
        let doc = serde_json::json!({ "schemaVersion": 2, "layers": [layer(WASM_LAYER, 3)] });
        let parsed = parse_manifest(
            "r",
            "u",
            doc.to_string().as_bytes(),
            Some("application/vnd.oci.image.manifest.v1+json; charset=utf-8"),
        )
        .unwrap();
        assert!(matches!(parsed, Manifest::Image(ref l) if l.len() == 1));
    }

    #[test]
    fn zero_or_several_wasm_layers_are_refused_naming_what_was_found() {
        let none = [serde_json::from_value::<Descriptor>(layer(
            "application/vnd.oci.image.layer.v1.tar",
            1,
        ))
        .unwrap()];
        let err = wasm_layer("reg/x:1", &none).unwrap_err();
        assert!(matches!(err, OciError::NoWasmLayer { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("application/vnd.oci.image.layer.v1.tar")
                && text.contains("oras push reg/x:1"),
            "{text}"
        );
        let two: Vec<Descriptor> = [layer(WASM_LAYER, 1), layer(WASM_LAYER, 2)]
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        assert!(matches!(
            wasm_layer("r", &two),
            Err(OciError::SeveralWasmLayers { count: 2, .. })
        ));
    }

    #[test]
    fn other_manifest_kinds_are_refused() {
        let v1 = serde_json::json!({ "schemaVersion": 1, "mediaType": "application/vnd.docker.distribution.manifest.v1+prettyjws", "fsLayers": [] });
        let err = parse_manifest("r", "u", v1.to_string().as_bytes(), None).unwrap_err();
        assert!(matches!(err, OciError::UnsupportedManifest { .. }), "{err}");
        let err = parse_manifest("r", "u", b"<html>", Some("text/html")).unwrap_err();
        assert!(matches!(err, OciError::Protocol { .. }), "{err}");
    }

    #[test]
    fn an_index_is_followed_only_to_one_unambiguous_manifest() {
        let entry = |n: u8, arch: &str| {
            let mut v = layer(OCI_MANIFEST, n);
            v["platform"] = serde_json::json!({ "architecture": arch, "os": "wasip2" });
            v
        };
        let doc = serde_json::json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry(1, "amd64"), entry(2, "wasm")] });
        let Manifest::Index(ms) =
            parse_manifest("r", "u", doc.to_string().as_bytes(), None).unwrap()
        else {
            panic!("not an index")
        };
        assert_eq!(index_entry("r", &ms).unwrap().size, 12);
        let doc = serde_json::json!({ "schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": [entry(1, "amd64"), entry(2, "arm64")] });
        let Manifest::Index(ms) =
            parse_manifest("r", "u", doc.to_string().as_bytes(), None).unwrap()
        else {
            panic!("not an index")
        };
        assert!(matches!(
            index_entry("r", &ms),
            Err(OciError::AmbiguousIndex { count: 2, .. })
        ));
    }

    #[test]
    fn digests_are_checked_and_only_sha256_is_accepted() {
        let d = Digest::of(b"abc").to_string();
        check_digest("blob", "u", &d, b"abc").unwrap();
        assert!(matches!(
            check_digest("blob", "u", &d, b"abd"),
            Err(OciError::DigestMismatch { .. })
        ));
        let sha512 = format!("sha512:{}", "0".repeat(128));
        assert!(matches!(
            check_digest("blob", "u", &sha512, b"abc"),
            Err(OciError::UnsupportedDigest { .. })
        ));
        let bare = Digest::of(b"abc").to_hex();
        assert!(matches!(
            check_digest("blob", "u", &bare, b"abc"),
            Err(OciError::UnsupportedDigest { .. })
        ));
    }

    #[test]
    fn registries_without_a_port_take_the_schemes_default_port() {
        // A portless registry listed as insecure is reached at http://HOST/, port 80.
        assert_eq!(registry_host_port("reg.lab", "http"), "reg.lab:80");
        assert_eq!(registry_host_port("ghcr.io", "https"), "ghcr.io:443");
        assert_eq!(
            registry_host_port("127.0.0.1:20001", "http"),
            "127.0.0.1:20001"
        );
    }

    #[test]
    fn references_that_could_leave_their_repository_are_refused() {
        let d = format!("sha256:{}", "a".repeat(64));
        for bad in [
            "reg.io/a/../../x:1".to_string(),
            "reg.io/./x:1".to_string(),
            "reg.io/a/.x:1".to_string(),
            "reg.io/a/x-:1".to_string(),
            "reg.io/a/x._y:1".to_string(),
            "reg.io/a/x:.hidden".to_string(),
            "reg.io/a/x:-1".to_string(),
            "reg.io/a/x@sha256:../../y".to_string(),
            format!(
                "reg.io/a/x@{}",
                d.to_uppercase().replace("SHA256", "sha256")
            ),
            format!("reg.io/a/x@sha512:{}", "a".repeat(128)),
        ] {
            let err = Reference::parse(&bad).unwrap_err();
            assert!(matches!(err, OciError::BadReference { .. }), "{bad}: {err}");
        }
        for good in ["reg.io/a__b/c.d/e--f:v1.0_x", "reg.io/a/b:_under"] {
            Reference::parse(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn error_urls_lose_their_query() {
        assert_eq!(
            without_query("https://s3.example/blob?X-Amz-Signature=secret"),
            "https://s3.example/blob"
        );
        assert_eq!(
            without_query("https://reg/v2/a/blobs/sha256:ab"),
            "https://reg/v2/a/blobs/sha256:ab"
        );
    }
}
