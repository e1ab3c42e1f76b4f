//! Cluster-side setup: CRDs, the plugin signing key, signed plugins, unique names.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use bosun_api::plugin::{Plugin, PluginSpec};
use bosun_lab::LabHandle;
use bosun_trust::{Digest, SigningKey, Statement};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::{DEADLINE, MANAGER, target_dir, workspace_root};

/// The annotation carrying the version the signatures bind (the agent reads it).
const VERSION_ANNOTATION: &str = "bosun.dev/plugin-version";

/// The namespace plugin ConfigMaps are published in.
pub const PLUGIN_NAMESPACE: &str = "bosun-system";

/// A name no earlier run used (the lab's etcd outlives test runs): `<prefix>-<pid>-<nanos>`,
/// a valid DNS label and label value for prefixes up to 30 characters.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// Applies every CRD in `deploy/crds` (server-side apply, so re-applying is harmless) and
/// waits until each is Established.
pub async fn apply_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = workspace_root().join("deploy/crds");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying {}", path.display()))?;
        tokio::time::timeout(
            DEADLINE,
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not Established within {DEADLINE:?}"))??;
    }
    WATCH_CACHES
        .get_or_try_init(|| async {
            let ((), (), (), (), (), ()) = tokio::try_join!(
                await_watch_cache::<bosun_api::Operation>(client),
                await_watch_cache::<bosun_api::NodeTask>(client),
                await_watch_cache::<bosun_api::Plugin>(client),
                await_watch_cache::<bosun_api::Policy>(client),
                await_watch_cache::<bosun_api::ClusterLifecycle>(client),
                await_watch_cache::<bosun_api::NodeReport>(client),
            )?;
            anyhow::Ok(())
        })
        .await?;
    Ok(())
}

