//! The Operation reconciler: one pass over an Operation, as a list of named phases.
//!
//! ```text
//!  an Operation applied, a NodeTask or Node changed, or the resync
//!        │
//!  observe    the Operation (this controller's last write, or the API server's copy while
//!        │    no plan is frozen); a finished one goes to its TTL, a deleted one is left
//!  plan       the planner's plan over the Nodes, or the frozen plan's task specs; input
//!        │    that cannot be planned fails the Operation
//!  freeze     first pass only: the operation gate, then the plan written to status
//!        │
//!  tasks      the Operation's NodeTasks from the store, the missing ones created
//!        │
//!  recover    people's retry and skip, automatic retries, the pause mirrored on tasks
//!        │
//!  advance    running tasks whose next move is the controller's (cordon, drain, waits,
//!        │    health gates, the end), each in a job of its own (`advance`)
//!  schedule   the planner: which tasks start, wait for approval, became invalid (pure)
//!        │
//!  start      invalid tasks blocked, the operation gate per group, one Operation per
//!        │    node, approvals asked, tasks started with their first controller steps
//!  summarise  the Operation's status (written when it changed), Events, when to look again
//! ```
//!
//! Each phase is a function of its own: it reads what it needs, returns what the next
//! phases need, and can end the pass ([`ControlFlow::Break`] with the pass's [`Action`]).
//! Every decision about order and concurrency is the planner's ([`bosun_planner::plan()`],
//! [`bosun_planner::schedule()`], [`bosun_planner::state`]), and the statuses a phase writes
//! are computed by pure functions beside it ([`plan_failed`], [`frozen_status`],
//! [`moved`]); the phases only read the cluster, ask, and write the answer. A pass starts
//! from what the API server holds (the frozen plan in status, the NodeTasks' phases), so a
//! restarted controller resumes where the last one stopped.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bosun_api::labels;
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase};
use bosun_api::operation::{
    Operation, OperationPhase, OperationSpec, OperationStatus, Plan, Rollout,
};
use bosun_planner::state::{TaskEvent, task_transition};
use bosun_planner::{
    NodeInfo, OperationIdentity, PlanError, PlanOutput, PlannedTask, Schedule, TaskView,
    plan_identified, schedule,
};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::Instrument;

use crate::cache::Writes;
use crate::error::{Error, Result};
use crate::time::set_condition;

mod advance;
mod start;

use advance::{advance_running_task, controller_moves_next, spawn_advance};
#[cfg(test)]
use start::{note_held, start_task};

/// An Operation's tasks by node, as one reconcile sees them: shared with the NodeTask store
/// (`crate::cache`) and copied only where the pass changes a task, so a pass over a thousand
/// tasks does not hold a second copy of each (docs/benchmarks.md, fleet: controller RSS).
pub type Tasks = BTreeMap<String, Arc<NodeTask>>;

/// What every reconcile shares.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    /// Field manager for server-side apply of everything the controller writes.
    pub manager: String,
    /// How often a running Operation is looked at even without a change (watches normally
    /// trigger reconciles sooner).
    pub resync: Duration,
    /// `--instance`: the value of [`bosun_api::labels::INSTANCE`] this install acts on and puts
    /// on the NodeTasks it creates.
    pub instance: Option<String>,
    /// The cluster's Policy objects (of this instance), compiled: the operation gate.
    pub policies: Arc<bosun_cluster::policies::PolicyWatch>,
    /// Events about Operations and NodeTasks (and the task phases seen so far).
    pub events: Arc<crate::events::Events>,
    /// Held while one reconcile reads which nodes other Operations hold and starts its own
    /// tasks ([`crate::exclusion`]): reconciles of different Operations run concurrently,
    /// and without it both could see a node free and both take it.
    pub exclusion: Arc<tokio::sync::Mutex<()>>,
    /// Operations waiting for a node another Operation holds: woken by a change of a task
    /// on that node ([`crate::exclusion::Waiters`]).
    pub waiters: Arc<crate::exclusion::Waiters>,
    /// The watch-backed Nodes and NodeTasks every reconcile reads ([`crate::cache`]);
    /// `client` records its NodeTask writes there ([`crate::cache::Caches::recording`]).
    pub caches: Arc<crate::cache::Caches>,
    /// The controller's own last Operation status writes, until the watch shows them
    /// ([`crate::cache::OwnWrites`]).
    pub own_writes: Arc<crate::cache::OwnWrites>,
    /// Running tasks being advanced in the background ([`crate::inflight`]).
    pub inflight: Arc<crate::inflight::InFlight>,
    /// Wakes a task's Operation when its background advance ends after the reconcile that
    /// started it stopped waiting (a clone of the task goes through the controller's task
    /// trigger); `None` in unit tests, which call [`reconcile`] themselves.
    pub retrigger: Option<tokio::sync::mpsc::UnboundedSender<NodeTask>>,
    /// The reboot gates' Prometheus client ([`crate::reboot_gate`]).
    pub gates: Arc<crate::reboot_gate::Gates>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("manager", &self.manager)
            .finish_non_exhaustive()
    }
}

/// One pass over an Operation. Idempotent: running it twice in a row with nothing changed
/// in between writes the same status and creates nothing.
///
/// Guarantees: the plan is written to status before any NodeTask exists, and never
/// recomputed once written; NodeTasks have deterministic names, so a second controller (or a
/// restarted one) creates none twice; a task is only ever moved through
/// [`task_transition`].
pub async fn reconcile(op: Arc<Operation>, ctx: Arc<Context>) -> Result<Action> {
    let span = tracing::info_span!("reconcile", operation = %op.name_any());
    reconcile_inner(op, ctx).instrument(span).await
}

/// Goes on with what a phase found, or ends the pass with the phase's [`Action`].
macro_rules! proceed {
    ($phase:expr) => {
        match $phase {
            ControlFlow::Continue(found) => found,
            ControlFlow::Break(action) => return Ok(action),
        }
    };
}

