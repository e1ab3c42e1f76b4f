//! `kubectl bosun plugin publish`: puts a signed plugin into the cluster so agents can run
//! it, without hand-editing YAML. It writes the plugin's bytes into a ConfigMap and the
//! `Plugin` resource pinning them: `spec.sha256`, `spec.signatures` copied from the
//! signature bundle (`FILE.wasm.sig.json`), `spec.grants` from a grants file, and the
//! annotation `bosun.dev/plugin-version` (the version the signatures bind).
//!
//! With `--url URL` or `--oci REF` no ConfigMap is written: the Plugin's source is that
//! https URL or OCI reference, where the publisher has put the same bytes (`oras push`);
//! the pin is still computed from FILE, so agents refuse anything else found there.
//!
//! It refuses anything the agents would refuse later: a bundle made for other bytes, a
//! bundle without signatures, a name or version other than the ones signed, a grants file
//! with unknown fields, bytes too large for a ConfigMap.
//!
//! `publish` (about 120 lines) is kept whole on purpose: the publish's steps in the order they
//! happen (the file, its signature bundle and grants read; the source chosen: ConfigMap, https
//! or OCI; the namespace, the ConfigMap and the Plugin written).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result, ensure};
use bosun_api::grants::Grants;
use bosun_api::plugin::{
    Backend, ConfigMapSource, OciSource, Plugin, PluginSource, PluginSpec, Signature,
    SignatureAlgorithm, UrlSource,
};
use bosun_trust::{Algorithm, Digest, SignatureBundle};
use clap::Args;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use super::grants::read_grants;
use crate::Status;
use crate::ops::{Connection, FIELD_MANAGER};
use crate::terminal::{clean, errln, outln};

/// The annotation the agent reads the plugin's version from.
pub const VERSION_ANNOTATION: &str = "bosun.dev/plugin-version";

/// The API server's limit on a ConfigMap's data (keys and values together).
pub const CONFIGMAP_LIMIT: usize = 1024 * 1024;

/// Runs `plugin publish`.
pub fn execute(args: PublishArgs) -> Result<Status> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(publish(args))
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The plugin file (`.wasm` component), signed with `kubectl bosun plugin sign`.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The Plugin resource's name; must be the name the signatures bind. Default: the
    /// bundle's name.
    #[arg(long)]
    pub name: Option<String>,
    /// The version; must be the version the signatures bind. Default: the bundle's.
    #[arg(long)]
    pub version: Option<String>,
    /// Namespace of the ConfigMap that carries the bytes (created if missing).
    #[arg(long, default_value = "bosun-system")]
    pub namespace: String,
    /// Grants (YAML, the `grants` of a Plugin resource). Without it the plugin is granted
    /// nothing: every host capability is denied.
    #[arg(long, value_name = "FILE")]
    pub grants: Option<PathBuf>,
    /// Signature bundle. Default: FILE.sig.json.
    #[arg(long, value_name = "PATH")]
    pub bundle: Option<PathBuf>,
    /// The ConfigMap's name. Default: plugin-NAME.
    #[arg(long, value_name = "NAME")]
    pub configmap: Option<String>,
    /// Instead of a ConfigMap: the https URL agents fetch FILE's bytes from (put them there
    /// yourself).
    #[arg(long, value_name = "URL", conflicts_with_all = ["oci", "configmap"])]
    pub url: Option<String>,
    /// Instead of a ConfigMap: the OCI reference agents pull FILE's bytes from (push them
    /// first: `oras push REF FILE:application/vnd.wasm.content.layer.v1+wasm`).
    #[arg(long, value_name = "REF", conflicts_with_all = ["url", "configmap"])]
    pub oci: Option<String>,
    /// Run this plugin in place of plugin NAME on the nodes of the OS families
    /// `--os-families` lists (`spec.backend`; docs/plugins.md, "Backends for an OS family").
    /// Publishing replaces the whole spec, so a backend is kept only when given here again.
    #[arg(long, value_name = "NAME", requires = "os_families")]
    pub backend_for: Option<String>,
    /// The OS families the backend serves, as os-release IDs, comma-separated
    /// (`opensuse-leap,sles,suse`).
    #[arg(
        long,
        value_name = "IDS",
        value_delimiter = ',',
        requires = "backend_for"
    )]
    pub os_families: Vec<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// The `spec.backend` `--backend-for` and `--os-families` ask for, checked as the API server
