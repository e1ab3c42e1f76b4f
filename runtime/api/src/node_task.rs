//! The `NodeTask` resource: the work one Operation does on one node.
//!
//! The controller creates one NodeTask per planned node (owner: the Operation; labels in
//! [`crate::labels`] name the operation, node and group). Its spec is the frozen list of
//! steps; a person may set only `approve` (Controlled mode) and `recovery` (after a
//! failure). The agent on the node and the controller report progress in the status.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::operation::Step;

/// Lines of a step's log kept in status. The agent keeps the last lines; older lines are
/// in the agent's own log.
pub const LOG_TAIL_LINES: usize = 50;

/// The work one Operation does on one node. Cluster-scoped.
// Each `printcolumn(...)` repeats keys such as `type_ = "string"`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bosun.dev",
    version = "v1alpha1",
    kind = "NodeTask",
    status = "NodeTaskStatus",
    shortname = "nt",
    category = "bosun",
    derive = "PartialEq",
    doc = "A NodeTask is the part of one Operation that runs on one node: an ordered list of steps, run by the node's agent (plugins) or by the controller (cordon, drain, uncordon, waits).",
    selectable = ".spec.nodeName",
    selectable = ".spec.operation",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Operation", type_ = "string", json_path = ".spec.operation"),
    printcolumn(
        name = "Group",
        type_ = "string",
        json_path = ".spec.group",
        priority = 1
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Step",
        type_ = "string",
        json_path = ".status.currentStep",
        description = "The step running or stopped at"
    ),
    printcolumn(
        name = "Attempts",
        type_ = "integer",
        json_path = ".status.attempts",
        priority = 1
    ),
    printcolumn(
        name = "Approved",
        type_ = "boolean",
        json_path = ".spec.approve",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.operation == oldSelf.operation && self.nodeName == oldSelf.nodeName && self.group == oldSelf.group && self.steps == oldSelf.steps && self.dryRun == oldSelf.dryRun",
    "message": "a NodeTask's operation, nodeName, group, steps and dryRun are set by the controller from the frozen plan and cannot change; only approve and recovery are yours to set",
}]))]
pub struct NodeTaskSpec {
    /// The Operation this task belongs to.
    #[schemars(length(min = 1, max = 253))]
    pub operation: String,

    /// The node the task runs on.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,

    /// The planned group the node belongs to.
    #[schemars(length(min = 1, max = 63))]
    pub group: String,

    /// The steps, in order.
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) > 0",
        "message": "a NodeTask needs at least one step",
    }]))]
    pub steps: Vec<Step>,

    /// Run preflight and policy only; plugins describe what they would change.
    #[serde(default)]
    pub dry_run: bool,

    /// A step running longer than this fails. Copied from the Operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub step_timeout_seconds: Option<u32>,

    /// Controlled mode: set to true to let this task start.
    #[serde(default)]
    pub approve: bool,

    /// After the task blocked: `Retry` runs the failed step again, `Skip` gives up on this
    /// node and lets the Operation move on. The controller clears it once it has acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

impl NodeTask {
    /// Whether the task is Running with one of its agent steps Running: the agent is at work
    /// on it, and the controller waits for the agent's result.
    pub fn agent_step_running(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        status.phase == NodeTaskPhase::Running
            && self.spec.steps.iter().any(|step| {
                step.runs_on == crate::operation::RunsOn::Agent
                    && status
                        .steps
                        .iter()
                        .any(|s| s.name == step.name && s.phase == StepPhase::Running)
            })
    }

    /// Whether the task is Running with no agent step Running: the controller is at work on
    /// it (a controller step, the health gates), and the agent waits for the controller.
    pub fn waits_on_controller(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.phase == NodeTaskPhase::Running)
            && !self.agent_step_running()
    }
}

/// What a person decides after a task blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Recovery {
    /// Run the failed step again (after fixing the cause).
    Retry,
    /// Leave this node as it is and let the Operation move on.
    Skip,
}

