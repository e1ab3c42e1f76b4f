//! Plugin resolution: from a `Plugin` resource to verified-pinnable bytes in a local
//! content-addressed store.
//!
//! Sources (exactly one per Plugin, as the CRD enforces):
//! - `configMap`: a ConfigMap's `binaryData` key, read through the API server;
//! - `url`: an `https://` URL, fetched by [`crate::fetch`] (TLS against the platform's roots
//!   and `--plugin-ca-file`, size-capped, bounded in time, https-only redirects);
//! - `oci`: an OCI artifact with one `application/vnd.wasm.content.layer.v1+wasm` layer,
//!   pulled by [`crate::oci`] (anonymous or anonymous-token pulls; plain http only for
//!   `--insecure-registry` hosts).
//!
//! Whatever the source, nothing it says is trusted: the bytes are stored only after they
//! hashed to the Plugin's pinned `sha256`, and the host verifies a signature over that
//! digest before compiling them. Any failure is a [`ResolveError`] whose message says what
//! was expected, what was found and what to do; the agent blocks the task with reason
//! PluginUnavailable and that message.
//!
//! The store is a directory of `<sha256 hex>.wasm` files. Bytes are written there only
//! after they hashed to the pinned digest, and are re-hashed whenever they are read back
//! (and again by the host before it compiles them), so a tampered store file is refused,
//! never run. A digest found in the store is never fetched again.

use std::path::{Path, PathBuf};

use bosun_api::plugin::{Plugin, SignatureAlgorithm};
use bosun_host::PluginPin;
use bosun_trust::{Algorithm, Digest, PluginSignature};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::{Client, ResourceExt};

use bosun_fetch::oci::OciError;
use bosun_fetch::{FetchError, Fetcher};

/// The annotation carrying the plugin version that the signatures bind (the signed
/// statement names the plugin's name, version and digest; the Plugin resource's spec has
/// no version field yet, so the publisher records it here).
pub const VERSION_ANNOTATION: &str = "bosun.dev/plugin-version";