/// will check it (so the refusal comes before anything is written).
pub fn backend_of(for_plugin: Option<&str>, families: &[String]) -> Result<Option<Backend>> {
    let Some(for_plugin) = for_plugin else {
        return Ok(None);
    };
    ensure!(
        !families.is_empty() && families.len() <= 32,
        "--os-families takes 1 to 32 os-release IDs (got {})",
        families.len()
    );
    for (i, family) in families.iter().enumerate() {
        ensure!(
            !family.is_empty()
                && family.len() <= 64
                && family.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && family.chars().all(|c| c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || matches!(c, '.' | '_' | '-')),
            "--os-families: {family:?} is not an os-release ID: write it as os-release spells ID (lowercase letters, digits, '.', '_' and '-'; for example opensuse-leap, sles, suse)"
        );
        ensure!(
            !families[..i].contains(family),
            "--os-families names {family} twice"
        );
    }
    Ok(Some(Backend {
        for_plugin: for_plugin.to_owned(),
        os_families: families.to_vec(),
    }))
}

/// What gets written, computed without the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Publication {
    pub name: String,
    pub version: String,
    pub namespace: String,
    pub configmap: String,
    pub key: String,
    pub bytes: Vec<u8>,
    pub spec: PluginSpec,
}

/// Checks the bytes against the bundle and builds the Plugin spec.
pub fn prepare(
    bytes: Vec<u8>,
    bundle: &SignatureBundle,
    name: Option<&str>,
    version: Option<&str>,
    namespace: &str,
    configmap: Option<&str>,
    grants: Grants,
) -> Result<Publication> {
    let (name, version, signatures) = checked_signatures(&bytes, bundle, name, version)?;
    let key = format!("{name}.wasm");
    ensure!(
        key.len() + bytes.len() <= CONFIGMAP_LIMIT,
        "the plugin is {} bytes; a ConfigMap holds at most {CONFIGMAP_LIMIT} bytes of data: shrink it (release build, strip) or serve it from an OCI registry or https URL (--oci, --url)",
        bytes.len()
    );
    let configmap = configmap.map_or_else(|| format!("plugin-{name}"), str::to_owned);
    Ok(Publication {
        name: name.clone(),
        version,
        namespace: namespace.to_owned(),
        configmap: configmap.clone(),
        key: key.clone(),
        spec: PluginSpec {
            source: PluginSource {
                oci: None,
                url: None,
                config_map: Some(ConfigMapSource {
                    namespace: namespace.to_owned(),
                    name: configmap,
                    key,
                }),
            },
            sha256: Digest::of(&bytes).to_string(),
            signatures,
            grants,
            backend: None,
        },
        bytes,
    })
}

/// Where a plugin published without a ConfigMap is fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remote {
    /// An https URL.
    Url(String),
    /// An OCI reference.
    Oci(String),
}

/// Checks the bytes against the bundle and builds the Plugin spec with a `url` or `oci`
/// source: (name, version, spec). No size limit applies here (the agents have their own,
/// `--plugin-max-mib`).
pub fn prepare_remote(
    bytes: &[u8],
    bundle: &SignatureBundle,
    name: Option<&str>,
    version: Option<&str>,
    remote: &Remote,
    grants: Grants,
) -> Result<(String, String, PluginSpec)> {
    let (name, version, signatures) = checked_signatures(bytes, bundle, name, version)?;
    let source = match remote {
        Remote::Url(url) => {
            ensure!(
                url.starts_with("https://") && !url.contains(char::is_whitespace),
                "--url {url:?} is not an https URL: agents fetch plugins over https only"
            );
            PluginSource {
                url: Some(UrlSource { url: url.clone() }),
                ..Default::default()
            }
        }
        Remote::Oci(reference) => {
            ensure!(
                !reference.is_empty()
                    && !reference.contains("://")
                    && !reference.contains(char::is_whitespace),
                "--oci {reference:?} is not an OCI reference: write it as REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST"
            );
            PluginSource {
                oci: Some(OciSource {
                    reference: reference.clone(),
                }),
                ..Default::default()
            }
        }
    };
    let spec = PluginSpec {
        source,
        sha256: Digest::of(bytes).to_string(),
        signatures,
        grants,
        backend: None,
    };
    Ok((name, version, spec))
}

