//! The ClusterLifecycle decision: desired state and observed state in, at most one
//! Operation to generate and the status to show out. Pure (no I/O, the time is an input),
//! so every rule is a unit test.
//!
//! Rules, in order:
//! 1. A generated Operation that has not finished holds everything: nothing new is
//!    generated, and `waiting` says what it waits for (a person for a Blocked one, an
//!    approval, or just its progress).
//! 2. `spec.paused` generates nothing.
//! 3. Nodes behind the desired version: one upgrade Operation, named after the version. A
//!    node is behind when its kubelet is, and, with `packages: FollowClusterVersion`, also
//!    when an installed kubeadm, kubelet or kubectl package its NodeReport lists is (the
//!    upgrade moves those packages; a package that is not reported is not guessed at).
//! 4. `spec.certificates.rotation` above the last one handled: one renewal, named after
//!    the rotation. The rotation counts as handled once that renewal has succeeded on every
//!    node (none skipped or gone), not when it is generated.
//! 5. `autoRenew` and a renewable control-plane certificate expiring within `renewBefore`:
//!    one renewal, named after that expiry, but only when `renewBefore` is shorter than the
//!    validity a renewal gives ([`RenewalValidity`]): a longer one would find every
//!    certificate due again the moment it was renewed, and renew forever.
//! 6. `reboots.when: Required` and a node whose NodeReport says it needs a reboot: one
//!    reboot Operation for that one node (control-plane nodes first, then by name), named
//!    after the node and its boot, with the ClusterLifecycle's reboot gates. A node that the
//!    last reboot generated for it did not help (it Succeeded, and the node reports the same
//!    need again) is not rebooted again: that waits for a person (`RebootDidNotClear`).
//!
//! Names are deterministic, so a rule whose Operation already exists (finished without
//! closing the gap: a DryRun, skipped nodes) generates nothing again; it waits for a person
//! instead. That is also what keeps a second reconcile from generating twice.

use bosun_api::lifecycle::{
    ClusterLifecycleSpec, MAX_REBOOT_NODES, ObservedCertificates, ObservedReboots,
    ObservedVersions, PackagePolicy, RebootWhen, parse_renew_before, parse_version,
};
use bosun_api::node_task::{CertificateExpiry, PackageVersion, RebootNeed};
use bosun_api::operation::{
    CertificateName, KubePackage, OperationPhase, OperationSpec, RebootSpec, RenewCertificatesSpec,
    UpgradeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// What the controller observed about one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeObservation {
    pub name: String,
    pub control_plane: bool,
    /// The kubelet's version as the Node reports it.
    pub kubelet_version: Option<String>,
    /// The certificates from the node's NodeReport; `None` without a report.
    pub certificates: Option<Vec<CertificateExpiry>>,
    /// The installed packages from the node's NodeReport (empty without a report, or
    /// where the agent could read no package database).
    pub packages: Vec<PackageVersion>,
    /// Whether the node needs a reboot, from its NodeReport; `None` without a report or
    /// from an agent that predates the check.
    pub reboot: Option<RebootNeed>,
    /// The node's boot identity, from its NodeReport.
    pub boot_id: Option<String>,
}

/// The packages a generated upgrade moves to the cluster's version (with
/// `packages: FollowClusterVersion`), so the ones whose lag counts as drift.
pub const FOLLOWED_PACKAGES: [KubePackage; 3] = [
    KubePackage::Kubeadm,
    KubePackage::Kubelet,
    KubePackage::Kubectl,
];

/// The packages of `node` behind `desired` among [`FOLLOWED_PACKAGES`], as
/// `kubectl 1.34.1-1.1`; a version that does not read as a Kubernetes version is left out.
fn packages_behind(node: &NodeObservation, desired: (u32, u32, u32)) -> Vec<String> {
    node.packages
        .iter()
        .filter(|p| FOLLOWED_PACKAGES.iter().any(|f| f.as_str() == p.name))
        .filter(|p| {
            p.kubernetes_version()
                .as_deref()
                .and_then(parse_version)
                .is_some_and(|v| v < desired)
        })
        .map(|p| format!("{} {}", p.name, p.version))
        .collect()
}

/// The kind of work of a generated Operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Upgrade,
    RenewCertificates,
    Reboot,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Upgrade => "upgrade",
            Kind::RenewCertificates => "renewCertificates",
            Kind::Reboot => "reboot",
        }
    }
}

/// An Operation this ClusterLifecycle generated earlier, as it stands now.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub name: String,
    pub kind: Kind,
    pub phase: OperationPhase,
    /// `status.progress` (`2/5`).
    pub progress: Option<String>,
    /// Its tasks that finished without doing their work: skipped by a person, or Invalid
    /// (the node went away).
    pub not_done: u32,
    /// The version an upgrade moves to (`spec.upgrade.kubernetesVersion`).
    pub version: Option<String>,
    /// Its `NodeHeld` condition's message while a node it needs is held by another
    /// Operation (`waiting: node w-1 is held by Operation x (task …, Blocked)`).
    pub held: Option<String>,
    /// The node a generated reboot reboots (`spec.reboot.nodes`).
    pub reboot_node: Option<String>,
    /// Its `Blocked` condition's message while a policy holds it (reason `PolicyDenied`: a
    /// maintenance window closed, a change freeze): it proceeds by itself once allowed.
    pub policy_hold: Option<String>,
    /// Why it was generated (its `bosun.dev/lifecycle-reason` annotation).
    pub reason: String,
}

/// Everything the decision reads.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    pub spec: &'a ClusterLifecycleSpec,
    /// `status.certificates.handledRotation`.
    pub handled_rotation: i64,
    pub nodes: &'a [NodeObservation],
    pub generated: &'a [Generated],
    /// How long a certificate is valid once renewed.
    pub renewal_validity: RenewalValidity,
    pub now: Timestamp,
}

/// How long `kubeadm certs renew` makes a certificate valid: the ClusterConfiguration's
/// `certificateValidityPeriod` (kubeadm v1beta4), or kubeadm's default of one year.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewalValidity {
    pub period: SignedDuration,
    /// Read from the `kubeadm-config` ConfigMap (else kubeadm's default).
    pub from_config: bool,
}

impl RenewalValidity {
    /// kubeadm's default: 8760h.
    pub const KUBEADM_DEFAULT: RenewalValidity = RenewalValidity {
        period: SignedDuration::from_hours(8760),
        from_config: false,
    };

    /// `where it comes from`, for messages.
    fn source(&self) -> &'static str {
        if self.from_config {
            "certificateValidityPeriod in ConfigMap kube-system/kubeadm-config"
        } else {
            "kubeadm's default certificate validity"
        }
    }
}

/// A duration the way `renewBefore` writes one: `365d`, `240h`, `90m` (the largest unit
/// that divides it).
pub fn show_period(secs: i64) -> String {
    if secs % 86_400 == 0 {
        format!("{}d", secs / 86_400)
    } else if secs % 3_600 == 0 {
        format!("{}h", secs / 3_600)
    } else if secs % 60 == 0 {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// Why `renewBefore` cannot work with certificates renewed for `validity` (`None`: it can):
/// a `renewBefore` at least as long as the validity finds every certificate due again the
/// moment it is renewed, so autoRenew would renew forever and the cluster never be InSync.
pub fn renew_before_too_long(renew_before: &str, validity: RenewalValidity) -> Option<String> {
    let before = parse_renew_before(renew_before)?;
    let period = validity.period.as_secs();
    (before >= period).then(|| {
        format!(
            "spec.certificates.renewBefore {renew_before} is not shorter than the {} a renewal gives each certificate ({}): every certificate would be due again the moment it was renewed, so no renewal is generated for expiry; set renewBefore well below {}, for example 30d",
            show_period(period),
            validity.source(),
            show_period(period)
        )
    })
}

/// An Operation to create.
#[derive(Clone, Debug, PartialEq)]
pub struct Generate {
    pub name: String,
    pub kind: Kind,
    pub reason: String,
    pub spec: OperationSpec,
}

/// What generation waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    Paused,
    BlockedOperation,
    Approval,
    OperationPaused,
    OperationRunning,
    OperationFinishedWithoutEffect,
    NodeReports,
    /// The Operation it would generate exists and is not its own (by hand, or generated by
    /// an earlier ClusterLifecycle): nothing is generated until the name is free.
    NameTaken,
    /// `spec.kubernetesVersion` is not a legal next step from the versions the nodes run
    /// (a skipped minor, a downgrade, a major change): nothing is generated.
    VersionNotReachable,
    /// Certificates are due but `renewBefore` is not shorter than the validity a renewal
    /// gives: a renewal could not make them fresh, so none is generated.
    RenewBeforeTooLong,
    /// A generated upgrade not yet finished moves to another version than
    /// `spec.kubernetesVersion` now says (the version was set back to withdraw it): a person
    /// deletes it (nothing is deleted for them) or sets the version again.
    OperationSuperseded,
    /// The last reboot generated for a node succeeded, and the node reports the same need
    /// again: another reboot would not help, so none is generated until a person looks.
    RebootDidNotClear,
    /// A generated Operation is held by policy (a maintenance window, a change freeze): it
    /// proceeds by itself once the policies allow.
    PolicyHold,
}

impl Waiting {
    pub fn as_str(self) -> &'static str {
        match self {
            Waiting::Paused => "Paused",
            Waiting::BlockedOperation => "BlockedOperation",
            Waiting::Approval => "Approval",
            Waiting::OperationPaused => "OperationPaused",
            Waiting::OperationRunning => "OperationRunning",
            Waiting::OperationFinishedWithoutEffect => "OperationFinishedWithoutEffect",
            Waiting::NodeReports => "NodeReports",
            Waiting::NameTaken => "NameTaken",
            Waiting::VersionNotReachable => "VersionNotReachable",
            Waiting::RenewBeforeTooLong => "RenewBeforeTooLong",
            Waiting::OperationSuperseded => "OperationSuperseded",
            Waiting::RebootDidNotClear => "RebootDidNotClear",
            Waiting::PolicyHold => "PolicyHold",
        }
    }
}

