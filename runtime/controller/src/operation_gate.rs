//! The operation decision point: the policies asked about an Operation before its plan is
//! frozen ([`hold_before_planning`]) and before the first task of each group starts
//! ([`hold_groups`]). A deny blocks the Operation (phase Blocked, reason PolicyDenied) with
//! the policies' messages, and a Warning Event; Warn findings are Events too.
//!
//! Fail closed: until the Policy list has been read once nothing is decided (the reconcile
//! looks again soon, see [`retry_later`]); a Policy that does not compile denies.

use std::collections::BTreeSet;
use std::time::Duration;

use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use bosun_api::operation::{Operation, OperationStatus, Plan};
use bosun_cluster::events::Notice;
use bosun_cluster::policies::{PolicyWatch, SYNC_WAIT};
use bosun_cluster::readers::{
    cluster_annotations, cluster_version, control_plane, is_ready, operation_ref, roles_of,
};
use bosun_policy::Decision;
use bosun_policy::input::{ClusterState, NodeSummary, OperationInput, PlanGroup};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};

use crate::events::Events;
use crate::reconcile::Context;
use crate::time::set_condition;

/// The Event reason of a deny.
pub const REASON_DENIED: &str = "PolicyDenied";
/// The Event reason of Warn findings.
pub const REASON_WARNING: &str = "PolicyWarning";
/// The Event action of this decision point.
const ACTION: &str = "PolicyGate";

/// What a gate said about an Operation.
#[derive(Debug)]
pub struct Verdict {
    pub decision: Decision,
    /// The groups held back (empty before planning, where the whole Operation is).
    pub held_groups: BTreeSet<String>,
}

impl Verdict {
    /// One line: the deny messages, for status and the Event.
    pub fn message(&self, when: &str) -> String {
        format!(
            "policy denied the operation {when}: {} (policy set {}); fix the cause or the policy, and it proceeds on the next reconcile",
            self.decision.deny_messages().join("; "),
            self.decision.policy_set_digest
        )
    }

    /// Marks `status` Blocked with reason PolicyDenied and `message`.
    pub fn record(
        &self,
        status: &mut OperationStatus,
        message: &str,
        generation: Option<i64>,
        now: Timestamp,
    ) {
        status.phase = bosun_api::operation::OperationPhase::Blocked;
        status.message = Some(message.to_owned());
        set_condition(
            &mut status.conditions,
            "Blocked",
            true,
            "PolicyDenied",
            message,
            generation,
            now,
        );
        set_condition(
            &mut status.conditions,
            "Progressing",
            false,
            "PolicyDenied",
            message,
            generation,
            now,
        );
    }
}

/// Asks the operation policies about `op` with `plan` (about to be frozen, or frozen) and
/// `next_group`, with the Nodes as the controller's Node watch shows them (`caches`).
/// Returns the decision; warnings and audits are logged (and Warn findings published as
/// Events by the caller).
pub async fn decide(
    client: &Client,
    watch: &PolicyWatch,
    caches: &crate::cache::Caches,
    op: &Operation,
    plan: &Plan,
    next_group: Option<&str>,
) -> Result<Decision, bosun_cluster::Error> {
    let generation = watch.generation(SYNC_WAIT).await?;
    let mut all: Vec<Node> = caches.nodes().iter().map(|n| Node::clone(n)).collect();
    all.sort_by_key(|n| n.name_any());
    let planned: BTreeSet<&str> = plan.node_names().collect();
    let input = OperationInput {
        operation: operation_ref(op),
        plan: plan
            .groups
            .iter()
            .map(|g| PlanGroup {
                name: g.name.clone(),
                nodes: g.nodes.clone(),
            })
            .collect(),
        next_group: next_group.map(str::to_owned),
        nodes: all
            .iter()
            .filter(|n| planned.contains(n.name_any().as_str()))
            .map(|n| NodeSummary {
                name: n.name_any(),
                roles: roles_of(n),
                ready: is_ready(n),
                kubelet_version: n
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.kubelet_version.clone()),
            })
            .collect(),
        cluster: ClusterState {
            version: cluster_version(client).await,
            annotations: cluster_annotations(client).await,
            control_plane: control_plane(client, &all, None).await?,
        },
        now: Timestamp::now().to_string(),
    };
    let clock = std::time::Instant::now();
    let decision = generation.with_evaluator(|e| e.operation(&input));
    bosun_telemetry::metrics().gate_finished(bosun_telemetry::Gate::Policy, clock.elapsed());
    for w in &decision.warnings {
        tracing::warn!(operation = %op.name_any(), policy = %w.policy, message = %w.message, "policy warning");
    }
    for a in &decision.audits {
        tracing::info!(operation = %op.name_any(), policy = %a.policy, message = %a.message, "policy audit");
    }
    Ok(decision)
}

/// The operation gate before planning: `Some(verdict)` when the policies deny the
/// Operation with the plan it would get.
pub async fn before_planning(
    ctx: &Context,
    op: &Operation,
    plan: &Plan,
) -> Result<Option<Verdict>, bosun_cluster::Error> {
    let decision = decide(&ctx.client, &ctx.policies, &ctx.caches, op, plan, None).await?;
    warn_events(&ctx.events, op, &decision).await;
    Ok((!decision.allowed).then(|| Verdict {
        decision,
        held_groups: BTreeSet::new(),
    }))
}

