//! The `Operation` resource: what a user wants done across the cluster's nodes.
//!
//! An Operation names exactly one kind of work (`upgrade`, `renewCertificates`, `reboot` or
//! `custom`)
//! and how to roll it out. The controller freezes a plan (ordered groups of node names) in
//! `status.plan` when it starts, and creates one `NodeTask` per planned node.
//!
//! The schema refuses invalid input at the API server: exactly one kind, version format,
//! `maxUnavailable` as an integer from 1 to 10000 or a percentage, a
//! `ttlSecondsAfterFinished` of at most 10 years, DNS-label step names, non-empty
//! groups and steps, and the plan-relevant fields are immutable after creation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// The most groups a custom Operation may have. Bounded so the API server can cost its
/// CEL rules, and because a plan longer than this is better split into Operations.
pub const MAX_GROUPS: usize = 20;
/// The most steps one group (and so one NodeTask) may have.
pub const MAX_STEPS: usize = 32;
/// The largest `ttlSecondsAfterFinished` the schema accepts: 10 years (365-day years).
/// Longer is "keep forever" in practice (leave the field out for that), and the bound keeps
/// completion time + TTL far inside what a timestamp can hold.
pub const MAX_TTL_SECONDS: i64 = 10 * 365 * 24 * 60 * 60;

/// What a user wants done across the cluster's nodes. Cluster-scoped.
// Each `printcolumn(...)` repeats keys such as `type_ = "string"`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bosun.dev",
    version = "v1alpha1",
    kind = "Operation",
    status = "OperationStatus",
    shortname = "op",
    category = "bosun",
    derive = "PartialEq",
    doc = "An Operation is one piece of lifecycle work (a Kubernetes upgrade, a certificate renewal or a custom sequence of plugin steps) that the Bosun controller plans into per-node NodeTasks and carries out group by group.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the Operation is in its life"
    ),
    printcolumn(
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress",
        description = "Finished nodes / planned nodes"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.executionMode",
        description = "Auto, Controlled or DryRun"
    ),
    printcolumn(
        name = "Paused",
        type_ = "boolean",
        json_path = ".spec.paused",
        priority = 1
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.upgrade.kubernetesVersion",
        priority = 1,
        description = "Target version of an upgrade"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        description = "What is happening, or what is blocking"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "[has(self.upgrade), has(self.renewCertificates), has(self.reboot), has(self.custom)].filter(x, x).size() == 1",
        "message": "an Operation does exactly one kind of work: set exactly one of spec.upgrade, spec.renewCertificates, spec.reboot or spec.custom",
    },
    {
        "rule": "has(self.upgrade) == has(oldSelf.upgrade) && has(self.renewCertificates) == has(oldSelf.renewCertificates) && has(self.reboot) == has(oldSelf.reboot) && has(self.custom) == has(oldSelf.custom)",
        "message": "the kind of work of an Operation cannot change after creation: create a new Operation instead",
    },
    {
        "rule": "has(self.nodeSelector) == has(oldSelf.nodeSelector)",
        "message": "spec.nodeSelector cannot be added or removed after creation (the plan is derived from it): create a new Operation instead",
    },
]))]
pub struct OperationSpec {
    /// Upgrade Kubernetes with kubeadm: the first control-plane node runs
    /// `kubeadm upgrade apply`, the other control-plane nodes and then the workers run
    /// `kubeadm upgrade node`, each drained while its kubelet is upgraded and restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.upgrade cannot change after creation (the plan is derived from it): create a new Operation instead",
    }]))]
    pub upgrade: Option<UpgradeSpec>,

    /// Renew the kubeadm-managed certificates on every control-plane node, one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.renewCertificates cannot change after creation (the plan is derived from it): create a new Operation instead",
    }]))]
    pub renew_certificates: Option<RenewCertificatesSpec>,

    /// Reboot nodes, one control-plane node at a time and then the workers
    /// (`rollout.maxUnavailable` at a time): each is cordoned and drained, asked to reboot
    /// by the `reboot` plugin, and its step finishes only when its agent comes back with a
    /// new boot; then the node must be Ready before it is uncordoned. A node not back within
    /// `stepTimeoutSeconds` of the reboot step's start blocks. Select the nodes with
    /// `nodeSelector` (absent: every node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.reboot cannot change after creation (the plan is derived from it): create a new Operation instead",
    }]))]
    pub reboot: Option<RebootSpec>,

    /// Run the user's own groups of steps, group after group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.custom cannot change after creation (the plan is derived from it): create a new Operation instead",
    }]))]
    pub custom: Option<CustomSpec>,

    /// Only nodes matching this selector take part (in addition to each custom group's
    /// own selector). Absent: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "node_selector_schema")]
    pub node_selector: Option<LabelSelector>,

    /// `Auto` runs every NodeTask as soon as the rollout allows; `Controlled` makes each
    /// NodeTask wait for `spec.approve: true`; `DryRun` runs preflight and policy only and
    /// describes what would change, without changing any host.
    #[serde(default)]
    pub execution_mode: ExecutionMode,

    /// While true, no new NodeTask or step starts; running steps finish. Can be set and
    /// cleared at any time.
    #[serde(default)]
    pub paused: bool,

    /// How many nodes may be worked on at once.
    #[serde(default)]
    pub rollout: Rollout,

    /// Checks the controller makes after each node, before the next one starts.
    #[serde(default)]
    pub health_gates: HealthGates,

    /// What happens when a step fails. Default: block and wait for a person.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// Cordon and drain settings for the steps that drain a node.
    #[serde(default)]
    pub drain: DrainSpec,

    /// A step still running after this many seconds fails (and the task blocks, or is
    /// retried by `failurePolicy`). Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub step_timeout_seconds: Option<u32>,

    /// Delete the Operation (and, through owner references, its NodeTasks) this many
    /// seconds after it finished: 0 to 315360000 (10 years). Absent: keep forever, as the
    /// audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_TTL_SECONDS))]
    pub ttl_seconds_after_finished: Option<i64>,
}

