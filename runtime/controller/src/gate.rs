//! Policy gates on the controller side, and the cluster's Policy objects as a compiled set.
//!
//! Owns three things:
//! - [`PolicyWatch`]: every `Policy` resource (optionally only those matching a label
//!   selector) kept in a reflector, compiled into a [`PolicySet`] once per generation of
//!   the set (the set digest is the key: any policy created, changed or deleted makes a
//!   new one), with a pool of evaluators so each concurrent caller has its own engine.
//!   The agent uses the same type for its step and capabilities gates.
//! - [`run_status`]: writes each Policy's status (compiled or not, errors with
//!   `policy:line:column`, its digest, the `Compiled` condition).
//! - The operation decision point: [`before_planning`] and [`before_groups`], which the
//!   reconciler calls before it freezes a plan and before it starts the first task of a
//!   group. A deny blocks the Operation with the policies' messages and a Warning Event.
//!
//! Fail closed: until the Policy list has been read once, no decision is made (callers get
//! [`GateError::NotSynced`] and try again later); a Policy that does not compile denies
//! every decision (see `bosun_policy`).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use bosun_api::operation::{ExecutionMode, Operation, OperationStatus, Plan};
use bosun_api::policy::{Enforcement as ApiEnforcement, Policy};
use bosun_policy::input::{
    ClusterState, ControlPlaneNode, NodeSummary, OperationInput, OperationKind, OperationRef,
    PlanGroup,
};
use bosun_policy::{Decision, Enforcement, Evaluator, Limits, PolicySet, PolicySource};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::time::set_condition;

/// Why a gate could not decide. Nothing runs while a gate cannot decide.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(
        "the cluster's Policy objects have not been listed yet (waited {waited:?}); no step or Operation proceeds until they are, so a policy is never skipped: check that the Policy CRD is installed and this process may list policies.bosun.dev"
    )]
    NotSynced { waited: Duration },
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// The log target of the Policy watch's own lines ("policy set compiled", watch errors):
/// the agent runs this watch too, and its log should not name the controller's module.
pub const POLICY_LOG_TARGET: &str = "bosun::policies";

/// The cluster's policies, watched and compiled. Share it (`Arc`) between workers.
pub struct PolicyWatch {
    store: Store<Policy>,
    writer: Mutex<Option<reflector::store::Writer<Policy>>>,
    limits: Limits,
    current: Mutex<Option<Arc<Generation>>>,
}

impl std::fmt::Debug for PolicyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyWatch").finish_non_exhaustive()
    }
}

/// One compiled generation of the policy set, with its evaluators.
pub struct Generation {
    set: PolicySet,
    /// Evaluators not in use. Each caller takes one (or clones a new one from the set) and
    /// puts it back, so concurrent decisions never share an engine and the engines are
    /// cloned once per worker, not per decision.
    idle: Mutex<Vec<Evaluator>>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("digest", &self.set.digest())
            .finish_non_exhaustive()
    }
}