/// The decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The Operation to create now, if any.
    pub generate: Option<Generate>,
    /// What generation waits for, and a sentence saying what to do.
    pub waiting: Option<(Waiting, String)>,
    /// Desired equals observed; the reason names what differs when false.
    pub in_sync: (bool, &'static str, String),
    /// The generated Operation under way, if any.
    pub progressing: Option<String>,
    /// When the decision changes by time alone (a certificate becomes due), if that is
    /// later than `now`: the reconciler decides again then.
    pub wake_at: Option<Timestamp>,
    pub versions: ObservedVersions,
    pub certificates: ObservedCertificates,
    pub reboots: ObservedReboots,
    pub summary: String,
}

/// True for kubeadm's CAs, which `kubeadm certs renew` does not renew: they stay out of
/// the freshness check, or an old CA would generate renewals forever.
fn is_ca(name: &str) -> bool {
    name == "ca" || name.ends_with("-ca")
}

/// `v1.34.4` → `v1-34-4`, for Operation names.
fn dns(version: &str) -> String {
    version.replace('.', "-").to_ascii_lowercase()
}

/// The name of the upgrade Operation for `version`.
pub fn upgrade_name(version: &str) -> String {
    format!("lifecycle-upgrade-{}", dns(version))
}

/// The name of the reboot Operation for `node` in the boot `boot_id` (one per boot: the
/// reboot ends that boot), at most 253 characters.
pub fn reboot_name(node: &str, boot_id: Option<&str>) -> String {
    let boot = bosun_planner::stable_hash(boot_id.unwrap_or_default().as_bytes());
    let hash = format!("{:08x}", boot >> 32);
    let prefix: String = format!("lifecycle-reboot-{node}")
        .chars()
        .take(253 - 9)
        .collect();
    format!(
        "{}-{hash}",
        prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
    )
}

/// The name of the renewal Operation for rotation `n`.
pub fn rotation_name(n: i64) -> String {
    format!("lifecycle-renew-r{n}")
}

/// The name of the renewal Operation for certificates expiring at `expiry`.
pub fn expiry_name(expiry: Timestamp) -> String {
    format!("lifecycle-renew-exp-{}", expiry.strftime("%Y%m%d-%H%M%S"))
}

/// Why `desired` is not a legal next step for the nodes as they run (`None`: it is). The
/// API server's transition rules compare a new spec with the old one only; this holds
/// against the cluster, whoever wrote the spec and however (a create, edits while paused).
/// kubeadm upgrades one minor version at a time and never downgrades, so every node that
/// reports a version must run `desired`'s major, at most `desired`, and at least the minor
/// before it. The first offending node (by name) is named.
pub fn unreachable_version(desired: (u32, u32, u32), nodes: &[NodeObservation]) -> Option<String> {
    let show = |v: (u32, u32, u32)| format!("v{}.{}.{}", v.0, v.1, v.2);
    let mut named: Vec<(&str, (u32, u32, u32))> = nodes
        .iter()
        .filter_map(|n| {
            let v = n.kubelet_version.as_deref().and_then(parse_version)?;
            Some((n.name.as_str(), v))
        })
        .collect();
    named.sort();
    let d = show(desired);
    named.into_iter().find_map(|(node, v)| {
        let at = show(v);
        if v.0 != desired.0 {
            Some(format!(
                "spec.kubernetesVersion {d} changes the major version of node {node}, which runs {at}: kubeadm upgrades one minor version at a time; set a version of v{}.{} or v{}.{}",
                v.0, v.1, v.0, v.1 + 1
            ))
        } else if v > desired {
            Some(format!(
                "spec.kubernetesVersion {d} is below node {node}, which runs {at}: kubeadm does not downgrade a node; set {at} or later"
            ))
        } else if desired.1 > v.1 + 1 {
            Some(format!(
                "spec.kubernetesVersion {d} skips a minor version for node {node}, which runs {at}: kubeadm upgrades one minor version at a time; set a v{}.{} version first and let that upgrade finish",
                v.0,
                v.1 + 1
            ))
        } else {
            None
        }
    })
}

/// Decides. See the module documentation for the rules.
pub fn decide(input: &Input<'_>) -> Decision {
    let versions = VersionsSeen::of(input);
    let certs = CertificatesSeen::of(input);
    let mut decision = Decision {
        generate: None,
        waiting: None,
        in_sync: in_sync(input, &versions, &certs),
        progressing: None,
        wake_at: certs.due_at.filter(|d| *d > input.now),
        versions: versions.observed.clone(),
        certificates: certs.observed.clone(),
        reboots: reboots_of(input.nodes),
        summary: String::new(),
    };
    // Rule 1: a generated Operation that has not finished holds everything.
    if let Some(open) = input.generated.iter().find(|g| !g.phase.is_finished()) {
        decision.progressing = Some(open.name.clone());
        decision.waiting = Some(waiting_for_open(open, &input.spec.kubernetes_version));
    } else {
        next_operation(input, &versions, &certs, &mut decision);
    }
    decision.summary = summary(input, &decision);
    decision
}

/// The nodes that need a reboot (`nodes` come sorted by name).
fn reboots_of(nodes: &[NodeObservation]) -> ObservedReboots {
    let mut out = ObservedReboots::default();
    for node in nodes {
        let Some(need) = &node.reboot else { continue };
        out.nodes_reported += 1;
        if need.required {
            out.required += 1;
            if out.nodes.len() < MAX_REBOOT_NODES {
                out.nodes.push(node.name.clone());
            }
        }
    }
    out
}

/// The nodes' versions against `spec.kubernetesVersion`.
struct VersionsSeen {
    desired: Option<(u32, u32, u32)>,
    observed: ObservedVersions,
    /// Nodes behind: in their kubelet, or (following the cluster version) in a package.
    behind: u32,
    /// Nodes not reporting a version that reads.
    unknown: u32,
    /// Nodes whose kubelet is not behind but a followed package is, and the first such,
    /// named.
    packages_only: u32,
    first_package_lag: Option<String>,
}

impl VersionsSeen {
    fn of(input: &Input<'_>) -> VersionsSeen {
        let spec = input.spec;
        let desired = parse_version(&spec.kubernetes_version);
        let mut seen = VersionsSeen {
            desired,
            observed: ObservedVersions {
                nodes: u32::try_from(input.nodes.len()).unwrap_or(u32::MAX),
                ..Default::default()
            },
            behind: 0,
            unknown: 0,
            packages_only: 0,
            first_package_lag: None,
        };
        let mut parsed: Vec<(u32, u32, u32)> = Vec::new();
        let follow = spec.packages == PackagePolicy::FollowClusterVersion;
        for node in input.nodes {
            let kubelet = node.kubelet_version.as_deref().and_then(parse_version);
            match kubelet {
                Some(v) => {
                    parsed.push(v);
                    if Some(v) == desired {
                        seen.observed.nodes_at_desired += 1;
                    }
                }
                None => seen.unknown += 1,
            }
            if kubelet.is_some_and(|v| desired.is_some_and(|d| v < d)) {
                seen.behind += 1;
            } else if let Some(d) = desired.filter(|_| follow && kubelet.is_some()) {
                let lagging = packages_behind(node, d);
                if !lagging.is_empty() {
                    seen.behind += 1;
                    seen.packages_only += 1;
                    seen.first_package_lag
                        .get_or_insert_with(|| format!("{}: {}", node.name, lagging.join(", ")));
                }
            }
        }
        let show = |v: (u32, u32, u32)| format!("v{}.{}.{}", v.0, v.1, v.2);
        seen.observed.lowest = parsed.iter().min().copied().map(show);
        seen.observed.highest = parsed.iter().max().copied().map(show);
        seen
    }