fn node_selector_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = schema::label_selector(generator);
    s.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "self == oldSelf",
            "message": "spec.nodeSelector cannot change after creation (the plan is derived from it): create a new Operation instead",
        }]),
    );
    s
}

/// A Kubernetes upgrade with kubeadm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// The target version, for example `v1.34.2`.
    #[schemars(regex(pattern = r"^v\d+\.\d+\.\d+$"), length(max = 32))]
    pub kubernetes_version: String,

    /// Which packages to upgrade to the target version through the node's package
    /// manager: `kubeadm` before the kubeadm step, `kubelet` and `kubectl` after it.
    /// Default: all three. An empty list leaves packages alone (for nodes whose binaries
    /// are managed some other way).
    #[serde(default = "default_packages")]
    #[schemars(length(max = 3))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub packages: Vec<KubePackage>,

    /// The etcd safety net on control-plane nodes: a health check of the etcd cluster
    /// before each control plane, and a verified snapshot on the first one before
    /// `kubeadm upgrade apply`. Both on by default; turn them off for a cluster whose etcd
    /// kubeadm does not run (external etcd), or whose snapshots are taken another way.
    #[serde(default)]
    pub etcd: EtcdSafety,
}

/// The etcd steps an upgrade puts on control-plane nodes (the `etcd` plugin; docs/operations.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSafety {
    /// Before each control-plane node: every etcd member healthy, one leader, no alarm,
    /// as many members as control-plane Nodes; otherwise that node blocks before anything
    /// on it changes. Default true.
    #[serde(default = "default_true")]
    pub health_check: bool,
    /// On the first control-plane node, before `kubeadm upgrade apply`: an etcd snapshot,
    /// verified with etcdutl, kept in `/var/lib/etcd-snapshots`; a failed snapshot blocks
    /// the node before kubeadm runs. Default true.
    #[serde(default = "default_true")]
    pub snapshot: bool,
    /// How many snapshots the node keeps (the newest; older ones the step took are
    /// removed). Default 3.
    #[serde(default = "default_keep_snapshots")]
    #[schemars(range(min = 1, max = 100))]
    pub keep_snapshots: u32,
}

