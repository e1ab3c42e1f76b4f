//! Operation spec + node snapshot → the frozen plan and one NodeTask spec per planned node.
//!
//! Groups, in order:
//! - `upgrade`: `control-plane-first` (one Ready control-plane node, `kubeadm upgrade
//!   apply`), `control-plane` (the others, `kubeadm upgrade node`), `workers`. Each
//!   control-plane node starts with the etcd health check, and the first one also takes
//!   an etcd snapshot, before it is cordoned (`spec.upgrade.etcd` turns either off).
//! - `renewCertificates`: `control-plane`.
//! - `reboot`: `control-plane` (one at a time), `workers`. Each node is cordoned and
//!   drained, then the `reboot` plugin asks it to reboot in a step that waits for the new
//!   boot (`awaitNewBoot`), then the node must be Ready before it is uncordoned (and, for a
//!   control plane, its API server must answer).
//! - `custom`: the user's groups, in their order; a node belongs to the first group whose
//!   selector it matches.
//!
//! Within a group nodes are ordered control-plane first, then by name. Every node must
//! match the Operation's `nodeSelector`. Control-plane groups run one node at a time;
//! other groups run `rollout.maxUnavailable` nodes at a time (see [`crate::rollout`]).
//!
//! Once a plan is frozen (stored in the Operation's status), [`plan`] given that plan
//! returns it unchanged and only rebuilds the task specs: nodes added to the cluster
//! later are not pulled in.

use std::collections::{BTreeMap, BTreeSet};

use bosun_api::labels;
use bosun_api::node_task::NodeTaskSpec;
use bosun_api::operation::{
    CustomSpec, ExecutionMode, KubePackage, OperationSpec, Plan, PlannedGroup, RebootSpec,
    RenewCertificatesSpec, RunsOn, Step, UpgradeSpec,
};
use bosun_api::plugin::well_known;
use serde_json::json;

use crate::nodes::NodeInfo;
use crate::rollout::{MaxUnavailable, MaxUnavailableError};
use crate::selector::{self, SelectorError};

/// Group names of the built-in Operation kinds.
pub mod groups {
    /// The control-plane node that runs `kubeadm upgrade apply`.
    pub const CONTROL_PLANE_FIRST: &str = "control-plane-first";
    /// The (other) control-plane nodes.
    pub const CONTROL_PLANE: &str = "control-plane";
    /// Every other node.
    pub const WORKERS: &str = "workers";
}

/// Controller-side actions (run by the controller through the API, not by a plugin).
pub mod controller_actions {
    pub const CORDON: &str = "cordon";
    pub const DRAIN: &str = "drain";
    pub const UNCORDON: &str = "uncordon";
    pub const WAIT_NODE_READY: &str = "waitNodeReady";
    pub const WAIT_API_SERVER: &str = "waitApiServer";
}

/// Why an Operation cannot be planned. Each message says what was expected, what was
/// found and what to do; the controller puts it in the Operation's status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "the Operation names no kind of work: set one of spec.upgrade, spec.renewCertificates, spec.reboot or spec.custom"
    )]
    NoKind,
    #[error(
        "the Operation names {kinds:?}, expected exactly one kind of work: create one Operation per kind"
    )]
    SeveralKinds { kinds: Vec<&'static str> },
    #[error("{context}: {source}")]
    Selector {
        context: String,
        #[source]
        source: SelectorError,
    },
    #[error(transparent)]
    MaxUnavailable(#[from] MaxUnavailableError),
    #[error(
        "no node matches the Operation ({total} nodes in the cluster, none selected): check spec.nodeSelector and the groups' nodeSelectors against the nodes' labels"
    )]
    NoMatchingNodes { total: usize },
    #[error(
        "{kind} needs control-plane nodes (label node-role.kubernetes.io/control-plane), found none among the {selected} selected nodes: label the control-plane nodes or fix spec.nodeSelector"
    )]
    NoControlPlane { kind: &'static str, selected: usize },
    #[error(
        "kubeadm upgrade apply needs a Ready control-plane node, found control-plane nodes {names:?} and none is Ready: make one Ready, then recreate the Operation"
    )]
    NoReadyControlPlane { names: Vec<String> },
    #[error(
        "the frozen plan has group {group:?}, which this Operation's spec does not define: the plan and spec disagree; create a new Operation"
    )]
    FrozenGroupUnknown { group: String },
}