/// Observed state of a NodeTask, written by the agent (agent steps) and the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTaskStatus {
    /// Where the task is in its life.
    #[serde(default)]
    pub phase: NodeTaskPhase,

    /// The step running now, or the one the task stopped at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,

    /// One entry per step that has started, in spec order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub steps: Vec<StepStatus>,

    /// Times the task was started or retried.
    #[serde(default)]
    pub attempts: u32,

    /// Why the task is Blocked or Invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<BlockReason>,

    /// One line for people: what is happening, or what is blocking and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Standard conditions: `Approved`, `Blocked`, `Complete`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The `metadata.generation` whose `spec.recovery` the controller has acted on,
    /// written by the same write that acts; `spec.recovery` is cleared only after it. A
    /// recovery still present at this generation (its clear failed) is cleared, never
    /// acted on twice; setting `spec.recovery` again bumps the generation. Only meaningful
    /// while `spec.recovery` is set: later controller writes may drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_generation: Option<i64>,

    /// What the node's agent found on the node: when it started working on this task
    /// (`before`) and once the task finished (`after`), so an upgrade shows both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_facts: Option<NodeFactsReport>,
}

/// Most certificates listed in one [`NodeFacts`]; the rest are counted in
/// [`NodeFacts::certificates_omitted`].
pub const MAX_CERTIFICATES: usize = 32;

/// The node's facts at the start and at the end of a task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFactsReport {
    /// Read when the agent started working on the task (its first look at it Running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<NodeFacts>,
    /// Read once the task finished (Succeeded or Skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<NodeFacts>,
}

/// What an agent read on its node at one moment. Absent values could not be read (the
/// binary or file is not on the node); they are never guessed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    /// When the agent read these facts (RFC 3339).
    pub collected_at: Time,
    /// The kubelet's version as the Node reports it (`status.nodeInfo.kubeletVersion`),
    /// for example `v1.34.4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubelet_version: Option<String>,
    /// The version of the node's own kubeadm, read without running it: the installed
    /// `kubeadm` package's (dpkg), else the version string built into `/usr/bin/kubeadm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubeadm_version: Option<String>,
    /// The version of the node's own kubectl, read like kubeadm's: the installed `kubectl`
    /// package's (dpkg), else the version string built into `/usr/bin/kubectl` (what
    /// `kubectl version --client` prints). Absent when kubectl is not installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubectl_version: Option<String>,
    /// The Kubernetes packages installed on the node (of kubeadm, kubelet, kubectl,
    /// cri-tools and kubernetes-cni) with their versions as the package database records
    /// them, by name. Read from the dpkg database (`/var/lib/dpkg/status`); empty where
    /// there is none (rpm nodes: their database is not read) or none of them is installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub packages: Vec<PackageVersion>,
    /// `PRETTY_NAME` from the node's os-release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub os: Option<String>,
    /// Architecture in Go spelling (`amd64`, `arm64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub arch: Option<String>,
    /// The running kernel's release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub kernel: Option<String>,
    /// Every certificate under `/etc/kubernetes/pki` and `pki/etcd` (CAs included),
    /// soonest expiry first, at most 32. Empty on nodes without a kubeadm PKI (workers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub certificates: Vec<CertificateExpiry>,
    /// Certificates found beyond the 32 listed (the latest-expiring are left out).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub certificates_omitted: u32,
    /// How this node's kernel confines the commands plugins run (docs/security.md, "The
    /// kernel boundary of a granted command"). Absent in reports of agents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_confinement: Option<CommandConfinement>,
    /// Whether the node needs a reboot, and why (docs/reboots.md). Absent in reports of
    /// agents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<RebootNeed>,
    /// This boot of the node: the kernel's `boot_id` and the start time of the node's PID 1
    /// (`<boot_id>/<clock ticks>`). It changes on a reboot, and on a node container's restart
    /// (where `boot_id` is the host's). Read from `/proc`, which no plugin can write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,
}

/// Whether a node needs a reboot, read as data with no command run: on the Debian family
/// `/run/reboot-required` (and the packages in `reboot-required.pkgs`); where kernel
/// packages install `/usr/lib/modules/<release>/vmlinuz` (the RHEL family, Fedora, SUSE), an
/// installed kernel newer than the running one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootNeed {
    /// True when a reboot is needed.
    pub required: bool,
    /// Why, one sentence per sign found, for example `/run/reboot-required is present
    /// (asked for by linux-image-6.1.0-28-amd64, libc6)`; empty when not required.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), inner(length(max = 2048)))]
    pub reasons: Vec<String>,
    /// The packages that asked for the reboot (`reboot-required.pkgs`), or `kernel
    /// <release>` for a newer installed kernel; at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 160)))]
    pub packages: Vec<String>,
}

/// What the kernel enforces around granted commands on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandConfinement {
    /// The kernel's Landlock ABI version; 0 when Landlock is missing or disabled.
    pub landlock_abi: u32,
    /// Whether seccomp filters can be installed.
    pub seccomp: bool,
    /// What granted commands run without on this node, one sentence each; empty when the
    /// whole boundary is enforced. A Policy can refuse steps on such nodes
    /// (`policies/command-confinement`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub missing: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Most packages listed in one [`NodeFacts`].