/// The pass, phase by phase (see the module's diagram).
async fn reconcile_inner(op: Arc<Operation>, ctx: Arc<Context>) -> Result<Action> {
    let op = proceed!(observe(&ctx, op).await?);
    let stored = op.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    let nodes = proceed!(observe_nodes(&ctx).await);
    let (planned, ignored) = proceed!(plan_phase(&ctx, &op, &nodes, &stored, now).await?);
    let current = proceed!(freeze(&ctx, &op, &planned, &stored, now).await?);
    let frozen = current.plan.clone().unwrap_or_default();
    // Which tasks are being advanced in the background, read before the tasks themselves:
    // a task not in flight now has its last advance's writes in the store (`inflight`).
    let busy = ctx.inflight.busy();
    let mut tasks = proceed!(observe_tasks(&ctx, &op, &planned, &stored).await?);
    let mut recheck = recover(&ctx, &op, &mut tasks, &busy, now).await?;
    recheck.merge(advance_running(&ctx, &op, &mut tasks, &busy).await?);
    let decision = schedule_now(&frozen, &tasks, &nodes, &op.spec);
    let started =
        proceed!(start::gate_and_start(&ctx, &op, &frozen, &mut tasks, &decision, now).await?);
    recheck.merge(started.recheck);
    let summary = crate::summary::Summary {
        stored_phase: stored.phase,
        schedule: &decision,
        tasks: &tasks,
        waiting: &started.waiting,
        gated: &started.gated,
        ignored: ignored.as_deref(),
        generation: op.metadata.generation,
        now,
    };
    summarise(
        &ctx,
        &op,
        &stored,
        current,
        &summary,
        &started.hold,
        recheck,
    )
    .await
}

/// The soonest moment a phase asked to look at the Operation again (a drain in progress, a
/// retry's backoff), when that is sooner than the resync.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Recheck(Option<Duration>);

impl Recheck {
    /// Keeps the sooner of the two.
    fn at_most(&mut self, wait: Option<Duration>) {
        if let Some(d) = wait {
            self.0 = Some(self.0.map_or(d, |r| r.min(d)));
        }
    }

    fn merge(&mut self, other: Recheck) {
        self.at_most(other.0);
    }

    /// Look again at the recheck, or at the resync if that is sooner.
    fn action(self, resync: Duration) -> Action {
        Action::requeue(self.0.map_or(resync, |r| r.min(resync)))
    }
}

fn operations(ctx: &Context) -> Api<Operation> {
    Api::all(ctx.client.clone())
}

/// **Observe** the Operation this pass works on. The watch may not have shown this
/// controller's last status write yet (a NodeTask event can trigger this reconcile first):
/// the pass starts from that write, so that a status computed the same again is seen as
/// unchanged and not written a second time. While no plan is frozen, the watch cache may
/// not have our own freeze yet either: the Operation is read from the API server, so a plan
/// is never computed twice. Ends the pass for an Operation being deleted (nothing is
/// planned, created or started) and for a finished one (its TTL).
async fn observe(ctx: &Context, op: Arc<Operation>) -> Result<ControlFlow<Action, Arc<Operation>>> {
    let name = op.name_any();
    let mut op = ctx.own_writes.newest(op);
    if being_deleted(&op) {
        tracing::debug!("operation is being deleted: nothing is planned, created or started");
        return Ok(ControlFlow::Break(Action::await_change()));
    }
    if op.status.as_ref().and_then(|s| s.plan.as_ref()).is_none() {
        match operations(ctx)
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("getting Operation {name}")))?
        {
            Some(fresh) if !being_deleted(&fresh) => op = Arc::new(fresh),
            _ => return Ok(ControlFlow::Break(Action::await_change())),
        }
    }
    let phase = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if phase.is_finished() {
        bosun_telemetry::metrics().operation_phase(&name, phase);
        return crate::ttl::after_finished(&ctx.client, &op)
            .await
            .map(ControlFlow::Break);
    }
    Ok(ControlFlow::Continue(op))
}

/// **Observe** the Nodes as the planner sees them, from the watch-backed store (listed once
/// at start: until then the pass ends and looks again in 5 s).
async fn observe_nodes(ctx: &Context) -> ControlFlow<Action, Vec<NodeInfo>> {
    if !ctx.caches.ready(crate::cache::LIST_WAIT).await {
        tracing::warn!(waited = ?crate::cache::LIST_WAIT, "the Node and NodeTask watches have not listed yet; looking again in 5s");
        return ControlFlow::Break(Action::requeue(Duration::from_secs(5)));
    }
    ControlFlow::Continue(snapshot_nodes(&ctx.caches))
}

/// **Plan**: the planner's plan over `nodes`, or once frozen the frozen plan's task specs,
/// with a note when a rollout control edited after freezing was set aside
/// ([`plan_or_keep_frozen`]). Input that cannot be planned fails the Operation, says why,
/// and ends the pass (nothing was created).
async fn plan_phase(
    ctx: &Context,
    op: &Operation,
    nodes: &[NodeInfo],
    stored: &OperationStatus,
    now: Timestamp,
) -> Result<ControlFlow<Action, (PlanOutput, Option<String>)>> {
    let name = op.name_any();
    let identity = identity_of(op);
    match plan_or_keep_frozen(
        &name,
        identity.as_ref(),
        &op.spec,
        nodes,
        stored.plan.as_ref(),
    ) {
        Ok(planned) => Ok(ControlFlow::Continue(planned)),
        Err(e) => {
            let status = plan_failed(stored, &e, op.metadata.generation, now);
            write_operation_status(
                &operations(ctx),
                &ctx.own_writes,
                &name,
                &status,
                &ctx.manager,
            )
            .await?;
            tracing::warn!(error = %e, "operation cannot be planned");
            Ok(ControlFlow::Break(Action::await_change()))
        }
    }
}

/// The status of an Operation whose input cannot be planned: Failed, with the planner's
/// reason in the message and the `Planned` condition.
fn plan_failed(
    stored: &OperationStatus,
    error: &PlanError,
    generation: Option<i64>,
    now: Timestamp,
) -> OperationStatus {
    let mut status = stored.clone();
    status.phase = OperationPhase::Failed;
    status.message = Some(format!("cannot plan: {error}"));
    status.completion_time = Some(Time(now));
    status.observed_generation = generation;
    set_condition(
        &mut status.conditions,
        "Planned",
        false,
        "PlanFailed",
        &error.to_string(),
        generation,
        now,
    );
    status
}

/// **Freeze**, on the first pass only: the operation gate before planning (a deny blocks
/// the Operation before anything is frozen, and ends the pass), then the plan written to
/// status. Once that write lands, a restart plans nothing anew. Returns the Operation's
/// status as it is now: the stored one, or the freeze just written.
async fn freeze(
    ctx: &Context,
    op: &Operation,
    planned: &PlanOutput,
    stored: &OperationStatus,
    now: Timestamp,
) -> Result<ControlFlow<Action, OperationStatus>> {
    if stored.plan.is_some() {
        return Ok(ControlFlow::Continue(stored.clone()));
    }
    let name = op.name_any();
    match crate::operation_gate::hold_before_planning(ctx, op, &planned.plan, stored, now).await {
        Ok(None) => {}
        Ok(Some(blocked)) => {
            if blocked != *stored {
                write_operation_status(
                    &operations(ctx),
                    &ctx.own_writes,
                    &name,
                    &blocked,
                    &ctx.manager,
                )
                .await?;
            }
            return Ok(ControlFlow::Break(Action::requeue(ctx.resync)));
        }
        Err(e) => return crate::operation_gate::retry_later(e).map(ControlFlow::Break),
    }
    let status = frozen_status(stored, planned, op.metadata.generation, now);
    write_operation_status(
        &operations(ctx),
        &ctx.own_writes,
        &name,
        &status,
        &ctx.manager,
    )
    .await?;
    tracing::info!(nodes = planned.tasks.len(), "plan frozen");
    Ok(ControlFlow::Continue(status))
}