/// The operation gate before each group: for every group whose first task is about to
/// start (no task of it has left Pending), asks the policies with `nextGroup` set. Returns
/// the groups held back, with the first deny.
pub async fn before_groups(
    ctx: &Context,
    op: &Operation,
    plan: &Plan,
    tasks: &crate::reconcile::Tasks,
    starting: &[String],
) -> Result<Option<Verdict>, bosun_cluster::Error> {
    let group_of = |node: &str| tasks.get(node).map(|t| t.spec.group.clone());
    let mut groups: Vec<String> = starting.iter().filter_map(|n| group_of(n)).collect();
    groups.dedup();
    let mut held = BTreeSet::new();
    let mut first: Option<Decision> = None;
    for group in groups {
        let fresh = tasks.values().filter(|t| t.spec.group == group).all(|t| {
            t.status.as_ref().map(|s| s.phase).unwrap_or_default() == NodeTaskPhase::Pending
        });
        if !fresh || held.contains(&group) {
            continue;
        }
        let decision = decide(
            &ctx.client,
            &ctx.policies,
            &ctx.caches,
            op,
            plan,
            Some(&group),
        )
        .await?;
        warn_events(&ctx.events, op, &decision).await;
        if !decision.allowed {
            held.insert(group);
            first.get_or_insert(decision);
        }
    }
    Ok(first.map(|decision| Verdict {
        decision,
        held_groups: held,
    }))
}

async fn warn_events(events: &Events, op: &Operation, decision: &Decision) {
    if !decision.warnings.is_empty() {
        let note: Vec<String> = decision
            .warnings
            .iter()
            .map(|w| format!("{}: {}", w.policy, w.message))
            .collect();
        events
            .publish(op, Notice::warning(REASON_WARNING, ACTION, note.join("; ")))
            .await;
    }
}

/// What the reconciler does when a gate cannot decide: nothing proceeds; look again soon.
pub fn retry_later(error: bosun_cluster::Error) -> crate::Result<Action> {
    match error {
        e @ bosun_cluster::Error::NotSynced { .. } => {
            tracing::warn!(error = %e, "operation gate cannot decide yet");
            Ok(Action::requeue(Duration::from_secs(5)))
        }
        e => Err(e.into()),
    }
}

/// The operation gate before planning. `Ok(Some(status))` is the Operation's status
/// Blocked by the policies (write it and plan nothing); `Ok(None)` lets planning go on.
/// A Warning Event with the messages is published when the block is new or its message
/// changed.
pub async fn hold_before_planning(
    ctx: &Context,
    op: &Operation,
    plan: &Plan,
    stored: &OperationStatus,
    now: Timestamp,
) -> Result<Option<OperationStatus>, bosun_cluster::Error> {
    let Some(verdict) = before_planning(ctx, op, plan).await? else {
        return Ok(None);
    };
    let message = verdict.message("before planning");
    let mut status = stored.clone();
    verdict.record(&mut status, &message, op.metadata.generation, now);
    status.observed_generation = op.metadata.generation;
    if stored.message.as_deref() != Some(message.as_str()) {
        tracing::warn!(operation = %op.name_any(), %message, "operation blocked by policy");
        ctx.events
            .publish(op, Notice::warning(REASON_DENIED, ACTION, message))
            .await;
    }
    Ok(Some(status))
}

/// Groups the operation gate holds back in this reconcile.
#[derive(Debug, Default)]
pub struct Hold(Option<Verdict>);

impl Hold {
    /// True when `task`'s group is held back: do not start it.
    pub fn holds(&self, task: &NodeTask) -> bool {
        self.0
            .as_ref()
            .is_some_and(|v| v.held_groups.contains(&task.spec.group))
    }

    /// Marks `status` Blocked (reason PolicyDenied) when a group is held, publishing a
    /// Warning Event when the block is new or its message changed.
    pub async fn record(
        &self,
        events: &Events,
        op: &Operation,
        stored: &OperationStatus,
        status: &mut OperationStatus,
        now: Timestamp,
    ) {
        let Some(verdict) = &self.0 else { return };
        let groups: Vec<&str> = verdict.held_groups.iter().map(String::as_str).collect();
        let message = verdict.message(&format!("before group {}", groups.join(", ")));
        verdict.record(status, &message, op.metadata.generation, now);
        if stored.message.as_deref() != Some(message.as_str()) {
            tracing::warn!(operation = %op.name_any(), %message, "group held by policy");
            events
                .publish(op, Notice::warning(REASON_DENIED, ACTION, message))
                .await;
        }
    }
}

/// The operation gate before each group, over the tasks the scheduler is about to start
/// (or ask approval for).
pub async fn hold_groups(
    ctx: &Context,
    op: &Operation,
    plan: &Plan,
    tasks: &crate::reconcile::Tasks,
    starting: &[String],
    awaiting: &[String],
) -> Result<Hold, bosun_cluster::Error> {
    let nodes: Vec<String> = starting.iter().chain(awaiting).cloned().collect();
    if nodes.is_empty() {
        return Ok(Hold(None));
    }
    Ok(Hold(before_groups(ctx, op, plan, tasks, &nodes).await?))
}