pub const MAX_PACKAGES: usize = 8;

/// The packages [`NodeFacts::packages`] lists, in this order.
pub const KUBERNETES_PACKAGES: [&str; 5] = [
    "kubeadm",
    "kubelet",
    "kubectl",
    "cri-tools",
    "kubernetes-cni",
];

/// One installed package and its version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageVersion {
    /// The package's name (`kubeadm`, `kubelet`, `kubectl`, `cri-tools`, `kubernetes-cni`).
    #[schemars(length(min = 1, max = 64))]
    pub name: String,
    /// Its version as the package database records it, for example `1.34.4-1.1`.
    #[schemars(length(min = 1, max = 128))]
    pub version: String,
}

impl PackageVersion {
    /// The upstream version of the package as a Kubernetes version (`1.34.4-1.1` →
    /// `v1.34.4`), see [`upstream_version`].
    pub fn kubernetes_version(&self) -> Option<String> {
        upstream_version(&self.version)
    }
}

/// A package version (dpkg `[epoch:]upstream[-revision]`, rpm `[epoch:]version-release`)
/// as a Kubernetes version: the epoch and the revision or release dropped, a `v` put in
/// front, `1.34.4-1.1` → `v1.34.4`. `None` unless the upstream part is MAJOR.MINOR.PATCH
/// with an optional `-pre` or `+build` suffix of `[0-9A-Za-z.+-]` (a `~rc.1` is not a
/// Kubernetes version).
pub fn upstream_version(package_version: &str) -> Option<String> {
    let version = package_version
        .split_once(':')
        .map_or(package_version, |(_, v)| v);
    let upstream = version.rsplit_once('-').map_or(version, |(u, _)| u);
    let (core, suffix) = upstream
        .find(['-', '+'])
        .map_or((upstream, ""), |i| upstream.split_at(i));
    let parts: Vec<&str> = core.split('.').collect();
    let ok = upstream.len() < 64
        && parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
        && suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-'));
    ok.then(|| format!("v{upstream}"))
}

/// One certificate and when it expires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateExpiry {
    /// kubeadm's name: the file name without `.crt`, `etcd-` in front for `pki/etcd`
    /// (`apiserver`, `etcd-server`, `ca`), or a kubeconfig's file name (`admin.conf`). A
    /// name, never a path: the API server refuses `/` and a leading `.`.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    )]
    pub name: String,
    /// The certificate's notAfter.
    pub not_after: Time,
}

impl CertificateExpiry {
    /// Whether this entry can be a certificate an agent reported: a name as the schema
    /// allows it (reports written before the schema said so are read too) and a `notAfter`
    /// no earlier than 1950, the first year an X.509 UTCTime can carry (kubeadm's
    /// certificates always use it). Readers skip the rest instead of showing, for example,
    /// `../../etc/shadow` expiring in year 1 as the cluster's earliest certificate.
    pub fn is_plausible(&self) -> bool {
        let name_ok = self
            .name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
            && self.name.len() <= 253
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        name_ok && self.not_after.0.as_second() >= EARLIEST_NOT_AFTER
    }
}

/// 1950-01-01T00:00:00Z in Unix seconds (see [`CertificateExpiry::is_plausible`]).
const EARLIEST_NOT_AFTER: i64 = -631_152_000;

/// Where a NodeTask is in its life. Transitions are in `bosun_planner::state`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NodeTaskPhase {
    /// Waiting for its turn in the rollout.
    #[default]
    Pending,
    /// Its turn came in Controlled mode; waits for `spec.approve: true`.
    AwaitingApproval,
    /// A step is running or the next one is about to.
    Running,
    /// A step failed, was refused, or was interrupted; waits for `spec.recovery`.
    /// Nothing else in the Operation starts while a task is Blocked.
    Blocked,
    /// Every step succeeded.
    Succeeded,
    /// A person chose `recovery: Skip`; the node was left as it was.
    Skipped,
    /// The node disappeared from the cluster after the plan was frozen.
    Invalid,
}

impl NodeTaskPhase {
    /// True for phases the task never leaves.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            NodeTaskPhase::Succeeded | NodeTaskPhase::Skipped | NodeTaskPhase::Invalid
        )
    }

    /// True while the task holds one of the rollout's slots: its turn came and it has not
    /// finished. A Blocked task keeps its slot (its node may be cordoned or drained), and so
    /// does a task awaiting approval (otherwise every task would ask for approval at once).
    pub fn occupies_slot(self) -> bool {
        matches!(
            self,
            NodeTaskPhase::AwaitingApproval | NodeTaskPhase::Running | NodeTaskPhase::Blocked
        )
    }
}