impl Default for EtcdSafety {
    fn default() -> Self {
        EtcdSafety {
            health_check: true,
            snapshot: true,
            keep_snapshots: default_keep_snapshots(),
        }
    }
}

fn default_keep_snapshots() -> u32 {
    3
}

fn default_packages() -> Vec<KubePackage> {
    vec![
        KubePackage::Kubeadm,
        KubePackage::Kubelet,
        KubePackage::Kubectl,
    ]
}

/// A Kubernetes package an upgrade can move to the target version.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KubePackage {
    Kubeadm,
    Kubelet,
    Kubectl,
}

impl KubePackage {
    /// The package name as the package managers know it.
    pub fn as_str(self) -> &'static str {
        match self {
            KubePackage::Kubeadm => "kubeadm",
            KubePackage::Kubelet => "kubelet",
            KubePackage::Kubectl => "kubectl",
        }
    }
}

/// Certificate renewal with kubeadm on the control-plane nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RenewCertificatesSpec {
    /// Which certificates to renew, by kubeadm's names (`kubeadm certs renew NAME`), or
    /// `all`. Default: `all`.
    #[serde(default = "default_certificates")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) > 0 && (!('all' in self) || size(self) == 1)",
        "message": "renewCertificates.certificates must name at least one certificate, and `all` cannot be combined with individual names",
    }]))]
    pub certificates: Vec<CertificateName>,

    /// Renew only certificates that expire within this duration, written as hours,
    /// minutes and seconds (`720h`, `90h30m`). Absent: renew unconditionally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"),
        length(min = 2, max = 20)
    )]
    pub renew_before: Option<String>,
}

fn default_certificates() -> Vec<CertificateName> {
    vec![CertificateName::All]
}

/// A certificate (or kubeconfig) kubeadm can renew.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum CertificateName {
    #[serde(rename = "all")]
    All,
    #[serde(rename = "apiserver")]
    Apiserver,
    #[serde(rename = "apiserver-kubelet-client")]
    ApiserverKubeletClient,
    #[serde(rename = "apiserver-etcd-client")]
    ApiserverEtcdClient,
    #[serde(rename = "front-proxy-client")]
    FrontProxyClient,
    #[serde(rename = "etcd-server")]
    EtcdServer,
    #[serde(rename = "etcd-peer")]
    EtcdPeer,
    #[serde(rename = "etcd-healthcheck-client")]
    EtcdHealthcheckClient,
    #[serde(rename = "admin.conf")]
    AdminConf,
    #[serde(rename = "super-admin.conf")]
    SuperAdminConf,
    #[serde(rename = "controller-manager.conf")]
    ControllerManagerConf,
    #[serde(rename = "scheduler.conf")]
    SchedulerConf,
}

/// A reboot of the selected nodes: which nodes is `spec.nodeSelector` (and `nodes`), how
/// many at once `spec.rollout`, how long a node may take to come back
/// `spec.stepTimeoutSeconds` (default 1800), the drain `spec.drain`. The gates
/// (`blockingPodSelector`, `alerts`) are checked before each node's task starts, and hold
/// it, not block it, while they say no (docs/reboots.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootSpec {
    /// Only these nodes, by name (and only those `spec.nodeSelector` admits too). Empty:
    /// every selected node. A ClusterLifecycle's generated reboot names its one node here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(max = 253)))]
    pub nodes: Vec<String>,

    /// Never start a node's reboot while a pod matching this selector runs on it (not yet
    /// Succeeded or Failed), in any namespace: the task waits, and says which pod holds it,
    /// until no such pod is left (kured's `--blocking-pod-selector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::label_selector")]
    pub blocking_pod_selector: Option<LabelSelector>,

    /// Do not start a node's reboot while alerts fire in Prometheus (kured's
    /// `--prometheus-url`, `--alert-filter-regexp`, `--alert-firing-only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<AlertGate>,
}