/// One NodeTask to create.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTask {
    /// The NodeTask's object name (see [`task_name`]).
    pub name: String,
    /// Labels naming the operation, node and group (values shortened to label limits).
    pub labels: BTreeMap<String, String>,
    pub spec: NodeTaskSpec,
}

/// The planner's result.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOutput {
    /// The plan to freeze in status (or the already frozen one).
    pub plan: Plan,
    /// One task per planned node, in plan order.
    pub tasks: Vec<PlannedTask>,
    /// Things a person should know (NotReady nodes, nodes left cordoned, empty groups).
    pub notes: Vec<String>,
}

enum Kind<'a> {
    Upgrade(&'a UpgradeSpec),
    Renew(&'a RenewCertificatesSpec),
    Reboot(&'a RebootSpec),
    Custom(&'a CustomSpec),
}

fn kind_of(spec: &OperationSpec) -> Result<Kind<'_>, PlanError> {
    let mut kinds = Vec::new();
    if spec.upgrade.is_some() {
        kinds.push("upgrade");
    }
    if spec.renew_certificates.is_some() {
        kinds.push("renewCertificates");
    }
    if spec.reboot.is_some() {
        kinds.push("reboot");
    }
    if spec.custom.is_some() {
        kinds.push("custom");
    }
    if kinds.len() > 1 {
        return Err(PlanError::SeveralKinds { kinds });
    }
    if let Some(u) = &spec.upgrade {
        Ok(Kind::Upgrade(u))
    } else if let Some(r) = &spec.renew_certificates {
        Ok(Kind::Renew(r))
    } else if let Some(r) = &spec.reboot {
        Ok(Kind::Reboot(r))
    } else if let Some(c) = &spec.custom {
        Ok(Kind::Custom(c))
    } else {
        Err(PlanError::NoKind)
    }
}

/// Plans `operation` over `nodes`.
///
/// Guarantees: deterministic (same input, same output, whatever the order of `nodes`);
/// every planned node appears in exactly one group; control-plane groups have
/// `max_parallel == 1`; with `frozen` given, the returned plan equals it.
pub fn plan(
    operation: &str,
    spec: &OperationSpec,
    nodes: &[NodeInfo],
    frozen: Option<&Plan>,
) -> Result<PlanOutput, PlanError> {
    plan_identified(operation, None, spec, nodes, frozen)
}

/// Which Operation a plan is for, beyond its name: what the controller reads from the stored
/// object.
#[derive(Clone, Debug)]
pub struct OperationIdentity {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.creationTimestamp`, RFC 3339 (`2026-12-06T15:00:00Z`).
    pub created: String,
}

/// [`plan()`] for one Operation (the controller's call): what must name this Operation and
/// not another of the same name created later (the etcd snapshot's label) carries the start
/// of its UID, and a renewal renews only certificates issued before the Operation was
/// created, so its step run again renews nothing more.
pub fn plan_identified(
    operation: &str,
    identity: Option<&OperationIdentity>,
    spec: &OperationSpec,
    nodes: &[NodeInfo],
    frozen: Option<&Plan>,
) -> Result<PlanOutput, PlanError> {
    let kind = kind_of(spec)?;
    let max_unavailable = MaxUnavailable::parse(&spec.rollout.max_unavailable)?;
    let by_name: BTreeMap<&str, &NodeInfo> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut notes = Vec::new();

    let plan = match frozen {
        Some(plan) => plan.clone(),
        None => {
            let selected = select(spec, nodes)?;
            let plan = match &kind {
                Kind::Upgrade(_) => plan_upgrade(spec, &selected, max_unavailable, &mut notes)?,
                Kind::Renew(_) => plan_renew(&selected)?,
                Kind::Reboot(r) => plan_reboot(
                    &only_named(&selected, &r.nodes, &mut notes),
                    max_unavailable,
                ),
                Kind::Custom(custom) => {
                    plan_custom(custom, &selected, max_unavailable, &mut notes)?
                }
            };
            if plan.node_names().next().is_none() {
                return Err(PlanError::NoMatchingNodes { total: nodes.len() });
            }
            for node in plan.node_names().filter_map(|n| by_name.get(n)) {
                if !node.ready {
                    notes.push(format!(
                        "node {} is NotReady: its task will wait at the readiness gate",
                        node.name
                    ));
                }
                match (&node.cordoned_by, node.unschedulable) {
                    (_, false) => {}
                    (None, true) => notes.push(format!(
                        "node {} was already cordoned: Bosun leaves it cordoned afterwards (no uncordon step)",
                        node.name
                    )),
                    (Some(task), true) => notes.push(format!(
                        "node {} is still cordoned by Bosun (NodeTask {task}, which never uncordoned it): this Operation uncordons it when its task is done",
                        node.name
                    )),
                }
            }
            plan
        }
    };

    // The etcd health check expects one member per control-plane Node of the cluster (not
    // only the selected ones): a stacked etcd has a member on each.
    let on = Cluster {
        snapshot_label: snapshot_label(operation, identity.map(|i| i.uid.as_str())),
        created: identity.map(|i| i.created.clone()),
        control_planes: nodes.iter().filter(|n| n.is_control_plane()).count(),
    };
    let mut tasks = Vec::new();
    for group in &plan.groups {
        for node_name in &group.nodes {
            // A node missing from the snapshot (it vanished) keeps its planned steps; the
            // scheduler marks its task Invalid.
            // A person's cordon stays; one Bosun made and never undid is undone.
            let was_cordoned = by_name
                .get(node_name.as_str())
                .is_some_and(|n| n.unschedulable && n.cordoned_by.is_none());
            let control_plane = group.control_plane_nodes.contains(node_name);
            let steps = steps_for(&kind, &on, &group.name, control_plane, was_cordoned)?;
            tasks.push(PlannedTask {
                name: task_name(operation, node_name),
                labels: BTreeMap::from([
                    (labels::OPERATION.to_string(), label_value(operation)),
                    (labels::NODE.to_string(), label_value(node_name)),
                    (labels::GROUP.to_string(), label_value(&group.name)),
                ]),
                spec: NodeTaskSpec {
                    operation: operation.to_string(),
                    node_name: node_name.clone(),
                    group: group.name.clone(),
                    steps,
                    dry_run: spec.execution_mode == ExecutionMode::DryRun,
                    step_timeout_seconds: spec.step_timeout_seconds,
                    approve: false,
                    recovery: None,
                },
            });
        }
    }
    Ok(PlanOutput { plan, tasks, notes })
}

/// Nodes matching the Operation's selector, control-plane first, then by name.
fn select<'a>(spec: &OperationSpec, nodes: &'a [NodeInfo]) -> Result<Vec<&'a NodeInfo>, PlanError> {
    let mut selected = Vec::new();
    for node in nodes {
        let keep = match &spec.node_selector {
            None => true,
            Some(sel) => {
                selector::matches(sel, &node.labels).map_err(|source| PlanError::Selector {
                    context: "spec.nodeSelector".into(),
                    source,
                })?
            }
        };
        if keep {
            selected.push(node);
        }
    }
    selected
        .sort_by(|a, b| (!a.is_control_plane(), &a.name).cmp(&(!b.is_control_plane(), &b.name)));
    selected.dedup_by(|a, b| a.name == b.name);
    Ok(selected)
}

fn names(nodes: &[&NodeInfo]) -> Vec<String> {
    nodes.iter().map(|n| n.name.clone()).collect()
}

fn plan_upgrade(
    spec: &OperationSpec,
    selected: &[&NodeInfo],
    max_unavailable: MaxUnavailable,
    notes: &mut Vec<String>,
) -> Result<Plan, PlanError> {
    let (control_plane, workers): (Vec<&NodeInfo>, Vec<&NodeInfo>) =
        selected.iter().copied().partition(|n| n.is_control_plane());
    let mut groups = Vec::new();
    if control_plane.is_empty() {
        // Upgrading a pool of workers after the control plane is fine, but only when the
        // user chose that with a selector; a cluster without control-plane labels is a
        // mistake to report.
        if spec.node_selector.is_none() || workers.is_empty() {
            return Err(PlanError::NoControlPlane {
                kind: "upgrade",
                selected: selected.len(),
            });
        }
        notes.push(
            "no control-plane node is selected: only workers are upgraded (kubeadm upgrade node), so the control plane must already run the target version"
                .into(),
        );
    } else {
        let first = control_plane
            .iter()
            .find(|n| n.ready && !n.unschedulable)
            .or_else(|| control_plane.iter().find(|n| n.ready))
            .ok_or_else(|| PlanError::NoReadyControlPlane {
                names: names(&control_plane),
            })?;
        groups.push(PlannedGroup {
            name: groups::CONTROL_PLANE_FIRST.into(),
            nodes: vec![first.name.clone()],
            max_parallel: 1,
            control_plane_nodes: vec![first.name.clone()],
        });
        let rest: Vec<String> = control_plane
            .iter()
            .filter(|n| n.name != first.name)
            .map(|n| n.name.clone())
            .collect();
        groups.extend(control_plane_group(rest));
    }
    groups.extend(workers_group(&workers, max_unavailable));
    Ok(Plan { groups })
}

/// The group `control-plane` of `nodes`, one at a time; none when there are none.
fn control_plane_group(nodes: Vec<String>) -> Option<PlannedGroup> {
    (!nodes.is_empty()).then(|| PlannedGroup {
        name: groups::CONTROL_PLANE.into(),
        nodes: nodes.clone(),
        max_parallel: 1,
        control_plane_nodes: nodes,
    })
}

/// The group `workers` of `workers`, `maxUnavailable` at a time; none when there are none.
fn workers_group(workers: &[&NodeInfo], max_unavailable: MaxUnavailable) -> Option<PlannedGroup> {
    (!workers.is_empty()).then(|| PlannedGroup {
        name: groups::WORKERS.into(),
        nodes: names(workers),
        max_parallel: max_unavailable.resolve(workers.len()),
        control_plane_nodes: Vec::new(),
    })
}

fn plan_renew(selected: &[&NodeInfo]) -> Result<Plan, PlanError> {
    let control_plane: Vec<&NodeInfo> = selected
        .iter()
        .copied()
        .filter(|n| n.is_control_plane())
        .collect();
    if control_plane.is_empty() {
        return Err(PlanError::NoControlPlane {
            kind: "renewCertificates",
            selected: selected.len(),
        });
    }
    let nodes = names(&control_plane);
    Ok(Plan {
        groups: vec![PlannedGroup {
            name: groups::CONTROL_PLANE.into(),
            nodes: nodes.clone(),
            max_parallel: 1,
            control_plane_nodes: nodes,
        }],
    })
}

/// Of `selected`, the nodes `names` lists (all of them when it is empty). A listed node that
/// is not selected (absent, or refused by `spec.nodeSelector`) is a note: it is not rebooted.
fn only_named<'a>(
    selected: &[&'a NodeInfo],
    names: &[String],
    notes: &mut Vec<String>,
) -> Vec<&'a NodeInfo> {
    if names.is_empty() {
        return selected.to_vec();
    }
    for name in names
        .iter()
        .filter(|n| !selected.iter().any(|s| &s.name == *n))
    {
        notes.push(format!(
            "spec.reboot.nodes names {name}, which is not a node of the cluster that spec.nodeSelector admits: it is not rebooted"
        ));
    }
    selected
        .iter()
        .copied()
        .filter(|s| names.contains(&s.name))
        .collect()
}

/// Control-plane nodes one at a time, then the workers `maxUnavailable` at a time; either
/// group is left out when no selected node is in it.
fn plan_reboot(selected: &[&NodeInfo], max_unavailable: MaxUnavailable) -> Plan {
    let (control_plane, workers): (Vec<&NodeInfo>, Vec<&NodeInfo>) =
        selected.iter().copied().partition(|n| n.is_control_plane());
    let groups = control_plane_group(names(&control_plane))
        .into_iter()
        .chain(workers_group(&workers, max_unavailable))
        .collect();
    Plan { groups }
}

fn plan_custom(
    custom: &CustomSpec,
    selected: &[&NodeInfo],
    max_unavailable: MaxUnavailable,
    notes: &mut Vec<String>,
) -> Result<Plan, PlanError> {
    let mut claimed: BTreeSet<&str> = BTreeSet::new();
    let mut groups = Vec::new();
    for group in &custom.groups {
        let mut members = Vec::new();
        for node in selected {
            if claimed.contains(node.name.as_str()) {
                continue;
            }
            let matches = match &group.node_selector {
                None => true,
                Some(sel) => {
                    selector::matches(sel, &node.labels).map_err(|source| PlanError::Selector {
                        context: format!("spec.custom.groups[{}].nodeSelector", group.name),
                        source,
                    })?
                }
            };
            if matches {
                claimed.insert(node.name.as_str());
                members.push(*node);
            }
        }
        if members.is_empty() {
            notes.push(format!(
                "group {} matches no node (that an earlier group did not take): it is skipped",
                group.name
            ));
        }
        let control_plane_nodes: Vec<String> = members
            .iter()
            .filter(|n| n.is_control_plane())
            .map(|n| n.name.clone())
            .collect();
        let workers = members.len() - control_plane_nodes.len();
        groups.push(PlannedGroup {
            name: group.name.clone(),
            nodes: names(&members),
            // maxUnavailable counts every node of the group; control-plane nodes are
            // additionally limited to one at a time by the scheduler.
            max_parallel: if workers == 0 {
                1
            } else {
                max_unavailable.resolve(members.len())
            },
            control_plane_nodes,
        });
    }
    let unclaimed: Vec<&str> = selected
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !claimed.contains(n))
        .collect();
    if !unclaimed.is_empty() {
        notes.push(format!(
            "nodes {unclaimed:?} match no group and take no part"
        ));
    }
    Ok(Plan { groups })
}

fn controller_step(name: &str, action: &str) -> Step {
    Step {
        name: name.into(),
        runs_on: RunsOn::Controller,
        plugin: None,
        action: action.into(),
        params: None,
        await_new_boot: false,
    }
}

fn agent_step(name: &str, plugin: &str, action: &str, params: serde_json::Value) -> Step {
    Step {
        name: name.into(),
        runs_on: RunsOn::Agent,
        plugin: Some(plugin.into()),
        action: action.into(),
        params: Some(params),
        await_new_boot: false,
    }
}

/// What the steps of a task need to know about the Operation and the cluster.
struct Cluster {
    /// See [`snapshot_label`].
    snapshot_label: String,
    /// The Operation's creation time: a renewal's `issuedBefore`.
    created: Option<String>,
    control_planes: usize,
}

/// The etcd steps at the start of a control-plane node's upgrade, before it is cordoned:
/// the health check on every control plane and the snapshot on the first, each turned off
/// by `spec.upgrade.etcd`.
fn etcd_steps(upgrade: &UpgradeSpec, on: &Cluster, group: &str, control_plane: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    if control_plane && upgrade.etcd.health_check {
        steps.push(agent_step(
            "etcd-health",
            well_known::ETCD,
            "health",
            json!({"expectedMembers": on.control_planes}),
        ));
    }
    if group == groups::CONTROL_PLANE_FIRST && upgrade.etcd.snapshot {
        steps.push(agent_step(
            "etcd-snapshot",
            well_known::ETCD,
            "snapshot",
            json!({"keep": upgrade.etcd.keep_snapshots, "label": on.snapshot_label}),
        ));
    }
    steps
}

/// The steps of one node's task.
fn steps_for(
    kind: &Kind<'_>,
    on: &Cluster,
    group: &str,
    control_plane: bool,
    was_cordoned: bool,
) -> Result<Vec<Step>, PlanError> {
    match kind {
        Kind::Upgrade(upgrade) => upgrade_steps(upgrade, on, group, control_plane, was_cordoned),
        Kind::Renew(renew) => renew_steps(renew, on, group),
        Kind::Reboot(_) => reboot_steps(group, control_plane, was_cordoned),
        Kind::Custom(custom) => custom
            .groups
            .iter()
            .find(|g| g.name == group)
            .map(|g| g.steps.clone())
            .ok_or_else(|| PlanError::FrozenGroupUnknown {
                group: group.into(),
            }),
    }
}

/// An upgrade's steps on one node: etcd's, cordon and drain, kubeadm, `kubeadm upgrade
/// apply` (the first control plane) or `node`, the kubelet and kubectl packages, the
/// kubelet's restart, and the waits.
fn upgrade_steps(
    upgrade: &UpgradeSpec,
    on: &Cluster,
    group: &str,
    control_plane: bool,
    was_cordoned: bool,
) -> Result<Vec<Step>, PlanError> {
    use controller_actions::*;
    let version = &upgrade.kubernetes_version;
    let kubeadm_action = match group {
        groups::CONTROL_PLANE_FIRST => "apply",
        groups::CONTROL_PLANE | groups::WORKERS => "node",
        other => {
            return Err(PlanError::FrozenGroupUnknown {
                group: other.into(),
            });
        }
    };
    let mut steps = etcd_steps(upgrade, on, group, control_plane);
    steps.push(controller_step("cordon", CORDON));
    steps.push(controller_step("drain", DRAIN));
    if upgrade.packages.contains(&KubePackage::Kubeadm) {
        steps.push(agent_step(
            "upgrade-kubeadm",
            well_known::PACKAGES,
            "install",
            json!({"packages": ["kubeadm"], "kubernetesVersion": version}),
        ));
    }
    steps.push(agent_step(
        "kubeadm-upgrade",
        well_known::KUBEADM_UPGRADE,
        kubeadm_action,
        json!({"kubernetesVersion": version}),
    ));
    let after: Vec<&str> = [KubePackage::Kubelet, KubePackage::Kubectl]
        .into_iter()
        .filter(|p| upgrade.packages.contains(p))
        .map(KubePackage::as_str)
        .collect();
    if !after.is_empty() {
        steps.push(agent_step(
            "upgrade-kubelet",
            well_known::PACKAGES,
            "install",
            json!({"packages": after, "kubernetesVersion": version}),
        ));
    }
    steps.push(agent_step(
        "restart-kubelet",
        well_known::KUBELET,
        "restart",
        json!({}),
    ));
    steps.push(controller_step("wait-node-ready", WAIT_NODE_READY));
    if !was_cordoned {
        steps.push(controller_step("uncordon", UNCORDON));
    }
    if control_plane {
        steps.push(controller_step("wait-api-server", WAIT_API_SERVER));
    }
    Ok(steps)
}

/// A renewal's steps on one control-plane node.
fn renew_steps(
    renew: &RenewCertificatesSpec,
    on: &Cluster,
    group: &str,
) -> Result<Vec<Step>, PlanError> {
    use controller_actions::*;
    if group != groups::CONTROL_PLANE {
        return Err(PlanError::FrozenGroupUnknown {
            group: group.into(),
        });
    }
    let mut params = json!({"certificates": renew.certificates});
    if let Some(before) = &renew.renew_before {
        params["renewBefore"] = json!(before);
    }
    // Certificates renewed by this Operation are not renewed again when the step runs again.
    if let Some(created) = &on.created {
        params["issuedBefore"] = json!(created);
    }
    Ok(vec![
        agent_step("renew-certificates", well_known::CERTS, "renew", params),
        agent_step(
            "restart-control-plane",
            well_known::CERTS,
            "restart-control-plane",
            json!({}),
        ),
        controller_step("wait-api-server", WAIT_API_SERVER),
    ])
}

/// A reboot's steps on one node: cordon, drain, the reboot (awaiting the new boot), and the
/// waits.
fn reboot_steps(
    group: &str,
    control_plane: bool,
    was_cordoned: bool,
) -> Result<Vec<Step>, PlanError> {
    use controller_actions::*;
    if group != groups::CONTROL_PLANE && group != groups::WORKERS {
        return Err(PlanError::FrozenGroupUnknown {
            group: group.into(),
        });
    }
    let mut steps = vec![
        controller_step("cordon", CORDON),
        controller_step("drain", DRAIN),
        Step {
            await_new_boot: true,
            ..agent_step("reboot", well_known::REBOOT, "reboot", json!({}))
        },
        controller_step("wait-node-ready", WAIT_NODE_READY),
    ];
    if !was_cordoned {
        steps.push(controller_step("uncordon", UNCORDON));
    }
    if control_plane {
        steps.push(controller_step("wait-api-server", WAIT_API_SERVER));
    }
    Ok(steps)
}

/// The NodeTask object name for `node` in `operation`: `OPERATION-NODE` when that fits the
/// 253-character limit of object names, otherwise a prefix of it plus a hash of the whole,
/// so distinct pairs keep distinct names.
pub fn task_name(operation: &str, node: &str) -> String {
    shorten(&format!("{operation}-{node}"), 253)
}

/// The label of the etcd snapshot an upgrade takes: the Operation's name and the first 8
/// characters of its UID, so a snapshot step run again (an agent restart) finds the
/// snapshot it took, and an Operation created later under the same name does not take the
/// earlier one's for its own. Without a UID (plans outside a cluster), the name alone.
#[must_use]
pub fn snapshot_label(operation: &str, uid: Option<&str>) -> String {
    match uid {
        Some(uid) => {
            let short: String = uid
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(8)
                .collect::<String>()
                .to_ascii_lowercase();
            label_value(&format!("{operation}-{short}"))
        }
        None => label_value(operation),
    }
}

/// A label value: at most 63 characters, starting and ending with an alphanumeric (for a
/// value that starts and ends with one). Values that fit are kept as they are; longer ones
/// become a prefix plus a hash of the whole, as in [`task_name`].
///
/// This is how the planner writes the `bosun.dev/operation`, `bosun.dev/node` and
/// `bosun.dev/group` labels of a NodeTask: anything selecting NodeTasks by those labels
/// must put its value through this function too, or it never matches a long name.
pub fn label_value(value: &str) -> String {
    shorten(value, 63)
}

fn shorten(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_string();
    }
    let hash = format!("{:016x}", fnv1a(value.as_bytes()));
    let mut keep = max - hash.len() - 1;
    while !value.is_char_boundary(keep) {
        keep -= 1;
    }
    let prefix = value[..keep].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{prefix}-{hash}")
}

/// A stable 64-bit hash of `bytes` (FNV-1a), for names derived from data: the same on every
/// run and release, unlike std's hasher. Not a cryptographic hash.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    fnv1a(bytes)
}

/// FNV-1a, 64 bit: a stable hash (unlike std's, which may change between releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