/// Why a task stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BlockReason {
    /// The plugin or controller action returned an error.
    StepFailed,
    /// A step ran longer than `stepTimeoutSeconds`.
    StepTimedOut,
    /// A preflight check failed.
    PreflightFailed,
    /// A Deny policy refused the step.
    PolicyDenied,
    /// The agent restarted during a step that is not idempotent.
    Interrupted,
    /// The drain did not finish within its timeout (often a PodDisruptionBudget).
    DrainTimedOut,
    /// A health gate did not pass within its timeout.
    HealthGateFailed,
    /// The plugin could not be found, fetched or verified.
    PluginUnavailable,
    /// The node vanished after the plan was frozen (phase Invalid).
    NodeGone,
    /// Someone else uncordoned the node while the task relied on its cordon (between its
    /// `cordon` step and its `uncordon`): the next step would have run on a schedulable
    /// node, so it did not start.
    CordonCleared,
}

impl BlockReason {
    /// The reason's name as it is written in status (and used as a condition reason).
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::StepFailed => "StepFailed",
            BlockReason::StepTimedOut => "StepTimedOut",
            BlockReason::PreflightFailed => "PreflightFailed",
            BlockReason::PolicyDenied => "PolicyDenied",
            BlockReason::Interrupted => "Interrupted",
            BlockReason::DrainTimedOut => "DrainTimedOut",
            BlockReason::HealthGateFailed => "HealthGateFailed",
            BlockReason::PluginUnavailable => "PluginUnavailable",
            BlockReason::NodeGone => "NodeGone",
            BlockReason::CordonCleared => "CordonCleared",
        }
    }
}

/// What happened to one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    /// The step's name, as in the spec.
    pub name: String,
    /// The step's state.
    #[serde(default)]
    pub phase: StepPhase,
    /// Runs of this step (more than 1 after retries).
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// True when the step changed the node; false for a no-op or a dry run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    /// The plugin's or controller's one-line result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Named results the plugin returned.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
    /// The last lines the step logged (at most 50).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub log_tail: Vec<String>,
    /// Preflight checks, in the order the plugin reported them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preflight: Vec<PreflightCheck>,
    /// What the policies said about this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyDecision>,
    /// Why the step failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    /// Of the step's wall time, the milliseconds its plugin waited for granted host commands
    /// and service actions (kubeadm, the package manager, systemd): the node's own work. The
    /// rest is Bosun's (verifying, compiling and running the plugin, its gates). Agent steps
    /// only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_milliseconds: Option<u64>,
    /// For a step that reboots the node (`awaitNewBoot`): the node's boot identity when the
    /// attempt started (see NodeFacts `bootId`). The step is done when the agent reports
    /// another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub boot_id: Option<String>,
    /// For a step that reboots the node: when the reboot was asked for (the plugin
    /// returned). The step stays Running until the node is back with a new boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_requested_at: Option<Time>,
}

/// A step's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StepPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
}

/// One preflight check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightCheck {
    pub name: String,
    pub status: CheckStatus,
    #[serde(default)]
    pub message: String,
}

/// A preflight check's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

/// The policies' verdict on a step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecision {
    /// False when a Deny policy refused the step.
    pub allowed: bool,
    /// Messages of every policy that objected, with its enforcement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<PolicyMessage>,
    /// `sha256:<hex>` of the set of policies that made the decision: the same digest and
    /// the same input give the same decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_set_digest: Option<String>,
    /// The input document the policies judged, recorded when any policy objected, so the
    /// decision can be replayed offline:
    /// `kubectl get nodetask T -o jsonpath='{.status.steps[?(@.name=="S")].policy.input}' > input.json`
    /// then `kubectl bosun policy eval --input input.json`. It is the capabilities
    /// decision's input when that one denied (before the plugin's preflight), else the
    /// step decision's (or the capabilities one's when the step gate was not reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::free_form_object")]
    pub input: Option<serde_json::Value>,
}

/// One policy's objection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyMessage {
    /// The Policy resource's name.
    pub policy: String,
    pub enforcement: crate::policy::Enforcement,
    pub message: String,
}