impl Generation {
    /// Compiles `sources` (never fails: broken policies are kept and deny).
    pub fn compile(sources: &[PolicySource], limits: Limits) -> Generation {
        Generation {
            set: PolicySet::compile(sources, limits),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The compiled set.
    pub fn set(&self) -> &PolicySet {
        &self.set
    }

    /// `sha256:<hex>` of the set; every decision it makes carries it.
    pub fn digest(&self) -> &str {
        self.set.digest()
    }

    /// Runs `f` with an evaluator no one else is using.
    pub fn with_evaluator<R>(&self, f: impl FnOnce(&mut Evaluator) -> R) -> R {
        let taken = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut evaluator = taken.unwrap_or_else(|| self.set.evaluator());
        let out = f(&mut evaluator);
        if let Ok(mut v) = self.idle.lock() {
            v.push(evaluator);
        }
        out
    }
}

/// A `Policy` resource as the policy engine sees it.
pub fn source_of(policy: &Policy) -> PolicySource {
    PolicySource {
        name: policy.name_any(),
        rego: policy.spec.rego.clone(),
        data: policy.spec.data.clone(),
        enforcement: match policy.spec.enforcement {
            ApiEnforcement::Deny => Enforcement::Deny,
            ApiEnforcement::Warn => Enforcement::Warn,
            ApiEnforcement::Audit => Enforcement::Audit,
        },
    }
}

impl Default for PolicyWatch {
    fn default() -> Self {
        PolicyWatch::new()
    }
}

impl PolicyWatch {
    /// A watch that sees nothing until [`PolicyWatch::drive`]'s future (or
    /// [`PolicyWatch::changes`]' stream) runs; until then every gate waits.
    pub fn new() -> PolicyWatch {
        let (store, writer) = reflector::store();
        PolicyWatch {
            store,
            writer: Mutex::new(Some(writer)),
            limits: Limits::default(),
            current: Mutex::new(None),
        }
    }

    /// The future that keeps the watch current (run it on the runtime). The first call of
    /// this or [`PolicyWatch::changes`] gets it; later calls get `None`.
    pub fn drive(
        &self,
        client: Client,
        selector: Option<String>,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        Some(self.changes(client, selector)?.for_each(|()| async {}))
    }

    /// Keeps the watch current while polled, yielding once per change to the set of
    /// policies (for triggering reconciles). The first call of this or
    /// [`PolicyWatch::drive`] gets it; later calls get `None`.
    /// Watches every Policy, or those matching `selector` (a label selector).
    pub fn changes(
        &self,
        client: Client,
        selector: Option<String>,
    ) -> Option<impl futures::Stream<Item = ()> + Send + 'static> {
        let writer = self.writer.lock().ok()?.take()?;
        let mut config = watcher::Config::default();
        if let Some(s) = &selector {
            config = config.labels(s);
        }
        let api: Api<Policy> = Api::all(client);
        Some(
            reflector::reflector(writer, watcher(api, config))
                .default_backoff()
                .filter_map(|event| async move {
                    match event {
                        Ok(
                            watcher::Event::Apply(_)
                            | watcher::Event::Delete(_)
                            | watcher::Event::InitDone,
                        ) => Some(()),
                        Ok(_) => None,
                        Err(e) => {
                            tracing::warn!(target: POLICY_LOG_TARGET, error = %e, "watching Policy objects failed; retrying");
                            None
                        }
                    }
                }),
        )
    }

    /// The reflector's store of Policy objects.
    pub fn store(&self) -> Store<Policy> {
        self.store.clone()
    }

    /// The compiled set for the policies held now, compiling only when they changed since
    /// the last call. Waits up to `wait` for the first list.
    pub async fn generation(&self, wait: Duration) -> Result<Arc<Generation>, GateError> {
        if tokio::time::timeout(wait, self.store.wait_until_ready())
            .await
            .map(|r| r.is_ok())
            != Ok(true)
        {
            return Err(GateError::NotSynced { waited: wait });
        }
        let mut policies = self.store.state();
        policies.sort_by_key(|p| p.name_any());
        let sources: Vec<PolicySource> = policies.iter().map(|p| source_of(p)).collect();
        let digest = bosun_policy::set_digest(&sources);
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(g) = current.as_ref()
            && g.digest() == digest
        {
            return Ok(g.clone());
        }
        let started = std::time::Instant::now();
        let g = Arc::new(Generation::compile(&sources, self.limits));
        tracing::info!(target: POLICY_LOG_TARGET, digest = %g.digest(), policies = sources.len(), healthy = g.set().is_healthy(), elapsed = ?started.elapsed(), "policy set compiled");
        *current = Some(g.clone());
        Ok(g)
    }
}

/// How long a gate waits for the first Policy list before giving up for this reconcile.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// Writes every watched Policy's status: compiled or not, its errors (`policy:line:column:
/// message`), its digest, and the `Compiled` condition. Runs until shutdown.
pub async fn run_status(client: Client, manager: String, selector: Option<String>) {
    let api: Api<Policy> = Api::all(client.clone());
    let mut config = watcher::Config::default();
    if let Some(s) = &selector {
        config = config.labels(s);
    }
    let ctx = Arc::new((client, manager));
    Controller::new(api, config)
        .shutdown_on_signal()
        .run(
            |policy: Arc<Policy>, ctx: Arc<(Client, String)>| async move {
                write_policy_status(&policy, &ctx.0, &ctx.1).await
            },
            |_policy, _error: &GateError, _ctx| Action::requeue(Duration::from_secs(5)),
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "policy status reconcile error");
            }
        })
        .await;
}