/// Set once this process has seen every Bosun resource's watch cache ready.
static WATCH_CACHES: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// Waits until the API server's watch cache of `K` serves a watch from the newest
/// resourceVersion. A CRD just created, or an API server just started, builds that cache
/// asynchronously, from the resourceVersion it starts at: a watch from an older one (the
/// resourceVersion of a list read from etcd before the cache was built) is refused as "too
/// old" (410), and a kube-runtime watcher lists again. Tests that count lists (the fleet
/// smoke test requires each watch to list once) would count that startup relist, which
/// happened on a brand-new machine, where the first test creates the CRDs; so every test
/// process waits here once. Costs about a second (the probe watch's own timeout), for all
/// resources at once.
async fn await_watch_cache<K>(client: &Client) -> Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    use futures::TryStreamExt as _;
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&()).to_string();
    let started = std::time::Instant::now();
    loop {
        let list = api
            .list_metadata(&kube::api::ListParams::default().limit(1))
            .await
            .with_context(|| format!("listing {kind}"))?;
        let version = list.metadata.resource_version.unwrap_or_default();
        let ready = match api
            .watch_metadata(&kube::api::WatchParams::default().timeout(1), &version)
            .await
        {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                match tokio::time::timeout(std::time::Duration::from_secs(5), stream.try_next())
                    .await
                {
                    Ok(Ok(Some(kube::api::WatchEvent::Error(status)))) => status.code != 410,
                    Ok(Ok(_)) => true,
                    Ok(Err(_)) | Err(_) => false,
                }
            }
            Err(_) => false,
        };
        if ready {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < DEADLINE,
            "the API server's watch cache of {kind} did not accept a watch from resourceVersion {version} within {DEADLINE:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The Ed25519 key every e2e test signs plugins with, and the file holding its public key
/// (the agents' `--trust-root`). One key for all tests and test binaries (kept in
/// `$CARGO_TARGET_DIR/e2e-signing/`), so tests publishing the same Plugin name publish the
/// same signature and never break each other's agents.
pub fn signing_key() -> Result<(SigningKey, PathBuf)> {
    let dir = target_dir().join("e2e-signing");
    std::fs::create_dir_all(&dir)?;
    let key_path = dir.join("e2e.key");
    let pub_path = dir.join("e2e.pub");
    if !key_path.exists() {
        // Created under a private name, then linked into place: two processes racing here
        // both end up with the one key that won.
        let tmp = dir.join(format!("e2e.key.{}", unique("tmp")));
        std::fs::write(
            &tmp,
            SigningKey::generate_ed25519().to_pkcs8_pem().as_bytes(),
        )?;
        let _ = std::fs::hard_link(&tmp, &key_path);
        let _ = std::fs::remove_file(&tmp);
    }
    let pem = std::fs::read_to_string(&key_path)
        .with_context(|| format!("reading {}", key_path.display()))?;
    let key = SigningKey::from_pem(&pem, &key_path.display().to_string()).with_context(|| {
        format!(
            "{} is not a signing key; delete it to make a new one",
            key_path.display()
        )
    })?;
    let tmp = dir.join(format!("e2e.pub.{}", unique("tmp")));
    std::fs::write(&tmp, key.public_key().to_pem())?;
    std::fs::rename(&tmp, &pub_path)?;
    Ok((key, pub_path))
}

/// Builds `bosun-test-steps` and publishes it as Plugin `e2e-steps`, reading `/etc` and
/// writing `state_dir` (its actions' files), as the lab tests that drive steps use it.
pub async fn publish_test_steps(client: &Client, state_dir: &str) -> Result<()> {
    let wasm = crate::build_plugin("bosun-test-steps")?;
    publish_plugin(
        client,
        "e2e-steps",
        "0.1.0",
        wasm,
        json!({ "filesystem": [
            { "path": "/etc", "access": "ReadOnly" },
            { "path": state_dir, "access": "ReadWrite" },
        ] }),
    )
    .await
}

/// Signs `wasm` as plugin `name` at `version` with [`signing_key`] and publishes it: a
/// ConfigMap `plugin-<name>` in [`PLUGIN_NAMESPACE`] with the bytes, and the cluster-scoped
/// Plugin `name` pinning their digest, with exactly `grants` (a `spec.grants` JSON object).
/// `name` must be the name the plugin declares in `describe()` (the host checks it).
pub async fn publish_plugin(
    client: &Client,
    name: &str,
    version: &str,
    wasm: Vec<u8>,
    grants: serde_json::Value,
) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            PLUGIN_NAMESPACE,
            &PatchParams::apply(MANAGER),
            &Patch::Apply(json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": PLUGIN_NAMESPACE } })),
        )
        .await
        .context("creating the plugin namespace")?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), PLUGIN_NAMESPACE);
    let cm_name = format!("plugin-{name}");
    let key_name = format!("{name}.wasm");
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(cm_name.clone()),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(
            key_name.clone(),
            ByteString(wasm.clone()),
        )])),
        ..Default::default()
    };
    maps.patch(
        &cm_name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .with_context(|| format!("publishing the ConfigMap of plugin {name}"))?;
    apply_plugin(
        client,
        name,
        version,
        &wasm,
        json!({ "configMap": { "namespace": PLUGIN_NAMESPACE, "name": cm_name, "key": key_name } }),
        grants,
    )
    .await
}