/// Why a step failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepError {
    /// A stable, machine-readable code (`kubeadm-missing`, `drain-timeout`).
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
    /// True when the same step may succeed if tried again unchanged.
    #[serde(default)]
    pub retryable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task in `phase` whose agent step `run` and controller step `drain` are in the
    /// phases given.
    fn task_with(phase: &str, run: &str, drain: &str) -> NodeTask {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
            "metadata": { "name": "t" },
            "spec": { "operation": "op", "nodeName": "n", "group": "g", "steps": [
                { "name": "drain", "runsOn": "controller", "action": "drain" },
                { "name": "run", "plugin": "p", "action": "a" } ] },
            "status": { "phase": phase, "steps": [
                { "name": "drain", "phase": drain },
                { "name": "run", "phase": run } ] }
        }))
        .expect("a NodeTask")
    }

    #[test]
    fn only_names_and_dates_an_agent_could_report_are_plausible() {
        let cert = |name: &str, at: &str| CertificateExpiry {
            name: name.into(),
            not_after: Time(at.parse().expect("a timestamp")),
        };
        for ok in [
            cert("apiserver", "2027-12-03T18:13:13Z"),
            cert("admin.conf", "2027-12-03T18:13:13Z"),
            cert("etcd-healthcheck-client", "1950-01-01T00:00:00Z"),
            cert("front_proxy-client", "2049-12-31T23:59:59Z"),
        ] {
            assert!(ok.is_plausible(), "{ok:?}");
        }
        for bad in [
            cert("../../etc/shadow", "2027-12-03T18:13:13Z"),
            cert(".hidden", "2027-12-03T18:13:13Z"),
            cert("pki/apiserver", "2027-12-03T18:13:13Z"),
            cert("", "2027-12-03T18:13:13Z"),
            cert("apiserver", "0001-01-01T00:00:00Z"),
            cert("apiserver", "1949-12-31T23:59:59Z"),
        ] {
            assert!(!bad.is_plausible(), "{bad:?}");
        }
    }

    #[test]
    fn who_a_running_task_waits_on_follows_the_kind_of_its_running_step() {
        let cases = [
            // (task, agent step, controller step) → (agent at work, controller at work)
            (("Running", "Running", "Succeeded"), (true, false)),
            (("Running", "Pending", "Running"), (false, true)),
            (("Running", "Succeeded", "Succeeded"), (false, true)), // health gates
            (("Running", "Pending", "Pending"), (false, true)),
            (("Blocked", "Running", "Succeeded"), (false, false)),
            (("Pending", "Pending", "Pending"), (false, false)),
            (("Succeeded", "Succeeded", "Succeeded"), (false, false)),
        ];
        for ((phase, run, drain), expected) in cases {
            let t = task_with(phase, run, drain);
            assert_eq!(
                (t.agent_step_running(), t.waits_on_controller()),
                expected,
                "task {phase}, agent step {run}, controller step {drain}"
            );
        }
        let mut no_status = task_with("Running", "Running", "Running");
        no_status.status = None;
        assert!(!no_status.agent_step_running() && !no_status.waits_on_controller());
    }

    #[test]
    fn block_reasons_are_named_as_they_serialize() {
        use BlockReason as B;
        for r in [
            B::StepFailed,
            B::StepTimedOut,
            B::PreflightFailed,
            B::PolicyDenied,
            B::Interrupted,
            B::DrainTimedOut,
            B::HealthGateFailed,
            B::PluginUnavailable,
            B::NodeGone,
            B::CordonCleared,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }

    #[test]
    fn a_package_version_reads_as_its_upstream_kubernetes_version() {
        for (package, want) in [
            ("1.34.4-1.1", Some("v1.34.4")),         // pkgs.k8s.io deb
            ("1.34.4-150500.1.1", Some("v1.34.4")),  // pkgs.k8s.io rpm
            ("2:1.33.10-1.1", Some("v1.33.10")),     // an epoch
            ("1.34.4", Some("v1.34.4")),             // no revision
            ("1.35.0-rc.1-0", Some("v1.35.0-rc.1")), // a pre-release, then a revision
            ("1.35.0~rc.1-0", None),                 // dpkg's tilde is no Kubernetes version
            ("1.34-1", None),
            ("1.34.x-1", None),
            ("", None),
            ("v1.34.4-1", None),
        ] {
            assert_eq!(upstream_version(package).as_deref(), want, "{package}");
        }
        let p = PackageVersion {
            name: "kubectl".into(),
            version: "1.34.1-1.1".into(),
        };
        assert_eq!(p.kubernetes_version().as_deref(), Some("v1.34.1"));
    }
}