    /// Every node's kubelet at the desired version.
    fn synced(&self) -> bool {
        self.observed.nodes_at_desired == self.observed.nodes && self.observed.nodes > 0
    }

    /// `, 1 only in its packages (w-1: kubectl 1.34.1-1.1)` when some nodes are behind only
    /// in their packages; empty otherwise.
    fn lag_note(&self) -> String {
        match (self.packages_only, &self.first_package_lag) {
            (0, _) | (_, None) => String::new(),
            (n, Some(first)) => format!(", {n} only in their packages ({first})"),
        }
    }
}

/// The control-plane nodes' certificates against `spec.certificates`.
struct CertificatesSeen {
    observed: ObservedCertificates,
    /// The renewable certificate that expires first: when, and `node/name`.
    earliest: Option<(Timestamp, String)>,
    /// When that certificate falls within `renewBefore`.
    due_at: Option<Timestamp>,
    /// It does now.
    due: bool,
    /// Why `renewBefore` is too long for the validity a renewal gives, if it is.
    too_long: Option<String>,
    /// `certificates.rotation` above the last one handled.
    rotation_due: bool,
}

impl CertificatesSeen {
    fn of(input: &Input<'_>) -> CertificatesSeen {
        let spec = input.spec;
        let mut observed = ObservedCertificates {
            handled_rotation: input.handled_rotation,
            ..Default::default()
        };
        let mut earliest: Option<(Timestamp, String)> = None;
        for node in input.nodes.iter().filter(|n| n.control_plane) {
            let Some(list) = &node.certificates else {
                continue;
            };
            observed.nodes_reported += 1;
            for cert in list.iter().filter(|c| !is_ca(&c.name)) {
                let at = cert.not_after.0;
                if earliest.as_ref().is_none_or(|(e, _)| at < *e) {
                    earliest = Some((at, format!("{}/{}", node.name, cert.name)));
                }
            }
        }
        let renew_before = parse_renew_before(&spec.certificates.renew_before).unwrap_or(0);
        let due_at = earliest
            .as_ref()
            .map(|(at, _)| *at - SignedDuration::from_secs(renew_before));
        if let Some((at, which)) = &earliest {
            observed.earliest_expiry = Some(Time(*at));
            observed.earliest = Some(which.clone());
        }
        if spec.certificates.auto_renew {
            observed.next_renewal = due_at.map(Time);
        }
        CertificatesSeen {
            observed,
            due: due_at.is_some_and(|d| d <= input.now),
            due_at,
            earliest,
            too_long: renew_before_too_long(
                &spec.certificates.renew_before,
                input.renewal_validity,
            ),
            rotation_due: spec.certificates.rotation > input.handled_rotation,
        }
    }

    /// The certificate due first and when it expires (`now` and nothing, if none is).
    fn first_due(&self, now: Timestamp) -> (Timestamp, String) {
        self.earliest.clone().unwrap_or((now, String::new()))
    }
}

/// The `InSync` condition: whether desired equals observed, and if not, the first of
/// package drift, version drift, a rotation requested, certificates due (with a
/// `renewBefore` too long to renew them) that differs.
fn in_sync(
    input: &Input<'_>,
    versions: &VersionsSeen,
    certs: &CertificatesSeen,
) -> (bool, &'static str, String) {
    let spec = input.spec;
    if versions.synced() && versions.packages_only > 0 {
        (
            false,
            "PackageDrift",
            format!(
                "every node's kubelet at {}, but {} with packages behind it ({})",
                spec.kubernetes_version,
                versions.packages_only,
                versions.first_package_lag.clone().unwrap_or_default()
            ),
        )
    } else if !versions.synced() {
        (
            false,
            "VersionDrift",
            format!(
                "{}/{} nodes at {} ({} behind{}, {} not reporting a version)",
                versions.observed.nodes_at_desired,
                versions.observed.nodes,
                spec.kubernetes_version,
                versions.behind,
                versions.lag_note(),
                versions.unknown,
            ),
        )
    } else if certs.rotation_due {
        (
            false,
            "RotationRequested",
            format!(
                "certificates.rotation {} is above the last handled, {}",
                spec.certificates.rotation, input.handled_rotation
            ),
        )
    } else if let Some(why) = certs.too_long.clone().filter(|_| certs.due) {
        (false, "RenewBeforeTooLong", why)
    } else if certs.due {
        let (at, which) = certs.first_due(input.now);
        (
            false,
            "CertificatesDue",
            format!(
                "{which} expires at {at}, within renewBefore {}",
                spec.certificates.renew_before
            ),
        )
    } else if let Some(node) = reboot_next(input) {
        (false, "RebootRequired", reboot_reason(node))
    } else {
        (
            true,
            "InSync",
            format!(
                "every node at {}; certificates fresh",
                spec.kubernetes_version
            ),
        )
    }
}

/// Rule 1: what a generated Operation that has not finished waits for, and what a person
/// can do about it. An upgrade to another version than `desired` was superseded.
fn waiting_for_open(open: &Generated, desired: &str) -> (Waiting, String) {
    let superseded = open
        .version
        .as_deref()
        .filter(|v| open.kind == Kind::Upgrade && *v != desired);
    if let Some(version) = superseded {
        return (
            Waiting::OperationSuperseded,
            format!(
                "Operation {} upgrades to {version}, but spec.kubernetesVersion is now {desired}: it goes on until it is deleted (nothing is deleted for you). To withdraw it, delete it (kubectl delete operation {}; pause it first with kubectl bosun pause {} if a node is under way); to go on, set spec.kubernetesVersion back to {version}",
                open.name, open.name, open.name
            ),
        );
    }
    if let Some(why) = open
        .policy_hold
        .as_ref()
        .filter(|_| open.phase == OperationPhase::Blocked)
    {
        return (
            Waiting::PolicyHold,
            format!(
                "Operation {} is held by policy and goes on by itself once the policies allow: {why}",
                open.name
            ),
        );
    }
    match open.phase {
        OperationPhase::Blocked => (
            Waiting::BlockedOperation,
            format!(
                "Operation {} is Blocked: resolve it (`kubectl bosun retry` or `skip` on its blocked task) and generation resumes",
                open.name
            ),
        ),
        OperationPhase::AwaitingApproval => (
            Waiting::Approval,
            format!("Operation {} waits for a node's approval", open.name),
        ),
        OperationPhase::Paused => (
            Waiting::OperationPaused,
            format!("Operation {} is paused", open.name),
        ),
        _ => (
            Waiting::OperationRunning,
            match &open.held {
                // Say which Operation holds which node, or a wait behind another
                // Operation reads as progress.
                Some(held) => format!("Operation {} is under way; {held}", open.name),
                None => format!("Operation {} is under way", open.name),
            },
        ),
    }
}

/// Rules 2 to 5, when no generated Operation is open: the first that applies generates an
/// Operation or says what generation waits for.
fn next_operation(
    input: &Input<'_>,
    versions: &VersionsSeen,
    certs: &CertificatesSeen,
    decision: &mut Decision,
) {
    let spec = input.spec;
    let auto_renew = spec.certificates.auto_renew;
    if spec.paused {
        decision.waiting = Some((
            Waiting::Paused,
            "spec.paused is true: no Operation is generated".into(),
        ));
    } else if let Some(why) = versions
        .desired
        .filter(|_| versions.behind > 0)
        .and_then(|d| unreachable_version(d, input.nodes))
    {
        decision.waiting = Some((Waiting::VersionNotReachable, why));
    } else if versions.behind > 0 && versions.desired.is_some() {
        upgrade(input, versions, decision);
    } else if certs.rotation_due {
        rotation(input, decision);
    } else if let Some(why) = certs.too_long.clone().filter(|_| certs.due && auto_renew) {
        decision.waiting = Some((Waiting::RenewBeforeTooLong, why));
    } else if certs.due && auto_renew {
        renewal_before_expiry(input, certs, decision);
    } else if let Some(node) = reboot_next(input) {
        reboot(input, node, decision);
    } else if auto_renew
        && decision.certificates.nodes_reported == 0
        && input.nodes.iter().any(|n| n.control_plane)
    {
        decision.waiting = Some((
            Waiting::NodeReports,
            "no control-plane node has reported its certificates yet (is the agent running there?)"
                .into(),
        ));
    }
}