/// The status that freezes `planned`: Running from now, with the plan, and the planner's
/// notes on the `Planned` condition.
fn frozen_status(
    stored: &OperationStatus,
    planned: &PlanOutput,
    generation: Option<i64>,
    now: Timestamp,
) -> OperationStatus {
    let mut status = stored.clone();
    status.plan = Some(planned.plan.clone());
    status.start_time = Some(Time(now));
    status.phase = OperationPhase::Running;
    status.message = Some(format!("planned {} nodes", planned.tasks.len()));
    set_condition(
        &mut status.conditions,
        "Planned",
        true,
        "PlanFrozen",
        &planned.notes.join("; "),
        generation,
        now,
    );
    status
}

/// **Tasks**: the Operation's NodeTasks from the store, then the plan's missing ones,
/// created by their deterministic names (create-or-get). Tasks of a frozen plan missing from
/// the cluster usually mean a deletion under way (the garbage collector removes the tasks
/// of an Operation being deleted), which the cached Operation may not show yet: the
/// Operation itself is read before any is recreated, and the pass ends if it is going.
async fn observe_tasks(
    ctx: &Context,
    op: &Operation,
    planned: &PlanOutput,
    stored: &OperationStatus,
) -> Result<ControlFlow<Action, Tasks>> {
    let name = op.name_any();
    let label = planned
        .tasks
        .first()
        .and_then(|t| t.labels.get(labels::OPERATION));
    let selector = label.map_or_else(String::new, |v| format!("{}={v}", labels::OPERATION));
    let own = |t: &NodeTask| {
        t.spec.operation == name
            && label.is_none_or(|v| t.labels().get(labels::OPERATION) == Some(v))
    };
    let mut tasks: Tasks = BTreeMap::new();
    for t in ctx
        .caches
        .tasks(&ctx.client, Writes::Of(&name), &selector, own)
        .await?
    {
        tasks.insert(t.spec.node_name.clone(), t);
    }
    let missing: Vec<&PlannedTask> = planned
        .tasks
        .iter()
        .filter(|t| !tasks.contains_key(&t.spec.node_name))
        .collect();
    if !missing.is_empty() && stored.plan.is_some() {
        match operations(ctx)
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("getting Operation {name}")))?
        {
            Some(fresh) if !being_deleted(&fresh) => {}
            _ => {
                tracing::debug!(
                    "operation is being deleted: its missing NodeTasks are not recreated"
                );
                return Ok(ControlFlow::Break(Action::await_change()));
            }
        }
    }
    for planned_task in missing {
        let created = create_task(ctx, op, planned_task).await?;
        tracing::info!(task = %planned_task.name, "NodeTask created");
        tasks.insert(planned_task.spec.node_name.clone(), Arc::new(created));
    }
    Ok(ControlFlow::Continue(tasks))
}

/// Creates the NodeTask of `planned` (owned by `op`, with this install's instance label),
/// or gets it when it already exists.
async fn create_task(ctx: &Context, op: &Operation, planned: &PlannedTask) -> Result<NodeTask> {
    let mut task_labels = planned.labels.clone();
    if let Some(instance) = &ctx.instance {
        task_labels.insert(labels::INSTANCE.to_string(), instance.clone());
    }
    let task = NodeTask {
        metadata: ObjectMeta {
            name: Some(planned.name.clone()),
            labels: Some(task_labels),
            owner_references: Some(vec![owner_reference(op)]),
            ..Default::default()
        },
        spec: planned.spec.clone(),
        status: None,
    };
    let api: Api<NodeTask> = Api::all(ctx.client.clone());
    match api.create(&PostParams::default(), &task).await {
        Ok(t) => Ok(t),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            api.get(&planned.name).await.map_err(Error::kube(format!(
                "getting NodeTask {} after it already existed",
                planned.name
            )))
        }
        Err(e) => Err(Error::kube(format!("creating NodeTask {}", planned.name))(
            e,
        )),
    }
}

/// **Recover**: people's decisions (`spec.recovery`), the failure policy's automatic
/// retries, and the pause mirrored onto the tasks, before anything else looks at them: a
/// task retried here runs on in this same pass. Tasks being advanced in the background
/// (`busy`) are looked at once that is done; a task with nothing to write stays the
/// store's, not a copy.
async fn recover(
    ctx: &Context,
    op: &Operation,
    tasks: &mut Tasks,
    busy: &HashSet<String>,
    now: Timestamp,
) -> Result<Recheck> {
    let mut recheck = Recheck::default();
    for task in tasks.values_mut() {
        if busy.contains(&task.name_any()) {
            continue;
        }
        let pause = crate::recovery::pause_differs(task, op.spec.paused);
        if !pause && !crate::recovery::wants_handling(task) {
            continue;
        }
        let task = Arc::make_mut(task);
        if pause {
            crate::recovery::mirror_pause(ctx, task, op.spec.paused).await?;
        }
        recheck.at_most(crate::recovery::handle(ctx, op, task, now).await?);
    }
    Ok(recheck)
}

/// **Advance** the running tasks whose next move is the controller's: their controller-side
/// steps, and the end of tasks whose steps all succeeded and whose health gates passed (a
/// drain or wait in progress asks to be looked at again sooner than the resync).
///
/// Each such task is advanced by a job of its own (`inflight`), up to
/// `RUNNING_TASKS_AT_ONCE` at a time; this pass waits for them at most
/// `inflight::PASS_WAIT` and takes what they finished in that time. The others go on and
/// wake this Operation when done, so a pass over a thousand running tasks does not wait for
/// each of their writes (docs/benchmarks.md, fleet).
async fn advance_running(
    ctx: &Arc<Context>,
    op: &Arc<Operation>,
    tasks: &mut Tasks,
    busy: &HashSet<String>,
) -> Result<Recheck> {
    let mut recheck = Recheck::default();
    let mut jobs = futures::stream::FuturesUnordered::new();
    for (node, task) in tasks.iter() {
        let task_name = task.name_any();
        let running = task.status.as_ref().map(|s| s.phase) == Some(NodeTaskPhase::Running);
        if !running
            || busy.contains(&task_name)
            || !controller_moves_next(task)
            || !ctx.inflight.claim(&task_name)
        {
            continue;
        }
        let node = node.clone();
        jobs.push(
            spawn_advance(ctx.clone(), op.clone(), task.clone()).map(move |done| (node, done)),
        );
    }
    let pass_wait = tokio::time::sleep(crate::inflight::PASS_WAIT);
    tokio::pin!(pass_wait);
    loop {
        tokio::select! {
            next = jobs.next() => match next {
                Some((node, Ok((task, result)))) => {
                    tasks.insert(node, Arc::new(task));
                    recheck.at_most(result?);
                }
                // A job dropped without an answer (the runtime is stopping).
                Some((_, Err(_))) => {}
                None => break,
            },
            () = &mut pass_wait => {
                tracing::debug!(left = jobs.len(), "tasks still being advanced; they wake this Operation when done");
                break;
            }
        }
    }
    Ok(recheck)
}

