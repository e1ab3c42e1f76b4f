//! The `ClusterLifecycle` resource: the declarative layer on top of Operations.
//!
//! One object per cluster, named `cluster`. Its spec says what the cluster should be (a
//! Kubernetes version, how fresh its certificates must stay, whether kubeadm/kubelet/kubectl
//! follow the cluster's version); the controller compares that with what the nodes report
//! ([`crate::NodeReport`], the Node objects) and generates ordinary Operations to close the
//! gap, one at a time. Its status says whether the cluster is in sync, what is in progress,
//! and what it waits for.
//!
//! The schema refuses, at the API server, a malformed version, a downgrade, a skipped minor
//! version, a `certificates.rotation` that decreases, and any name other than `cluster`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::operation::{AlertGate, DrainSpec, EtcdSafety, ExecutionMode, HealthGates, Rollout};
use crate::schema;

/// The one name a ClusterLifecycle may have.
pub const NAME: &str = "cluster";

/// How many generated Operations `status.history` keeps (newest first).
pub const MAX_HISTORY: usize = 10;

/// The version pattern, as CEL writes it (the Rust side parses with [`parse_version`]).
const VERSION_RE: &str = "^v[0-9]{1,4}[.][0-9]{1,4}[.][0-9]{1,4}$";

/// What the cluster should be: its Kubernetes version and how fresh its certificates stay.
/// Cluster-scoped singleton named `cluster`.
// Each `printcolumn(...)` repeats keys such as `type_ = "string"`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bosun.dev",
    version = "v1alpha1",
    kind = "ClusterLifecycle",
    status = "ClusterLifecycleStatus",
    shortname = "lifecycle",
    category = "bosun",
    derive = "PartialEq",
    doc = "The ClusterLifecycle (one per cluster, named `cluster`) states the Kubernetes version the cluster should run and how fresh its certificates must stay; the Bosun controller compares it with what the nodes report and generates Operations, one at a time, to close the gap.",
    printcolumn(
        name = "Desired",
        type_ = "string",
        json_path = ".spec.kubernetesVersion",
        description = "The Kubernetes version the cluster should run"
    ),
    printcolumn(
        name = "InSync",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"InSync\")].status"
    ),
    printcolumn(
        name = "Waiting",
        type_ = "string",
        json_path = ".status.waiting",
        description = "What generation waits for, if anything"
    ),
    printcolumn(
        name = "Certs-Expire",
        type_ = "string",
        json_path = ".status.certificates.earliestExpiry",
        description = "The earliest expiry of a renewable control-plane certificate (a timestamp: a date column would show a future time as <invalid>)"
    ),
    printcolumn(
        name = "Reboots",
        type_ = "integer",
        json_path = ".status.reboots.required",
        description = "Nodes that need a reboot",
        priority = 1
    ),
    printcolumn(
        name = "Paused",
        type_ = "boolean",
        json_path = ".spec.paused",
        priority = 1
    ),
    printcolumn(
        name = "Summary",
        type_ = "string",
        json_path = ".status.summary",
        description = "Where the cluster stands, in one line"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLifecycleSpec {
    /// The Kubernetes version the cluster should run, for example `v1.34.4`. Raising it by
    /// patch versions or by one minor version generates an upgrade Operation; skipping a
    /// minor version is refused (kubeadm upgrades one minor at a time), and so is lowering
    /// it below the highest version a node runs (`status.versions.highest`): lowering is
    /// allowed only to withdraw a requested upgrade before it has moved a node.
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {
            "rule": format!("self.matches('{VERSION_RE}')"),
            "message": "spec.kubernetesVersion must be a version like v1.34.4: a `v`, then major.minor.patch",
        },
        {
            "rule": format!("!self.matches('{VERSION_RE}') || !oldSelf.matches('{VERSION_RE}') || self.substring(1).split('.')[0] == oldSelf.substring(1).split('.')[0]"),
            "message": "spec.kubernetesVersion cannot change its major version: kubeadm upgrades one minor version at a time",
        },
        // Lowering is a rule on the whole object (`lowering_rule`): it reads the status.
        {
            "rule": format!("!self.matches('{VERSION_RE}') || !oldSelf.matches('{VERSION_RE}') || self.substring(1).split('.')[0] != oldSelf.substring(1).split('.')[0] || int(self.substring(1).split('.')[1]) <= int(oldSelf.substring(1).split('.')[1]) + 1"),
            "message": "spec.kubernetesVersion cannot skip a minor version: kubeadm upgrades one minor version at a time, so raise it to the next minor first and let that upgrade finish",
        },
    ]))]
    pub kubernetes_version: String,

    /// How fresh the control-plane certificates must stay.
    #[serde(default)]
    pub certificates: CertificatePolicy,

    /// Whether upgrades also move the kubeadm, kubelet and kubectl packages to the cluster's
    /// version (`FollowClusterVersion`, the default) or leave packages alone (`LeaveAlone`,
    /// for nodes whose binaries are managed some other way).
    #[serde(default)]
    pub packages: PackagePolicy,

    /// Settings copied into every Operation this object generates.
    #[serde(default)]
    pub operation_defaults: OperationDefaults,

    /// Whether nodes that need a reboot (their NodeReport says so) are rebooted, one node at
    /// a time, and the gates each reboot waits for (docs/reboots.md).
    #[serde(default)]
    pub reboots: RebootPolicy,

    /// While true, no Operation is generated (one already running goes on; pause it on the
    /// Operation itself).
    #[serde(default)]
    pub paused: bool,
}