/// Signs `wasm` as plugin `name` at `version` with [`signing_key`] and writes the
/// cluster-scoped Plugin `name` pinning its digest, fetched from `source` (a `spec.source`
/// JSON object: `url`, `oci` or `configMap`; publishing the bytes there is the caller's
/// job), with exactly `grants`.
///
/// The whole spec is replaced (get, then replace or create), as `kubectl bosun plugin
/// publish` does: a server-side apply would keep source fields another manager (the CLI, in
/// another test) set, and a Plugin with two sources is refused by the CRD's rules.
pub async fn apply_plugin(
    client: &Client,
    name: &str,
    version: &str,
    wasm: &[u8],
    source: serde_json::Value,
    grants: serde_json::Value,
) -> Result<()> {
    let (key, _) = signing_key()?;
    let digest = Digest::of(wasm);
    let signature = key.sign_statement(&Statement::new(name, version, digest)?);
    let spec: PluginSpec = serde_json::from_value(json!({
        "source": source,
        "sha256": digest.to_string(),
        "signatures": [{ "algorithm": "ed25519", "keyId": signature.key_id, "signature": signature.signature }],
        "grants": grants,
    }))
    .with_context(|| format!("the Plugin spec of {name}"))?;
    let plugins: Api<Plugin> = Api::all(client.clone());
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    // A concurrent writer (another test publishing the same name) makes the replace or
    // create conflict: read again and retry.
    for _ in 0..10 {
        let written = match plugins
            .get_opt(name)
            .await
            .with_context(|| format!("reading Plugin {name}"))?
        {
            Some(mut existing) => {
                existing.spec = spec.clone();
                existing
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(VERSION_ANNOTATION.into(), version.into());
                plugins.replace(name, &params, &existing).await
            }
            None => {
                let mut plugin = Plugin::new(name, spec.clone());
                plugin.metadata.annotations = Some(BTreeMap::from([(
                    VERSION_ANNOTATION.to_string(),
                    version.to_string(),
                )]));
                plugins.create(&params, &plugin).await
            }
        };
        match written {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e).with_context(|| format!("writing Plugin {name}")),
        }
    }
    bail!("Plugin {name} kept changing under this test (10 conflicts in a row)")
}

/// Builds, signs and publishes the `hello` example plugin with exactly the grants it needs
/// (`/etc` read-only, `/usr/bin/uname -r`), and gives every lab node's host root the
/// `uname` binary and its libraries (granted commands run chrooted into the host root).
pub async fn publish_hello(lab: &LabHandle) -> Result<()> {
    install_uname(lab)?;
    let wasm = crate::build_plugin("bosun-plugin-hello")?;
    publish_plugin(
        &lab.client,
        "hello",
        "0.1.0",
        wasm,
        json!({
            "filesystem": [{ "path": "/etc", "access": "ReadOnly" }],
            "exec": [{ "command": "/usr/bin/uname", "args": [["-r"]], "dryRun": true }],
        }),
    )
    .await
}

/// Copies `/usr/bin/uname` and the shared libraries it loads into each node's host root.
/// Idempotent.
fn install_uname(lab: &LabHandle) -> Result<()> {
    let ldd = Command::new("ldd")
        .arg("/usr/bin/uname")
        .output()
        .context("running ldd")?;
    let mut files = vec![PathBuf::from("/usr/bin/uname")];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux... (0x...)`
        let path = line
            .split("=>")
            .last()
            .unwrap_or("")
            .split_whitespace()
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    for node in &lab.nodes {
        for file in &files {
            let dest = node.host_root.join(file.strip_prefix("/")?);
            std::fs::create_dir_all(dest.parent().context("a file has a parent")?)?;
            if std::fs::read(&dest).ok() == std::fs::read(file).ok() {
                continue; // already there: leave the file (and its mtime) alone
            }
            std::fs::copy(file, &dest)
                .with_context(|| format!("copying {} to {}", file.display(), dest.display()))?;
        }
    }
    Ok(())
}

/// The events.k8s.io Events about the object named `name`. Bosun's objects are
/// cluster-scoped, so their Events are in `default`; `reason`, when given, keeps only those.
pub async fn events_about(
    client: &Client,
    name: &str,
    reason: Option<&str>,
) -> Result<Vec<k8s_openapi::api::events::v1::Event>> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "default");
    let list = api
        .list(&ListParams::default())
        .await
        .context("listing Events")?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && reason.is_none_or(|r| e.reason.as_deref() == Some(r))
        })
        .collect())
}