/// **Schedule**: the planner's decision over the tasks' phases now and the Nodes present.
fn schedule_now(
    frozen: &Plan,
    tasks: &Tasks,
    nodes: &[NodeInfo],
    spec: &OperationSpec,
) -> Schedule {
    let present: BTreeSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let views: BTreeMap<String, TaskView> = tasks
        .iter()
        .map(|(node, t)| {
            let phase = t.status.as_ref().map(|s| s.phase).unwrap_or_default();
            (
                node.clone(),
                TaskView {
                    phase,
                    approve: t.spec.approve,
                },
            )
        })
        .collect();
    schedule(frozen, &views, &present, spec.paused, spec.execution_mode)
}

/// **Summarise**: the Operation's status from the schedule and the tasks (with the
/// operation gate's hold), written when it differs from `current`; Events for what changed;
/// and when to look again (never, once finished).
async fn summarise(
    ctx: &Context,
    op: &Operation,
    stored: &OperationStatus,
    current: OperationStatus,
    summary: &crate::summary::Summary<'_>,
    hold: &crate::operation_gate::Hold,
    recheck: Recheck,
) -> Result<Action> {
    let name = op.name_any();
    let now = summary.now;
    let was_ignoring = stored
        .conditions
        .iter()
        .any(|c| c.type_ == crate::summary::SPEC_IGNORED && c.status == "True");
    if let Some(note) = summary.ignored
        && !was_ignoring
    {
        tracing::warn!(note = %note, "a rollout control changed after the plan was frozen cannot be read; carrying on with the frozen plan");
    }
    let mut status = current.clone();
    crate::summary::summarize(&mut status, summary);
    hold.record(&ctx.events, op, summary.tasks, stored, &mut status, now)
        .await;
    if status.phase.is_finished() && status.completion_time.is_none() {
        status.completion_time = Some(Time(now));
    }
    bosun_telemetry::metrics().operation_phase(&name, status.phase);
    if status != current {
        write_operation_status(
            &operations(ctx),
            &ctx.own_writes,
            &name,
            &status,
            &ctx.manager,
        )
        .await?;
    }
    ctx.events
        .observe(
            op,
            stored.phase,
            status.phase,
            status.message.as_deref().unwrap_or(""),
            summary.tasks.values().map(|t| &**t),
        )
        .await;
    if status.phase.is_finished() {
        tracing::info!(phase = ?status.phase, message = status.message.as_deref().unwrap_or(""), "operation finished");
        return Ok(Action::await_change());
    }
    Ok(recheck.action(ctx.resync))
}

/// Whether `op` is being deleted (it has a `deletionTimestamp`): such an Operation is
/// planned, given NodeTasks and has tasks started no more; the garbage collector removes
/// its tasks, and the controller must not race it by recreating them.
pub fn being_deleted(op: &Operation) -> bool {
    op.metadata.deletion_timestamp.is_some()
}

/// The stored Operation's UID and creation time, which the planner puts in the steps that
/// must name this Operation alone. A stored object has both; `None` otherwise.
fn identity_of(op: &Operation) -> Option<OperationIdentity> {
    Some(OperationIdentity {
        uid: op.metadata.uid.clone()?,
        created: op
            .metadata
            .creation_timestamp
            .as_ref()?
            .0
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
    })
}

/// Plans the Operation, or, once its plan is frozen, rebuilds the task specs of that plan.
///
/// After freezing, `rollout.maxUnavailable` decides nothing (each group's limit was resolved
/// into the plan), but the field stays editable, and a CRD installed before the schema
/// bounded it lets through values the planner cannot read (`"99999999999"`). Such an edit
/// must not fail an Operation whose tasks are under way: the frozen plan carries on, and the
/// second value is a note saying what was set aside. It is the only spec edit that can make
/// a frozen plan unplannable (the kind of work, the custom groups and the node selector are
/// immutable); every other error is returned as it is, as is any error before freezing.
fn plan_or_keep_frozen(
    name: &str,
    identity: Option<&OperationIdentity>,
    spec: &OperationSpec,
    nodes: &[NodeInfo],
    frozen: Option<&Plan>,
) -> std::result::Result<(PlanOutput, Option<String>), PlanError> {
    match plan_identified(name, identity, spec, nodes, frozen) {
        Err(PlanError::MaxUnavailable(e)) if frozen.is_some() => {
            let readable = OperationSpec {
                rollout: Rollout::default(),
                ..spec.clone()
            };
            let planned = plan_identified(name, identity, &readable, nodes, frozen)?;
            let note = format!(
                "spec.rollout.maxUnavailable is ignored, the plan is already frozen with its own limits ({e})"
            );
            Ok((planned, Some(note)))
        }
        other => other.map(|planned| (planned, None)),
    }
}

/// What [`kube::runtime::Controller`] does after a failed reconcile: log it and try again
/// a little later (the API server may be briefly unavailable; transitions refused by the
/// state machine are logged loudly and retried in case the status was being edited).
pub fn error_policy(op: Arc<Operation>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(operation = %op.name_any(), %error, "reconcile failed; retrying in 5s");
    Action::requeue(Duration::from_secs(5))
}

/// The planner's view of every Node (as the Node watch last showed them).
fn snapshot_nodes(caches: &crate::cache::Caches) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = caches.nodes().iter().map(|n| node_info(n)).collect();
    // A LIST returned them by name; the store holds them in no order.
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes
}

/// A Node object as the planner sees it.
pub fn node_info(node: &Node) -> NodeInfo {
    NodeInfo {
        name: node.name_any(),
        labels: node.labels().clone(),
        ready: bosun_cluster::readers::is_ready(node),
        unschedulable: node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        cordoned_by: crate::actions::cordoned_by(node),
    }
}

