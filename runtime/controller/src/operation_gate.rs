//! The operation decision point: the policies asked about an Operation before its plan is
//! frozen ([`hold_before_planning`]) and before each task starts ([`hold_nodes`], with
//! `nextGroup` and `nextNode` set). A deny holds what it was asked about (the whole
//! Operation, or that node's task, which stays Pending): the Operation reads Blocked, reason
//! PolicyDenied, with the policies' messages, and a Warning Event; it proceeds on its own
//! once the policies allow (a maintenance window opening). Warn findings are Events too.
//!
//! Fail closed: until the Policy list has been read once nothing is decided (the reconcile
//! looks again soon, see [`retry_later`]); a Policy that does not compile denies.

use std::collections::BTreeSet;
use std::time::Duration;

use bosun_api::node_task::NodeTask;
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
    /// The nodes held back (empty before planning, where the whole Operation is).
    pub held_nodes: BTreeSet<String>,
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

/// The operation policies, ready to be asked about one Operation: the compiled policies and
/// the input document, read once ([`Asker::new`]) and asked once per node ([`Asker::ask`]).
pub struct Asker {
    generation: std::sync::Arc<bosun_cluster::policies::Generation>,
    input: OperationInput,
    operation: String,
}

impl std::fmt::Debug for Asker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asker")
            .field("operation", &self.operation)
            .finish_non_exhaustive()
    }
}

impl Asker {
    /// The policies and the input about `op` with `plan` (about to be frozen, or frozen),
    /// with the Nodes as the controller's Node watch shows them (`caches`).
    pub async fn new(
        client: &Client,
        watch: &PolicyWatch,
        caches: &crate::cache::Caches,
        op: &Operation,
        plan: &Plan,
    ) -> Result<Asker, bosun_cluster::Error> {
        let generation = watch.generation(SYNC_WAIT).await?;
        let input = operation_input(client, caches, op, plan).await?;
        Ok(Asker {
            generation,
            input,
            operation: op.name_any(),
        })
    }

    /// Asks the policies with `nextGroup` and `nextNode` (both `None` before planning).
    /// Warnings and audits are logged (and Warn findings published as Events by the caller).
    pub fn ask(&mut self, next_group: Option<&str>, next_node: Option<&str>) -> Decision {
        self.input.next_group = next_group.map(str::to_owned);
        self.input.next_node = next_node.map(str::to_owned);
        let clock = std::time::Instant::now();
        let decision = self.generation.with_evaluator(|e| e.operation(&self.input));
        bosun_telemetry::metrics().gate_finished(bosun_telemetry::Gate::Policy, clock.elapsed());
        let node = next_node.unwrap_or("");
        for w in &decision.warnings {
            tracing::warn!(operation = %self.operation, node, policy = %w.policy, message = %w.message, "policy warning");
        }
        for a in &decision.audits {
            tracing::info!(operation = %self.operation, node, policy = %a.policy, message = %a.message, "policy audit");
        }
        decision
    }
}

/// The operation point's input about `op` with `plan`, without `nextGroup` and `nextNode`.
async fn operation_input(
    client: &Client,
    caches: &crate::cache::Caches,
    op: &Operation,
    plan: &Plan,
) -> Result<OperationInput, bosun_cluster::Error> {
    let mut all: Vec<Node> = caches.nodes().iter().map(|n| Node::clone(n)).collect();
    all.sort_by_key(|n| n.name_any());
    let planned: BTreeSet<&str> = plan.node_names().collect();
    Ok(OperationInput {
        operation: operation_ref(op),
        plan: plan
            .groups
            .iter()
            .map(|g| PlanGroup {
                name: g.name.clone(),
                nodes: g.nodes.clone(),
            })
            .collect(),
        next_group: None,
        next_node: None,
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
                annotations: n.annotations().clone(),
            })
            .collect(),
        cluster: ClusterState {
            version: cluster_version(client).await,
            annotations: cluster_annotations(client).await,
            control_plane: control_plane(client, &all, None).await?,
        },
        now: Timestamp::now().to_string(),
    })
}