/// How fresh the control-plane certificates must stay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificatePolicy {
    /// With `autoRenew`, renew when a certificate expires within this long: days, hours and
    /// minutes (`30d`, `7d12h`, `90m`). Default `30d`. It must be shorter than the validity
    /// a renewal gives (kubeadm's `certificateValidityPeriod`, one year by default), or no
    /// renewal is generated for expiry (`RenewBeforeTooLong`); zero with `autoRenew` renews
    /// only expired certificates, and is accepted with a warning.
    #[serde(default = "default_renew_before")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) > 0 && self.matches('^([0-9]{1,4}d)?([0-9]{1,5}h)?([0-9]{1,6}m)?$')",
        "message": "spec.certificates.renewBefore must be days, hours and minutes in that order, each optional, such as 30d, 7d12h or 90m",
    }]))]
    pub renew_before: String,

    /// Renew the certificates automatically when one is due (within `renewBefore`).
    /// Default false: expiry is reported, nothing is renewed.
    #[serde(default)]
    pub auto_renew: bool,

    /// Raise this number to renew every certificate once, now, whatever their expiry. It
    /// may only increase; the last one acted on is `status.certificates.handledRotation`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1_000_000))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= oldSelf",
        // A static message: a messageExpression printing both values is refused by the API
        // server's CEL cost estimate (string(int) has no bound).
        "message": "spec.certificates.rotation can only increase: raise it by one to renew every certificate once (a server-side apply or a replace that leaves spec.certificates.rotation out sets it back to 0: include its current value)",
    }]))]
    pub rotation: i64,
}

impl Default for CertificatePolicy {
    fn default() -> Self {
        CertificatePolicy {
            renew_before: default_renew_before(),
            auto_renew: false,
            rotation: 0,
        }
    }
}

fn default_renew_before() -> String {
    "30d".into()
}

/// Whether upgrades move the Kubernetes packages too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PackagePolicy {
    /// Upgrades move kubeadm, kubelet and kubectl to the cluster's version.
    #[default]
    FollowClusterVersion,
    /// Upgrades leave the packages alone.
    LeaveAlone,
}

/// Whether and how nodes that need a reboot are rebooted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebootPolicy {
    /// `Never` (the default: needs are counted in `status.reboots`, nothing is rebooted) or
    /// `Required`: a node whose NodeReport says it needs a reboot gets a reboot Operation,
    /// one node at a time (control-plane nodes first, then by name). Nodes that do not need
    /// one are never touched.
    #[serde(default)]
    pub when: RebootWhen,

    /// Copied into each generated reboot: never start a node's reboot while a pod matching
    /// this selector runs on it (kured's `--blocking-pod-selector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::label_selector")]
    pub blocking_pod_selector: Option<LabelSelector>,

    /// Copied into each generated reboot: do not start a node's reboot while alerts fire in
    /// Prometheus (kured's `--prometheus-url`, `--alert-filter-regexp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<AlertGate>,
}

/// When the ClusterLifecycle reboots nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RebootWhen {
    /// Never: reboots are counted and shown, not carried out.
    #[default]
    Never,
    /// When a node's NodeReport says it needs one.
    Required,
}

