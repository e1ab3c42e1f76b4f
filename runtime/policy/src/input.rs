//! The input documents of the three decision points.
//!
//! These types are the contract between Bosun and policy authors: the controller and
//! agent fill them in, policies read them as `input`. Their JSON Schemas are generated
//! from these types ([`schemas`]) and checked in under `policies/schema/`; a test fails
//! when the two drift. Unknown fields are refused, so an example or test case that does
//! not match the documented shape is caught.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::capabilities::{Grants, RequestedCapabilities};

/// Input of the step decision point (`data.bosun.step.deny`): everything known right
/// before a plugin step runs on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepInput {
    pub operation: OperationRef,
    pub task: TaskRef,
    pub step: StepRef,
    pub plugin: PluginInfo,
    /// The grants the administrator gave the plugin (the `Plugin` resource's `grants`).
    pub grants: Grants,
    pub node: NodeFacts,
    /// Preflight results of this step: the agent's built-in checks and the plugin's own.
    #[serde(default)]
    pub preflight: Vec<PreflightResult>,
    pub cluster: ClusterState,
    /// The agent's clock when the decision is made, RFC 3339 with offset
    /// (`2026-11-30T01:00:00Z`). Policies use it instead of `time.now_ns()` so that
    /// decisions can be reproduced and tested.
    #[schemars(extend("format" = "date-time"))]
    pub now: String,
}

/// Input of the operation decision point (`data.bosun.operation.deny`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationInput {
    pub operation: OperationRef,
    /// The plan: groups in order, each with its node names.
    #[serde(default)]
    pub plan: Vec<PlanGroup>,
    /// The group of the node about to start, when the decision is made before a node's task
    /// starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_group: Option<String>,
    /// The node whose task is about to start (its summary is in `nodes`). Absent before
    /// planning. A deny holds this node's task, Pending, until the policies allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_node: Option<String>,
    /// A summary of every node the operation selects.
    #[serde(default)]
    pub nodes: Vec<NodeSummary>,
    pub cluster: ClusterState,
    /// The controller's clock, RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub now: String,
}

/// Input of the capabilities decision point (`data.bosun.capabilities.deny`). Bosun first
/// checks requested ⊆ granted itself; policies then judge the grants and requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilitiesInput {
    pub plugin: PluginInfo,
    /// What the plugin's `describe()` asked for.
    pub requested: RequestedCapabilities,
    /// What the administrator granted.
    pub grants: Grants,
    /// The node the plugin is about to run on, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Which operation a decision is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperationRef {
    /// The Operation's name.
    pub name: String,
    pub kind: OperationKind,
    /// For upgrades: the Kubernetes version asked for, for example `v1.34.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// `Auto`, `Controlled` or `DryRun`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_mode: Option<String>,
    /// The Operation's labels and annotations, so policies can honour per-operation
    /// overrides that an administrator allows.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What kind of work an Operation does (the spec variant that is set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OperationKind {
    Upgrade,
    RenewCertificates,
    Reboot,
    Custom,
}

/// The NodeTask a step belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskRef {
    /// The node's name.
    pub node: String,
    /// The plan group, for example `first-control-plane`, `control-plane`, `workers`.
    pub group: String,
}

/// The step about to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRef {
    pub name: String,
    /// The plugin name the step gives. On a node whose OS family a backend claims, that
    /// backend runs instead (`plugin.name`; docs/plugins.md, "Backends for an OS family").
    pub plugin: String,
    pub action: String,
    /// The step's params as given in the NodeTask (a JSON object).
    #[serde(default)]
    pub params: serde_json::Value,
}

/// What Bosun knows about a plugin once it is verified.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginInfo {
    /// The name the plugin declares (and that its signature covers).
    pub name: String,
    /// The plugin's own semantic version.
    pub version: String,
    /// `sha256:<hex>` of the plugin's bytes.
    pub digest: String,
    /// Key id of the trust-root key whose signature verified, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