/// The Operation of `name`, if it was generated already.
fn generated<'a>(input: &'a Input<'_>, name: &str) -> Option<&'a Generated> {
    input.generated.iter().find(|g| g.name == name)
}

/// Rule 3: one upgrade Operation for the nodes behind, unless the one for this version
/// already ended without closing the gap.
fn upgrade(input: &Input<'_>, versions: &VersionsSeen, decision: &mut Decision) {
    let spec = input.spec;
    let behind = versions.behind;
    let name = upgrade_name(&spec.kubernetes_version);
    if let Some(done) = generated(input, &name) {
        decision.waiting = Some((
            Waiting::OperationFinishedWithoutEffect,
            format!(
                "upgrade Operation {name} ended {} but {behind} nodes are still behind {}: look at its tasks (a DryRun or skipped nodes change nothing); to run it again, delete it (kubectl delete operation {name}) and the ClusterLifecycle generates it anew, or raise spec.kubernetesVersion",
                done.phase.as_str(),
                spec.kubernetes_version
            ),
        ));
    } else {
        decision.generate = Some(Generate {
            name,
            kind: Kind::Upgrade,
            reason: format!(
                "{behind} of {} nodes behind {}{}",
                input.nodes.len(),
                spec.kubernetes_version,
                versions.lag_note()
            ),
            spec: operation_spec(spec, Kind::Upgrade),
        });
    }
}

/// Rule 4: one renewal for a raised `certificates.rotation`. A rotation is handled once its
/// renewal has succeeded on every node, not when it is generated: until then InSync stays
/// False (RotationRequested), and a renewal that ended with nodes skipped or gone says so
/// instead of using the request up.
fn rotation(input: &Input<'_>, decision: &mut Decision) {
    let spec = input.spec;
    let rotation = spec.certificates.rotation;
    let name = rotation_name(rotation);
    match generated(input, &name) {
        None => {
            decision.generate = Some(Generate {
                name,
                kind: Kind::RenewCertificates,
                reason: format!("certificates.rotation raised to {rotation}"),
                spec: operation_spec(spec, Kind::RenewCertificates),
            });
        }
        Some(done) if done.phase == OperationPhase::Succeeded && done.not_done == 0 => {
            decision.certificates.handled_rotation = rotation;
        }
        Some(done) => {
            decision.waiting = Some((
                Waiting::OperationFinishedWithoutEffect,
                format!(
                    "renewal Operation {name} ended {}{}: rotation {rotation} is not handled; look at its tasks, renew those nodes by hand, or raise certificates.rotation to {} to renew every node again",
                    done.phase.as_str(),
                    match done.not_done {
                        0 => String::new(),
                        n => format!(
                            " with {n} node(s) skipped or gone, whose certificates were not renewed"
                        ),
                    },
                    rotation + 1
                ),
            ));
        }
    }
}

/// Rule 5: one renewal named after the expiry of the certificate due first, unless that
/// renewal already ended and the certificate is still due.
fn renewal_before_expiry(input: &Input<'_>, certs: &CertificatesSeen, decision: &mut Decision) {
    let spec = input.spec;
    let (at, which) = certs.first_due(input.now);
    let name = expiry_name(at);
    if let Some(done) = generated(input, &name) {
        decision.waiting = Some((
            Waiting::OperationFinishedWithoutEffect,
            format!(
                "renewal Operation {name} ended {} but {which} still expires at {at}: look at its tasks, then renew by hand or raise certificates.rotation",
                done.phase.as_str()
            ),
        ));
    } else {
        decision.generate = Some(Generate {
            name,
            kind: Kind::RenewCertificates,
            reason: format!(
                "{which} expires at {at}, within renewBefore {}",
                spec.certificates.renew_before
            ),
            spec: operation_spec(spec, Kind::RenewCertificates),
        });
    }
}

/// Rule 6: with `reboots.when: Required`, the node to reboot next: the first control-plane
/// node, then the first worker, by name, whose NodeReport says it needs a reboot.
fn reboot_next<'a>(input: &'a Input<'_>) -> Option<&'a NodeObservation> {
    if input.spec.reboots.when != RebootWhen::Required {
        return None;
    }
    let needs = |n: &&NodeObservation| n.reboot.as_ref().is_some_and(|r| r.required);
    let first = |cp: bool| {
        input
            .nodes
            .iter()
            .filter(needs)
            .find(move |n| n.control_plane == cp)
    };
    first(true).or_else(|| first(false))
}

/// Why `node` needs a reboot, for the generated Operation's reason.
fn reboot_reason(node: &NodeObservation) -> String {
    let reasons = node
        .reboot
        .as_ref()
        .map(|r| r.reasons.join("; "))
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "its NodeReport says so".into());
    format!("node {} needs a reboot: {reasons}", node.name)
}

/// Rule 6: one reboot Operation for `node`, unless the last one generated for it succeeded
/// and the node reports the same need again, or the one for this boot ended without a new
/// boot.
fn reboot(input: &Input<'_>, node: &NodeObservation, decision: &mut Decision) {
    let name = reboot_name(&node.name, node.boot_id.as_deref());
    let reason = reboot_reason(node);
    // `input.generated` is newest first.
    let last = input
        .generated
        .iter()
        .find(|g| g.kind == Kind::Reboot && g.reboot_node.as_deref() == Some(&node.name));
    if let Some(done) = generated(input, &name) {
        decision.waiting = Some((
            Waiting::OperationFinishedWithoutEffect,
            format!(
                "reboot Operation {name} ended {} and node {} has not rebooted since: look at its task; to try again, delete it (kubectl delete operation {name}) and the ClusterLifecycle generates it anew",
                done.phase.as_str(),
                node.name
            ),
        ));
    } else if let Some(last) = last
        .filter(|l| l.phase == OperationPhase::Succeeded && l.not_done == 0 && l.reason == reason)
    {
        decision.waiting = Some((
            Waiting::RebootDidNotClear,
            format!(
                "node {} was rebooted by Operation {} and still reports the same need ({reason}): another reboot would not clear it, so none is generated. Look at the node (is /run a tmpfs? does a package keep asking?); once it is a new need, delete Operation {} (kubectl delete operation {}) and the ClusterLifecycle reboots the node again",
                node.name, last.name, last.name, last.name
            ),
        ));
    } else {
        let mut spec = operation_spec(input.spec, Kind::Reboot);
        if let Some(r) = spec.reboot.as_mut() {
            r.nodes = vec![node.name.clone()];
        }
        decision.generate = Some(Generate {
            name,
            kind: Kind::Reboot,
            reason,
            spec,
        });
    }
}

/// The Operation spec of a generated Operation of `kind`.
pub fn operation_spec(spec: &ClusterLifecycleSpec, kind: Kind) -> OperationSpec {
    let defaults = &spec.operation_defaults;
    let mut out = OperationSpec {
        execution_mode: defaults.execution_mode,
        rollout: defaults.rollout.clone(),
        health_gates: defaults.health_gates.clone(),
        drain: defaults.drain.clone(),
        ..Default::default()
    };
    match kind {
        Kind::Upgrade => {
            out.upgrade = Some(UpgradeSpec {
                kubernetes_version: spec.kubernetes_version.clone(),
                packages: match spec.packages {
                    PackagePolicy::FollowClusterVersion => FOLLOWED_PACKAGES.to_vec(),
                    PackagePolicy::LeaveAlone => Vec::new(),
                },
                etcd: defaults.etcd.clone(),
            });
        }
        Kind::RenewCertificates => {
            out.renew_certificates = Some(RenewCertificatesSpec {
                certificates: vec![CertificateName::All],
                renew_before: None,
            });
        }
        Kind::Reboot => {
            out.reboot = Some(RebootSpec {
                nodes: Vec::new(),
                blocking_pod_selector: spec.reboots.blocking_pod_selector.clone(),
                alerts: spec.reboots.alerts.clone(),
            });
        }
    }
    out
}

/// `1 node`, `3 nodes`.
fn nodes_word(n: u32) -> String {
    format!("{n} node{}", if n == 1 { "" } else { "s" })
}