fn owner_reference(op: &Operation) -> OwnerReference {
    OwnerReference {
        api_version: Operation::api_version(&()).into_owned(),
        kind: Operation::kind(&()).into_owned(),
        name: op.name_any(),
        uid: op.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Running tasks advanced at the same time (their controller steps and finishing writes,
/// across Operations: [`crate::inflight`]), and tasks one reconcile starts at the same time.
/// At 1,000 nodes and `maxUnavailable: 100%` (docs/benchmarks.md, debug build): 16 took
/// 95 s, 32 took 82 s and 64 took 78 s, with the controller's peak RSS at 85, 91 and
/// 107 MiB; 32 keeps it under the 100 MB target.
pub(crate) const RUNNING_TASKS_AT_ONCE: usize = 32;

/// Applies `event` to a task and writes the new phase (with `reason` when it blocks or
/// becomes invalid).
async fn move_task(
    ctx: &Context,
    task: &NodeTask,
    event: TaskEvent,
    reason: Option<(BlockReason, String)>,
) -> Result<NodeTaskPhase> {
    let (next, body) = moved(task, event, reason)?;
    apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
    Ok(next)
}

/// The task's next phase after `event`, and the top-level fields that say so: every field
/// the controller's own manager owns at the top level (server-side apply drops fields a
/// manager set before and omits now).
fn moved(
    task: &NodeTask,
    event: TaskEvent,
    reason: Option<(BlockReason, String)>,
) -> Result<(NodeTaskPhase, serde_json::Value)> {
    let current = task.status.clone().unwrap_or_default();
    let next = task_transition(current.phase, event)
        .map_err(bosun_cluster::Error::transition(task.name_any()))?;
    let mut body = json!({ "phase": next, "attempts": current.attempts, "message": current.message.clone().unwrap_or_default() });
    if matches!(
        event,
        TaskEvent::TurnCame {
            needs_approval: false
        } | TaskEvent::Approved
    ) {
        body["attempts"] = json!(current.attempts + 1);
        body["message"] = json!("running");
    }
    if matches!(
        event,
        TaskEvent::TurnCame {
            needs_approval: true
        }
    ) {
        body["message"] =
            json!("waiting for approval: `kubectl bosun approve` (spec.approve: true)");
    }
    if next == NodeTaskPhase::Succeeded {
        body["message"] = json!("every step succeeded");
    }
    if let Some((r, m)) = reason {
        body["reason"] = json!(r);
        body["message"] = json!(m);
    }
    Ok((next, body))
}

/// Mirrors top-level fields written (`body`, from [`moved`]) in the task's status in memory.
fn mirror_top(task: &mut NodeTask, next: NodeTaskPhase, body: &serde_json::Value) {
    let s = task.status.get_or_insert_with(Default::default);
    s.phase = next;
    if let Some(a) = body["attempts"].as_u64() {
        s.attempts = u32::try_from(a).unwrap_or(u32::MAX);
    }
    if let Some(m) = body["message"].as_str() {
        s.message = Some(m.to_string());
    }
    if let Some(r) = body.get("reason") {
        s.reason = serde_json::from_value(r.clone()).ok();
    }
}

/// Server-side apply of part of a NodeTask's status under the controller's field manager.
/// `manager` is the controller's own for the task's top-level fields, and one per step
/// (`<manager>.step.<name>`) for a step's entry, so no apply removes another's fields.
pub(crate) async fn apply_task_status(
    ctx: &Context,
    name: &str,
    status: impl serde::Serialize,
    manager: &str,
) -> Result<()> {
    bosun_cluster::status::apply(&ctx.client, name, manager, &status).await?;
    Ok(())
}

/// Applies `status` as the Operation's status under `manager`, and records the API server's
/// answer in `own` ([`crate::cache::OwnWrites`]): until the Operation watch shows this write,
/// a reconcile starts from it rather than from the older Operation the watch last showed.
async fn write_operation_status(
    api: &Api<Operation>,
    own: &crate::cache::OwnWrites,
    name: &str,
    status: &OperationStatus,
    manager: &str,
) -> Result<()> {
    bosun_telemetry::metrics().operation_phase(name, status.phase);
    let status = serde_json::to_value(status).map_err(|source| Error::Serialize {
        what: "Operation status",
        source,
    })?;
    let patch = json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "metadata": { "name": name }, "status": status });
    let written = api
        .patch_status(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "writing the status of Operation {name}"
        )))?;
    own.record(written);
    Ok(())
}

#[cfg(test)]
mod tests {
    use bosun_api::node_task::{NodeTaskStatus, StepPhase};
    use bosun_planner::state::step_status;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    use super::*;
    use crate::exclusion::Holder;
    use crate::fake_api::{context, fake};

    fn pending() -> NodeTask {
        let mut t = NodeTask::new("second-w1", crate::fake_api::task_spec("second", "w1"));
        t.status = Some(NodeTaskStatus::default());
        t
    }