/// The checks every publication makes (the bundle is for these bytes, signed, under this
/// name and version) and the signatures in the Plugin's shape: (name, version, signatures).
fn checked_signatures(
    bytes: &[u8],
    bundle: &SignatureBundle,
    name: Option<&str>,
    version: Option<&str>,
) -> Result<(String, String, Vec<Signature>)> {
    let digest = Digest::of(bytes);
    ensure!(
        bundle.sha256 == digest,
        "the signature bundle is for {} but the file's digest is {digest}: the file was rebuilt after signing; sign it again with `kubectl bosun plugin sign`",
        bundle.sha256
    );
    ensure!(
        !bundle.signatures.is_empty(),
        "the signature bundle has no signatures; sign the plugin with `kubectl bosun plugin sign` (unsigned plugins never run)"
    );
    let name = name.unwrap_or(&bundle.name);
    ensure!(
        name == bundle.name,
        "--name {name} differs from the signed name {}: agents verify the signed statement (name, version, digest), so publishing under another name would fail on every node; sign it as {name} or publish it as {}",
        bundle.name,
        bundle.name
    );
    let version = version.unwrap_or(&bundle.version);
    ensure!(
        version == bundle.version,
        "--version {version} differs from the signed version {}: sign it as {version} or publish it as {}",
        bundle.version,
        bundle.version
    );
    let signatures = bundle
        .signatures
        .iter()
        .map(|s| Signature {
            algorithm: match s.algorithm {
                Algorithm::Ed25519 => SignatureAlgorithm::Ed25519,
                Algorithm::EcdsaP256Sha256 => SignatureAlgorithm::EcdsaP256Sha256,
            },
            key_id: s.key_id.clone(),
            signature: s.signature.clone(),
        })
        .collect();
    Ok((name.to_owned(), version.to_owned(), signatures))
}

async fn publish(args: PublishArgs) -> Result<Status> {
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("reading plugin file {}", args.file.display()))?;
    let bundle_path = args
        .bundle
        .clone()
        .unwrap_or_else(|| SignatureBundle::path_for(&args.file));
    let bundle = SignatureBundle::read(&bundle_path).with_context(|| {
        format!(
            "no usable signature bundle at {}; sign the plugin first with `kubectl bosun plugin sign --key KEY {}`",
            bundle_path.display(),
            args.file.display()
        )
    })?;
    let grants = read_grants(args.grants.as_ref())?;
    let backend = backend_of(args.backend_for.as_deref(), &args.os_families)?;
    if args.grants.is_none() {
        errln!(
            "note: no --grants: the plugin is granted nothing (every host capability is denied)"
        );
    }
    let remote = match (&args.url, &args.oci) {
        (Some(url), _) => Some(Remote::Url(url.clone())),
        (None, Some(reference)) => Some(Remote::Oci(reference.clone())),
        (None, None) => None,
    };
    if let Some(remote) = remote {
        let (name, version, mut spec) = prepare_remote(
            &bytes,
            &bundle,
            args.name.as_deref(),
            args.version.as_deref(),
            &remote,
            grants,
        )?;
        spec.backend = backend;
        let client = args.conn.client().await?;
        let action = write_plugin(&client, &name, &version, &spec).await?;
        // Name and version are the bundle's, as its file says.
        outln!(
            "published {} {} {}",
            clean(&name),
            clean(&version),
            spec.sha256
        );
        match &remote {
            Remote::Url(url) => {
                outln!(
                    "  source: https URL {} (agents refuse any bytes there but these)",
                    clean(url)
                )
            }
            Remote::Oci(reference) => outln!(
                "  source: OCI artifact {} (agents refuse any bytes there but these)",
                clean(reference)
            ),
        }
        print_plugin_line(&name, action, &spec);
        return Ok(Status::Success);
    }
    let mut p = prepare(
        bytes,
        &bundle,
        args.name.as_deref(),
        args.version.as_deref(),
        &args.namespace,
        args.configmap.as_deref(),
        grants,
    )?;
    p.spec.backend = backend;
    let client = args.conn.client().await?;

    // Namespace: created when missing, left alone otherwise.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(&p.namespace).await?.is_none() {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(p.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {}", p.namespace))?;
        outln!("created namespace {}", clean(&p.namespace));
    }

    // ConfigMap: this CLI owns the plugin's key (server-side apply, forced).
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &p.namespace);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(p.configmap.clone()),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(
            p.key.clone(),
            ByteString(p.bytes.clone()),
        )])),
        ..Default::default()
    };
    maps.patch(
        &p.configmap,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .with_context(|| format!("writing ConfigMap {}/{}", p.namespace, p.configmap))?;

    let action = write_plugin(&client, &p.name, &p.version, &p.spec).await?;
    outln!(
        "published {} {} {}",
        clean(&p.name),
        clean(&p.version),
        p.spec.sha256
    );
    outln!(
        "  ConfigMap {}/{} key {} ({} bytes)",
        clean(&p.namespace),
        clean(&p.configmap),
        clean(&p.key),
        p.bytes.len()
    );
    print_plugin_line(&p.name, action, &p.spec);
    Ok(Status::Success)
}