fn summary(input: &Input<'_>, d: &Decision) -> String {
    let mut parts = vec![format!(
        "{}/{} nodes at {}",
        d.versions.nodes_at_desired, d.versions.nodes, input.spec.kubernetes_version
    )];
    if let Some(g) = &d.generate {
        parts.push(format!(
            "generating {} Operation {}",
            g.kind.as_str(),
            g.name
        ));
    } else if let Some(open) = d
        .progressing
        .as_ref()
        .and_then(|n| input.generated.iter().find(|g| &g.name == n))
    {
        parts.push(format!(
            "{} Operation {} {} ({})",
            open.kind.as_str(),
            open.name,
            open.phase.in_words(),
            open.progress.as_deref().unwrap_or("not planned yet")
        ));
    }
    if let Some((w, _)) = &d.waiting {
        parts.push(format!("waiting: {}", w.as_str()));
    }
    if let Some(at) = &d.certificates.earliest_expiry {
        parts.push(format!("certificates expire from {}", at.0));
    }
    let r = &d.reboots;
    if r.required > 0 {
        let more = r.required as usize - r.nodes.len();
        parts.push(format!(
            "{} need{} a reboot ({}{})",
            nodes_word(r.required),
            if r.required == 1 { "s" } else { "" },
            r.nodes.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::lifecycle::CertificatePolicy;

    fn spec(version: &str) -> ClusterLifecycleSpec {
        ClusterLifecycleSpec {
            kubernetes_version: version.into(),
            certificates: CertificatePolicy::default(),
            packages: PackagePolicy::default(),
            operation_defaults: Default::default(),
            paused: false,
            reboots: Default::default(),
        }
    }

    fn now() -> Timestamp {
        "2026-12-01T00:00:00Z".parse().unwrap()
    }

    fn cert(name: &str, days: i64) -> CertificateExpiry {
        CertificateExpiry {
            name: name.into(),
            not_after: Time(now() + SignedDuration::from_hours(24 * days)),
        }
    }

    fn node(
        name: &str,
        cp: bool,
        version: &str,
        certs: Option<Vec<CertificateExpiry>>,
    ) -> NodeObservation {
        NodeObservation {
            name: name.into(),
            control_plane: cp,
            kubelet_version: Some(version.into()),
            certificates: certs,
            packages: Vec::new(),
            reboot: None,
            boot_id: None,
        }
    }

    fn package(name: &str, version: &str) -> PackageVersion {
        PackageVersion {
            name: name.into(),
            version: version.into(),
        }
    }

    fn cluster(version: &str, cert_days: i64) -> Vec<NodeObservation> {
        vec![
            node(
                "cp-1",
                true,
                version,
                Some(vec![cert("ca", 3), cert("apiserver", cert_days)]),
            ),
            node("w-1", false, version, Some(vec![cert("ca", 3)])),
        ]
    }

    fn decide_with(
        spec: &ClusterLifecycleSpec,
        handled: i64,
        nodes: &[NodeObservation],
        generated: &[Generated],
    ) -> Decision {
        decide(&Input {
            spec,
            handled_rotation: handled,
            nodes,
            generated,
            renewal_validity: RenewalValidity::KUBEADM_DEFAULT,
            now: now(),
        })
    }

    #[test]
    fn a_cluster_as_desired_is_in_sync_and_generates_nothing() {
        let d = decide_with(&spec("v1.34.4"), 0, &cluster("v1.34.4", 300), &[]);
        assert_eq!(d.generate, None);
        assert_eq!(d.waiting, None);
        assert!(d.in_sync.0, "{:?}", d.in_sync);
        assert_eq!(d.versions.nodes_at_desired, 2);
        // CAs are left out: the earliest renewable certificate is the apiserver's.
        assert_eq!(d.certificates.earliest.as_deref(), Some("cp-1/apiserver"));
        assert_eq!(
            d.certificates.next_renewal, None,
            "no autoRenew, no planned renewal"
        );
        assert!(
            d.summary.starts_with("2/2 nodes at v1.34.4"),
            "{}",
            d.summary
        );
    }

    #[test]
    fn version_drift_generates_one_upgrade_with_the_defaults() {
        let mut s = spec("v1.35.0");
        s.operation_defaults.execution_mode = bosun_api::ExecutionMode::DryRun;
        s.operation_defaults.drain.evict_unmanaged_pods = true;
        s.operation_defaults.drain.timeout_seconds = 120;
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &[]);
        let g = d.generate.expect("an upgrade");
        assert_eq!(g.name, "lifecycle-upgrade-v1-35-0");
        assert_eq!(g.kind, Kind::Upgrade);
        assert_eq!(g.spec.execution_mode, bosun_api::ExecutionMode::DryRun);
        assert_eq!(
            g.spec.drain, s.operation_defaults.drain,
            "the drain defaults are copied"
        );
        let up = g.spec.upgrade.expect("upgrade spec");
        assert_eq!(up.kubernetes_version, "v1.35.0");
        assert_eq!(up.packages.len(), 3);
        assert_eq!(d.in_sync.1, "VersionDrift");

        s.packages = PackagePolicy::LeaveAlone;
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &[]);
        assert!(
            d.generate
                .unwrap()
                .spec
                .upgrade
                .unwrap()
                .packages
                .is_empty()
        );
    }

    #[test]
    fn a_version_the_nodes_cannot_reach_in_one_upgrade_generates_nothing_and_says_why() {
        // (desired, the nodes' version) → the reason's key words, or legal.
        let cases = [
            ("v1.35.0", "v1.34.4", None),
            ("v1.34.5", "v1.34.4", None),
            (
                "v1.36.0",
                "v1.34.4",
                Some("skips a minor version for node cp-1, which runs v1.34.4"),
            ),
            ("v1.36.0", "v1.34.5", Some("set a v1.35 version first")),
            (
                "v2.0.0",
                "v1.34.4",
                Some("changes the major version of node cp-1"),
            ),
            ("v1.30.0", "v1.34.4", None), // nothing behind: nothing to generate anyway
        ];
        for (desired, at, expected) in cases {
            let d = decide_with(&spec(desired), 0, &cluster(at, 300), &[]);
            match expected {
                None => assert_ne!(
                    d.waiting.as_ref().map(|w| w.0),
                    Some(Waiting::VersionNotReachable),
                    "{desired} from {at}"
                ),
                Some(words) => {
                    assert_eq!(d.generate, None, "{desired} from {at}: nothing generated");
                    let (w, why) = d.waiting.expect("a reason");
                    assert_eq!(w, Waiting::VersionNotReachable, "{desired} from {at}");
                    assert!(why.contains(words), "{desired} from {at}: {why}");
                }
            }
        }
        // A downgrade of one node among others that are behind: refused, naming that node.
        let mut nodes = cluster("v1.34.4", 300);
        nodes[1].kubelet_version = Some("v1.35.2".into());
        let d = decide_with(&spec("v1.35.0"), 0, &nodes, &[]);
        assert_eq!(d.generate, None);
        let (w, why) = d.waiting.expect("a reason");
        assert_eq!(w, Waiting::VersionNotReachable);
        assert!(
            why.contains("is below node w-1, which runs v1.35.2"),
            "{why}"
        );
    }

    #[test]
    fn an_existing_upgrade_of_that_version_is_not_generated_again() {
        let s = spec("v1.35.0");
        let done = [Generated {
            name: upgrade_name("v1.35.0"),
            kind: Kind::Upgrade,
            phase: OperationPhase::Succeeded,
            progress: Some("2/2".into()),
            not_done: 0,
            version: None,
            held: None,
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &done);
        assert_eq!(d.generate, None);
        assert_eq!(
            d.waiting.map(|w| w.0),
            Some(Waiting::OperationFinishedWithoutEffect)
        );
    }

    #[test]
    fn an_upgrade_whose_version_was_withdrawn_says_how_to_cancel_it() {
        // Requested v1.35.0, then set back to the nodes' v1.34.4 before any node moved.
        let s = spec("v1.34.4");
        for phase in [
            OperationPhase::AwaitingApproval,
            OperationPhase::Running,
            OperationPhase::Paused,
            OperationPhase::Blocked,
        ] {
            let open = [Generated {
                name: upgrade_name("v1.35.0"),
                kind: Kind::Upgrade,
                phase,
                progress: Some("0/2".into()),
                not_done: 0,
                version: Some("v1.35.0".into()),
                held: None,
                reboot_node: None,
                policy_hold: None,
                reason: String::new(),
            }];
            let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &open);
            assert_eq!(d.generate, None, "{phase:?}");
            let (w, why) = d.waiting.expect("waiting");
            assert_eq!(w, Waiting::OperationSuperseded, "{phase:?}");
            assert!(
                why.contains("upgrades to v1.35.0, but spec.kubernetesVersion is now v1.34.4")
                    && why.contains("kubectl delete operation lifecycle-upgrade-v1-35-0")
                    && why.contains("nothing is deleted for you"),
                "{why}"
            );
            assert_eq!(d.progressing.as_deref(), Some("lifecycle-upgrade-v1-35-0"));
            // The nodes are where the spec says.
            assert!(d.in_sync.0, "{:?}", d.in_sync);
        }
        // The same version: an ordinary wait.
        let open = [Generated {
            name: upgrade_name("v1.34.4"),
            kind: Kind::Upgrade,
            phase: OperationPhase::Running,
            progress: Some("0/2".into()),
            not_done: 0,
            version: Some("v1.34.4".into()),
            held: None,
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&s, 0, &cluster("v1.34.3", 300), &open);
        assert_eq!(d.waiting.map(|w| w.0), Some(Waiting::OperationRunning));
    }

    #[test]
    fn a_generated_operation_held_behind_another_says_by_which_on_which_node() {
        let s = spec("v1.35.0");
        let open = [Generated {
            name: upgrade_name("v1.35.0"),
            kind: Kind::Upgrade,
            phase: OperationPhase::Running,
            progress: Some("0/2".into()),
            not_done: 0,
            version: Some("v1.35.0".into()),
            held: Some(
                "waiting: node cp-1 is held by Operation renew-now (task renew-now-cp-1, Blocked)"
                    .into(),
            ),
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &open);
        let (w, why) = d.waiting.expect("waiting");
        assert_eq!(w, Waiting::OperationRunning);
        assert_eq!(
            why,
            "Operation lifecycle-upgrade-v1-35-0 is under way; waiting: node cp-1 is held by Operation renew-now (task renew-now-cp-1, Blocked)"
        );
    }

    #[test]
    fn an_unfinished_generated_operation_holds_generation() {
        let s = spec("v1.35.0");
        for (phase, waiting, summary) in [
            (
                OperationPhase::Blocked,
                Waiting::BlockedOperation,
                "blocked",
            ),
            (
                OperationPhase::AwaitingApproval,
                Waiting::Approval,
                "awaiting approval",
            ),
            (
                OperationPhase::Running,
                Waiting::OperationRunning,
                "running",
            ),
            (
                OperationPhase::Pending,
                Waiting::OperationRunning,
                "pending",
            ),
            (OperationPhase::Paused, Waiting::OperationPaused, "paused"),
        ] {
            let open = [Generated {
                name: "lifecycle-renew-r1".into(),
                kind: Kind::RenewCertificates,
                phase,
                progress: Some("0/1".into()),
                not_done: 0,
                version: None,
                held: None,
                reboot_node: None,
                policy_hold: None,
                reason: String::new(),
            }];
            let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &open);
            assert_eq!(d.generate, None, "{phase:?}");
            assert_eq!(d.waiting.map(|w| w.0), Some(waiting), "{phase:?}");
            assert_eq!(d.progressing.as_deref(), Some("lifecycle-renew-r1"));
            let expected = format!(
                "renewCertificates Operation lifecycle-renew-r1 {summary} (0/1); waiting: {}",
                waiting.as_str()
            );
            assert!(d.summary.contains(&expected), "{}", d.summary);
        }
        // Once it finished, the drift is acted on.
        let finished = [Generated {
            name: "lifecycle-renew-r1".into(),
            kind: Kind::RenewCertificates,
            phase: OperationPhase::Succeeded,
            progress: Some("1/1".into()),
            not_done: 0,
            version: None,
            held: None,
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &finished);
        assert_eq!(d.generate.map(|g| g.kind), Some(Kind::Upgrade));
    }

    #[test]
    fn paused_generates_nothing() {
        let mut s = spec("v1.35.0");
        s.paused = true;
        s.certificates.rotation = 3;
        let d = decide_with(&s, 0, &cluster("v1.34.4", 1), &[]);
        assert_eq!(d.generate, None);
        assert_eq!(d.waiting.map(|w| w.0), Some(Waiting::Paused));
        assert_eq!(
            d.certificates.handled_rotation, 0,
            "a paused rotation is not handled"
        );
    }

    #[test]
    fn a_rotation_bump_renews_once() {
        let mut s = spec("v1.34.4");
        s.certificates.rotation = 3;
        let d = decide_with(&s, 2, &cluster("v1.34.4", 300), &[]);
        let g = d.generate.expect("a renewal");
        assert_eq!(g.name, "lifecycle-renew-r3");
        assert!(g.spec.renew_certificates.is_some());
        assert_eq!(
            d.certificates.handled_rotation, 2,
            "generated is not handled: handled means succeeded"
        );
        assert!(!d.in_sync.0);
        // Under way, or Blocked: still not handled, not in sync.
        for phase in [OperationPhase::Running, OperationPhase::Blocked] {
            let open = [Generated {
                name: "lifecycle-renew-r3".into(),
                kind: Kind::RenewCertificates,
                phase,
                progress: None,
                not_done: 0,
                version: None,
                held: None,
                reboot_node: None,
                policy_hold: None,
                reason: String::new(),
            }];
            let d = decide_with(&s, 2, &cluster("v1.34.4", 300), &open);
            assert_eq!(
                (d.generate, d.certificates.handled_rotation),
                (None, 2),
                "{phase:?}"
            );
            assert_eq!(d.in_sync.1, "RotationRequested", "{phase:?}");
        }
        // Finished with a node skipped: not handled, and the status says so and what to do.
        let skipped = [Generated {
            name: "lifecycle-renew-r3".into(),
            kind: Kind::RenewCertificates,
            phase: OperationPhase::Succeeded,
            progress: Some("2/2".into()),
            not_done: 1,
            version: None,
            held: None,
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&s, 2, &cluster("v1.34.4", 300), &skipped);
        assert_eq!((d.generate, d.certificates.handled_rotation), (None, 2));
        let (w, why) = d.waiting.expect("a reason");
        assert_eq!(w, Waiting::OperationFinishedWithoutEffect);
        assert!(
            why.contains("with 1 node(s) skipped or gone")
                && why.contains("raise certificates.rotation to 4"),
            "{why}"
        );
        // Handled: nothing more.
        let d = decide_with(&s, 3, &cluster("v1.34.4", 300), &[]);
        assert_eq!(d.generate, None);
        assert!(d.in_sync.0);
        // Succeeded on every node (and perhaps the status write of that was lost): handled,
        // nothing is generated twice.
        let exists = [Generated {
            name: "lifecycle-renew-r3".into(),
            kind: Kind::RenewCertificates,
            phase: OperationPhase::Succeeded,
            progress: None,
            not_done: 0,
            version: None,
            held: None,
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&s, 2, &cluster("v1.34.4", 300), &exists);
        assert_eq!(d.generate, None);
        assert_eq!(d.certificates.handled_rotation, 3);
    }

    #[test]
    fn certificates_within_renew_before_renew_only_with_auto_renew() {
        let mut s = spec("v1.34.4");
        s.certificates.renew_before = "30d".into();
        let nodes = cluster("v1.34.4", 10);
        let d = decide_with(&s, 0, &nodes, &[]);
        assert_eq!(d.generate, None, "autoRenew is off");
        assert_eq!(d.in_sync.1, "CertificatesDue");

        s.certificates.auto_renew = true;
        let d = decide_with(&s, 0, &nodes, &[]);
        let g = d.generate.expect("a renewal");
        assert!(g.name.starts_with("lifecycle-renew-exp-"), "{}", g.name);
        assert_eq!(
            d.certificates.next_renewal.map(|t| t.0),
            Some(now() + SignedDuration::from_hours(24 * 10) - SignedDuration::from_hours(24 * 30))
        );

        // Fresh certificates: the next renewal is planned, nothing generated.
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &[]);
        assert_eq!(d.generate, None);
        assert!(d.in_sync.0);
        assert_eq!(
            d.certificates.next_renewal.map(|t| t.0),
            Some(now() + SignedDuration::from_hours(24 * 270))
        );
    }

    #[test]
    fn a_renew_before_not_shorter_than_the_validity_generates_no_renewal() {
        let mut s = spec("v1.34.4");
        s.certificates.auto_renew = true;
        let nodes = cluster("v1.34.4", 300);
        // (renewBefore, validity a renewal gives, generates a renewal for expiry)
        let one_year = RenewalValidity::KUBEADM_DEFAULT;
        let ten_days = RenewalValidity {
            period: SignedDuration::from_hours(240),
            from_config: true,
        };
        let table = [
            ("9999d", one_year, false),
            ("365d", one_year, false),
            ("8760h", one_year, false),
            ("364d", one_year, true),
            ("30d", ten_days, false),
            ("10d", ten_days, false),
            ("9d", ten_days, true),
        ];
        for (before, validity, renews) in table {
            s.certificates.renew_before = before.into();
            let d = decide(&Input {
                spec: &s,
                handled_rotation: 0,
                nodes: &nodes,
                generated: &[],
                renewal_validity: validity,
                now: now(),
            });
            let certs_due = 300 * 86_400 <= parse_renew_before(before).unwrap();
            match (renews, certs_due) {
                (true, true) => {
                    assert!(d.generate.is_some(), "{before} on {validity:?}: {d:?}");
                    assert_eq!(d.in_sync.1, "CertificatesDue", "{before}");
                }
                (true, false) | (false, false) => {
                    assert_eq!(d.generate, None, "{before}: not due");
                    assert!(d.in_sync.0, "{before}: {:?}", d.in_sync);
                }
                (false, true) => {
                    assert_eq!(d.generate, None, "{before} on {validity:?}: {d:?}");
                    let (w, why) = d.waiting.clone().expect("waiting");
                    assert_eq!(w, Waiting::RenewBeforeTooLong, "{before}");
                    assert_eq!(d.in_sync.1, "RenewBeforeTooLong", "{before}");
                    assert!(
                        why.contains(&format!("renewBefore {before} is not shorter than the"))
                            && why.contains(validity.source())
                            && why.contains("for example 30d"),
                        "{why}"
                    );
                }
            }
        }
        // The message names the period the way renewBefore writes one.
        let why = renew_before_too_long("9999d", one_year).unwrap();
        assert!(why.contains("the 365d a renewal gives"), "{why}");
        let why = renew_before_too_long("30d", ten_days).unwrap();
        assert!(why.contains("the 10d a renewal gives"), "{why}");
        assert_eq!(renew_before_too_long("364d", one_year), None);

        // Without autoRenew nothing is generated either way, but InSync says why.
        s.certificates.auto_renew = false;
        s.certificates.renew_before = "9999d".into();
        let d = decide_with(&s, 0, &nodes, &[]);
        assert_eq!(d.waiting, None);
        assert_eq!(d.in_sync.1, "RenewBeforeTooLong");
    }

    #[test]
    fn a_due_ca_alone_generates_nothing() {
        let mut s = spec("v1.34.4");
        s.certificates.auto_renew = true;
        let nodes = vec![node(
            "cp-1",
            true,
            "v1.34.4",
            Some(vec![
                cert("ca", 1),
                cert("etcd-ca", 1),
                cert("apiserver", 300),
            ]),
        )];
        let d = decide_with(&s, 0, &nodes, &[]);
        assert_eq!(d.generate, None);
        assert!(d.in_sync.0);
    }

    #[test]
    fn upgrade_comes_before_renewal() {
        let mut s = spec("v1.35.0");
        s.certificates.rotation = 1;
        let d = decide_with(&s, 0, &cluster("v1.34.4", 300), &[]);
        assert_eq!(d.generate.map(|g| g.kind), Some(Kind::Upgrade));
        assert_eq!(
            d.certificates.handled_rotation, 0,
            "the rotation waits for its turn"
        );
    }

    #[test]
    fn nodes_ahead_of_desired_are_not_in_sync_but_not_downgraded() {
        let d = decide_with(&spec("v1.34.4"), 0, &cluster("v1.34.5", 300), &[]);
        assert_eq!(d.generate, None);
        assert!(!d.in_sync.0);
    }

    #[test]
    fn without_reports_auto_renew_waits_for_them() {
        let mut s = spec("v1.34.4");
        s.certificates.auto_renew = true;
        let nodes = vec![node("cp-1", true, "v1.34.4", None)];
        let d = decide_with(&s, 0, &nodes, &[]);
        assert_eq!(d.waiting.map(|w| w.0), Some(Waiting::NodeReports));
    }

    #[test]
    fn a_followed_package_behind_the_version_is_drift_and_generates_the_upgrade() {
        let mut nodes = cluster("v1.34.4", 300);
        nodes[1].packages = vec![
            package("kubeadm", "1.34.4-1.1"),
            package("kubelet", "1.34.4-1.1"),
            package("kubectl", "1.34.1-1.1"),
        ];
        let d = decide_with(&spec("v1.34.4"), 0, &nodes, &[]);
        assert_eq!(d.in_sync.1, "PackageDrift", "{:?}", d.in_sync);
        assert!(!d.in_sync.0);
        assert!(
            d.in_sync.2.contains("w-1: kubectl 1.34.1-1.1"),
            "{}",
            d.in_sync.2
        );
        assert_eq!(
            d.versions.nodes_at_desired, 2,
            "the kubelets are at the version"
        );
        let g = d.generate.expect("an upgrade moving the packages");
        assert_eq!(g.name, "lifecycle-upgrade-v1-34-4");
        assert_eq!(g.spec.upgrade.unwrap().packages, FOLLOWED_PACKAGES.to_vec());
        assert_eq!(
            g.reason,
            "1 of 2 nodes behind v1.34.4, 1 only in their packages (w-1: kubectl 1.34.1-1.1)"
        );
        // That upgrade already ran and the package is still behind: nothing again.
        let done = [Generated {
            name: upgrade_name("v1.34.4"),
            kind: Kind::Upgrade,
            phase: OperationPhase::Succeeded,
            progress: Some("2/2".into()),
            not_done: 0,
            version: None,
            held: None,
            reboot_node: None,
            policy_hold: None,
            reason: String::new(),
        }];
        let d = decide_with(&spec("v1.34.4"), 0, &nodes, &done);
        assert_eq!(d.generate, None);
        assert_eq!(
            d.waiting.map(|w| w.0),
            Some(Waiting::OperationFinishedWithoutEffect)
        );

        // LeaveAlone: packages are someone else's business.
        let mut s = spec("v1.34.4");
        s.packages = PackagePolicy::LeaveAlone;
        let d = decide_with(&s, 0, &nodes, &[]);
        assert!(d.in_sync.0, "{:?}", d.in_sync);
        assert_eq!(d.generate, None);
    }

    #[test]
    fn packages_not_followed_ahead_or_unreadable_are_no_drift() {
        let mut nodes = cluster("v1.34.4", 300);
        nodes[0].packages = vec![
            package("cri-tools", "1.33.0-1.1"),     // not moved by an upgrade
            package("kubernetes-cni", "1.7.1-1.1"), // not a Kubernetes version at all
            package("kubectl", "1.35.0-1.1"),       // ahead: never downgraded
            package("kubeadm", "1.34.4~custom-1"),  // not a Kubernetes version
        ];
        nodes[1].packages = vec![package("kubelet", "1.34.4-1.1")];
        let d = decide_with(&spec("v1.34.4"), 0, &nodes, &[]);
        assert!(d.in_sync.0, "{:?}", d.in_sync);
        assert_eq!(d.generate, None);
    }

    #[test]
    fn kubelet_and_package_lag_are_counted_once_per_node() {
        let mut nodes = cluster("v1.34.4", 300);
        nodes[0].packages = vec![package("kubeadm", "1.34.4-1.1")];
        nodes[1].packages = vec![package("kubeadm", "1.34.4-1.1")];
        nodes[1].kubelet_version = Some("v1.34.3".into());
        nodes[1].packages.push(package("kubelet", "1.34.3-1.1"));
        let d = decide_with(&spec("v1.34.4"), 0, &nodes, &[]);
        assert_eq!(d.in_sync.1, "VersionDrift");
        assert_eq!(
            d.in_sync.2,
            "1/2 nodes at v1.34.4 (1 behind, 0 not reporting a version)"
        );
        assert_eq!(d.generate.unwrap().reason, "1 of 2 nodes behind v1.34.4");
    }

    #[test]
    fn the_next_decision_by_time_alone_is_when_a_certificate_becomes_due() {
        let d = decide_with(&spec("v1.34.4"), 0, &cluster("v1.34.4", 300), &[]);
        assert_eq!(
            d.wake_at,
            Some(now() + SignedDuration::from_hours(24 * 270))
        );
        // Already due: nothing to wait for (the decision has acted on it).
        let d = decide_with(&spec("v1.34.4"), 0, &cluster("v1.34.4", 10), &[]);
        assert_eq!(d.wake_at, None);
        // No certificates reported: no time to wake at.
        let d = decide_with(
            &spec("v1.34.4"),
            0,
            &[node("cp-1", true, "v1.34.4", None)],
            &[],
        );
        assert_eq!(d.wake_at, None);
    }

    #[test]
    fn nodes_that_need_a_reboot_are_counted_and_named_without_changing_sync() {
        let need = |required: bool| {
            Some(RebootNeed {
                required,
                reasons: if required {
                    vec!["/run/reboot-required is present".into()]
                } else {
                    vec![]
                },
                packages: vec![],
            })
        };
        // (reboot of each node, required, named, reported, summary's reboot part)
        type Case = (
            Vec<Option<RebootNeed>>,
            u32,
            Vec<&'static str>,
            u32,
            Option<&'static str>,
        );
        let cases: [Case; 4] = [
            (vec![None, None, None], 0, vec![], 0, None),
            (vec![need(false), need(false), None], 0, vec![], 2, None),
            (
                vec![need(false), need(true), None],
                1,
                vec!["n-1"],
                2,
                Some("1 node needs a reboot (n-1)"),
            ),
            (
                vec![need(true), need(true), need(true)],
                3,
                vec!["n-0", "n-1", "n-2"],
                3,
                Some("3 nodes need a reboot (n-0, n-1, n-2)"),
            ),
        ];
        for (reboots, required, named, reported, part) in cases {
            let nodes: Vec<NodeObservation> = reboots
                .iter()
                .enumerate()
                .map(|(i, r)| NodeObservation {
                    reboot: r.clone(),
                    ..node(&format!("n-{i}"), i == 0, "v1.34.4", None)
                })
                .collect();
            let d = decide_with(&spec("v1.34.4"), 0, &nodes, &[]);
            assert_eq!(d.reboots.required, required, "{reboots:?}");
            assert_eq!(d.reboots.nodes, named, "{reboots:?}");
            assert_eq!(d.reboots.nodes_reported, reported, "{reboots:?}");
            assert_eq!(
                d.generate, None,
                "a reboot need generates nothing by itself"
            );
            assert!(
                d.in_sync.0,
                "a reboot need is not version drift: {:?}",
                d.in_sync
            );
            let found = d.summary.split("; ").find(|p| p.contains("reboot"));
            assert_eq!(found, part, "{}", d.summary);
        }
        // More nodes than the status names: the rest are counted.
        let many: Vec<NodeObservation> = (0..25)
            .map(|i| NodeObservation {
                reboot: need(true),
                ..node(&format!("n-{i:02}"), false, "v1.34.4", None)
            })
            .collect();
        let d = decide_with(&spec("v1.34.4"), 0, &many, &[]);
        assert_eq!(d.reboots.required, 25);
        assert_eq!(d.reboots.nodes.len(), MAX_REBOOT_NODES);
        assert!(
            d.summary.contains("25 nodes need a reboot (n-00, ")
                && d.summary.contains(" and 5 more)"),
            "{}",
            d.summary
        );
    }

    #[test]
    fn with_reboots_required_one_node_at_a_time_is_rebooted_and_a_reboot_that_did_not_help_waits() {
        let need = |reason: &str| {
            Some(RebootNeed {
                required: true,
                reasons: vec![reason.into()],
                packages: vec![],
            })
        };
        // cp-1 and w-2 need a reboot, w-1 does not.
        let nodes = |cp_reason: Option<&str>| {
            vec![
                NodeObservation {
                    reboot: cp_reason.and_then(need),
                    boot_id: Some("boot-cp".into()),
                    ..node("cp-1", true, "v1.34.4", None)
                },
                NodeObservation {
                    reboot: Some(RebootNeed {
                        required: false,
                        reasons: vec![],
                        packages: vec![],
                    }),
                    boot_id: Some("boot-w1".into()),
                    ..node("w-1", false, "v1.34.4", None)
                },
                NodeObservation {
                    reboot: need("/run/reboot-required is present (asked for by libc6)"),
                    boot_id: Some("boot-w2".into()),
                    ..node("w-2", false, "v1.34.4", None)
                },
            ]
        };
        let gen_reboot = |node: &str, boot: &str, phase: OperationPhase, reason: &str| Generated {
            name: reboot_name(node, Some(boot)),
            kind: Kind::Reboot,
            phase,
            progress: None,
            not_done: 0,
            version: None,
            held: None,
            reboot_node: Some(node.into()),
            policy_hold: None,
            reason: reason.into(),
        };
        let w2_reason =
            "node w-2 needs a reboot: /run/reboot-required is present (asked for by libc6)";
        let mut required = spec("v1.34.4");
        required.reboots.when = RebootWhen::Required;
        required.reboots.blocking_pod_selector = Some(Default::default());
        let never = spec("v1.34.4");
        // (spec, the control plane's need, generated before, expected: generated node or
        // what generation waits for)
        type Case<'a> = (
            &'a ClusterLifecycleSpec,
            Option<&'static str>,
            Vec<Generated>,
            Result<&'static str, Waiting>,
        );
        let cases: Vec<Case> = vec![
            // Control-plane nodes first.
            (&required, Some("kernel 6.1.0-29"), vec![], Ok("cp-1")),
            (&required, None, vec![], Ok("w-2")),
            // `Never` (the default) counts and generates nothing.
            (&never, None, vec![], Err(Waiting::Paused)),
            // The one for this boot ended, and the node has not rebooted since.
            (
                &required,
                None,
                vec![gen_reboot(
                    "w-2",
                    "boot-w2",
                    OperationPhase::Failed,
                    w2_reason,
                )],
                Err(Waiting::OperationFinishedWithoutEffect),
            ),
            // The last reboot of w-2 (an earlier boot) succeeded and it asks again for the
            // same reason: a person looks.
            (
                &required,
                None,
                vec![gen_reboot(
                    "w-2",
                    "boot-w2-old",
                    OperationPhase::Succeeded,
                    w2_reason,
                )],
                Err(Waiting::RebootDidNotClear),
            ),
            // ... for another reason: a new need, rebooted.
            (
                &required,
                None,
                vec![gen_reboot(
                    "w-2",
                    "boot-w2-old",
                    OperationPhase::Succeeded,
                    "node w-2 needs a reboot: kernel 6.1.0-28",
                )],
                Ok("w-2"),
            ),
        ];
        for (spec, cp_reason, generated, expected) in cases {
            let observed = nodes(cp_reason);
            let d = decide_with(spec, 0, &observed, &generated);
            let what = format!("{:?} {cp_reason:?} {generated:?}", spec.reboots.when);
            match expected {
                Ok(node) => {
                    let g = d.generate.expect(&what);
                    assert_eq!(g.kind, Kind::Reboot, "{what}");
                    let boot = observed
                        .iter()
                        .find(|n| n.name == node)
                        .unwrap()
                        .boot_id
                        .clone();
                    assert_eq!(g.name, reboot_name(node, boot.as_deref()), "{what}");
                    let reboot = g.spec.reboot.expect("a reboot");
                    assert_eq!(reboot.nodes, vec![node.to_string()], "{what}");
                    assert_eq!(
                        reboot.blocking_pod_selector, spec.reboots.blocking_pod_selector,
                        "the gates are copied: {what}"
                    );
                    assert!(
                        g.reason
                            .starts_with(&format!("node {node} needs a reboot: "))
                    );
                    assert!(
                        d.summary.contains("generating reboot Operation"),
                        "{}",
                        d.summary
                    );
                    assert_eq!(
                        (d.in_sync.0, d.in_sync.1),
                        (false, "RebootRequired"),
                        "{what}"
                    );
                }
                Err(Waiting::Paused) => {
                    assert_eq!((d.generate, d.waiting), (None, None), "{what}");
                }
                Err(waiting) => {
                    assert_eq!(d.generate, None, "{what}");
                    let (w, why) = d.waiting.expect(&what);
                    assert_eq!(w, waiting, "{what}");
                    assert!(
                        why.contains("w-2") && why.contains("kubectl delete operation"),
                        "{why}"
                    );
                }
            }
        }
        // Names: one per node and boot, short enough for any node name.
        assert_ne!(reboot_name("w-2", Some("a")), reboot_name("w-2", Some("b")));
        assert_eq!(reboot_name("w-2", Some("a")), reboot_name("w-2", Some("a")));
        let long = reboot_name(&"n".repeat(253), Some("a"));
        assert!(
            long.len() <= 253 && long.starts_with("lifecycle-reboot-nnn"),
            "{long}"
        );
    }

    #[test]
    fn a_generated_operation_held_by_policy_is_a_hold_not_a_block() {
        let open = |policy_hold: Option<&str>| Generated {
            name: "lifecycle-renew-r1".into(),
            kind: Kind::RenewCertificates,
            phase: OperationPhase::Blocked,
            progress: None,
            not_done: 0,
            version: None,
            held: None,
            reboot_node: None,
            policy_hold: policy_hold.map(Into::into),
            reason: String::new(),
        };
        let window = "policy denied the operation before group workers (node w-1): no maintenance window is open";
        let d = decide_with(
            &spec("v1.34.4"),
            0,
            &cluster("v1.34.4", 300),
            &[open(Some(window))],
        );
        let (w, why) = d.waiting.expect("waiting");
        assert_eq!(w, Waiting::PolicyHold);
        assert!(
            why.contains("goes on by itself") && why.ends_with(window),
            "{why}"
        );
        let d = decide_with(&spec("v1.34.4"), 0, &cluster("v1.34.4", 300), &[open(None)]);
        assert_eq!(d.waiting.map(|w| w.0), Some(Waiting::BlockedOperation));
    }
}