    fn custom_op(max_unavailable: serde_json::Value) -> OperationSpec {
        serde_json::from_value(json!({
            "custom": {"groups": [{"name": "all", "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]}]},
            "rollout": {"maxUnavailable": max_unavailable},
        }))
        .unwrap()
    }

    fn worker(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            labels: BTreeMap::new(),
            ready: true,
            unschedulable: false,
            cordoned_by: None,
        }
    }

    /// A `maxUnavailable` edited into a value the planner cannot read after the plan was
    /// frozen (a CRD from before the schema bounded it lets `"99999999999"` through) does
    /// not fail the running Operation: the frozen plan and its tasks carry on, with a note.
    /// Before freezing the same value still fails planning.
    #[test]
    fn an_unreadable_max_unavailable_after_freezing_keeps_the_frozen_plan() {
        let nodes = [worker("w1"), worker("w2"), worker("w3")];
        let (first, note) =
            plan_or_keep_frozen("op", None, &custom_op(json!(2)), &nodes, None).unwrap();
        assert_eq!(note, None);
        assert_eq!(first.plan.groups[0].max_parallel, 2);

        let edited = custom_op(json!("99999999999"));
        let (again, note) =
            plan_or_keep_frozen("op", None, &edited, &nodes, Some(&first.plan)).unwrap();
        assert_eq!(
            again.plan, first.plan,
            "the frozen plan, limits included, is unchanged"
        );
        assert_eq!(again.tasks, first.tasks);
        let note = note.expect("a note says the field is ignored");
        assert!(
            note.contains("spec.rollout.maxUnavailable is ignored") && note.contains("99999999999"),
            "{note}"
        );

        assert!(matches!(
            plan_or_keep_frozen("op", None, &edited, &nodes, None),
            Err(PlanError::MaxUnavailable(_))
        ));
    }

    /// An Operation with a `deletionTimestamp`, as the watch delivers it: the reconcile
    /// asks the API server nothing and writes nothing (no read, no plan, no task).
    #[tokio::test]
    async fn an_operation_being_deleted_is_neither_planned_nor_given_tasks() {
        let mut op = Operation::new("going", custom_op(json!(1)));
        op.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(being_deleted(&op));
        let (client, seen) = crate::fake_api::fake_routes(|_| json!({}));
        let action = reconcile(Arc::new(op), Arc::new(context(client)))
            .await
            .unwrap();
        assert_eq!(action, Action::await_change());
        let requests = seen.lock().unwrap().clone();
        assert!(
            requests.is_empty(),
            "an Operation being deleted asks and writes nothing: {requests:#?}"
        );
    }

    /// The cached Operation does not show the deletion yet, but its NodeTasks are gone (the
    /// garbage collector removed them): the reconcile reads the Operation itself, sees the
    /// deletionTimestamp, and creates no task anew (and starts none).
    #[tokio::test]
    async fn tasks_removed_by_a_deletion_are_not_recreated_from_a_stale_cache() {
        let nodes = [worker("w1"), worker("w2")];
        let (planned, _) =
            plan_or_keep_frozen("going", None, &custom_op(json!(1)), &nodes, None).unwrap();
        let mut cached = Operation::new("going", custom_op(json!(1)));
        cached.status = Some(OperationStatus {
            plan: Some(planned.plan),
            phase: OperationPhase::Running,
            ..Default::default()
        });
        let (client, seen) = crate::fake_api::fake_routes(|req| {
            if req.path.ends_with("/operations/going") && req.method == "GET" {
                json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
                    "metadata": { "name": "going", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["foregroundDeletion"] },
                    "spec": custom_op(json!(1)) })
            } else {
                req.body.clone()
            }
        });
        // The Node watch shows both nodes; the NodeTask watch shows no task.
        let node = crate::fake_api::ready_node;
        let mut ctx = context(client);
        ctx.caches = Arc::new(crate::cache::Caches::listed(
            vec![node("w1"), node("w2")],
            vec![],
        ));
        let action = reconcile(Arc::new(cached), Arc::new(ctx)).await.unwrap();
        assert_eq!(action, Action::await_change());
        let requests = seen.lock().unwrap().clone();
        assert!(
            !requests
                .iter()
                .any(|r| r.path.ends_with("/nodes") || r.path.ends_with("/nodetasks")),
            "Nodes and NodeTasks are read from the stores: {requests:#?}"
        );
        let writes: Vec<_> = requests.iter().filter(|r| r.method != "GET").collect();
        assert!(
            writes.is_empty(),
            "nothing is created or started for an Operation being deleted: {writes:#?}"
        );
        assert!(
            requests
                .iter()
                .any(|r| r.path.ends_with("/operations/going")),
            "the Operation itself was read: {requests:#?}"
        );
    }