/// The status Bosun writes for `policy`: what compiling it alone gives (a policy's compile
/// result depends only on itself).
pub fn policy_status(policy: &Policy, now: Timestamp) -> bosun_api::policy::PolicyStatus {
    let source = source_of(policy);
    let set = PolicySet::compile(std::slice::from_ref(&source), Limits::default());
    let status = set.statuses().into_iter().next();
    let errors: Vec<String> = status
        .as_ref()
        .map(|s| s.errors.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    let compiled = status.as_ref().is_some_and(|s| s.compiled);
    let mut out = policy.status.clone().unwrap_or_default();
    out.compiled = compiled;
    out.errors = errors.clone();
    out.digest = Some(bosun_policy::source_digest(&source));
    out.observed_generation = policy.metadata.generation;
    let (reason, message) = if compiled {
        let at = status.and_then(|s| s.point).map_or_else(String::new, |p| {
            format!("evaluated at the {p} decision point")
        });
        ("Compiled", at)
    } else {
        (
            "CompileFailed",
            format!(
                "{}; a policy that does not compile blocks every decision until it is fixed or deleted",
                errors.join("; ")
            ),
        )
    };
    set_condition(
        &mut out.conditions,
        "Compiled",
        compiled,
        reason,
        &message,
        policy.metadata.generation,
        now,
    );
    out
}

async fn write_policy_status(
    policy: &Policy,
    client: &Client,
    manager: &str,
) -> Result<Action, GateError> {
    let name = policy.name_any();
    let status = policy_status(policy, Timestamp::now());
    if policy.status.as_ref() == Some(&status) {
        return Ok(Action::await_change());
    }
    if !status.compiled {
        tracing::warn!(policy = %name, errors = ?status.errors, "policy does not compile; it blocks every decision");
    }
    let api: Api<Policy> = Api::all(client.clone());
    let patch = json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy", "metadata": { "name": name }, "status": status });
    api.patch_status(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| GateError::Kube {
        what: format!("writing the status of Policy {name}"),
        source,
    })?;
    Ok(Action::await_change())
}

/// The Kubernetes version the API server reports, for example `v1.34.4`.
pub async fn cluster_version(client: &Client) -> Option<String> {
    client.apiserver_version().await.ok().map(|i| i.git_version)
}

/// Cluster-wide annotations: those of the `kube-system` Namespace (where
/// `bosun.dev/change-freeze` is set).
pub async fn cluster_annotations(client: &Client) -> std::collections::BTreeMap<String, String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .get_opt("kube-system")
        .await
        .ok()
        .flatten()
        .map(|n| n.annotations().clone())
        .unwrap_or_default()
}

/// The node's roles from its `node-role.kubernetes.io/<role>` labels (`worker` when none).
pub fn roles_of(node: &Node) -> Vec<String> {
    let mut roles: Vec<String> = node
        .labels()
        .keys()
        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
        .map(str::to_owned)
        .collect();
    if roles.is_empty() {
        roles.push("worker".into());
    }
    roles
}

/// True when the Node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Every control-plane node: Ready, and whether a NodeTask of any Operation is Running on
/// it now.
pub async fn control_plane(
    client: &Client,
    nodes: &[Node],
) -> Result<Vec<ControlPlaneNode>, GateError> {
    let tasks: Api<NodeTask> = Api::all(client.clone());
    let running: BTreeSet<String> = tasks
        .list(&ListParams::default())
        .await
        .map_err(|source| GateError::Kube {
            what: "listing NodeTasks".into(),
            source,
        })?
        .items
        .into_iter()
        .filter(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Running)
        })
        .map(|t| t.spec.node_name)
        .collect();
    Ok(nodes
        .iter()
        .filter(|n| roles_of(n).iter().any(|r| r == "control-plane"))
        .map(|n| ControlPlaneNode {
            name: n.name_any(),
            ready: is_ready(n),
            in_progress: running.contains(&n.name_any()),
        })
        .collect())
}