/// The settings every generated Operation gets (the Operation spec's own types).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationDefaults {
    /// `Auto`, `Controlled` (each node waits for approval) or `DryRun`. Default `Auto`.
    #[serde(default)]
    pub execution_mode: ExecutionMode,
    /// How many nodes may be worked on at once.
    #[serde(default)]
    pub rollout: Rollout,
    /// Checks between nodes.
    #[serde(default)]
    pub health_gates: HealthGates,
    /// Cordon and drain settings (`timeoutSeconds`, `deleteEmptyDirData`,
    /// `evictUnmanagedPods`), as on an Operation.
    #[serde(default)]
    pub drain: DrainSpec,
    /// The etcd health check and snapshot of generated upgrades (`healthCheck`,
    /// `snapshot`, `keepSnapshots`), as an Operation's `spec.upgrade.etcd`.
    #[serde(default)]
    pub etcd: EtcdSafety,
}

/// What the controller observed and did, written by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLifecycleStatus {
    /// `InSync` (desired equals observed) and `Progressing` (a generated Operation is under
    /// way).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// What generation waits for: `Paused`, `BlockedOperation`, `Approval`,
    /// `OperationRunning`, `OperationSuperseded` (a generated upgrade to a version the spec
    /// no longer says: delete it to withdraw it), `OperationFinishedWithoutEffect`,
    /// `NodeReports`, `NameTaken` (the Operation it would generate exists and is not its
    /// own), `VersionNotReachable` (`spec.kubernetesVersion` is not a legal next step from
    /// the versions the nodes run), `RenewBeforeTooLong` (certificates are due, but
    /// `renewBefore` is not shorter than the validity a renewal gives, so a renewal could not
    /// make them fresh). Absent when nothing is awaited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,

    /// One line for people, for example
    /// `3/5 nodes at v1.34.4; upgrade Operation lifecycle-upgrade-v1-34-4 running (2/5)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,

    /// Node versions as observed.
    #[serde(default)]
    pub versions: ObservedVersions,

    /// Certificate expiry as observed, and the rotation last acted on.
    #[serde(default)]
    pub certificates: ObservedCertificates,

    /// The nodes that need a reboot, as their NodeReports say.
    #[serde(default)]
    pub reboots: ObservedReboots,

    /// The generated Operation not yet finished, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_operation: Option<String>,

    /// Generated Operations, newest first, at most 10.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub history: Vec<GeneratedOperation>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The nodes' versions as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedVersions {
    /// Nodes whose kubelet reports the desired version.
    #[serde(default)]
    pub nodes_at_desired: u32,
    /// Nodes in the cluster.
    #[serde(default)]
    pub nodes: u32,
    /// The lowest kubelet version reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 40))]
    pub lowest: Option<String>,
    /// The highest kubelet version reported. `spec.kubernetesVersion` may not be lowered
    /// below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 40))]
    pub highest: Option<String>,
}

/// Certificate expiry as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedCertificates {
    /// The earliest expiry among the renewable certificates of the control-plane nodes (CAs
    /// are not renewed by kubeadm and are left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_expiry: Option<Time>,
    /// Which certificate that is: `<node>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest: Option<String>,
    /// With `autoRenew`: when a renewal will be generated (the earliest expiry minus
    /// `renewBefore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_renewal: Option<Time>,
    /// Control-plane nodes that have reported their certificates.
    #[serde(default)]
    pub nodes_reported: u32,
    /// The `spec.certificates.rotation` last acted on (a renewal Operation was generated
    /// for it).
    #[serde(default)]
    pub handled_rotation: i64,
}

/// The nodes that need a reboot, as their agents report it (docs/reboots.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedReboots {
    /// Nodes whose NodeReport says a reboot is needed.
    #[serde(default)]
    pub required: u32,
    /// Those nodes by name, in name order, at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), inner(length(max = 253)))]
    pub nodes: Vec<String>,
    /// Nodes whose NodeReport says whether a reboot is needed (an agent that predates the
    /// check says nothing, and its node is not counted either way).
    #[serde(default)]
    pub nodes_reported: u32,
}

/// The most node names [`ObservedReboots::nodes`] lists.
pub const MAX_REBOOT_NODES: usize = 20;

/// One Operation the ClusterLifecycle generated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedOperation {
    /// The Operation's name.
    pub name: String,
    /// `upgrade`, `renewCertificates` or `reboot`.
    pub kind: String,
    /// Why it was generated.
    pub reason: String,
    /// When it was generated.
    pub created_at: Time,
}