/// The operation gate before planning: `Some(verdict)` when the policies deny the
/// Operation with the plan it would get.
pub async fn before_planning(
    ctx: &Context,
    op: &Operation,
    plan: &Plan,
) -> Result<Option<Verdict>, bosun_cluster::Error> {
    let decision = Asker::new(&ctx.client, &ctx.policies, &ctx.caches, op, plan)
        .await?
        .ask(None, None);
    warn_events(&ctx.events, op, &decision).await;
    Ok((!decision.allowed).then(|| Verdict {
        decision,
        held_nodes: BTreeSet::new(),
    }))
}

/// The operation gate before each task starts: for every node of `starting`, asks the
/// policies with `nextGroup` (its group) and `nextNode` (the node). Returns the nodes held
/// back, with the first deny. Warn findings are published once per distinct set.
pub async fn before_nodes(
    ctx: &Context,
    op: &Operation,
    plan: &Plan,
    tasks: &crate::reconcile::Tasks,
    starting: &[String],
) -> Result<Option<Verdict>, bosun_cluster::Error> {
    let mut nodes: Vec<&String> = starting.iter().filter(|n| tasks.contains_key(*n)).collect();
    nodes.sort();
    nodes.dedup();
    let mut asker = Asker::new(&ctx.client, &ctx.policies, &ctx.caches, op, plan).await?;
    let mut held = BTreeSet::new();
    let mut first: Option<Decision> = None;
    let mut warned: BTreeSet<Vec<String>> = BTreeSet::new();
    for node in nodes {
        let decision = asker.ask(Some(&tasks[node].spec.group), Some(node));
        let warnings: Vec<String> = decision
            .warnings
            .iter()
            .map(|w| w.message.clone())
            .collect();
        if warned.insert(warnings) {
            warn_events(&ctx.events, op, &decision).await;
        }
        if !decision.allowed {
            held.insert(node.clone());
            first.get_or_insert(decision);
        }
    }
    Ok(first.map(|decision| Verdict {
        decision,
        held_nodes: held,
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

/// Nodes the operation gate holds back in this reconcile.
#[derive(Debug, Default)]
pub struct Hold(Option<Verdict>);

impl Hold {
    /// True when `task`'s node is held back: do not start it.
    pub fn holds(&self, task: &NodeTask) -> bool {
        self.0
            .as_ref()
            .is_some_and(|v| v.held_nodes.contains(&task.spec.node_name))
    }

    /// Marks `status` Blocked (reason PolicyDenied) when a node is held, publishing a
    /// Warning Event when the block is new or its message changed.
    pub async fn record(
        &self,
        events: &Events,
        op: &Operation,
        tasks: &crate::reconcile::Tasks,
        stored: &OperationStatus,
        status: &mut OperationStatus,
        now: Timestamp,
    ) {
        let Some(verdict) = &self.0 else { return };
        let message = verdict.message(&held_what(verdict, tasks));
        verdict.record(status, &message, op.metadata.generation, now);
        if stored.message.as_deref() != Some(message.as_str()) {
            tracing::warn!(operation = %op.name_any(), %message, "node held by policy");
            events
                .publish(op, Notice::warning(REASON_DENIED, ACTION, message))
                .await;
        }
    }
}

/// `before group workers (nodes w-1, w-2)`: where the held nodes are, for the message.
fn held_what(verdict: &Verdict, tasks: &crate::reconcile::Tasks) -> String {
    let mut groups: Vec<&str> = verdict
        .held_nodes
        .iter()
        .filter_map(|n| tasks.get(n).map(|t| t.spec.group.as_str()))
        .collect();
    groups.sort();
    groups.dedup();
    let nodes: Vec<&str> = verdict.held_nodes.iter().map(String::as_str).collect();
    format!(
        "before group {} (node{} {})",
        groups.join(", "),
        if nodes.len() == 1 { "" } else { "s" },
        nodes.join(", ")
    )
}

/// The operation gate before each task the scheduler is about to start (or ask approval
/// for).
pub async fn hold_nodes(
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
    Ok(Hold(before_nodes(ctx, op, plan, tasks, &nodes).await?))
}