/// Creates or replaces the Plugin `name` with `spec` and the version annotation; returns
/// "created" or "updated".
async fn write_plugin(
    client: &kube::Client,
    name: &str,
    version: &str,
    spec: &PluginSpec,
) -> Result<&'static str> {
    // The whole spec is replaced, so no grant from an earlier version lingers
    // (an apply would keep fields another manager set, which could widen the grants).
    let plugins: Api<Plugin> = Api::all(client.clone());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match plugins.get_opt(name).await? {
        Some(mut existing) => {
            existing.spec = spec.clone();
            existing
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(VERSION_ANNOTATION.into(), version.to_owned());
            plugins
                .replace(name, &params, &existing)
                .await
                .with_context(|| format!("updating Plugin {name}"))?;
            Ok("updated")
        }
        None => {
            let mut plugin = Plugin::new(name, spec.clone());
            plugin.metadata.annotations = Some(BTreeMap::from([(
                VERSION_ANNOTATION.into(),
                version.to_owned(),
            )]));
            plugins
                .create(&params, &plugin)
                .await
                .with_context(|| format!("creating Plugin {name}"))?;
            Ok("created")
        }
    }
}

fn print_plugin_line(name: &str, action: &str, spec: &PluginSpec) {
    let g = &spec.grants;
    outln!(
        "  Plugin {} {action}: {} signature{}; grants: {} filesystem, {} exec, {} services, {} http",
        clean(name),
        spec.signatures.len(),
        if spec.signatures.len() == 1 { "" } else { "s" },
        g.filesystem.len(),
        g.exec.len(),
        g.services.len(),
        g.http.len()
    );
    if let Some(b) = &spec.backend {
        outln!(
            "  backend for `{}` steps on OS families {}",
            clean(&b.for_plugin),
            clean(&b.os_families.join(", "))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_trust::{SigningKey, Statement};

    #[test]
    fn a_backend_is_checked_as_the_api_server_checks_it() {
        let families = |f: &[&str]| f.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(backend_of(None, &[]).unwrap(), None);
        let b = backend_of(Some("packages"), &families(&["opensuse-leap", "suse"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (b.for_plugin.as_str(), b.os_families),
            ("packages", families(&["opensuse-leap", "suse"]))
        );
        for (bad, says) in [
            (&[][..], "1 to 32 os-release IDs"),
            (&["openSUSE Leap"][..], "is not an os-release ID"),
            (&["-suse"][..], "is not an os-release ID"),
            (&["suse", "sles", "suse"][..], "names suse twice"),
        ] {
            let e = backend_of(Some("packages"), &families(bad)).unwrap_err();
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
    }

    fn signed(bytes: &[u8], name: &str, version: &str) -> SignatureBundle {
        let statement = Statement::new(name, version, Digest::of(bytes)).unwrap();
        let mut bundle = SignatureBundle::new(&statement);
        bundle.add(SigningKey::generate_ed25519().sign_statement(&statement));
        bundle
    }

    #[test]
    fn spec_carries_digest_signatures_grants_and_source() {
        let bytes = b"\0asm not really".to_vec();
        let bundle = signed(&bytes, "hello", "0.1.0");
        let grants: Grants =
            serde_yaml::from_str("filesystem: [{path: /etc, access: ReadOnly}]").unwrap();
        let p = prepare(
            bytes.clone(),
            &bundle,
            Some("hello"),
            Some("0.1.0"),
            "bosun-system",
            None,
            grants.clone(),
        )
        .unwrap();
        assert_eq!(p.spec.sha256, Digest::of(&bytes).to_string());
        assert_eq!(p.spec.signatures.len(), 1);
        assert_eq!(p.spec.signatures[0].algorithm, SignatureAlgorithm::Ed25519);
        assert_eq!(
            p.spec.signatures[0].signature,
            bundle.signatures[0].signature
        );
        assert_eq!(p.spec.signatures[0].key_id, bundle.signatures[0].key_id);
        assert_eq!(p.spec.grants, grants);
        let cm = p.spec.source.config_map.as_ref().unwrap();
        assert_eq!(
            (cm.namespace.as_str(), cm.name.as_str(), cm.key.as_str()),
            ("bosun-system", "plugin-hello", "hello.wasm")
        );
        assert_eq!((p.name.as_str(), p.version.as_str()), ("hello", "0.1.0"));
        // The spec passes the API types' own serde (what the API server will get).
        let json = serde_json::to_value(&p.spec).unwrap();
        assert_eq!(json["signatures"][0]["algorithm"], "ed25519");
    }

    #[test]
    fn name_and_version_default_to_the_signed_ones_and_must_match_them() {
        let bytes = b"x".to_vec();
        let bundle = signed(&bytes, "hello", "0.1.0");
        let p = prepare(
            bytes.clone(),
            &bundle,
            None,
            None,
            "ns",
            Some("cm"),
            Grants::default(),
        )
        .unwrap();
        assert_eq!(
            (p.name.as_str(), p.version.as_str(), p.configmap.as_str()),
            ("hello", "0.1.0", "cm")
        );
        let e = prepare(
            bytes.clone(),
            &bundle,
            Some("other"),
            None,
            "ns",
            None,
            Grants::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("--name other differs from the signed name hello"),
            "{e}"
        );
        let e = prepare(
            bytes,
            &bundle,
            None,
            Some("0.2.0"),
            "ns",
            None,
            Grants::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("--version 0.2.0 differs from the signed version 0.1.0"),
            "{e}"
        );
    }

    #[test]
    fn rebuilt_unsigned_or_oversized_plugins_are_refused() {
        let bundle = signed(b"old", "hello", "0.1.0");
        let e = prepare(
            b"new".to_vec(),
            &bundle,
            None,
            None,
            "ns",
            None,
            Grants::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("rebuilt after signing"), "{e}");

        let mut unsigned = signed(b"x", "hello", "0.1.0");
        unsigned.signatures.clear();
        let e = prepare(
            b"x".to_vec(),
            &unsigned,
            None,
            None,
            "ns",
            None,
            Grants::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no signatures"), "{e}");

        let big = vec![0u8; CONFIGMAP_LIMIT];
        let bundle = signed(&big, "hello", "0.1.0");
        let e = prepare(big, &bundle, None, None, "ns", None, Grants::default()).unwrap_err();
        assert!(e.to_string().contains("a ConfigMap holds at most"), "{e}");
    }

    #[test]
    fn url_and_oci_publications_pin_the_file_and_name_only_that_source() {
        let bytes = b"\0asm remote".to_vec();
        let bundle = signed(&bytes, "hello", "0.1.0");
        let url = Remote::Url("https://plugins.example.com/hello-0.1.0.wasm".into());
        let (name, version, spec) =
            prepare_remote(&bytes, &bundle, None, None, &url, Grants::default()).unwrap();
        assert_eq!((name.as_str(), version.as_str()), ("hello", "0.1.0"));
        assert_eq!(spec.sha256, Digest::of(&bytes).to_string());
        assert_eq!(spec.signatures.len(), 1);
        assert_eq!(
            spec.source,
            PluginSource {
                url: Some(UrlSource {
                    url: "https://plugins.example.com/hello-0.1.0.wasm".into()
                }),
                ..Default::default()
            }
        );
        let oci = Remote::Oci("registry.example.com/bosun/hello:0.1.0".into());
        let (_, _, spec) =
            prepare_remote(&bytes, &bundle, None, None, &oci, Grants::default()).unwrap();
        assert_eq!(
            spec.source.oci.map(|o| o.reference).as_deref(),
            Some("registry.example.com/bosun/hello:0.1.0")
        );
        assert!(spec.source.config_map.is_none() && spec.source.url.is_none());

        // No ConfigMap, so no ConfigMap limit; the bundle checks still apply.
        let big = vec![0u8; CONFIGMAP_LIMIT];
        let big_bundle = signed(&big, "hello", "0.1.0");
        prepare_remote(&big, &big_bundle, None, None, &oci, Grants::default()).unwrap();
        let e =
            prepare_remote(b"rebuilt", &bundle, None, None, &oci, Grants::default()).unwrap_err();
        assert!(e.to_string().contains("rebuilt after signing"), "{e}");
        for bad in [
            Remote::Url("http://plugins.example.com/hello.wasm".into()),
            Remote::Oci("https://registry.example.com/bosun/hello:0.1.0".into()),
            Remote::Oci(String::new()),
        ] {
            assert!(
                prepare_remote(&bytes, &bundle, None, None, &bad, Grants::default()).is_err(),
                "{bad:?}"
            );
        }
    }
}
