//! The `Plugin` resource: a WebAssembly plugin the cluster trusts, pinned by digest, with
//! the capabilities an administrator grants it.
//!
//! Agents fetch the bytes from `source`, refuse them unless they hash to `sha256` and one
//! of `signatures` verifies against a configured trust root, and run them with exactly
//! `grants`. A Plugin has no status: verification happens on each node, each time a step
//! runs, and its outcome is in that step's NodeTask status (`PluginUnavailable` with the
//! reason when refused); `kubectl bosun plugin verify` and `inspect` show a plugin file's
//! signature and declarations offline.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::grants::Grants;

/// Well-known Plugin resource names the planner uses for built-in Operation kinds.
///
/// A cluster that runs `upgrade` or `renewCertificates` Operations needs Plugin resources
/// with these names; the actions each must provide are listed in `docs/api.md`.
pub mod well_known {
    /// `kubeadm upgrade apply` (action `apply`) and `kubeadm upgrade node` (action `node`).
    pub const KUBEADM_UPGRADE: &str = "kubeadm-upgrade";
    /// Certificate renewal (action `renew`) and restart of the control-plane static pods
    /// (action `restart-control-plane`).
    pub const CERTS: &str = "certs";
    /// Package upgrades through the node's package manager (action `install`).
    pub const PACKAGES: &str = "packages";
    /// kubelet service control (action `restart`).
    pub const KUBELET: &str = "kubelet";
    /// etcd's health (action `health`) and a verified snapshot (action `snapshot`) on
    /// control-plane nodes before an upgrade.
    pub const ETCD: &str = "etcd";
    /// A reboot of the node (action `reboot`), through a service grant on `reboot.target`;
    /// the step that runs it waits for the node's new boot (`awaitNewBoot`).
    pub const REBOOT: &str = "reboot";
}

/// A plugin the cluster trusts. Cluster-scoped.
// Each `printcolumn(...)` repeats keys such as `type_ = "string"`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bosun.dev",
    version = "v1alpha1",
    kind = "Plugin",
    shortname = "bplugin",
    category = "bosun",
    derive = "PartialEq",
    doc = "A Plugin is a signed WebAssembly component that agents may run, pinned by its sha256 digest, with the host capabilities the administrator grants it.",
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".spec.sha256",
        priority = 1
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".metadata.annotations.bosun\\.dev/plugin-version"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PluginSpec {
    /// Where agents fetch the plugin's bytes.
    pub source: PluginSource,

    /// The digest the bytes must hash to, `sha256:` and 64 lowercase hex digits.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub sha256: String,

    /// Signatures over the digest; at least one must verify against a trust root.
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) > 0",
        "message": "a Plugin needs at least one signature over its digest (make one with `kubectl bosun plugin sign` or `cosign sign-blob`); unsigned plugins never run",
    }]))]
    pub signatures: Vec<Signature>,

    /// The host capabilities the plugin gets. Everything not listed is denied.
    #[serde(default)]
    pub grants: Grants,

    /// Run this plugin, instead of the one a step names, on the nodes of the OS families
    /// listed: a community backend for a distribution the named plugin does not serve (a
    /// `zypper` plugin for SUSE nodes in place of `packages`). The agent chooses on each
    /// node, from its os-release, when the step runs (docs/plugins.md, "Backends for an OS
    /// family"). Absent: the plugin runs only where a step names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
}

/// What a backend plugin stands in for, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// The plugin name steps give, which this plugin runs in place of on its families'
    /// nodes: `packages` for the package installs of upgrades, or a name custom Operations'
    /// steps use. A plugin may name itself (the first-party `packages` declaring the
    /// families it serves).
    #[serde(rename = "for")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub for_plugin: String,
    /// The OS families served, as os-release spells them: an `ID` (`opensuse-leap`, `sles`,
    /// `debian`) or an `ID_LIKE` entry (`suse`, `rhel`). A node matches on its `ID` first,
    /// then on its `ID_LIKE` entries in their order.
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 64)))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(f, f.matches('^[a-z0-9][a-z0-9._-]*$'))",
        "message": "spec.backend.osFamilies holds os-release IDs as os-release spells them: lowercase letters, digits, '.', '_' and '-' (for example opensuse-leap, sles, suse)",
    }, {
        "rule": "self.all(f, self.exists_one(g, g == f))",
        "message": "spec.backend.osFamilies names a family twice",
    }]))]
    pub os_families: Vec<String>,
}

/// Where a plugin's bytes come from: exactly one of `oci`, `url`, `configMap`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.oci), has(self.url), has(self.configMap)].filter(x, x).size() == 1",
    "message": "spec.source must set exactly one of oci, url or configMap",
}]))]
pub struct PluginSource {
    /// An OCI artifact with one `application/vnd.wasm.content.layer.v1+wasm` layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSource>,
    /// An https URL serving the component's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<UrlSource>,
    /// A key of a ConfigMap holding the component (as `binaryData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapSource>,
}

/// An OCI artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciSource {
    /// Reference such as `registry.example.com/bosun/certs:0.1.0`.
    #[schemars(length(min = 1, max = 512))]
    pub reference: String,
}

/// An https URL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UrlSource {
    /// Must start with `https://`.
    #[schemars(regex(pattern = r"^https://[^\s]+$"), length(max = 2048))]
    pub url: String,
}

/// A ConfigMap key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapSource {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A signature over the plugin's signed statement (its name, version and sha256 digest; see
/// docs/trust.md). The same shape as an entry of the `<plugin>.wasm.sig.json` bundle that
/// `kubectl bosun plugin sign` writes, so entries can be copied over as they are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Signature {
    /// The signature scheme.
    pub algorithm: SignatureAlgorithm,
    /// The trust-root key that made it, as `sha256:<hex>` of its public key (printed by
    /// `kubectl bosun plugin keygen`). Optional: cosign signatures carry none, and without
    /// it every trust root of the algorithm is tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key_id: Option<String>,
    /// The signature, base64.
    #[schemars(
        regex(pattern = r"^[A-Za-z0-9+/]+={0,2}$"),
        length(min = 4, max = 4096)
    )]
    pub signature: String,
}

/// A signature scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SignatureAlgorithm {
    /// Ed25519 over the statement (`kubectl bosun plugin sign`).
    #[serde(rename = "ed25519")]
    Ed25519,
    /// ECDSA P-256 with SHA-256 over the statement, DER-encoded, base64
    /// (`cosign sign-blob`).
    #[serde(rename = "ecdsa-p256-sha256")]
    EcdsaP256Sha256,
}