/// The Operation as the policy input names it.
pub fn operation_ref(op: &Operation) -> OperationRef {
    let kind = if op.spec.upgrade.is_some() {
        OperationKind::Upgrade
    } else if op.spec.renew_certificates.is_some() {
        OperationKind::RenewCertificates
    } else {
        OperationKind::Custom
    };
    let mut annotations = op.labels().clone();
    annotations.extend(op.annotations().iter().map(|(k, v)| (k.clone(), v.clone())));
    OperationRef {
        name: op.name_any(),
        kind,
        target_version: op
            .spec
            .upgrade
            .as_ref()
            .map(|u| u.kubernetes_version.clone()),
        execution_mode: Some(
            match op.spec.execution_mode {
                ExecutionMode::Auto => "Auto",
                ExecutionMode::Controlled => "Controlled",
                ExecutionMode::DryRun => "DryRun",
            }
            .into(),
        ),
        annotations,
    }
}

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
/// `next_group`. Returns the decision; warnings and audits are logged (and Warn findings
/// published as Events by the caller).
pub async fn decide(
    client: &Client,
    watch: &PolicyWatch,
    op: &Operation,
    plan: &Plan,
    next_group: Option<&str>,
) -> Result<Decision, GateError> {
    let generation = watch.generation(SYNC_WAIT).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let all = nodes
        .list(&ListParams::default())
        .await
        .map_err(|source| GateError::Kube {
            what: "listing Nodes".into(),
            source,
        })?
        .items;
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
            control_plane: control_plane(client, &all).await?,
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

/// Publishes an Event about `op` (best effort: a failed Event is logged, never fatal).
pub async fn publish(
    client: &Client,
    op: &Operation,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: crate::FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(note, 1000)),
        action: "PolicyGate".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &op.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing an Event failed");
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The operation gate before planning: `Some(verdict)` when the policies deny the
/// Operation with the plan it would get.
pub async fn before_planning(
    client: &Client,
    watch: &PolicyWatch,
    op: &Operation,
    plan: &Plan,
) -> Result<Option<Verdict>, GateError> {
    let decision = decide(client, watch, op, plan, None).await?;
    warn_events(client, op, &decision).await;
    Ok((!decision.allowed).then(|| Verdict {
        decision,
        held_groups: BTreeSet::new(),
    }))
}

/// The operation gate before each group: for every group whose first task is about to
/// start (no task of it has left Pending), asks the policies with `nextGroup` set. Returns
/// the groups held back, with the first deny.
pub async fn before_groups(
    client: &Client,
    watch: &PolicyWatch,
    op: &Operation,
    plan: &Plan,
    tasks: &std::collections::BTreeMap<String, NodeTask>,
    starting: &[String],
) -> Result<Option<Verdict>, GateError> {
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
        let decision = decide(client, watch, op, plan, Some(&group)).await?;
        warn_events(client, op, &decision).await;
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

async fn warn_events(client: &Client, op: &Operation, decision: &Decision) {
    if !decision.warnings.is_empty() {
        let note: Vec<String> = decision
            .warnings
            .iter()
            .map(|w| format!("{}: {}", w.policy, w.message))
            .collect();
        publish(
            client,
            op,
            EventType::Warning,
            "PolicyWarning",
            note.join("; "),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::policy::PolicySpec;

    fn policy(name: &str, rego: &str) -> Policy {
        let mut p = Policy::new(
            name,
            PolicySpec {
                rego: rego.into(),
                data: None,
                enforcement: ApiEnforcement::Deny,
            },
        );
        p.metadata.generation = Some(3);
        p
    }

    #[test]
    fn a_policy_that_compiles_has_a_compiled_status_with_its_digest() {
        let p = policy(
            "ok",
            "package bosun.step\n\ndeny contains \"no\" if input.x\n",
        );
        let s = policy_status(&p, Timestamp::UNIX_EPOCH);
        assert!(s.compiled, "{s:?}");
        assert!(s.errors.is_empty());
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            s.digest.as_deref(),
            Some(bosun_policy::source_digest(&source_of(&p)).as_str())
        );
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Compiled")
            .expect("a Compiled condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Compiled"));
        assert!(c.message.contains("step"), "{}", c.message);
    }

    #[test]
    fn a_broken_policy_reports_line_and_column() {
        let p = policy(
            "broken",
            "package bosun.step\n\ndeny contains msg if {\n  msg := \n}\n",
        );
        let s = policy_status(&p, Timestamp::UNIX_EPOCH);
        assert!(!s.compiled);
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        assert!(
            s.errors[0].starts_with("broken:5:") || s.errors[0].starts_with("broken:4:"),
            "{}",
            s.errors[0]
        );
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Compiled")
            .expect("a Compiled condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "CompileFailed")
        );
        assert!(c.message.contains("blocks every decision"), "{}", c.message);
    }

    #[test]
    fn evaluators_are_reused_and_decisions_carry_the_set_digest() {
        let g = Generation::compile(
            &[source_of(&policy(
                "freeze",
                "package bosun.operation\n\ndeny contains \"frozen\" if input.cluster.annotations[\"bosun.dev/change-freeze\"] == \"true\"\n",
            ))],
            Limits::default(),
        );
        let input = |freeze: &str| json!({"operation": {"name": "o", "kind": "Custom"}, "cluster": {"annotations": {"bosun.dev/change-freeze": freeze}}, "now": "2026-11-30T00:00:00Z"});
        let d = g
            .with_evaluator(|e| e.evaluate(bosun_policy::DecisionPoint::Operation, &input("true")));
        assert!(!d.allowed);
        assert_eq!(d.deny_messages(), vec!["freeze: frozen".to_string()]);
        assert_eq!(d.policy_set_digest, g.digest());
        let d = g.with_evaluator(|e| {
            e.evaluate(bosun_policy::DecisionPoint::Operation, &input("false"))
        });
        assert!(d.allowed);
        assert_eq!(
            g.idle.lock().unwrap().len(),
            1,
            "the evaluator went back to the pool and was reused"
        );
    }
}

/// What the reconciler does when a gate cannot decide: nothing proceeds; look again soon.
pub fn retry_later(error: GateError) -> crate::Result<Action> {
    match error {
        GateError::Kube { what, source } => Err(crate::Error::Kube { what, source }),
        e @ GateError::NotSynced { .. } => {
            tracing::warn!(error = %e, "operation gate cannot decide yet");
            Ok(Action::requeue(Duration::from_secs(5)))
        }
    }
}

/// The operation gate before planning. `Ok(Some(status))` is the Operation's status
/// Blocked by the policies (write it and plan nothing); `Ok(None)` lets planning go on.
/// A Warning Event with the messages is published when the block is new or its message
/// changed.
pub async fn hold_before_planning(
    client: &Client,
    watch: &PolicyWatch,
    op: &Operation,
    plan: &Plan,
    stored: &OperationStatus,
    now: Timestamp,
) -> Result<Option<OperationStatus>, GateError> {
    let Some(verdict) = before_planning(client, watch, op, plan).await? else {
        return Ok(None);
    };
    let message = verdict.message("before planning");
    let mut status = stored.clone();
    verdict.record(&mut status, &message, op.metadata.generation, now);
    status.observed_generation = op.metadata.generation;
    if stored.message.as_deref() != Some(message.as_str()) {
        tracing::warn!(operation = %op.name_any(), %message, "operation blocked by policy");
        publish(client, op, EventType::Warning, "PolicyDenied", message).await;
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
        client: &Client,
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
            publish(client, op, EventType::Warning, "PolicyDenied", message).await;
        }
    }
}

/// The operation gate before each group, over the tasks the scheduler is about to start
/// (or ask approval for).
pub async fn hold_groups(
    client: &Client,
    watch: &PolicyWatch,
    op: &Operation,
    plan: &Plan,
    tasks: &std::collections::BTreeMap<String, NodeTask>,
    starting: &[String],
    awaiting: &[String],
) -> Result<Hold, GateError> {
    let nodes: Vec<String> = starting.iter().chain(awaiting).cloned().collect();
    if nodes.is_empty() {
        return Ok(Hold(None));
    }
    Ok(Hold(
        before_groups(client, watch, op, plan, tasks, &nodes).await?,
    ))
}