/// The CEL rule, on the whole object, that refuses lowering `spec.kubernetesVersion` below
/// the highest version a node runs, with its message. It reads `status.versions.highest`
/// (the controller's observation; the API server keeps the stored status on a spec update),
/// so a version raised by mistake can be set back while no node has moved to it, which is
/// how a requested upgrade is withdrawn (docs/lifecycle.md, "Withdrawing an upgrade"). Without
/// an observation, lowering is refused. The controller holds the same line against the
/// nodes themselves (`VersionNotReachable`), so a stale status cannot make a node go back.
pub fn lowering_rule() -> (String, &'static str) {
    let re = VERSION_RE;
    let part = |of: &str, i: usize| format!("int({of}.substring(1).split('.')[{i}])");
    // `a` below `b`, both valid and of one major.
    let below = |a: &str, b: &str| {
        format!(
            "({} < {} || ({} == {} && {} < {}))",
            part(a, 1),
            part(b, 1),
            part(a, 1),
            part(b, 1),
            part(a, 2),
            part(b, 2)
        )
    };
    let new = "self.spec.kubernetesVersion";
    let old = "oldSelf.spec.kubernetesVersion";
    let highest = "self.status.versions.highest";
    let rule = format!(
        "!{new}.matches('{re}') || !{old}.matches('{re}') || {new}.substring(1).split('.')[0] != {old}.substring(1).split('.')[0] || !{lowered} || (has(self.status) && has(self.status.versions) && has(self.status.versions.highest) && {highest}.matches('{re}') && {highest}.substring(1).split('.')[0] == {new}.substring(1).split('.')[0] && !{under})",
        lowered = below(new, old),
        under = below(new, highest),
    );
    (
        rule,
        "spec.kubernetesVersion cannot be lowered below a version a node runs (status.versions.highest): kubeadm does not downgrade a cluster, and once nodes run the newer version going back means restoring the control plane from a backup. Lowering is allowed only to withdraw a requested upgrade while no node runs above the version you set (docs/lifecycle.md, Withdrawing an upgrade)",
    )
}

/// A Kubernetes version as `(major, minor, patch)`, from `v1.34.4` (a suffix after the
/// patch, such as `+k3s1` or `-rc.0`, is ignored). `None` when it is not one.
pub fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let rest = s.strip_prefix('v')?;
    let mut parts = rest.splitn(3, '.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch_text = parts.next()?;
    let digits: String = patch_text
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let patch = digits.parse().ok()?;
    Some((major, minor, patch))
}

/// `renewBefore` (`30d`, `7d12h`, `90m`) in seconds; `None` when malformed.
pub fn parse_renew_before(s: &str) -> Option<i64> {
    if s.is_empty() {
        return None;
    }
    sum_of_units(s, &[('d', 86_400), ('h', 3_600), ('m', 60)])
}

/// The seconds of a duration written as whole numbers each followed by one of `units`
/// (a unit letter and its seconds), such as `7d12h` or kubeadm's `8760h0m0s`: the sum of
/// each number times its unit. `None` for another character, a number without a unit, a
/// unit without a number, or an overflow. The empty string is 0.
pub fn sum_of_units(s: &str, units: &[(char, i64)]) -> Option<i64> {
    let mut total: i64 = 0;
    let mut number = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: i64 = number.parse().ok()?;
        number.clear();
        let (_, unit) = units.iter().find(|(letter, _)| *letter == c)?;
        total = total.checked_add(n.checked_mul(*unit)?)?;
    }
    number.is_empty().then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_and_without_suffixes() {
        assert_eq!(parse_version("v1.34.4"), Some((1, 34, 4)));
        assert_eq!(parse_version("v1.34.4+k3s1"), Some((1, 34, 4)));
        assert_eq!(parse_version("1.34.4"), None);
        assert_eq!(parse_version("v1.34"), None);
        assert_eq!(parse_version("vX.1.2"), None);
    }

    #[test]
    fn renew_before_parses_days_hours_minutes() {
        assert_eq!(parse_renew_before("30d"), Some(30 * 86_400));
        assert_eq!(parse_renew_before("7d12h"), Some(7 * 86_400 + 12 * 3_600));
        assert_eq!(parse_renew_before("90m"), Some(5_400));
        assert_eq!(parse_renew_before("30"), None);
        assert_eq!(parse_renew_before("d"), None);
        assert_eq!(parse_renew_before(""), None);
        assert_eq!(parse_renew_before("3w"), None);
    }
}