/// Why a plugin could not be made available. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "Plugin {name} not found: create the Plugin resource the step names (or fix the step's plugin field)"
    )]
    NotFound { name: String },
    #[error("reading {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Plugin {name}: fetching spec.source.url: {source}")]
    Url {
        name: String,
        #[source]
        source: FetchError,
    },
    #[error(
        "Plugin {name}: GET {url} answered {status}, expected 200 with the plugin's bytes: {hint}"
    )]
    UrlStatus {
        name: String,
        url: String,
        status: http::StatusCode,
        hint: &'static str,
    },
    #[error("Plugin {name}: pulling spec.source.oci {reference}: {source}")]
    Oci {
        name: String,
        reference: String,
        // Boxed: the registry errors are large and this error travels by value.
        #[source]
        source: Box<OciError>,
    },
    #[error("Plugin {name} names no source: set exactly one of spec.source.oci, url or configMap")]
    NoSource { name: String },
    #[error(
        "ConfigMap {namespace}/{configmap} has no binaryData key {key} (Plugin {name}): put the plugin's .wasm bytes there"
    )]
    MissingKey {
        name: String,
        namespace: String,
        configmap: String,
        key: String,
    },
    #[error("Plugin {name} spec.sha256 {value:?} is not a sha256 digest: {reason}")]
    BadDigest {
        name: String,
        value: String,
        reason: String,
    },
    #[error(
        "Plugin {name} bytes from {origin} hash to {found}, but {pinned} is pinned: republish the exact bytes that were signed, or pin and sign the new ones"
    )]
    DigestMismatch {
        name: String,
        origin: String,
        found: Digest,
        pinned: Digest,
    },
    #[error(
        "Plugin {name} has no {VERSION_ANNOTATION} annotation: set it to the version the signatures were made for (as in the .sig.json bundle)"
    )]
    NoVersion { name: String },
    #[error("plugin store {path}: {source}")]
    Store {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The pin (name, version, digest, signatures) a Plugin resource describes.
pub fn pin_of(plugin: &Plugin) -> Result<PluginPin, ResolveError> {
    let name = plugin.name_any();
    let sha256 = Digest::parse(&plugin.spec.sha256).map_err(|e| ResolveError::BadDigest {
        name: name.clone(),
        value: plugin.spec.sha256.clone(),
        reason: e.to_string(),
    })?;
    let version = plugin
        .annotations()
        .get(VERSION_ANNOTATION)
        .cloned()
        .ok_or_else(|| ResolveError::NoVersion { name: name.clone() })?;
    let signatures = plugin
        .spec
        .signatures
        .iter()
        .map(|s| PluginSignature {
            algorithm: match s.algorithm {
                SignatureAlgorithm::Ed25519 => Algorithm::Ed25519,
                SignatureAlgorithm::EcdsaP256Sha256 => Algorithm::EcdsaP256Sha256,
            },
            // Only a `sha256:` key id names a trust root; any other value is a human
            // label, and (as with no key id) every root of the algorithm is tried.
            key_id: s.key_id.clone().filter(|id| id.starts_with("sha256:")),
            signature: s.signature.clone(),
        })
        .collect();
    Ok(PluginPin {
        name,
        version,
        sha256,
        signatures,
    })
}

/// The local content-addressed store of plugin bytes.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// A store in `dir` (created if missing).
    pub fn new(dir: impl Into<PathBuf>) -> Result<Store, ResolveError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| ResolveError::Store {
            path: dir.clone(),
            source,
        })?;
        Ok(Store { dir })
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.wasm", digest.to_hex()))
    }

    /// The stored bytes for `digest`, if present and still hashing to it. A file that no
    /// longer matches is removed (and fetched again by the caller).
    pub fn get(&self, digest: &Digest) -> Result<Option<Vec<u8>>, ResolveError> {
        let path = self.path(digest);
        match std::fs::read(&path) {
            Ok(bytes) if Digest::of(&bytes) == *digest => Ok(Some(bytes)),
            Ok(_) => {
                tracing::warn!(path = %path.display(), "stored plugin no longer matches its digest; removing it");
                std::fs::remove_file(&path)
                    .map_err(|source| ResolveError::Store { path, source })?;
                Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ResolveError::Store { path, source }),
        }
    }

    /// Stores `bytes` under `digest` after checking they hash to it.
    pub fn put(
        &self,
        name: &str,
        origin: &str,
        digest: &Digest,
        bytes: &[u8],
    ) -> Result<(), ResolveError> {
        let found = Digest::of(bytes);
        if found != *digest {
            return Err(ResolveError::DigestMismatch {
                name: name.into(),
                origin: origin.into(),
                found,
                pinned: *digest,
            });
        }
        let path = self.path(digest);
        // A temporary file of this write's own: two writers of the same plugin at once (two
        // steps resolving it together, or agents sharing a store) must not rename each
        // other's file away. With one shared name, the second rename found it gone and a
        // step blocked on "No such file" (seen at 1,000 agents sharing a store in the bench).
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            digest.to_hex(),
            std::process::id(),
            WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::write(&tmp, bytes).map_err(|source| ResolveError::Store {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, &path).map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            ResolveError::Store { path, source }
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A Plugin resource resolved to its pin and bytes.
#[derive(Debug)]
pub struct Resolved {
    pub plugin: Plugin,
    pub pin: PluginPin,
    pub bytes: Vec<u8>,
}

/// Reads the Plugin resource `name` and gets its bytes (from the store, or from the
/// source into the store, fetching over the network with `fetcher`). The bytes hash to the
/// pinned digest; signatures are checked by the host when it loads them.
pub async fn resolve(
    client: &Client,
    store: &Store,
    fetcher: &Fetcher,
    name: &str,
) -> Result<Resolved, ResolveError> {
    let plugins: Api<Plugin> = Api::all(client.clone());
    let plugin = plugins
        .get_opt(name)
        .await
        .map_err(|source| ResolveError::Kube {
            what: format!("Plugin {name}"),
            source,
        })?
        .ok_or_else(|| ResolveError::NotFound { name: name.into() })?;
    let pin = pin_of(&plugin)?;
    if let Some(bytes) = store.get(&pin.sha256)? {
        bosun_telemetry::metrics().plugin_cache(bosun_telemetry::CacheResult::Hit);
        return Ok(Resolved { plugin, pin, bytes });
    }
    bosun_telemetry::metrics().plugin_cache(bosun_telemetry::CacheResult::Miss);
    let source = &plugin.spec.source;
    let (bytes, origin) = match (&source.config_map, &source.url, &source.oci) {
        (Some(cm), _, _) => {
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
            let map = maps
                .get(&cm.name)
                .await
                .map_err(|source| ResolveError::Kube {
                    what: format!("ConfigMap {}/{}", cm.namespace, cm.name),
                    source,
                })?;
            let bytes = map
                .binary_data
                .as_ref()
                .and_then(|d| d.get(&cm.key))
                .map(|b| b.0.clone())
                .ok_or_else(|| ResolveError::MissingKey {
                    name: name.into(),
                    namespace: cm.namespace.clone(),
                    configmap: cm.name.clone(),
                    key: cm.key.clone(),
                })?;
            (
                bytes,
                format!("ConfigMap {}/{} key {}", cm.namespace, cm.name, cm.key),
            )
        }
        (None, Some(url), _) => (fetch_url(fetcher, name, &url.url).await?, url.url.clone()),
        (None, None, Some(oci)) => {
            let bytes = bosun_fetch::oci::pull(fetcher, &oci.reference)
                .await
                .map_err(|source| ResolveError::Oci {
                    name: name.into(),
                    reference: oci.reference.clone(),
                    source: Box::new(source),
                })?;
            (bytes, format!("OCI artifact {}", oci.reference))
        }
        (None, None, None) => return Err(ResolveError::NoSource { name: name.into() }),
    };
    store.put(name, &origin, &pin.sha256, &bytes)?;
    tracing::info!(plugin = name, digest = %pin.sha256, %origin, "plugin fetched into the store");
    Ok(Resolved { plugin, pin, bytes })
}

/// GETs a URL source's bytes (https only, capped at the fetcher's limit). The caller
/// checks them against the pinned digest ([`Store::put`]).
pub async fn fetch_url(fetcher: &Fetcher, name: &str, url: &str) -> Result<Vec<u8>, ResolveError> {
    let parsed = url::Url::parse(url).map_err(|e| ResolveError::Url {
        name: name.into(),
        source: FetchError::BadUrl {
            url: url.into(),
            reason: e.to_string(),
        },
    })?;
    let response = fetcher
        .get(&parsed, &[], fetcher.max_body_bytes(), false)
        .await
        .map_err(|source| ResolveError::Url {
            name: name.into(),
            source,
        })?;
    if response.status != http::StatusCode::OK {
        let hint = match response.status.as_u16() {
            404 | 410 => "publish the plugin at that URL or fix spec.source.url",
            401 | 403 => {
                "the URL must be readable without credentials; use a public or pre-signed URL"
            }
            _ => "check the server, or fix spec.source.url",
        };
        return Err(ResolveError::UrlStatus {
            name: name.into(),
            url: response.url.to_string(),
            status: response.status,
            hint,
        });
    }
    Ok(Vec::from(response.body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::plugin::{ConfigMapSource, PluginSource, PluginSpec, Signature};

    fn plugin(annotated: bool) -> Plugin {
        let mut p = Plugin::new(
            "hello",
            PluginSpec {
                source: PluginSource {
                    config_map: Some(ConfigMapSource {
                        namespace: "ns".into(),
                        name: "cm".into(),
                        key: "hello.wasm".into(),
                    }),
                    ..Default::default()
                },
                sha256: Digest::of(b"bytes").to_string(),
                signatures: vec![
                    Signature {
                        algorithm: SignatureAlgorithm::Ed25519,
                        key_id: Some("sha256:0123456789abcdef".into()),
                        signature: "AAAA".into(),
                    },
                    Signature {
                        algorithm: SignatureAlgorithm::EcdsaP256Sha256,
                        key_id: Some("team-key".into()),
                        signature: "BBBB".into(),
                    },
                ],
                grants: Default::default(),
                backend: None,
            },
        );
        if annotated {
            p.metadata.annotations =
                Some([(VERSION_ANNOTATION.to_string(), "0.1.0".to_string())].into());
        }
        p
    }

    #[test]
    fn the_pin_carries_name_version_digest_and_mapped_signatures() {
        let pin = pin_of(&plugin(true)).unwrap();
        assert_eq!(pin.name, "hello");
        assert_eq!(pin.version, "0.1.0");
        assert_eq!(pin.sha256, Digest::of(b"bytes"));
        assert_eq!(pin.signatures[0].algorithm, Algorithm::Ed25519);
        assert_eq!(
            pin.signatures[0].key_id.as_deref(),
            Some("sha256:0123456789abcdef")
        );
        assert_eq!(pin.signatures[1].algorithm, Algorithm::EcdsaP256Sha256);
        assert_eq!(pin.signatures[1].key_id, None, "a label is not a key id");
    }

    #[test]
    fn a_plugin_without_its_version_is_refused_with_the_fix() {
        let err = pin_of(&plugin(false)).unwrap_err();
        assert!(err.to_string().contains(VERSION_ANNOTATION), "{err}");
    }

    #[test]
    fn the_store_keeps_only_bytes_that_match_their_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("store")).unwrap();
        let digest = Digest::of(b"good");
        assert!(store.get(&digest).unwrap().is_none());
        let err = store.put("hello", "test", &digest, b"evil").unwrap_err();
        assert!(matches!(err, ResolveError::DigestMismatch { .. }), "{err}");
        store.put("hello", "test", &digest, b"good").unwrap();
        assert_eq!(store.get(&digest).unwrap().as_deref(), Some(&b"good"[..]));
        // Tampering with the stored file makes it disappear instead of being used.
        std::fs::write(
            store.dir().join(format!("{}.wasm", digest.to_hex())),
            b"evil",
        )
        .unwrap();
        assert!(store.get(&digest).unwrap().is_none());
    }

    /// Many writers of the same plugin at once all succeed, and leave one file: the stored
    /// plugin, no temporary file.
    #[test]
    fn writers_of_the_same_plugin_at_once_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("store")).unwrap();
        let bytes = vec![7u8; 256 * 1024];
        let digest = Digest::of(&bytes);
        std::thread::scope(|scope| {
            let writers: Vec<_> = (0..16)
                .map(|_| {
                    scope.spawn(|| {
                        (0..20)
                            .map(|_| store.put("p", "test", &digest, &bytes))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for w in writers {
                for result in w.join().unwrap() {
                    result.unwrap();
                }
            }
        });
        assert_eq!(store.get(&digest).unwrap().as_deref(), Some(&bytes[..]));
        let names: Vec<_> = std::fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![format!("{}.wasm", digest.to_hex())]);
    }
}