/// The alert gate of a reboot: the controller asks Prometheus for its alerts
/// (`GET <prometheusUrl>/api/v1/alerts`) before each node's reboot starts, and holds the
/// node while one counts. Prometheus unreachable or answering something else holds too
/// (the gate fails closed), and says why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AlertGate {
    /// Where Prometheus (or anything serving its `/api/v1/alerts`) answers, for example
    /// `http://prometheus-operated.monitoring.svc:9090`. https is verified against the
    /// controller's trust roots; plain http only to a `HOST:PORT` the controller's
    /// `--prometheus-plain-http` lists.
    #[schemars(length(max = 2048))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.startsWith('https://') || self.startsWith('http://')",
        "message": "spec.reboot.alerts.prometheusUrl must start with http:// or https://, for example http://prometheus-operated.monitoring.svc:9090",
    }]))]
    pub prometheus_url: String,

    /// Alerts whose name (`alertname` label) matches this regular expression (the whole
    /// name: it is anchored) do not hold a reboot, for example `Watchdog|InfoInhibitor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub ignore_alerts: Option<String>,

    /// Count only firing alerts. Default false: a pending alert (its condition true, its
    /// `for` not yet elapsed) holds a reboot too, as with kured.
    #[serde(default)]
    pub firing_only: bool,
}

/// The user's own sequence of groups.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomSpec {
    /// Groups run in order: every node of a group finishes before the next group starts.
    /// A node that matches several groups belongs to the first one only.
    #[schemars(length(max = 20))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) > 0",
        "message": "spec.custom.groups is empty: add at least one group with a name, an optional nodeSelector and its steps",
    }]))]
    pub groups: Vec<CustomGroup>,
}

/// One group of a custom Operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomGroup {
    /// The group's name, a DNS label (`workers`, `etcd-nodes`).
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 63)
    )]
    pub name: String,

    /// Nodes of this group. Absent: every node (that the Operation's own selector admits
    /// and no earlier group claimed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::label_selector")]
    pub node_selector: Option<LabelSelector>,

    /// Steps each node of the group runs, in order.
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) > 0",
        "message": "a custom group has no steps: add at least one step (name, runsOn, plugin, action)",
    }]))]
    pub steps: Vec<Step>,
}

/// One step a node runs: a plugin action on the node, or an API action in the controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.runsOn == 'agent' ? has(self.plugin) && size(self.plugin) > 0 : !has(self.plugin)",
        "message": "a step with runsOn: agent needs `plugin` (the name of the Plugin resource that performs it); a step with runsOn: controller must not name a plugin",
    },
    {
        "rule": "self.runsOn != 'controller' || self.action in ['cordon', 'drain', 'uncordon', 'waitNodeReady', 'waitApiServer']",
        "message": "a controller step's action must be one of cordon, drain, uncordon, waitNodeReady, waitApiServer; host work runs with runsOn: agent and a plugin",
    },
    {
        "rule": "!has(self.awaitNewBoot) || !self.awaitNewBoot || self.runsOn == 'agent'",
        "message": "awaitNewBoot is for a step that reboots the node, which runs on the agent (runsOn: agent)",
    },
]))]
pub struct Step {
    /// The step's name, a DNS label unique within its group (`drain`, `renew-certs`).
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 63)
    )]
    pub name: String,

    /// `agent` (a plugin on the node) or `controller` (an API action such as a drain).
    #[serde(default)]
    pub runs_on: RunsOn,

    /// The name of the Plugin resource that performs an agent step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
        length(max = 253)
    )]
    pub plugin: Option<String>,

    /// The plugin action (`renew`, `apply`) or the controller action (`drain`).
    #[schemars(length(min = 1, max = 63))]
    pub action: String,

    /// Parameters for the action, a JSON object the plugin validates against its own
    /// schema. Controller actions take none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::free_form_object")]
    pub params: Option<serde_json::Value>,

    /// The step asks the node to reboot. It finishes only when the node's agent comes back
    /// with a boot identity other than the one recorded when the step started; the agent
    /// that comes back does not run it again. A node not back within `stepTimeoutSeconds`
    /// of the step's start blocks the task. Agent steps only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub await_new_boot: bool,
}