    /// A reconcile triggered again before the Operation watch showed its last status write
    /// (a NodeTask event comes first) starts from that write: the status it computes is the
    /// same, and it is not written a second time.
    #[tokio::test]
    async fn a_status_the_watch_has_not_shown_yet_is_not_written_again() {
        let nodes = [worker("w1"), worker("w2")];
        let (planned, _) =
            plan_or_keep_frozen("done", None, &custom_op(json!(1)), &nodes, None).unwrap();
        let mut cached = Operation::new("done", custom_op(json!(1)));
        cached.metadata.uid = Some("u1".into());
        cached.metadata.resource_version = Some("10".into());
        cached.status = Some(OperationStatus {
            plan: Some(planned.plan.clone()),
            phase: OperationPhase::Running,
            ..Default::default()
        });
        // Both tasks Succeeded, as the NodeTask watch shows them.
        let tasks: Vec<NodeTask> = planned
            .tasks
            .iter()
            .map(|p| {
                let mut t = NodeTask::new(&p.name, p.spec.clone());
                t.metadata.labels = Some(p.labels.clone());
                t.metadata.resource_version = Some("9".into());
                t.status = Some(NodeTaskStatus {
                    phase: NodeTaskPhase::Succeeded,
                    ..Default::default()
                });
                t
            })
            .collect();
        // The API server answers the status write with the Operation at version 20.
        let (client, seen) = crate::fake_api::fake_routes(|req| {
            if req.method == "PATCH" && req.path.ends_with("/operations/done/status") {
                json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
                    "metadata": { "name": "done", "uid": "u1", "resourceVersion": "20" },
                    "spec": custom_op(json!(1)), "status": req.body["status"] })
            } else {
                req.body.clone()
            }
        });
        let node = crate::fake_api::ready_node;
        let mut ctx = context(client);
        ctx.caches = Arc::new(crate::cache::Caches::listed(
            vec![node("w1"), node("w2")],
            tasks,
        ));
        let ctx = Arc::new(ctx);
        let operation_writes = |seen: &Arc<std::sync::Mutex<Vec<crate::fake_api::Seen>>>| {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|r| r.method != "GET" && r.path.contains("/operations/"))
                .count()
        };
        reconcile(Arc::new(cached.clone()), ctx.clone())
            .await
            .unwrap();
        assert_eq!(operation_writes(&seen), 1, "{:#?}", seen.lock().unwrap());
        let written = &status_writes(&seen.lock().unwrap())[0];
        assert_eq!(written.body["status"]["phase"], json!("Succeeded"));
        // Triggered again with the watch's Operation still at version 10: nothing written.
        reconcile(Arc::new(cached.clone()), ctx.clone())
            .await
            .unwrap();
        assert_eq!(operation_writes(&seen), 1, "{:#?}", seen.lock().unwrap());
        // Once the watch shows version 20, that is what the reconcile starts from.
        let mut caught_up = cached;
        caught_up.metadata.resource_version = Some("20".into());
        caught_up.status = Some(serde_json::from_value(written.body["status"].clone()).unwrap());
        let shown = ctx.own_writes.newest(Arc::new(caught_up.clone()));
        assert_eq!(shown.metadata.resource_version.as_deref(), Some("20"));
        assert!(Arc::ptr_eq(&ctx.own_writes.newest(shown.clone()), &shown));
    }

    /// A NodeTask of `steps` (JSON) on node w1, in `phase`, with `done` steps Succeeded.
    fn task_of(steps: serde_json::Value, phase: NodeTaskPhase, done: &[&str]) -> NodeTask {
        let mut t = pending();
        t.spec.steps = serde_json::from_value(steps).unwrap();
        let s = t.status.get_or_insert_with(Default::default);
        s.phase = phase;
        for name in done {
            s.steps.push(
                serde_json::from_value(
                    json!({ "name": name, "phase": "Succeeded", "attempts": 1 }),
                )
                .unwrap(),
            );
        }
        t
    }

    fn cordon_greet_uncordon() -> serde_json::Value {
        json!([
            { "name": "cordon", "runsOn": "controller", "action": "cordon" },
            { "name": "greet", "plugin": "hello", "action": "greet" },
            { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
        ])
    }

    /// A fake API server with node w1 (Ready, schedulable unless a patch says otherwise)
    /// that answers a NodeTask write with a bare NodeTask.
    fn node_routes(req: &crate::fake_api::Seen) -> serde_json::Value {
        if req.path.starts_with("/api/v1/nodes/") {
            json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "w1" },
                "spec": { "unschedulable": false },
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] } })
        } else {
            json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": "second-w1" },
                "spec": { "operation": "second", "nodeName": "w1", "group": "g", "steps": [] } })
        }
    }

    /// A renewal planned for a stored Operation renews only what was issued before the
    /// Operation was created (so its step run again renews nothing more), and an object
    /// without a UID or creation time (never stored) gets neither.
    #[test]
    fn a_renewal_renews_only_what_was_issued_before_its_operation() {
        let spec: OperationSpec = serde_json::from_value(json!({
            "renewCertificates": {"certificates": ["all"]}
        }))
        .unwrap();
        let mut op = Operation::new("renew", spec);
        assert!(identity_of(&op).is_none());
        op.metadata.uid = Some("9C1D2e3f-0000-4000-8000-000000000000".into());
        op.metadata.creation_timestamp = Some(Time("2026-12-06T15:04:05.25Z".parse().unwrap()));
        let identity = identity_of(&op).unwrap();
        assert_eq!(identity.created, "2026-12-06T15:04:05Z");
        let nodes = [NodeInfo::control_plane("cp1")];
        let (planned, _) =
            plan_or_keep_frozen("renew", Some(&identity), &op.spec, &nodes, None).unwrap();
        let renew = &planned.tasks[0].spec.steps[0];
        assert_eq!(renew.name, "renew-certificates");
        assert_eq!(
            renew.params,
            Some(json!({"certificates": ["all"], "issuedBefore": "2026-12-06T15:04:05Z"}))
        );
    }

    fn op_without_api_gate() -> Operation {
        let mut spec = custom_op(json!(1));
        spec.health_gates.api_server = false;
        spec.health_gates.control_plane_pods = false;
        Operation::new("second", spec)
    }

    fn status_writes(seen: &[crate::fake_api::Seen]) -> Vec<crate::fake_api::Seen> {
        seen.iter().filter(|r| r.is_status()).cloned().collect()
    }

    /// The status of the only status write seen, which `manager` made.
    fn the_one_status_write(seen: &[crate::fake_api::Seen], manager: &str) -> serde_json::Value {
        let writes = status_writes(seen);
        assert_eq!(writes.len(), 1, "{writes:#?}");
        assert_eq!(writes[0].field_manager(), Some(manager));
        writes[0].body["status"].clone()
    }

    /// A task whose first step is a controller step that is done at once (cordon): its
    /// start is written with that step, in one write under the step's manager, and the
    /// agent's step is left to the agent.
    #[tokio::test]
    async fn a_start_is_written_with_its_first_controller_step_in_one_write() {
        let (client, seen) = crate::fake_api::fake_routes(node_routes);
        let ctx = context(client);
        let mut task = task_of(cordon_greet_uncordon(), NodeTaskPhase::Pending, &[]);
        let recheck = start_task(
            &ctx,
            &op_without_api_gate(),
            &mut task,
            TaskEvent::TurnCame {
                needs_approval: false,
            },
        )
        .await
        .unwrap();
        assert_eq!(recheck, None);
        let status = &the_one_status_write(&seen.lock().unwrap(), "bosun-controller.step.cordon");
        assert_eq!(
            (&status["phase"], &status["attempts"], &status["message"]),
            (&json!("Running"), &json!(1), &json!("running"))
        );
        assert_eq!(status["currentStep"], json!("cordon"));
        assert_eq!(status["steps"][0]["name"], json!("cordon"));
        assert_eq!(status["steps"][0]["phase"], json!("Succeeded"));
        assert_eq!(status["steps"].as_array().unwrap().len(), 1);
        // And in memory: Running, cordon done.
        let s = task.status.as_ref().unwrap();
        assert_eq!((s.phase, s.attempts), (NodeTaskPhase::Running, 1));
        assert!(step_status(&s.steps, "cordon").is_some_and(|c| c.phase == StepPhase::Succeeded));
    }

    /// A task that waited for its node holds the controller's `NodeHeld` condition, which
    /// only the controller's own manager can remove: its start is written alone under it
    /// (without the condition), then the step under the step's manager.
    #[tokio::test]
    async fn a_start_that_must_remove_the_held_condition_is_written_alone_first() {
        let (client, seen) = crate::fake_api::fake_routes(node_routes);
        let ctx = context(client);
        let mut task = task_of(cordon_greet_uncordon(), NodeTaskPhase::Pending, &[]);
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            crate::exclusion::CONDITION,
            true,
            crate::exclusion::REASON_HELD,
            "waiting",
            None,
            Timestamp::now(),
        );
        task.status.as_mut().unwrap().conditions = conditions;
        start_task(
            &ctx,
            &op_without_api_gate(),
            &mut task,
            TaskEvent::TurnCame {
                needs_approval: false,
            },
        )
        .await
        .unwrap();
        let writes = status_writes(&seen.lock().unwrap());
        let managers: Vec<_> = writes.iter().map(|w| w.field_manager()).collect();
        assert_eq!(
            managers,
            [
                Some("bosun-controller"),
                Some("bosun-controller.step.cordon")
            ]
        );
        assert_eq!(writes[0].body["status"]["phase"], json!("Running"));
        assert!(writes[0].body["status"].get("conditions").is_none());
        assert!(writes[1].body["status"].get("phase").is_none());
    }

    /// The last controller step, the health gates' verdict and the task's Succeeded are one
    /// write under the last step's manager.
    #[tokio::test]
    async fn the_last_controller_step_and_the_end_of_the_task_are_one_write() {
        let (client, seen) = crate::fake_api::fake_routes(node_routes);
        let ctx = context(client);
        let mut task = task_of(
            cordon_greet_uncordon(),
            NodeTaskPhase::Running,
            &["cordon", "greet"],
        );
        task.status.as_mut().unwrap().attempts = 1;
        let recheck = advance_running_task(&ctx, &op_without_api_gate(), &mut task, None)
            .await
            .unwrap();
        assert_eq!(recheck, None);
        let status = &the_one_status_write(&seen.lock().unwrap(), "bosun-controller.step.uncordon");
        assert_eq!(
            (&status["phase"], &status["attempts"], &status["message"]),
            (
                &json!("Succeeded"),
                &json!(1),
                &json!("every step succeeded")
            )
        );
        assert_eq!(status["steps"][0]["name"], json!("uncordon"));
        assert_eq!(status["conditions"][0]["type"], json!("HealthGates"));
        assert_eq!(status["conditions"][0]["reason"], json!("Passed"));
        assert_eq!(task.status.unwrap().phase, NodeTaskPhase::Succeeded);
    }

    /// A task whose controller step's write is not answered does not hold its Operation's
    /// reconcile: the pass carries on after `inflight::PASS_WAIT` while the task is still
    /// being advanced; a second pass meanwhile does not advance it again; when the write is
    /// answered, the job wakes the Operation with the task as written, once. (The fake API
    /// server holds the write until the test lets it go: no clock is raced.)
    #[tokio::test]
    async fn a_slow_controller_step_does_not_hold_the_pass_and_runs_once() {
        let spec: OperationSpec = serde_json::from_value(json!({
            "custom": {"groups": [{"name": "all", "steps": [
                {"name": "uncordon", "runsOn": "controller", "action": "uncordon"}]}]},
            "healthGates": {"nodeReady": false, "apiServer": false, "controlPlanePods": false},
        }))
        .unwrap();
        let (planned, _) = plan_or_keep_frozen("slow", None, &spec, &[worker("w1")], None).unwrap();
        let mut op = Operation::new("slow", spec.clone());
        op.metadata.uid = Some("u1".into());
        op.status = Some(OperationStatus {
            plan: Some(planned.plan.clone()),
            phase: OperationPhase::Running,
            ..Default::default()
        });
        let p = &planned.tasks[0];
        let mut task = NodeTask::new(&p.name, p.spec.clone());
        task.metadata.labels = Some(p.labels.clone());
        task.metadata.owner_references = Some(vec![owner_reference(&op)]);
        task.status = Some(NodeTaskStatus {
            phase: NodeTaskPhase::Running,
            attempts: 1,
            ..Default::default()
        });
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (client, seen) = crate::fake_api::fake_answers_held(
            move |req| {
                let body = if req.path.starts_with("/api/v1/nodes/") {
                    serde_json::to_value(crate::fake_api::ready_node("w1")).unwrap()
                } else if req.path.contains("/operations/") {
                    json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
                        "metadata": { "name": "slow", "uid": "u1", "resourceVersion": "20" },
                        "spec": {}, "status": req.body["status"] })
                } else {
                    json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": "slow-w1" },
                        "spec": { "operation": "slow", "nodeName": "w1", "group": "all", "steps": [] } })
                };
                (200, body)
            },
            |req| req.is_status() && req.path.contains("/nodetasks/"),
            gate.clone(),
        );
        let (retrigger, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let mut ctx = context(client);
        ctx.caches = Arc::new(crate::cache::Caches::listed(
            vec![crate::fake_api::ready_node("w1")],
            vec![task.clone()],
        ));
        ctx.retrigger = Some(retrigger);
        let ctx = Arc::new(ctx);
        let task_writes = || {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|r| r.is_status() && r.path.contains("/nodetasks/"))
                .count()
        };
        let op = Arc::new(op);

        // The write is held: the pass returns without its answer.
        reconcile(op.clone(), ctx.clone()).await.unwrap();
        assert_eq!(task_writes(), 1, "the uncordon's write was sent");
        assert!(
            ctx.inflight.busy().contains(&p.name),
            "the task is in flight"
        );

        reconcile(op.clone(), ctx.clone()).await.unwrap();
        assert_eq!(
            task_writes(),
            1,
            "a second pass did not advance the task again"
        );
        assert!(woken.try_recv().is_err(), "nothing woke the Operation yet");

        gate.add_permits(1);
        let written = woken.recv().await.expect("the job woke the Operation");
        assert_eq!(written.name_any(), p.name);
        assert_eq!(
            written.status.as_ref().map(|s| s.phase),
            Some(NodeTaskPhase::Succeeded)
        );
        assert!(ctx.inflight.busy().is_empty(), "the task was released");
        assert_eq!(
            task_writes(),
            1,
            "one write for the step and the task's end"
        );
        assert!(woken.try_recv().is_err(), "woken once");
    }

    fn holder(phase: NodeTaskPhase) -> Holder {
        Holder {
            node: "w1".into(),
            operation: "first".into(),
            task: "first-w1".into(),
            phase,
        }
    }

    /// The waiting note is written once (message and NodeHeld condition, with the phase and
    /// attempts the controller's field manager owns), then not again while nothing changed
    /// (a write would wake the controller at once), and again when the holder changed.
    #[tokio::test]
    async fn a_held_task_is_noted_once_and_again_only_when_the_holder_changes() {
        let now = Timestamp::now();
        let task = pending();
        let (client, seen) = fake(&task, |_| false);
        note_held(
            &context(client),
            &task,
            &holder(NodeTaskPhase::Blocked),
            now,
        )
        .await
        .unwrap();
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 1, "{requests:#?}");
        let status = &requests[0].body["status"];
        let want = "waiting: node w1 is held by Operation first (task first-w1, Blocked)";
        assert_eq!(status["message"], json!(want));
        assert_eq!(
            (status["phase"].clone(), status["attempts"].clone()),
            (json!("Pending"), json!(0))
        );
        let condition: Condition = serde_json::from_value(status["conditions"][0].clone()).unwrap();
        assert_eq!(
            (
                condition.type_.as_str(),
                condition.status.as_str(),
                condition.reason.as_str()
            ),
            ("NodeHeld", "True", "HeldByOtherOperation")
        );
        assert_eq!(condition.message, want);

        // The task as the server now holds it: nothing more to write.
        let mut noted = task.clone();
        let s = noted.status.as_mut().unwrap();
        s.message = Some(want.into());
        s.conditions = vec![condition];
        let (client, seen) = fake(&noted, |_| false);
        note_held(
            &context(client),
            &noted,
            &holder(NodeTaskPhase::Blocked),
            now,
        )
        .await
        .unwrap();
        assert!(
            seen.lock().unwrap().is_empty(),
            "an unchanged note is not written again"
        );

        // The holder moved on to another phase: the note follows.
        let (client, seen) = fake(&noted, |_| false);
        note_held(
            &context(client),
            &noted,
            &holder(NodeTaskPhase::Running),
            now,
        )
        .await
        .unwrap();
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 1);
        assert_eq!(
            requests[0].body["status"]["message"],
            json!("waiting: node w1 is held by Operation first (task first-w1, Running)")
        );
    }
}