/// Facts about the node the step runs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeFacts {
    pub name: String,
    /// From the node's labels: `control-plane`, `worker`.
    pub roles: Vec<String>,
    /// The Node's Ready condition is True.
    pub ready: bool,
    pub os: OsRelease,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// For example `v1.33.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeadm_version: Option<String>,
    /// The Node's annotations (per-node holds, maintenance windows ...).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// kubeadm-managed certificates on the node and when they expire, as the agent read
    /// them (empty on workers).
    #[serde(default)]
    pub certificates: Vec<CertificateFact>,
    /// What the node's kernel enforces around the commands plugins run
    /// (`policies/command-confinement` refuses steps where part of it is missing).
    #[serde(default)]
    pub confinement: Confinement,
    /// The init system the agent drives this node's services through (`service` grants):
    /// `systemd`, `openrc`, or `simulated` on the lab's simulated nodes. Empty in inputs
    /// written before agents reported it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_manager: String,
}

/// The kernel boundary of granted commands on one node (docs/security.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Confinement {
    /// The kernel's Landlock ABI version; 0 without Landlock.
    #[serde(default)]
    pub landlock_abi: u32,
    /// Whether seccomp filters can be installed.
    #[serde(default)]
    pub seccomp: bool,
    /// What granted commands run without on this node, one sentence each; empty when the
    /// whole boundary is enforced.
    #[serde(default)]
    pub missing: Vec<String>,
}

/// The parts of /etc/os-release policies branch on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OsRelease {
    pub id: String,
    #[serde(default)]
    pub id_like: Vec<String>,
    #[serde(default)]
    pub version_id: String,
    #[serde(default)]
    pub pretty_name: String,
}

/// One certificate's expiry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateFact {
    /// kubeadm's name for it, for example `apiserver` or `admin.conf`.
    pub name: String,
    /// RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub not_after: String,
}

/// One preflight check's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreflightResult {
    pub name: String,
    pub status: CheckStatus,
    pub message: String,
    /// `agent` for built-in checks, otherwise the plugin's name.
    pub source: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

/// Cluster-wide facts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterState {
    /// The API server's version, for example `v1.33.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Cluster-wide annotations (Bosun reads them from the `kube-system` Namespace), for
    /// example `bosun.dev/change-freeze`.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Every control-plane node, including the one a step runs on.
    #[serde(default)]
    pub control_plane: Vec<ControlPlaneNode>,
}

/// A control-plane node as the controller sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneNode {
    pub name: String,
    pub ready: bool,
    /// A NodeTask of any Operation is running a step on this node right now.
    #[serde(default)]
    pub in_progress: bool,
}

/// A plan group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanGroup {
    pub name: String,
    pub nodes: Vec<String>,
}

/// A node as the operation decision point sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSummary {
    pub name: String,
    pub roles: Vec<String>,
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// The Node's annotations (per-node settings such as `bosun.dev/maintenance-windows`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The JSON Schemas of the three input documents, as checked in under
/// `policies/schema/<point>.schema.json`.
pub fn schemas() -> [(crate::DecisionPoint, serde_json::Value); 3] {
    let gen_schema = |s: schemars::Schema| serde_json::to_value(s).expect("a schema is JSON");
    [
        (
            crate::DecisionPoint::Operation,
            gen_schema(schemars::schema_for!(OperationInput)),
        ),
        (
            crate::DecisionPoint::Step,
            gen_schema(schemars::schema_for!(StepInput)),
        ),
        (
            crate::DecisionPoint::Capabilities,
            gen_schema(schemars::schema_for!(CapabilitiesInput)),
        ),
    ]
}

/// Checks that `input` is a valid document for `point` (shape and field names), with
/// the path of the first offending field in the error.
pub fn validate(point: crate::DecisionPoint, input: &serde_json::Value) -> Result<(), String> {
    fn check<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<(), String> {
        serde_path_to_error::deserialize::<_, T>(v)
            .map(|_| ())
            .map_err(|e| format!("at {}: {}", e.path(), e.inner()))
    }
    match point {
        crate::DecisionPoint::Operation => check::<OperationInput>(input),
        crate::DecisionPoint::Step => check::<StepInput>(input),
        crate::DecisionPoint::Capabilities => check::<CapabilitiesInput>(input),
    }
}