/// Where a step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunsOn {
    /// On the node, as a plugin run by the agent.
    #[default]
    Agent,
    /// In the controller, as API calls (cordon, drain, uncordon, waits).
    Controller,
}

/// How NodeTasks are allowed to proceed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ExecutionMode {
    /// Start NodeTasks as soon as the rollout allows.
    #[default]
    Auto,
    /// Each NodeTask waits for a person to set `spec.approve: true`.
    Controlled,
    /// Agents run preflight and policy only and describe what they would change.
    DryRun,
}

/// Rollout limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Worker nodes worked on at once: an integer from 1 to 10000, or a percentage of the
    /// group from 1% to 100%.
    #[serde(default = "default_max_unavailable")]
    #[schemars(schema_with = "schema::max_unavailable")]
    pub max_unavailable: IntOrString,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            max_unavailable: default_max_unavailable(),
        }
    }
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

/// Checks between nodes. Each gate must pass before the next node of the rollout starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthGates {
    /// Wait until a finished node reports Ready. Default true.
    #[serde(default = "default_true")]
    pub node_ready: bool,
    /// Wait until the API server answers `/readyz`. Default true.
    #[serde(default = "default_true")]
    pub api_server: bool,
    /// On a control-plane node, wait until its control-plane static Pods (kube-system,
    /// `tier=control-plane`, on that node) are Ready, and those a `restart-control-plane`
    /// step restarted run a container started after that step began. Nothing to wait for
    /// on a node without such Pods. Default true.
    #[serde(default = "default_true")]
    pub control_plane_pods: bool,
    /// Wait this many more seconds after the gates pass. Default 0.
    #[serde(default)]
    #[schemars(range(max = 3600))]
    pub settle_seconds: u32,
    /// Give up waiting for a gate after this many seconds and block. Default 600.
    #[serde(default = "default_gate_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: u32,
}

impl Default for HealthGates {
    fn default() -> Self {
        HealthGates {
            node_ready: true,
            api_server: true,
            control_plane_pods: true,
            settle_seconds: 0,
            timeout_seconds: default_gate_timeout(),
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_gate_timeout() -> u32 {
    600
}

/// What happens when a step fails.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.mode == 'Retry' || (!has(self.retryLimit) && !has(self.backoffSeconds))",
    "message": "failurePolicy.retryLimit and backoffSeconds only apply with mode: Retry; set mode: Retry or remove them",
}]))]
pub struct FailurePolicy {
    /// `Block` (default): the task and the Operation stop until a person sets
    /// `recovery` on the NodeTask. `Retry`: retry a failed retryable step automatically.
    #[serde(default)]
    pub mode: FailureMode,
    /// Automatic retries per step before blocking. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub retry_limit: Option<u32>,
    /// Seconds before the first retry; doubled for each further retry. Default 30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub backoff_seconds: Option<u32>,
}

/// The failure policy's mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FailureMode {
    /// Stop and wait for a person.
    #[default]
    Block,
    /// Retry automatically within `retryLimit`, then stop.
    Retry,
}

/// Cordon and drain settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Give up draining after this many seconds (pods whose PodDisruptionBudget does not
    /// allow eviction keep it from finishing) and block with the pods still there.
    /// Default 600.
    #[serde(default = "default_drain_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: u32,
    /// Also evict pods that use emptyDir volumes (their data is lost). Default false.
    #[serde(default)]
    pub delete_empty_dir_data: bool,
    /// Also evict pods that no controller manages (bare pods: nothing recreates them
    /// elsewhere). Default false: such a pod stops the drain and blocks the task.
    #[serde(default)]
    pub evict_unmanaged_pods: bool,
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            timeout_seconds: default_drain_timeout(),
            delete_empty_dir_data: false,
            evict_unmanaged_pods: false,
        }
    }
}

fn default_drain_timeout() -> u32 {
    600
}

/// Observed state of an Operation, written by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// Where the Operation is in its life.
    #[serde(default)]
    pub phase: OperationPhase,

    /// Standard conditions: `Planned`, `Progressing`, `Blocked`, `Complete`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The plan, frozen when the Operation started. Nodes added to the cluster later are
    /// not pulled in; a planned node that disappears makes its NodeTask Invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,

    /// Task counts by phase.
    #[serde(default)]
    pub counts: TaskCounts,

    /// `finished/planned`, for `kubectl get operations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// When the controller started the Operation (froze the plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the Operation reached Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// One line for people: what is happening, or what is blocking and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Where an Operation is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OperationPhase {
    /// Accepted, not planned yet.
    #[default]
    Pending,
    /// Planned; NodeTasks are running or waiting for their turn.
    Running,
    /// `spec.paused` is true: nothing new starts.
    Paused,
    /// Controlled mode: the next NodeTask waits for `approve`.
    AwaitingApproval,
    /// A NodeTask failed or was refused; a person must set its `recovery`.
    Blocked,
    /// Every planned task finished (succeeded or was skipped).
    Succeeded,
    /// The Operation cannot go on (for example it could not be planned).
    Failed,
}

impl OperationPhase {
    /// True for phases the Operation never leaves.
    pub fn is_finished(self) -> bool {
        matches!(self, OperationPhase::Succeeded | OperationPhase::Failed)
    }

    /// The phase's name as it is written in status (and used as a condition reason).
    pub fn as_str(self) -> &'static str {
        match self {
            OperationPhase::Pending => "Pending",
            OperationPhase::Running => "Running",
            OperationPhase::Paused => "Paused",
            OperationPhase::AwaitingApproval => "AwaitingApproval",
            OperationPhase::Blocked => "Blocked",
            OperationPhase::Succeeded => "Succeeded",
            OperationPhase::Failed => "Failed",
        }
    }

    /// The phase in lower-case words, for a sentence ("upgrade Operation x awaiting approval").
    pub fn in_words(self) -> &'static str {
        match self {
            OperationPhase::Pending => "pending",
            OperationPhase::Running => "running",
            OperationPhase::Paused => "paused",
            OperationPhase::AwaitingApproval => "awaiting approval",
            OperationPhase::Blocked => "blocked",
            OperationPhase::Succeeded => "succeeded",
            OperationPhase::Failed => "failed",
        }
    }
}

/// The frozen plan: groups in the order they run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Groups in order; every node of a group finishes before the next group starts.
    pub groups: Vec<PlannedGroup>,
}

impl Plan {
    /// Every planned node name, in plan order.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.groups
            .iter()
            .flat_map(|g| g.nodes.iter().map(String::as_str))
    }
}

/// One planned group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedGroup {
    /// The group's name (`control-plane-first`, `control-plane`, `workers`, or a custom
    /// group's name).
    pub name: String,
    /// Node names in the order they are taken.
    pub nodes: Vec<String>,
    /// How many of the group's nodes may be worked on at once (1 for control-plane nodes),
    /// resolved from `rollout.maxUnavailable` when the plan was frozen.
    pub max_parallel: u32,
    /// The group's control-plane nodes (a subset of `nodes`), recorded when the plan was
    /// frozen: at most one of them, across the whole Operation, is worked on at a time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub control_plane_nodes: Vec<String>,
}

/// NodeTask counts by phase.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCounts {
    pub planned: u32,
    pub pending: u32,
    pub awaiting_approval: u32,
    pub running: u32,
    pub blocked: u32,
    pub succeeded: u32,
    pub skipped: u32,
    pub invalid: u32,
}

/// Convenience for building selectors in code and tests.
pub fn match_labels<const N: usize>(pairs: [(&str, &str); N]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        match_expressions: None,
    }
}

#[cfg(test)]
mod phase_name_tests {
    use super::*;

    #[test]
    fn operation_phases_are_named_as_they_serialize() {
        use OperationPhase as P;
        for p in [
            P::Pending,
            P::Running,
            P::Paused,
            P::AwaitingApproval,
            P::Blocked,
            P::Succeeded,
            P::Failed,
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
    }
}
